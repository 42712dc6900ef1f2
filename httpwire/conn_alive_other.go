//go:build !unix

package httpwire

import "net"

// connAlive cannot peek without blocking here; a closed connection is found
// on use instead, and the request is sent again once.
func connAlive(net.Conn) bool { return true }

func isConnReset(error) bool { return false }

// readable cannot peek without blocking here: it never waits, and the read
// that follows waits with its buffer.
func readable(uintptr) bool { return true }

// Refused reports an engine that refused a connection or reset it before
// answering: not told apart from other failures here.
func Refused(error) bool { return false }
