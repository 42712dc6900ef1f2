package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// routingFleet is one router's fleet: its prefills and decodes, started
// cold for it alone, and the router in front of them.
type routingFleet struct {
	prefills, decodes []*Sim
	procs             []*Process // every process, the router's last
	oracle            *oracle
	url               string // the router's base URL
}

// decodeKVPages is a decode's KV pool: a decode holds a whole prompt's
// pages until its answer ends (sim/sglang.go decodeRoom), and the prefix
// cache under study is the prefills'.
const decodeKVPages = 16384

// startRoutingFleet starts cfg's prefills and decodes of router p's engine
// kind and p in front of them, and sends a request through it. A pdplane
// router's sims register with its serve (the precise policy's publishing
// their KV events); the other routers are given the sims' addresses, and
// the sims share a transfer secret.
func startRoutingFleet(ctx context.Context, cfg RoutingConfig, p Peer) (_ *routingFleet, err error) {
	f := &routingFleet{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	engine := routerEngine(p.Name)
	var controlPlane, secret string
	pdplane := p.Name == RouterPdplane || p.Name == RouterPdplaneRing || p.Name == RouterPdplaneP2C
	if pdplane {
		serve, url, err := startServe(ctx, cfg.Pdplane, p.Name+" serve", "--prefill-policy", pdplanePolicy(p.Name), "--max-inflight", "4096")
		if err != nil {
			return nil, err
		}
		controlPlane = url
		f.procs = append(f.procs, serve)
		f.url = controlPlane
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		secret = hex.EncodeToString(b)
	}
	for _, role := range []string{"prefill", "decode"} {
		n := cfg.Prefills
		if role == "decode" {
			n = cfg.Decodes
		}
		for i := range n {
			spec := SimSpec{Engine: engine, Role: role, Name: fmt.Sprintf("%s-%s-%d", engine, role, i), ControlPlane: controlPlane, TransferSecret: secret,
				CheapTransfer: true, NumLayers: loadNumLayers, NumKVHeads: loadNumKVHeads, HeadDim: loadHeadDim,
				PageSize: cfg.PageSize, KVPages: decodeKVPages}
			if role == "prefill" {
				spec.KVPages, spec.PrefillTimePerToken, spec.PrefillSlots = cfg.KVPages, cfg.PrefillTimePerToken, cfg.PrefillSlots
				if cfg.CachePages < cfg.KVPages {
					spec.PrefixCachePages = cfg.CachePages
				}
				if p.Name == RouterPdplane {
					if spec.KVEventsAddr, err = freeAddr(); err != nil {
						return nil, err
					}
					if spec.KVEventsReplayAddr, err = freeAddr(); err != nil {
						return nil, err
					}
				}
			}
			s, err := StartSim(ctx, cfg.Pdplane, spec)
			if err != nil {
				return nil, err
			}
			f.procs = append(f.procs, s.Process)
			if role == "prefill" {
				f.prefills = append(f.prefills, s)
			} else {
				f.decodes = append(f.decodes, s)
			}
		}
	}
	if err := f.startRouter(ctx, cfg, p); err != nil {
		return nil, err
	}
	// The first request proves the whole path (a router discovering its
	// workers fails until it has); Routing counts from after it.
	warm := Load{URL: f.url + "/v1/completions", Stream: true,
		Body: []byte(`{"model":"sim-model","prompt":"hello there","max_tokens":1,"stream":true}`)}
	if err := sendUntilOK(ctx, warm, startTimeout); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", p.Name, err, f.outputs())
	}
	return f, nil
}

// startRouter starts router p in front of the fleet and sets f.url.
func (f *routingFleet) startRouter(ctx context.Context, cfg RoutingConfig, p Peer) error {
	switch p.Name {
	case RouterPdplane, RouterPdplaneRing, RouterPdplaneP2C:
		return waitPairs(ctx, f.procs[0], f.url, len(f.prefills)*len(f.decodes))
	case RouterOracle:
		o, url, err := startOracle(f.prefills, f.decodes)
		if err != nil {
			return err
		}
		f.oracle, f.url = o, url
		return nil
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	var args []string
	if p.Name == PeerSMG {
		args, err = SMGPDFleetArgs(p.Bin, port, "", f.prefills, f.decodes)
	} else {
		args, err = VLLMRouterPDFleetArgs(p.Bin, port, "", f.prefills, f.decodes)
	}
	if err != nil {
		return err
	}
	proc, err := Start(p.Name, nil, append(args, "--policy", "cache_aware")...)
	if err != nil {
		return err
	}
	f.procs = append(f.procs, proc)
	f.url = "http://127.0.0.1:" + strconv.Itoa(port)
	return nil
}

// waitPairs waits until the serve at url routes n pairs (GET
// /api/v1/fleet), so that no engine joins the run late.
func waitPairs(ctx context.Context, serve *Process, url string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := -1
	for {
		var fleet struct {
			Pairs struct {
				Routable int `json:"routable"`
			} `json:"pairs"`
		}
		if err := getJSON(ctx, url+"/api/v1/fleet", &fleet); err == nil {
			if last = fleet.Pairs.Routable; last >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d pairs routable: %w\n%s", serve.Name, max(last, 0), n, context.Cause(ctx), tail(serve.Output(), 4000))
		case <-tick.C:
		}
	}
}

// simCounters are the prefix cache's counters of GET /_sim/stats.
type simCounters struct {
	PromptTokens       int64 `json:"prompt_tokens"`
	CachedPromptTokens int64 `json:"cached_prompt_tokens"`
}

// prefillCounters sums the prefills' counters.
func (f *routingFleet) prefillCounters(ctx context.Context) (simCounters, error) {
	var sum simCounters
	for _, p := range f.prefills {
		var c simCounters
		if err := getJSON(ctx, p.URL+"/_sim/stats", &c); err != nil {
			return sum, fmt.Errorf("%s: %w", p.Name, err)
		}
		sum.PromptTokens += c.PromptTokens
		sum.CachedPromptTokens += c.CachedPromptTokens
	}
	return sum, nil
}

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d: %s", url, resp.StatusCode, tail(string(b), 500))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// freeAddr is FreePort as a host:port of 127.0.0.1.
func freeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// outputs is the last of each process's output, for a failure's report.
func (f *routingFleet) outputs() string {
	var b strings.Builder
	for _, p := range f.procs {
		fmt.Fprintf(&b, "--- %s:\n%s\n", p.Name, tail(p.Output(), 1500))
	}
	return b.String()
}

// close stops the router and every engine, newest first. It is idempotent.
func (f *routingFleet) close() {
	if f.oracle != nil {
		f.oracle.close()
		f.oracle = nil
	}
	for i := len(f.procs) - 1; i >= 0; i-- {
		f.procs[i].Stop()
	}
	f.procs = nil
}
