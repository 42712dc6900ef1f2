package deploy_test

// Shared by the Kubernetes and systemd tests: the pdplane binary built from
// this tree, the flags and environment variables its subcommands accept
// (read from their -h output), and a parser for a pdplane command line with
// the flag package's rules.

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// startPdplane runs the built binary as `pdplane SUB --addr ADDR ARGS...` on
// a free loopback address, without the caller's PDPLANE_* environment, and
// returns its base URL once GET readyPath answers a status that ready
// accepts. It fails the test, with the binary's output, if the binary exits
// first or is not ready within wait. stop kills it and waits for it.
func startPdplane(t *testing.T, readyPath string, ready func(status int) bool, wait time.Duration, sub string, args ...string) (base string, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(pdplaneBin, append([]string{sub, "--addr", addr}, args...)...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PDPLANE_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	base = "http://" + addr
	client := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(wait)
	for {
		if resp, err := client.Get(base + readyPath); err == nil {
			resp.Body.Close()
			if ready(resp.StatusCode) {
				return base, stop
			}
		}
		select {
		case err := <-exited:
			exited <- err
			stop()
			t.Fatalf("pdplane %s --addr %s exited (%v):\n%s", sub, addr, err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("pdplane %s --addr %s was not ready within %s:\n%s", sub, addr, wait, out.String())
		}
	}
}

// pendingFlags lists flags being added to pdplane concurrently with these
// artifacts, per subcommand. The artifacts already use them; until the
// binary accepts them the tests treat them as accepted (string-valued, with
// the usual PDPLANE_* variable) and log it. Once the binary accepts one,
// TestPendingFlagsStillPending fails: remove the flag from this list.
var pendingFlags = map[string][]string{}

// pdplaneBin is the binary built from this tree by TestMain.
var pdplaneBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pdplane-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		os.Exit(1)
	}
	pdplaneBin = filepath.Join(dir, "pdplane")
	build := exec.Command("go", "build", "-o", pdplaneBin, "./cmd/pdplane")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/pdplane: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// flagInfo is one flag of a subcommand as its -h output shows it.
type flagInfo struct {
	isBool  bool
	env     string // its $PDPLANE_* variable
	pending bool   // in pendingFlags, not yet accepted by the binary
}

// command is what one subcommand accepts.
type command struct {
	name  string
	flags map[string]flagInfo
	envs  map[string]string // PDPLANE_* variable → flag name
}

var (
	flagLine = regexp.MustCompile(`^  --?([a-z0-9][a-z0-9-]*)(?: (\S+))?$`)
	envRef   = regexp.MustCompile(`\(\$(PDPLANE_[A-Z0-9_]+)\)`)
)

// helpFlags runs `pdplane SUB -h` and parses its flag listing.
func helpFlags(t *testing.T, sub string) command {
	t.Helper()
	out, _ := exec.Command(pdplaneBin, sub, "-h").CombinedOutput() // -h may exit non-zero
	if !strings.Contains(string(out), "pdplane "+sub+" [flags]") {
		t.Fatalf("pdplane %s -h printed no usage:\n%s", sub, out)
	}
	return parseHelp(t, sub, string(out))
}

func parseHelp(t *testing.T, sub, help string) command {
	t.Helper()
	c := command{name: sub, flags: map[string]flagInfo{}, envs: map[string]string{}}
	var cur string
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			c.flags[cur] = flagInfo{isBool: m[2] == ""}
			continue
		}
		if m := envRef.FindStringSubmatch(line); m != nil && cur != "" {
			f := c.flags[cur]
			f.env = m[1]
			c.flags[cur] = f
			c.envs[m[1]] = cur
		}
	}
	if len(c.flags) == 0 {
		t.Fatalf("pdplane %s -h: no flags found in:\n%s", sub, help)
	}
	for _, p := range pendingFlags[sub] {
		if _, ok := c.flags[p]; ok {
			continue // TestPendingFlagsStillPending reports it
		}
		env := "PDPLANE_" + strings.ToUpper(strings.ReplaceAll(p, "-", "_"))
		c.flags[p] = flagInfo{env: env, pending: true}
		c.envs[env] = p
		t.Logf("pdplane %s does not accept --%s yet: taken as pending (pendingFlags)", sub, p)
	}
	return c
}

// TestPendingFlagsStillPending fails as soon as the binary accepts a flag
// listed in pendingFlags, so that whoever merges it removes it from there
// and the artifacts are checked against the real flag from then on.
func TestPendingFlagsStillPending(t *testing.T) {
	t.Parallel()
	for sub, names := range pendingFlags {
		out, _ := exec.Command(pdplaneBin, sub, "-h").CombinedOutput()
		for _, n := range names {
			if helpHasFlag(string(out), n) {
				t.Errorf("pdplane %s now accepts --%s: remove it from pendingFlags in deploy/deploy_test.go", sub, n)
			}
		}
	}
}

// helpHasFlag reports whether a -h output lists the flag.
func helpHasFlag(help, name string) bool {
	return slices.ContainsFunc(strings.Split(help, "\n"), func(l string) bool {
		m := flagLine.FindStringSubmatch(l)
		return m != nil && m[1] == name
	})
}

