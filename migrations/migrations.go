// Package migrations holds the PostgreSQL schema as numbered SQL files,
// embedded in the binary and applied with tern by `pdplane migrate` and at
// start-up.
package migrations

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed *.sql
var files embed.FS

// VersionTable records which migrations ran.
const VersionTable = "pdplane_schema_version"

// Migrate brings the schema on conn up to date. tern holds an advisory lock
// while it runs, so replicas starting together apply each migration once.
func Migrate(ctx context.Context, conn *pgx.Conn) (from, to int32, err error) {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return 0, 0, fmt.Errorf("new migrator: %w", err)
	}
	if err := m.LoadMigrations(files); err != nil {
		return 0, 0, fmt.Errorf("load migrations: %w", err)
	}
	from, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return from, 0, fmt.Errorf("migrate: %w", err)
	}
	return from, int32(len(m.Migrations)), nil
}
