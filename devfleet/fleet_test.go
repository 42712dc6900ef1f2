package devfleet_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/devfleet"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

func testLog(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}

// startEngine starts an engine of cfg, closed when the test ends.
func startEngine(t *testing.T, ctx context.Context, cfg devfleet.EngineConfig, log zerolog.Logger) *devfleet.Engine {
	t.Helper()
	e, err := devfleet.StartEngine(ctx, cfg, log)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Sim.Name, err)
	}
	t.Cleanup(e.Close)
	return e
}

// simConfig is a small simulator for a fleet: Name and Role are the
// fleet's to set, and the transfer secrets come from the control plane.
func simConfig() sim.Config {
	c := simtest.Config("", "", registry.EngineSGLang)
	c.SharedTransferSecret = nil
	return c
}

// TestStartEngineAlone: without a control plane there is no agent, Done is
// closed at once with no error, the engine serves, and Close stops it.
func TestStartEngineAlone(t *testing.T) {
	t.Parallel()
	e := startEngine(t, context.Background(), devfleet.EngineConfig{
		Sim: simtest.Config("alone", registry.RoleDecode, registry.EngineSGLang),
	}, testLog(t))
	select {
	case <-e.Done():
	default:
		t.Fatal("Done is open for an engine without an agent")
	}
	if err := e.Err(); err != nil {
		t.Fatalf("Err = %v, want nil", err)
	}
	resp, err := http.Get(e.Sim().URL() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /health: %d", resp.StatusCode)
	}
	e.Close()
	if resp, err := http.Get(e.Sim().URL() + "/health"); err == nil {
		resp.Body.Close()
		t.Fatalf("the engine still answers after Close: %d", resp.StatusCode)
	}
	e.Close() // idempotent
}

// TestStartEngineRegisters: the agent registers the engine, the engine
// learns the peer ID the control plane gave it, and Close stops the agent
// (Done closes with the cancellation) before closing the engine.
func TestStartEngineRegisters(t *testing.T) {
	t.Parallel()
	log := testLog(t)
	cp := startControlPlane(t, cpConfig{}, log)
	c := simConfig()
	c.Name, c.Role = "decode-x", registry.RoleDecode
	e := startEngine(t, context.Background(), devfleet.EngineConfig{Sim: c, ControlPlane: cp.BaseURL, JoinToken: joinToken}, log)
	var p *registry.Peer
	waitSnapshot(t, cp, "decode-x registered", func(s *replica.Snapshot) bool {
		p = peerByName(s, "decode-x")
		return p != nil
	})
	simtest.WaitFor(t, "the sim to learn its peer ID", func() bool { return e.Sim().PeerID() != "" })
	if got := e.Sim().PeerID(); got != p.ID {
		t.Fatalf("sim's peer ID %q, the control plane's %q", got, p.ID)
	}
	select {
	case <-e.Done():
		t.Fatalf("the agent stopped on its own: %v", e.Err())
	default:
	}
	e.Close()
	select {
	case <-e.Done():
	default:
		t.Fatal("Done is open after Close")
	}
	if err := e.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after Close = %v, want the cancellation", err)
	}
}

// TestStartEngineRefused: a control plane that refuses the peer (a wrong
// join token) stops the agent with an *agent.RefusedError, which is what
// `pdplane sim` exits non-zero on.
func TestStartEngineRefused(t *testing.T) {
	t.Parallel()
	log := testLog(t)
	cp := startControlPlane(t, cpConfig{}, log)
	c := simConfig()
	c.Name, c.Role = "refused", registry.RolePrefill
	e := startEngine(t, context.Background(), devfleet.EngineConfig{Sim: c, ControlPlane: cp.BaseURL, JoinToken: "wrong"}, log)
	select {
	case <-e.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the agent kept going after the control plane refused it")
	}
	var refused *agent.RefusedError
	if err := e.Err(); !errors.As(err, &refused) {
		t.Fatalf("Err = %v, want an *agent.RefusedError", err)
	}
}

// TestFleetNamesRolesAndSpread: the fleet starts the prefills then the
// decodes, named by role and index, and engine i registers with control
// plane i mod n. Each control plane here has its own store, so where a
// peer registered is what that store holds.
func TestFleetNamesRolesAndSpread(t *testing.T) {
	t.Parallel()
	log := testLog(t)
	cps := []*controlPlane{startControlPlane(t, cpConfig{}, log), startControlPlane(t, cpConfig{}, log)}
	f, err := devfleet.Start(context.Background(), devfleet.Config{
		ControlPlanes: []string{cps[0].BaseURL, cps[1].BaseURL}, JoinToken: joinToken,
		Prefills: 2, Decodes: 1, Sim: simConfig(),
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	var names []string
	for _, e := range f.Engines() {
		c := e.Sim().Config()
		names = append(names, c.Name)
		if want := registry.Role(strings.Split(c.Name, "-")[0]); c.Role != want {
			t.Errorf("%s has role %s", c.Name, c.Role)
		}
	}
	if want := []string{"prefill-0", "prefill-1", "decode-0"}; !slices.Equal(names, want) {
		t.Fatalf("engines %q, want %q", names, want)
	}
	if e := f.Engine("decode-0"); e == nil || e != f.Engines()[2] {
		t.Errorf("Engine(decode-0) = %v", e)
	}
	if e := f.Engine("decode-1"); e != nil {
		t.Errorf("Engine(decode-1) = %v, want nil", e)
	}
	want := [][]string{{"decode-0", "prefill-0"}, {"prefill-1"}}
	for i, cp := range cps {
		waitSnapshot(t, cp, "the engines spread over the control planes", func(s *replica.Snapshot) bool {
			var got []string
			for _, p := range s.Peers() {
				got = append(got, p.Name)
			}
			slices.Sort(got)
			return slices.Equal(got, want[i])
		})
	}
}

func TestFleetConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   devfleet.Config
		field string
	}{
		{"no control plane", devfleet.Config{Prefills: 1, Decodes: 1}, "ControlPlanes"},
		{"negative prefills", devfleet.Config{ControlPlanes: []string{"http://127.0.0.1:1"}, Prefills: -1}, "Prefills"},
		{"negative decodes", devfleet.Config{ControlPlanes: []string{"http://127.0.0.1:1"}, Decodes: -1}, "Decodes"},
	} {
		f, err := devfleet.Start(context.Background(), tc.cfg, testLog(t))
		if err == nil {
			f.Close()
			t.Errorf("%s: started", tc.name)
		} else if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v does not name %s", tc.name, err, tc.field)
		}
	}
}

// TestWaitReady: WaitReady fails while the control plane has no routable
// pair and returns once a fleet made one routable.
func TestWaitReady(t *testing.T) {
	t.Parallel()
	log := testLog(t)
	cp := startControlPlane(t, cpConfig{}, log)
	if err := devfleet.WaitReady(context.Background(), cp.BaseURL, 200*time.Millisecond); err == nil {
		t.Fatal("WaitReady returned nil with no engine registered")
	}
	f, err := devfleet.Start(context.Background(), devfleet.Config{
		ControlPlanes: []string{cp.BaseURL}, JoinToken: joinToken, Prefills: 1, Decodes: 1, Sim: simConfig(),
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	if err := devfleet.WaitReady(context.Background(), cp.BaseURL, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if ok, why := cp.mirror.Snapshot().Routable(); !ok {
		t.Fatalf("WaitReady returned but the control plane has no routable pair: %v", why)
	}
}
