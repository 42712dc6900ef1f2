package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdplane/pdplane/transfer"
)

// Room bookkeeping of both sides of SGLang's bootstrap protocol, and the
// blocks a vLLM prefill holds for its decodes. Rooms are created by
// whichever side arrives first and removed by whichever gives up last; every
// wait is bounded by the room timeout, so pages never leak.

var (
	errRoomTimeout      = errors.New("room timed out waiting for its counterpart")
	errPrefillCancelled = errors.New("the prefill request was cancelled")
	errDecodeLeft       = errors.New("the decode left the room")
	errRoomInUse        = errors.New("room already has a decode")
)

// roomMsg is what a decode posts to a prefill's bootstrap server for one
// request: where the room's KV must go.
type roomMsg struct {
	Room      uint64 `json:"room"`
	AgentName string `json:"agent_name"`
	PeerID    string `json:"peer_id,omitempty"`
	Pages     []int  `json:"pages"`
}

// roomResult is the prefill's answer to a roomMsg, sent once the room's
// transfer is over.
type roomResult struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// MissingMemKind: the transfer raised SGLang's "Missing NIXL
	// destination KV memory kind".
	MissingMemKind bool `json:"missing_mem_kind,omitempty"`
}

// prefillRoom is one room on a prefill.
type prefillRoom struct {
	id      uint64
	dst     *roomMsg      // set by the decode
	dstSet  chan struct{} // closed when dst is set
	claimed chan struct{} // closed when the prefill takes dst
	result  chan error    // the transfer's outcome, for the decode; cap 1
	gone    bool          // out of the table
	claimOK bool
}

// prefillRooms is a prefill's table of rooms. Rooms the prefill gave up on
// leave a tombstone for a while, so that a decode arriving late hears why
// at once instead of waiting for the room timeout.
type prefillRooms struct {
	mu   sync.Mutex
	m    map[uint64]*prefillRoom
	dead map[uint64]deadRoom
	ttl  time.Duration
}

type deadRoom struct {
	why   error
	until time.Time
}

// maxDeadRooms bounds the tombstones; expired ones are pruned beyond it.
const maxDeadRooms = 4096

func (t *prefillRooms) init(ttl time.Duration) {
	t.m = map[uint64]*prefillRoom{}
	t.dead = map[uint64]deadRoom{}
	t.ttl = ttl
}

func (t *prefillRooms) getLocked(id uint64) *prefillRoom {
	r, ok := t.m[id]
	if !ok {
		r = &prefillRoom{id: id, dstSet: make(chan struct{}), claimed: make(chan struct{}), result: make(chan error, 1)}
		t.m[id] = r
	}
	return r
}

// get returns the room, creating it (and forgetting an old tombstone: the
// prefill takes the room up again).
func (t *prefillRooms) get(id uint64) *prefillRoom {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.dead, id)
	return t.getLocked(id)
}

// fail gives up on room id before the prefill ever waited in it.
func (t *prefillRooms) fail(id uint64, why error) { t.drop(t.get(id), why) }

// attach records a decode's destination in its room; a room the prefill
// gave up on answers why.
func (t *prefillRooms) attach(m *roomMsg) (*prefillRoom, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d, ok := t.dead[m.Room]; ok {
		delete(t.dead, m.Room)
		if time.Now().Before(d.until) {
			return nil, &roomDroppedError{why: d.why}
		}
	}
	r := t.getLocked(m.Room)
	if r.dst != nil {
		return nil, errRoomInUse
	}
	r.dst = m
	close(r.dstSet)
	return r, nil
}

// claim takes the destination for the prefill; false when the decode gave
// up meanwhile.
func (t *prefillRooms) claim(r *prefillRoom) (*roomMsg, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.gone || r.claimOK {
		return nil, false
	}
	r.claimOK = true
	close(r.claimed)
	r.gone = true
	if t.m[r.id] == r {
		delete(t.m, r.id)
	}
	return r.dst, true
}

