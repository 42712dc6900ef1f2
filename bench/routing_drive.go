package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// driveResult is what one workload through one router gave.
type driveResult struct {
	ok, failed int
	firstError string
	elapsed    time.Duration
	ttft, e2e  []time.Duration // one each per request served
}

// progressEvery is how often drive reports the requests done.
const progressEvery = 5 * time.Second

// drive sends w's requests to the router at url, request i at arrivals[i]
// from the start or, when its conversation's previous turn has not been
// answered by then, as soon as it has: closed within a conversation, open
// across them. Each is a streamed /v1/completions of maxTokens tokens;
// its time to first token is the first SSE event's at the client.
// progress is called every few seconds.
func drive(ctx context.Context, url string, w *Workload, arrivals []time.Duration, maxTokens int,
	progress func(done, failed int, elapsed time.Duration)) driveResult {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true,
		IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	var (
		mu  sync.Mutex
		res driveResult
		wg  sync.WaitGroup
	)
	record := func(ttft, e2e time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.failed++
			if res.firstError == "" {
				res.firstError = err.Error()
			}
			return
		}
		res.ok++
		res.ttft = append(res.ttft, ttft)
		res.e2e = append(res.e2e, e2e)
	}
	start := time.Now()
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-tick.C:
				mu.Lock()
				done, failed := res.ok+res.failed, res.failed
				mu.Unlock()
				progress(done, failed, time.Since(start))
			}
		}
	}()
	previous := map[int]chan struct{}{} // each conversation's last turn sent: closed when answered
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i, q := range w.Requests {
		if d := time.Until(start.Add(arrivals[i])); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			record(0, 0, fmt.Errorf("not sent: %w", context.Cause(ctx)))
			continue
		}
		body, err := completionBody(q.Prompt, maxTokens)
		if err != nil {
			record(0, 0, err)
			continue
		}
		after := previous[q.Conversation]
		answered := make(chan struct{})
		previous[q.Conversation] = answered
		wg.Go(func() {
			defer close(answered)
			if after != nil {
				select {
				case <-after:
				case <-ctx.Done():
					record(0, 0, fmt.Errorf("not sent: %w", context.Cause(ctx)))
					return
				}
			}
			record(sendCompletion(ctx, client, url+"/v1/completions", body))
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	close(stopProgress)
	<-progressDone
	progress(res.ok+res.failed, res.failed, res.elapsed)
	return res
}

// completionBody is a streamed /v1/completions of prompt: one prompt
// string, as SGLang's tokenize endpoint takes, so that a real engine could
// count the same tokens.
func completionBody(prompt string, maxTokens int) ([]byte, error) {
	return json.Marshal(struct {
		Model     string `json:"model"`
		Prompt    string `json:"prompt"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
	}{"sim-model", prompt, maxTokens, true})
}

// sendCompletion sends body and reads the stream to its end: the time to
// its first event and to its end. A status other than 200, a broken
// stream or an error event fails it.
func sendCompletion(ctx context.Context, client *http.Client, url string, body []byte) (ttft, e2e time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if ttft, err = readAnswer(resp.Body, true, start); err != nil {
		return 0, 0, err
	}
	return ttft, time.Since(start), nil
}
