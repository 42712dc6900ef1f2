package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/cli"
	"gopkg.in/yaml.v3"
)

// parsedServe is serve's flag set after one parse.
type parsedServe struct {
	fs             *cli.FlagSet
	c              serveConfig
	path           string // the config file, if any
	stdout, stderr strings.Builder
	err            error
}

// parseServe parses serve's flags with a config file holding file (none
// when file is empty), the variables env (and no others) and args.
func parseServe(t *testing.T, file string, env map[string]string, args ...string) *parsedServe {
	t.Helper()
	p := &parsedServe{}
	var gcMinHeapMiB int
	p.fs = serveFlags(&p.c, &gcMinHeapMiB)
	p.fs.Stdout, p.fs.Stderr = &p.stdout, &p.stderr
	p.fs.LookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if file != "" {
		p.path = writeConfig(t, "serve.yaml", file)
		args = append([]string{"--config", p.path}, args...)
	}
	p.err = p.fs.Parse(args)
	return p
}

func writeConfig(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigFilePrecedence: the file, then the environment, then the
// command line, each overriding the one before.
func TestConfigFilePrecedence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		file  string
		env   map[string]string
		args  []string
		want  time.Duration
		setBy string // "file", "flag" or the variable
	}{
		{"default", "", nil, nil, 10 * time.Second, ""},
		{"file", "lease-ttl: 20s\n", nil, nil, 20 * time.Second, "file"},
		{"environment over file", "lease-ttl: 20s\n", map[string]string{"PDPLANE_LEASE_TTL": "30s"}, nil, 30 * time.Second, "$PDPLANE_LEASE_TTL"},
		{"flag over file", "lease-ttl: 20s\n", nil, []string{"--lease-ttl", "40s"}, 40 * time.Second, "flag"},
		{"flag over environment over file", "lease-ttl: 20s\n", map[string]string{"PDPLANE_LEASE_TTL": "30s"},
			[]string{"--lease-ttl=40s"}, 40 * time.Second, "flag"},
		{"an empty variable leaves the file's duration", "lease-ttl: 20s\n", map[string]string{"PDPLANE_LEASE_TTL": ""}, nil,
			20 * time.Second, "file"},
		{"config from the environment", "", map[string]string{"PDPLANE_CONFIG": "FILE"}, nil, 20 * time.Second, "file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.env["PDPLANE_CONFIG"] == "FILE" {
				tc.env = map[string]string{"PDPLANE_CONFIG": writeConfig(t, "serve.yaml", "lease-ttl: 20s\n")}
			}
			p := parseServe(t, tc.file, tc.env, tc.args...)
			if p.err != nil {
				t.Fatal(p.err)
			}
			if p.c.leaseTTL != tc.want {
				t.Errorf("lease TTL %s, want %s", p.c.leaseTTL, tc.want)
			}
			want := tc.setBy
			if want == "file" {
				want = *p.fs.Config
			}
			if got := p.fs.SetBy["lease-ttl"]; got != want {
				t.Errorf("--lease-ttl set by %q, want %q", got, want)
			}
		})
	}
}

// TestConfigFileValues: scalars of any YAML type are taken in their text
// form, null as empty; a sequence is a comma-separated list where the flag
// takes one.
func TestConfigFileValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file string
		got  func(*serveConfig) any
		want any
	}{
		{"max-inflight: 8\n", func(c *serveConfig) any { return c.maxInflight }, 8},
		{"insecure: true\n", func(c *serveConfig) any { return c.insecure }, true},
		{"front: false\n", func(c *serveConfig) any { return c.front }, false},
		{"replica: 1.50\n", func(c *serveConfig) any { return c.replica }, "1.50"},
		{"replica: 0x1F\n", func(c *serveConfig) any { return c.replica }, "0x1F"},
		{"replica: ~\n", func(c *serveConfig) any { return c.replica }, ""},
		{"replica:\n", func(c *serveConfig) any { return c.replica }, ""},
		{"access-log: sample:10\n", func(c *serveConfig) any { return c.logServedEvery }, 10},
		{"join-token: [a, b]\n", func(c *serveConfig) any { return c.tokens() }, []string{"a", "b"}},
		{"join-token:\n  - a\n  - b\n", func(c *serveConfig) any { return c.tokens() }, []string{"a", "b"}},
		{"join-token: a,b\n", func(c *serveConfig) any { return c.tokens() }, []string{"a", "b"}},
		{"api-keys: [k1, ' k2', 3]\n", func(c *serveConfig) any { return c.apiKeys }, "k1, k2,3"},
		{"allowed-hosts: []\n", func(c *serveConfig) any { return c.allowedHosts }, ""},
		{"lease-ttl: &ttl 20s\nheal-hold: *ttl\n", func(c *serveConfig) any { return c.heal.Hold }, 20 * time.Second},
		{"# only comments\n", func(c *serveConfig) any { return c.leaseTTL }, 10 * time.Second},
	} {
		p := parseServe(t, tc.file, nil)
		if p.err != nil {
			t.Errorf("%q: %v", tc.file, p.err)
			continue
		}
		if got := tc.got(&p.c); !equal(got, tc.want) {
			t.Errorf("%q: got %#v, want %#v", tc.file, got, tc.want)
		}
	}
}

