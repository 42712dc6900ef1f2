package deploy_test

// The systemd units, checked offline: each parses as a unit file with known
// sections, its ExecStart runs a pdplane subcommand with flags the built
// binary accepts and a config file whose example (serve.yaml, agent.yaml
// beside the units) it accepts too, the agent's heal matches the polkit
// rule that permits it, and `systemd-analyze verify` accepts them where it
// is installed.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	systemdDir = "systemd"
	// unitBinary is where the units expect the binary.
	unitBinary = "/usr/local/bin/pdplane"
	// agentInstance stands for %i when a template is checked.
	agentInstance = "prefill-0"
	polkitRule    = "50-pdplane-agent-heal.rules"
)

// unitEntry is one Key=Value line.
type unitEntry struct {
	section, key, value string
	line                int
}

type unitFile struct {
	name    string
	entries []unitEntry
}

// values returns every value of section.key, in order.
func (u unitFile) values(section, key string) []string {
	var out []string
	for _, e := range u.entries {
		if e.section == section && e.key == key {
			out = append(out, e.value)
		}
	}
	return out
}

func (u unitFile) value(section, key string) string {
	v := u.values(section, key)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

var (
	unitSection = regexp.MustCompile(`^\[([A-Za-z]+)\]$`)
	unitKey     = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*)$`)
)

// parseUnit reads a service unit the way systemd's parser does for these
// files: comments (# ;), [Section] headers, Key=Value lines, backslash
// continuations. Sections other than Unit, Service and Install fail.
func parseUnit(name string, data []byte) (unitFile, error) {
	u := unitFile{name: name}
	var section, pending string
	pendingLine := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending != "" {
			line = pending + " " + line
			pending = ""
		} else {
			pendingLine = n
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		if m := unitSection.FindStringSubmatch(line); m != nil {
			if !slices.Contains([]string{"Unit", "Service", "Install"}, m[1]) {
				return u, fmt.Errorf("%s:%d: unknown section [%s]", name, n, m[1])
			}
			section = m[1]
			continue
		}
		m := unitKey.FindStringSubmatch(line)
		if m == nil {
			return u, fmt.Errorf("%s:%d: not a Key=Value line: %q", name, n, line)
		}
		if section == "" {
			return u, fmt.Errorf("%s:%d: %s outside any section", name, n, m[1])
		}
		u.entries = append(u.entries, unitEntry{section, m[1], strings.TrimSpace(m[2]), pendingLine})
	}
	if pending != "" {
		return u, fmt.Errorf("%s: ends in a continuation", name)
	}
	return u, sc.Err()
}

// expandSpecifiers replaces the specifiers these units use; any other
// fails, so that one the check does not understand is not passed over.
func expandSpecifiers(s, instance string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("%q ends in %%", s)
		}
		i++
		switch s[i] {
		case 'i', 'I':
			if instance == "" {
				return "", fmt.Errorf("%q: %%%c in a unit that is not a template", s, s[i])
			}
			b.WriteString(instance)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("%q: specifier %%%c not understood by this test", s, s[i])
		}
	}
	return b.String(), nil
}

func loadUnits(t *testing.T) map[string]unitFile {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	units := map[string]unitFile{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u, err := parseUnit(filepath.Base(f), data)
		if err != nil {
			t.Fatal(err)
		}
		units[u.name] = u
	}
	for _, want := range []string{"pdplane-serve.service", "pdplane-agent@.service"} {
		if _, ok := units[want]; !ok {
			t.Fatalf("%s/%s is missing", systemdDir, want)
		}
	}
	return units
}

func TestUnitParserRefuses(t *testing.T) {
	t.Parallel()
	for name, text := range map[string]string{
		"unknown section": "[Sevrice]\nExecStart=/bin/true\n",
		"no section":      "ExecStart=/bin/true\n",
		"not key=value":   "[Service]\nExecStart /bin/true\n",
		"dangling \\":     "[Service]\nExecStart=/bin/true \\\n",
	} {
		if _, err := parseUnit(name, []byte(text)); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
	u, err := parseUnit("ok", []byte("# c\n[Service]\nExecStart=/bin/a \\\n  --b c\n"))
	if err != nil || u.value("Service", "ExecStart") != "/bin/a  --b c" {
		t.Errorf("continuation: got %q, %v", u.value("Service", "ExecStart"), err)
	}
	if _, err := expandSpecifiers("%h/x", "i"); err == nil {
		t.Error("expandSpecifiers accepted %h")
	}
}

// TestSystemdUnits checks each unit's command line against the binary and
// the hardening both units share.
func TestSystemdUnits(t *testing.T) {
	t.Parallel()
	units := loadUnits(t)
	cmds := map[string]command{"serve": helpFlags(t, "serve"), "agent": helpFlags(t, "agent")}
	for name, u := range units {
		instance := ""
		if strings.HasSuffix(name, "@.service") {
			instance = agentInstance
		}
		execs := u.values("Service", "ExecStart")
		if len(execs) != 1 {
			t.Errorf("%s: %d ExecStart lines, want 1", name, len(execs))
			continue
		}
		line, err := expandSpecifiers(execs[0], instance)
		if err != nil {
			t.Errorf("%s: ExecStart: %v", name, err)
			continue
		}
		if strings.ContainsAny(line, `"'$`) {
			t.Errorf("%s: ExecStart %q quotes or expands variables: set PDPLANE_* in the EnvironmentFile instead", name, execs[0])
			continue
		}
		words := strings.Fields(line)
		if len(words) < 2 || words[0] != unitBinary {
			t.Errorf("%s: ExecStart %q does not run %s SUBCOMMAND", name, execs[0], unitBinary)
			continue
		}
		cmd, ok := cmds[words[1]]
		if !ok {
			t.Errorf("%s: ExecStart runs pdplane %s, want serve or agent", name, words[1])
			continue
		}
		set, err := parseArgs(cmd, words[2:])
		if err != nil {
			t.Errorf("%s: ExecStart: %v", name, err)
			continue
		}
		if u.value("Service", "EnvironmentFile") == "" {
			t.Errorf("%s: no EnvironmentFile (the tokens and database URL belong there, not in the unit)", name)
		}
		// The settings come from a config file, installed from the
		// example beside the units.
		if conf := set["config"]; !strings.HasPrefix(conf, "/etc/pdplane/") || !strings.HasSuffix(conf, ".yaml") {
			t.Errorf("%s: --config %q, want /etc/pdplane/*.yaml (the settings; the secrets go in the EnvironmentFile)", name, conf)
		} else {
			example := filepath.Join(systemdDir, cmd.name+".yaml")
			set = withConfig(configFileFlags(t, name, cmd.name, example, set, nil), set)
		}
		for key, want := range map[string]string{
			"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
			"PrivateDevices": "yes", "CapabilityBoundingSet": "", "RestrictSUIDSGID": "yes",
		} {
			if got := u.values("Service", key); len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("%s: %s=%q, want %q", name, key, got, want)
			}
		}
		if u.value("Service", "DynamicUser") != "yes" && u.value("Service", "User") == "" {
			t.Errorf("%s: runs as root: set DynamicUser=yes or User=", name)
		}
		if cmd.name == "agent" {
			checkAgentUnit(t, u, instance, set)
		}
	}
}

