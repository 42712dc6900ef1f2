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

// newClient is an HTTP client with a connection kept for each of conns
// concurrent clients.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// runWindow sends l from concurrency clients until d has passed; the
// requests in flight then finish and count, so that the caller can divide
// the router's CPU up to the return by every request it served.
func runWindow(ctx context.Context, client *http.Client, l Load, concurrency int, d time.Duration) windowResult {
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var res windowResult
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			var ttfts []time.Duration
			ok, failed, firstErr := 0, 0, ""
			for ctx.Err() == nil && time.Now().Before(deadline) {
				ttft, err := send(ctx, client, l)
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

// send sends l once and returns the time to its first token: the first
// SSE data event of a stream, the whole answer otherwise. A stream must
// end with [DONE] and carry no error event.
func send(ctx context.Context, client *http.Client, l Load) (time.Duration, error) {
	start := time.Now()
	resp, err := post(ctx, client, l)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if !l.Stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0, fmt.Errorf("read answer: %w", err)
		}
		return time.Since(start), nil
	}
	var ttft time.Duration
	done := false
	r := bufio.NewReader(resp.Body)
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

// post sends l and returns the response if it is a 200.
func post(ctx context.Context, client *http.Client, l Load) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL, bytes.NewReader(l.Body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return resp, nil
}

// sendUntilOK sends l until it succeeds once: a router discovering its
// workers answers 5xx (or refuses connections) until then.
func sendUntilOK(ctx context.Context, client *http.Client, l Load, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := send(ctx, client, l)
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
