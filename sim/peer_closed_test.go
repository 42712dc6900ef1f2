//go:build unix

package sim

import (
	"net"
	"testing"
	"time"
)

// TestPeerClosed: the socket says an open connection is open, with or
// without bytes waiting, and one whose peer closed is closed, without a
// reader having seen the close first (the pushers' send asks it so).
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if peerClosed(c) {
		t.Fatal("an open connection with nothing waiting: closed")
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if peerClosed(c) {
		t.Fatal("an open connection with a byte waiting: closed")
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !peerClosed(c) {
		if time.Now().After(deadline) {
			t.Fatal("the peer's close was not seen within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
