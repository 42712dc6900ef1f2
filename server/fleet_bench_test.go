package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// fleetConfig sizes one run of the registry at fleet scale: replicas
// control planes on one PostgreSQL, peers heartbeating through them every
// interval over HTTP, and marks stale marks sent to the first replica.
type fleetConfig struct {
	replicas, peers, marks int
	interval               time.Duration
	// gap is the pause between one mark reaching every replica and the next.
	gap time.Duration
	// conns bounds each replica's client connections, as a fleet of agents
	// behind a few load balancer connections would.
	conns int
}

// fleetResult is what runFleet measured.
type fleetResult struct {
	heartbeats, failedHeartbeats int64
	elapsed                      time.Duration
	hbLatency                    []time.Duration // each heartbeat's round trip
	markLatency                  []time.Duration // each stale mark's round trip on replica A
	fanOut                       []time.Duration // mark sent on A → seen in another replica's snapshot
	// fanOutCommitted is fanOut less the mark's round trip on A: from A's
	// answer (the mark committed and announced) until another replica's
	// snapshot shows it.
	fanOutCommitted []time.Duration
	missed          int // marks some replica never showed within the deadline
	pgCPU, selfCPU  time.Duration
}

// fleetPeer is one registered peer as its agent knows it.
type fleetPeer struct {
	id, credential string
	body           []byte // its heartbeat
	replica        int    // the replica it heartbeats through
}

// fleetReplica is one control plane: its own pool, listener, mirror and
// HTTP server over the shared schema.
type fleetReplica struct {
	url    string
	mirror *registry.Mirror
	client *http.Client
}

