package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// The wire format, little endian throughout.
//
// Metadata (what LocalMetadata returns and the control plane carries):
//
//	magic "PDTCPMD1" | u16 len, agent name | u16 len, address | u64 instance |
//	u32 count, count × (u8 kind, u64 addr, u64 len, u64 dev id) | u32 crc32 (IEEE) of all before
//
// Connection hello, initiator to target:
//
//	magic "PDTH" | u8 version | u16 len, initiator name | u16 len, target name | u64 target instance |
//	32 bytes initiator nonce
//
// The target answers with a reply (stStranger for another agent or
// instance); an OK reply is followed by its challenge:
//
//	32 bytes target nonce | 32 bytes target proof
//
// and the initiator, having checked the target's proof, answers with
//
//	32 bytes initiator proof
//
// after which the target sends one more reply (stOK, or stUnauthenticated
// and it hangs up). The proofs are HMAC-SHA256 under the target agent's
// transfer secret (see proof), which only the two agents learn from the
// control plane; the secret itself never crosses the wire, and the agent
// name, address and instance in the published metadata open nothing.
//
// Request, then the payload of a WRITE:
//
//	u8 op | u8 flags (1: notification) | u16 0 | u32 span count | u32 notification length |
//	u64 total bytes | count × (u64 addr, u64 len) | notification
//
// Reply: u8 status | u16 len, message; a successful READ reply is followed by
// the payload.
const (
	mdMagic    = "PDTCPMD1"
	helloMagic = "PDTH"
	version    = 2

	nonceBytes = 32
	proofBytes = sha256.Size

	maxName    = 1024
	maxRegions = 1 << 16
	// maxSpans bounds one request's spans: 1 MiB of them on the wire,
	// some 2.5 MiB at the target while it serves them. An initiator sends
	// a transfer of more as several requests (Backend.run).
	maxSpans    = 1 << 16
	maxNotif    = 1 << 20
	maxMessage  = 1 << 12
	headerBytes = 24
	spanBytes   = 16

	flagNotif = 1
)

// Reply statuses.
const (
	stOK byte = iota
	stOutOfRange
	stInvalid
	stStranger
	stClosing
	stUnauthenticated
)

func statusErr(st byte, msg string) error {
	var class error
	switch st {
	case stOK:
		return nil
	case stOutOfRange:
		class = transfer.ErrOutOfRange
	case stInvalid:
		class = transfer.ErrInvalidDescs
	case stStranger:
		class = transfer.ErrStranger
	case stClosing:
		class = transfer.ErrPeerGone
	case stUnauthenticated:
		class = transfer.ErrUnauthenticated
	default:
		class = transfer.ErrPeerGone
	}
	return fmt.Errorf("remote: %s: %w", msg, class)
}

// metadata is the decoded form of an agent's metadata.
type metadata struct {
	Name     string
	Addr     string
	Instance uint64
	Regions  []transfer.DescList
}

