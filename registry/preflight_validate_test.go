package registry_test

import (
	"errors"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// TestPreflightTextFollowsTheTextRules: a reported preflight's or probe's
// text that PostgreSQL would refuse (NUL, invalid UTF-8) or that is no
// name (control characters in a backend or agent name) is the reporter's
// error naming the field, not the store's.
func TestPreflightTextFollowsTheTextRules(t *testing.T) {
	t.Parallel()
	const p, d = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	pf := func(errText, backend string) registry.Preflight {
		return registry.Preflight{PrefillID: p, DecodeID: d, State: registry.PreflightFailed, Error: errText, Backend: backend, MemKind: registry.DRAM}
	}
	pr := func(agent, backend string) registry.Probe {
		return registry.Probe{PeerID: p, AgentName: agent, Backend: backend, MemKind: registry.DRAM, Metadata: []byte{1}, Addr: 4096, Len: 4096}
	}
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"error with NUL", registry.ValidatePreflight(pf("bad\x00read", "nixl")), "error"},
		{"error not UTF-8", registry.ValidatePreflight(pf("bad\xffread", "nixl")), "error"},
		{"backend with a newline", registry.ValidatePreflight(pf("x", "ni\nxl")), "backend"},
		{"probe agent with a control character", registry.ValidateProbe(pr("agent\x01", "nixl")), "agent_name"},
		{"probe backend with NUL", registry.ValidateProbe(pr("agent", "nixl\x00")), "backend"},
	} {
		var fe *registry.FieldError
		if !errors.As(tc.err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want an error naming %q", tc.name, tc.err, tc.field)
		}
	}
	if err := registry.ValidatePreflight(pf("NIXL_ERR_BACKEND\ntraceback line", "nixl")); err != nil {
		t.Errorf("a multi-line error is refused: %v", err)
	}
	if err := registry.ValidateProbe(pr("agent", "nixl")); err != nil {
		t.Errorf("a valid probe is refused: %v", err)
	}
}
