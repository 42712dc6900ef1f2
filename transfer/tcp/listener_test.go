package tcp_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// target is a decode-side agent with cfg's listener settings and
// authBytes of registered memory.
func target(t *testing.T, cfg tcp.Config) (*tcp.Backend, *transfertest.Agent) {
	t.Helper()
	var b *tcp.Backend
	a := transfertest.NewAgent(t, func(t testing.TB, name string) transfer.Backend {
		cfg.AgentName = name
		var err error
		if b, err = tcp.New(cfg, zerolog.New(zerolog.NewTestWriter(t))); err != nil {
			t.Fatal(err)
		}
		return b
	}, transfertest.UniqueName("decode"), authBytes)
	return b, a
}

// magicOnly dials the agent and sends only the hello's magic, as the
// finding's 2,000 connections did.
func magicOnly(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("PDTH")); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin waits for the agent to close c and fails unless it did
// within d. Nothing is sent to it before.
func closedWithin(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	// A reset is a close too: the agent closed with our bytes unread.
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: not closed within %s: %v", what, d, err)
	}
}

// TestHandshakeHasADeadline: a connection that sends the magic and then
// nothing is closed at HandshakeTimeout, not held for IOTimeout (the
// finding: 2,000 of them held 30 s each).
func TestHandshakeHasADeadline(t *testing.T) {
	t.Parallel()
	vb, _ := target(t, tcp.Config{HandshakeTimeout: 200 * time.Millisecond, IOTimeout: time.Minute})
	c := magicOnly(t, vb.Addr())
	// 200 ms, with room for a loaded machine; IOTimeout is a minute.
	closedWithin(t, c, 20*time.Second, "a connection that stopped after the magic")
}

// TestHandshakesAreCapped: beyond MaxHandshakes connections in their
// handshake, a new one is closed at once; once they are gone, a peer with
// the secret transfers again.
func TestHandshakesAreCapped(t *testing.T) {
	t.Parallel()
	const limit = 4
	vb, v := target(t, tcp.Config{MaxHandshakes: limit, HandshakeTimeout: time.Minute})
	var held []net.Conn
	for range limit {
		held = append(held, magicOnly(t, vb.Addr()))
	}
	// The accept loop counts connections in the order they came, so the
	// next one is over the cap; it is closed long before the minute of
	// HandshakeTimeout.
	closedWithin(t, magicOnly(t, vb.Addr()), 20*time.Second, "a connection over the cap")

	for _, c := range held {
		c.Close()
	}
	friend := initiator(t, "prefill", func(context.Context, string) ([]byte, error) { return vb.Secret(), nil })
	transfertest.Connect(t, friend, v)
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := transfer.Do(ctxT(t), friend.B, transfer.Xfer{Op: transfer.OpRead, Remote: v.B.AgentName(), Local: friend.Buf.Region(), Dst: v.Buf.Region()})
		if err == nil {
			break
		}
		// The agent notices the held connections closing as it reads
		// them; until then it is still at its cap.
		if !errors.Is(err, transfer.ErrPeerGone) || time.Now().After(deadline) {
			t.Fatalf("READ with the secret after the held connections closed: %v", err)
		}
	}
}

