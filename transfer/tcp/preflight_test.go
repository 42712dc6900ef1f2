package tcp_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/tcp"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// TestPreflightSilentPeer: a peer that accepts connections and never
// answers fails the preflight at its deadline instead of hanging it.
func TestPreflightSilentPeer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	defer func() { ln.Close(); <-done }()
	cfg := transfertest.PreflightConfig()
	cfg.Timeout = 300 * time.Millisecond
	p := transfertest.NewProbePair(t, newBackend, cfg)
	peer, err := p.Target.Peer()
	if err != nil {
		t.Fatal(err)
	}
	name, _, instance, err := tcp.PublishedTarget(peer.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	peer.Metadata = tcp.Metadata(name, ln.Addr().String(), instance, peer.Region)
	res := transfer.RunPreflight(context.Background(), p.From, p.Local, peer, cfg)
	transfertest.ExpectStage(t, res, transfer.StageWrite, nil)
}
