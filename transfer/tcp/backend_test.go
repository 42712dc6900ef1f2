package tcp_test

import (
	"testing"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp/tcptest"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

func newBackend(t testing.TB, name string) transfer.Backend { return tcptest.New(t, name) }

func TestBackendContract(t *testing.T) {
	t.Parallel()
	transfertest.RunBackendSuite(t, newBackend, transfertest.Options{})
}

func TestTwoProcess(t *testing.T) {
	transfertest.RunTwoProcess(t, newBackend)
}

func TestPreflight(t *testing.T) {
	t.Parallel()
	transfertest.RunPreflightSuite(t, newBackend)
}
