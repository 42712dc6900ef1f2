package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/pdplane/pdplane/zmtp"
)

// Config says where one engine publishes its KV events.
type Config struct {
	// Endpoint is the host:port of its PUB socket (vLLM: the
	// --kv-events-config endpoint, as the router reaches it).
	Endpoint string
	// ReplayEndpoint is the host:port of its ROUTER replay socket; empty
	// when it has none: a gap then cannot be filled.
	ReplayEndpoint string
	// Topic is the topic it publishes under ("" for all).
	Topic string
	// DialTimeout bounds each connection's dial and handshake; 5 s by
	// default.
	DialTimeout time.Duration
}

// Message is what Stream hands on: a batch, in sequence order.
type Message struct {
	Seq   uint64
	Batch Batch
	// Missed, when not zero, is how many batches just before this one were
	// lost for good (no replay endpoint, or it no longer held them): what
	// was known of the engine's cache is not any more.
	Missed uint64
}

// endSeq is the sequence number of vLLM's end-of-replay marker (-1).
const endSeq = ^uint64(0)

// maxMessage bounds one message's frames together: a batch's payload and
// its topic and sequence number.
const maxMessage = MaxPayloadBytes + 1<<10

// Stream subscribes to one engine's KV events and calls on with every
// batch in sequence order, until ctx ends (nil) or the connection fails or
// a batch is malformed (the error: what was known of the engine is then
// stale). With a replay endpoint it first asks for the batches the engine
// still holds from sequence number from (0 at a first subscription), and
// fills any later gap the same way; it returns the next sequence number it
// expects, for a caller that subscribes again.
func Stream(ctx context.Context, cfg Config, from uint64, on func(Message)) (next uint64, err error) {
	defer func() {
		if ctx.Err() != nil {
			err = nil // ended by the caller: the connection's error is its closing
		}
	}()
	next = from
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	sub, nc, err := open(ctx, cfg, cfg.Endpoint, zmq4.Sub)
	if err != nil {
		return next, err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	if err := sub.SendMsg(zmq4.NewMsg(append([]byte{1}, cfg.Topic...))); err != nil {
		return next, fmt.Errorf("subscribe to %s: %w", cfg.Endpoint, err)
	}
	// deliver hands on a batch in order: older ones (seen in a replay)
	// are dropped, and a gap is filled from the replay socket or told.
	deliver := func(seq uint64, payload []byte) error {
		if seq < next {
			return nil
		}
		var missed uint64
		if seq > next && cfg.ReplayEndpoint != "" {
			var err error
			if next, err = replay(ctx, cfg, next, seq, on); err != nil {
				return err
			}
		}
		if seq > next {
			missed = seq - next
		}
		b, err := Decode(payload)
		if err != nil {
			return fmt.Errorf("batch %d from %s: %w", seq, cfg.Endpoint, err)
		}
		on(Message{Seq: seq, Batch: b, Missed: missed})
		next = seq + 1
		return nil
	}
	if cfg.ReplayEndpoint != "" {
		if next, err = replay(ctx, cfg, next, endSeq, on); err != nil {
			return next, err
		}
	}
	for {
		msg, err := sub.RecvMsg()
		if err != nil {
			return next, fmt.Errorf("read KV events from %s: %w", cfg.Endpoint, err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		seq, payload, err := frames(msg.Frames)
		if err != nil {
			return next, fmt.Errorf("KV events from %s: %w", cfg.Endpoint, err)
		}
		if err := deliver(seq, payload); err != nil {
			return next, err
		}
	}
}

// frames reads a published message: topic, sequence number, payload.
func frames(f [][]byte) (seq uint64, payload []byte, err error) {
	if len(f) != 3 || len(f[1]) != 8 {
		return 0, nil, fmt.Errorf("%w: a message of %d frames, want topic, 8-byte sequence number and payload", ErrMalformed, len(f))
	}
	return binary.BigEndian.Uint64(f[1]), f[2], nil
}

// replay asks the engine's replay socket for the batches from seq from on
// and hands on those before until in order (all it holds when until is
// endSeq); it returns the next sequence number expected. vLLM's ROUTER
// answers a request (an empty delimiter and the 8-byte start) with
// (delimiter, topic, seq, payload) per batch it still holds, then
// (delimiter, "", -1, "").
func replay(ctx context.Context, cfg Config, from, until uint64, on func(Message)) (uint64, error) {
	d, nc, err := open(ctx, cfg, cfg.ReplayEndpoint, zmq4.Dealer)
	if err != nil {
		return from, err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	if err := d.SendMsg(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return from, fmt.Errorf("ask %s to replay: %w", cfg.ReplayEndpoint, err)
	}
	next := from
	for {
		msg, err := d.RecvMsg()
		if err != nil {
			return next, fmt.Errorf("replay from %s: %w", cfg.ReplayEndpoint, err)
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(msg.Frames) > 0 && len(msg.Frames[0]) == 0 {
			msg.Frames = msg.Frames[1:] // the delimiter
		}
		seq, payload, err := frames(msg.Frames)
		if err != nil {
			return next, fmt.Errorf("replay from %s: %w", cfg.ReplayEndpoint, err)
		}
		if seq == endSeq {
			return next, nil
		}
		if seq < next || seq >= until {
			continue
		}
		b, err := Decode(payload)
		if err != nil {
			return next, fmt.Errorf("replayed batch %d from %s: %w", seq, cfg.ReplayEndpoint, err)
		}
		on(Message{Seq: seq, Batch: b, Missed: seq - next})
		next = seq + 1
	}
}

// open dials addr and opens a ZMTP socket of type t over it, its messages
// bounded by maxMessage.
func open(ctx context.Context, cfg Config, addr string, t zmq4.SocketType) (*zmq4.Conn, net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var dialer net.Dialer
	nc, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("KV events: %w", err)
	}
	if err := nc.SetDeadline(time.Now().Add(cfg.DialTimeout)); err != nil {
		nc.Close()
		return nil, nil, err
	}
	zc, err := zmq4.Open(zmtp.Guard(nc, maxMessage), null.Security(), t, zmq4.SocketIdentity(""), false, nil)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("KV events: ZMTP handshake with %s: %w", addr, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return zc, nc, nil
}