func startFleetReplicas(tb testing.TB, n, conns int) []fleetReplica {
	tb.Helper()
	// Peers are marked once each, so the heal limit never turns a mark
	// into a failure.
	first, cfg := registrytest.NewPGStore(tb, pgstore.Config{})
	out := make([]fleetReplica, n)
	for i := range out {
		store := first
		if i > 0 {
			store = registrytest.OpenPGStore(tb, cfg)
		}
		u, m := serveStore(tb, store)
		tr := &http.Transport{MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns}
		tb.Cleanup(tr.CloseIdleConnections)
		out[i] = fleetReplica{url: u, mirror: m, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	}
	return out
}

// post sends body to path on r with token and decodes a 200 answer into out.
func (r fleetReplica) post(ctx context.Context, path, token string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		var p map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return fmt.Errorf("POST %s: %d %v", path, resp.StatusCode, p)
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// registerFleetAPI registers n peers through the replicas' API, 32 at a
// time, half prefills and half decodes.
func registerFleetAPI(tb testing.TB, ctx context.Context, reps []fleetReplica, n int) []fleetPeer {
	tb.Helper()
	peers := make([]fleetPeer, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				role := registry.RolePrefill
				if i%2 == 1 {
					role = registry.RoleDecode
				}
				spec := registrytest.Spec(fmt.Sprintf("fleet-%05d", i), role)
				r := i % len(reps)
				var got struct{ ID, Credential string }
				if err := reps[r].post(ctx, "/api/v1/peers", adminToken, specJSON(spec), &got); err != nil {
					errs <- err
					return
				}
				hb, _ := json.Marshal(map[string]any{"instance_id": spec.InstanceID,
					"load": map[string]any{"running": i % 7, "queued": i % 3, "kv_usage": 0.25}})
				peers[i] = fleetPeer{id: got.ID, credential: got.Credential, body: hb, replica: r}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return peers
}

// heartbeatFleet makes every peer heartbeat once per interval, spread
// evenly over it, until ctx ends.
func heartbeatFleet(ctx context.Context, reps []fleetReplica, peers []fleetPeer, interval time.Duration, res *fleetResult) *sync.WaitGroup {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			path := "/api/v1/peers/" + p.id + "/heartbeat"
			for at := start.Add(time.Duration(i) * interval / time.Duration(len(peers))); ; at = at.Add(interval) {
				select {
				case <-ctx.Done():
					mu.Lock()
					res.hbLatency = append(res.hbLatency, local...)
					mu.Unlock()
					return
				case <-time.After(time.Until(at)):
				}
				t0 := time.Now()
				if err := reps[p.replica].post(ctx, path, p.credential, p.body, nil); err != nil {
					if ctx.Err() == nil {
						atomic.AddInt64(&res.failedHeartbeats, 1)
					}
					continue
				}
				local = append(local, time.Since(t0))
				atomic.AddInt64(&res.heartbeats, 1)
			}
		}()
	}
	return &wg
}

// seenStale waits on snaps until peer id is stale in m's snapshot and
// returns when that was, or false at the deadline.
func seenStale(m *registry.Mirror, snaps <-chan *registry.Snapshot, id string, deadline time.Time) (time.Time, bool) {
	stale := func(s *registry.Snapshot) bool {
		p, ok := s.Peer(id)
		return ok && p.State == registry.StateStale
	}
	if stale(m.Snapshot()) {
		return time.Now(), true
	}
	timeout := time.After(time.Until(deadline))
	for {
		select {
		case s := <-snaps:
			if stale(s) {
				return time.Now(), true
			}
		case <-timeout:
			return time.Time{}, false
		}
	}
}

// markAndWatch marks decode peers stale one after another through replica
// A and times each until every other replica's snapshot shows it.
func markAndWatch(tb testing.TB, ctx context.Context, reps []fleetReplica, peers []fleetPeer, cfg fleetConfig, res *fleetResult) {
	tb.Helper()
	watches := make([]<-chan *registry.Snapshot, len(reps))
	for i := 1; i < len(reps); i++ {
		watches[i] = reps[i].mirror.Watch(ctx)
	}
	body := []byte(`{"reason":"fleet benchmark: transfer failed"}`)
	// The marks have their own connection to replica A, as a router's
	// report would: they do not queue behind the fleet's heartbeats.
	marker := reps[0]
	marker.client = &http.Client{Timeout: 30 * time.Second}
	for k := range cfg.marks {
		p := peers[(k*len(peers)/cfg.marks)|1] // a decode (odd index), spread over the fleet
		for i := 1; i < len(reps); i++ {
			for len(watches[i]) > 0 { // drop a snapshot from before the mark
				<-watches[i]
			}
		}
		start := time.Now()
		if err := marker.post(ctx, "/api/v1/peers/"+p.id+"/stale", adminToken, body, nil); err != nil {
			tb.Fatal(err)
		}
		res.markLatency = append(res.markLatency, time.Since(start))
		seen := make([]time.Duration, len(reps))
		var wg sync.WaitGroup
		for i := 1; i < len(reps); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if at, ok := seenStale(reps[i].mirror, watches[i], p.id, start.Add(10*time.Second)); ok {
					seen[i] = at.Sub(start)
				}
			}()
		}
		wg.Wait()
		if os.Getenv("PDPLANE_FLEET_DEBUG") != "" {
			tb.Logf("mark %d: %v", k, seen)
		}
		for i := 1; i < len(reps); i++ {
			if seen[i] == 0 {
				res.missed++
				continue
			}
			res.fanOut = append(res.fanOut, seen[i])
			res.fanOutCommitted = append(res.fanOutCommitted, max(0, seen[i]-res.markLatency[k]))
		}
		select {
		case <-ctx.Done():
			tb.Fatal(ctx.Err())
		case <-time.After(cfg.gap):
		}
	}
}

// runFleet registers the fleet, lets it heartbeat for one interval, then
// marks decodes stale while it keeps heartbeating, and returns the figures.
func runFleet(tb testing.TB, cfg fleetConfig) fleetResult {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reps := startFleetReplicas(tb, cfg.replicas, cfg.conns)
	t0 := time.Now()
	peers := registerFleetAPI(tb, ctx, reps, cfg.peers)
	tb.Logf("registered %d peers through the API in %v", cfg.peers, time.Since(t0).Round(time.Millisecond))
	var res fleetResult
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	pg := postmasterPID(tb)
	pg0, _ := cpuOf(pg)
	self0, _ := cpuOf(os.Getpid())
	start := time.Now()
	wg := heartbeatFleet(hbCtx, reps, peers, cfg.interval, &res)
	// Every peer has heartbeated once and every replica has caught up
	// with the registrations and first heartbeats before marks are timed.
	for _, r := range reps {
		waitAllReady(tb, ctx, r.mirror, len(peers))
	}
	markAndWatch(tb, ctx, reps, peers, cfg, &res)
	stopHB()
	wg.Wait()
	res.elapsed = time.Since(start)
	pg1, _ := cpuOf(pg)
	self1, _ := cpuOf(os.Getpid())
	res.pgCPU, res.selfCPU = pg1-pg0, self1-self0
	return res
}

