// Package tcptest makes TCP transfer backends for tests that have no
// control plane to hand out transfer secrets.
package tcptest

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp"
)

// Secret is the transfer secret a test gives the agent named name. It is
// derived from the name, so that the two processes of a two-process test
// agree on it without a control plane; a real agent's secret is random.
func Secret(name string) []byte {
	h := sha256.Sum256([]byte("pdplane tcptest transfer secret\x00" + name))
	return h[:]
}

// RemoteSecret resolves a remote agent's secret the way Secret derives it.
func RemoteSecret(_ context.Context, agent string) ([]byte, error) { return Secret(agent), nil }

// New returns a backend named name with Secret(name), resolving remotes
// with RemoteSecret; it is a transfertest.Factory.
func New(t testing.TB, name string) transfer.Backend {
	t.Helper()
	b, err := tcp.New(tcp.Config{AgentName: name, Secret: Secret(name), RemoteSecret: RemoteSecret}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("new tcp backend: %v", err)
	}
	return b
}
