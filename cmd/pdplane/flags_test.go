package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/cli"
)

var errStopAfterParse = errors.New("stopped after parsing the flags")

// commandLines are every subcommand, and each verb of peers and pairs.
func commandLines() [][]string {
	var lines [][]string
	for name := range commands {
		switch name {
		case "peers":
			for _, s := range peersGroup(io.Discard).subs {
				lines = append(lines, []string{name, s.name})
			}
		case "pairs":
			for _, s := range pairsGroup(io.Discard).subs {
				lines = append(lines, []string{name, s.name})
			}
		case "bench":
			lines = append(lines, []string{name, "compare"}, []string{name, "routing"})
		default:
			lines = append(lines, []string{name})
		}
	}
	sort.Slice(lines, func(i, j int) bool { return strings.Join(lines[i], " ") < strings.Join(lines[j], " ") })
	return lines
}

// flagSetOf runs the command line far enough to parse its flags, and
// returns its flag set.
func flagSetOf(t *testing.T, line []string) *cli.FlagSet {
	t.Helper()
	var got *cli.FlagSet
	cli.ParseHook = func(fs *cli.FlagSet) error {
		got = fs
		return errStopAfterParse
	}
	defer func() { cli.ParseHook = nil }()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing may start
	err := commands[line[0]](ctx, line[1:])
	if !errors.Is(err, errStopAfterParse) || got == nil {
		t.Fatalf("pdplane %s: %v; want it to parse its flags and stop", strings.Join(line, " "), err)
	}
	if got.Name() != strings.Join(line, " ") {
		t.Errorf("pdplane %s: its flag set is named %q", strings.Join(line, " "), got.Name())
	}
	return got
}

// TestEveryFlagReadsItsVariable: every flag of every subcommand takes its
// value from its PDPLANE_* variable when the command line leaves it out,
// and its help names the variable.
func TestEveryFlagReadsItsVariable(t *testing.T) {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PDPLANE_") {
			k, _, _ := strings.Cut(kv, "=")
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	n := 0
	for _, line := range commandLines() {
		cmd := strings.Join(line, " ")
		t.Run(cmd, func(t *testing.T) {
			fs := flagSetOf(t, line)
			fs.Stderr = io.Discard
			want := map[string]string{}
			fs.VisitAll(func(fl *flag.Flag) {
				if _, short := fs.Shorthands[fl.Name]; short {
					return
				}
				sample, ok := cli.Sample(fl.Value)
				if !ok {
					t.Errorf("--%s is registered without cli.FlagSet's helpers (Str, Dur, Int, Bool, Choice)", fl.Name)
					return
				}
				if !strings.Contains(fl.Usage, "$"+cli.EnvName(fl.Name)) {
					t.Errorf("--%s: its help does not name $%s", fl.Name, cli.EnvName(fl.Name))
				}
				want[fl.Name] = sample
				t.Setenv(cli.EnvName(fl.Name), sample)
			})
			fs = flagSetOf(t, line)
			for name, v := range want {
				n++
				if got := fs.Lookup(name).Value.String(); got != v {
					t.Errorf("with %s=%s: --%s = %q", cli.EnvName(name), v, name, got)
				}
				if fs.SetBy[name] != "$"+cli.EnvName(name) {
					t.Errorf("--%s: set by %q", name, fs.SetBy[name])
				}
			}
			for short, long := range fs.Shorthands {
				if got := fs.Lookup(short).Value.String(); got != want[long] {
					t.Errorf("-%s = %q with %s=%s", short, got, cli.EnvName(long), want[long])
				}
			}
		})
	}
	if n < 60 {
		t.Errorf("only %d flags checked", n)
	}
	t.Logf("%d flags checked", n)
}