func equal(a, b any) bool {
	as, aok := a.([]string)
	bs, bok := b.([]string)
	if aok && bok {
		return slices.Equal(as, bs)
	}
	return a == b
}

// TestConfigFileErrors: a bad file is refused, naming the file and the key,
// with the framework's own message for a bad value, as a usage error.
func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		want []string
	}{
		{"unknown key", "lease-tl: 10s\n", nil, []string{`serve.yaml: unknown key "lease-tl" (see 'pdplane serve -h')`}},
		{"bad value", "lease-ttl: 10\n", nil,
			[]string{`serve.yaml: lease-ttl: invalid value "10" for --lease-ttl: want a duration such as 10s, 1m30s`}},
		{"bad value the environment overrides", "lease-ttl: 10\n", map[string]string{"PDPLANE_LEASE_TTL": "10s"},
			[]string{`serve.yaml: lease-ttl: invalid value "10" for --lease-ttl`}},
		{"every bad key", "lease-tl: 10s\nmax-inflight: lots\ninsecure: yes\n", nil, []string{
			`serve.yaml: unknown key "lease-tl"`,
			`serve.yaml: max-inflight: invalid value "lots" for --max-inflight: want an integer such as 8`,
			`serve.yaml: insecure: invalid value "yes" for --insecure: want true or false`}},
		{"a list where one value is wanted", "lease-ttl: [10s]\n", nil, []string{"serve.yaml: lease-ttl: a list, but --lease-ttl takes one value"}},
		{"a list of lists", "join-token: [[a]]\n", nil, []string{"serve.yaml: join-token: want a list of values"}},
		{"a mapping value", "lease-ttl: {a: 1}\n", nil, []string{"serve.yaml: lease-ttl: want a value or a list of values, not a mapping"}},
		{"not a mapping: a list", "- lease-ttl\n", nil, []string{"serve.yaml: want a mapping of flag names to values"}},
		{"not a mapping: a value", "lease-ttl\n", nil, []string{"serve.yaml: want a mapping of flag names to values"}},
		{"not YAML", "lease-ttl: [\n", nil, []string{"serve.yaml: yaml: "}},
		{"two documents", "lease-ttl: 1s\n---\nlease-ttl: 2s\n", nil, []string{"serve.yaml: more than one YAML document"}},
		{"a key given twice", "lease-ttl: 1s\nlease-ttl: 2s\n", nil, []string{"serve.yaml: lease-ttl: given twice"}},
		{"config in the file", "config: other.yaml\n", nil, []string{"serve.yaml: config: only a command-line flag"}},
		{"print-config in the file", "print-config: true\n", nil, []string{"serve.yaml: print-config: only a command-line flag"}},
		{"a redacted secret with nothing to fill it", "admin-token: <redacted>\n", nil,
			[]string{"serve.yaml: admin-token: <redacted> stands for a secret that --print-config hid: give it as $PDPLANE_ADMIN_TOKEN or --admin-token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := parseServe(t, tc.file, tc.env)
			checkUsageError(t, p.err, tc.want...)
		})
	}
}

// checkUsageError: err exits 2 and says each of want.
func checkUsageError(t *testing.T, err error, want ...string) {
	t.Helper()
	var stderr strings.Builder
	if code := exitStatus(err, &stderr); code != 2 {
		t.Errorf("exit %d (%v), want 2", code, err)
	}
	for _, w := range want {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("error %q does not say %q", stderr.String(), w)
		}
	}
}

