// Package simtest holds helpers for tests that run simulated engines: small
// configurations, starting sims closed with the test, and a client that does
// the router's job by hand (SGLang's bootstrap triple, vLLM's
// kv_transfer_params hand-off) so that the simulator's protocols can be
// tested without the router, and the router's tests can check themselves
// against the same behaviour.
package simtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// Config returns a small, fast engine configuration: 4-token pages, 2
// layers, 2 heads of 8, 64 pages, no per-token pauses, 5s room timeouts.
func Config(name string, role registry.Role, engine registry.Engine) sim.Config {
	return sim.Config{
		Name: name, Role: role, Engine: engine, Model: "sim-model",
		PageSize: 4, NumLayers: 2, NumKVHeads: 2, HeadDim: 8, Pages: 64,
		RoomTimeout: 5 * time.Second, TransferTimeout: 5 * time.Second,
		SharedTransferSecret: []byte("simtest shared transfer secret"),
	}
}

// UseNIXL switches cfg to the NIXL backend over loopback UCX TCP, skipping
// the test when libnixl_capi.so cannot be loaded (failing it when
// PDPLANE_REQUIRE_NIXL=1). The process should set UCX_TLS=tcp and
// UCX_NET_DEVICES=lo before the library loads (transfertest.UseLoopbackUCX,
// which TestMain in sim calls).
func UseNIXL(t testing.TB, cfg sim.Config) sim.Config {
	t.Helper()
	transfertest.RequireNIXL(t)
	cfg.Transfer = sim.TransferNIXL
	cfg.UCXTLS = "tcp"
	return cfg
}

// Start creates and starts a sim, closed when the test ends.
func Start(t testing.TB, cfg sim.Config) *sim.Sim {
	t.Helper()
	s, err := sim.New(cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatalf("new sim %s: %v", cfg.Name, err)
	}
	t.Cleanup(s.Close)
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("start sim %s: %v", cfg.Name, err)
	}
	return s
}

// Pair starts a prefill and a decode of engine from Config, adjusted by
// adjust (which may be nil) before they start.
func Pair(t testing.TB, engine registry.Engine, adjust func(*sim.Config)) (prefill, decode *sim.Sim) {
	t.Helper()
	pc := Config("p0", registry.RolePrefill, engine)
	dc := Config("d0", registry.RoleDecode, engine)
	if adjust != nil {
		adjust(&pc)
		adjust(&dc)
	}
	return Start(t, pc), Start(t, dc)
}

// BusyPair starts a Pair of engine whose decode generates slowly (20 ms a
// token) and keeps one streamed chat completion of 4,000 tokens running on
// it until the test ends; it returns once the decode generates that request.
func BusyPair(t testing.TB, engine registry.Engine) (prefill, decode *sim.Sim) {
	t.Helper()
	p, d := Pair(t, engine, func(c *sim.Config) {
		if c.Role == registry.RoleDecode {
			c.DecodeTimePerToken = 20 * time.Millisecond
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		c := NewClient()
		body := map[string]any{"model": "sim-model", "stream": true, "max_tokens": 4000,
			"messages": []any{map[string]any{"role": "user", "content": "keep the decode busy"}}}
		if engine == registry.EngineVLLM {
			c.VLLM(ctx, p, d, "/v1/chat/completions", body)
		} else {
			c.SGLang(ctx, p, d, "/v1/chat/completions", body, Room())
		}
	}()
	// Running alone is not enough: a request counts as running from its
	// arrival until it starts to wait for its KV. Generating means its KV
	// has arrived and nothing waits.
	WaitFor(t, "the decode generating the request", func() bool {
		l := d.Load()
		return l.Running == 1 && l.Queued == 0 && d.Stats().Transfers >= 1
	})
	return p, d
}

// Response is one engine's answer, read to the end.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body as an object (numbers as json.Number).
func (r Response) JSON() (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode %d answer %q: %w", r.Status, r.Body, err)
	}
	return m, nil
}

// Events returns the data payloads of an SSE body, without the final
// [DONE], and whether [DONE] came.
func Events(body []byte) (events [][]byte, done bool) {
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		d, ok := bytes.CutPrefix(bytes.TrimSpace(ev), []byte("data:"))
		if !ok {
			continue
		}
		d = bytes.TrimSpace(d)
		if string(d) == "[DONE]" {
			done = true
			continue
		}
		events = append(events, d)
	}
	return events, done
}

