package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
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
	"github.com/pdplane/pdplane/registry/replica"
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
	// nice is the agents' process's niceness (startFleetAgents).
	nice int
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
	// announced is the first part of fanOutCommitted: from A's answer
	// until the other replica's store announced the change (PostgreSQL's
	// notification received and passed on); the rest is the mirror's.
	announced []time.Duration
	missed    int // marks some replica never showed within the deadline
	// pgCPU is PostgreSQL's CPU, replicasCPU this process's (the three
	// replicas), agentsCPU the agents' process's.
	pgCPU, replicasCPU, agentsCPU time.Duration
	// schedP50 and schedP99 are how long this process's goroutines waited
	// to run once runnable (the runtime's /sched/latencies:seconds) while
	// the marks were timed: each step of a mark waits about as long.
	schedP50, schedP99 time.Duration
}

// fleetPeer is one registered peer as its agent knows it.
type fleetPeer struct {
	ID         string `json:"id"`
	Credential string `json:"credential"`
	Body       []byte `json:"body"`    // its heartbeat
	Replica    int    `json:"replica"` // the replica it heartbeats through
}

// fleetReplica is one control plane: its own pool, listener, mirror and
// HTTP server over the shared schema.
type fleetReplica struct {
	url    string
	store  registry.Store
	mirror *replica.Mirror
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
		out[i] = fleetReplica{url: u, store: store, mirror: m, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
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
				peers[i] = fleetPeer{ID: got.ID, Credential: got.Credential, Body: hb, Replica: r}
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
			path := "/api/v1/peers/" + p.ID + "/heartbeat"
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
				if err := reps[p.Replica].post(ctx, path, p.Credential, p.Body, nil); err != nil {
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
func seenStale(m *replica.Mirror, snaps <-chan *replica.Snapshot, id string, deadline time.Time) (time.Time, bool) {
	stale := func(s *replica.Snapshot) bool {
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

// announcements records when a store first announced each peer's change
// (since forget).
type announcements struct {
	mu sync.Mutex
	at map[string]time.Time
}

func watchAnnouncements(ctx context.Context, s registry.Store) *announcements {
	a := &announcements{at: map[string]time.Time{}}
	changes := s.Subscribe(ctx)
	go func() {
		for c := range changes {
			now := time.Now()
			a.mu.Lock()
			for _, id := range c.PeerIDs {
				if _, ok := a.at[id]; !ok {
					a.at[id] = now
				}
			}
			a.mu.Unlock()
		}
	}()
	return a
}

// forget drops what was recorded of id, so that the next announcement of
// it is the one recorded.
func (a *announcements) forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.at, id)
}

func (a *announcements) of(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// markAndWatch marks decode peers stale one after another through replica
// A and times each until every other replica's snapshot shows it.
func markAndWatch(tb testing.TB, ctx context.Context, reps []fleetReplica, peers []fleetPeer, cfg fleetConfig, res *fleetResult) {
	tb.Helper()
	watches := make([]<-chan *replica.Snapshot, len(reps))
	announced := make([]*announcements, len(reps))
	for i := 1; i < len(reps); i++ {
		watches[i] = reps[i].mirror.Watch(ctx)
		announced[i] = watchAnnouncements(ctx, reps[i].store)
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
			announced[i].forget(p.ID) // and an announcement
		}
		start := time.Now()
		if err := marker.post(ctx, "/api/v1/peers/"+p.ID+"/stale", adminToken, body, nil); err != nil {
			tb.Fatal(err)
		}
		res.markLatency = append(res.markLatency, time.Since(start))
		seen := make([]time.Duration, len(reps))
		var wg sync.WaitGroup
		for i := 1; i < len(reps); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if at, ok := seenStale(reps[i].mirror, watches[i], p.ID, start.Add(10*time.Second)); ok {
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
			if at, ok := announced[i].of(p.ID); ok {
				res.announced = append(res.announced, max(0, at.Sub(start)-res.markLatency[k]))
			}
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
	pg := postmasterPID(tb)
	pg0, _ := cpuOf(pg)
	self0, _ := cpuOf(os.Getpid())
	start := time.Now()
	agents := startFleetAgents(tb, reps, peers, cfg)
	defer agents.kill()
	// Every peer has heartbeated once and every replica has caught up
	// with the registrations and first heartbeats before marks are timed.
	for _, r := range reps {
		waitAllReady(tb, ctx, r.mirror, len(peers))
	}
	stopProfile := profileCPU(tb, os.Getenv("PDPLANE_FLEET_CPUPROFILE"))
	sched0 := schedLatencies()
	markAndWatch(tb, ctx, reps, peers, cfg, &res)
	sched1 := schedLatencies()
	res.schedP50, res.schedP99 = schedWait(sched0, sched1, 0.5), schedWait(sched0, sched1, 0.99)
	stopProfile()
	agents.stop(tb, &res)
	res.elapsed = time.Since(start)
	pg1, _ := cpuOf(pg)
	self1, _ := cpuOf(os.Getpid())
	res.pgCPU, res.replicasCPU = pg1-pg0, self1-self0
	return res
}

// The agents heartbeat from a process of their own: agents run on the
// engines' hosts, not beside the control plane, and in this process their
// 10,000 HTTP clients took CPU from the replicas whose fan-out is timed.
// The benchmark runs that process at a lower priority (nice 19,
// PDPLANE_FLEET_AGENTS_NICE; 0 keeps the benchmark's): the replicas and
// PostgreSQL come first on this machine's cores, as on separate hosts, and
// the agents get what is left. What they delivered is reported (heartbeats/s against
// target/s), so a starved load shows rather than flatters the figures.
const fleetAgentsEnv = "PDPLANE_FLEET_AGENTS_SPEC"

// fleetAgentsSpec is what the agents' process is given: the replicas to
// heartbeat through and the peers to heartbeat as.
type fleetAgentsSpec struct {
	Replicas []string      `json:"replicas"`
	Peers    []fleetPeer   `json:"peers"`
	Interval time.Duration `json:"interval"`
	Conns    int           `json:"conns"`
}

// fleetAgentsResult is what the agents' process delivered, written to its
// standard output when its standard input ends.
type fleetAgentsResult struct {
	Heartbeats int64           `json:"heartbeats"`
	Failed     int64           `json:"failed"`
	Latency    []time.Duration `json:"latency"`
}

// TestMain runs this test binary as the fleet benchmark's agents when
// fleetAgentsEnv names their spec, and as the tests otherwise.
func TestMain(m *testing.M) {
	if spec := os.Getenv(fleetAgentsEnv); spec != "" {
		if err := runFleetAgents(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet agents:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runFleetAgents heartbeats every peer of the spec at specPath until stop
// ends, then writes what it delivered to out.
func runFleetAgents(specPath string, stop io.Reader, out io.Writer) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec fleetAgentsSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	reps := make([]fleetReplica, len(spec.Replicas))
	for i, u := range spec.Replicas {
		tr := &http.Transport{MaxConnsPerHost: spec.Conns, MaxIdleConnsPerHost: spec.Conns}
		defer tr.CloseIdleConnections()
		reps[i] = fleetReplica{url: u, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stop)
		cancel()
	}()
	var res fleetResult
	heartbeatFleet(ctx, reps, spec.Peers, spec.Interval, &res).Wait()
	return json.NewEncoder(out).Encode(fleetAgentsResult{Heartbeats: res.heartbeats, Failed: res.failedHeartbeats, Latency: res.hbLatency})
}

// fleetAgents is the running agents' process.
type fleetAgents struct {
	tb     testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout bytes.Buffer
	stderr bytes.Buffer
}

// startFleetAgents starts this test binary as the agents of peers.
func startFleetAgents(tb testing.TB, reps []fleetReplica, peers []fleetPeer, cfg fleetConfig) *fleetAgents {
	tb.Helper()
	spec := fleetAgentsSpec{Peers: peers, Interval: cfg.interval, Conns: cfg.conns}
	for _, r := range reps {
		spec.Replicas = append(spec.Replicas, r.url)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "agents.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	a := &fleetAgents{cmd: exec.Command(exe)}
	if cfg.nice != 0 {
		a.cmd = exec.Command("nice", "-n", strconv.Itoa(cfg.nice), exe)
	}
	a.tb = tb
	a.cmd.Env = append(os.Environ(), fleetAgentsEnv+"="+path)
	a.cmd.Stdout, a.cmd.Stderr = &a.stdout, &a.stderr
	if a.stdin, err = a.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		tb.Fatalf("start the agents' process: %v", err)
	}
	return a
}

// stop ends the heartbeats and adds what the agents delivered, and the
// CPU their process used, to res.
func (a *fleetAgents) stop(tb testing.TB, res *fleetResult) {
	tb.Helper()
	cpu, err := cpuOf(a.cmd.Process.Pid)
	if err != nil {
		tb.Fatalf("the agents' CPU: %v", err)
	}
	_ = a.stdin.Close()
	if err := a.cmd.Wait(); err != nil {
		tb.Fatalf("the agents' process: %v\n%s", err, a.stderr.String())
	}
	var got fleetAgentsResult
	if err := json.Unmarshal(a.stdout.Bytes(), &got); err != nil {
		tb.Fatalf("the agents' result: %v\n%s", err, a.stderr.String())
	}
	res.heartbeats, res.failedHeartbeats, res.hbLatency = got.Heartbeats, got.Failed, got.Latency
	res.agentsCPU = cpu
}

// kill ends the agents' process if stop did not, and shows what it said
// when the benchmark failed (an agents' process that died early leaves
// the replicas waiting for heartbeats).
func (a *fleetAgents) kill() {
	if a.cmd.ProcessState == nil {
		_ = a.cmd.Process.Kill()
		_ = a.cmd.Wait()
	}
	if a.tb.Failed() && a.stderr.Len() > 0 {
		a.tb.Logf("the agents' process said:\n%s", a.stderr.String())
	}
}

// waitAllReady polls m's snapshot until n peers are ready in it.
func waitAllReady(tb testing.TB, ctx context.Context, m *replica.Mirror, n int) {
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

// profileCPU profiles this process's CPU into path (nothing when path is
// empty) until the returned function is called: the replicas while the
// marks are timed, without the registrations before.
func profileCPU(tb testing.TB, path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		tb.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			tb.Error(err)
		}
	}
}

// schedLatencies is the runtime's histogram of how long goroutines waited
// to run once runnable, nil where the runtime has none.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedWait is the quantile q of the waits counted between the histograms
// before and after, to the upper bound of its bucket.
func schedWait(before, after *metrics.Float64Histogram, q float64) time.Duration {
	if before == nil || after == nil {
		return 0
	}
	var total uint64
	for i := range after.Counts {
		total += after.Counts[i] - before.Counts[i]
	}
	var seen uint64
	for i := range after.Counts {
		seen += after.Counts[i] - before.Counts[i]
		if total > 0 && float64(seen) >= q*float64(total) {
			upper := after.Buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = after.Buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
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
// from sending a mark until replicas B and C's snapshots show it. The
// agents heartbeat from a process of their own, at nice 19 unless
// PDPLANE_FLEET_AGENTS_NICE says otherwise (startFleetAgents). It does not
// depend on b.N. Set PDPLANE_FLEET_PEERS / _MARKS to resize it, and
// PDPLANE_FLEET_CPUPROFILE to a file to profile the replicas while the marks
// are timed.
func BenchmarkRegistryFleet(b *testing.B) {
	nice := 19
	if v := os.Getenv("PDPLANE_FLEET_AGENTS_NICE"); v != "" {
		var err error
		if nice, err = strconv.Atoi(v); err != nil {
			b.Fatalf("PDPLANE_FLEET_AGENTS_NICE: %v", err)
		}
	}
	cfg := fleetConfig{replicas: 3, peers: envInt("PDPLANE_FLEET_PEERS", 10_000), marks: envInt("PDPLANE_FLEET_MARKS", 100),
		interval: 2 * time.Second, gap: 50 * time.Millisecond, conns: envInt("PDPLANE_FLEET_CONNS", 1024), nice: nice}
	for range b.N {
		res := runFleet(b, cfg)
		secs := res.elapsed.Seconds()
		b.ReportMetric(float64(res.heartbeats)/secs, "heartbeats/s")
		b.ReportMetric(float64(cfg.peers)/cfg.interval.Seconds(), "target/s")
		b.ReportMetric(float64(res.failedHeartbeats), "hb-failed")
		b.ReportMetric(ms(pct(res.hbLatency, 0.5)), "hb-p50-ms")
		b.ReportMetric(ms(pct(res.hbLatency, 0.99)), "hb-p99-ms")
		b.ReportMetric(ms(pct(res.markLatency, 0.5)), "mark-p50-ms")
		b.ReportMetric(ms(pct(res.markLatency, 0.99)), "mark-p99-ms")
		b.ReportMetric(ms(pct(res.fanOut, 0.5)), "fanout-p50-ms")
		b.ReportMetric(ms(pct(res.fanOut, 0.99)), "fanout-p99-ms")
		b.ReportMetric(ms(pct(res.fanOutCommitted, 0.5)), "committed-fanout-p50-ms")
		b.ReportMetric(ms(pct(res.fanOutCommitted, 0.99)), "committed-fanout-p99-ms")
		b.ReportMetric(ms(pct(res.announced, 0.5)), "announced-p50-ms")
		b.ReportMetric(ms(pct(res.announced, 0.99)), "announced-p99-ms")
		b.ReportMetric(float64(res.missed), "fanout-missed")
		b.ReportMetric(ms(res.schedP50), "replicas-sched-wait-p50-ms")
		b.ReportMetric(ms(res.schedP99), "replicas-sched-wait-p99-ms")
		b.ReportMetric(res.pgCPU.Seconds()/secs, "pg-cores")
		b.ReportMetric(res.replicasCPU.Seconds()/secs, "replicas-cores")
		b.ReportMetric(res.agentsCPU.Seconds()/secs, "agents-cores")
	}
}

// TestRegistryFleetSmoke runs the fleet benchmark small (100 peers, one
// mark, the agents' process at the tests' priority) so that `make test`
// keeps it working; it asserts what was delivered, never how fast.
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