// authenticated opens a connection to the agent and passes its handshake
// with the agent's secret, by hand.
func authenticated(t *testing.T, vb *tcp.Backend, md []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	name, addr, instance, err := tcp.PublishedTarget(md)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var nonce, targetNonce [32]byte
	rand.Read(nonce[:])
	if _, err := c.Write(tcp.Hello("prober", name, instance, nonce)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if st, msg, err := tcp.ReadReply(br); err != nil || st != tcp.StatusOK {
		t.Fatalf("hello: status %d %q %v", st, msg, err)
	}
	if _, err := io.ReadFull(br, targetNonce[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(br, make([]byte, 32)); err != nil { // the target's proof
		t.Fatal(err)
	}
	if _, err := c.Write(tcp.InitiatorProof(vb.Secret(), "prober", name, instance, nonce, targetNonce)); err != nil {
		t.Fatal(err)
	}
	if st, msg, err := tcp.ReadReply(br); err != nil || st != tcp.StatusOK {
		t.Fatalf("proof: status %d %q %v", st, msg, err)
	}
	return c, br
}

// TestSpanCountsAreBoundedByTheRegisteredRegions: an authenticated
// connection announcing 4,194,304 spans (the finding: 64 MiB allocated for
// them, held until the connection closed) to an agent with 64 KiB
// registered is refused at once, before any span is sent, as is one
// announcing more spans than bytes; the agent still serves a real transfer.
func TestSpanCountsAreBoundedByTheRegisteredRegions(t *testing.T) {
	t.Parallel()
	vb, v := target(t, tcp.Config{})
	md := v.Meta(t)
	for name, h := range map[string][]byte{
		"4,194,304 spans of a byte":  tcp.AnnounceHeader(transfer.OpRead, 1<<22, 1<<22),
		"more bytes than registered": tcp.AnnounceHeader(transfer.OpWrite, 1, authBytes+1),
		"more spans than bytes":      tcp.AnnounceHeader(transfer.OpRead, 4096, 4095),
	} {
		c, br := authenticated(t, vb, md)
		if _, err := c.Write(h); err != nil {
			t.Fatal(err)
		}
		st, msg, err := tcp.ReadReply(br)
		if err != nil || st != tcp.StatusInvalid {
			t.Fatalf("%s: status %d %q %v; want the invalid status before any span is sent", name, st, msg, err)
		}
		closedWithin(t, c, 20*time.Second, name)
	}
	friend := initiator(t, "prefill", func(context.Context, string) ([]byte, error) { return vb.Secret(), nil })
	transfertest.Connect(t, friend, v)
	if err := transfer.Do(ctxT(t), friend.B, transfer.Xfer{Op: transfer.OpRead, Remote: v.B.AgentName(), Local: friend.Buf.Region(), Dst: v.Buf.Region()}); err != nil {
		t.Fatalf("READ with the secret: %v", err)
	}
}

// TestATransferOfMoreSpansThanARequestCarries: the initiator splits it
// into requests of at most MaxSpans, and the target has every byte before
// the notification, which comes once.
func TestATransferOfMoreSpansThanARequestCarries(t *testing.T) {
	t.Parallel()
	const spans, size = tcp.MaxSpans + 100, 4
	var vb *tcp.Backend
	v := transfertest.NewAgent(t, func(t testing.TB, name string) transfer.Backend {
		var err error
		if vb, err = tcp.New(tcp.Config{AgentName: name}, zerolog.New(zerolog.NewTestWriter(t))); err != nil {
			t.Fatal(err)
		}
		return vb
	}, transfertest.UniqueName("decode"), spans*size)
	friend := transfertest.NewAgent(t, func(t testing.TB, n string) transfer.Backend {
		b, err := tcp.New(tcp.Config{AgentName: n, RemoteSecret: func(context.Context, string) ([]byte, error) { return vb.Secret(), nil }},
			zerolog.New(zerolog.NewTestWriter(t)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, transfertest.UniqueName("prefill"), spans*size)
	transfertest.Connect(t, friend, v)
	// The target's spans backwards, so that none merges with the next.
	dst, local := transfer.DescList{Kind: v.Buf.Region().Kind}, transfer.DescList{Kind: friend.Buf.Region().Kind}
	for i := range spans {
		dst.Descs = append(dst.Descs, transfer.Desc{Addr: v.Buf.Addr() + uint64(spans-1-i)*size, Len: size})
		local.Descs = append(local.Descs, transfer.Desc{Addr: friend.Buf.Addr() + uint64(i)*size, Len: size})
	}
	transfertest.Fill(friend.Buf.Bytes(), 3)
	// 65,636 spans take a while under the race detector on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := transfer.Do(ctx, friend.B, transfer.Xfer{Op: transfer.OpWrite, Remote: v.B.AgentName(), Local: local, Dst: dst, Notif: []byte("done")}); err != nil {
		t.Fatalf("WRITE of %d spans: %v", spans, err)
	}
	src, got := friend.Buf.Bytes(), v.Buf.Bytes()
	for i := range spans {
		if !bytes.Equal(got[(spans-1-i)*size:(spans-i)*size], src[i*size:(i+1)*size]) {
			t.Fatalf("span %d of %d did not arrive", i, spans)
		}
	}
	notifs, err := v.B.GetNotifs()
	if err != nil || len(notifs) != 1 || string(notifs[0].Msg) != "done" {
		t.Fatalf("notifications %v, %v; want one", notifs, err)
	}
	clear(friend.Buf.Bytes())
	if err := transfer.Do(ctx, friend.B, transfer.Xfer{Op: transfer.OpRead, Remote: v.B.AgentName(), Local: local, Dst: dst}); err != nil {
		t.Fatalf("READ of %d spans: %v", spans, err)
	}
	if err := transfertest.Verify(friend.Buf.Bytes(), 3); err != nil {
		t.Fatalf("READ of %d spans: %v", spans, err)
	}
}
