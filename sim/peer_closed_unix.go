//go:build unix

package sim

import (
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether nc's peer has closed its end or the
// connection broke, asking the socket now: a peek that does not wait finds
// the end of the stream, or an error. Bytes waiting, or none yet, mean it
// is open.
func peerClosed(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			closed = n == 0
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		default:
			closed = true
		}
	})
	return closed
}
