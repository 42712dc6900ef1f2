package httpwire

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// deadlineCounter counts the read deadlines put on a connection's socket.
type deadlineCounter struct {
	net.Conn
	n atomic.Int32
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.n.Add(1)
	return c.Conn.SetReadDeadline(t)
}

// tcpPair is a loopback TCP connection's two ends.
func tcpPair(t *testing.T) (near, far net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	far, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	near, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close(); far.Close() })
	return near, far
}

// TestClientConnDefersReadDeadlines: while the front owns a connection, a
// read deadline goes on the socket when a read needs it, and only the last
// one set; one set while a read waits cuts it at once; once the front lets
// go (net/http's, a hijacker's), every one goes on at once.
func TestClientConnDefersReadDeadlines(t *testing.T) {
	near, far := tcpPair(t)
	dc := &deadlineCounter{Conn: near}
	c := &clientConn{Conn: dc}
	c.deferReadDeadlines(true)
	buf := make([]byte, 16)

	// A request's round as the front makes it: the idle wait's deadline,
	// the head's, cleared, then BodyDeadline's, cleared. The request came
	// whole in the first read.
	if _, err := far.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "request" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_ = c.SetReadDeadline(time.Time{})
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_ = c.SetReadDeadline(time.Time{})
	if n := dc.n.Load(); n != 1 {
		t.Fatalf("%d deadlines put on the socket, want 1 (the one a read needed)", n)
	}

	// A deadline set before a read is the read's.
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}

	// One set while a read waits cuts it.
	_ = c.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := c.Read(buf); done <- err }()
	waitFor(t, "the read to be under way", func() bool {
		c.rd.mu.Lock()
		defer c.rd.mu.Unlock()
		return c.rd.reading == 1
	})
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("waiting read cut with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline set while a read waited did not cut it")
	}

	// Let go: the last deadline set is on the socket, and later ones go on
	// at once, for readers that bypass Read's check (net/http's own
	// buffered reader reads through Read, but a deadline may be meant to
	// cut a read on another goroutine).
	_ = c.SetReadDeadline(time.Time{})
	c.deferReadDeadlines(false)
	before := dc.n.Load()
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if dc.n.Load() != before+1 {
		t.Fatal("a deadline set after the front let go was deferred")
	}
	if _, err := near.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the socket read past the deadline set: %v", err)
	}
}
