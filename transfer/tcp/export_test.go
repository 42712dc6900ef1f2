package tcp

import (
	"encoding/binary"
	"io"

	"github.com/pdplane/pdplane/transfer"
)

// What the tests of the handshake need of the wire format: a stranger reads
// the published metadata and speaks the protocol by hand.

// Reply statuses the tests look for.
const (
	StatusOK              = stOK
	StatusUnauthenticated = stUnauthenticated
)

// PublishedTarget is what anyone learns from an agent's published metadata.
func PublishedTarget(md []byte) (name, addr string, instance uint64, err error) {
	m, err := decodeMetadata(md)
	return m.Name, m.Addr, m.Instance, err
}

// Hello encodes the opening of a connection to the named target.
func Hello(initiator, target string, instance uint64, nonce [32]byte) []byte {
	return encodeHello(hello{Initiator: initiator, Target: target, Instance: instance, Nonce: nonce})
}

// Metadata encodes metadata that sends initiators to addr.
func Metadata(name, addr string, instance uint64, regions ...transfer.DescList) []byte {
	return encodeMetadata(metadata{Name: name, Addr: addr, Instance: instance, Regions: regions})
}

// OKReply encodes a successful status reply.
func OKReply() []byte { return appendReply(nil, stOK, "") }

// ReadReply reads a status reply.
func ReadReply(r io.Reader) (byte, string, error) { return readReply(r) }

// RequestHeader encodes a request header of one span.
func RequestHeader(op transfer.Op, addr, n uint64) []byte {
	b := make([]byte, headerBytes+spanBytes)
	putHeader(b, header{Op: op, Spans: 1, Total: n})
	binary.LittleEndian.PutUint64(b[headerBytes:], addr)
	binary.LittleEndian.PutUint64(b[headerBytes+8:], n)
	return b
}