// TestConfigFileMissing: a missing file names the flag or the variable
// that named it.
func TestConfigFileMissing(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "serve.yaml")
	p := parseServe(t, "", nil, "--config", missing)
	checkUsageError(t, p.err, "--config: open "+missing+": no such file or directory")
	p = parseServe(t, "", map[string]string{"PDPLANE_CONFIG": missing})
	checkUsageError(t, p.err, "$PDPLANE_CONFIG: open "+missing+": no such file or directory")
	// A flag on the command line wins over the variable's file.
	p = parseServe(t, "lease-ttl: 20s\n", map[string]string{"PDPLANE_CONFIG": missing})
	if p.err != nil || p.c.leaseTTL != 20*time.Second {
		t.Errorf("--config FILE with $PDPLANE_CONFIG missing: %v, lease TTL %s", p.err, p.c.leaseTTL)
	}
}

// TestConfigFileShorthandsAndDeprecated: a shorthand is no key; a
// deprecated flag set in the file warns, naming the file, and
// --print-config shows it only when set, so that its output, fed back,
// warns only where the configuration did.
func TestConfigFileShorthandsAndDeprecated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file, flag string // flag: --print-config or none
		want       string // in the error, the warnings or the output
		missing    string // not in the output
	}{
		{"o: json\n", "", `cli.yaml: unknown key "o" (see 'pdplane peers list -h')`, ""},
		{"output: json\n", "--print-config", "\noutput: json\n", "\no:"},
		{"token: old\n", "", "/cli.yaml: token is deprecated: use --join-token ($PDPLANE_JOIN_TOKEN)", ""},
		{"token: old\n", "--print-config", "\ntoken: <redacted>\n", ""},
		{"join-token: new\n", "--print-config", "\njoin-token: <redacted>\n", "\ntoken:"},
	} {
		var output, token, legacy string
		fs := cli.NewFlagSet("peers list")
		fs.OutputFlag(&output)
		fs.List(&token, "join-token", "", "join token")
		fs.DeprecatedStr(&legacy, "token", "join-token")
		fs.ConfigFile()
		var stdout, stderr strings.Builder
		fs.Stdout, fs.Stderr = &stdout, &stderr
		fs.LookupEnv = func(string) (string, bool) { return "", false }
		args := []string{"--config", writeConfig(t, "cli.yaml", tc.file)}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		err := fs.Parse(args)
		got := stdout.String() + stderr.String()
		if err != nil && !errors.Is(err, cli.ErrPrinted) {
			got += err.Error()
		}
		if !strings.Contains(got, tc.want) || tc.missing != "" && strings.Contains(got, tc.missing) {
			t.Errorf("%q %s: %v, printed\n%s\nwant %q and not %q", tc.file, tc.flag, err, got, tc.want, tc.missing)
		}
	}
}

// printServe runs serve --print-config and returns what it printed.
func printServe(t *testing.T, file string, env map[string]string, args ...string) string {
	t.Helper()
	p := parseServe(t, file, env, append(args, "--print-config")...)
	if !errors.Is(p.err, cli.ErrPrinted) {
		t.Fatalf("--print-config: %v, want it to print and stop", p.err)
	}
	if code := exitStatus(p.err, io.Discard); code != 0 {
		t.Errorf("--print-config exits %d", code)
	}
	return p.stdout.String()
}

// TestPrintConfigRoundTrip: --print-config prints every flag, from
// whichever source, and its output fed back with --config (the secrets
// still in the environment) prints the same.
func TestPrintConfigRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		file    string
		env     map[string]string
		args    []string
		want    []string
		keepEnv bool // feed back with env, not with none
	}{
		{"defaults", "", nil, nil,
			[]string{"lease-ttl: 10s\n", "allowed-hosts: []\n", "max-inflight: 4096\n", "front: true\n", `admin-token: ""` + "\n"}, false},
		{"every source", "lease-ttl: 20s\nallowed-hosts: [a.example, b.example]\nreplica: \"yes\"\n",
			map[string]string{"PDPLANE_MAX_INFLIGHT": "9", "PDPLANE_ACCESS_LOG": "sample:3"},
			[]string{"--insecure", "--addr", "0.0.0.0:9090"},
			[]string{"lease-ttl: 20s\n", "allowed-hosts: [a.example, b.example]\n", "replica: \"yes\"\n", "max-inflight: 9\n",
				"access-log: sample:3\n", "insecure: true\n", "addr: 0.0.0.0:9090\n"}, false},
		{"secrets", "lease-ttl: 20s\n",
			map[string]string{"PDPLANE_ADMIN_TOKEN": "adm", "PDPLANE_API_KEYS": "k1,k2", "PDPLANE_DATABASE_URL": "postgres://pd:pw@db/pd"}, nil,
			[]string{"admin-token: <redacted>\n", "database-url: <redacted>\n", "api-keys: <redacted>\n", "lease-ttl: 20s\n"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := printServe(t, tc.file, tc.env, tc.args...)
			if !strings.HasPrefix(out, "# pdplane serve --print-config: ") {
				t.Errorf("no header comment:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, "\n"+w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			checkEveryFlagPrinted(t, out)
			var env map[string]string
			if tc.keepEnv {
				env = tc.env
			}
			if again := printServe(t, out, env); again != out {
				t.Errorf("fed back, --print-config prints\n%s\nwant\n%s", again, out)
			}
		})
	}
}

// checkEveryFlagPrinted: the output is YAML with one key per flag of
// serve, but --config and --print-config.
func checkEveryFlagPrinted(t *testing.T, out string) {
	t.Helper()
	var got map[string]any
	if err := yaml.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, out)
	}
	var c serveConfig
	var gcMinHeapMiB int
	serveFlags(&c, &gcMinHeapMiB).VisitAll(func(fl *flag.Flag) {
		_, printed := got[fl.Name]
		if want := fl.Name != "config" && fl.Name != "print-config"; printed != want {
			t.Errorf("--%s printed: %v, want %v", fl.Name, printed, want)
		}
	})
}

