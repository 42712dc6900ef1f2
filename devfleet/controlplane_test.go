package devfleet_test

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// The fleet's agents need a control plane to register with. cmd/pdplane's
// serve wiring cannot be imported (nothing imports cmd/...), so the tests
// assemble the same packages the same way here: store, mirror, lease
// sweeper, router and server on one real HTTP listener. What `pdplane
// serve` adds on top (flags, exposure checks, the status page) is tested in
// cmd/pdplane.

// Tokens of every test control plane.
const (
	joinToken  = "peer-tok"
	adminToken = "admin-tok"
)

type cpConfig struct {
	databaseURL  string // empty: the in-memory store
	heartbeat    time.Duration
	leaseTTL     time.Duration
	decodePolicy router.Policy // round_robin when empty
	// healHold is the heal plan's hold (registry.HealConfig.Hold); zero:
	// the default.
	healHold time.Duration
}

// controlPlane is a running control plane: its URL, and the store and
// routing snapshots the tests observe.
type controlPlane struct {
	BaseURL string
	store   registry.Store
	mirror  *replica.Mirror
}

func startControlPlane(t *testing.T, c cpConfig, log zerolog.Logger) *controlPlane {
	t.Helper()
	if c.heartbeat == 0 {
		c.heartbeat = registry.DefaultHeartbeatInterval
	}
	if c.leaseTTL == 0 {
		c.leaseTTL = registry.DefaultLeaseTTL
	}
	if c.decodePolicy == "" {
		c.decodePolicy = router.PolicyRoundRobin
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var store registry.Store = memstore.New(memstore.Config{LeaseTTL: c.leaseTTL, Heal: registry.HealConfig{Hold: c.healHold}})
	if c.databaseURL != "" {
		openCtx, cancelOpen := context.WithTimeout(ctx, 30*time.Second)
		defer cancelOpen()
		s, err := pgstore.Open(openCtx, pgstore.Config{URL: c.databaseURL, LeaseTTL: c.leaseTTL, Migrate: true,
			Heal: registry.HealConfig{Hold: c.healHold}}, log)
		if err != nil {
			t.Fatalf("open postgres store: %v", err)
		}
		store = s
	}
	t.Cleanup(store.Close)
	mirror := replica.NewMirror(replica.MirrorConfig{LoadRefresh: c.heartbeat}, store, log.With().Str("component", "mirror").Logger())
	if err := mirror.Start(ctx); err != nil {
		t.Fatalf("load registry: %v", err)
	}
	sweeper, err := registry.NewLeaseSweeper(registry.SweeperConfig{LeaseTTL: c.leaseTTL}, store, log)
	if err != nil {
		t.Fatal(err)
	}
	swept := make(chan struct{})
	go func() { defer close(swept); sweeper.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-swept })

	reg := prometheus.NewRegistry()
	rt, err := router.New(router.Config{PrefillPolicy: router.PolicyRoundRobin, DecodePolicy: c.decodePolicy},
		mirror, store, log.With().Str("component", "router").Logger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{
		AdminToken: adminToken, JoinTokens: []string{joinToken},
		HeartbeatInterval: c.heartbeat, LeaseTTL: c.leaseTTL,
	}, server.Deps{Store: store, Snaps: mirror, Registry: reg, Routes: rt}, log.With().Str("component", "server").Logger())
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &controlPlane{BaseURL: hs.URL, store: store, mirror: mirror}
}

// waitSnapshot waits until cond holds on the control plane's routing
// snapshot.
func waitSnapshot(t *testing.T, cp *controlPlane, what string, cond func(*replica.Snapshot) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond(cp.mirror.Snapshot()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func peerByName(s *replica.Snapshot, name string) *registry.Peer {
	for _, p := range s.Peers() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func TestMain(m *testing.M) {
	transfertest.UseLoopbackUCX()
	os.Exit(m.Run())
}
