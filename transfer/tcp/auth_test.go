package tcp_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

const authBytes = 64 << 10

// victim is a decode-side agent with a random secret (as a real one has)
// and a KV area full of a known pattern.
func victim(t *testing.T) (*tcp.Backend, *transfertest.Agent) {
	t.Helper()
	var b *tcp.Backend
	a := transfertest.NewAgent(t, func(t testing.TB, name string) transfer.Backend {
		var err error
		if b, err = tcp.New(tcp.Config{AgentName: name}, zerolog.New(zerolog.NewTestWriter(t))); err != nil {
			t.Fatal(err)
		}
		return b
	}, transfertest.UniqueName("decode"), authBytes)
	transfertest.Fill(a.Buf.Bytes(), 42)
	return b, a
}

// initiator is an agent that resolves the victim's secret with resolve.
func initiator(t *testing.T, name string, resolve func(context.Context, string) ([]byte, error)) *transfertest.Agent {
	t.Helper()
	return transfertest.NewAgent(t, func(t testing.TB, n string) transfer.Backend {
		b, err := tcp.New(tcp.Config{AgentName: n, RemoteSecret: resolve}, zerolog.New(zerolog.NewTestWriter(t)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, transfertest.UniqueName(name), authBytes)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestPublishedMetadataOpensNothing pins the closed transfer plane: an agent
// that has a decode's published metadata (name, address, instance, regions)
// but not its transfer secret can neither READ nor WRITE its KV memory, with
// a wrong secret, with none, or speaking the protocol by hand; one that
// learned the secret can.
func TestPublishedMetadataOpensNothing(t *testing.T) {
	t.Parallel()
	vb, v := victim(t)
	wrong := func(context.Context, string) ([]byte, error) { return bytes.Repeat([]byte{7}, 32), nil }
	for name, resolve := range map[string]func(context.Context, string) ([]byte, error){
		"a wrong secret": wrong,
		"no secret":      nil,
	} {
		thief := initiator(t, "thief", resolve)
		transfertest.Connect(t, thief, v)
		err := transfer.Do(ctxT(t), thief.B, transfer.Xfer{Op: transfer.OpRead, Remote: v.B.AgentName(), Local: thief.Buf.Region(), Dst: v.Buf.Region()})
		if !errors.Is(err, transfer.ErrUnauthenticated) {
			t.Fatalf("READ with %s: err = %v, want ErrUnauthenticated", name, err)
		}
		if !bytes.Equal(thief.Buf.Bytes(), make([]byte, authBytes)) {
			t.Fatalf("READ with %s brought bytes of the decode's KV", name)
		}
		transfertest.Fill(thief.Buf.Bytes(), 666)
		err = transfer.Do(ctxT(t), thief.B, transfer.Xfer{Op: transfer.OpWrite, Remote: v.B.AgentName(), Local: thief.Buf.Region(), Dst: v.Buf.Region(), Notif: []byte("x")})
		if !errors.Is(err, transfer.ErrUnauthenticated) {
			t.Fatalf("WRITE with %s: err = %v, want ErrUnauthenticated", name, err)
		}
		if err := transfertest.Verify(v.Buf.Bytes(), 42); err != nil {
			t.Fatalf("WRITE with %s changed the decode's KV: %v", name, err)
		}
	}

	// By hand: the hello from the published metadata, then a READ request
	// where the proof belongs, and then a guessed proof.
	md := v.Meta(t)
	name, addr, instance, err := tcp.PublishedTarget(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, after := range [][]byte{
		tcp.RequestHeader(transfer.OpRead, v.Buf.Addr(), authBytes)[:32],
		make([]byte, 32),
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var nonce [32]byte
		rand.Read(nonce[:])
		if _, err := c.Write(tcp.Hello("thief", name, instance, nonce)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		if st, msg, err := tcp.ReadReply(br); err != nil || st != tcp.StatusOK {
			t.Fatalf("hello: status %d %q %v", st, msg, err)
		}
		if _, err := io.ReadFull(br, make([]byte, 64)); err != nil { // the challenge
			t.Fatal(err)
		}
		if _, err := c.Write(append(after, tcp.RequestHeader(transfer.OpRead, v.Buf.Addr(), authBytes)...)); err != nil {
			t.Fatal(err)
		}
		st, _, err := tcp.ReadReply(br)
		if err != nil || st != tcp.StatusUnauthenticated {
			t.Fatalf("a forged proof: status %d, err %v; want the unauthenticated status", st, err)
		}
		if rest, _ := io.ReadAll(br); len(rest) > 0 {
			t.Fatalf("the decode sent %d bytes after refusing the proof", len(rest))
		}
		c.Close()
	}

	// The control: whoever learned the secret from the control plane
	// reads the KV.
	friend := initiator(t, "prefill", func(_ context.Context, agent string) ([]byte, error) {
		if agent != v.B.AgentName() {
			return nil, errors.New("unknown agent")
		}
		return vb.Secret(), nil
	})
	transfertest.Connect(t, friend, v)
	if err := transfer.Do(ctxT(t), friend.B, transfer.Xfer{Op: transfer.OpRead, Remote: v.B.AgentName(), Local: friend.Buf.Region(), Dst: v.Buf.Region()}); err != nil {
		t.Fatalf("READ with the secret: %v", err)
	}
	if err := transfertest.Verify(friend.Buf.Bytes(), 42); err != nil {
		t.Fatalf("READ with the secret: %v", err)
	}
}

// TestImpostorTargetGetsNoBytes pins the other direction: an initiator
// whose metadata points at a listener that cannot prove the agent's secret
// (a stale address reused, forged metadata) refuses it and sends no KV.
func TestImpostorTargetGetsNoBytes(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		// Answer OK and a challenge with a made-up proof, then count what
		// the initiator still sends until it hangs up.
		challenge := append(tcp.OKReply(), make([]byte, 64)...)
		rand.Read(challenge[len(challenge)-64:])
		c.Write(challenge)
		n, _ := io.Copy(io.Discard, c)
		got <- int(n)
	}()

	secret := bytes.Repeat([]byte{9}, 32)
	a := initiator(t, "prefill", func(context.Context, string) ([]byte, error) { return secret, nil })
	region := transfer.DescList{Kind: a.Buf.Region().Kind, Descs: []transfer.Desc{{Addr: 0x10000, Len: authBytes}}}
	md := tcp.Metadata("decode-impostor", ln.Addr().String(), 7, region)
	if err := transfer.LoadPeer(a.B, "decode-impostor", md); err != nil {
		t.Fatal(err)
	}
	transfertest.Fill(a.Buf.Bytes(), 5)
	err = transfer.Do(ctxT(t), a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: "decode-impostor", Local: a.Buf.Region(), Dst: region})
	if !errors.Is(err, transfer.ErrUnauthenticated) {
		t.Fatalf("WRITE to an impostor: err = %v, want ErrUnauthenticated", err)
	}
	helloLen := len(tcp.Hello(a.B.AgentName(), "decode-impostor", 7, [32]byte{}))
	if n := <-got; n != helloLen {
		t.Fatalf("the impostor received %d bytes, want only the %d-byte hello", n, helloLen)
	}
}
