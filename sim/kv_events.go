package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/pdplane/pdplane/zmtp"
)

// A prefill's KV events, on vLLM's wire (vllm/distributed/kv_events.py,
// ZmqEventPublisher, vLLM 0.32), which package kvevents reads:
//
//   - a PUB socket sends every batch as a message of three frames: the
//     topic, the batch's sequence number (8 bytes big-endian, from 0, one
//     more each batch) and the msgpack KVEventBatch, the array [ts,
//     events, data_parallel_rank] whose events are maps tagged by "type":
//     BlockStored (block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium, lora_name) and BlockRemoved (block_hashes, medium).
//     Hashes are integers, as vLLM sends them under
//     VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (the low 8 bytes of its digest);
//   - a ROUTER replay socket answers a request (an empty delimiter and the
//     8-byte sequence number to start from) with every batch it still
//     holds from there, each as (delimiter, topic, sequence number,
//     payload), then the end marker (delimiter, "", -1, "").
//
// One batch goes out per prefill that changed the cache: the runs of blocks
// it stored, then the blocks it evicted. The sim publishes vLLM's shape in
// both engine modes. SGLang's publisher
// (python/sglang/srt/disaggregation/kv_events.py) is a copy of vLLM's with
// these differences: its events are positional arrays (msgspec
// array_like: ["BlockStored", block_hashes, parent_block_hash, token_ids,
// block_size, lora_id]; ["BlockRemoved", block_hashes]), not maps, with no
// medium or lora_name; its batch is [ts, events] (later versions add
// attn_dp_rank); its hashes are always integers; and its replay answers
// (delimiter, sequence number, payload) without the topic, ending with
// (delimiter, -1, ""). kvevents reads neither SGLang's events nor its
// replay.
//
// The sockets are served here over go-zeromq's handshake (zmq4.Open) and
// the ZMTP framing written and read directly: a subscriber's or replay
// client's connection has one writer and reads through zmtp.Guard, and a
// PING is answered in order with what is being sent.

// Bounds of the publisher.
const (
	// kvEventsRing is how many recent batches the replay socket holds
	// (vLLM's buffer_steps, 10,000 by default).
	kvEventsRing = 1000
	// kvEventsQueue is how many batches a subscriber may fall behind
	// before it misses some, as a PUB socket drops past its high-water
	// mark; the replay socket fills the gap.
	kvEventsQueue = 4096
	// maxKVEventsTopic bounds Config.KVEventsTopic.
	maxKVEventsTopic = 1 << 10
	// maxKVEventsInbound bounds a message a subscriber or a replay client
	// sends: subscriptions, replay requests and ZMTP commands are small.
	maxKVEventsInbound = 64 << 10
	// kvEventsHandshake bounds a connection's ZMTP handshake;
	// kvEventsWrite, one write to a peer.
	kvEventsHandshake = 5 * time.Second
	kvEventsWrite     = 10 * time.Second
)

// kvEndSeq is the sequence number of the end-of-replay marker (vLLM's
// END_SEQ, -1 as 8 bytes big-endian).
const kvEndSeq = ^uint64(0)

// kvEvents is a prefill's KV events publisher.
type kvEvents struct {
	log        zerolog.Logger
	now        func() time.Time
	topic      []byte
	addr       string // Config.KVEventsAddr
	replayAddr string // Config.KVEventsReplayAddr
	blockSize  int

	pubLn, replayLn net.Listener
	pubEP, replayEP string // "tcp://host:port"

	mu     sync.Mutex
	next   uint64       // the next batch's sequence number
	ring   []kvBatchMsg // the last kvEventsRing batches, oldest first
	subs   map[*kvSub]struct{}
	conns  map[net.Conn]struct{} // every connection, closed at close
	closed bool
	wg     sync.WaitGroup
}

// kvBatchMsg is one published batch.
type kvBatchMsg struct {
	seq     uint64
	payload []byte
}

func newKVEvents(cfg Config, log zerolog.Logger) *kvEvents {
	return &kvEvents{
		log: log.With().Str("component", "kv-events").Logger(), now: cfg.Now,
		topic: []byte(cfg.KVEventsTopic), addr: cfg.KVEventsAddr, replayAddr: cfg.KVEventsReplayAddr,
		blockSize: cfg.PageSize, subs: map[*kvSub]struct{}{}, conns: map[net.Conn]struct{}{},
	}
}

