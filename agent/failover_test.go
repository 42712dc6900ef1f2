package agent_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim/simtest"
)

const (
	failoverHeartbeat = 50 * time.Millisecond
	failoverTTL       = time.Second
)

// startReplica serves the control-plane API over store, as one of several
// `pdplane serve` replicas sharing a database, on ln (a fresh port when
// nil). It runs the replica's lease sweeper too.
func startReplica(t *testing.T, store registry.Store, ln net.Listener) *httptest.Server {
	t.Helper()
	return startReplicaWith(t, store, ln, nil, false, failoverTTL)
}

// startReplicaWith is startReplica with wrap, when set, around the
// replica's handler, serving HTTPS when tls is set.
func startReplicaWith(t *testing.T, store registry.Store, ln net.Listener, wrap func(http.Handler) http.Handler, tls bool, ttl time.Duration) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t))
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sw, err := registry.NewLeaseSweeper(registry.SweeperConfig{Interval: failoverHeartbeat}, store, log)
	if err != nil {
		t.Fatal(err)
	}
	go sw.Run(ctx)
	srv, err := server.New(server.Config{JoinTokens: []string{"tok"}, HeartbeatInterval: failoverHeartbeat, LeaseTTL: ttl},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, log)
	if err != nil {
		t.Fatal(err)
	}
	h := srv.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewUnstartedServer(h)
	if ln != nil {
		ts.Listener.Close()
		ts.Listener = ln
	}
	if tls {
		ts.StartTLS()
	} else {
		ts.Start()
	}
	t.Cleanup(ts.Close)
	return ts
}

// failoverConfig is the agent configuration of the failover tests: the
// replicas at urls, quick retries and a quick return to the first replica.
func failoverConfig(urls ...string) agent.Config {
	return agent.Config{ControlPlane: strings.Join(urls, ","), JoinToken: "tok", Probe: noProbe,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		FailbackMin: 100 * time.Millisecond, FailbackMax: 200 * time.Millisecond}
}

// runFailoverAgent runs an agent built from cfg (failoverConfig, mostly)
// until the test ends.
func runFailoverAgent(t *testing.T, cfg agent.Config, eng agent.Engine) *agent.Agent {
	t.Helper()
	a, _, _ := startAgent(t, cfg, eng, testLog(t))
	return a
}

// waitUntil waits for cond with a deadline and returns how long it took.
func waitUntil(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	simtest.WaitFor(t, what, cond)
	return time.Since(start)
}

// heartbeatAfter reports whether the peer named name heartbeat after t.
func heartbeatAfter(s registry.Store, name string, t time.Time) bool {
	peers, _ := s.List(context.Background(), registry.Filter{})
	for _, p := range peers {
		if p.Name == name && p.LastHeartbeat != nil && p.LastHeartbeat.After(t) {
			return true
		}
	}
	return false
}

func expiredEvents(t *testing.T, s registry.Store) int {
	t.Helper()
	evs, err := s.Events(context.Background(), registry.EventQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Kind == registry.EventExpired {
			n++
		}
	}
	return n
}

// TestAgentFailsOverWhenReplicaDies: two replicas share one store and the
// agent lists both. The replica it uses is killed (its port refuses
// connections): the next heartbeat goes to the survivor, the lease never
// lapses, and when the first replica is back the agent returns to it.
func TestAgentFailsOverWhenReplicaDies(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Config{LeaseTTL: failoverTTL})
	lnA := bench.ListenFree(t) // listened on again when the replica is back
	addrA := lnA.Addr().String()
	a, b := startReplica(t, store, lnA), startReplica(t, store, nil)
	ag := runFailoverAgent(t, failoverConfig(a.URL, b.URL), &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})
	waitPeer(t, store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	if got := ag.ControlPlane(); got != a.URL {
		t.Fatalf("agent uses %q, want the first replica %s", got, a.URL)
	}

	killed := time.Now()
	a.Close()
	took := waitUntil(t, "a heartbeat through the surviving replica", func() bool {
		return ag.ControlPlane() == b.URL && heartbeatAfter(store, "d0", killed)
	})
	t.Logf("first heartbeat through the survivor %s after the kill (heartbeat interval %s, lease %s)", took, failoverHeartbeat, failoverTTL)
	if took >= failoverTTL {
		t.Errorf("failover took %s, not within the lease of %s", took, failoverTTL)
	}

	ln, err := net.Listen("tcp", addrA)
	if err != nil {
		t.Fatalf("relisten on %s: %v", addrA, err)
	}
	startReplica(t, store, ln)
	waitUntil(t, "the agent back on the first replica", func() bool { return ag.ControlPlane() == a.URL })
	if n := expiredEvents(t, store); n != 0 {
		t.Fatalf("%d lease expiries; the agent always had a replica", n)
	}
	if p := waitPeer(t, store, "d0", func(registry.Peer) bool { return true }); p.State != registry.StateReady || p.Generation != 1 {
		t.Fatalf("peer after failover and failback: %s generation %d, want ready, never re-registered", p.State, p.Generation)
	}
}

