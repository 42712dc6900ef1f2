// Package registrytest holds the registry.Store contract suite, which every
// store must pass, and helpers for tests that need PostgreSQL or ready-made
// peers.
package registrytest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry/pgstore"
)

// DatabaseURL returns PDPLANE_TEST_DATABASE_URL. Without it the test is
// skipped, except under CI=true, where a missing database is a failure.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("PDPLANE_TEST_DATABASE_URL")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PDPLANE_TEST_DATABASE_URL is not set; under CI=true PostgreSQL is required (make test starts one)")
		}
		t.Skip("PDPLANE_TEST_DATABASE_URL is not set; run `make test` to start a throwaway PostgreSQL")
	}
	return u
}

// NewSchema creates a fresh schema for one test, dropped when the test ends,
// and returns a database URL whose connections use it and the schema's name.
// Tests that each get their own schema can run in parallel on one database.
func NewSchema(t testing.TB) (dbURL, schema string) {
	t.Helper()
	base := DatabaseURL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = fmt.Sprintf("t_%x", b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("connect to drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), schema
}

// NewPGStore opens a migrated PostgreSQL store on a fresh schema, closed when
// the test ends. It returns the store and the URL of its schema, so a test
// can open a second store (a second replica) on the same data.
func NewPGStore(t testing.TB, cfg pgstore.Config) (*pgstore.Store, pgstore.Config) {
	t.Helper()
	cfg = onNewSchema(t, cfg)
	return OpenPGStore(t, cfg), cfg
}

// onNewSchema is cfg moved to a fresh schema (its URL and notification
// channel), migrated on open.
func onNewSchema(t testing.TB, cfg pgstore.Config) pgstore.Config {
	t.Helper()
	dbURL, schema := NewSchema(t)
	cfg.URL, cfg.Channel, cfg.Migrate = dbURL, "pdplane_"+schema, true
	return cfg
}

// OpenPGStore opens a store with cfg, closed when the test ends.
func OpenPGStore(t testing.TB, cfg pgstore.Config) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := pgstore.Open(ctx, cfg, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("open pgstore: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}
