package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim/simtest"
)

// shutdownServer serves h through an http.Server counted by an InFlight,
// as pdplane serve does, and returns the Shutdown of it and its URL.
func shutdownServer(t *testing.T, h http.Handler) (*server.Shutdown, string) {
	t.Helper()
	b := setup(t)
	var inflight httpwire.InFlight
	mux := http.NewServeMux()
	mux.Handle("/slow", h)
	mux.Handle("/", b.srv.Handler())
	hs := &http.Server{Handler: inflight.Handler(mux), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return &server.Shutdown{Server: b.srv, HTTP: hs, InFlight: &inflight, Log: zerolog.New(zerolog.NewTestWriter(t))}, "http://" + ln.Addr().String()
}

// TestShutdownWaitsForRequestsInFlight: a request in flight when the
// shutdown begins finishes, Run returns only after it (without polling it
// needs no more than its end), /readyz answers 503 meanwhile, and nothing
// is cut.
func TestShutdownWaitsForRequestsInFlight(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	sd, base := shutdownServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
	}))
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- string(b)
	}()
	<-entered
	ran := make(chan int64, 1)
	go func() { ran <- sd.Run(context.Background()) }()
	simtest.WaitFor(t, "the shutdown begun (Run's first step)", sd.Server.ShuttingDown)
	select {
	case <-ran:
		t.Fatal("Run returned while a request was in flight")
	default:
	}
	close(release)
	if got := <-answer; got != "done" {
		t.Fatalf("the request in flight got %q", got)
	}
	select {
	case cut := <-ran:
		if cut != 0 {
			t.Fatalf("Run cut %d requests, want none", cut)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return once the request finished")
	}
}

// TestShutdownCutsWhatOutlastsTheGrace: a request that outlasts the drain
// context is cut (its connection closed, the count returned), and Run
// returns soon after the grace, not after the request.
func TestShutdownCutsWhatOutlastsTheGrace(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	sd, base := shutdownServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // only the cut ends it
	}))
	failed := make(chan error, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	<-entered
	const grace = 200 * time.Millisecond
	drain, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	start := time.Now()
	if cut := sd.Run(drain); cut != 1 {
		t.Fatalf("Run cut %d requests, want 1", cut)
	}
	if took := time.Since(start); took > grace+5*time.Second {
		t.Fatalf("Run took %v with a grace of %v", took, grace)
	}
	if err := <-failed; err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("the cut request's client got %v, want its connection closed", err)
	}
}