// listen binds the sockets; advertise is the host put in their endpoints
// when they listen on every address.
func (e *kvEvents) listen(advertise string) error {
	var err error
	if e.pubLn, e.pubEP, err = listenEndpoint(e.addr, advertise); err != nil {
		return fmt.Errorf("listen for KV events subscribers on %s: %w", e.addr, err)
	}
	if e.replayAddr != "" {
		if e.replayLn, e.replayEP, err = listenEndpoint(e.replayAddr, advertise); err != nil {
			return fmt.Errorf("listen for KV events replays on %s: %w", e.replayAddr, err)
		}
	}
	return nil
}

func listenEndpoint(addr, advertise string) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = advertise
	}
	return ln, "tcp://" + net.JoinHostPort(host, port), nil
}

func (e *kvEvents) endpoints() (string, string) { return e.pubEP, e.replayEP }

// serve accepts subscribers and replay clients until close.
func (e *kvEvents) serve() {
	e.wg.Go(func() { e.accept(e.pubLn, e.serveSub) })
	if e.replayLn != nil {
		e.wg.Go(func() { e.accept(e.replayLn, e.serveReplay) })
	}
	e.wg.Wait()
}

// accept serves ln's connections with serve, each on a goroutine of its
// own; a failing accept is retried after a pause that doubles up to a
// second.
func (e *kvEvents) accept(ln net.Listener, serve func(net.Conn, io.Reader)) {
	var pause time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			e.log.Warn().Err(err).Dur("retry_in", pause).Msg("KV events: accept")
			time.Sleep(pause)
			continue
		}
		pause = 0
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			nc.Close()
			return
		}
		e.conns[nc] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go func() {
			defer e.wg.Done()
			defer func() {
				e.mu.Lock()
				delete(e.conns, nc)
				e.mu.Unlock()
				nc.Close()
			}()
			r, err := handshake(nc, serveType(ln == e.pubLn))
			if err != nil {
				e.log.Debug().Err(err).Str("peer", nc.RemoteAddr().String()).Msg("KV events: ZMTP handshake")
				return
			}
			serve(nc, r)
		}()
	}
}

func serveType(pub bool) zmq4.SocketType {
	if pub {
		return zmq4.Pub
	}
	return zmq4.Router
}

// handshake runs the ZMTP handshake of a socket of type t over nc and
// returns what to read the connection through from then on.
func handshake(nc net.Conn, t zmq4.SocketType) (io.Reader, error) {
	if err := nc.SetDeadline(time.Now().Add(kvEventsHandshake)); err != nil {
		return nil, err
	}
	g := zmtp.Guard(nc, maxKVEventsInbound)
	if _, err := zmq4.Open(g, null.Security(), t, zmq4.SocketIdentity(""), true, nil); err != nil {
		return nil, err
	}
	return g, nc.SetDeadline(time.Time{})
}