// TestAgentFailsOverOn503: the replica the agent uses loses its database
// (a real outage through registrytest.Outage) and answers 503; the agent
// heartbeats through the other replica, which can still write, and returns
// once the first one can write again. No lease lapses on either replica.
func TestAgentFailsOverOn503(t *testing.T) {
	t.Parallel()
	cut, outage, cfg := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: failoverTTL})
	whole := registrytest.OpenPGStore(t, cfg)
	a, b := startReplica(t, cut, nil), startReplica(t, whole, nil)
	ag := runFailoverAgent(t, failoverConfig(a.URL, b.URL), &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})
	waitPeer(t, whole, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	waitUntil(t, "the agent on the first replica", func() bool { return ag.ControlPlane() == a.URL })

	outage.Cut()
	cutAt := time.Now()
	took := waitUntil(t, "a heartbeat through the replica that can write", func() bool {
		return ag.ControlPlane() == b.URL && heartbeatAfter(whole, "d0", cutAt)
	})
	t.Logf("first heartbeat through the other replica %s after the outage began", took)
	// Several leases' worth of heartbeats through b.
	hold := time.Now().Add(2 * failoverTTL)
	waitUntil(t, "two lease TTLs on the other replica", func() bool { return heartbeatAfter(whole, "d0", hold) })

	outage.Restore()
	waitUntil(t, "the agent back on the first replica", func() bool { return ag.ControlPlane() == a.URL })
	if n := expiredEvents(t, whole); n != 0 {
		t.Fatalf("%d lease expiries; the agent always had a replica that could write", n)
	}
}

func TestParseControlPlanes(t *testing.T) {
	t.Parallel()
	got, err := agent.ParseControlPlanes(" http://a:8080/ ,https://b,")
	if err != nil || strings.Join(got, " ") != "http://a:8080 https://b" {
		t.Fatalf("parse: %v, %v", got, err)
	}
	for _, bad := range []string{"", " , ", "a:8080", "ftp://a", "http://"} {
		if _, err := agent.ParseControlPlanes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := agent.New(agent.Config{ControlPlane: "http://a,b"}, &fakeEngine{}, zerolog.Nop()); err == nil ||
		!strings.Contains(err.Error(), `URL 2 "b"`) {
		t.Errorf("a bad second URL: %v, want an error naming it", err)
	}
}

// TestAgentRetriesWithinLease: the only replica's database is away for
// several leases, so every heartbeat is answered 503 and the agent backs
// off. Once the database is back the replica grants every lease one TTL;
// the agent's pause between retries is capped well inside it (a quarter of
// the lease), so its next heartbeat lands in time however long the outage
// lasted, with backoffs configured far above the lease.
func TestAgentRetriesWithinLease(t *testing.T) {
	t.Parallel()
	store, outage, _ := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: failoverTTL})
	cp := startReplica(t, store, nil)
	runFailoverAgent(t, agent.Config{ControlPlane: cp.URL, JoinToken: "tok", Probe: noProbe, MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second},
		&fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})
	waitPeer(t, store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })

	outage.Cut()
	// Hold the outage long enough for an uncapped backoff to pass the lease.
	<-time.After(3 * failoverTTL)
	outage.Restore()
	back := time.Now()
	took := waitUntil(t, "a heartbeat after the outage", func() bool { return heartbeatAfter(store, "d0", back) })
	t.Logf("first heartbeat %s after the store came back (lease %s)", took, failoverTTL)
	// The grace the replica grants runs one TTL from the store's return:
	// the heartbeat must land within it. The time counts the agent's
	// capped pause (a quarter of the lease) and the heartbeat's own round
	// trip through a store that is reconnecting (440 ms in a loaded CI
	// run); an uncapped backoff would take 10 s.
	if took >= failoverTTL {
		t.Errorf("the agent came back %s after the store, past the lease %s", took, failoverTTL)
	}
	if n := expiredEvents(t, store); n != 0 {
		t.Errorf("%d lease expiries", n)
	}
}

// TestAgentFailsOverAcrossAddressesOfOneName: one control-plane URL whose
// name resolves to two addresses (a headless Service, round-robin DNS),
// each a replica. When the replica at the first address answers 503 the
// agent heartbeats through the second, still under the name: every request
// carries the name as its Host header and, over HTTPS, as its TLS server
// name (the test certificate covers *.example.com and 127.0.0.1, not
// 127.0.0.2, so a connection verified by address would fail).
func TestAgentFailsOverAcrossAddressesOfOneName(t *testing.T) {
	t.Parallel()
	for _, scheme := range []string{"http", "https"} {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			testFailoverAcrossAddresses(t, scheme)
		})
	}
}