// checkAgentUnit: the agent heals by restarting its engine's unit, which
// its polkit rule must allow for exactly that user and that unit.
func checkAgentUnit(t *testing.T, u unitFile, instance string, set map[string]string) {
	t.Helper()
	if instance == "" {
		t.Errorf("%s: the agent unit must be a template (instance = engine name)", u.name)
		return
	}
	if env := u.value("Service", "EnvironmentFile"); env != "/etc/pdplane/%i.env" {
		t.Errorf("%s: EnvironmentFile=%s, want /etc/pdplane/%%i.env", u.name, env)
	}
	if set["name"] != instance {
		t.Errorf("%s: --name %q, want the instance (%%i)", u.name, set["name"])
	}
	heal := set["heal"]
	if err := checkHeal(heal); err != nil {
		t.Errorf("%s: %v", u.name, err)
		return
	}
	unit, ok := strings.CutPrefix(heal, "systemd:")
	if want := "sglang-" + instance + ".service"; !ok || unit != want {
		t.Errorf("%s: --heal %q, want systemd:sglang-%%i.service", u.name, heal)
		return
	}
	user := u.value("Service", "User")
	rule, err := os.ReadFile(filepath.Join(systemdDir, polkitRule))
	if err != nil {
		t.Fatalf("the agent's systemd heal needs its polkit rule: %v", err)
	}
	r := string(rule)
	if !strings.Contains(r, `subject.user == "`+user+`"`) {
		t.Errorf("%s: polkit rule %s does not admit User=%s", u.name, polkitRule, user)
	}
	for _, want := range []string{`action.id == "org.freedesktop.systemd1.manage-units"`, `action.lookup("verb") == "restart"`} {
		if !strings.Contains(r, want) {
			t.Errorf("%s: polkit rule lacks %s", polkitRule, want)
		}
	}
	m := regexp.MustCompile(`/(\^[^/]+\$)/\.test\(action\.lookup\("unit"\)\)`).FindStringSubmatch(r)
	if m == nil {
		t.Fatalf("%s: no /^...$/.test(action.lookup(\"unit\")) pattern", polkitRule)
	}
	re, err := regexp.Compile(m[1])
	if err != nil {
		t.Fatalf("%s: unit pattern %s: %v", polkitRule, m[1], err)
	}
	if !re.MatchString(unit) {
		t.Errorf("%s: unit pattern %s does not admit %s, the unit --heal restarts", polkitRule, m[1], unit)
	}
	for _, other := range []string{"pdplane-serve.service", "postgresql.service", "sshd.service"} {
		if re.MatchString(other) {
			t.Errorf("%s: unit pattern %s also admits %s", polkitRule, m[1], other)
		}
	}
	if u.value("Service", "NoNewPrivileges") == "yes" && strings.Contains(r, "sudo") {
		t.Errorf("%s: sudo cannot run under NoNewPrivileges=yes", polkitRule)
	}
	if !slices.ContainsFunc(strings.Fields(u.value("Service", "RestrictAddressFamilies")), func(f string) bool { return f == "AF_UNIX" }) {
		t.Errorf("%s: the heal asks systemd over D-Bus: RestrictAddressFamilies needs AF_UNIX", u.name)
	}
}