// close closes the sockets and every connection, and waits for their
// goroutines.
func (e *kvEvents) close() {
	e.mu.Lock()
	e.closed = true
	for _, ln := range []net.Listener{e.pubLn, e.replayLn} {
		if ln != nil {
			ln.Close()
		}
	}
	for nc := range e.conns {
		nc.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// publishChange publishes the batch of one cache change. The cache calls
// it under its lock, so that batches leave in the order of the changes.
func (e *kvEvents) publishChange(ch cacheChange) {
	ts := float64(e.now().UnixNano()) / 1e9
	e.publish(encodeKVBatch(ts, ch, e.blockSize))
}

// publish sends payload as the next batch to every subscriber of the topic
// and keeps it for replays. A subscriber kvEventsQueue batches behind
// misses it.
func (e *kvEvents) publish(payload []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	seq := e.next
	e.next++
	if len(e.ring) == kvEventsRing {
		copy(e.ring, e.ring[1:])
		e.ring = e.ring[:kvEventsRing-1]
	}
	e.ring = append(e.ring, kvBatchMsg{seq: seq, payload: payload})
	var msg []byte
	for sub := range e.subs {
		if !sub.subscribed(e.topic) {
			continue
		}
		if msg == nil {
			msg = appendZMTPMessage(nil, e.topic, binary.BigEndian.AppendUint64(nil, seq), payload)
		}
		select {
		case sub.out <- msg:
		default:
			e.log.Debug().Uint64("seq", seq).Str("subscriber", sub.nc.RemoteAddr().String()).Msg("KV events: a slow subscriber misses a batch")
		}
	}
}

// kvSub is one subscriber's connection.
type kvSub struct {
	nc  net.Conn
	out chan []byte // encoded messages, written in order by one goroutine

	mu     sync.Mutex
	topics map[string]int // subscribed prefixes, counted as libzmq does
}

// subscribed reports whether a message of topic goes to the subscriber: a
// PUB socket sends what one of its subscriptions is a prefix of.
func (s *kvSub) subscribed(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.topics {
		if bytes.HasPrefix(topic, []byte(p)) {
			return true
		}
	}
	return false
}

// subscribe applies a subscription (on) or its cancellation.
func (s *kvSub) subscribe(prefix []byte, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := string(prefix)
	switch {
	case on:
		s.topics[k]++
	case s.topics[k] > 1:
		s.topics[k]--
	default:
		delete(s.topics, k)
	}
}

// serveSub serves a subscriber: what it subscribes to, and the batches
// published meanwhile.
func (e *kvEvents) serveSub(nc net.Conn, r io.Reader) {
	sub := &kvSub{nc: nc, out: make(chan []byte, kvEventsQueue), topics: map[string]int{}}
	e.mu.Lock()
	e.subs[sub] = struct{}{}
	e.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	var writer sync.WaitGroup
	writer.Go(func() {
		defer nc.Close() // a failed write ends the reader too
		for {
			select {
			case msg := <-sub.out:
				if err := writeDeadline(nc, msg); err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	})
	defer func() {
		e.mu.Lock()
		delete(e.subs, sub)
		e.mu.Unlock()
		cancel()
		writer.Wait()
	}()
	for {
		frames, cmd, err := readZMTPMessage(r)
		if err != nil {
			return
		}
		switch {
		case cmd:
			name, body := splitCommand(frames[0])
			switch name {
			case "PING":
				select {
				case sub.out <- pong(body):
				default:
				}
			case "SUBSCRIBE": // ZMTP 3.1
				sub.subscribe(body, true)
			case "CANCEL":
				sub.subscribe(body, false)
			}
		case len(frames) == 1 && len(frames[0]) > 0 && frames[0][0] <= 1:
			// ZMTP 3.0's subscription message: 1 (or 0 to cancel) and
			// the prefix.
			sub.subscribe(frames[0][1:], frames[0][0] == 1)
		}
	}
}

// serveReplay answers a replay client's requests: every batch still held
// from the sequence number asked, then the end marker. A request of other
// than two frames (the delimiter and the number) is dropped, as vLLM's
// _service_replay drops it.
func (e *kvEvents) serveReplay(nc net.Conn, r io.Reader) {
	for {
		frames, cmd, err := readZMTPMessage(r)
		if err != nil {
			return
		}
		if cmd {
			if name, body := splitCommand(frames[0]); name == "PING" {
				if writeDeadline(nc, pong(body)) != nil {
					return
				}
			}
			continue
		}
		if len(frames) != 2 {
			e.log.Warn().Int("frames", len(frames)).Msg("KV events: invalid replay request")
			continue
		}
		from := kvEndSeq // a number past 8 bytes is past every batch
		if len(frames[1]) <= 8 {
			var b [8]byte
			copy(b[8-len(frames[1]):], frames[1])
			from = binary.BigEndian.Uint64(b[:])
		}
		e.mu.Lock()
		held := make([]kvBatchMsg, 0, len(e.ring))
		for _, m := range e.ring {
			if m.seq >= from {
				held = append(held, m)
			}
		}
		e.mu.Unlock()
		var buf []byte
		for _, m := range held {
			buf = appendZMTPMessage(buf[:0], nil, e.topic, binary.BigEndian.AppendUint64(nil, m.seq), m.payload)
			if writeDeadline(nc, buf) != nil {
				return
			}
		}
		buf = appendZMTPMessage(buf[:0], nil, nil, binary.BigEndian.AppendUint64(nil, kvEndSeq), nil)
		if writeDeadline(nc, buf) != nil {
			return
		}
	}
}

func writeDeadline(nc net.Conn, b []byte) error {
	if err := nc.SetWriteDeadline(time.Now().Add(kvEventsWrite)); err != nil {
		return err
	}
	_, err := nc.Write(b)
	return err
}

// ZMTP 3.x framing (rfc.zeromq.org/spec/23): each frame a flags byte
// (MORE, LONG, COMMAND), its size in one byte or, LONG, eight big-endian,
// and its body; a command's body is its name's length, its name and its
// data.
const (
	zmtpMore    = 0x01
	zmtpLong    = 0x02
	zmtpCommand = 0x04
)

// appendZMTPMessage appends the frames of one message to dst.
func appendZMTPMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags |= zmtpMore
		}
		if len(f) > 255 {
			dst = append(dst, flags|zmtpLong)
			dst = binary.BigEndian.AppendUint64(dst, uint64(len(f)))
		} else {
			dst = append(dst, flags, byte(len(f)))
		}
		dst = append(dst, f...)
	}
	return dst
}

// pong is the PONG command answering a PING's body (its TTL, then the
// context the PONG echoes).
func pong(ping []byte) []byte {
	var ctx []byte
	if len(ping) > 2 {
		ctx = ping[2:]
	}
	body := append([]byte{4}, "PONG"...)
	body = append(body, ctx...)
	return append([]byte{zmtpCommand, byte(len(body))}, body...)
}

// readZMTPMessage reads one message (its frames) or command (one frame)
// from r, which bounds it (zmtp.Guard).
func readZMTPMessage(r io.Reader) (frames [][]byte, cmd bool, err error) {
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, false, err
		}
		size := uint64(hdr[1])
		if hdr[0]&zmtpLong != 0 {
			var rest [7]byte
			if _, err := io.ReadFull(r, rest[:]); err != nil {
				return nil, false, err
			}
			size = binary.BigEndian.Uint64(append([]byte{hdr[1]}, rest[:]...))
		}
		if size > maxKVEventsInbound {
			return nil, false, fmt.Errorf("a frame of %d bytes", size)
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, false, err
		}
		frames = append(frames, body)
		if hdr[0]&zmtpCommand != 0 {
			return frames, true, nil
		}
		if hdr[0]&zmtpMore == 0 {
			return frames, false, nil
		}
	}
}

