package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/transfer"
)

// fakeEngine stands in for an engine process: its spec, and a counter of
// fresh NIXL agents it was asked to create.
type fakeEngine struct {
	mu    sync.Mutex
	spec  registry.PeerSpec
	fresh int
}

func (e *fakeEngine) Spec(context.Context) (registry.PeerSpec, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.spec
	s.Ranks = append([]registry.Rank(nil), e.spec.Ranks...)
	for i := range s.Ranks {
		s.Ranks[i].AgentName = fmt.Sprintf("%s-%d", e.spec.Ranks[i].AgentName, e.fresh)
	}
	return s, nil
}

func (e *fakeEngine) Reregister(context.Context, string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fresh++
	return nil
}

type controlPlane struct {
	url    string
	store  *memstore.Store
	mirror *replica.Mirror
	close  func()
}

func startControlPlane(t *testing.T, ln net.Listener) controlPlane {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := zerolog.New(zerolog.NewTestWriter(t))
	store := memstore.New(memstore.Config{LeaseTTL: time.Second})
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, log)
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{AdminToken: "admin", JoinTokens: []string{"tok"}, HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: time.Second},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, log)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(srv.Handler())
	if ln != nil {
		ts.Listener.Close()
		ts.Listener = ln
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return controlPlane{url: ts.URL, store: store, mirror: mirror, close: ts.Close}
}

func runAgent(t *testing.T, url string, eng agent.Engine) (*agent.Agent, chan error) {
	t.Helper()
	a, done, _ := runAgentWith(t, agent.Config{ControlPlane: url}, eng)
	return a, done
}

// noProbe turns the engine probes off: the fake engines here have no HTTP
// side (the probes are tested against the simulator in
// engine_probe_test.go), and an engine that never answered a probe is
// unhealthy.
var noProbe = agent.ProbeConfig{Disabled: true}

// runAgentWith runs an agent with the join token "tok"; stop ends it early
// (an agent process that exits) and waits for it.
func runAgentWith(t *testing.T, cfg agent.Config, eng agent.Engine) (a *agent.Agent, done chan error, stop func()) {
	t.Helper()
	return runAgentLogging(t, cfg, eng, zerolog.New(zerolog.NewTestWriter(t)))
}

func runAgentLogging(t *testing.T, cfg agent.Config, eng agent.Engine, log zerolog.Logger) (a *agent.Agent, done chan error, stop func()) {
	t.Helper()
	cfg.JoinToken, cfg.MinBackoff, cfg.MaxBackoff, cfg.Probe = "tok", 20*time.Millisecond, 100*time.Millisecond, noProbe
	return startAgent(t, cfg, eng, log)
}

// startAgent runs an agent built from cfg as given until the test ends;
// stop ends it early (an agent process that exits) and waits for it.
func startAgent(t *testing.T, cfg agent.Config, eng agent.Engine, log zerolog.Logger) (a *agent.Agent, done chan error, stop func()) {
	t.Helper()
	a, err := agent.New(cfg, eng, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return a, done, stop
}

// testLog is a logger writing to the test's log.
func testLog(t *testing.T) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

func waitPeer(t *testing.T, s registry.Store, name string, ok func(p registry.Peer) bool) registry.Peer {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		peers, _ := s.List(context.Background(), registry.Filter{})
		for _, p := range peers {
			if p.Name == name && ok(p) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer %s never reached the expected state; peers: %+v", name, peers)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAgentRegistersHeartbeatsAndReregisters(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	eng := &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)}
	runAgent(t, cp.url, eng)

	p := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	if p.Generation != 1 || p.Ranks[0].AgentName != "d0-agent-0-0" {
		t.Fatalf("first registration: gen %d agent %s", p.Generation, p.Ranks[0].AgentName)
	}
	if _, err := cp.store.MarkStale(context.Background(), p.ID, "transfer failed", "Missing NIXL destination KV memory kind"); err != nil {
		t.Fatal(err)
	}
	q := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.Generation == 2 })
	if q.State != registry.StateReady || q.ID != p.ID || q.Ranks[0].AgentName != "d0-agent-0-1" {
		t.Fatalf("after re-registration: state %s id %s agent %s", q.State, q.ID, q.Ranks[0].AgentName)
	}
}

func TestAgentRefusedGeometryStops(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	spec := registrytest.Spec("d0", registry.RoleDecode)
	spec.Ranks[0].KVMemKinds = nil
	_, done := runAgent(t, cp.url, &fakeEngine{spec: spec})
	select {
	case err := <-done:
		var refused *agent.RefusedError
		if !errors.As(err, &refused) || refused.Status != 422 || refused.Problem.Field == nil || *refused.Problem.Field != "ranks[0].kv_mem_kinds" {
			t.Fatalf("Run returned %v, want a 422 refusal naming ranks[0].kv_mem_kinds", err)
		}
		done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("agent kept retrying a refused geometry")
	}
}

