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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/sim"
)

// The heal test (issue 13) runs the real binary: `pdplane serve`, three
// standalone SGLang sims (one prefill, two decodes) that move KV between
// themselves with a shared transfer secret, as stock SGLang engines do, and
// one `pdplane agent --engine sglang` per sim. The victim decode's agent has
// `--heal exec:SCRIPT`; the script restarts the victim's sim process on the
// same address, the way an operator's restart script restarts an engine.
const (
	healHeartbeat = 300 * time.Millisecond
	healLease     = 3 * time.Second
	healDrain     = 3 * time.Second
	// The decodes' time per token: each streamed answer (8 to 20 tokens)
	// lasts a while on the victim (0.5 to 1.2 s, less than the drain
	// grace), so that requests are in flight on it when it goes stale, and
	// a stream's pace tells which decode served it (the router does not
	// say).
	healVictimToken   = 60 * time.Millisecond
	healSurvivorToken = 15 * time.Millisecond
	// healEngineStart is how long the restarted engine takes to answer
	// again (a real one loads its model): the stock-SGLang agent tells a new
	// instance by /health failing and then passing (SGLang publishes no
	// start time without --enable-metrics), and it looks once a heartbeat.
	healEngineStart = 5 * healHeartbeat
	healSecret      = "heal-e2e-transfer-secret-0123456789"
	// healRoomTimeout is the engines' transfer timeout (see simArgs).
	healRoomTimeout = 5 * time.Second
)

// healFleet is serve, the sims and their agents.
type healFleet struct {
	base             string
	victim, survivor string   // decode sim addresses
	prefills         []string // prefill sim addresses
	bootstrapPorts   []int    // the prefills' SGLang bootstrap ports
	victimID         string   // the victim decode's peer ID
	dir              string   // the heal script's files
	runs, pidFile    string
}

// healOpts shapes a heal fleet: verify is --heal-verify-timeout; restart
// says whether the victim's heal script restarts its sim (or only records
// that it ran); prefills is how many prefill sims run (at least one); hold
// is --heal-hold (zero: the default).
type healOpts struct {
	verify   time.Duration
	restart  bool
	prefills int
	hold     time.Duration
}

// healPeer is what the test reads of a peer.
type healPeer struct {
	ID            string     `json:"id"`
	Name          string     `json:"name"`
	State         string     `json:"state"`
	StateReason   string     `json:"state_reason"`
	Generation    int64      `json:"generation"`
	InstanceID    string     `json:"instance_id"`
	LastHeartbeat *time.Time `json:"last_heartbeat"`
	// Heal is the peer's heal plan; nil when none runs.
	Heal *struct {
		Phase string   `json:"phase"`
		Pairs []string `json:"pairs"`
	} `json:"heal"`
}

type healEvent struct {
	ID         int64     `json:"id"`
	Kind       string    `json:"kind"`
	Generation int64     `json:"generation"`
	Message    string    `json:"message"`
	Error      string    `json:"error"`
	At         time.Time `json:"at"`
}

// startHealFleet starts a fleet of one prefill and two decodes.
func startHealFleet(t *testing.T, dbURL string, verify time.Duration, restart bool) *healFleet {
	t.Helper()
	return startHealFleetWith(t, dbURL, healOpts{verify: verify, restart: restart, prefills: 1})
}