func encodeMetadata(m metadata) []byte {
	b := []byte(mdMagic)
	b = appendString(b, m.Name)
	b = appendString(b, m.Addr)
	b = binary.LittleEndian.AppendUint64(b, m.Instance)
	var n uint32
	for _, l := range m.Regions {
		n += uint32(len(l.Descs))
	}
	b = binary.LittleEndian.AppendUint32(b, n)
	for _, l := range m.Regions {
		for _, d := range l.Descs {
			b = append(b, byte(l.Kind))
			b = binary.LittleEndian.AppendUint64(b, d.Addr)
			b = binary.LittleEndian.AppendUint64(b, d.Len)
			b = binary.LittleEndian.AppendUint64(b, d.DevID)
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

var errShort = errors.New("truncated")

func decodeMetadata(b []byte) (metadata, error) {
	var m metadata
	if len(b) < len(mdMagic)+4 || string(b[:len(mdMagic)]) != mdMagic {
		return m, fmt.Errorf("no tcp metadata magic: %w", transfer.ErrBadMetadata)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return m, fmt.Errorf("checksum mismatch: %w", transfer.ErrBadMetadata)
	}
	r := reader{b: body[len(mdMagic):]}
	m.Name = r.string()
	m.Addr = r.string()
	m.Instance = r.u64()
	n := r.u32()
	if r.err == nil && (n > maxRegions || uint64(n)*25 > uint64(len(r.b))) {
		r.err = fmt.Errorf("%d regions", n)
	}
	byKind := map[registry.MemKind]int{}
	for i := uint32(0); i < n && r.err == nil; i++ {
		k := registry.MemKind(r.u8())
		d := transfer.Desc{Addr: r.u64(), Len: r.u64(), DevID: r.u64()}
		if !k.Valid() {
			r.err = fmt.Errorf("region %d has kind %d", i, int(k))
			break
		}
		j, ok := byKind[k]
		if !ok {
			j = len(m.Regions)
			byKind[k] = j
			m.Regions = append(m.Regions, transfer.DescList{Kind: k})
		}
		m.Regions[j].Descs = append(m.Regions[j].Descs, d)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err == nil && (m.Name == "" || m.Addr == "") {
		r.err = errors.New("empty agent name or address")
	}
	if r.err != nil {
		return metadata{}, fmt.Errorf("decode tcp metadata: %w: %w", r.err, transfer.ErrBadMetadata)
	}
	return m, nil
}

type hello struct {
	Initiator string
	Target    string
	Instance  uint64
	Nonce     [nonceBytes]byte
}

func encodeHello(h hello) []byte {
	b := append([]byte(helloMagic), version)
	b = appendString(b, h.Initiator)
	b = appendString(b, h.Target)
	b = binary.LittleEndian.AppendUint64(b, h.Instance)
	return append(b, h.Nonce[:]...)
}

// Proof roles: the target and the initiator prove knowledge of the secret
// over the same transcript under different labels, so that neither proof
// can be replayed as the other.
const (
	roleTarget    = "pdplane tcp transfer v2 target"
	roleInitiator = "pdplane tcp transfer v2 initiator"
)

// proof is HMAC-SHA256 under secret of the role and the whole handshake:
// both names, the target's instance and both nonces. Fresh nonces on each
// side make every proof single-use.
func proof(secret []byte, role string, h hello, targetNonce [nonceBytes]byte) [proofBytes]byte {
	m := hmac.New(sha256.New, secret)
	msg := appendString(nil, role)
	msg = appendString(msg, h.Initiator)
	msg = appendString(msg, h.Target)
	msg = binary.LittleEndian.AppendUint64(msg, h.Instance)
	msg = append(msg, h.Nonce[:]...)
	msg = append(msg, targetNonce[:]...)
	m.Write(msg)
	var out [proofBytes]byte
	copy(out[:], m.Sum(nil))
	return out
}

func readHello(r io.Reader) (hello, error) {
	var fixed [len(helloMagic) + 1]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return hello{}, err
	}
	if string(fixed[:len(helloMagic)]) != helloMagic || fixed[len(helloMagic)] != version {
		return hello{}, errors.New("not a pdplane tcp transfer hello")
	}
	var h hello
	var err error
	if h.Initiator, err = readString(r); err != nil {
		return hello{}, err
	}
	if h.Target, err = readString(r); err != nil {
		return hello{}, err
	}
	var inst [8]byte
	if _, err := io.ReadFull(r, inst[:]); err != nil {
		return hello{}, err
	}
	h.Instance = binary.LittleEndian.Uint64(inst[:])
	if _, err := io.ReadFull(r, h.Nonce[:]); err != nil {
		return hello{}, err
	}
	return h, nil
}

// header is a decoded request header.
type header struct {
	Op       transfer.Op
	HasNotif bool
	Spans    uint32
	NotifLen uint32
	Total    uint64
}

func putHeader(b []byte, h header) {
	b[0] = byte(h.Op)
	b[1] = 0
	if h.HasNotif {
		b[1] = flagNotif
	}
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.Spans)
	binary.LittleEndian.PutUint32(b[8:], h.NotifLen)
	binary.LittleEndian.PutUint32(b[12:], 0)
	binary.LittleEndian.PutUint64(b[16:], h.Total)
}

func parseHeader(b []byte) (header, error) {
	h := header{
		Op:       transfer.Op(b[0]),
		HasNotif: b[1]&flagNotif != 0,
		Spans:    binary.LittleEndian.Uint32(b[4:]),
		NotifLen: binary.LittleEndian.Uint32(b[8:]),
		Total:    binary.LittleEndian.Uint64(b[16:]),
	}
	switch {
	case h.Op != transfer.OpRead && h.Op != transfer.OpWrite:
		return h, fmt.Errorf("op %d", b[0])
	case h.Spans == 0 || h.Spans > maxSpans:
		return h, fmt.Errorf("%d spans", h.Spans)
	case h.NotifLen > maxNotif:
		return h, fmt.Errorf("notification of %d bytes", h.NotifLen)
	case !h.HasNotif && h.NotifLen != 0:
		return h, errors.New("notification bytes without the notification flag")
	}
	return h, nil
}

// spanChunk is how many spans readSpans reads at a time (64 KiB of them).
const spanChunk = 4096

// errBadSpans marks spans that are not what the header says.
var errBadSpans = errors.New("bad spans")

// readSpans reads count spans that must add up to total bytes. The spans
// are read spanChunk at a time and the slice grows as they arrive, so that
// what a header announces costs nothing until its bytes have come. An
// error wraps errBadSpans when the spans are wrong, and is the read's
// otherwise.
func readSpans(r io.Reader, count uint32, total uint64) ([]transfer.Desc, error) {
	first := min(int(count), spanChunk)
	ds := make([]transfer.Desc, 0, first)
	buf := make([]byte, first*spanBytes)
	var sum uint64
	for left := int(count); left > 0; {
		n := min(left, spanChunk)
		if _, err := io.ReadFull(r, buf[:n*spanBytes]); err != nil {
			return nil, err
		}
		chunk, err := decodeSpans(buf[:n*spanBytes])
		if err != nil {
			return nil, fmt.Errorf("%w: from span %d: %w", errBadSpans, len(ds), err)
		}
		for _, d := range chunk {
			if sum+d.Len < sum || sum+d.Len > total {
				return nil, fmt.Errorf("%w: spans add up to more than the %d bytes the header says", errBadSpans, total)
			}
			sum += d.Len
		}
		ds = append(ds, chunk...)
		left -= n
	}
	if sum != total {
		return nil, fmt.Errorf("%w: spans add up to %d bytes, header says %d", errBadSpans, sum, total)
	}
	return ds, nil
}

// readUpTo reads n bytes, growing its buffer as they arrive rather than
// allocating n at once.
func readUpTo(r io.Reader, n int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err == nil && len(b) < n {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// decodeSpans decodes the spans of b, none of zero length.
func decodeSpans(b []byte) ([]transfer.Desc, error) {
	ds := make([]transfer.Desc, len(b)/spanBytes)
	for i := range ds {
		ds[i] = transfer.Desc{Addr: binary.LittleEndian.Uint64(b[i*spanBytes:]), Len: binary.LittleEndian.Uint64(b[i*spanBytes+8:])}
		if ds[i].Len == 0 {
			return nil, fmt.Errorf("span %d has zero length", i)
		}
	}
	return ds, nil
}

// parseSpans decodes count spans and checks that they add up to total.
func parseSpans(b []byte, total uint64) ([]transfer.Desc, error) {
	ds, err := decodeSpans(b)
	if err != nil {
		return nil, err
	}
	var sum uint64
	for _, d := range ds {
		if sum+d.Len < sum {
			return nil, errors.New("span lengths overflow")
		}
		sum += d.Len
	}
	if sum != total {
		return nil, fmt.Errorf("spans add up to %d bytes, header says %d", sum, total)
	}
	return ds, nil
}

func appendReply(b []byte, st byte, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = append(b, st)
	return appendString(b, msg)
}

func readReply(r io.Reader) (byte, string, error) {
	var st [1]byte
	if _, err := io.ReadFull(r, st[:]); err != nil {
		return 0, "", err
	}
	msg, err := readString(r)
	if err != nil {
		return 0, "", err
	}
	return st[0], msg, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func readString(r io.Reader) (string, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	l := binary.LittleEndian.Uint16(n[:])
	if l > maxMessage {
		return "", fmt.Errorf("string of %d bytes", l)
	}
	b := make([]byte, l)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// reader decodes from a byte slice, remembering the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = errShort
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() byte {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *reader) string() string {
	var n uint16
	if v := r.take(2); v != nil {
		n = binary.LittleEndian.Uint16(v)
	}
	if r.err == nil && n > maxName {
		r.err = fmt.Errorf("name of %d bytes", n)
		return ""
	}
	return string(r.take(int(n)))
}
