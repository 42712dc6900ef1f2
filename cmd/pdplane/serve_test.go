package main

import (
	"strings"
	"testing"
)

func TestCheckExposure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    serveConfig
		ok   bool
	}{
		{"open on loopback", serveConfig{addr: "127.0.0.1:8080"}, true},
		{"open on IPv6 loopback", serveConfig{addr: "[::1]:8080"}, true},
		{"open on localhost", serveConfig{addr: "localhost:8080"}, true},
		{"open on all interfaces", serveConfig{addr: "0.0.0.0:8080"}, false},
		{"open on an empty host", serveConfig{addr: ":8080"}, false},
		{"open on a LAN address", serveConfig{addr: "10.0.0.5:8080"}, false},
		{"open but --insecure", serveConfig{addr: "0.0.0.0:8080", insecure: true}, true},
		{"join token", serveConfig{addr: "0.0.0.0:8080", joinTokens: "a,b"}, true},
		{"deprecated peer token", serveConfig{addr: "0.0.0.0:8080", peerToken: "a"}, true},
		{"admin token", serveConfig{addr: "0.0.0.0:8080", adminToken: "a"}, true},
		{"a list of blanks is no token", serveConfig{addr: "0.0.0.0:8080", joinTokens: " , "}, false},
	} {
		err := tc.c.checkExposure()
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("%s: the refusal does not say how to proceed: %v", tc.name, err)
		}
	}
}

func TestJoinTokens(t *testing.T) {
	t.Parallel()
	c := serveConfig{joinTokens: " new, old ,", peerToken: "legacy"}
	if got := strings.Join(c.tokens(), "|"); got != "new|old|legacy" {
		t.Fatalf("tokens = %q", got)
	}
	if got := c.agentToken(); got != "new" {
		t.Fatalf("agent token = %q", got)
	}
	if got := firstToken(" new , old"); got != "new" {
		t.Fatalf("firstToken = %q", got)
	}
}