// TestAgentWaitsForControlPlane starts the agent before the control plane
// exists, then starts it: the agent registers once it is reachable, and
// again after the control plane restarts empty (the embedded store).
func TestAgentWaitsForControlPlane(t *testing.T) {
	t.Parallel()
	addr := bench.FreeAddr(t) // the control plane listens there later
	failures := &messageCounter{msg: "registration failed; retrying", seen: make(chan struct{}, 100)}
	log := zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), failures))
	runAgentLogging(t, agent.Config{ControlPlane: "http://" + addr}, &fakeEngine{spec: registrytest.Spec("p0", registry.RolePrefill)}, log)
	// The control plane starts only after the agent has failed to reach
	// it a few times and kept trying.
	for i := range 3 {
		select {
		case <-failures.seen:
		case <-time.After(5 * time.Second):
			t.Fatalf("the agent logged %d failed registrations in 5s, want 3 while the control plane is down", i)
		}
	}

	relisten := func() net.Listener {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("relisten on %s: %v", addr, err)
		}
		return l
	}
	cp := startControlPlane(t, relisten())
	first := waitPeer(t, cp.store, "p0", func(p registry.Peer) bool { return p.State == registry.StateReady })

	cp.close()
	cp2 := startControlPlane(t, relisten())
	again := waitPeer(t, cp2.store, "p0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	if again.ID == first.ID {
		t.Fatalf("a new, empty control plane kept the old id")
	}
}

// messageCounter is a log writer that signals on seen for each JSON log line
// whose message is msg.
type messageCounter struct {
	msg  string
	seen chan struct{}
}

