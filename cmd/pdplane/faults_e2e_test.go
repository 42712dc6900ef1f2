//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/sim"
)

// The control-plane fault test (issue 11) runs the real binary: two `pdplane
// serve` replicas on a PostgreSQL of its own, which it stops and starts, and
// `pdplane sim` engines whose agents list both replicas. Its durations are
// the scaled by 0.3, ratios kept: heartbeats every 300 ms and a 3 s
// lease (the issue: 1 s and 10 s); PostgreSQL away for 4.5 s, one and a
// half leases, so that every lease lapses (the issue: 10 s, one lease); 9 s,
// three leases, watched after each fault (the issue: 30 s).
const (
	faultHeartbeat = 300 * time.Millisecond
	faultLease     = 3 * time.Second
	faultOutage    = 4500 * time.Millisecond
	faultWatch     = 3 * faultLease
)

var (
	binOnce   sync.Once
	binPath   string
	binErr    error
	binRemove func()
)

// pdplaneBinary builds the binary once per test process, when a test first
// needs it; TestMain removes it.
func pdplaneBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() { binPath, binRemove, binErr = bench.BuildPdplane(".") })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binRemove != nil {
		binRemove()
	}
	os.Exit(code)
}

// testPostgres is a PostgreSQL server of the test's own, started and
// stopped with scripts/pg-start.sh and scripts/pg-stop.sh.
type testPostgres struct {
	dir, url, scripts string
}

func startTestPostgres(t *testing.T) *testPostgres {
	t.Helper()
	if !havePostgresBinaries() {
		if os.Getenv("CI") == "true" {
			t.Fatal("PostgreSQL server binaries not found; under CI=true they are required")
		}
		t.Skip("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql to run this test")
	}
	scripts, err := filepath.Abs(filepath.Join("..", "..", "scripts"))
	if err != nil {
		t.Fatal(err)
	}
	// Under /tmp, not t.TempDir(): as root the server runs as user
	// postgres, which may not enter the test's private folders.
	dir, err := os.MkdirTemp("", "pdplane-faults-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pg := &testPostgres{dir: dir, scripts: scripts}
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(scripts, "pg-stop.sh"), dir).CombinedOutput(); err != nil {
			t.Logf("stop PostgreSQL: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	pg.url = pg.start(t)
	return pg
}

func havePostgresBinaries() bool {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err == nil
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) > 0 {
		return true
	}
	_, err := exec.LookPath("initdb")
	return err == nil
}

// start starts the server (initialising it the first time) and returns its
// URL; a restart keeps the data and the port.
func (pg *testPostgres) start(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(pg.scripts, "pg-start.sh"), pg.dir)
	// Below Linux's ephemeral range (32768-60999): no listener on port 0 and
	// no outgoing connection of a parallel test can take the port, before
	// the first start or between a stop and the restart on the same port.
	cmd.Env = append(os.Environ(), fmt.Sprintf("PDPLANE_TEST_PG_PORT=%d", 20000+os.Getpid()%10000))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

func (pg *testPostgres) stop(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(filepath.Join(pg.scripts, "pg-stop.sh"), pg.dir).CombinedOutput(); err != nil {
		t.Fatalf("stop PostgreSQL: %v\n%s", err, out)
	}
}

// process is a child process of the test, with its output in a file that
// the test log shows when the test fails.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	return startProcessEnv(t, name, nil, args...)
}

// startProcessEnv is startProcess with env added to the child's
// environment (after the PDPLANE_ variables are dropped).
func startProcessEnv(t *testing.T, name string, env []string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pdplaneBinary(t), args...)
	cmd.Stdout, cmd.Stderr = out, out
	// The children's configuration is their flags alone.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PDPLANE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 8000 {
				data = data[len(data)-8000:]
			}
			t.Logf("--- %s (last lines) ---\n%s", name, data)
		}
	})
	return p
}

// kill9 kills the process as a crash would and waits until it is gone.
func (p *process) kill9() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitHTTP waits until GET url answers 200.
func waitHTTP(t *testing.T, url string, within time.Duration) {
	t.Helper()
	waitHTTPStatus(t, url, http.StatusOK, within)
}

// apiPeer is what the test reads of GET /api/v1/peers.
type apiPeer struct {
	ID            string     `json:"id"`
	Name          string     `json:"name"`
	State         string     `json:"state"`
	LastHeartbeat *time.Time `json:"last_heartbeat"`
}

func listPeers(base string) ([]apiPeer, error) {
	var out struct {
		Peers []apiPeer `json:"peers"`
	}
	return out.Peers, replicaJSON(base, "/api/v1/peers", &out)
}

// replicaJSON GETs path from the replica at base and decodes its 200 answer
// into v.
func replicaJSON(base, path string, v any) error {
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		return err
	}
	return fetchJSON(req, v)
}

