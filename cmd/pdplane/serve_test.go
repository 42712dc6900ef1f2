package main

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/cli"
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
	if got := cli.FirstToken(" new , old"); got != "new" {
		t.Fatalf("firstToken = %q", got)
	}
}

func TestFlagAccessLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		every int
		ok    bool
	}{
		{"errors", 0, true}, {"all", 1, true}, {"sample:1", 1, true}, {"sample:100", 100, true},
		{"sample:0", 0, false}, {"sample:-3", 0, false}, {"sample:", 0, false}, {"some", 0, false}, {"", 0, false},
	} {
		every, err := parseAccessLog(tc.in)
		if (err == nil) != tc.ok || every != tc.every {
			t.Errorf("parseAccessLog(%q) = %d, %v; want %d, ok %v", tc.in, every, err, tc.every, tc.ok)
		}
	}
	for _, every := range []int{0, 1, 7} {
		if got, err := parseAccessLog(formatAccessLog(every)); err != nil || got != every {
			t.Errorf("parseAccessLog(formatAccessLog(%d)) = %d, %v", every, got, err)
		}
	}
}
