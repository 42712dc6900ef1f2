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

// StatusInvalid is the status of a request the target refuses as malformed.
const StatusInvalid = stInvalid

// InitiatorProof is the proof an initiator holding secret answers the
// target's challenge with.
func InitiatorProof(secret []byte, initiator, target string, instance uint64, nonce, targetNonce [32]byte) []byte {
	p := proof(secret, roleInitiator, hello{Initiator: initiator, Target: target, Instance: instance, Nonce: nonce}, targetNonce)
	return p[:]
}

// AnnounceHeader encodes a request header announcing spans spans of total
// bytes, without the spans.
func AnnounceHeader(op transfer.Op, spans uint32, total uint64) []byte {
	b := make([]byte, headerBytes)
	putHeader(b, header{Op: op, Spans: spans, Total: total})
	return b
}

// MaxSpans is the most spans one request carries.
const MaxSpans = maxSpans
