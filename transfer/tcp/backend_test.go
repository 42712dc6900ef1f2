package tcp_test

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

func newBackend(t testing.TB, name string) transfer.Backend {
	t.Helper()
	b, err := tcp.New(tcp.Config{AgentName: name}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("new tcp backend: %v", err)
	}
	return b
}

func TestBackendContract(t *testing.T) {
	t.Parallel()
	transfertest.RunBackendSuite(t, newBackend, transfertest.Options{})
}

func TestTwoProcess(t *testing.T) {
	transfertest.RunTwoProcess(t, newBackend)
}
