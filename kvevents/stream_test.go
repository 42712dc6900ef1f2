package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// fakePublisher is a fake engine: a ZMQ PUB socket and a ROUTER replay
// socket that send what vLLM's ZmqEventPublisher sends (topic, 8-byte
// sequence number, payload; a replay's batches, then the -1 marker).
type fakePublisher struct {
	pub, router zmq4.Socket
	mu          sync.Mutex
	sent        map[uint64][]byte // what the replay socket still holds
}

func newFakePublisher(t *testing.T) *fakePublisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakePublisher{pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx), sent: map[uint64][]byte{}}
	t.Cleanup(func() { cancel(); f.pub.Close(); f.router.Close() })
	for _, s := range []zmq4.Socket{f.pub, f.router} {
		if err := s.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	go f.serveReplay()
	return f
}

func (f *fakePublisher) config() Config {
	addr := func(s zmq4.Socket) string { return strings.TrimPrefix(s.Addr().String(), "tcp://") }
	return Config{Endpoint: addr(f.pub), ReplayEndpoint: addr(f.router), Topic: "kv"}
}

// publish sends payload as batch seq; live false keeps it for the replay
// socket alone (a batch the subscriber missed).
func (f *fakePublisher) publish(t *testing.T, seq uint64, payload []byte, live bool) {
	t.Helper()
	f.mu.Lock()
	f.sent[seq] = payload
	f.mu.Unlock()
	if live {
		if err := f.pub.Send(zmq4.NewMsgFrom([]byte("kv"), binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fakePublisher) serveReplay() {
	for {
		msg, err := f.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, from := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		f.mu.Lock()
		for seq := from; ; seq++ {
			p, ok := f.sent[seq]
			if !ok {
				break
			}
			_ = f.router.Send(zmq4.NewMsgFrom(id, nil, []byte("kv"), binary.BigEndian.AppendUint64(nil, seq), p))
		}
		f.mu.Unlock()
		_ = f.router.Send(zmq4.NewMsgFrom(id, nil, nil, binary.BigEndian.AppendUint64(nil, endSeq), nil))
	}
}

// TestStreamFillsGapsFromTheReplaySocket: batches come in order; a batch
// the subscription missed is asked of the replay socket before the next
// is handed on; without a replay socket the gap is told (Missed), and a
// malformed batch ends the stream.
func TestStreamFillsGapsFromTheReplaySocket(t *testing.T) {
	payload, err := os.ReadFile("testdata/vllm-batch.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	for _, withReplay := range []bool{true, false} {
		f := newFakePublisher(t)
		cfg := f.config()
		if !withReplay {
			cfg.ReplayEndpoint = ""
		}
		got := make(chan Message, 16)
		done := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, err := Stream(ctx, cfg, 0, func(m Message) { got <- m })
			done <- err
		}()
		// A PUB socket drops what it sends before the subscription
		// arrives: publish batch 0 until it is seen.
		first := time.Now()
		for seen := false; !seen; {
			f.publish(t, 0, payload, true)
			select {
			case m := <-got:
				seen = m.Seq == 0
			case <-time.After(20 * time.Millisecond):
				if time.Since(first) > 5*time.Second {
					t.Fatal("batch 0 never arrived")
				}
			}
		}
		f.publish(t, 1, payload, false) // missed by the subscriber
		f.publish(t, 2, payload, true)
		var seqs []uint64
		var missed uint64
		for len(seqs) < 2 && (withReplay || len(seqs) < 1) {
			select {
			case m := <-got:
				seqs, missed = append(seqs, m.Seq), missed+m.Missed
			case <-time.After(5 * time.Second):
				t.Fatalf("replay %v: got %v", withReplay, seqs)
			}
		}
		switch {
		case withReplay && (seqs[0] != 1 || seqs[1] != 2 || missed != 0):
			t.Fatalf("with replay: batches %v, %d missed; want 1 then 2", seqs, missed)
		case !withReplay && (seqs[0] != 2 || missed != 1):
			t.Fatalf("without replay: batches %v, %d missed; want 2 with 1 missed", seqs, missed)
		}
		f.publish(t, 3, []byte{0x92, 0xc0}, true) // [nil, ...]: not a batch
		select {
		case err := <-done:
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("a malformed batch ended the stream with %v, want ErrMalformed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a malformed batch did not end the stream")
		}
		cancel()
	}
}
