package transfer

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// Preflight stages: where a failed preflight stopped. A stage is part of
// the failure's reason, so that a metadata problem, a dead peer and
// corrupted bytes read differently on the page.
const (
	StageMetadata = "metadata" // loading the peer's metadata
	StageWrite    = "write"    // the WRITE of the pattern
	StageRead     = "read"     // the READ back
	StageVerify   = "verify"   // the byte-for-byte comparison
	StageProbe    = "probe"    // the local probe memory (fill, copy back)
)

// PreflightError is a failed preflight: the stage it stopped at, the size
// being moved, and the backend's error.
type PreflightError struct {
	Stage string // one of the Stage constants
	Size  int    // bytes being moved; 0 at StageMetadata
	Err   error  // the backend's error (a NIXL status error, a timeout, ...)
}

// Error names the stage, the size and the cause.
func (e *PreflightError) Error() string {
	if e.Size == 0 {
		return fmt.Sprintf("preflight %s: %v", e.Stage, e.Err)
	}
	return fmt.Sprintf("preflight %s of %d bytes: %v", e.Stage, e.Size, e.Err)
}

// Unwrap returns the backend's error.
func (e *PreflightError) Unwrap() error { return e.Err }

// ErrPatternMismatch: the bytes read back from the peer are not the ones
// written.
var ErrPatternMismatch = errors.New("pattern mismatch")

// ProbeMemory is a registered probe region of one memory kind that the
// preflight can fill and read from the host: a HostBuffer for DRAM, a CUDA
// allocation for VRAM.
type ProbeMemory interface {
	// Region returns the whole region as registered with the backend.
	Region() DescList
	// Len returns its size in bytes.
	Len() int
	// WriteAt copies p into the region at off.
	WriteAt(p []byte, off int) error
	// ReadAt copies the region's bytes at off into p.
	ReadAt(p []byte, off int) error
}

// HostProbe is DRAM probe memory: a HostBuffer.
type HostProbe struct{ *HostBuffer }

// WriteAt copies p into the buffer at off.
func (h HostProbe) WriteAt(p []byte, off int) error {
	if off < 0 || off+len(p) > h.Len() {
		return fmt.Errorf("write %d bytes at %d of %d: %w", len(p), off, h.Len(), ErrOutOfRange)
	}
	copy(h.Bytes()[off:], p)
	return nil
}

// ReadAt copies the buffer's bytes at off into p.
func (h HostProbe) ReadAt(p []byte, off int) error {
	if off < 0 || off+len(p) > h.Len() {
		return fmt.Errorf("read %d bytes at %d of %d: %w", len(p), off, h.Len(), ErrOutOfRange)
	}
	copy(p, h.Bytes()[off:])
	return nil
}

// PreflightPeer is what the control plane carries from the target agent to
// the initiator: its agent name, its metadata, and its registered probe
// region.
type PreflightPeer struct {
	Agent    string
	Metadata []byte
	Region   DescList
}

// PreflightConfig tunes a preflight.
type PreflightConfig struct {
	// MinSize is the first rung of the size ladder; default 4 KiB.
	MinSize int
	// MaxSize is the last rung; default 1 MiB. The local probe region must
	// hold twice MaxSize (the pattern and the read-back), the peer's at
	// least MaxSize.
	MaxSize int
	// Rounds is how many WRITE/READ round trips run at each rung; the
	// fastest counts. Default 3.
	Rounds int
	// Timeout bounds the whole preflight; default 10s.
	Timeout time.Duration
}

// DefaultPreflightMaxSize is the default last rung of the ladder.
const DefaultPreflightMaxSize = 1 << 20