func testFailoverAcrossAddresses(t *testing.T, scheme string) {
	cut, outage, cfg := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: failoverTTL})
	whole := registrytest.OpenPGStore(t, cfg)
	lnA := bench.ListenFree(t) // listened on again when the replica is back
	port := strconv.Itoa(lnA.Addr().(*net.TCPAddr).Port)
	lnB, err := net.Listen("tcp", "127.0.0.2:"+port)
	if err != nil {
		t.Skipf("no second loopback address to serve a second replica on: %v", err)
	}
	name := "cp.example.com:" + port
	var mu sync.Mutex
	hosts := map[string]int{}
	recordHost := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hosts[r.Host]++
			if r.TLS != nil {
				hosts["sni "+r.TLS.ServerName]++
			}
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	}
	tls := scheme == "https"
	tsA := startReplicaWith(t, cut, lnA, recordHost, tls, failoverTTL)
	startReplicaWith(t, whole, lnB, recordHost, tls, failoverTTL)
	agentCfg := failoverConfig(scheme + "://" + name)
	agentCfg.HTTPClient = tsA.Client()
	agentCfg.LookupHost = func(_ context.Context, host string) ([]string, error) {
		if host != "cp.example.com" {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return []string{"127.0.0.1", "127.0.0.2"}, nil
	}
	a := runFailoverAgent(t, agentCfg, &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})

	first, second := scheme+"://"+name+" (127.0.0.1:"+port+")", scheme+"://"+name+" (127.0.0.2:"+port+")"
	waitPeer(t, whole, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	waitUntil(t, "the agent on the first address", func() bool { return a.ControlPlane() == first })
	outage.Cut()
	cutAt := time.Now()
	waitUntil(t, "a heartbeat through the second address", func() bool {
		return a.ControlPlane() == second && heartbeatAfter(whole, "d0", cutAt)
	})
	outage.Restore()
	waitUntil(t, "the agent back on the first address", func() bool { return a.ControlPlane() == first })
	mu.Lock()
	defer mu.Unlock()
	want := 1
	if tls {
		want = 2
		if hosts["sni cp.example.com"] == 0 {
			t.Errorf("TLS server names seen by the replicas: %v, want cp.example.com", hosts)
		}
	}
	if len(hosts) != want || hosts[name] == 0 {
		t.Errorf("Host headers seen by the replicas: %v, want only %s", hosts, name)
	}
}

// TestAgentFailsBackAfterSharedOutage: both replicas lose their database,
// so the agent's every call fails on both and both earn a long pause
// (FailbackMax is 10 s here). The second replica's database comes back
// first and the agent heartbeats through it; when the first one's comes
// back, the agent returns to it within a second, not after the pause.
func TestAgentFailsBackAfterSharedOutage(t *testing.T) {
	t.Parallel()
	cutA, outageA, cfg := registrytest.NewPGStoreWithOutage(t, pgstore.Config{LeaseTTL: failoverTTL})
	outageB, viaB := registrytest.NewOutage(t, cfg.URL)
	cfgB := cfg
	cfgB.URL = viaB
	cutB := registrytest.OpenPGStore(t, cfgB)
	a, b := startReplica(t, cutA, nil), startReplica(t, cutB, nil)
	agentCfg := failoverConfig(a.URL, b.URL)
	agentCfg.FailbackMax = 10 * time.Second
	ag := runFailoverAgent(t, agentCfg, &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})
	whole := registrytest.OpenPGStore(t, cfg)
	waitPeer(t, whole, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	waitUntil(t, "the agent on the first replica", func() bool { return ag.ControlPlane() == a.URL })

	outageA.Cut()
	outageB.Cut()
	<-time.After(3 * failoverTTL) // the outage: many failed calls on both replicas
	outageB.Restore()
	backB := time.Now()
	waitUntil(t, "a heartbeat through the second replica", func() bool {
		return ag.ControlPlane() == b.URL && heartbeatAfter(whole, "d0", backB)
	})
	outageA.Restore()
	took := waitUntil(t, "the agent back on the first replica", func() bool { return ag.ControlPlane() == a.URL })
	t.Logf("failed back %s after the first replica's database returned", took)
	if took > time.Second {
		t.Errorf("failback took %s; want within a second", took)
	}
}

// TestAgentFailsOverFromHungReplica: the first replica accepts heartbeats
// and never answers them (a wedged process). Each try there is cut off
// after two heartbeat intervals or a second, and the heartbeat goes on to
// the second replica, so heartbeats land at most about a second apart,
// inside the 2 s lease, though the HTTP client would wait 5 s.
func TestAgentFailsOverFromHungReplica(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	store := memstore.New(memstore.Config{LeaseTTL: ttl})
	var tries atomic.Int64
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/heartbeat") {
			http.Error(w, "not here", http.StatusServiceUnavailable) // registration goes on
			return
		}
		tries.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); hung.Close() })
	good := startReplicaWith(t, store, nil, nil, false, ttl)
	cfg := failoverConfig(hung.URL, good.URL)
	cfg.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	cfg.FailbackMin = 200 * time.Millisecond
	runFailoverAgent(t, cfg, &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)})
	waitPeer(t, store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })

	watchUntil := time.Now().Add(2 * ttl)
	waitUntil(t, "two leases of heartbeats", func() bool { return heartbeatAfter(store, "d0", watchUntil) })
	if n := tries.Load(); n < 2 {
		t.Fatalf("the hung replica was tried %d times; the test needs it tried again and again", n)
	}
	if n := expiredEvents(t, store); n != 0 {
		t.Fatalf("%d lease expiries behind a hung replica", n)
	}
	t.Logf("the hung replica held %d heartbeat tries; no lease lapsed", tries.Load())
}