// Client does the router's job by hand.
type Client struct {
	HTTP *http.Client
}

// NewClient returns a client with its own transport.
func NewClient() *Client {
	return &Client{HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// Post sends body to url+path and reads the answer to the end.
func (c *Client) Post(ctx context.Context, url, path string, body any, header http.Header) (Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return Response{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(b))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	return c.do(req)
}

func (c *Client) do(req *http.Request) (Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: out}, err
}

// clone copies a JSON-shaped body one level deep.
func clone(body map[string]any) map[string]any {
	m := make(map[string]any, len(body)+3)
	for k, v := range body {
		m[k] = v
	}
	return m
}

// Room draws a bootstrap room as the router does: uniform in [0, 2^63).
func Room() uint64 { return rand.Uint64() >> 1 }

// SGLang sends body to prefill and decode as SGLang's PD protocol wants:
// the same body, with the prefill's bootstrap host and port and room,
// POSTed to both at once. Both answers are read to the end.
func (c *Client) SGLang(ctx context.Context, prefill, decode *sim.Sim, path string, body map[string]any, room uint64) (p, d Response, err error) {
	m := clone(body)
	m["bootstrap_host"] = "127.0.0.1"
	m["bootstrap_port"] = prefill.BootstrapPort()
	m["bootstrap_room"] = room
	h := http.Header{"X-Request-Id": {"req-" + strconv.FormatUint(room, 16)}}
	var wg sync.WaitGroup
	var perr error
	wg.Go(func() { p, perr = c.Post(ctx, prefill.URL(), path, m, h) })
	d, err = c.Post(ctx, decode.URL(), path, m, h)
	wg.Wait()
	if perr != nil {
		return p, d, fmt.Errorf("prefill: %w", perr)
	}
	if err != nil {
		return p, d, fmt.Errorf("decode: %w", err)
	}
	return p, d, nil
}

// VLLMPrefillBody is the prefill leg of vLLM's protocol for body: one
// token, not streamed, asking for a remote decode.
func VLLMPrefillBody(body map[string]any) map[string]any {
	m := clone(body)
	m["max_tokens"] = 1
	if _, ok := m["messages"]; ok {
		m["max_completion_tokens"] = 1
	}
	m["stream"] = false
	delete(m, "stream_options")
	m["kv_transfer_params"] = map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
	return m
}

// VLLM runs vLLM's protocol: the prefill leg, then the original body with
// the prefill's kv_transfer_params to the decode, with one X-Request-Id.
// The decode is not called when the prefill fails.
func (c *Client) VLLM(ctx context.Context, prefill, decode *sim.Sim, path string, body map[string]any) (p, d Response, err error) {
	h := http.Header{"X-Request-Id": {fmt.Sprintf("req-%x", rand.Uint64())}}
	p, err = c.Post(ctx, prefill.URL(), path, VLLMPrefillBody(body), h)
	if err != nil {
		return p, d, fmt.Errorf("prefill: %w", err)
	}
	if p.Status != http.StatusOK {
		return p, d, nil
	}
	m, err := VLLMDecodeBody(body, p)
	if err != nil {
		return p, d, err
	}
	d, err = c.Post(ctx, decode.URL(), path, m, h)
	if err != nil {
		return p, d, fmt.Errorf("decode: %w", err)
	}
	return p, d, nil
}

// VLLMDecodeBody is the decode leg of vLLM's protocol for body: body with
// the kv_transfer_params of the prefill's answer.
func VLLMDecodeBody(body map[string]any, prefill Response) (map[string]any, error) {
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(prefill.Body, &ans); err != nil || len(ans.KV) == 0 {
		return nil, fmt.Errorf("prefill answer without kv_transfer_params: %s", prefill.Body)
	}
	m := clone(body)
	m["kv_transfer_params"] = ans.KV
	return m, nil
}

// SetFault posts fault to the sim's /_sim/fault.
func (c *Client) SetFault(ctx context.Context, s *sim.Sim, fault string) (Response, error) {
	return c.Post(ctx, s.URL(), "/_sim/fault", map[string]string{"fault": fault}, nil)
}

// WaitFor waits until cond holds, checking every few milliseconds, and
// fails the test after 10 s: for what a simulator, or the control plane
// that serves it, does in the background (pages freed, a cancelled request
// let go, a routing mirror catching up with its store).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