// TestFlagErrors: a bad value names the flag (or the variable) and the form
// wanted, and exits 2.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"serve", "--lease-ttl", "10"}, `invalid value "10" for --lease-ttl: want a duration such as 10s, 1m30s`},
		{nil, []string{"serve", "--max-inflight", "lots"}, `invalid value "lots" for --max-inflight: want an integer such as 8`},
		{nil, []string{"serve", "--insecure=maybe"}, `invalid value "maybe" for --insecure: want true or false`},
		{nil, []string{"dev", "--prefills=two"}, `invalid value "two" for --prefills: want an integer such as 8`},
		{nil, []string{"peers", "list", "-o", "xml"}, `invalid value "xml" for --output: want one of table, json, yaml`},
		{map[string]string{"PDPLANE_LEASE_TTL": "10"}, []string{"serve"},
			`PDPLANE_LEASE_TTL=10: invalid value "10" for --lease-ttl: want a duration such as 10s, 1m30s`},
		{map[string]string{"PDPLANE_BOOTSTRAP_PORT": "x"}, []string{"sim"},
			`PDPLANE_BOOTSTRAP_PORT=x: invalid value "x" for --bootstrap-port: want an integer such as 8`},
		{nil, []string{"serve", "--no-such-flag"}, `serve: unknown flag -no-such-flag (see 'pdplane serve -h')`},
		{nil, []string{"serve", "extra"}, `serve: unexpected arguments: extra`},
		{nil, []string{"peers", "show"}, `peers show takes PEER, got 0 argument(s)`},
		{nil, []string{"pairs", "lift", "p0"}, `pairs lift takes PREFILL DECODE, got 1 argument(s)`},
		{nil, []string{"events", "--limit", "0"}, `invalid value 0 for --limit`},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var stdout, stderr strings.Builder
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("pdplane %s: exit %d, %q; want exit 2 saying %q", strings.Join(tc.args, " "), code, stderr.String(), tc.want)
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
	// A flag on the command line wins over a bad variable.
	t.Setenv("PDPLANE_LEASE_TTL", "10")
	cli.ParseHook = func(*cli.FlagSet) error { return errStopAfterParse }
	defer func() { cli.ParseHook = nil }()
	if err := runServe(context.Background(), []string{"--lease-ttl", "10s"}); !errors.Is(err, errStopAfterParse) {
		t.Errorf("--lease-ttl 10s with PDPLANE_LEASE_TTL=10: %v", err)
	}
}

// TestDeprecatedAliases: the old spellings still work, with a warning.
func TestDeprecatedAliases(t *testing.T) {
	t.Setenv("PDPLANE_TOKEN", "old-tok")
	var warnings strings.Builder
	fs := cli.NewFlagSet("peers list")
	fs.Stderr = &warnings
	var cf clientFlags
	cf.register(fs, true, true)
	if _, err := fs.ParseArgs([]string{"--server", "http://example.invalid"}); err != nil {
		t.Fatal(err)
	}
	c, err := cf.client(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.base != "http://example.invalid" || c.token != "old-tok" {
		t.Errorf("--server and $PDPLANE_TOKEN: base %q token %q", c.base, c.token)
	}
	for _, want := range []string{
		"warning: --server is deprecated: use --control-plane ($PDPLANE_CONTROL_PLANE)",
		"warning: $PDPLANE_TOKEN is deprecated: use --admin-token ($PDPLANE_ADMIN_TOKEN)",
	} {
		if !strings.Contains(warnings.String(), want) {
			t.Errorf("warnings %q lack %q", warnings.String(), want)
		}
	}
	// The new spellings win over the old.
	t.Setenv("PDPLANE_ADMIN_TOKEN", "new-tok")
	fs = cli.NewFlagSet("peers list")
	fs.Stderr = io.Discard
	cf = clientFlags{}
	cf.register(fs, true, true)
	if _, err := fs.ParseArgs([]string{"--server", "http://old.invalid", "--control-plane", "http://new.invalid,http://b.invalid"}); err != nil {
		t.Fatal(err)
	}
	if c, _ := cf.client(io.Discard); c.base != "http://new.invalid" || c.token != "new-tok" {
		t.Errorf("new and old spellings: base %q token %q", c.base, c.token)
	}
}
