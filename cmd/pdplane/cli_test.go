package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"sigs.k8s.io/yaml"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/sim/simtest"
)

// syncBuffer is a bytes.Buffer a command may write to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCLIControlPlane serves the control-plane API over store (admin token
// "adm", join token "join") until the test ends, with a prefill p0 and a
// decode d0 registered and heartbeating once.
func startCLIControlPlane(t *testing.T, ctx context.Context, store registry.Store) (url string, p0, d0 registry.RegisterResult) {
	t.Helper()
	mirror := replica.NewMirror(replica.MirrorConfig{}, store, zerolog.Nop())
	if err := mirror.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{AdminToken: "adm", JoinTokens: []string{"join"}},
		server.Deps{Store: store, Snaps: mirror, Registry: prometheus.NewRegistry()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	admin := registry.Claim{Admin: true}
	p0, err = store.Register(ctx, registrytest.Spec("p0", registry.RolePrefill), admin)
	if err != nil {
		t.Fatal(err)
	}
	d0, err = store.Register(ctx, registrytest.Spec("d0", registry.RoleDecode), admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []registry.Peer{p0.Peer, d0.Peer} {
		if _, err := store.Heartbeat(ctx, registry.Heartbeat{PeerID: p.ID, InstanceID: p.InstanceID}); err != nil {
			t.Fatal(err)
		}
	}
	return ts.URL, p0, d0
}

// subscriptions is a store that counts its subscriptions: the mirror's,
// then one per event stream the API serves.
type subscriptions struct {
	registry.Store
	n atomic.Int32
}

func (s *subscriptions) Subscribe(ctx context.Context) <-chan registry.Change {
	s.n.Add(1)
	return s.Store.Subscribe(ctx)
}

// TestCLIAgainstControlPlane runs peers, pairs and events against an
// in-process control plane: peers by name and by id, -o json and yaml that
// parse back into the API's types, the event stream.
func TestCLIAgainstControlPlane(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := &subscriptions{Store: memstore.New(memstore.Config{})}
	url, pf, d := startCLIControlPlane(t, ctx, store)
	for _, k := range []string{"PDPLANE_ADMIN_TOKEN", "PDPLANE_TOKEN", "PDPLANE_SERVER", "PDPLANE_OUTPUT", "PDPLANE_ROLE", "PDPLANE_STATE", "PDPLANE_MODEL", "PDPLANE_PEER", "PDPLANE_LIMIT", "PDPLANE_FOLLOW", "PDPLANE_FULL"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("PDPLANE_CONTROL_PLANE", url)

	peers := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := peersGroup(&out).run(ctx, args)
		return out.String(), err
	}
	events := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := eventsCmd(ctx, args, &out)
		return out.String(), err
	}
	mustParse := func(what, out string, v any, unmarshal func([]byte, any) error) {
		t.Helper()
		if err := unmarshal([]byte(out), v); err != nil {
			t.Fatalf("%s does not parse back: %v\n%s", what, err, out)
		}
	}
	yamlUnmarshal := func(b []byte, v any) error { return yaml.Unmarshal(b, v) }

	// list: table, json, yaml, a filter.
	out, err := peers("list")
	if err != nil || !strings.Contains(out, "NAME") || !strings.Contains(out, "p0") || !strings.Contains(out, d.Peer.ID) {
		t.Fatalf("peers list: %v\n%s", err, out)
	}
	var list api.PeerList
	out, err = peers("list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("peers list -o json", out, &list, json.Unmarshal)
	if len(list.Peers) != 2 {
		t.Fatalf("peers list -o json: %d peers", len(list.Peers))
	}
	list = api.PeerList{}
	out, err = peers("list", "--output=yaml", "--role", "decode")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("peers list -o yaml", out, &list, yamlUnmarshal)
	if len(list.Peers) != 1 || list.Peers[0].Name != "d0" || list.Peers[0].Id != d.Peer.ID {
		t.Fatalf("peers list --role decode -o yaml: %+v", list.Peers)
	}

	// show: by name and by id, each form.
	var p api.PeerSummary
	out, err = peers("show", "d0", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("peers show d0 -o json", out, &p, json.Unmarshal)
	if p.Id != d.Peer.ID || p.Name != "d0" || p.State != api.StateReady {
		t.Fatalf("peers show d0: %+v", p)
	}
	p = api.PeerSummary{}
	out, err = peers("show", "-o", "yaml", pf.Peer.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustParse("peers show ID -o yaml", out, &p, yamlUnmarshal)
	if p.Name != "p0" {
		t.Fatalf("peers show by id: %+v", p)
	}
	if out, err := peers("show", "d0"); err != nil || !strings.Contains(out, "name:") || !strings.Contains(out, d.Peer.ID) || !strings.Contains(out, "ready") {
		t.Fatalf("peers show d0 as a table: %v\n%s", err, out)
	}
	if _, err := peers("show", "nope"); err == nil || !strings.Contains(err.Error(), `no peer named "nope"`) {
		t.Fatalf("peers show nope: %v", err)
	}
	if _, err := peers("show", "d0", "--full"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("peers show --full without the admin token: %v", err)
	}
	var reg api.PeerRegistration
	out, err = peers("show", "d0", "--full", "--admin-token", "adm")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("peers show --full (yaml by default)", out, &reg, yamlUnmarshal)
	if reg.Name != "d0" {
		t.Fatalf("peers show --full: %+v", reg)
	}

	// events: the page, by peer name, in each form.
	var evs api.EventList
	out, err = events("--peer", "d0", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("events -o json", out, &evs, json.Unmarshal)
	if len(evs.Events) == 0 {
		t.Fatal("events --peer d0: none")
	}
	for _, e := range evs.Events {
		if e.PeerId != d.Peer.ID {
			t.Fatalf("events --peer d0 lists %+v", e)
		}
	}
	evs = api.EventList{}
	out, err = events("-o", "yaml", "--limit", "1")
	if err != nil {
		t.Fatal(err)
	}
	mustParse("events -o yaml", out, &evs, yamlUnmarshal)
	if len(evs.Events) != 1 {
		t.Fatalf("events --limit 1: %d", len(evs.Events))
	}
	if out, err := events(); err != nil || !strings.Contains(out, "KIND") || !strings.Contains(out, "d0") || !strings.Contains(out, "p0") {
		t.Fatalf("events: %v\n%s", err, out)
	}

	// events --follow: the page, then what happens, for one peer only.
	fctx, fcancel := context.WithCancel(ctx)
	var fout syncBuffer
	done := make(chan error, 1)
	go func() { done <- eventsCmd(fctx, []string{"--follow", "--peer", "p0", "-o", "json"}, &fout) }()
	waitFor := func(what string, cond func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(fout.String()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s; output so far:\n%s", what, fout.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("events --follow prints the page", func(s string) bool { return strings.Count(s, "\n") >= 1 })
	page := strings.Count(fout.String(), "\n")
	// The stream is open: the server has subscribed it to the store's
	// changes, so that what follows reaches it as it happens.
	simtest.WaitFor(t, "the event stream to subscribe", func() bool { return store.n.Load() == 2 })
	if out, err := peers("drain", "d0", "--admin-token", "adm"); err != nil || !strings.Contains(out, "drained d0") {
		t.Fatalf("peers drain d0: %v\n%s", err, out)
	}
	out, err = peers("stale", "p0", "--reason", "cli test", "--admin-token", "adm", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	p = api.PeerSummary{}
	mustParse("peers stale -o json", out, &p, json.Unmarshal)
	if p.Name != "p0" {
		t.Fatalf("peers stale: %+v", p)
	}
	waitFor("events --follow prints the stale mark", func(s string) bool { return strings.Contains(s, "cli test") })
	fcancel()
	if err := <-done; err != nil {
		t.Fatalf("events --follow ended with %v", err)
	}
	lines := strings.Split(strings.TrimSpace(fout.String()), "\n")
	if len(lines) <= page {
		t.Fatalf("events --follow printed nothing from the stream:\n%s", fout.String())
	}
	for _, l := range lines[page:] {
		var e api.Event
		mustParse("a followed event", l, &e, json.Unmarshal)
		if e.PeerId != pf.Peer.ID {
			t.Errorf("events --follow --peer p0 printed %+v", e)
		}
	}

	// pairs list -o json, rm by name.
	var pairs api.PairList
	var pout bytes.Buffer
	if err := pairsCmd(ctx, []string{"list", "-o", "json"}, &pout); err != nil {
		t.Fatal(err)
	}
	mustParse("pairs list -o json", pout.String(), &pairs, json.Unmarshal)
	if len(pairs.Pairs) != 1 || pairs.Pairs[0].Prefill.Name != "p0" {
		t.Fatalf("pairs list: %+v", pairs)
	}
	if out, err := peers("rm", "d0", "--admin-token", "adm"); err != nil || !strings.Contains(out, "removed d0 ("+d.Peer.ID+")") {
		t.Fatalf("peers rm d0: %v\n%s", err, out)
	}
	if _, err := peers("rm", "d0", "--admin-token", "adm"); err == nil || !strings.Contains(err.Error(), `no peer named "d0"`) {
		t.Fatalf("peers rm d0 again: %v", err)
	}
}

// TestResolvePeerAmbiguous: a name two peers share is an error that lists
// their ids.
func TestResolvePeerAmbiguous(t *testing.T) {
	t.Parallel()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.PeerList{Peers: []api.PeerSummary{
			{Id: "11111111-1111-4111-8111-111111111111", Name: "twin", Role: api.Prefill},
			{Id: "22222222-2222-4222-8222-222222222222", Name: "twin", Role: api.Decode},
		}})
	}))
	defer ts.Close()
	c, err := (&clientFlags{controlPlane: ts.URL}).client(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.resolvePeer(context.Background(), "twin")
	if err == nil || !strings.Contains(err.Error(), `2 peers are named "twin"`) ||
		!strings.Contains(err.Error(), "11111111-1111-4111-8111-111111111111 (prefill)") || !strings.Contains(err.Error(), "give the id") {
		t.Fatalf("ambiguous name: %v", err)
	}
	if p, err := c.resolvePeer(context.Background(), "22222222-2222-4222-8222-222222222222"); err != nil || p.Role != api.Decode {
		t.Fatalf("by id: %+v %v", p, err)
	}
}

// TestHelpAndExitStatus: -h works at every level and exits 0 with the usage
// on stdout; a wrong command line exits 2 with the usage or a hint on
// stderr.
func TestHelpAndExitStatus(t *testing.T) {
	t.Parallel()
	bin := pdplaneBinary(t)
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string // wanted in stdout
		stderr     string // wanted in stderr
		noStderr   bool
		stdoutNone bool
	}{
		{args: []string{"-h"}, stdout: "pdplane events", noStderr: true},
		{args: []string{"--help"}, stdout: "Usage:", noStderr: true},
		{args: []string{"help"}, stdout: "Usage:", noStderr: true},
		{args: []string{"peers", "-h"}, stdout: "pdplane peers show PEER", noStderr: true},
		{args: []string{"peers", "--help"}, stdout: "pdplane peers rm PEER", noStderr: true},
		{args: []string{"peers", "show", "-h"}, stdout: "-o, --output table|json|yaml", noStderr: true},
		{args: []string{"peers", "list", "--help"}, stdout: "--role prefill|decode|both", noStderr: true},
		{args: []string{"pairs", "-h"}, stdout: "pdplane pairs lift PREFILL DECODE", noStderr: true},
		{args: []string{"pairs", "lift", "-h"}, stdout: "$PDPLANE_ADMIN_TOKEN", noStderr: true},
		{args: []string{"events", "-h"}, stdout: "--follow", noStderr: true},
		{args: []string{"serve", "-h"}, stdout: "--lease-ttl duration", noStderr: true},
		{args: []string{"serve", "--help"}, stdout: "$PDPLANE_JOIN_TOKEN", noStderr: true},
		{args: []string{"sim", "-h"}, stdout: "--bootstrap-port int", noStderr: true},
		{args: []string{"agent", "-h"}, stdout: "--join-token", noStderr: true},
		{args: []string{"dev", "-h"}, stdout: "$PDPLANE_PREFILLS", noStderr: true},
		{args: []string{"migrate", "-h"}, stdout: "--database-url", noStderr: true},
		{args: []string{"sim", "--help"}, stdout: "--kv-pages int", noStderr: true},
		{args: []string{"bench", "-h"}, stdout: "pdplane bench compare", noStderr: true},
		{args: []string{"bench", "compare", "-h"}, stdout: "--held-streams string", noStderr: true},
		{args: []string{"bench", "compare", "--held-streams", "100,0"}, code: 2, stderr: `invalid value "100,0" for --held-streams`, stdoutNone: true},
		{args: []string{"bench"}, code: 2, stderr: "bench: a verb is required", stdoutNone: true},
		{args: []string{"bench", "bogus"}, code: 2, stderr: `bench: unknown verb "bogus"`, stdoutNone: true},
		{args: []string{"bench", "compare", "--concurrency", "32,0"}, code: 2, stderr: `invalid value "32,0" for --concurrency`, stdoutNone: true},
		{args: []string{"bench", "compare", "--peers", "bogus"}, code: 2, stderr: `invalid value "bogus" for --peers`, stdoutNone: true},
		{args: []string{"bench", "compare", "--peers", "baseline"}, code: 2, stderr: "--peers baseline needs --baseline", stdoutNone: true},
		{args: []string{"bench", "compare", "--peers", "baseline", "--baseline", "/nonexistent/pdplane"}, code: 1, stderr: "baseline: stat /nonexistent/pdplane", stdoutNone: true},
		{args: []string{"bench", "compare", "--baseline", "/nonexistent/pdplane"}, code: 2, stderr: "--baseline is measured only with --peers baseline", stdoutNone: true},
		{args: []string{"bench", "compare", "--peers", "smg", "--smg", "/nonexistent/smg", "--require"}, code: 1, stderr: "smg: executable not found", stdoutNone: true},
		{args: []string{"bench", "floor", "-h"}, stdout: "--bootstrap-port int", noStderr: true},
		{args: []string{"bench", "-h"}, stdout: "pdplane bench routing", noStderr: true},
		{args: []string{"bench", "routing", "-h"}, stdout: "--workload prefix-heavy|no-shared|both", noStderr: true},
		{args: []string{"bench", "routing", "--peers", "bogus"}, code: 2, stderr: `invalid value "bogus" for --peers`, stdoutNone: true},
		{args: []string{"bench", "routing", "--load", "0"}, code: 2, stderr: `invalid value "0" for --load`, stdoutNone: true},
		{args: []string{"bench", "routing", "--peers", "smg", "--smg", "/nonexistent/smg", "--require"}, code: 1, stderr: "smg: executable not found", stdoutNone: true},
		{args: []string{"bench", "floor", "--prefill", "127.0.0.1:1", "--decode", "http://127.0.0.1:2"}, code: 2, stderr: `invalid value "127.0.0.1:1" for --prefill`, stdoutNone: true},
		{args: []string{"bench", "floor", "--prefill", "http://127.0.0.1:1"}, code: 2, stderr: `invalid value "" for --decode`, stdoutNone: true},
		{args: []string{}, code: 2, stderr: "Usage:", stdoutNone: true},
		{args: []string{"bogus"}, code: 2, stderr: `unknown command "bogus"`, stdoutNone: true},
		{args: []string{"peers"}, code: 2, stderr: "a verb is required", stdoutNone: true},
		{args: []string{"peers", "bogus"}, code: 2, stderr: "pdplane peers list", stdoutNone: true},
		{args: []string{"pairs", "bogus"}, code: 2, stderr: `pairs: unknown verb "bogus"`, stdoutNone: true},
		{args: []string{"peers", "show", "--bogus"}, code: 2, stderr: "unknown flag -bogus (see 'pdplane peers show -h')", stdoutNone: true},
		{args: []string{"serve", "--lease-ttl", "10"}, code: 2, stderr: `invalid value "10" for --lease-ttl: want a duration such as 10s, 1m30s`, stdoutNone: true},
		{args: []string{"peers", "show", "d0", "--control-plane", "http://127.0.0.1:1"}, code: 1, stderr: "connection refused", stdoutNone: true},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		name := "pdplane " + strings.Join(tc.args, " ")
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d; stderr %q", name, code, tc.code, stderr.String())
		}
		if !strings.Contains(stdout.String(), tc.stdout) {
			t.Errorf("%s: stdout lacks %q:\n%s", name, tc.stdout, stdout.String())
		}
		if !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%s: stderr lacks %q:\n%s", name, tc.stderr, stderr.String())
		}
		if tc.noStderr && stderr.Len() > 0 {
			t.Errorf("%s: stderr %q", name, stderr.String())
		}
		if tc.stdoutNone && stdout.Len() > 0 {
			t.Errorf("%s: stdout %q", name, stdout.String())
		}
	}
}