// expiries counts lease expiries in the event log.
func expiries(t *testing.T, base string) int {
	t.Helper()
	var out struct {
		Events []struct {
			Kind string `json:"kind"`
		} `json:"events"`
	}
	if err := replicaJSON(base, "/api/v1/events?limit=1000", &out); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range out.Events {
		if e.Kind == "expired" {
			n++
		}
	}
	return n
}

// outcome is one client request of the streaming load.
type outcome struct {
	start, end time.Time
	target     string
	err        error
}

// streamingLoad sends streaming chat completions from several clients, each
// round-robin over the targets the test sets, until stop.
type streamingLoad struct {
	mu       sync.Mutex
	targets  []string
	outcomes []outcome
	wg       sync.WaitGroup
	stop     chan struct{}
}

func startStreamingLoad(clients int, targets []string) *streamingLoad {
	l := &streamingLoad{targets: targets, stop: make(chan struct{})}
	client := &http.Client{Timeout: 20 * time.Second}
	for c := 0; c < clients; c++ {
		l.wg.Add(1)
		go func(c int) {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				l.mu.Lock()
				target := l.targets[(c+i)%len(l.targets)]
				l.mu.Unlock()
				o := outcome{start: time.Now(), target: target}
				o.err = streamOnce(client, target, fmt.Sprintf("client %d request %d", c, i))
				o.end = time.Now()
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
			}
		}(c)
	}
	return l
}

