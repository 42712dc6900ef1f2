package sim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestSGLangBootstrapServer pins the prefill's bootstrap server to SGLang's
// (python/sglang/srt/disaggregation/common/conn.py,
// CommonKVBootstrapServer: _handle_route_put, _handle_route_get,
// _handle_register_dp_rank, _handle_query_dp_ranks, _handle_health_check):
// routes, answers, texts and status codes.
func TestSGLangBootstrapServer(t *testing.T) {
	t.Parallel()
	cfg := simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang)
	p := simtest.Start(t, cfg)
	base := fmt.Sprintf("http://127.0.0.1:%d", p.BootstrapPort())
	do := func(method, path, body string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if st, _, body := do("GET", "/health", ""); st != 200 || body != "OK" {
		t.Fatalf("health %d %q", st, body)
	}
	if st, _, body := do("GET", "/route?prefill_dp_rank=0", ""); st != 400 || body != "Missing inputs for bootstrap server." {
		t.Fatalf("missing inputs %d %q", st, body)
	}
	// The prefill PUT its one rank at start: the layout is complete.
	st, _, body := do("GET", "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", "")
	var info map[string]any
	if st != 200 || json.Unmarshal([]byte(body), &info) != nil || info["attn_tp_size"] != 1.0 || info["dp_size"] != 1.0 ||
		info["pp_size"] != 1.0 || info["attn_cp_size"] != 1.0 || info["page_size"] != float64(cfg.PageSize) ||
		info["kv_cache_dtype"] != "bfloat16" || info["follow_bootstrap_room"] != true {
		t.Fatalf("server info %d %s", st, body)
	}
	st, _, body = do("GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "")
	var rank struct {
		RankIP   string `json:"rank_ip"`
		RankPort int    `json:"rank_port"`
	}
	if st != 200 || json.Unmarshal([]byte(body), &rank) != nil || rank.RankIP != "127.0.0.1" || rank.RankPort == 0 {
		t.Fatalf("rank %d %s", st, body)
	}
	if st, _, body := do("GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=3&target_pp_rank=0", ""); st != 404 ||
		body != "Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=3 pp_rank=0" {
		t.Fatalf("unknown rank %d %q", st, body)
	}
	if st, ct, body := do("DELETE", "/route", ""); st != 405 || body != "Method not allowed" || ct != "application/json" {
		t.Fatalf("delete %d %q %q", st, ct, body)
	}
	if st, _, body := do("PUT", "/route", `{"attn_tp_size": 1}`); st != 500 || !strings.Contains(body, "attn_tp_rank") {
		t.Fatalf("incomplete put %d %q", st, body)
	}
	if st, _, body := do("POST", "/register_dp_rank", `{"bootstrap_room": 12345, "dp_rank": 0}`); st != 200 || body != "OK" {
		t.Fatalf("register_dp_rank %d %q", st, body)
	}
	if st, _, body := do("POST", "/query_dp_ranks", `{"bootstrap_rooms": [12345, 999]}`); st != 200 || strings.TrimSpace(body) != `{"12345":0}` {
		t.Fatalf("query_dp_ranks %d %q", st, body)
	}
}

// TestSGLangRankSocket drives a prefill's rank socket the way an SGLang
// decode does, from a ZeroMQ PUSH socket of its own: a registration, the
// same agent registered again (ignored: NixlKVManager._add_remote_peer logs
// "Peer … was already registered, ignoring."), and a message without the
// guard (dropped as foreign traffic).
func TestSGLangRankSocket(t *testing.T) {
	t.Parallel()
	p := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang))
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	// One real request registers d's agent with p.
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "register", "max_tokens": 1})
	if s := p.Stats(); len(s.Remotes) != 1 || s.Remotes[0].Agent != d.AgentName() || s.IgnoredKVArgs != 0 {
		t.Fatalf("after one request: %+v", s)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	push := zmq4.NewPush(ctx, zmq4.WithDialerMaxRetries(0))
	defer push.Close()
	if err := push.Dial("tcp://" + rankAddr(t, p)); err != nil {
		t.Fatal(err)
	}
	// d's agent again, now claiming other pointers: SGLang keeps the first.
	if err := push.Send(zmq4.NewMsgFrom(kvArgsAgain(d.AgentName(), []byte("md"))...)); err != nil {
		t.Fatal(err)
	}
	if err := push.Send(zmq4.NewMsgFrom([]byte("GET / HTTP/1.1"), []byte("x"))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-registration ignored and the foreign message dropped", func() bool {
		s := p.Stats()
		return s.IgnoredKVArgs == 1 && s.ForeignMessages == 1
	})
	// The first registration still serves.
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "still works", "max_tokens": 1})
}

