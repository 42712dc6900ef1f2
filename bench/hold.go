package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// heldStreams are streams opened and kept open: each has received its
// first event, and its connection is then parked, unread, until Release.
// A held stream costs the harness a socket and nothing else (no goroutine,
// no buffer, no net/http connection), so that holding thousands of them
// does not slow down the load generator measuring new requests beside them.
// At a token a second, what the router sends meanwhile fits in the
// socket's receive buffer for far longer than a measurement.
type heldStreams struct {
	Held       int
	FirstError string // why the first stream that failed did
	mu         sync.Mutex
	conns      []net.Conn
}

// holdOpening is how many streams holdStreams opens at once: thousands of
// connections at once overflow the router's accept backlog, and a dropped
// SYN is retried only a second later.
const holdOpening = 256

// holdStreams opens n streams of l, holdOpening at a time, and returns
// when each has received its first event or failed, or within has passed
// (the streams still opening then fail).
func holdStreams(ctx context.Context, l Load, n int, within time.Duration) (*heldStreams, error) {
	lr, err := newLoadRequest(l)
	if err != nil {
		return nil, fmt.Errorf("hold streams: %w", err)
	}
	req := lr.wire
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	h := &heldStreams{}
	opening := make(chan struct{}, holdOpening)
	var wg sync.WaitGroup
	for range n {
		select {
		case opening <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			h.failed(fmt.Errorf("not opened within %v: %w", within, ctx.Err()))
			continue
		}
		wg.Go(func() {
			defer func() { <-opening }()
			c, err := openStream(ctx, lr.host, req)
			if err != nil {
				h.failed(err)
				return
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			h.conns = append(h.conns, c)
			h.Held++
		})
	}
	wg.Wait()
	return h, nil
}

// openStream sends req on a new connection to addr and reads the answer
// until its first SSE event; it returns the connection, left unread after
// that.
func openStream(ctx context.Context, addr string, req []byte) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	err = firstEvent(c, req)
	if !stop() || err != nil {
		c.Close()
		return nil, errors.Join(err, ctx.Err())
	}
	return c, nil
}

// firstEvent writes req to c and reads the answer's status and headers,
// then its body until the first line of an SSE event ("data:", whatever
// chunk framing is around it).
func firstEvent(c net.Conn, req []byte) error {
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	r := bufio.NewReaderSize(c, 1024)
	status, err := r.ReadSlice('\n')
	if err != nil {
		return fmt.Errorf("read the status line: %w", err)
	}
	if f := bytes.Fields(status); len(f) < 2 || string(f[1]) != "200" {
		return fmt.Errorf("status %s", bytes.TrimSpace(status))
	}
	for {
		line, err := r.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data:")) {
			return nil
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("stream ended before its first event: %w", err)
		}
	}
}

func (h *heldStreams) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.FirstError == "" {
		h.FirstError = err.Error()
	}
}

// Release closes the streams. It is idempotent.
func (h *heldStreams) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
	h.conns = nil
}
