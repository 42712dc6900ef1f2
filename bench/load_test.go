package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestLoadConnKeepsItsConnection: a load client sends request after
// request on one connection, whether the router answers with a length or
// chunked, and dials again only when an answer could not be read to its
// end or the router said it closes the connection.
func TestLoadConnKeepsItsConnection(t *testing.T) {
	var conns atomic.Int64
	var served atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := served.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/v1/x" || r.Header.Get("Content-Type") != "application/json" ||
			r.ContentLength != 2 {
			http.Error(w, fmt.Sprintf("%s %s %q %d", r.Method, r.URL, r.Header.Get("Content-Type"), r.ContentLength), http.StatusBadRequest)
			return
		}
		switch n {
		case 2: // chunked: flushed before the handler returns
			w.Write([]byte("data: {}\n\n"))
			w.(http.Flusher).Flush()
			w.Write([]byte("data: [DONE]\n\n"))
		case 3:
			w.Header().Set("Connection", "close")
			w.Write([]byte("data: [DONE]\n\n"))
		case 4:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case 6:
			w.Write([]byte("data: {\"error\":{\"message\":\"cut\"}}\n\n"))
		default:
			w.Header().Set("Content-Length", "14")
			w.Write([]byte("data: [DONE]\n\n"))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	lc, err := newLoadConn(Load{URL: srv.URL + "/v1/x", Body: []byte("{}"), Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.close()
	ctx := context.Background()
	for i, want := range []struct {
		err   string
		conns int64
	}{
		{"", 1},                 // a length
		{"", 1},                 // chunked, same connection
		{"", 1},                 // Connection: close: answered, then closed
		{"status 503: busy", 2}, // a new connection, kept: the answer was read whole
		{"", 2},                 // the same connection
		{"error event", 2},      // an error event fails the request and closes it
		{"", 3},                 // a new connection again
	} {
		_, err := lc.send(ctx)
		if want.err == "" && err != nil || want.err != "" && (err == nil || !strings.Contains(err.Error(), want.err)) {
			t.Fatalf("request %d: %v, want %q", i+1, err, want.err)
		}
		if got := conns.Load(); got != want.conns {
			t.Fatalf("request %d: %d connections so far, want %d", i+1, got, want.conns)
		}
	}
}

// TestLoadConnEndsWithItsContext: a request waiting for its answer ends
// when the window's context does.
func TestLoadConnEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	lc, err := newLoadConn(Load{URL: srv.URL + "/v1/x", Body: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := lc.send(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an unanswered request succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request outlived its context by 5 s")
	}
}
