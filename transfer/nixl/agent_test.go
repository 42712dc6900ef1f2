package nixl_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// TestAgentLowLevel drives the C API directly: plugins and their
// parameters, registration, metadata, check/invalidate, notification
// drains, and calls after Close.
func TestAgentLowLevel(t *testing.T) {
	t.Parallel()
	lib := transfertest.RequireNIXL(t)
	a, err := lib.NewAgent(transfertest.UniqueName("low"), nixl.AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := a.Plugins()
	if err != nil || !slices.Contains(plugins, "UCX") {
		t.Fatalf("plugins %v: %v (is NIXL_PLUGIN_DIR right?)", plugins, err)
	}
	mems, params, err := a.PluginParams("UCX")
	if err != nil || !slices.Contains(mems, registry.DRAM) {
		t.Fatalf("UCX params %v %v: %v", mems, params, err)
	}
	if _, ok := params["num_workers"]; !ok {
		t.Errorf("UCX params lack num_workers: %v", params)
	}
	bh, err := a.CreateBackend("UCX", map[string]string{"engine_config": "TLS=tcp"})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := transfer.AllocHost(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	if err := a.RegisterMem(buf.Region(), bh); err != nil {
		t.Fatal(err)
	}
	md, err := a.LocalMD()
	if err != nil || len(md) == 0 {
		t.Fatalf("local metadata %d bytes: %v", len(md), err)
	}

	// A second agent loads, checks and invalidates the first.
	b, err := lib.NewAgent(transfertest.UniqueName("low"), nixl.AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateBackend("UCX", nil); err != nil {
		t.Fatal(err)
	}
	name, err := b.LoadRemoteMD(md)
	if err != nil || name != a.Name() {
		t.Fatalf("loaded %q: %v", name, err)
	}
	if err := b.CheckRemoteMD(a.Name(), nil); err != nil {
		t.Fatalf("check loaded agent: %v", err)
	}
	in := buf.Region()
	if err := b.CheckRemoteMD(a.Name(), &in); err != nil {
		t.Fatalf("check registered span: %v", err)
	}
	out := transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: buf.Addr() + 1<<16, Len: 64}}}
	if err := b.CheckRemoteMD(a.Name(), &out); err == nil {
		t.Fatal("span past the registered region passes the check")
	}
	if err := b.InvalidateRemoteMD(a.Name()); err != nil {
		t.Fatal(err)
	}
	if err := b.CheckRemoteMD(a.Name(), nil); !errors.Is(err, nixl.ErrNotFound) {
		t.Fatalf("check after invalidation: %v", err)
	}
	if _, err := b.LoadRemoteMD([]byte("garbage")); err == nil {
		t.Fatal("garbage metadata loads")
	}
	ns, err := b.GetNotifs()
	if err != nil || len(ns) != 0 {
		t.Fatalf("notifications %v: %v", ns, err)
	}

	if err := a.DeregisterMem(buf.Region(), bh); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := a.LocalMD(); err == nil {
		t.Fatal("call after close succeeds")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if a.OpenHandles() != 0 || b.OpenHandles() != 0 {
		t.Fatalf("handles left: %d %d", a.OpenHandles(), b.OpenHandles())
	}
}
