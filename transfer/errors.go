package transfer

import (
	"errors"
	"fmt"
)

// Error classes shared by the backends. Backends wrap them with context (and,
// for NIXL, together with the library's *nixl.StatusError), so classify with
// errors.Is.
var (
	// ErrUnknownAgent: no metadata is loaded for the remote agent named.
	ErrUnknownAgent = errors.New("unknown remote agent")
	// ErrOutOfRange: a span lies outside every registered region (local or
	// remote).
	ErrOutOfRange = errors.New("span outside registered memory")
	// ErrInvalidRegion: a region to register is empty, wraps around, or is
	// not one that was registered (on deregistration).
	ErrInvalidRegion = errors.New("invalid memory region")
	// ErrOverlap: a region to register overlaps a registered region.
	ErrOverlap = errors.New("overlapping memory region")
	// ErrInvalidDescs: the lists of a transfer do not pair up.
	ErrInvalidDescs = errors.New("invalid descriptor lists")
	// ErrBadMetadata: metadata that does not decode as any agent's.
	ErrBadMetadata = errors.New("malformed agent metadata")
	// ErrStranger: metadata (or a connection) from an agent other than the
	// one expected, or from an agent instance that is no longer current.
	ErrStranger = errors.New("metadata from an unexpected agent")
	// ErrUnauthenticated: a connection that did not prove it holds the
	// agent's transfer secret (or a remote that did not prove it does).
	ErrUnauthenticated = errors.New("transfer connection not authenticated")
	// ErrPeerGone: the remote agent went away before or during a transfer.
	ErrPeerGone = errors.New("remote agent gone")
	// ErrUnsupportedKind: the backend cannot move this kind of memory.
	ErrUnsupportedKind = errors.New("unsupported memory kind")
	// ErrQueueFull: a worker queue is full; the caller should shed or retry
	// later rather than block.
	ErrQueueFull = errors.New("transfer queue full")
	// ErrClosed: the backend, worker or pool is closed.
	ErrClosed = errors.New("closed")
	// ErrStaleGeneration: a request names an older generation of a peer than
	// the one already loaded.
	ErrStaleGeneration = errors.New("stale peer generation")
)

// MissingMemKindMessage is the exact text SGLang raises (a RuntimeError in
// python/sglang/srt/disaggregation/nixl/conn.py transfer_worker) when a
// destination on a kind-needing path has neither transfer segments nor a
// homogeneous memory kind. The router matches prefill error bodies against
// it.
const MissingMemKindMessage = "Missing NIXL destination KV memory kind"

// MissingMemKindError is the typed form of SGLang's "Missing NIXL destination
// KV memory kind": the destination rank reached the MLA, hybrid-MLA or
// equal-attention-TP path with neither segments nor a homogeneous kind. It
// means the peer's registration on this side never completed; the control
// plane marks the peer stale and asks it to re-register.
type MissingMemKindError struct {
	Agent string // destination agent name
	Path  Path   // the kind-needing path the transfer was on
}

// Error returns exactly MissingMemKindMessage, so that the text matches what
// SGLang engines put in their HTTP 500 bodies.
func (e *MissingMemKindError) Error() string { return MissingMemKindMessage }

// GeometryError says which field of a rank's geometry makes a plan
// impossible.
type GeometryError struct {
	Side   string // "source" or "destination"
	Field  string // e.g. "kv_item_lens"
	Reason string // what is wrong with it
}

// Error names the side, field and reason.
func (e *GeometryError) Error() string {
	return fmt.Sprintf("%s %s: %s", e.Side, e.Field, e.Reason)
}