// drop removes a room the prefill gives up on before claiming it, telling
// an attached decode why, or leaving a tombstone for one yet to come.
func (t *prefillRooms) drop(r *prefillRoom, why error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.claimOK {
		return
	}
	if t.m[r.id] == r {
		delete(t.m, r.id)
	}
	r.gone = true
	if r.dst != nil {
		select {
		case r.result <- why:
		default:
		}
		return
	}
	now := time.Now()
	if len(t.dead) >= maxDeadRooms {
		for id, d := range t.dead {
			if now.After(d.until) {
				delete(t.dead, id)
			}
		}
	}
	if len(t.dead) < maxDeadRooms {
		t.dead[r.id] = deadRoom{why: why, until: now.Add(t.ttl)}
	}
}

// roomDroppedError answers a decode that attaches to a room the prefill
// gave up on.
type roomDroppedError struct{ why error }

func (e *roomDroppedError) Error() string { return "the prefill gave up on the room: " + e.why.Error() }
func (e *roomDroppedError) Unwrap() error { return e.why }

// abandon removes a room whose decode gives up; false when the prefill
// already claimed it (the transfer's result will come).
func (t *prefillRooms) abandon(r *prefillRoom) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.claimOK {
		return false
	}
	if t.m[r.id] == r {
		delete(t.m, r.id)
	}
	r.gone = true
	return true
}

// waitDecode waits until a decode attaches to room id and claims its
// destination.
func (t *prefillRooms) waitDecode(ctx context.Context, id uint64, timeout time.Duration) (*roomMsg, *prefillRoom, error) {
	r := t.get(id)
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-r.dstSet:
		dst, ok := t.claim(r)
		if !ok {
			return nil, nil, errDecodeLeft
		}
		return dst, r, nil
	case <-ctx.Done():
		t.drop(r, errPrefillCancelled)
		return nil, nil, ctx.Err()
	case <-tm.C:
		t.drop(r, errRoomTimeout)
		return nil, nil, errRoomTimeout
	}
}

// decodeRoom is one room on a decode: its pages, waiting for the prefill's
// notification. Its pages are freed when both the request and the
// exchange with the prefill are done with it, so that a transfer still
// under way never lands in pages handed to another request.
type decodeRoom struct {
	id    uint64
	pages []int

	notified chan struct{} // closed when every part's notification is in
	settled  chan struct{} // closed when the prefill answered the room
	err      error         // the prefill's failure; read after settled

	mu    sync.Mutex
	parts int
	done  bool

	refs atomic.Int32
}

// decodeRooms is a decode's table of rooms, which the notification poller
// dispatches to.
type decodeRooms struct {
	mu     sync.Mutex
	m      map[uint64]*decodeRoom
	active atomic.Int64
}

func (t *decodeRooms) init() { t.m = map[uint64]*decodeRoom{} }

// add creates room id holding pages; false if the room exists.
func (t *decodeRooms) add(id uint64, pages []int) (*decodeRoom, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[id]; ok {
		return nil, false
	}
	r := &decodeRoom{id: id, pages: pages, notified: make(chan struct{}), settled: make(chan struct{})}
	r.refs.Store(2)
	t.m[id] = r
	t.active.Add(1)
	return r, true
}

// notify records one notification part for room id.
func (t *decodeRooms) notify(id uint64, total int) {
	t.mu.Lock()
	r, ok := t.m[id]
	t.mu.Unlock()
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.parts++
	if r.parts >= total {
		r.done = true
		close(r.notified)
	}
}

// settle records the prefill's answer.
func (r *decodeRoom) settle(err error) {
	r.err = err
	close(r.settled)
}

// release drops one of the room's two holders; the last frees the pages.
func (t *decodeRooms) release(r *decodeRoom, pool *kvPool) {
	if r.refs.Add(-1) != 0 {
		return
	}
	t.mu.Lock()
	if t.m[r.id] == r {
		delete(t.m, r.id)
		t.active.Add(-1)
	}
	t.mu.Unlock()
	pool.release(r.pages)
}

// notifGrace is how long a decode waits for the notification after the
// prefill said the transfer is done.
const notifGrace = 2 * time.Second

