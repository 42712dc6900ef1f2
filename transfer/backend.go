package transfer

import (
	"context"
	"fmt"

	"github.com/pdplane/pdplane/registry"
)

// Op is the direction of a transfer, numbered as NIXL numbers nixl_xfer_op_t.
type Op int

// Transfer directions.
const (
	// OpRead copies remote memory into local memory.
	OpRead Op = 0
	// OpWrite copies local memory into remote memory.
	OpWrite Op = 1
)

// String returns "READ" or "WRITE".
func (o Op) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Desc is one contiguous span of memory: an address, a length in bytes and a
// device id (the GPU index for VRAM, 0 for DRAM).
type Desc struct {
	Addr  uint64 `json:"addr"`   // first byte
	Len   uint64 `json:"len"`    // length in bytes
	DevID uint64 `json:"dev_id"` // GPU index for VRAM, 0 for DRAM
}

// End returns the first address past the span.
func (d Desc) End() uint64 { return d.Addr + d.Len }

// DescList is a list of spans that all live in one kind of memory, the unit
// in which backends register memory and describe transfers.
type DescList struct {
	Kind  registry.MemKind `json:"kind"`  // the memory kind of every span
	Descs []Desc           `json:"descs"` // the spans, in transfer order
}

// Bytes returns the total length of the spans.
func (l DescList) Bytes() uint64 {
	var n uint64
	for _, d := range l.Descs {
		n += d.Len
	}
	return n
}

// Notif is a notification a remote agent attached to a transfer that targeted
// this agent; it is delivered only after the transfer's bytes are in place.
type Notif struct {
	Agent string // name of the agent that initiated the transfer
	Msg   []byte // the message it attached
}

// Xfer describes one transfer between this agent's memory and a remote
// agent's memory. Local and Remote must have the same number of spans, and
// the i-th spans must have equal lengths.
type Xfer struct {
	Op     Op       // READ or WRITE
	Remote string   // name of the remote agent, as LoadRemoteMetadata returned it
	Local  DescList // this agent's spans
	Dst    DescList // the remote agent's spans
	// Notif, when not nil, is delivered to the remote agent once the transfer
	// is complete (an empty, non-nil slice sends an empty notification).
	Notif []byte
}

// Request is a posted transfer.
type Request interface {
	// Wait blocks until the transfer completes, fails, or ctx is done, and
	// releases the request. It is safe to call more than once; later calls
	// return the first result.
	Wait(ctx context.Context) error
}

// Prepared is a pair of descriptor lists (local and remote) prepared once
// for a remote agent, from which transfers pick spans by index. It belongs to
// one remote agent and must be released before that agent's metadata is
// invalidated.
type Prepared interface {
	// Post starts a transfer of the spans local[localIdx[i]] <-> remote[remoteIdx[i]].
	Post(ctx context.Context, op Op, localIdx, remoteIdx []int, notif []byte) (Request, error)
	// Release frees the prepared lists. It is idempotent.
	Release() error
}

// Backend moves bytes between registered memory of this agent and registered
// memory of remote agents, and delivers notifications. Both the NIXL binding
// and the pure-Go TCP backend implement it; both are safe for concurrent use.
type Backend interface {
	// AgentName returns this agent's name, the one remote agents see.
	AgentName() string
	// RegisterMemory registers regions so that they can be transferred from
	// and to. Regions must have a non-zero length and must not overlap
	// regions already registered. The memory must stay mapped until it is
	// deregistered.
	RegisterMemory(regions DescList) error
	// DeregisterMemory deregisters regions registered earlier, exactly as
	// they were registered.
	DeregisterMemory(regions DescList) error
	// LocalMetadata returns this agent's metadata: an opaque blob the
	// control plane carries to remote agents. Take it after registering
	// memory.
	LocalMetadata() ([]byte, error)
	// LoadRemoteMetadata loads a remote agent's metadata and returns the
	// remote agent's name.
	LoadRemoteMetadata(md []byte) (string, error)
	// InvalidateRemote forgets a remote agent's metadata. Prepared lists for
	// that agent must have been released first.
	InvalidateRemote(agent string) error
	// Post starts a transfer.
	Post(ctx context.Context, x Xfer) (Request, error)
	// Prepare prepares descriptor lists for repeated transfers to one remote
	// agent.
	Prepare(remote string, local, dst DescList) (Prepared, error)
	// GetNotifs drains the notifications received since the last call.
	GetNotifs() ([]Notif, error)
	// Close releases everything the backend holds (prepared lists, requests,
	// registrations, connections) in order. It is idempotent.
	Close() error
}

