//go:build unix

package httpwire

import (
	"errors"
	"net"
	"syscall"
)

// connAlive peeks at an idle connection without blocking: a connection the
// engine closed reads as end of file, and one with unexpected bytes is
// unusable; only "nothing to read yet" means it may be reused.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = n < 0 && (errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK))
		return true // never wait for readability
	})
	return err == nil && alive
}

// readable is a RawConn.Read function that returns once the descriptor has
// bytes to read, has reached its end, or has failed: a peek that would block
// makes Read wait for readability and ask again.
func readable(fd uintptr) bool {
	var buf [1]byte
	_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
}

// isConnReset reports a write to a connection the engine already closed.
func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Refused reports an engine that refused a connection or reset it before
// any byte of an answer (on a fresh connection too: see Transport.send):
// nothing serves there now. A reset after an answer began is one request's
// failure, not this.
func Refused(err error) bool {
	var nr *nothingReceivedError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &nr) && errors.Is(nr.err, syscall.ECONNRESET)
}
