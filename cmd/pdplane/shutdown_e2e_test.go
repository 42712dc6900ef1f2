//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/sim"
)

// The shutdown tests (issue 14, item 5) run the real binary: `pdplane serve`
// on its embedded store with a prefill and a decode `pdplane sim`, whose
// decode takes shutdownTokenTime per token so that a streamed completion
// is still in flight when serve gets SIGTERM, and slow enough that the
// router takes its connection over from net/http (router/takeover.go).
const shutdownTokenTime = 150 * time.Millisecond

// shutdownFleet starts serve with --shutdown-grace grace and a routable
// pair, and returns serve's process and base URL.
func shutdownFleet(t *testing.T, grace time.Duration) (*process, string) {
	t.Helper()
	addr := bench.FreeAddr(t)
	base := "http://" + addr
	serve := startProcess(t, "serve", "serve", "--addr", addr, "--shutdown-grace", grace.String())
	waitHTTP(t, base+"/healthz", 30*time.Second)
	startProcess(t, "prefill", "sim", "--role", "prefill", "--name", "p0", "--control-plane", base)
	startProcess(t, "decode", "sim", "--role", "decode", "--name", "d0", "--control-plane", base,
		"--decode-time-per-token", shutdownTokenTime.String())
	waitHTTP(t, base+"/readyz", 30*time.Second)
	return serve, base
}

// sseStream is a streamed response read to its end in the background.
type sseStream struct {
	firstLine chan struct{} // closed when the first line came
	done      chan struct{} // closed at EOF or error
	ended     time.Time
	lines     []string
	err       error
}

// openSSE sends req and reads the answer's lines until it ends.
func openSSE(t *testing.T, req *http.Request) *sseStream {
	t.Helper()
	// Its own transport: the stream may not share a connection.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, data)
	}
	s := &sseStream{firstLine: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { resp.Body.Close() })
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if len(s.lines) == 0 {
				close(s.firstLine)
			}
			s.lines = append(s.lines, sc.Text())
		}
		s.ended, s.err = time.Now(), sc.Err()
		if len(s.lines) == 0 {
			close(s.firstLine)
		}
	}()
	return s
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}, within time.Duration) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("%s: not within %s", what, within)
	}
}

// startCompletion starts a streamed chat completion of tokens tokens and
// waits until its first chunk arrived: it is in flight.
func startCompletion(t *testing.T, base string, tokens int) *sseStream {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": sim.DefaultModel, "stream": true, "max_tokens": tokens,
		"messages": []map[string]string{{"role": "user", "content": "say something long"}}})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	s := openSSE(t, req)
	waitClosed(t, "the completion's first chunk", s.firstLine, 30*time.Second)
	return s
}

// openEventStream opens the status page's event stream and waits for its
// greeting.
func openEventStream(t *testing.T, base string) *sseStream {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/events/stream", nil)
	req.Header.Set("Accept", "text/event-stream")
	s := openSSE(t, req)
	waitClosed(t, "the event stream's greeting", s.firstLine, 10*time.Second)
	return s
}

// sawDone reports whether a completion stream ended with its [DONE].
func (s *sseStream) sawDone() bool {
	for _, l := range s.lines {
		if l == "data: [DONE]" {
			return true
		}
	}
	return false
}

// waitReadyz503 polls /readyz on fresh connections until it answers 503,
// failing if the server stops answering first; it returns when.
func waitReadyz503(t *testing.T, p *process, base string, within time.Duration) time.Time {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(within)
	for {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("/readyz stopped answering before it said 503: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			return time.Now()
		}
		select {
		case <-p.done:
			t.Fatal("serve exited before /readyz said 503")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %s after the signal", resp.StatusCode, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exitCode waits for the process and returns its exit status.
func exitCode(t *testing.T, p *process, within time.Duration) int {
	t.Helper()
	waitClosed(t, p.name+" to exit", p.done, within)
	return p.cmd.ProcessState.ExitCode()
}

func assertRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after serve exited", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s after exit: %v, want connection refused", addr, err)
	}
}

