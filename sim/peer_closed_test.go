//go:build unix

package sim

import (
	"errors"
	"net"
	"syscall"
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
	byteWaiting(t, c)
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

// byteWaiting waits until c has a byte to read, and leaves it there.
func byteWaiting(t *testing.T, c net.Conn) {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	n := 0
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		var rerr error
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing yet: wait until the socket is readable, then ask again.
		return !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK)
	})
	if err != nil || n != 1 {
		t.Fatalf("no byte waiting: %d, %v", n, err)
	}
}
