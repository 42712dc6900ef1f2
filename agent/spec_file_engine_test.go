package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api/apiconv"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestSpecFileEngineFillsFromServerInfo registers an engine whose launcher
// wrote only what SGLang does not serve over HTTP (ranks, identity); model,
// role, bootstrap port, parallelism and page size come from /server_info of
// a running engine (the simulator, which serves SGLang's shape). The
// re-register command rewrites the file with a fresh agent name, as an
// operator's script would after restarting the engine's NIXL agent.
func TestSpecFileEngineFillsFromServerInfo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := sim.New(simtest.Config("p-real", registry.RolePrefill, registry.EngineSGLang), zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	full, err := s.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	written := registry.PeerSpec{Name: full.Name, InstanceID: full.InstanceID, Ranks: full.Ranks,
		KV: registry.KVGeometry{NumLayers: full.KV.NumLayers, NumKVHeads: full.KV.NumKVHeads, HeadDim: full.KV.HeadDim, DType: full.KV.DType}}
	path := filepath.Join(t.TempDir(), "peer.json")
	data, _ := json.Marshal(apiconv.Registration(&written))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	eng := &agent.SpecFileEngine{Path: path, EngineURL: s.URL(),
		ReregisterCmd: `sed -i "s/` + full.Ranks[0].AgentName + `/fresh-agent/" "$PDPLANE_SPEC_FILE"`}
	got, err := eng.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("completed spec does not validate: %v", err)
	}
	if got.Model != full.Model || got.Role != registry.RolePrefill || got.BootstrapPort != s.BootstrapPort() ||
		got.KV.PageSize != full.KV.PageSize || got.URL != s.URL() || got.Parallelism.TPSize != 1 {
		t.Fatalf("spec from file + server_info = %+v\nwant the engine's %+v", got, full)
	}
	// What came from /server_info is observed; what the file said is declared.
	for _, f := range []string{"model", "role", "bootstrap_port", "parallelism.tp_size", "kv.page_size"} {
		if got.Provenance(f) != registry.Observed {
			t.Errorf("%s is %s, want observed (observed %q)", f, got.Provenance(f), got.Observed)
		}
	}
	if got.Provenance("kv.dtype") != registry.Declared || got.Provenance("ranks") != registry.Declared {
		t.Errorf("the file's fields: dtype %s, ranks %s, want declared", got.Provenance("kv.dtype"), got.Provenance("ranks"))
	}

	cp := startControlPlane(t, nil)
	runAgent(t, cp.url, eng)
	waitPeer(t, cp.store, full.Name, func(p registry.Peer) bool { return p.State == registry.StateReady })
	peers, _ := cp.store.List(ctx, registry.Filter{})
	if _, err := cp.store.MarkStale(ctx, peers[0].ID, "test", "Missing NIXL destination KV memory kind"); err != nil {
		t.Fatal(err)
	}
	p := waitPeer(t, cp.store, full.Name, func(p registry.Peer) bool { return p.Generation == 2 })
	if p.Ranks[0].AgentName != "fresh-agent" || p.State != registry.StateReady {
		t.Fatalf("after the re-register command: agent %s, state %s", p.Ranks[0].AgentName, p.State)
	}
}
