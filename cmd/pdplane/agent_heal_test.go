package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/agent"
)

func agentSpecEngine(path, reregister string) *agent.SpecFileEngine {
	return &agent.SpecFileEngine{Path: path, ReregisterCmd: reregister}
}

// TestAgentRefusesBadHeal: a heal action that cannot work stops the agent
// at start, with the reason, instead of failing the first heal.
func TestAgentRefusesBadHeal(t *testing.T) {
	t.Parallel()
	bin := pdplaneBinary(t)
	for _, tc := range []struct {
		args, env []string
		want      string
	}{
		{[]string{"agent", "--heal", "bogus"}, nil,
			`--heal: unknown heal action "bogus": want one of exec:CMD, systemd:UNIT, kubernetes, none`},
		{[]string{"agent", "--engine", "sglang", "--engine-url", "http://127.0.0.1:1"}, []string{"PDPLANE_HEAL=systemd:a/b"},
			"--heal: heal action systemd:a/b"},
		{[]string{"agent", "--heal", "kubernetes", "--engine", "sglang", "--engine-url", "http://127.0.0.1:1"}, nil,
			"KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"},
		{[]string{"agent", "--heal", "exec:"}, nil, "heal action exec needs a command"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tc.env...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("pdplane %s: %v, output %q; want exit 1 saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
}

func TestParseHealDefaults(t *testing.T) {
	for _, tc := range []struct {
		spec, reregister, path, kind string
		alias                        bool
	}{
		{"", "", "", "none", false},
		{"", "", "/etc/pdplane/decode.json", "none", false},
		{"", "/opt/restart-decode.sh", "/etc/pdplane/decode.json", "exec", true},
		{"systemd:sglang-decode", "/opt/restart-decode.sh", "/etc/pdplane/decode.json", "systemd", false},
	} {
		eng := agentSpecEngine(tc.path, tc.reregister)
		heal, alias, err := parseHeal(tc.spec, eng)
		if err != nil || heal.Kind() != tc.kind || alias != tc.alias {
			t.Errorf("parseHeal(%q, reregister %q): %v, alias %v, %v; want %s, alias %v", tc.spec, tc.reregister, heal, alias, err, tc.kind, tc.alias)
		}
	}
	if _, _, err := parseHeal("", agentSpecEngine("f.json", "  ")); err == nil || !strings.HasPrefix(err.Error(), "--reregister-cmd: ") {
		t.Errorf("a blank --reregister-cmd: %v, want an error naming --reregister-cmd", err)
	}
}

// TestHealReregisterCmdAliasKeepsItsEnvironment: a --reregister-cmd script
// that reads $PDPLANE_SPEC_FILE and $PDPLANE_REREGISTER_REASON works as the
// heal action unchanged.
func TestHealReregisterCmdAliasKeepsItsEnvironment(t *testing.T) {
	out := filepath.Join(t.TempDir(), "env")
	heal, _, err := parseHeal("", agentSpecEngine("/etc/pdplane/decode.json",
		`echo "$PDPLANE_SPEC_FILE|$PDPLANE_REREGISTER_REASON|$PDPLANE_PEER_NAME" > `+out))
	if err != nil {
		t.Fatal(err)
	}
	if err := heal.Run(context.Background(), agent.HealRequest{Name: "decode-0", Reason: "stale"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); string(got) != "/etc/pdplane/decode.json|stale|decode-0\n" {
		t.Fatalf("the command saw %q", got)
	}
}