// wait waits for the room's KV: the notification, or the timeout, or ctx.
// A failure the prefill reports does not end the wait (SGLang's decode is
// never told; its KV just never comes), but one of the decode's own
// exchange with the bootstrap server does.
func (r *decodeRoom) wait(ctx context.Context, timeout time.Duration, kick func()) error {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	settled := r.settled
	graced := false
	for {
		select {
		case <-r.notified:
			return nil
		case <-settled:
			settled = nil
			var pe *prefillError
			if errors.As(r.err, &pe) {
				continue
			}
			if r.err != nil {
				return r.err
			}
			// The transfer is done; the notification is in the backend
			// already or about to be. Drain now rather than at the next
			// poll.
			graced = true
			kick()
			tm.Reset(notifGrace)
		case <-ctx.Done():
			return ctx.Err()
		case <-tm.C:
			if graced {
				return fmt.Errorf("the prefill reported the transfer done but no notification came within %s", notifGrace)
			}
			return errRoomTimeout
		}
	}
}

// agentRecord is one engine's transfer agent as another engine sees it: its
// NIXL agent, metadata and the geometry of its KV regions, memory kinds
// included. A decode sends it to a prefill's bootstrap server (SGLang's
// KVArgsRegisterInfo); a vLLM prefill serves it on its side channel.
type agentRecord struct {
	Name          string                `json:"name"` // the engine's name
	InstanceID    string                `json:"instance_id"`
	AgentName     string                `json:"agent_name"`
	AgentMetadata []byte                `json:"agent_metadata"`
	Generation    int64                 `json:"generation"`
	Geometry      transfer.RankGeometry `json:"geometry"`
	AttnTPSize    int                   `json:"attn_tp_size"`
	AttnTPRank    int                   `json:"attn_tp_rank"`
}

// key identifies the engine across re-registrations (not across restarts).
func (a *agentRecord) key() string { return a.Name + "/" + a.InstanceID }

// peer is the transfer worker's view of the engine.
func (a *agentRecord) peer() transfer.Peer {
	g := a.Geometry
	g.AgentName = a.AgentName
	return transfer.Peer{
		Key: a.key(), AgentName: a.AgentName, Generation: a.Generation, Metadata: a.AgentMetadata,
		Geometry: g, AttnTPSize: a.AttnTPSize, AttnTPRank: a.AttnTPRank,
	}
}

// kvArgs is a decode's registration with a prefill, once per agent.
type kvArgs struct {
	agentRecord
	PeerID string `json:"peer_id,omitempty"` // the decode's peer ID in the registry
}

// decodeTable is a prefill's table of decode KV args by agent name (SGLang's
// decode_kv_args_table).
type decodeTable struct {
	mu         sync.Mutex
	byAgent    map[string]*kvArgs
	agentByKey map[string]string
	keyByName  map[string]string // the current instance of each decode
}

func (t *decodeTable) init() {
	t.byAgent = map[string]*kvArgs{}
	t.agentByKey = map[string]string{}
	t.keyByName = map[string]string{}
}

// put records a registration. Like SGLang's bootstrap thread it overwrites
// the entry of a known agent; changed reports that the entry's memory kinds
// changed, so that a loaded destination must be prepared again. A new agent
// of a known decode replaces the old agent's entry; a new instance of a
// known decode (it restarted) replaces the old instance, whose key comes
// back in gone so that its loaded destination can be dropped.
func (t *decodeTable) put(a *kvArgs) (changed bool, gone string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := a.key()
	if old, ok := t.keyByName[a.Name]; ok && old != k {
		delete(t.byAgent, t.agentByKey[old])
		delete(t.agentByKey, old)
		gone = old
	}
	t.keyByName[a.Name] = k
	if old, ok := t.agentByKey[k]; ok && old != a.AgentName {
		delete(t.byAgent, old)
	}
	if prev, ok := t.byAgent[a.AgentName]; ok {
		changed = !slices.Equal(prev.Geometry.KVMemKinds, a.Geometry.KVMemKinds)
	}
	t.byAgent[a.AgentName] = a
	t.agentByKey[k] = a.AgentName
	return changed, gone
}

