package nixl_test

import (
	"os"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

func TestMain(m *testing.M) {
	transfertest.UseLoopbackUCX()
	os.Exit(m.Run())
}

func newBackend(t testing.TB, name string) transfer.Backend {
	t.Helper()
	lib := transfertest.RequireNIXL(t)
	b, err := lib.NewBackend(nixl.Config{AgentName: name, UCXTLS: "tcp"}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("new nixl backend: %v", err)
	}
	return b
}

func TestBackendContract(t *testing.T) {
	t.Parallel()
	transfertest.RequireNIXL(t)
	transfertest.RunBackendSuite(t, newBackend, transfertest.Options{})
}

// TestTwoProcess moves bytes between two OS processes over UCX TCP.
func TestTwoProcess(t *testing.T) {
	transfertest.RunTwoProcess(t, newBackend)
}

func TestPreflight(t *testing.T) {
	t.Parallel()
	transfertest.RequireNIXL(t)
	transfertest.RunPreflightSuite(t, newBackend)
}
