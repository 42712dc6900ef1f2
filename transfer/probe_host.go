package transfer

import (
	"bytes"
	"fmt"
	"sync"
)

// ProbeHost is the target side of preflights: a backend with a registered
// probe region that initiators write to and read back, and a count of the
// preflight notifications that arrived. An agent hosts one for the memory
// kind its engine uses.
type ProbeHost struct {
	b   Backend
	mem ProbeMemory

	mu         sync.Mutex
	registered bool
	notifs     int
}

// NewProbeHost registers mem with b.
func NewProbeHost(b Backend, mem ProbeMemory) (*ProbeHost, error) {
	if err := b.RegisterMemory(mem.Region()); err != nil {
		return nil, fmt.Errorf("register probe region: %w", err)
	}
	return &ProbeHost{b: b, mem: mem, registered: true}, nil
}

// Backend returns the backend the probe region is registered with.
func (h *ProbeHost) Backend() Backend { return h.b }

// Peer returns what an initiator needs to preflight this host: the agent
// name, fresh metadata and the probe region.
func (h *ProbeHost) Peer() (PreflightPeer, error) {
	md, err := h.b.LocalMetadata()
	if err != nil {
		return PreflightPeer{}, fmt.Errorf("probe metadata: %w", err)
	}
	return PreflightPeer{Agent: h.b.AgentName(), Metadata: md, Region: h.mem.Region()}, nil
}

// DrainNotifs takes the notifications received since the last call and
// returns how many preflight notifications arrived in total.
func (h *ProbeHost) DrainNotifs() (int, error) {
	ns, err := h.b.GetNotifs()
	if err != nil {
		return 0, fmt.Errorf("drain probe notifications: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range ns {
		if bytes.HasPrefix(n.Msg, []byte(PreflightNotifPrefix)) {
			h.notifs++
		}
	}
	return h.notifs, nil
}

// Deregister takes the probe region away from the backend, so that every
// preflight against this host fails; it is how an operator (or a test)
// proves that a broken side turns its pairs red. It is idempotent.
func (h *ProbeHost) Deregister() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.registered {
		return nil
	}
	if err := h.b.DeregisterMemory(h.mem.Region()); err != nil {
		return fmt.Errorf("deregister probe region: %w", err)
	}
	h.registered = false
	return nil
}

// Close deregisters the probe region; the caller closes the backend and
// frees the memory afterwards.
func (h *ProbeHost) Close() error { return h.Deregister() }
