package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// oracle is the routing benchmark's yardstick: a router that knows what no
// real router can, each prefill's cache and queue at the moment a request
// comes, by asking every prefill sim (POST /_sim/cache_probe with the
// request's body). It sends each request to the prefill that would finish
// computing it first (least queued compute tokens plus the prompt's
// uncached tokens) and to the decode with the fewest of its requests in
// flight, and runs SGLang's PD protocol itself: the same body with the
// prefill's bootstrap host and port and a random room to both engines at
// once (router/legs.go runSGLang; sim/sglang.go), relaying the decode's
// answer. It trusts its engines and has no retries: it is not a router to
// run, only the best a router could pick on this fleet.
type oracle struct {
	prefills, decodes []*oracleEngine
	client            *http.Client
	srv               *http.Server
	ln                net.Listener
}

// oracleEngine is one engine behind the oracle and the requests it has
// there in flight.
type oracleEngine struct {
	url           string
	bootstrapHost string // a prefill's, JSON-quoted
	bootstrapPort int
	inflight      atomic.Int64
}

// cacheProbe is a prefill sim's answer to POST /_sim/cache_probe.
type cacheProbe struct {
	PromptTokens        int `json:"prompt_tokens"`
	CachedTokens        int `json:"cached_tokens"`
	QueuedRequests      int `json:"queued_requests"`
	QueuedComputeTokens int `json:"queued_compute_tokens"`
}

// startOracle serves the oracle on a free port of 127.0.0.1 in front of
// SGLang prefills and decodes.
func startOracle(prefills, decodes []*Sim) (*oracle, string, error) {
	o := &oracle{client: &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 1024, DisableCompression: true, IdleConnTimeout: time.Minute}}}
	for _, p := range prefills {
		u, err := url.Parse(p.URL)
		if err != nil {
			return nil, "", fmt.Errorf("oracle: prefill %s: %w", p.URL, err)
		}
		host, _ := json.Marshal(u.Hostname())
		o.prefills = append(o.prefills, &oracleEngine{url: p.URL, bootstrapHost: string(host), bootstrapPort: p.BootstrapPort})
	}
	for _, d := range decodes {
		o.decodes = append(o.decodes, &oracleEngine{url: d.URL})
	}
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if o.ln, err = net.Listen("tcp", addr); err != nil {
		return nil, "", fmt.Errorf("oracle: %w", err)
	}
	o.srv = &http.Server{Handler: o, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = o.srv.Serve(o.ln) }()
	return o, "http://" + addr, nil
}

// close stops serving and ends the requests in flight.
func (o *oracle) close() {
	_ = o.srv.Close()
	o.client.CloseIdleConnections()
}

// maxOracleBody bounds a request's body.
const maxOracleBody = 16 << 20

func (o *oracle) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOracleBody))
	if err != nil {
		http.Error(w, "oracle: read the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	body = bytes.TrimRight(body, " \t\r\n")
	if len(body) < 2 || body[len(body)-1] != '}' {
		http.Error(w, "oracle: the body is not a JSON object", http.StatusBadRequest)
		return
	}
	p, err := o.pickPrefill(r.Context(), body)
	if err != nil {
		http.Error(w, "oracle: "+err.Error(), http.StatusBadGateway)
		return
	}
	d := leastInflight(o.decodes)
	p.inflight.Add(1)
	d.inflight.Add(1)
	defer p.inflight.Add(-1)
	defer d.inflight.Add(-1)
	o.relay(w, r, p, d, body)
}

// pickPrefill probes every prefill with body and returns the one whose
// queue and uncached tokens are least; ties go to the one with the fewest
// of the oracle's requests in flight, then to the first.
func (o *oracle) pickPrefill(ctx context.Context, body []byte) (*oracleEngine, error) {
	probes := make([]cacheProbe, len(o.prefills))
	errs := make([]error, len(o.prefills))
	var wg sync.WaitGroup
	for i, p := range o.prefills {
		wg.Go(func() { probes[i], errs[i] = o.probe(ctx, p, body) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	best := -1
	var bestCost, bestInflight int64
	for i, pr := range probes {
		cost := int64(pr.QueuedComputeTokens + pr.PromptTokens - pr.CachedTokens)
		in := o.prefills[i].inflight.Load()
		if best < 0 || cost < bestCost || cost == bestCost && in < bestInflight {
			best, bestCost, bestInflight = i, cost, in
		}
	}
	return o.prefills[best], nil
}

func (o *oracle) probe(ctx context.Context, p *oracleEngine, body []byte) (cacheProbe, error) {
	var pr cacheProbe
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/_sim/cache_probe", bytes.NewReader(body))
	if err != nil {
		return pr, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.client.Do(req)
	if err != nil {
		return pr, fmt.Errorf("probe %s: %w", p.url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return pr, fmt.Errorf("probe %s: %w", p.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return pr, fmt.Errorf("probe %s: status %d: %s", p.url, resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &pr); err != nil {
		return pr, fmt.Errorf("probe %s: %w", p.url, err)
	}
	return pr, nil
}

func leastInflight(es []*oracleEngine) *oracleEngine {
	best := es[0]
	for _, e := range es[1:] {
		if e.inflight.Load() < best.inflight.Load() {
			best = e
		}
	}
	return best
}

// relay runs SGLang's PD protocol for body on prefill p and decode d and
// writes the decode's answer to w as it comes. A prefill that fails
// before the decode answered fails the request with its status.
func (o *oracle) relay(w http.ResponseWriter, r *http.Request, p, d *oracleEngine, body []byte) {
	up := make([]byte, 0, len(body)+128)
	up = append(up, body[:len(body)-1]...)
	up = fmt.Appendf(up, `,"bootstrap_host":%s,"bootstrap_port":%d,"bootstrap_room":%d}`,
		p.bootstrapHost, p.bootstrapPort, rand.Uint64()>>1)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	path := r.URL.RequestURI()
	prefillDone := make(chan struct{})
	go func() {
		defer close(prefillDone)
		if err := o.prefill(ctx, p.url+path, up); err != nil {
			cancel(err)
		}
	}()
	relayed := false
	defer func() {
		if !relayed {
			cancel(errors.New("the decode leg failed")) // the prefill may wait for a decode that never comes
		}
		<-prefillDone
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+path, bytes.NewReader(up))
	if err != nil {
		http.Error(w, "oracle: "+err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.client.Do(req)
	if err != nil {
		http.Error(w, fmt.Sprintf("oracle: decode: %v (prefill: %v)", err, context.Cause(ctx)), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				panic(http.ErrAbortHandler) // the client sees a cut stream
			}
			relayed = resp.StatusCode == http.StatusOK
			return
		}
	}
}

// prefill sends the prefill leg and reads its answer to the end.
func (o *oracle) prefill(ctx context.Context, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.client.Do(req)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prefill: status %d: %s", resp.StatusCode, tail(string(bytes.TrimSpace(b)), 500))
	}
	return nil
}
