package sim

import (
	"context"
	"errors"
	"fmt"
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
	errRoomTimeout = errors.New("room timed out waiting for its counterpart")
	errRoomInUse   = errors.New("room already has a decode")
	errRoomDropped = errors.New("the prefill gave up on the room")
)

// roomMsg is a decode's destination for one request (SGLang's
// TransferInfo): where the room's KV must go.
type roomMsg struct {
	Room      uint64
	AgentName string
	Pages     []int
}

// prefillRoom is one room on a prefill.
type prefillRoom struct {
	id     uint64
	dst    *roomMsg      // set by the decode's message
	dstSet chan struct{} // closed when dst is set
	gone   bool          // out of the table
	expiry *time.Timer   // drops a destination no prefill request takes
}

// prefillRooms is a prefill's table of rooms. A room is created by
// whichever comes first, the request or the decode's destination; a
// destination no request takes within the room timeout is dropped, and a
// room the request gave up on leaves a tombstone for a while so that a
// destination arriving late is dropped at once.
type prefillRooms struct {
	mu   sync.Mutex
	m    map[uint64]*prefillRoom
	dead map[uint64]time.Time
	ttl  time.Duration
}

// maxDeadRooms bounds the tombstones; expired ones are pruned beyond it.
const maxDeadRooms = 4096

func (t *prefillRooms) init(ttl time.Duration) {
	t.m = map[uint64]*prefillRoom{}
	t.dead = map[uint64]time.Time{}
	t.ttl = ttl
}

func (t *prefillRooms) getLocked(id uint64) *prefillRoom {
	r, ok := t.m[id]
	if !ok {
		r = &prefillRoom{id: id, dstSet: make(chan struct{})}
		t.m[id] = r
	}
	return r
}

// fail gives up on room id before the prefill ever waited in it.
func (t *prefillRooms) fail(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.dead, id)
	t.dropLocked(t.getLocked(id))
}

// attach records a decode's destination in its room.
func (t *prefillRooms) attach(m *roomMsg) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if until, ok := t.dead[m.Room]; ok {
		delete(t.dead, m.Room)
		if time.Now().Before(until) {
			return errRoomDropped
		}
	}
	r := t.getLocked(m.Room)
	if r.dst != nil {
		return errRoomInUse
	}
	r.dst = m
	close(r.dstSet)
	r.expiry = time.AfterFunc(t.ttl, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if !r.gone && t.m[r.id] == r {
			delete(t.m, r.id)
			r.gone = true
		}
	})
	return nil
}

// dropLocked removes a room the prefill gives up on, leaving a tombstone
// when no destination came yet.
func (t *prefillRooms) dropLocked(r *prefillRoom) {
	if t.m[r.id] == r {
		delete(t.m, r.id)
	}
	if r.gone {
		return
	}
	r.gone = true
	if r.expiry != nil {
		r.expiry.Stop()
	}
	if r.dst != nil {
		return
	}
	now := time.Now()
	if len(t.dead) >= maxDeadRooms {
		for id, until := range t.dead {
			if now.After(until) {
				delete(t.dead, id)
			}
		}
	}
	if len(t.dead) < maxDeadRooms {
		t.dead[r.id] = now.Add(t.ttl)
	}
}

// waitDecode waits until a decode's destination is in room id and takes
// it.
func (t *prefillRooms) waitDecode(ctx context.Context, id uint64, timeout time.Duration) (*roomMsg, error) {
	t.mu.Lock()
	delete(t.dead, id)
	r := t.getLocked(id)
	t.mu.Unlock()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	var why error
	select {
	case <-r.dstSet:
		t.mu.Lock()
		defer t.mu.Unlock()
		if r.gone {
			return nil, errRoomTimeout // the destination expired before the request came
		}
		r.gone = true
		r.expiry.Stop()
		if t.m[r.id] == r {
			delete(t.m, r.id)
		}
		return r.dst, nil
	case <-ctx.Done():
		why = ctx.Err()
	case <-tm.C:
		why = errRoomTimeout
	}
	t.mu.Lock()
	t.dropLocked(r)
	t.mu.Unlock()
	return nil, why
}