// startHealFleetWith starts the fleet that o describes.
func startHealFleetWith(t *testing.T, dbURL string, o healOpts) *healFleet {
	t.Helper()
	verify, restart := o.verify, o.restart
	bin := pdplaneBinary(t)
	// Under /tmp, not t.TempDir(): the restarted sim writes its log here
	// and may still be writing when the test's folders are removed.
	dir, err := os.MkdirTemp("", "pdplane-heal-")
	if err != nil {
		t.Fatal(err)
	}
	f := &healFleet{dir: dir, runs: filepath.Join(dir, "runs"), pidFile: filepath.Join(dir, "victim.pid")}
	firstPid := 0
	t.Cleanup(func() {
		// The restarted sim is the script's child, not the test's: end it
		// (the first one is the test's, ended by startProcess).
		if data, err := os.ReadFile(f.pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 && pid != firstPid {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			if data, err := os.ReadFile(filepath.Join(dir, "restarted.log")); err == nil {
				t.Logf("--- restarted victim sim ---\n%s", tailOf(data, 4000))
			}
		}
		os.RemoveAll(dir)
	})

	addr := bench.FreeAddr(t)
	f.base = "http://" + addr
	serveArgs := []string{"serve", "--addr", addr, "--join-token", "peer-tok", "--admin-token", "admin-tok",
		"--heartbeat-interval", healHeartbeat.String(), "--lease-ttl", healLease.String(),
		"--heal-drain-grace", healDrain.String(), "--heal-verify-timeout", verify.String(),
		// Round robin sends every other request to the victim: one reaches
		// it soon after its fault, while others still stream from it.
		"--decode-policy", "round_robin"}
	if o.hold > 0 {
		serveArgs = append(serveArgs, "--heal-hold", o.hold.String())
	}
	if dbURL != "" {
		serveArgs = append(serveArgs, "--database-url", dbURL)
	}
	startProcess(t, "serve", serveArgs...)
	waitHTTP(t, f.base+"/healthz", 30*time.Second)

	f.victim, f.survivor = bench.FreeAddr(t), bench.FreeAddr(t)
	// The engines give up on a transfer (--room-timeout) well inside the
	// clients' 20 s: a request in flight on the victim when its fault
	// starts may lose its room (its KV never comes, as on a NIXL decode),
	// and it must fail in time for the router to send it elsewhere.
	simArgs := func(role, name, addr string, perToken time.Duration) []string {
		return []string{"sim", "--role", role, "--engine", "sglang", "--name", name, "--sim-addr", addr,
			"--transfer-secret", healSecret, "--decode-time-per-token", perToken.String(), "--room-timeout", healRoomTimeout.String()}
	}
	engines := []struct{ name, addr, heal string }{}
	for i := 0; i < o.prefills; i++ {
		name, addr := fmt.Sprintf("prefill-%d", i), bench.FreeAddr(t)
		_, port, _ := strings.Cut(bench.FreeAddr(t), ":")
		bp, _ := strconv.Atoi(port)
		f.prefills, f.bootstrapPorts = append(f.prefills, addr), append(f.bootstrapPorts, bp)
		startProcess(t, "sim-"+name, append(simArgs("prefill", name, addr, 0), "--bootstrap-port", port)...)
		engines = append(engines, struct{ name, addr, heal string }{name, addr, "none"})
	}
	victim := startProcess(t, "sim-victim", simArgs("decode", "decode-victim", f.victim, healVictimToken)...)
	startProcess(t, "sim-survivor", simArgs("decode", "decode-survivor", f.survivor, healSurvivorToken)...)
	firstPid = victim.cmd.Process.Pid
	if err := os.WriteFile(f.pidFile, []byte(strconv.Itoa(firstPid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The heal action: record the run (with its time), then, for a real
	// heal, kill the victim's engine and start a new one on its address.
	var script strings.Builder
	fmt.Fprintf(&script, "#!/bin/sh\nset -e\necho \"$(date +%%s.%%N) $PDPLANE_PEER_NAME generation $PDPLANE_GENERATION\" >> %s\n", f.runs)
	if restart {
		restartArgs := simArgs("decode", "decode-victim", f.victim, healVictimToken)
		fmt.Fprintf(&script, "kill -9 \"$(cat %s)\"\n", f.pidFile)
		fmt.Fprintf(&script, "sleep %g\n", healEngineStart.Seconds())
		fmt.Fprintf(&script, "unset PDPLANE_PEER_ID PDPLANE_PEER_NAME PDPLANE_GENERATION PDPLANE_HEAL_REASON\n")
		fmt.Fprintf(&script, "%s %s </dev/null >>%s 2>&1 &\n", bin, strings.Join(restartArgs, " "), filepath.Join(dir, "restarted.log"))
		fmt.Fprintf(&script, "echo $! > %s\n", f.pidFile)
	}
	script.WriteString("exit 0\n")
	scriptPath := filepath.Join(dir, "heal.sh")
	if err := os.WriteFile(scriptPath, []byte(script.String()), 0o755); err != nil {
		t.Fatal(err)
	}

	engines = append(engines, struct{ name, addr, heal string }{"decode-victim", f.victim, "exec:" + scriptPath},
		struct{ name, addr, heal string }{"decode-survivor", f.survivor, "none"})
	for _, s := range engines {
		waitHTTP(t, "http://"+s.addr+"/health", 30*time.Second)
		startProcess(t, "agent-"+s.name, "agent", "--engine", "sglang", "--engine-url", "http://"+s.addr,
			"--control-plane", f.base, "--join-token", "peer-tok", "--name", s.name, "--heal", s.heal)
	}
	waitFor(t, "every peer ready", 30*time.Second, func() bool {
		peers, err := healPeers(f.base)
		if err != nil || len(peers) != len(engines) {
			return false
		}
		for _, p := range peers {
			if p.State != "ready" {
				return false
			}
			if p.Name == "decode-victim" {
				f.victimID = p.ID
			}
		}
		return true
	})
	// The API reads the store; the router routes from its snapshot, which
	// follows the store (on PostgreSQL through NOTIFY) a moment later.
	waitHTTP(t, f.base+"/readyz", 30*time.Second)
	return f
}

func tailOf(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitFor polls cond until it holds; past within the test fails.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func healPeers(base string) ([]healPeer, error) {
	var out struct {
		Peers []healPeer `json:"peers"`
	}
	return out.Peers, adminGet(base+"/api/v1/peers", &out)
}

func (f *healFleet) peer(t *testing.T) healPeer {
	t.Helper()
	var p healPeer
	if err := adminGet(f.base+"/api/v1/peers/"+f.victimID, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// events returns the victim's events, oldest first.
func (f *healFleet) events(t *testing.T) []healEvent {
	t.Helper()
	var out struct {
		Events []healEvent `json:"events"`
	}
	if err := adminGet(f.base+"/api/v1/events?limit=1000&peer_id="+f.victimID, &out); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out.Events, func(a, b healEvent) int { return int(a.ID - b.ID) })
	return out.Events
}

func adminGet(url string, v any) error {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, data)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// actionRuns reads the heal script's record: one line a run.
func (f *healFleet) actionRuns(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(f.runs)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// firstRunAt is when the first of runs (the heal script's record, one
// line a run, each starting with the Unix time in seconds) began, by the
// script's clock; zero when there is none or it cannot be read.
func firstRunAt(runs []string) time.Time {
	if len(runs) == 0 {
		return time.Time{}
	}
	sec, err := strconv.ParseFloat(strings.Fields(runs[0])[0], 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, int64(sec*1e9))
}

func simStats(addr string) (sim.Stats, error) {
	var s sim.Stats
	resp, err := http.Get("http://" + addr + "/_sim/stats")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /_sim/stats: %d", resp.StatusCode)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

func mustSimStats(t *testing.T, addr string) sim.Stats {
	t.Helper()
	s, err := simStats(addr)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func setFault(t *testing.T, addr string, fault sim.Fault) {
	t.Helper()
	setPairFault(t, addr, fault, 0)
}

// setPairFault sets fault on the sim at addr, limited to the pair with the
// prefill whose bootstrap port is bootstrapPort (zero: every pair).
func setPairFault(t *testing.T, addr string, fault sim.Fault, bootstrapPort int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"fault": fault, "bootstrap_port": bootstrapPort})
	resp, err := http.Post("http://"+addr+"/_sim/fault", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /_sim/fault %s: %d %s", fault, resp.StatusCode, data)
	}
}

// waitHeartbeats waits until the victim's agent has heartbeat n more times
// (its last heartbeat moved on n times), so that the heal plan has seen
// them.
func (f *healFleet) waitHeartbeats(t *testing.T, n int) {
	t.Helper()
	var last time.Time
	seen := 0
	waitFor(t, fmt.Sprintf("%d more heartbeats of the victim", n), time.Duration(n)*healHeartbeat+10*time.Second, func() bool {
		p := f.peer(t)
		if p.LastHeartbeat != nil && p.LastHeartbeat.After(last) {
			if !last.IsZero() {
				seen++
			}
			last = *p.LastHeartbeat
		}
		return seen >= n
	})
}

// timedStream is one streamed chat completion and when its bytes came.
type timedStream struct {
	tokens                int
	start, firstByte, end time.Time
	err                   error
}

// onVictim tells a stream the victim served by its pace: 60 ms a token
// there, 15 ms on the survivor.
func (s timedStream) onVictim() bool {
	return s.err == nil && s.end.Sub(s.firstByte) > time.Duration(s.tokens)*(healVictimToken+healSurvivorToken)/2
}

// healLoad runs streamed chat completions from several clients until stop.
type healLoad struct {
	mu       sync.Mutex
	streams  []timedStream
	wg       sync.WaitGroup
	stop     chan struct{}
	stopOnce sync.Once
}

func startHealLoad(clients int, base string) *healLoad {
	l := &healLoad{stop: make(chan struct{})}
	client := &http.Client{Timeout: 20 * time.Second}
	for c := 0; c < clients; c++ {
		l.wg.Add(1)
		go func(c int) {
			defer l.wg.Done()
			// Clients of different lengths, started apart, so that streams
			// do not begin and end together.
			tokens := 8 + 4*(c%4)
			select {
			case <-l.stop:
				return
			case <-time.After(time.Duration(c) * 70 * time.Millisecond):
			}
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				s := streamTimed(client, base, fmt.Sprintf("client %d request %d", c, i), tokens)
				l.mu.Lock()
				l.streams = append(l.streams, s)
				l.mu.Unlock()
			}
		}(c)
	}
	return l
}

// streamTimed is streamOnce with the time of the first byte of the answer.
func streamTimed(client *http.Client, base, prompt string, tokens int) (s timedStream) {
	s.start, s.tokens = time.Now(), tokens
	defer func() { s.end = time.Now() }()
	body, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "stream": true, "max_tokens": tokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.err = fmt.Errorf("%d: %s", resp.StatusCode, bytes.TrimSpace(data))
		return s
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if s.firstByte.IsZero() {
			s.firstByte = time.Now()
		}
		if strings.Contains(line, `"error"`) {
			s.err = fmt.Errorf("error event: %s", line)
			return s
		}
		if line == "data: [DONE]" {
			return s
		}
	}
	s.err = fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
	return s
}

// extra sends n streams at once, besides the clients' loop, counted with
// theirs.
func (l *healLoad) extra(n int, base string) {
	client := &http.Client{Timeout: 20 * time.Second}
	for i := 0; i < n; i++ {
		l.wg.Add(1)
		go func(i int) {
			defer l.wg.Done()
			s := streamTimed(client, base, fmt.Sprintf("extra request %d", i), 8)
			l.mu.Lock()
			l.streams = append(l.streams, s)
			l.mu.Unlock()
		}(i)
	}
}

func (l *healLoad) snapshot() []timedStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.streams)
}

func (l *healLoad) close() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// waitCompleted waits until n streams that started after from completed.
func (l *healLoad) waitCompleted(t *testing.T, from time.Time, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d streams completed", n), 30*time.Second, func() bool {
		k := 0
		for _, s := range l.snapshot() {
			if !s.start.Before(from) && s.err == nil {
				k++
			}
		}
		return k >= n
	})
}

// firstEvent returns the first event of kind after index from, and its
// index; -1 when there is none.
func firstEvent(evs []healEvent, from int, kind string) (healEvent, int) {
	for i := from; i < len(evs); i++ {
		if evs[i].Kind == kind {
			return evs[i], i
		}
	}
	return healEvent{}, -1
}

func countEvents(evs []healEvent, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// wantOneEach checks that evs hold exactly one event of each of kinds.
func wantOneEach(t *testing.T, evs []healEvent, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		if n := countEvents(evs, k); n != 1 {
			t.Errorf("%d %s events; want 1", n, k)
		}
	}
}

// timelineStep is one line of a logged heal timeline: what happened, when,
// and a note (an event's message, or whose clock timed it).
type timelineStep struct {
	what string
	at   time.Time
	note string
}

// eventStep is an event's line: its kind, time and message.
func eventStep(e healEvent) timelineStep { return timelineStep{e.Kind, e.At, e.Message} }

// logTimeline logs steps in order, each at its offset from origin, under
// header (which says what origin is).
func logTimeline(t *testing.T, header string, origin time.Time, steps ...timelineStep) {
	t.Helper()
	t.Logf("%s at %s:", header, origin.Format("15:04:05.000"))
	for _, s := range steps {
		t.Logf("  %-22s %s  %s", s.what, since(origin, s.at), s.note)
	}
}

// since is at's offset from origin, to the millisecond: "+1.234s".
func since(origin, at time.Time) string {
	return "+" + at.Sub(origin).Round(time.Millisecond).String()
}

// healStores runs fn on the in-memory store and, where
// PDPLANE_TEST_DATABASE_URL names one (required under CI=true), on
// PostgreSQL. The two run one after the other: each is timed on two CPUs.
func healStores(t *testing.T, fn func(t *testing.T, dbURL string)) {
	t.Run("memstore", func(t *testing.T) { fn(t, "") })
	t.Run("pgstore", func(t *testing.T) {
		dbURL, _ := registrytest.NewSchema(t)
		fn(t, dbURL)
	})
}

// TestHealRestartsStaleDecode is issue 13's proof with real processes: a
// decode whose KV registration breaks (missing-mem-kind) under streaming
// load goes stale, drains, its agent's heal action restarts its engine once,
// and the new instance is ready at generation + 1, while no client request
// fails and the other decode keeps serving.
func TestHealRestartsStaleDecode(t *testing.T) {
	healStores(t, testHealRestartsStaleDecode)
}

func testHealRestartsStaleDecode(t *testing.T, dbURL string) {
	f := startHealFleet(t, dbURL, 20*time.Second, true)
	before := f.peer(t)

	load := startHealLoad(4, f.base)
	defer load.close()
	steady := time.Now()
	load.waitCompleted(t, steady, 20)
	// A stream in flight on the victim when its registration breaks: the
	// fault goes in as a stream has just had its KV there (its decode
	// lasts 8 tokens or more, 480 ms at the victim's pace), and two
	// requests right after it (round robin: one reaches the victim) make
	// the stale mark come at once rather than with the load's next turn.
	var last int64 = -1
	waitFor(t, "a stream starting on the victim", 10*time.Second, func() bool {
		s, err := simStats(f.victim)
		if err != nil {
			return false
		}
		fresh := last >= 0 && s.Transfers > last
		last = s.Transfers
		return fresh
	})
	faultAt := time.Now()
	setFault(t, f.victim, sim.FaultMissingMemKind)
	load.extra(2, f.base)
	survivorAtFault := mustSimStats(t, f.survivor)

	// Until the heal action runs, watch the victim's engine: requests in
	// flight on it when it went stale, and whether it drained.
	var runningAtStale int
	var staleSeen, drainedSeen time.Time
	waitFor(t, "the heal action runs", 30*time.Second, func() bool {
		if len(f.actionRuns(t)) > 0 {
			return true
		}
		p := f.peer(t)
		s, err := simStats(f.victim)
		if p.State == "stale" && err == nil {
			if staleSeen.IsZero() {
				staleSeen, runningAtStale = time.Now(), s.Running
			}
			if s.Running == 0 && drainedSeen.IsZero() {
				drainedSeen = time.Now()
			}
		}
		return false
	})
	survivorAtAction := mustSimStats(t, f.survivor)

	waitFor(t, "the victim ready at generation + 1", 30*time.Second, func() bool {
		p := f.peer(t)
		return p.State == "ready" && p.Generation == before.Generation+1
	})
	survivorAtHealed := mustSimStats(t, f.survivor)
	// The healed victim serves again.
	victimAtHealed := mustSimStats(t, f.victim)
	waitFor(t, "the healed victim moves KV again", 30*time.Second, func() bool {
		s, err := simStats(f.victim)
		return err == nil && s.Transfers > victimAtHealed.Transfers
	})
	// More heartbeats: the heal plan must not act again.
	f.waitHeartbeats(t, 10)
	load.close()
	end := time.Now()

	// 1. No client-visible failure, over the whole run.
	streams := load.snapshot()
	var failed []timedStream
	for _, s := range streams {
		if s.err != nil {
			failed = append(failed, s)
		}
	}
	t.Logf("%d streamed chat completions from %s to %s, %d failed", len(streams), steady.Format("15:04:05.000"), end.Format("15:04:05.000"), len(failed))
	for i, s := range failed {
		if i == 5 {
			t.Errorf("... and %d more", len(failed)-5)
			break
		}
		t.Errorf("stream started at +%s failed: %v", s.start.Sub(faultAt).Round(time.Millisecond), s.err)
	}

	// 2. The timeline from the victim's events.
	evs := f.events(t)
	stale, si := firstEvent(evs, 0, "stale")
	if si < 0 {
		t.Fatalf("no stale event; events %+v", evs)
	}
	started, i1 := firstEvent(evs, si, "heal_started")
	acting, i2 := firstEvent(evs, max(i1, 0), "heal_acting")
	rereg, i3 := firstEvent(evs, max(i2, 0), "reregistered")
	healed, i4 := firstEvent(evs, max(i2, 0), "healed")
	if i1 < 0 || i2 < 0 || i3 < 0 || i4 < 0 {
		t.Fatalf("heal events out of order or missing: %+v", evs)
	}
	runs := f.actionRuns(t)
	actionAt := firstRunAt(runs)
	at := func(t time.Time) string { return since(stale.At, t) }
	logTimeline(t, fmt.Sprintf("heal timeline (store %q), from the victim's events; + is after the stale mark", storeName(dbURL)), stale.At,
		timelineStep{"fault injected", faultAt, "(test clock)"},
		timelineStep{"stale", stale.At, stale.Message + " " + stale.Error},
		eventStep(started), eventStep(acting),
		timelineStep{"action ran", actionAt, "(script's clock)"},
		eventStep(rereg), eventStep(healed))
	if !strings.Contains(healed.Message, fmt.Sprintf("generation %d → %d", before.Generation, before.Generation+1)) {
		t.Errorf("healed: %q, want generation %d → %d", healed.Message, before.Generation, before.Generation+1)
	}
	after := f.peer(t)
	if after.State != "ready" || after.Generation != before.Generation+1 || after.InstanceID == before.InstanceID {
		t.Errorf("victim after the heal: %s at generation %d, instance %s; want ready at generation %d with a new instance (was %s)",
			after.State, after.Generation, after.InstanceID, before.Generation+1, before.InstanceID)
	}
	if stale.Generation != before.Generation {
		t.Errorf("stale at generation %d; want %d", stale.Generation, before.Generation)
	}
	wantOneEach(t, evs, "heal_started", "heal_acting", "reregistered", "healed", "stale")
	if n := countEvents(evs, "heal_failed"); n != 0 {
		t.Errorf("%d heal_failed events", n)
	}

	// 3. The action ran once, ten heartbeats after the heal included.
	if len(runs) != 1 {
		t.Errorf("the heal action ran %d times: %q; want once", len(runs), runs)
	}

	// 4. Requests in flight on the victim when it went stale finished.
	// A stream that had bytes before the mark cannot be retried, so if it
	// was cut its client saw the error (1); by its pace it was the
	// victim's.
	var inFlight []timedStream
	onVictim := 0
	for _, s := range streams {
		if s.onVictim() {
			onVictim++
			if s.firstByte.Before(stale.At) && s.end.After(stale.At) {
				inFlight = append(inFlight, s)
			}
		}
	}
	for _, s := range inFlight {
		t.Logf("  in flight on the victim at the stale mark: %d tokens, first byte %s, [DONE] %s", s.tokens, at(s.firstByte), at(s.end))
	}
	t.Logf("%d streams served by the victim (by their pace), %d of them streaming at the stale mark, all ended with [DONE]; "+
		"the victim's engine had %d requests in flight when the test first saw it stale (%s after the mark), "+
		"idle from %s; the action ran at %s", onVictim, len(inFlight), runningAtStale,
		staleSeen.Sub(stale.At).Round(time.Millisecond), at(drainedSeen), at(actionAt))
	if onVictim == 0 {
		t.Errorf("no stream was served at the victim's pace: the pace check is broken")
	}
	if len(inFlight) == 0 {
		t.Errorf("no stream was streaming from the victim at the stale mark: nothing in flight was tested")
	}
	// The registry's judgement, from the load the victim's agent
	// heartbeats (the test's own look at the engine, above, is sampled
	// and only logged).
	if !strings.HasPrefix(acting.Message, "drained") {
		t.Errorf("heal_acting: %q; want the victim drained before the action (requests in flight finish)", acting.Message)
	}

	// 5. The survivor kept serving while the victim was out.
	t.Logf("survivor KV transfers: %d at the fault, %d when the action ran, %d when the victim was healed",
		survivorAtFault.Transfers, survivorAtAction.Transfers, survivorAtHealed.Transfers)
	if survivorAtHealed.Transfers <= survivorAtAction.Transfers || survivorAtAction.Transfers <= survivorAtFault.Transfers {
		t.Errorf("the survivor did not keep serving during the heal: transfers %d → %d → %d",
			survivorAtFault.Transfers, survivorAtAction.Transfers, survivorAtHealed.Transfers)
	}
}

func storeName(dbURL string) string {
	if dbURL == "" {
		return "memstore"
	}
	return "pgstore"
}

// TestHealActionWithoutNewInstance: a heal action that exits 0 but never
// brings a new instance runs once; the peer is failed once the verify
// timeout is over, and more heartbeats run it no more.
func TestHealActionWithoutNewInstance(t *testing.T) {
	healStores(t, testHealActionWithoutNewInstance)
}

func testHealActionWithoutNewInstance(t *testing.T, dbURL string) {
	const verify = 4 * time.Second
	f := startHealFleet(t, dbURL, verify, false)
	before := f.peer(t)

	load := startHealLoad(2, f.base)
	defer load.close()
	steady := time.Now()
	load.waitCompleted(t, steady, 10)
	setFault(t, f.victim, sim.FaultMissingMemKind)

	waitFor(t, "the victim failed", 30*time.Second+verify, func() bool { return f.peer(t).State == "failed" })
	failedPeer := f.peer(t)
	f.waitHeartbeats(t, 10)
	load.close()

	evs := f.events(t)
	acting, ai := firstEvent(evs, 0, "heal_acting")
	hf, fi := firstEvent(evs, max(ai, 0), "heal_failed")
	if ai < 0 || fi < 0 {
		t.Fatalf("no heal_acting then heal_failed: %+v", evs)
	}
	t.Logf("heal_acting at %s, heal_failed %s later: %s", acting.At.Format("15:04:05.000"), hf.At.Sub(acting.At).Round(time.Millisecond), hf.Message)
	if d := hf.At.Sub(acting.At); d < verify {
		t.Errorf("failed %s after the action; want no sooner than --heal-verify-timeout (%s)", d, verify)
	}
	if !strings.HasPrefix(failedPeer.StateReason, "heal did not verify") {
		t.Errorf("state reason %q; want \"heal did not verify…\"", failedPeer.StateReason)
	}
	if failedPeer.Generation != before.Generation {
		t.Errorf("generation %d → %d without a new instance", before.Generation, failedPeer.Generation)
	}
	if runs := f.actionRuns(t); len(runs) != 1 {
		t.Errorf("the heal action ran %d times: %q; want once", len(runs), runs)
	}
	if p := f.peer(t); p.State != "failed" {
		t.Errorf("after ten more heartbeats the victim is %s (%s); want failed until an operator acts", p.State, p.StateReason)
	}
	for _, k := range []string{"heal_started", "heal_acting", "heal_failed"} {
		if n := countEvents(evs, k); n != 1 {
			t.Errorf("%d %s events; want 1: %+v", n, k, evs)
		}
	}
	for _, s := range load.snapshot() {
		if s.err != nil {
			t.Errorf("a client stream failed: %v", s.err)
			break
		}
	}
}
