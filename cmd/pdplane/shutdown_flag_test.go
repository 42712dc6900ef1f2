package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/cli"
	"github.com/rs/zerolog"
)

// TestShutdownGraceFlag: --shutdown-grace defaults to 30 s, takes
// $PDPLANE_SHUTDOWN_GRACE, and a negative grace is refused at start-up.
func TestShutdownGraceFlag(t *testing.T) {
	parse := func(args ...string) serveConfig {
		t.Helper()
		var c serveConfig
		fs := cli.NewFlagSet("serve")
		c.flags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := parse(); c.shutdownGrace != 30*time.Second {
		t.Errorf("default grace %s, want 30s", c.shutdownGrace)
	}
	t.Setenv("PDPLANE_SHUTDOWN_GRACE", "45s")
	if c := parse(); c.shutdownGrace != 45*time.Second {
		t.Errorf("grace from the environment %s, want 45s", c.shutdownGrace)
	}
	if c := parse("--shutdown-grace", "2s"); c.shutdownGrace != 2*time.Second {
		t.Errorf("grace from the flag %s, want 2s", c.shutdownGrace)
	}
	c := parse("--shutdown-grace", "-1s", "--addr", "127.0.0.1:0")
	_, err := startControlPlane(context.Background(), c, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "--shutdown-grace") {
		t.Fatalf("negative grace: %v, want a refusal naming --shutdown-grace", err)
	}
}