func processLog(t *testing.T, p *process) string {
	t.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestShutdownDrainsInFlight: at SIGTERM serve turns /readyz 503 at once,
// ends the status page's event stream at once, lets the streamed
// completion in flight finish with its [DONE], and exits 0 well within
// the grace; afterwards nothing listens.
func TestShutdownDrainsInFlight(t *testing.T) {
	t.Parallel()
	const grace = 30 * time.Second
	serve, base := shutdownFleet(t, grace)
	checkDrain(t, serve, base, grace)
	if log := processLog(t, serve); !strings.Contains(log, `"message":"shut down"`) {
		t.Errorf("serve's log does not say it shut down:\n%s", log)
	}
}

// TestShutdownDevDrainsInFlight: `dev` drains as serve does, and its sims
// close only after the completion they stream has finished.
func TestShutdownDevDrainsInFlight(t *testing.T) {
	t.Parallel()
	const grace = 30 * time.Second
	addr := bench.FreeAddr(t)
	base := "http://" + addr
	dev := startProcess(t, "dev", "dev", "--addr", addr, "--shutdown-grace", grace.String(),
		"--decode-time-per-token", shutdownTokenTime.String())
	waitOutput(t, dev, regexp.MustCompile(`Try: curl`), 30*time.Second)
	waitHTTP(t, base+"/readyz", 30*time.Second)
	checkDrain(t, dev, base, grace)
	if log := processLog(t, dev); strings.Count(log, "sim closed") != 2 || !strings.Contains(log, "shut down") {
		t.Errorf("dev's log does not say it shut down and closed both sims:\n%s", log)
	}
}

// checkDrain opens an event stream and a streamed completion of about 4.5 s
// on the control plane at base, sends p SIGTERM, and checks the drain:
// /readyz 503 before exit, the event stream ended at once, the completion
// finished with [DONE], exit 0 within the grace, and nothing listening
// after. It logs the times.
func checkDrain(t *testing.T, p *process, base string, grace time.Duration) {
	t.Helper()
	events := openEventStream(t, base)
	const tokens = 30 // 4.5 s at 150 ms a token
	completion := startCompletion(t, base, tokens)

	signalled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	notReady := waitReadyz503(t, p, base, 2*time.Second)
	select {
	case <-completion.done:
		t.Fatal("the completion ended before /readyz said 503: nothing was in flight to drain")
	default:
	}
	waitClosed(t, "the event stream to end", events.done, 2*time.Second)
	if got := strings.TrimSpace(strings.Join(events.lines, "\n")); !strings.HasSuffix(got, "\n: pdplane is shutting down") || events.err != nil {
		t.Errorf("event stream did not end with the shutdown comment and EOF (err %v):\n%s", events.err, got)
	}
	waitClosed(t, "the completion to finish", completion.done, grace)
	if !completion.sawDone() || completion.err != nil {
		t.Fatalf("the completion in flight was not finished: err %v, lines:\n%s", completion.err, strings.Join(completion.lines, "\n"))
	}
	if n := strings.Count(strings.Join(completion.lines, "\n"), `"delta"`); n < tokens/2 {
		t.Errorf("the completion sent %d chunks, want about %d", n, tokens)
	}
	code := exitCode(t, p, grace)
	exited := time.Now()
	if code != 0 {
		t.Fatalf("%s exited %d after SIGTERM, want 0", p.name, code)
	}
	assertRefused(t, strings.TrimPrefix(base, "http://"))
	if log := processLog(t, p); strings.Contains(log, "requests_cut") || strings.Contains(log, "request(s) still in flight") {
		t.Errorf("%s cut requests although they finished within the grace:\n%s", p.name, log)
	}
	t.Logf("%s after SIGTERM: /readyz 503 at %s, event stream ended at %s, completion [DONE] at %s, exit 0 at %s (grace %s)", p.name,
		notReady.Sub(signalled).Round(time.Millisecond), events.ended.Sub(signalled).Round(time.Millisecond),
		completion.ended.Sub(signalled).Round(time.Millisecond), exited.Sub(signalled).Round(time.Millisecond), grace)
	if d := events.ended.Sub(signalled); d > time.Second {
		t.Errorf("the event stream took %s to end, want well under a second", d)
	}
	if !completion.ended.Before(exited) {
		t.Errorf("%s exited before the completion finished", p.name)
	}
}

// TestShutdownGraceCutsTheRest: a completion longer than the grace is cut
// when the grace ends; serve still exits 0, and its log says how many
// requests it cut.
func TestShutdownGraceCutsTheRest(t *testing.T) {
	t.Parallel()
	const grace = time.Second
	serve, base := shutdownFleet(t, grace)
	completion := startCompletion(t, base, 100) // 15 s at 150 ms a token

	signalled := time.Now()
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := exitCode(t, serve, grace+5*time.Second)
	exited := time.Now()
	if code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0", code)
	}
	if d := exited.Sub(signalled); d < grace {
		t.Errorf("serve exited %s after SIGTERM, before its grace of %s", d, grace)
	}
	waitClosed(t, "the cut completion to end", completion.done, 5*time.Second)
	if completion.sawDone() {
		t.Fatalf("a completion of 15 s finished within a grace of %s", grace)
	}
	assertRefused(t, strings.TrimPrefix(base, "http://"))
	log := processLog(t, serve)
	if !strings.Contains(log, `"requests_cut":1`) || !strings.Contains(log, "cut 1 request(s) still in flight") {
		t.Errorf("serve's log does not say it cut one request:\n%s", log)
	}
	t.Logf("after SIGTERM: exit 0 at %s (grace %s), the completion cut at %s after %d lines",
		exited.Sub(signalled).Round(time.Millisecond), grace, completion.ended.Sub(signalled).Round(time.Millisecond), len(completion.lines))
}

// TestShutdownSecondSignalCutsAtOnce: a second SIGTERM during the drain
// cuts what is in flight without waiting for the grace; the exit is 0.
func TestShutdownSecondSignalCutsAtOnce(t *testing.T) {
	t.Parallel()
	const grace = 30 * time.Second
	serve, base := shutdownFleet(t, grace)
	completion := startCompletion(t, base, 100) // 15 s at 150 ms a token
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitReadyz503(t, serve, base, 2*time.Second)
	second := time.Now()
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, serve, 5*time.Second); code != 0 {
		t.Fatalf("serve exited %d after a second SIGTERM, want 0", code)
	}
	exited := time.Now()
	waitClosed(t, "the cut completion to end", completion.done, 5*time.Second)
	if completion.sawDone() {
		t.Fatal("the 15 s completion finished although a second signal cut it")
	}
	log := processLog(t, serve)
	if !strings.Contains(log, "second signal") || !strings.Contains(log, `"requests_cut":1`) {
		t.Errorf("serve's log does not say the second signal cut one request:\n%s", log)
	}
	t.Logf("exit 0 at %s after the second SIGTERM", exited.Sub(second).Round(time.Millisecond))
}