// TestSystemdAnalyzeVerify runs `systemd-analyze verify` on copies of the
// units whose ExecStart points at the binary built from this tree (verify
// checks that the command exists), the template as an instance. Any output
// fails: verify only warns, exit 0, about unknown keys or bad values.
func TestSystemdAnalyzeVerify(t *testing.T) {
	t.Parallel()
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze not found; under CI=true it is required (Debian: apt-get install systemd): %v", err)
		}
		t.Skipf("systemd-analyze not found (%v): the units are not verified by systemd", err)
	}
	dir := t.TempDir()
	units := loadUnits(t)
	var paths []string
	for name := range units {
		data, err := os.ReadFile(filepath.Join(systemdDir, name))
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte(unitBinary), []byte(pdplaneBin))
		if strings.HasSuffix(name, "@.service") {
			name = strings.TrimSuffix(name, "@.service") + "@" + agentInstance + ".service"
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	verify := func(paths ...string) (string, error) {
		cmd := exec.Command(tool, append([]string{"verify", "--man=no"}, paths...)...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := verify(paths...); err != nil || out != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check bites: a unit with a misspelt key only warns, and that
	// warning fails it.
	bad := filepath.Join(dir, "bad.service")
	if err := os.WriteFile(bad, []byte("[Service]\nExecStart="+pdplaneBin+" serve\nProtectSytem=strict\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := verify(bad); err == nil && out == "" {
		t.Error("systemd-analyze verify said nothing about a misspelt key: the check above would miss one")
	}
}