// current reports whether agent is its decode's latest agent: a transfer
// to an older one failing says nothing about the decode as it is now.
func (t *decodeTable) current(key, agent string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agentByKey[key] == agent
}

func (t *decodeTable) get(agent string) (*kvArgs, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byAgent[agent]
	return a, ok
}

func (t *decodeTable) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.agentByKey))
	for k := range t.agentByKey {
		out = append(out, k)
	}
	return out
}

// heldBlock is a vLLM prefill's KV kept for a decode to READ.
type heldBlock struct {
	pages []int
	timer *time.Timer
	parts int
}

// heldBlocks is a vLLM prefill's table of held blocks, by request id.
type heldBlocks struct {
	mu     sync.Mutex
	m      map[string]*heldBlock
	active atomic.Int64
}

func (t *heldBlocks) init() { t.m = map[string]*heldBlock{} }

// hold keeps pages for id until done, or until timeout, when expire runs.
func (t *heldBlocks) hold(id string, pages []int, pool *kvPool, timeout time.Duration, expired func()) {
	h := &heldBlock{pages: pages}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[id] = h
	t.active.Add(1)
	h.timer = time.AfterFunc(timeout, func() {
		if t.take(id, h) {
			pool.release(pages)
			expired()
		}
	})
}

// take removes id's entry if it is still h.
func (t *heldBlocks) take(id string, h *heldBlock) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[id] != h {
		return false
	}
	delete(t.m, id)
	t.active.Add(-1)
	return true
}

// done records one part of the decode's "read done" notification and frees
// the blocks after the last.
func (t *heldBlocks) done(id string, total int, pool *kvPool) {
	t.mu.Lock()
	h, ok := t.m[id]
	if !ok {
		t.mu.Unlock()
		return
	}
	h.parts++
	if h.parts < total {
		t.mu.Unlock()
		return
	}
	delete(t.m, id)
	t.active.Add(-1)
	t.mu.Unlock()
	h.timer.Stop()
	pool.release(h.pages)
}

// releaseAll frees every held block (at Close).
func (t *heldBlocks) releaseAll(pool *kvPool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, h := range t.m {
		h.timer.Stop()
		pool.release(h.pages)
		delete(t.m, id)
		t.active.Add(-1)
	}
}

// Notification messages. A room's KV arrives with "room:<room>"; a vLLM
// decode's READ tells the prefill "done:<request id>". On the mixed-segments
// path each part carries "_part_<i>_<n>".
const (
	notifRoom = "room:"
	notifDone = "done:"
)

func roomNotif(room uint64) string { return notifRoom + strconv.FormatUint(room, 10) }

// parseNotif splits a notification into its kind prefix, id and the number
// of parts it is one of.
func parseNotif(msg string) (kind, id string, total int, ok bool) {
	total = 1
	if i := strings.LastIndex(msg, "_part_"); i >= 0 {
		var part, n int
		if _, err := fmt.Sscanf(msg[i:], "_part_%d_%d", &part, &n); err == nil && n > 0 {
			msg, total = msg[:i], n
		}
	}
	for _, k := range []string{notifRoom, notifDone} {
		if rest, found := strings.CutPrefix(msg, k); found && rest != "" {
			return k, rest, total, true
		}
	}
	return "", "", 0, false
}

// sideChannels caches, on a vLLM decode, the prefill agents it fetched
// from side channels, by engine id (which changes when a prefill
// re-registers).
type sideChannels struct {
	mu sync.Mutex
	m  map[string]agentInfo
}

func (c *sideChannels) init() { c.m = map[string]agentInfo{} }

// maxSideChannels bounds the cache; it is cleared when full.
const maxSideChannels = 256

func (c *sideChannels) get(engineID string) (agentInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.m[engineID]
	return a, ok
}

func (c *sideChannels) put(a agentInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxSideChannels {
		clear(c.m)
	}
	c.m[a.EngineID] = a
}

func (c *sideChannels) forget(engineID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, engineID)
}