// splitCommand splits a command frame into its name and data.
func splitCommand(f []byte) (name string, body []byte) {
	if len(f) == 0 || int(f[0]) > len(f)-1 {
		return "", nil
	}
	return string(f[1 : 1+f[0]]), f[1+f[0]:]
}

// encodeKVBatch encodes ch as a KVEventBatch, as msgspec encodes vLLM's:
// the batch an array, each event a map led by its "type" tag, the members
// vLLM always sends (those without a default) and none of those it omits
// at their default. The fixture of package kvevents
// (kvevents/testdata/vllm-batch.msgpack) was written by vLLM's encoder.
func encodeKVBatch(ts float64, ch cacheChange, blockSize int) []byte {
	var b bytes.Buffer
	enc := msgpack.NewEncoder(&b)
	n := len(ch.stored)
	if len(ch.removed) > 0 {
		n++
	}
	// Writes to a bytes.Buffer do not fail.
	_ = enc.EncodeArrayLen(3)
	_ = enc.EncodeFloat64(ts)
	_ = enc.EncodeArrayLen(n)
	for _, run := range ch.stored {
		_ = enc.EncodeMapLen(8)
		_ = enc.EncodeString("type")
		_ = enc.EncodeString("BlockStored")
		_ = enc.EncodeString("block_hashes")
		_ = enc.EncodeArrayLen(len(run))
		for _, blk := range run {
			_ = enc.EncodeUint(blk.hash)
		}
		_ = enc.EncodeString("parent_block_hash")
		if run[0].hasParent {
			_ = enc.EncodeUint(run[0].parent)
		} else {
			_ = enc.EncodeNil()
		}
		_ = enc.EncodeString("token_ids")
		_ = enc.EncodeArrayLen(len(run) * blockSize)
		for _, blk := range run {
			for _, t := range blk.tokens {
				_ = enc.EncodeInt(int64(t))
			}
		}
		_ = enc.EncodeString("block_size")
		_ = enc.EncodeInt(int64(blockSize))
		_ = enc.EncodeString("lora_id")
		_ = enc.EncodeNil()
		_ = enc.EncodeString("medium")
		_ = enc.EncodeString("GPU")
		_ = enc.EncodeString("lora_name")
		_ = enc.EncodeNil()
	}
	if len(ch.removed) > 0 {
		_ = enc.EncodeMapLen(3)
		_ = enc.EncodeString("type")
		_ = enc.EncodeString("BlockRemoved")
		_ = enc.EncodeString("block_hashes")
		_ = enc.EncodeArrayLen(len(ch.removed))
		for _, h := range ch.removed {
			_ = enc.EncodeUint(h)
		}
		_ = enc.EncodeString("medium")
		_ = enc.EncodeString("GPU")
	}
	_ = enc.EncodeInt(0) // data_parallel_rank
	return b.Bytes()
}
