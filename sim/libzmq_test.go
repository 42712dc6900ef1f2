package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// PyzmqPython is the python whose pyzmq (libzmq, which SGLang's KV
// managers speak ZMTP through) stands in for a real engine's socket in the
// interop tests: $PDPLANE_PYZMQ_PYTHON, else the repository's .venv when
// it has pyzmq (scripts/install-pyzmq.sh). Required under CI=true.
func PyzmqPython(t testing.TB) string {
	t.Helper()
	py := os.Getenv("PDPLANE_PYZMQ_PYTHON")
	if py == "" {
		if p, _ := filepath.Abs(filepath.Join("..", ".venv", "bin", "python")); exec.Command(p, "-c", "import zmq").Run() == nil {
			py = p
		}
	}
	if py == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no python with pyzmq; under CI=true it is required (scripts/install-pyzmq.sh)")
		}
		t.Skip("no python with pyzmq: the libzmq interop is not tested (scripts/install-pyzmq.sh installs it into .venv)")
	}
	return py
}

// pullScript binds a libzmq PULL on a free port, prints the port, and
// prints each message it receives as a JSON list of its frames' lengths
// and its first frame, until it has n or waited 10 s for one.
const pullScript = `
import json, sys, zmq
n = int(sys.argv[1])
s = zmq.Context().socket(zmq.PULL)
s.setsockopt(zmq.RCVTIMEO, 10000)
print(s.bind_to_random_port("tcp://127.0.0.1"), flush=True)
for _ in range(n):
    m = s.recv_multipart()
    print(json.dumps({"lengths": [len(f) for f in m], "first": m[0].decode()}), flush=True)
`

// TestPushersSpeakLibzmq: what a decode sends a prefill's rank socket
// reaches a libzmq PULL as SGLang's bootstrap thread receives it
// (recv_multipart): every frame, short and long (over 255 bytes, ZMTP's
// 8-byte size), in order, each message whole, two on one connection.
func TestPushersSpeakLibzmq(t *testing.T) {
	py := PyzmqPython(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", pullScript, "2")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("the PULL printed no port: %v", lines.Err())
	}
	addr := "127.0.0.1:" + strings.TrimSpace(lines.Text())
	var p pushers
	p.init()
	defer p.closeAll()
	sent := [][][]byte{
		{[]byte("NixlMsgGuard"), []byte("123"), nil, make([]byte, 300), make([]byte, 70000)},
		{[]byte("second"), []byte("x")},
	}
	for _, frames := range sent {
		if err := p.send(ctx, addr, frames); err != nil {
			t.Fatal(err)
		}
	}
	for i, frames := range sent {
		if !lines.Scan() {
			t.Fatalf("message %d never reached the PULL: %v", i+1, lines.Err())
		}
		var got struct {
			Lengths []int
			First   string
		}
		if err := json.Unmarshal(lines.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		want := make([]int, len(frames))
		for k, f := range frames {
			want[k] = len(f)
		}
		if got.First != string(frames[0]) || !slices.Equal(got.Lengths, want) {
			t.Fatalf("message %d reached the PULL as %+v, want lengths %v, first %q", i+1, got, want, frames[0])
		}
	}
}

// SlowFirstPushDial makes the decode's first connection to a prefill's
// rank socket take d longer to open than the ones after it, as a dropped
// SYN does: a test's way to let later requests overtake the first.
func SlowFirstPushDial(s *Sim, d time.Duration) {
	var first atomic.Bool
	dial := s.pushers.dial
	s.pushers.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if first.CompareAndSwap(false, true) {
			time.Sleep(d) // the fault itself: a dial that is slow
		}
		return dial(ctx, network, addr)
	}
}
