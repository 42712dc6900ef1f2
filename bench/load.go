package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"
)

// Load is the request every client of a window sends, again and again.
type Load struct {
	URL    string // the router's base URL and path
	Body   []byte
	Stream bool
}

// windowResult is what one window of load through one router gave.
type windowResult struct {
	OK, Failed int
	TTFT       []time.Duration // one per OK request
	FirstError string
}

// loadRequest is a Load prepared once for every client that sends it: the
// router's address and the request's bytes as sent.
type loadRequest struct {
	stream bool
	host   string        // the router's host:port
	head   *http.Request // for http.ReadResponse
	wire   []byte
}

func newLoadRequest(l Load) (*loadRequest, error) {
	u, err := url.Parse(l.URL)
	if err != nil {
		return nil, fmt.Errorf("load url: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("load url %q: want http://host:port/path", l.URL)
	}
	head, err := http.NewRequest(http.MethodPost, l.URL, nil)
	if err != nil {
		return nil, err
	}
	wire := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		u.RequestURI(), u.Host, len(l.Body))
	return &loadRequest{stream: l.Stream, host: u.Host, head: head, wire: append(wire, l.Body...)}, nil
}

// loadConn is one load client's connection to a router, kept alive from
// request to request: the request goes out as bytes prepared once, and the
// answer is read with http.ReadResponse on the connection's own buffer, on
// the client's goroutine. net/http's Transport hands every request between
// three goroutines (the caller's, the connection's writer and its reader);
// on a machine whose cores the routers under test share with their load,
// what the load costs is taken from whichever router is measured, and the
// more so from the cheaper one.
type loadConn struct {
	req  *loadRequest
	c    net.Conn
	br   *bufio.Reader
	stop func() bool // ends the context's hold on c
}

func newLoadConn(l Load) (*loadConn, error) {
	req, err := newLoadRequest(l)
	return &loadConn{req: req}, err
}

// dial connects; a done ctx closes the connection, ending any read or
// write on it.
func (lc *loadConn) dial(ctx context.Context) error {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", lc.req.host)
	if err != nil {
		return err
	}
	lc.c, lc.br = c, bufio.NewReaderSize(c, 16<<10)
	lc.stop = context.AfterFunc(ctx, func() { c.Close() })
	return nil
}

// close closes the connection; the next send dials again.
func (lc *loadConn) close() {
	if lc.c != nil {
		lc.stop()
		lc.c.Close()
		lc.c = nil
	}
}

// runWindow sends l from concurrency clients until d has passed; the
// requests in flight then finish and count, so that the caller can divide
// the router's CPU up to the return by every request it served.
func runWindow(ctx context.Context, l Load, concurrency int, d time.Duration) windowResult {
	req, err := newLoadRequest(l)
	if err != nil {
		return windowResult{Failed: 1, FirstError: err.Error()}
	}
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var res windowResult
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			var ttfts []time.Duration
			ok, failed, firstErr := 0, 0, ""
			lc := &loadConn{req: req}
			defer lc.close()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				ttft, err := lc.send(ctx)
				if err != nil {
					failed++
					if firstErr == "" {
						firstErr = err.Error()
					}
					continue
				}
				ok++
				ttfts = append(ttfts, ttft)
			}
			mu.Lock()
			defer mu.Unlock()
			res.OK += ok
			res.Failed += failed
			res.TTFT = append(res.TTFT, ttfts...)
			if res.FirstError == "" {
				res.FirstError = firstErr
			}
		})
	}
	wg.Wait()
	return res
}

// send sends the request once and returns the time to its first token,
// from the request's first byte: the first SSE data event of a stream, the
// whole answer otherwise. A stream must end with [DONE] and carry no error
// event. The connection is kept for the next send unless the answer could
// not be read to its end or the router closes it.
func (lc *loadConn) send(ctx context.Context) (time.Duration, error) {
	if lc.c == nil {
		if err := lc.dial(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	if _, err := lc.c.Write(lc.req.wire); err != nil {
		lc.close()
		return 0, fmt.Errorf("send request: %w", err)
	}
	resp, err := http.ReadResponse(lc.br, lc.req.head)
	if err != nil {
		lc.close()
		return 0, fmt.Errorf("read answer: %w", err)
	}
	ttft, whole, err := lc.answer(resp, start)
	if !whole || resp.Close {
		lc.close() // first: the body's Close would read on to its end
	}
	resp.Body.Close()
	return ttft, err
}

// answer reads resp; whole reports that its body was read to the end, so
// that the connection can carry the next request.
func (lc *loadConn) answer(resp *http.Response, start time.Time) (ttft time.Duration, whole bool, err error) {
	if resp.StatusCode != http.StatusOK {
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, 512))
		whole = rerr == nil && len(b) < 512
		return 0, whole, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if ttft, err = readAnswer(resp.Body, lc.req.stream, start); err != nil {
		return 0, false, err
	}
	return ttft, true, nil
}

// readAnswer reads an answer's body to its end and returns the time to
// its first token from start.
func readAnswer(body io.Reader, stream bool, start time.Time) (time.Duration, error) {
	if !stream {
		if _, err := io.Copy(io.Discard, body); err != nil {
			return 0, fmt.Errorf("read answer: %w", err)
		}
		return time.Since(start), nil
	}
	var ttft time.Duration
	done := false
	r := bufio.NewReader(body)
	for {
		line, err := r.ReadSlice('\n')
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if ttft == 0 {
				ttft = time.Since(start)
			}
			if bytes.Equal(data, []byte("[DONE]")) {
				done = true
			} else if bytes.HasPrefix(data, []byte(`{"error"`)) {
				return 0, fmt.Errorf("error event: %s", data)
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return 0, fmt.Errorf("read stream: %w", err)
		}
	}
	if !done {
		return 0, errors.New("stream ended without [DONE]")
	}
	return ttft, nil
}

// sendUntilOK sends l until it succeeds once: a router discovering its
// workers answers 5xx (or refuses connections) until then.
func sendUntilOK(ctx context.Context, l Load, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	lc, err := newLoadConn(l)
	if err != nil {
		return err
	}
	defer lc.close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := lc.send(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never served a request: %w", l.URL, err)
		case <-tick.C:
		}
	}
}

// percentile is the p-th percentile (0 < p ≤ 100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