// WithDefaults fills in unset fields.
func (c PreflightConfig) WithDefaults() PreflightConfig {
	if c.MinSize <= 0 {
		c.MinSize = 4 << 10
	}
	if c.MaxSize <= 0 {
		c.MaxSize = DefaultPreflightMaxSize
	}
	if c.MaxSize < c.MinSize {
		c.MaxSize = c.MinSize
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	return c
}

// Ladder returns the sizes a preflight moves: MinSize, ×4 each rung, and
// MaxSize last.
func (c PreflightConfig) Ladder() []int {
	c = c.WithDefaults()
	var out []int
	for s := c.MinSize; s < c.MaxSize; s *= 4 {
		out = append(out, s)
	}
	return append(out, c.MaxSize)
}

// PreflightRung is the measurement at one size: the fastest WRITE and READ.
type PreflightRung struct {
	Size  int
	Write time.Duration
	Read  time.Duration
}

// PreflightResult is the outcome of one preflight. Err is nil when every
// rung wrote, read back and matched.
type PreflightResult struct {
	Remote  string           // the peer's agent name
	MemKind registry.MemKind // the local probe's memory kind
	Rungs   []PreflightRung  // the rungs that passed, smallest first
	// GBps is the throughput at the largest rung that passed: bytes
	// written and read back over the time both took, in 10^9 bytes/s.
	GBps float64
	// Latency is the fastest WRITE at the smallest rung.
	Latency time.Duration
	Err     error // a *PreflightError, or nil
}

// Passed reports whether the preflight succeeded.
func (r PreflightResult) Passed() bool { return r.Err == nil }

// RunPreflight proves the transfer path from b to a peer: it loads the
// peer's metadata, then at every rung of the ladder WRITEs a fresh pattern
// from local into the peer's probe region with a notification, READs it
// back into the second half of local, and compares byte for byte. It never
// blocks past cfg.Timeout and forgets the peer's metadata before it
// returns. The peer's region is shared by every initiator; each one writes
// to its own slot of MaxSize bytes when the region has several.
func RunPreflight(ctx context.Context, b Backend, local ProbeMemory, peer PreflightPeer, cfg PreflightConfig) PreflightResult {
	cfg = cfg.WithDefaults()
	// A peer whose agent runs with a smaller --preflight-max-size holds a
	// smaller region: the ladder stops at what it holds, rather than fail,
	// and keep out of routing, a pair whose path works.
	if d := peer.Region.Descs; len(d) == 1 && d[0].Len < uint64(cfg.MaxSize) && d[0].Len >= uint64(cfg.MinSize) {
		cfg.MaxSize = int(d[0].Len)
	}
	res := PreflightResult{Remote: peer.Agent, MemKind: local.Region().Kind}
	if err := checkProbeSizes(local, peer, cfg); err != nil {
		res.Err = &PreflightError{Stage: StageProbe, Err: err}
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := loadPeerCtx(ctx, b, peer); err != nil {
		res.Err = &PreflightError{Stage: StageMetadata, Err: err}
		return res
	}
	defer b.InvalidateRemote(peer.Agent)
	run := preflightRun{b: b, local: local, peer: peer, cfg: cfg, slot: peerSlot(b.AgentName(), peer, cfg.MaxSize),
		pattern: make([]byte, cfg.MaxSize), back: make([]byte, cfg.MaxSize), zero: make([]byte, cfg.MaxSize)}
	var seed [8]byte
	rand.Read(seed[:])
	run.seed = binary.LittleEndian.Uint64(seed[:])
	for _, size := range cfg.Ladder() {
		rung, err := run.rung(ctx, size)
		if err != nil {
			res.Err = err
			break
		}
		res.Rungs = append(res.Rungs, rung)
	}
	if len(res.Rungs) > 0 {
		first, last := res.Rungs[0], res.Rungs[len(res.Rungs)-1]
		res.Latency = first.Write
		if d := last.Write + last.Read; d > 0 {
			res.GBps = float64(2*last.Size) / d.Seconds() / 1e9
		}
	}
	return res
}

func checkProbeSizes(local ProbeMemory, peer PreflightPeer, cfg PreflightConfig) error {
	if local.Len() < 2*cfg.MaxSize {
		return fmt.Errorf("local probe region of %d bytes holds less than twice the largest rung (%d): %w", local.Len(), cfg.MaxSize, ErrInvalidRegion)
	}
	if len(peer.Region.Descs) != 1 || peer.Region.Descs[0].Len < uint64(cfg.MaxSize) {
		return fmt.Errorf("peer probe region %v is not one span of at least %d bytes: %w", peer.Region.Descs, cfg.MaxSize, ErrInvalidRegion)
	}
	return nil
}

// loadPeerCtx loads the peer's metadata, giving up when ctx ends (a
// backend's load may block on the network). A load that gave up and is
// still running keeps its place: the next preflight of that peer fails at
// once rather than leave one more goroutine behind it, so a peer whose
// metadata load hangs costs one goroutine, not one per retry.
func loadPeerCtx(ctx context.Context, b Backend, peer PreflightPeer) error {
	k := pendingLoad{b, peer.Agent}
	if _, busy := pendingLoads.LoadOrStore(k, struct{}{}); busy {
		return fmt.Errorf("an earlier load of %s's metadata has not returned", peer.Agent)
	}
	done := make(chan error, 1)
	go func() {
		defer pendingLoads.Delete(k)
		// A load left behind by an earlier preflight that gave up must
		// not make this one fail as a duplicate.
		_ = b.InvalidateRemote(peer.Agent)
		done <- LoadPeer(b, peer.Agent, peer.Metadata)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pendingLoads holds the metadata loads (pendingLoad) still running.
var pendingLoads sync.Map

// pendingLoad is one peer's metadata load on one backend.
type pendingLoad struct {
	b     Backend
	agent string
}

// peerSlot picks the initiator's slot in the peer's region, so that
// initiators preflighting one peer at once rarely share bytes; when they do,
// the per-run pattern makes it a mismatch, never a false pass.
func peerSlot(initiator string, peer PreflightPeer, size int) uint64 {
	slots := peer.Region.Descs[0].Len / uint64(size)
	h := fnv.New64a()
	h.Write([]byte(initiator))
	return (h.Sum64() % slots) * uint64(size)
}

type preflightRun struct {
	b     Backend
	local ProbeMemory
	peer  PreflightPeer
	cfg   PreflightConfig
	slot  uint64 // offset of this initiator's slot in the peer's region
	seed  uint64
	round uint64
	// pattern, back and zero are host scratch of MaxSize, reused by every
	// round: the pattern written, the bytes read back, and zeros that
	// clear the read-back region first.
	pattern, back, zero []byte
}

// rung runs cfg.Rounds round trips of size bytes and keeps the fastest.
func (r *preflightRun) rung(ctx context.Context, size int) (PreflightRung, error) {
	out := PreflightRung{Size: size}
	for i := 0; i < r.cfg.Rounds; i++ {
		w, rd, err := r.roundTrip(ctx, size)
		if err != nil {
			return out, err
		}
		if out.Write == 0 || w < out.Write {
			out.Write = w
		}
		if out.Read == 0 || rd < out.Read {
			out.Read = rd
		}
	}
	return out, nil
}

// roundTrip writes a fresh pattern, reads it back and compares.
func (r *preflightRun) roundTrip(ctx context.Context, size int) (time.Duration, time.Duration, error) {
	r.round++
	seed := r.seed + r.round
	pattern, back := r.pattern[:size], r.back[:size]
	FillPattern(pattern, seed)
	fail := func(stage string, err error) (time.Duration, time.Duration, error) {
		return 0, 0, &PreflightError{Stage: stage, Size: size, Err: err}
	}
	if err := r.local.WriteAt(pattern, 0); err != nil {
		return fail(StageProbe, err)
	}
	if err := r.local.WriteAt(r.zero[:size], r.cfg.MaxSize); err != nil {
		return fail(StageProbe, err)
	}
	lr, rr := r.local.Region(), r.peer.Region
	src := Desc{Addr: lr.Descs[0].Addr, Len: uint64(size), DevID: lr.Descs[0].DevID}
	dst := Desc{Addr: lr.Descs[0].Addr + uint64(r.cfg.MaxSize), Len: uint64(size), DevID: lr.Descs[0].DevID}
	far := Desc{Addr: rr.Descs[0].Addr + r.slot, Len: uint64(size), DevID: rr.Descs[0].DevID}
	remote := DescList{Kind: rr.Kind, Descs: []Desc{far}}
	start := time.Now()
	if err := Do(ctx, r.b, Xfer{Op: OpWrite, Remote: r.peer.Agent, Local: DescList{Kind: lr.Kind, Descs: []Desc{src}}, Dst: remote, Notif: PreflightNotif(seed)}); err != nil {
		return fail(StageWrite, err)
	}
	wrote := time.Since(start)
	start = time.Now()
	if err := Do(ctx, r.b, Xfer{Op: OpRead, Remote: r.peer.Agent, Local: DescList{Kind: lr.Kind, Descs: []Desc{dst}}, Dst: remote}); err != nil {
		return fail(StageRead, err)
	}
	read := time.Since(start)
	if err := r.local.ReadAt(back, r.cfg.MaxSize); err != nil {
		return fail(StageProbe, err)
	}
	if err := CheckPattern(back, seed); err != nil {
		return fail(StageVerify, err)
	}
	return wrote, read, nil
}

// PreflightNotifPrefix starts every notification a preflight WRITE
// carries, so that a probe host can tell them from KV traffic.
const PreflightNotifPrefix = "pdplane-preflight:"

// PreflightNotif is the notification of the WRITE that carried seed's
// pattern.
func PreflightNotif(seed uint64) []byte {
	return []byte(PreflightNotifPrefix + strconv.FormatUint(seed, 16))
}

// FillPattern writes a deterministic pseudo-random pattern derived from
// seed into b (xorshift64, eight bytes at a time).
func FillPattern(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x = xorshift(x)
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(seed + uint64(i))
	}
}

func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// CheckPattern checks that b holds FillPattern's pattern for seed, without
// allocating; the error wraps ErrPatternMismatch and names the first byte
// that differs.
func CheckPattern(b []byte, seed uint64) error {
	x := seed*0x9E3779B97F4A7C15 + 1
	var want [8]byte
	for i := 0; i < len(b); i += 8 {
		if i+8 <= len(b) {
			x = xorshift(x)
			if binary.LittleEndian.Uint64(b[i:]) == x {
				continue
			}
			binary.LittleEndian.PutUint64(want[:], x)
		} else {
			for j := i; j < len(b); j++ {
				want[j-i] = byte(seed + uint64(j))
			}
		}
		for j := i; j < len(b) && j < i+8; j++ {
			if b[j] != want[j-i] {
				return fmt.Errorf("byte %d of %d is %#x, want %#x: %w", j, len(b), b[j], want[j-i], ErrPatternMismatch)
			}
		}
	}
	return nil
}