// decodeRoom is one room on a decode: its pages, waiting for the prefill's
// notification. Its pages are freed when both the request and the
// exchange with the prefill are done with it, so that a transfer still
// under way never lands in pages handed to another request.
type decodeRoom struct {
	id    uint64
	pages []int

	notified chan struct{} // closed when every part's notification is in
	settled  chan struct{} // closed when sending the destination failed
	err      error         // why; read after settled

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

// settle records that the destination could not be sent: the room fails
// now (SGLang's KVPoll.Failed on a bootstrap or ZMQ error).
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

// wait waits for the room's KV: the notification, or the timeout, or ctx.
// A prefill that failed does not end the wait (SGLang's NIXL decode is
// never told; its KV just never comes), but a failure to send the room's
// destination does.
func (r *decodeRoom) wait(ctx context.Context, timeout time.Duration) error {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-r.notified:
		return nil
	case <-r.settled:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return errRoomTimeout
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

// kvArgs is a decode rank's registration as a prefill holds it: what its
// message said, the generation the prefill counts for the rank's endpoint
// (a new agent name there is a new generation), and whether preparing it
// failed.
type kvArgs struct {
	sglangKVArgs
	gen    int64
	broken bool
}

// peer is the transfer worker's view of the decode rank. A broken entry
// has no memory kinds: neither a homogeneous kind nor segments.
func (a *kvArgs) peer() transfer.Peer {
	g := a.geometry()
	if a.broken {
		g.KVMemKinds = nil
	}
	return transfer.Peer{
		Key: a.endpointKey(), AgentName: a.AgentName, Generation: a.gen, Metadata: a.Metadata,
		Geometry: g, AttnTPSize: a.TPSize, AttnTPRank: a.TPRank,
	}
}

// decodeTable is a prefill's table of decode KV args by agent name (SGLang's
// decode_kv_args_table), and the latest agent of each decode endpoint.
type decodeTable struct {
	mu         sync.Mutex
	byAgent    map[string]*kvArgs
	agentByKey map[string]string // endpoint -> its latest agent
	gens       map[string]int64  // endpoint -> generations seen
}

func (t *decodeTable) init() {
	t.byAgent = map[string]*kvArgs{}
	t.agentByKey = map[string]string{}
	t.gens = map[string]int64{}
}

// maxDecodeEndpoints bounds the table: beyond it, the oldest-looking
// entries are not worth keeping (a fleet has far fewer decode ranks).
const maxDecodeEndpoints = 4096

// add records a registration and reports whether it is new. A known agent
// name is not touched: SGLang ignores a re-registration. A new agent at a
// known endpoint replaces the endpoint's older agent (the simulator drops
// what SGLang would keep until the prefill restarts).
func (t *decodeTable) add(a *sglangKVArgs) (*kvArgs, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byAgent[a.AgentName]; ok {
		return e, false
	}
	k := a.endpointKey()
	if old, ok := t.agentByKey[k]; ok {
		delete(t.byAgent, old)
	} else if len(t.agentByKey) >= maxDecodeEndpoints {
		clear(t.byAgent)
		clear(t.agentByKey)
	}
	t.gens[k]++
	if len(t.gens) > 2*maxDecodeEndpoints {
		for ep := range t.gens {
			if _, live := t.agentByKey[ep]; !live && ep != k {
				delete(t.gens, ep)
			}
		}
	}
	e := &kvArgs{sglangKVArgs: *a, gen: t.gens[k]}
	t.byAgent[a.AgentName] = e
	t.agentByKey[k] = a.AgentName
	return e, true
}

// keys returns the endpoints with a current agent.
func (t *decodeTable) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.agentByKey))
	for k := range t.agentByKey {
		out = append(out, k)
	}
	return out
}

// markBroken records that preparing agent's entry failed.
func (t *decodeTable) markBroken(agent string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byAgent[agent]; ok {
		e.broken = true
	}
}

// current reports whether agent is its endpoint's latest agent: a transfer
// to an older one failing says nothing about the decode as it is now.
func (t *decodeTable) current(endpoint, agent string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.agentByKey[endpoint] == agent
}

func (t *decodeTable) get(agent string) (kvArgs, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byAgent[agent]
	if !ok {
		return kvArgs{}, false
	}
	return *e, true
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

// notifDone is the prefix of a vLLM decode's "read done" notification to
// its prefill: "done:<request id>"; a room's KV comes with SGLang's tag
// (sglangKVNotif). On the mixed-segments path each part carries
// "_part_<i>_<n>".
const notifDone = "done:"

// notifRoom is parseNotif's kind for a room's KV.
const notifRoom = "room"

// parseNotif splits a notification into its kind (notifRoom: an SGLang KV
// tag, whose id is the room; notifDone: a vLLM read done, whose id is the
// request), and the number of parts it is one of.
func parseNotif(msg string) (kind, id string, total int, ok bool) {
	if room, last, parts, ok := parseSGLangNotif(msg); ok && last {
		return notifRoom, strconv.FormatUint(room, 10), parts, true
	}
	total = 1
	if i := strings.LastIndex(msg, "_part_"); i >= 0 {
		var part, n int
		if _, err := fmt.Sscanf(msg[i:], "_part_%d_%d", &part, &n); err == nil && n > 0 {
			msg, total = msg[:i], n
		}
	}
	if rest, found := strings.CutPrefix(msg, notifDone); found && rest != "" {
		return notifDone, rest, total, true
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
