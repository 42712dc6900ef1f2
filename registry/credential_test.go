package registry_test

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

func TestCredentialShape(t *testing.T) {
	t.Parallel()
	a, ha, err := registry.NewCredential("peer-1")
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := registry.NewCredential("peer-1")
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("two credentials are equal")
	}
	if id, ok := registry.CredentialPeerID(a); !ok || id != "peer-1" {
		t.Fatalf("CredentialPeerID(%q) = %q, %v", a, id, ok)
	}
	if !registry.CredentialMatches(ha, a) || registry.CredentialMatches(ha, b) || registry.CredentialMatches(nil, a) {
		t.Fatal("CredentialMatches accepts the wrong credential or an empty hash")
	}
	if strings.Contains(string(ha), a) {
		t.Fatal("the hash holds the credential")
	}
	for _, bad := range []string{"", "admin-token", "pdpc.", "pdpc.peer-1", "pdpc.peer-1.short", "pdpc..AAAA"} {
		if _, ok := registry.CredentialPeerID(bad); ok {
			t.Errorf("CredentialPeerID(%q) accepted", bad)
		}
	}
}
