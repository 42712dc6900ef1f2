package cli

import "testing"

func TestSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, value string
		want        bool
	}{
		{"admin-token", "x", true},
		{"join-token", "x", true},
		{"token", "x", true},
		{"api-keys", "x", true},
		{"transfer-secret", "x", true},
		{"admin-token", "", false},
		{"credential-file", "/var/lib/pdplane/credential", false},
		{"database-url", "postgres://pd:pw@db/pd", true},
		{"database-url", "postgres://pd@db/pd?password=pw", true},
		{"database-url", "host=db user=pd password=pw", true},
		{"database-url", "postgres://pd@db/pd", false},
		{"database-url", "host=db user=pd", false},
		{"lease-ttl", "10s", false},
	} {
		if got := secret(tc.name, tc.value); got != tc.want {
			t.Errorf("secret(%q, %q) = %v, want %v", tc.name, tc.value, got, tc.want)
		}
	}
}