// Doer is implemented by backends that can run a transfer on the calling
// goroutine more cheaply than Post followed by Wait.
type Doer interface {
	Do(ctx context.Context, x Xfer) error
}

// Do runs x to completion: through the backend's Doer when it has one,
// else Post and Wait.
func Do(ctx context.Context, b Backend, x Xfer) error {
	if d, ok := b.(Doer); ok {
		return d.Do(ctx, x)
	}
	r, err := b.Post(ctx, x)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// LoadPeer loads md into b and checks that it belongs to the agent the
// control plane said it would (want). Metadata of any other agent is a
// stranger's: it is invalidated again and the call fails with ErrStranger.
func LoadPeer(b Backend, want string, md []byte) error {
	got, err := b.LoadRemoteMetadata(md)
	if err != nil {
		return err
	}
	if got != want {
		if err := b.InvalidateRemote(got); err != nil {
			return fmt.Errorf("metadata of agent %q where %q was expected: %w (and invalidating it: %w)", got, want, ErrStranger, err)
		}
		return fmt.Errorf("metadata of agent %q where %q was expected: %w", got, want, ErrStranger)
	}
	return nil
}

// CheckXfer checks the shape of a transfer: a known direction, equal span
// counts, pairwise equal lengths, no zero-length span.
func CheckXfer(x Xfer) error {
	if x.Op != OpRead && x.Op != OpWrite {
		return fmt.Errorf("transfer op %d: %w", int(x.Op), ErrInvalidDescs)
	}
	return CheckPairs(x.Local, x.Dst)
}

// CheckPairs checks that two lists pair up span by span.
func CheckPairs(local, remote DescList) error {
	if len(local.Descs) != len(remote.Descs) {
		return fmt.Errorf("%d local spans against %d remote spans: %w", len(local.Descs), len(remote.Descs), ErrInvalidDescs)
	}
	if len(local.Descs) == 0 {
		return fmt.Errorf("no spans: %w", ErrInvalidDescs)
	}
	for i := range local.Descs {
		if local.Descs[i].Len != remote.Descs[i].Len {
			return fmt.Errorf("span %d: local length %d, remote length %d: %w", i, local.Descs[i].Len, remote.Descs[i].Len, ErrInvalidDescs)
		}
		if local.Descs[i].Len == 0 {
			return fmt.Errorf("span %d has zero length: %w", i, ErrInvalidDescs)
		}
	}
	return nil
}

// SelectPairs picks local[localIdx[i]] and remote[remoteIdx[i]] into a pair
// of lists, merging neighbours that are contiguous on both sides.
func SelectPairs(local, remote DescList, localIdx, remoteIdx []int) (DescList, DescList, error) {
	if len(localIdx) != len(remoteIdx) {
		return DescList{}, DescList{}, fmt.Errorf("%d local indices against %d remote indices: %w", len(localIdx), len(remoteIdx), ErrInvalidDescs)
	}
	if len(localIdx) == 0 {
		return DescList{}, DescList{}, fmt.Errorf("no indices: %w", ErrInvalidDescs)
	}
	l := DescList{Kind: local.Kind, Descs: make([]Desc, 0, len(localIdx))}
	r := DescList{Kind: remote.Kind, Descs: make([]Desc, 0, len(remoteIdx))}
	for i := range localIdx {
		li, ri := localIdx[i], remoteIdx[i]
		if li < 0 || li >= len(local.Descs) || ri < 0 || ri >= len(remote.Descs) {
			return DescList{}, DescList{}, fmt.Errorf("index pair %d (%d, %d) outside prepared lists of %d and %d: %w", i, li, ri, len(local.Descs), len(remote.Descs), ErrOutOfRange)
		}
		ld, rd := local.Descs[li], remote.Descs[ri]
		if ld.Len != rd.Len {
			return DescList{}, DescList{}, fmt.Errorf("index pair %d: local length %d, remote length %d: %w", i, ld.Len, rd.Len, ErrInvalidDescs)
		}
		if n := len(l.Descs); n > 0 && l.Descs[n-1].End() == ld.Addr && r.Descs[n-1].End() == rd.Addr &&
			l.Descs[n-1].DevID == ld.DevID && r.Descs[n-1].DevID == rd.DevID {
			l.Descs[n-1].Len += ld.Len
			r.Descs[n-1].Len += rd.Len
			continue
		}
		l.Descs = append(l.Descs, ld)
		r.Descs = append(r.Descs, rd)
	}
	return l, r, nil
}