// TestPrintConfigRedactsSecrets: no secret reaches the output; empty ones
// and a database URL without a password are shown.
func TestPrintConfigRedactsSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"PDPLANE_ADMIN_TOKEN":  "adm-s3cret",
		"PDPLANE_JOIN_TOKEN":   "join-s3cret,join2-s3cret",
		"PDPLANE_API_KEYS":     "key-s3cret",
		"PDPLANE_DATABASE_URL": "postgres://pd:pw-s3cret@db/pd",
	}
	out := printServe(t, "", env)
	if strings.Contains(out, "s3cret") {
		t.Errorf("a secret is printed:\n%s", out)
	}
	for _, k := range []string{"admin-token", "join-token", "api-keys", "database-url"} {
		if !strings.Contains(out, "\n"+k+": <redacted>\n") {
			t.Errorf("%s is not shown as <redacted>:\n%s", k, out)
		}
	}
	out = printServe(t, "", map[string]string{"PDPLANE_DATABASE_URL": "postgres://pd@db/pd?sslmode=require"})
	for _, w := range []string{"\ndatabase-url: postgres://pd@db/pd?sslmode=require\n", "\nadmin-token: \"\"\n", "\napi-keys: []\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestConfigFileCommands: serve, agent and sim take --config and
// --print-config through run, with run's exit statuses; dev does not.
func TestConfigFileCommands(t *testing.T) {
	t.Cleanup(func() { cli.ParseHook = nil })
	file := writeConfig(t, "pdplane.yaml", "log-level: debug\n")
	for _, cmd := range []string{"serve", "agent", "sim"} {
		var got *cli.FlagSet
		cli.ParseHook = func(fs *cli.FlagSet) error { got = fs; return errStopAfterParse }
		err := commands[cmd](context.Background(), []string{"--config", file})
		if !errors.Is(err, errStopAfterParse) || got == nil {
			t.Errorf("%s --config: %v", cmd, err)
		} else if v, by := got.Lookup("log-level").Value.String(), got.SetBy["log-level"]; v != "debug" || by != file {
			t.Errorf("%s --config: --log-level %q set by %q", cmd, v, by)
		}

		var out strings.Builder
		cli.ParseHook = func(fs *cli.FlagSet) error { fs.Stdout = &out; return nil }
		var stderr strings.Builder
		if code := run(context.Background(), []string{cmd, "--config", file, "--print-config"}, io.Discard, &stderr); code != 0 {
			t.Errorf("%s --print-config: exit %d: %s", cmd, code, stderr.String())
		}
		if !strings.HasPrefix(out.String(), "# pdplane "+cmd+" --print-config") || !strings.Contains(out.String(), "\nlog-level: debug\n") {
			t.Errorf("%s --print-config printed:\n%s", cmd, out.String())
		}
	}
	cli.ParseHook = nil
	bad := writeConfig(t, "bad.yaml", "lease-tl: 1s\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--config", bad}, `bad.yaml: unknown key "lease-tl" (see 'pdplane serve -h')`},
		{[]string{"dev", "--config", file}, "dev: unknown flag -config"},
	} {
		var stderr strings.Builder
		if code := run(context.Background(), tc.args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("pdplane %s: exit %d, %q; want 2 saying %q", strings.Join(tc.args, " "), code, stderr.String(), tc.want)
		}
	}
}