// rankAddr is the rank socket of prefill p, as its bootstrap server tells a
// decode.
func rankAddr(t *testing.T, p *sim.Sim) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", p.BootstrapPort()))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rank struct {
		RankIP   string `json:"rank_ip"`
		RankPort int    `json:"rank_port"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rank); err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(rank.RankIP, strconv.Itoa(rank.RankPort))
}

// TestRankSocketOutlivesHostileClients: the decodes a prefill serves go
// on being served while its rank socket holds a client that never greets
// (it is dropped at the handshake's timeout), a client that is not ZMTP
// at all, and a ZMTP greeting followed by a frame header naming 1 TiB,
// which go-zeromq would try to allocate (the process would die for want
// of memory): that connection is closed by the engine.
func TestRankSocketOutlivesHostileClients(t *testing.T) {
	t.Parallel()
	p := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang))
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	addr := rankAddr(t, p)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial() // silent: holds its connection open, says nothing
	if _, err := dial().Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// A NULL-mechanism greeting (ZMTP 3.0: signature, version, mechanism,
	// as-server, filler), then a long frame's header: flags LONG|COMMAND,
	// a size of 2^40.
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xFF, 0x7F, 3, 0
	copy(greeting[12:], "NULL")
	huge := dial()
	if _, err := huge.Write(append(greeting, 0x06, 0, 0, 1, 0, 0, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := huge.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// The engine greets back, then closes the connection.
	if _, err := io.Copy(io.Discard, huge); err != nil {
		t.Fatalf("the connection with the oversized frame: %v, want it closed by the engine", err)
	}
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "still served", "max_tokens": 1})
}

// kvArgsAgain is a registration of a decode's agent that the prefill knows
// already (SGLang keeps the first and ignores this one), with metadata md
// and other pointers.
func kvArgsAgain(agent string, md []byte) [][]byte {
	ptrs := binary.LittleEndian.AppendUint64(nil, 0xdead000)
	return [][]byte{
		[]byte("NixlMsgGuard"), []byte("None"), []byte("127.0.0.1"), []byte("1"), []byte(agent), md,
		ptrs, nil, nil, []byte("0"), []byte("1"), []byte("0"), []byte("4096"),
		nil, nil, nil, nil, []byte("8"), []byte("DRAM"), nil, nil, nil, []byte("1"), []byte("0"),
	}
}

// pushScript connects a libzmq PUSH, as SGLang's decode does (_connect in
// disaggregation/common/conn.py: one zmq.PUSH per endpoint), to argv[1]
// and sends the messages it reads from stdin, a JSON list of lists of
// hex-encoded frames, waiting until they are out.
const pushScript = `
import json, sys, zmq
s = zmq.Context().socket(zmq.PUSH)
s.connect("tcp://" + sys.argv[1])
for m in json.load(sys.stdin):
    s.send_multipart([bytes.fromhex(f) for f in m])
s.close(linger=10000)
`

// TestRankSocketSpeaksLibzmq: a prefill's rank socket reads what a
// libzmq PUSH sends it, as a real SGLang decode's: a re-registration of a
// known agent whose metadata is 100 KiB (ZMTP's long frames) is read and
// ignored as SGLang ignores it, and a message without the guard is
// dropped as foreign.
func TestRankSocketSpeaksLibzmq(t *testing.T) {
	t.Parallel()
	py := sim.PyzmqPython(t)
	p := simtest.Start(t, simtest.Config("p0", registry.RolePrefill, registry.EngineSGLang))
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineSGLang))
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "register", "max_tokens": 1})
	var msgs [][]string
	for _, m := range [][][]byte{kvArgsAgain(d.AgentName(), make([]byte, 100<<10)), {[]byte("GET / HTTP/1.1"), []byte("x")}} {
		var hexes []string
		for _, f := range m {
			hexes = append(hexes, hex.EncodeToString(f))
		}
		msgs = append(msgs, hexes)
	}
	in, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", pushScript, rankAddr(t, p))
	cmd.Stdin = bytes.NewReader(in)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the libzmq PUSH: %v\n%s", err, out)
	}
	waitFor(t, "the re-registration ignored and the foreign message dropped", func() bool {
		s := p.Stats()
		return s.IgnoredKVArgs == 1 && s.ForeignMessages == 1
	})
	pdOK(t, p, d, "/v1/completions", map[string]any{"prompt": "still served", "max_tokens": 1})
}

// TestFirstRequestsToAPrefillAllServed: many requests close together from
// a decode to a prefill it has never sent to are all served. SGLang's
// scheduler builds their receivers one at a time, so the decode's KV args
// reach the prefill before any request's destination; a destination that
// overtook them would fail its transfer with an unknown agent.
func TestFirstRequestsToAPrefillAllServed(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.Pages = 1024 })
	// The first request's connection opens late; the requests after it
	// find the prefill's rank fetched meanwhile.
	sim.SlowFirstPushDial(d, 50*time.Millisecond)
	c, ctx := simtest.NewClient(), context.Background()
	body := map[string]any{"prompt": "first contact", "max_tokens": 1}
	errs := make(chan string, 32)
	var wg sync.WaitGroup
	for range cap(errs) {
		// Spread over a few tens of milliseconds, as a router's requests
		// come: the load's pace, not a wait for an event.
		time.Sleep(time.Millisecond)
		wg.Go(func() {
			pr, dr, err := c.SGLang(ctx, p, d, "/v1/completions", body, simtest.Room())
			if err != nil || pr.Status != http.StatusOK || dr.Status != http.StatusOK {
				errs <- fmt.Sprintf("%v: prefill %d %s, decode %d %s", err, pr.Status, pr.Body, dr.Status, dr.Body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
