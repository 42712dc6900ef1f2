package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/web"
)

type serveConfig struct {
	addr        string
	databaseURL string
	adminToken  string
	peerToken   string
	logLevel    string
	leaseTTL    time.Duration
	heartbeat   time.Duration
}

func runServe(ctx context.Context, args []string, dev bool) error {
	var c serveConfig
	name := "serve"
	if dev {
		name = "dev"
	}
	fs := newFlagSet(name)
	fs.str(&c.addr, "addr", "127.0.0.1:8080", "listen address HOST:PORT")
	fs.str(&c.databaseURL, "database-url", "", "PostgreSQL URL; empty uses the embedded in-memory store")
	fs.str(&c.adminToken, "admin-token", "", "bearer token for operator actions (delete, drain)")
	fs.str(&c.peerToken, "peer-token", "", "bearer token for agents (register, heartbeat, stale reports)")
	fs.str(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.dur(&c.heartbeat, "heartbeat-interval", registry.DefaultHeartbeatInterval, "how often agents heartbeat")
	fs.dur(&c.leaseTTL, "lease-ttl", registry.DefaultLeaseTTL, "how long a peer lives without a heartbeat")
	if err := fs.parse(args); err != nil {
		return err
	}
	log, err := newLogger(c.logLevel, dev)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	store, err := openStore(ctx, c, log)
	if err != nil {
		return err
	}
	defer store.Close()

	mirror := registry.NewMirror(registry.MirrorConfig{}, store, log.With().Str("component", "mirror").Logger())
	if err := mirror.Start(ctx); err != nil {
		return fmt.Errorf("load registry: %w", err)
	}
	go registry.RunLeaseSweeper(ctx, store, time.Second, time.Now, log.With().Str("component", "sweeper").Logger())

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(server.Config{
		AdminToken: c.adminToken, PeerToken: c.peerToken,
		HeartbeatInterval: c.heartbeat, LeaseTTL: c.leaseTTL,
	}, server.Deps{Store: store, Snaps: mirror, Registry: reg, Web: web.Handler()}, log.With().Str("component", "server").Logger())
	if err != nil {
		return err
	}
	if c.adminToken == "" && c.peerToken == "" {
		log.Warn().Msg("no --admin-token or --peer-token: the control-plane API accepts writes from anyone who can reach it")
	}

	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.addr, err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	base := "http://" + ln.Addr().String()
	log.Info().Str("addr", ln.Addr().String()).Str("openai_base_url", base+"/v1").Str("status_page", base+"/").Msg("pdplane listening")
	if dev {
		fmt.Fprintf(os.Stderr, "\n  OpenAI base URL: %s/v1\n  Status page:     %s/\n  REST API:        %s/api/v1/peers\n\n", base, base, base)
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down")
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer shutCancel()
	if err := hs.Shutdown(shutCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func openStore(ctx context.Context, c serveConfig, log zerolog.Logger) (registry.Store, error) {
	if c.databaseURL == "" {
		log.Info().Str("store", "memory").Msg("using the embedded in-memory registry store (single node); set --database-url for PostgreSQL")
		return memstore.New(memstore.Config{LeaseTTL: c.leaseTTL}), nil
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := pgstore.Open(openCtx, pgstore.Config{URL: c.databaseURL, LeaseTTL: c.leaseTTL, Migrate: true},
		log.With().Str("component", "pgstore").Logger())
	if err != nil {
		return nil, fmt.Errorf("open postgres store: %w", err)
	}
	log.Info().Str("store", "postgres").Msg("using the PostgreSQL registry store (migrated)")
	return s, nil
}

func runMigrate(ctx context.Context, args []string) error {
	var url string
	fs := newFlagSet("migrate")
	fs.str(&url, "database-url", "", "PostgreSQL URL")
	if err := fs.parse(args); err != nil {
		return err
	}
	if url == "" {
		return errors.New("--database-url (or $PDPLANE_DATABASE_URL) is required")
	}
	if err := pgstore.Migrate(ctx, url); err != nil {
		return err
	}
	fmt.Println("migrations applied")
	return nil
}

func newLogger(level string, console bool) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("--log-level: %w", err)
	}
	var log zerolog.Logger
	if console {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly})
	} else {
		log = zerolog.New(os.Stderr)
	}
	return log.Level(lvl).With().Timestamp().Logger(), nil
}