func (m *messageCounter) Write(p []byte) (int, error) {
	var line struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(p, &line) == nil && line.Message == m.msg {
		select {
		case m.seen <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func TestReportFor(t *testing.T) {
	t.Parallel()
	missing := fmt.Errorf("plan: %w", &transfer.MissingMemKindError{Agent: "d0-g1"})
	for _, tc := range []struct {
		name   string
		err    error
		decode string
		want   agent.TransferReport
	}{
		{"prefill reports the decode it could not write to", missing, "id-d0",
			agent.TransferReport{DecodeID: "id-d0", DecodeAgent: "d0-g1", PrefillID: "id-p0",
				Reason: "KV transfer failed: destination memory kind missing", Error: missing.Error()}},
		{"other transfer errors name no decode agent", errors.New("peer gone"), "id-d0",
			agent.TransferReport{DecodeID: "id-d0", PrefillID: "id-p0", Reason: "KV transfer failed", Error: "peer gone"}},
		{"a decode that could not pull reports itself", missing, "id-p0",
			agent.TransferReport{DecodeID: "id-p0", DecodeAgent: "self-agent",
				Reason: "KV transfer failed: destination memory kind missing", Error: missing.Error()}},
		{"error text the registry would refuse is cleaned", errors.New("remote said \x00\xff"), "id-d0",
			agent.TransferReport{DecodeID: "id-d0", PrefillID: "id-p0", Reason: "KV transfer failed", Error: "remote said \uFFFD\uFFFD"}},
	} {
		if got := agent.ReportFor(tc.err, tc.decode, "id-p0", "self-agent"); got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// TestAgentKeepsCredential pins that the credential a registration issues
// goes to --credential-file (owner-only), and that a restarted agent using
// the file re-registers its live name at once, keeping the credential.
func TestAgentKeepsCredential(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	file := filepath.Join(t.TempDir(), "credential")
	eng := &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)}
	_, _, stop := runAgentWith(t, agent.Config{ControlPlane: cp.url, CredentialFile: file}, eng)
	first := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !registry.CredentialMatches(first.CredentialHash, strings.TrimSpace(string(data))) {
		t.Fatalf("the credential file does not hold the peer's credential")
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credential file mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	stop()

	// A restarted engine: a new instance, registered while the old lease is
	// still running.
	eng.mu.Lock()
	eng.spec.InstanceID = "restarted"
	eng.mu.Unlock()
	runAgentWith(t, agent.Config{ControlPlane: cp.url, CredentialFile: file}, eng)
	again := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.InstanceID == "restarted" })
	if !again.LeaseExpiry.After(first.LeaseExpiry) || !bytes.Equal(again.CredentialHash, first.CredentialHash) {
		t.Fatalf("restart with the credential file: lease %v (was %v), credential kept %v",
			again.LeaseExpiry, first.LeaseExpiry, bytes.Equal(again.CredentialHash, first.CredentialHash))
	}
}

// TestAgentWithoutCredentialReclaimsAfterLease pins the other way back: an
// agent that lost its credential is refused while the old lease runs, and
// claims the name with the join token once it has run out.
func TestAgentWithoutCredentialReclaimsAfterLease(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	eng := &fakeEngine{spec: registrytest.Spec("d0", registry.RoleDecode)}
	_, _, stop := runAgentWith(t, agent.Config{ControlPlane: cp.url}, eng)
	ready := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	stop()
	first, err := cp.store.Get(context.Background(), ready.ID) // its last lease
	if err != nil {
		t.Fatal(err)
	}

	eng.mu.Lock()
	eng.spec.InstanceID = "restarted"
	eng.mu.Unlock()
	runAgentWith(t, agent.Config{ControlPlane: cp.url}, eng)
	again := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool {
		return p.InstanceID == "restarted" && p.State == registry.StateReady
	})
	if again.ID != first.ID || bytes.Equal(again.CredentialHash, first.CredentialHash) {
		t.Fatalf("reclaimed peer: id %s (was %s), credential reissued %v", again.ID, first.ID, !bytes.Equal(again.CredentialHash, first.CredentialHash))
	}
	evs, err := cp.store.Events(context.Background(), registry.EventQuery{PeerID: first.ID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == registry.EventReregistered && e.At.Before(first.LeaseExpiry) {
			t.Fatalf("the name was re-registered at %v, before the old lease ran out at %v", e.At, first.LeaseExpiry)
		}
	}
}

// TestAgentFetchesTransferSecrets pins the transfer plane's path to a
// remote's secret: a registered agent reads another peer's rank secret with
// its credential; a name the peer no longer has, or an agent holding only
// the join token, gets none.
func TestAgentFetchesTransferSecrets(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	dspec := registrytest.Spec("d0", registry.RoleDecode)
	dspec.Ranks[0].TransferSecret = bytes.Repeat([]byte{0x5a}, 32)
	runAgent(t, cp.url, &fakeEngine{spec: dspec})
	p, _ := runAgent(t, cp.url, &fakeEngine{spec: registrytest.Spec("p0", registry.RolePrefill)})
	d := waitPeer(t, cp.store, "d0", func(p registry.Peer) bool { return p.State == registry.StateReady })
	waitPeer(t, cp.store, "p0", func(p registry.Peer) bool { return p.State == registry.StateReady })

	ctx := context.Background()
	got, err := p.TransferSecret(ctx, d.ID, d.Ranks[0].AgentName)
	if err != nil || !bytes.Equal(got, dspec.Ranks[0].TransferSecret) {
		t.Fatalf("secret of %s: %x, %v", d.Ranks[0].AgentName, got, err)
	}
	if _, err := p.TransferSecret(ctx, d.ID, "d0-agent-0-old"); err == nil {
		t.Fatal("a secret for an agent name the peer does not have")
	}
	stranger, err := agent.New(agent.Config{ControlPlane: cp.url, JoinToken: "tok", Probe: noProbe}, &fakeEngine{spec: registrytest.Spec("x", registry.RolePrefill)},
		zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	var refused *agent.RefusedError
	if _, err := stranger.TransferSecret(ctx, d.ID, d.Ranks[0].AgentName); !errors.As(err, &refused) || refused.Status != 403 {
		t.Fatalf("an unregistered agent with the join token: %v, want a 403 refusal", err)
	}
}

// slowRestartEngine is an engine whose answer to "did you restart?" (a
// stock engine's /metrics) hangs until released, as a real vLLM decode's
// did while a NIXL transfer it could not finish held it.
type slowRestartEngine struct {
	fakeEngine
	release chan struct{}
}

func (e *slowRestartEngine) Restarted(ctx context.Context, registered string) bool {
	select {
	case <-e.release:
	case <-ctx.Done():
		return false
	}
	s, _ := e.Spec(ctx)
	return s.InstanceID != registered
}

// TestAgentHeartbeatsWhileTheEngineIsSlowToAnswer: the agent asks its
// engine whether it restarted beside its heartbeats, not before each one,
// so an engine that takes longer than the lease to answer keeps its
// lease; once it answers that it restarted, the new instance is
// registered at the next generation. Before, the question sat in the
// heartbeat loop, and a real vLLM decode's lease ran out twice while its
// agent waited on the engine's /metrics.
func TestAgentHeartbeatsWhileTheEngineIsSlowToAnswer(t *testing.T) {
	t.Parallel()
	cp := startControlPlane(t, nil)
	eng := &slowRestartEngine{fakeEngine: fakeEngine{spec: registrytest.Spec("slow-d", registry.RoleDecode)}, release: make(chan struct{})}
	eng.spec.InstanceID = "instance-1"
	runAgent(t, cp.url, eng)
	first := waitPeer(t, cp.store, "slow-d", func(p registry.Peer) bool { return p.State == registry.StateReady && p.LastHeartbeat != nil })
	// Heartbeats for three lease TTLs (1 s) with the engine's answer
	// hanging, the peer ready at its generation all along.
	waitPeer(t, cp.store, "slow-d", func(p registry.Peer) bool {
		if p.State != registry.StateReady || p.Generation != first.Generation {
			t.Fatalf("while the engine was slow to answer: %s at generation %d (reason %q)", p.State, p.Generation, p.StateReason)
		}
		return p.LastHeartbeat.Sub(*first.LastHeartbeat) >= 3*time.Second
	})
	eng.mu.Lock()
	eng.spec.InstanceID = "instance-2"
	eng.mu.Unlock()
	close(eng.release)
	waitPeer(t, cp.store, "slow-d", func(p registry.Peer) bool {
		return p.Generation == first.Generation+1 && p.InstanceID == "instance-2" && p.State == registry.StateReady
	})
}