// waitAllReady polls m's snapshot until n peers are ready in it.
func waitAllReady(tb testing.TB, ctx context.Context, m *registry.Mirror, n int) {
	tb.Helper()
	for {
		ready := 0
		for _, p := range m.Snapshot().Peers() {
			if p.State == registry.StateReady {
				ready++
			}
		}
		if ready == n {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("%d of %d peers ready in a replica's snapshot: %v", ready, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func cpuOf(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	u, err := bench.ReadUsage(pid)
	return u.CPU, err
}

// postmasterPID finds the PostgreSQL server behind the test database on
// this machine (its process and every backend under it), or 0 when it runs
// elsewhere: the one whose command line listens on the URL's port.
func postmasterPID(tb testing.TB) int {
	u, err := url.Parse(registrytest.DatabaseURL(tb))
	if err != nil || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") {
		return 0
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasSuffix(args[0], "postgres") || !slices.Contains(args, "-D") {
			continue
		}
		if i := slices.Index(args, "-p"); i >= 0 && i+1 < len(args) && args[i+1] == port {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
			return pid
		}
	}
	return 0
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkRegistryFleet runs three control-plane replicas (each its own
// store, pool, listener, mirror and HTTP server, in this process) on one
// PostgreSQL with 10,000 peers heartbeating over HTTP every 2 s, and marks
// 100 decodes stale through replica A while they do: fan-out is the time
// from sending a mark until replicas B and C's snapshots show it. It does
// not depend on b.N. Set PDPLANE_FLEET_PEERS / _MARKS to resize it.
func BenchmarkRegistryFleet(b *testing.B) {
	cfg := fleetConfig{replicas: 3, peers: envInt("PDPLANE_FLEET_PEERS", 10_000), marks: envInt("PDPLANE_FLEET_MARKS", 100),
		interval: 2 * time.Second, gap: 50 * time.Millisecond, conns: envInt("PDPLANE_FLEET_CONNS", 1024)}
	for range b.N {
		res := runFleet(b, cfg)
		secs := res.elapsed.Seconds()
		b.ReportMetric(float64(res.heartbeats)/secs, "heartbeats/s")
		b.ReportMetric(float64(cfg.peers)/cfg.interval.Seconds(), "target/s")
		b.ReportMetric(float64(res.failedHeartbeats), "hb-failed")
		b.ReportMetric(ms(pct(res.hbLatency, 0.5)), "hb-p50-ms")
		b.ReportMetric(ms(pct(res.hbLatency, 0.99)), "hb-p99-ms")
		b.ReportMetric(ms(pct(res.markLatency, 0.5)), "mark-p50-ms")
		b.ReportMetric(ms(pct(res.fanOut, 0.5)), "fanout-p50-ms")
		b.ReportMetric(ms(pct(res.fanOut, 0.99)), "fanout-p99-ms")
		b.ReportMetric(ms(pct(res.fanOutCommitted, 0.5)), "committed-fanout-p50-ms")
		b.ReportMetric(ms(pct(res.fanOutCommitted, 0.99)), "committed-fanout-p99-ms")
		b.ReportMetric(float64(res.missed), "fanout-missed")
		b.ReportMetric(res.pgCPU.Seconds()/secs, "pg-cores")
		b.ReportMetric(res.selfCPU.Seconds()/secs, "replicas+clients-cores")
	}
}

// TestRegistryFleetSmoke runs the fleet benchmark small (100 peers, one
// mark) so that `make test` keeps it working; it asserts what was
// delivered, never how fast.
func TestRegistryFleetSmoke(t *testing.T) {
	t.Parallel()
	res := runFleet(t, fleetConfig{replicas: 3, peers: 100, marks: 1, interval: 200 * time.Millisecond, gap: time.Millisecond, conns: 8})
	if res.missed != 0 || len(res.fanOut) != 2 {
		t.Fatalf("the stale mark reached %d of 2 other replicas (%d missed)", len(res.fanOut), res.missed)
	}
	if res.heartbeats == 0 || res.failedHeartbeats != 0 {
		t.Fatalf("%d heartbeats delivered, %d failed", res.heartbeats, res.failedHeartbeats)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