func streamOnce(client *http.Client, base, prompt string) error {
	body, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "stream": true, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"error"`) {
			return fmt.Errorf("error event: %s", line)
		}
		if line == "data: [DONE]" {
			return nil
		}
	}
	return fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

func (l *streamingLoad) setTargets(targets ...string) {
	l.mu.Lock()
	l.targets = targets
	l.mu.Unlock()
}

// between returns the requests started in [from, to) and their failures.
// A request started before from, to a replica killed at from, is not
// counted.
func (l *streamingLoad) between(from, to time.Time) (all int, failed []outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range l.outcomes {
		if !o.start.Before(from) && o.start.Before(to) {
			all++
			if o.err != nil {
				failed = append(failed, o)
			}
		}
	}
	return all, failed
}

func (l *streamingLoad) close() {
	close(l.stop)
	l.wg.Wait()
}

func checkNoFailures(t *testing.T, what string, l *streamingLoad, from, to time.Time) {
	t.Helper()
	all, failed := l.between(from, to)
	t.Logf("%s: %d streaming requests, %d failed", what, all, len(failed))
	if all == 0 {
		t.Errorf("%s: no request completed; the load did not run", what)
	}
	for i, o := range failed {
		if i == 5 {
			t.Errorf("... and %d more", len(failed)-5)
			break
		}
		t.Errorf("%s: request to %s at +%s failed: %v", what, o.target, o.start.Sub(from), o.err)
	}
}

// TestControlPlaneFaults is issue 11's proof. (a) PostgreSQL stops under
// streaming load for longer than a lease and starts again: routing carries
// on from the snapshots, no peer is marked failed and no client request
// fails. (b) One replica is killed with SIGKILL while agents list both:
// the agents heartbeat through the survivor within a heartbeat interval,
// no peer is marked failed, and clients that moved to the survivor see no
// error.
func TestControlPlaneFaults(t *testing.T) {
	t.Parallel()
	pg := startTestPostgres(t)
	pdplaneBinary(t)

	var urls []string
	var replicas []*process
	for i := 0; i < 2; i++ {
		addr := bench.FreeAddr(t)
		replicas = append(replicas, startProcess(t, fmt.Sprintf("serve-%d", i), "serve", "--addr", addr,
			"--database-url", pg.url, "--peer-token", "peer-tok", "--admin-token", "admin-tok",
			"--heartbeat-interval", faultHeartbeat.String(), "--lease-ttl", faultLease.String()))
		urls = append(urls, "http://"+addr)
	}
	for _, u := range urls {
		waitHTTP(t, u+"/healthz", 30*time.Second)
	}
	controlPlanes := strings.Join(urls, ",")
	for _, role := range []string{"prefill", "decode"} {
		for i := 0; i < 2; i++ {
			name := fmt.Sprintf("%s-%d", role, i)
			startProcess(t, name, "sim", "--role", role, "--name", name, "--control-plane", controlPlanes, "--token", "peer-tok")
		}
	}
	for _, u := range urls {
		waitHTTP(t, u+"/readyz", 30*time.Second)
	}
	peers, err := listPeers(urls[1])
	if err != nil || len(peers) != 4 {
		t.Fatalf("peers before the faults: %v %v", peers, err)
	}

	load := startStreamingLoad(4, urls)
	defer load.close()
	steady := time.Now()
	waitLoad(t, load, steady, 20)

	// (a) PostgreSQL away for longer than a lease.
	down := time.Now()
	pg.stop(t)
	<-time.After(faultOutage) // the outage itself, not a wait for a condition
	checkNoFailures(t, "(a) while PostgreSQL was stopped", load, down, time.Now())
	pg.start(t)
	up := time.Now()
	t.Logf("(a) PostgreSQL was stopped for %s", up.Sub(down).Round(time.Millisecond))
	waitHTTPStatus(t, urls[1]+"/api/v1/peers", http.StatusOK, faultLease)
	t.Logf("(a) the API answered again %s after PostgreSQL started", time.Since(up).Round(time.Millisecond))
	<-time.After(faultWatch - time.Since(up))
	checkNoFailures(t, "(a) after PostgreSQL came back", load, up, time.Now())
	if n := expiries(t, urls[1]); n != 0 {
		t.Errorf("(a) %d leases expired over a PostgreSQL outage; want 0", n)
	}
	assertAllReady(t, "(a)", urls[1], 4)

	// (b) The replica every agent uses (the first listed) is killed.
	waitAgentsOn(t, urls[0], urls[1])
	// Clients move to the survivor first: what is under test is that the
	// survivor never answers 503 because it expired the fleet, not that a
	// client's request to a dead process fails.
	load.setTargets(urls[1])
	killed := time.Now()
	replicas[0].kill9()
	took := waitHeartbeatsAfter(t, urls[1], killed, 4)
	t.Logf("(b) every agent heartbeat through the survivor %s after the kill (interval %s)", took.Round(time.Millisecond), faultHeartbeat)
	if took > faultHeartbeat+400*time.Millisecond { // the interval, and the heartbeat's own way on a loaded machine
		t.Errorf("(b) agents reached the survivor %s after the kill; want within one heartbeat interval (%s)", took, faultHeartbeat)
	}
	<-time.After(faultWatch - time.Since(killed))
	checkNoFailures(t, "(b) on the survivor after the kill", load, killed, time.Now())
	if n := expiries(t, urls[1]); n != 0 {
		t.Errorf("(b) %d leases expired after a replica was killed; want 0", n)
	}
	assertAllReady(t, "(b)", urls[1], 4)
}

// heartbeatsAnswered reads how many heartbeats the replica at base has
// answered, from its /metrics.
func heartbeatsAnswered(t *testing.T, base string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var v float64
		if line := sc.Text(); strings.HasPrefix(line, "pdplane_heartbeats_total{") {
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// waitAgentsOn waits until every agent heartbeats through the replica at
// preferred and none through other: over two heartbeat intervals, the
// first answered one heartbeat per peer or more and the other none.
func waitAgentsOn(t *testing.T, preferred, other string) {
	t.Helper()
	deadline := time.Now().Add(2 * faultLease)
	for {
		p0, o0 := heartbeatsAnswered(t, preferred), heartbeatsAnswered(t, other)
		<-time.After(2 * faultHeartbeat) // a window to count heartbeats in
		p1, o1 := heartbeatsAnswered(t, preferred), heartbeatsAnswered(t, other)
		if p1-p0 >= 4 && o1 == o0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents never all heartbeat through %s: %v there and %v through %s in the last window", preferred, p1-p0, o1-o0, other)
		}
	}
}

// waitLoad waits until n requests started after from have completed.
func waitLoad(t *testing.T, l *streamingLoad, from time.Time, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		all, failed := l.between(from, time.Now())
		if len(failed) > 0 {
			t.Fatalf("steady load failed: %v", failed[0].err)
		}
		if all >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests in 20 s of steady load", all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitHTTPStatus(t *testing.T, url string, status int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == status {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer %d within %s (last: %v)", url, status, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitHeartbeatsAfter waits until all n peers heartbeat after since, as the
// replica at base records it, and returns the latest first heartbeat after
// since, measured from since.
func waitHeartbeatsAfter(t *testing.T, base string, since time.Time, n int) time.Duration {
	t.Helper()
	first := map[string]time.Time{}
	deadline := time.Now().Add(2 * faultLease)
	for len(first) < n {
		peers, err := listPeers(base)
		if err == nil {
			for _, p := range peers {
				if _, ok := first[p.ID]; !ok && p.LastHeartbeat != nil && p.LastHeartbeat.After(since) {
					first[p.ID] = *p.LastHeartbeat
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d peers heartbeat through %s after the kill", len(first), n, base)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var latest time.Duration
	for _, at := range first {
		latest = max(latest, at.Sub(since))
	}
	return latest
}

func assertAllReady(t *testing.T, what, base string, n int) {
	t.Helper()
	peers, err := listPeers(base)
	if err != nil {
		t.Fatalf("%s list peers: %v", what, err)
	}
	ready := 0
	for _, p := range peers {
		if p.State == "ready" {
			ready++
		} else {
			t.Errorf("%s peer %s is %s", what, p.Name, p.State)
		}
	}
	if ready != n {
		t.Errorf("%s %d of %d peers ready", what, ready, n)
	}
}