// parseArgs reads a pdplane subcommand's arguments (after the subcommand)
// with the flag package's rules: -name or --name, =value or the next
// argument for non-boolean flags. It refuses unknown flags, a flag given
// twice, and positional arguments (no pdplane subcommand here takes any).
func parseArgs(c command, args []string) (map[string]string, error) {
	set := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return nil, fmt.Errorf("pdplane %s: positional argument %q: it takes none", c.name, a)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if name == "" || strings.HasPrefix(name, "-") || strings.HasPrefix(name, "=") {
			return nil, fmt.Errorf("pdplane %s: bad flag syntax %q", c.name, a)
		}
		name, val, hasVal := strings.Cut(name, "=")
		f, ok := c.flags[name]
		if !ok {
			return nil, fmt.Errorf("pdplane %s: unknown flag --%s (not in `pdplane %s -h`)", c.name, name, c.name)
		}
		if _, dup := set[name]; dup {
			return nil, fmt.Errorf("pdplane %s: --%s given twice", c.name, name)
		}
		switch {
		case f.isBool && hasVal:
			if _, err := strconv.ParseBool(val); err != nil {
				return nil, fmt.Errorf("pdplane %s: --%s=%q is not a boolean", c.name, name, val)
			}
		case f.isBool:
			val = "true"
		case !hasVal:
			if i+1 >= len(args) {
				return nil, fmt.Errorf("pdplane %s: --%s needs a value", c.name, name)
			}
			i++
			val = args[i]
		}
		set[name] = val
	}
	return set, nil
}

// configFileFlags checks a config file that an artifact passes to `pdplane
// SUB --config`: the built binary accepts it (--print-config exits 0), it
// holds no secret (--print-config, given no variables, redacts nothing:
// secrets come from the environment), and none of its keys is also set by
// args or by one of the variables env, which would override it unseen. It
// returns the file's keys with their values as the flags take them (a list
// joined with commas).
func configFileFlags(t *testing.T, where, sub, file string, args map[string]string, env map[string]string) map[string]string {
	t.Helper()
	cmd := exec.Command(pdplaneBin, sub, "--config", file, "--print-config")
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PDPLANE_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s: pdplane %s --config %s --print-config: %v\n%s", where, sub, file, err, out)
		return nil
	}
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, "<redacted>") {
			t.Errorf("%s: %s holds a secret (pdplane %s --print-config: %s): give it as its PDPLANE_* variable", where, file, sub, l)
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		t.Fatalf("%s: %s: %v", where, file, err)
	}
	set := map[string]string{}
	for k, v := range keys {
		if items, ok := v.([]any); ok {
			texts := make([]string, len(items))
			for i, it := range items {
				texts[i] = fmt.Sprint(it)
			}
			set[k] = strings.Join(texts, ",")
		} else {
			set[k] = fmt.Sprint(v)
		}
		if _, both := args[k]; both {
			t.Errorf("%s: --%s is set both in %s and on the command line, which wins", where, k, file)
		}
		envName := "PDPLANE_" + strings.ToUpper(strings.ReplaceAll(k, "-", "_"))
		if _, both := env[envName]; both {
			t.Errorf("%s: %s sets %s, but $%s overrides it", where, file, k, envName)
		}
	}
	return set
}

// withConfig is a command line's flags over its config file's keys: the
// flags that the command sees as set.
func withConfig(file, args map[string]string) map[string]string {
	set := map[string]string{}
	for k, v := range file {
		set[k] = v
	}
	for k, v := range args {
		set[k] = v
	}
	return set
}

// checkHeal checks a --heal value's form: exec:CMD, systemd:UNIT,
// kubernetes or none.
func checkHeal(v string) error {
	kind, arg, hasArg := strings.Cut(v, ":")
	switch {
	case (kind == "kubernetes" || kind == "none") && !hasArg:
		return nil
	case (kind == "exec" || kind == "systemd") && arg != "":
		return nil
	}
	return fmt.Errorf("--heal=%q: want exec:CMD, systemd:UNIT, kubernetes or none", v)
}

func TestParseArgsRefuses(t *testing.T) {
	t.Parallel()
	c := parseHelp(t, "fake", "Usage of fake:\n  -engine string\n    \tx ($PDPLANE_ENGINE)\n  -insecure\n    \ty\n")
	for _, args := range [][]string{
		{"--nope=1"},
		{"--engine"},
		{"--engine=a", "--engine=b"},
		{"--insecure=maybe"},
		{"positional"},
		{"---engine=a"},
	} {
		if _, err := parseArgs(c, args); err == nil {
			t.Errorf("parseArgs(%q) accepted it", args)
		}
	}
	// What TestPendingFlagsStillPending sees once --heal lands.
	if !helpHasFlag("Usage of agent:\n  -heal string\n    \th ($PDPLANE_HEAL)\n", "heal") || helpHasFlag("  -healthy\n", "heal") {
		t.Error("helpHasFlag does not find a listed flag exactly")
	}
	got, err := parseArgs(c, []string{"-engine", "sglang", "--insecure"})
	if err != nil || got["engine"] != "sglang" || got["insecure"] != "true" {
		t.Errorf("parseArgs: got %v, %v", got, err)
	}
}
