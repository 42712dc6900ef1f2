package pgstore

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pdplane/pdplane/registry"
)

// TestClassify pins which driver errors are the store being away (503 at
// the HTTP edge) and which are answers about the request. SQLSTATEs from
// PostgreSQL's errcodes.txt: class 08 connection exception, 57P01
// admin_shutdown (pg_ctl stop -m fast, pg_terminate_backend), 57P02
// crash_shutdown, 57P03 cannot_connect_now (starting up, shutting down),
// 53300 too_many_connections.
func TestClassify(t *testing.T) {
	t.Parallel()
	connectErr := &pgconn.ConnectError{Config: &pgconn.Config{User: "u", Database: "d"}}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, registry.ErrUnavailable},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, registry.ErrUnavailable},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, registry.ErrUnavailable},
		{"connection failure", &pgconn.PgError{Code: "08006"}, registry.ErrUnavailable},
		{"too many connections", &pgconn.PgError{Code: "53300"}, registry.ErrUnavailable},
		{"connect failed", connectErr, registry.ErrUnavailable},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, registry.ErrUnavailable},
		{"broken mid-statement", fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), registry.ErrUnavailable},
		{"conn closed", fmt.Errorf("x: %w", pgconn.ErrConnClosed), registry.ErrUnavailable},
		{"no rows", pgx.ErrNoRows, registry.ErrNotFound},
		{"unique violation", &pgconn.PgError{Code: "23505"}, registry.ErrConflict},
		{"malformed uuid", &pgconn.PgError{Code: "22P02"}, registry.ErrNotFound},
		{"query canceled", &pgconn.PgError{Code: "57014"}, nil},
		{"syntax error", &pgconn.PgError{Code: "42601"}, nil},
		{"anything else", errors.New("boom"), nil},
	} {
		got := classify(tc.err, "op")
		for _, class := range []error{registry.ErrUnavailable, registry.ErrNotFound, registry.ErrConflict} {
			if errors.Is(got, class) != (class == tc.want) {
				t.Errorf("%s: classify(%v) = %v; is %v: %v, want class %v", tc.name, tc.err, got, class, errors.Is(got, class), tc.want)
			}
		}
		if !errors.Is(got, tc.err) && tc.want != registry.ErrNotFound && tc.want != registry.ErrConflict {
			t.Errorf("%s: the cause is lost: %v", tc.name, got)
		}
	}
}
