package agent

import (
	"context"
	"testing"
)

// TestPreflightSecretsOneADecode: the preflighter keeps the transfer
// secret of each decode's current probe agent only. A decode that
// restarts (every heal restarts one) comes back with a new agent name;
// the old agent's secret goes, so the map does not grow with restarts.
func TestPreflightSecretsOneADecode(t *testing.T) {
	p := &Preflighter{secrets: map[string][]byte{}, agentOf: map[string]string{}}
	for i, agent := range []string{"d0-g1", "d0-g2", "d0-g3"} {
		p.learnSecret("decode-0", agent, []byte{byte(i)})
	}
	p.learnSecret("decode-1", "d1-g1", []byte{9})
	if len(p.secrets) != 2 {
		t.Fatalf("%d secrets kept for 2 decodes: %v", len(p.secrets), p.secrets)
	}
	if s, err := p.RemoteSecret(context.Background(), "d0-g3"); err != nil || len(s) != 1 || s[0] != 2 {
		t.Fatalf("current agent's secret: %v, %v", s, err)
	}
	if _, err := p.RemoteSecret(context.Background(), "d0-g1"); err == nil {
		t.Fatal("a restarted decode's old agent still has its secret")
	}
}
