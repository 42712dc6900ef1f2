// Package zmtp hardens go-zeromq's connections: ZMTP 3.x, the wire of
// ZeroMQ (SGLang's bootstrap plane, vLLM's KV events).
package zmtp

import (
	"bufio"
	"fmt"
	"net"
)

// ZMTP 3.x framing (rfc.zeromq.org/spec/23): a 64-byte greeting, then
// frames of a flags byte, a size of one byte (eight with the LONG flag,
// big-endian) and the body; commands (READY, PING) are framed the same.
const (
	zmtpGreetingLen = 64
	zmtpMoreFlag    = 0x01
	zmtpLongFlag    = 0x02
)

// guard is a connection read through a buffer that follows
// the ZMTP stream and refuses a message (its frames together) larger than
// max before go-zeromq reads the body that passes it: go-zeromq makes a
// buffer of whatever size a frame's header names (up to 2^63 bytes) and
// keeps a message's frames until its last, so one header, or a message of
// endless frames, from anyone who can reach the socket would end the
// process for want of memory. (libzmq, without ZMQ_MAXMSGSIZE, bounds
// nothing either.)
type guard struct {
	net.Conn
	r   *bufio.Reader
	max uint64
	err error // the refusal, returned from then on

	greeting int    // greeting bytes still to pass
	sizeLeft int    // size bytes still to come
	size     uint64 // the size read so far
	body     uint64 // body bytes still to pass
	more     bool   // the current frame is not its message's last
	message  uint64 // the sizes of the current message's frames so far
}

// Guard returns c read through a guard that refuses, with an error from
// Read, a message (its frames together) larger than max bytes, before
// go-zeromq allocates for it.
func Guard(c net.Conn, max uint64) net.Conn {
	return &guard{Conn: c, r: bufio.NewReaderSize(c, 32<<10), max: max, greeting: zmtpGreetingLen}
}

// Read hands on what it read unless it completes a frame header that
// takes its message past max: then nothing, and an error, so that
// go-zeromq allocates nothing more.
func (g *guard) Read(b []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(b)
	if g.err = g.follow(b[:n]); g.err != nil {
		return 0, g.err
	}
	return n, err
}

// follow advances through p, the next bytes of the stream.
func (g *guard) follow(p []byte) error {
	for len(p) > 0 {
		switch {
		case g.greeting > 0:
			k := min(g.greeting, len(p))
			g.greeting -= k
			p = p[k:]
		case g.body > 0:
			k := min(g.body, uint64(len(p)))
			g.body -= k
			p = p[k:]
		case g.sizeLeft > 0:
			g.size = g.size<<8 | uint64(p[0])
			g.sizeLeft--
			p = p[1:]
			if g.sizeLeft == 0 {
				if g.size > g.max-g.message {
					return fmt.Errorf("zmtp: a frame of %d bytes takes its message over the limit of %d", g.size, g.max)
				}
				g.message += g.size
				g.body = g.size
			}
		default: // a frame's flags
			if !g.more {
				g.message = 0 // a new message
			}
			g.more = p[0]&zmtpMoreFlag != 0
			g.size, g.sizeLeft = 0, 1
			if p[0]&zmtpLongFlag != 0 {
				g.sizeLeft = 8
			}
			p = p[1:]
		}
	}
	return nil
}
