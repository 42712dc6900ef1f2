package sim

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// pullOn binds a PULL socket (go-zeromq's own, standing in for the
// prefill's rank socket) on addr ("127.0.0.1:0" for any port).
func pullOn(t *testing.T, addr string) zmq4.Socket {
	t.Helper()
	pull := zmq4.NewPull(context.Background())
	if err := pull.Listen("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	return pull
}

// recvFrames receives one message or fails after a timeout.
func recvFrames(t *testing.T, pull zmq4.Socket) [][]byte {
	t.Helper()
	got := make(chan zmq4.Msg, 1)
	go func() {
		m, _ := pull.Recv()
		got <- m
	}()
	select {
	case m := <-got:
		return m.Frames
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5 s")
		return nil
	}
}

// TestPushersReachARestartedPrefill: a prefill that restarts on the same
// rank port closes the decode's PUSH connection; the decode's next send
// must reach the new process, as libzmq's PUSH reconnects on its own
// (SGLang's decode keeps one socket per endpoint, _connect in
// disaggregation/common/conn.py). Sending into the old connection would
// lose the message without an error: the kernel accepts the bytes of a
// connection whose peer has only closed.
func TestPushersReachARestartedPrefill(t *testing.T) {
	var p pushers
	p.init()
	defer p.closeAll()
	first := pullOn(t, "127.0.0.1:0")
	addr := first.Addr().String()
	ctx := context.Background()
	frames := func(i int) [][]byte { return [][]byte{[]byte("room"), []byte(fmt.Sprint(i)), nil, make([]byte, 300)} }
	if err := p.send(ctx, addr, frames(1)); err != nil {
		t.Fatal(err)
	}
	if got := recvFrames(t, first); string(got[1]) != "1" || len(got) != 4 || len(got[3]) != 300 {
		t.Fatalf("first message: %q", got)
	}
	first.Close()
	// The close reaches the decode's end before the new process binds.
	p.mu.Lock()
	c := p.conns[addr]
	p.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); !c.closed.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the prefill's close did not reach the decode's connection within 5 s")
		}
	}
	second := pullOn(t, addr)
	defer second.Close()
	if err := p.send(ctx, addr, frames(2)); err != nil {
		t.Fatal(err)
	}
	if got := recvFrames(t, second); string(got[1]) != "2" {
		t.Fatalf("after the restart: %q", got)
	}
}

// TestPushersSendAMessageInOneWrite: a message leaves in one write, as
// libzmq's encoder batches it, not a write per frame header and body.
func TestPushersSendAMessageInOneWrite(t *testing.T) {
	pull := pullOn(t, "127.0.0.1:0")
	defer pull.Close()
	var p pushers
	p.init()
	defer p.closeAll()
	var writes []int
	dial := p.dial
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countWrites{Conn: c, sizes: &writes}, nil
	}
	if err := p.send(context.Background(), pull.Addr().String(), [][]byte{[]byte("a"), []byte("bc"), nil, []byte("def")}); err != nil {
		t.Fatal(err)
	}
	if got := recvFrames(t, pull); len(got) != 4 || string(got[3]) != "def" {
		t.Fatalf("got %q", got)
	}
	handshake := len(writes) - 1
	// Four frames: 2+1, 2+2, 2+0 and 2+3 bytes.
	if last := writes[len(writes)-1]; handshake < 1 || last != 14 {
		t.Fatalf("writes %v: want the handshake's, then one of 14 bytes", writes)
	}
}

type countWrites struct {
	net.Conn
	sizes *[]int
}

func (c *countWrites) Write(b []byte) (int, error) {
	*c.sizes = append(*c.sizes, len(b))
	return c.Conn.Write(b)
}
