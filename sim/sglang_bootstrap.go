package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/pdplane/pdplane/zmtp"
)

// The SGLang bootstrap plane (see sglang_wire.go for the wire): the
// bootstrap server on a prefill's bootstrap port, the rank socket every
// engine binds, the prefill's handling of what decodes send it, and the
// decode's side.

// sglangBoot is a prefill's bootstrap server state
// (CommonKVBootstrapServer): the parallel layout the first rank PUT, every
// rank's endpoint, and the rooms' DP ranks.
type sglangBoot struct {
	mu         sync.Mutex
	sized      bool
	info       prefillServerInfo
	ranks      map[[4]int]rankEndpoint // DP group, CP rank, TP rank, PP rank
	registered int
	roomDP     map[uint64]roomDPRank
}

type roomDPRank struct {
	dp int
	at time.Time
}

// roomDPTTL is how long a room's DP rank is kept
// (SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL); maxRoomDP bounds
// the table between cleanups.
const (
	roomDPTTL = 120 * time.Second
	maxRoomDP = 1 << 16
)

// maxRankMessage is the largest message the rank socket accepts: KV args
// carry the decode's NIXL agent metadata, a few MiB at most.
const maxRankMessage = 64 << 20

func (b *sglangBoot) init() {
	b.ranks = map[[4]int]rankEndpoint{}
	b.roomDP = map[uint64]roomDPRank{}
}

// ready reports whether every rank of the layout has registered.
func (b *sglangBoot) readyLocked() bool {
	return b.sized && b.registered >= b.info.DPSize*b.info.AttnCPSize*b.info.AttnTPSize*b.info.PPSize
}

// textResponse answers as aiohttp's web.Response(text=…) does.
func textResponse(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// serverError answers as aiohttp answers a handler that raised.
func serverError(w http.ResponseWriter, why string) {
	textResponse(w, http.StatusInternalServerError, "500 Internal Server Error\n\nServer got itself in trouble: "+why)
}

func (s *Sim) sglangBootstrapRoutes(mux *http.ServeMux) {
	mux.HandleFunc("/route", s.handleRoute)
	mux.HandleFunc("POST /register_dp_rank", s.handleRegisterDPRank)
	mux.HandleFunc("POST /query_dp_ranks", s.handleQueryDPRanks)
}

// handleRoute is CommonKVBootstrapServer._handle_route: PUT registers a
// prefill rank, GET looks one up; other methods are 405.
func (s *Sim) handleRoute(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut:
		s.handleRoutePut(w, r)
	case http.MethodGet:
		s.handleRouteGet(w, r)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		_, _ = io.WriteString(w, "Method not allowed")
	}
}

func (s *Sim) handleRoutePut(w http.ResponseWriter, r *http.Request) {
	var rr rankRoute
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBootstrapBody)).Decode(&rr); err != nil {
		serverError(w, "invalid JSON: "+err.Error())
		return
	}
	if f := rr.missing(); f != "" {
		serverError(w, "KeyError: '"+f+"'")
		return
	}
	b := &s.boot
	b.mu.Lock()
	if !b.sized {
		dp := *rr.AttnDPSize
		if *rr.SystemDPSize != 1 {
			dp = *rr.SystemDPSize
		}
		b.info = prefillServerInfo{
			AttnTPSize: *rr.AttnTPSize, AttnCPSize: *rr.AttnCPSize, DPSize: dp, PPSize: *rr.PPSize,
			PageSize: *rr.PageSize, KVCacheDtype: *rr.KVCacheDtype,
			FollowBootstrapRoom: rr.LoadBalanceMethod == "" || rr.LoadBalanceMethod == "follow_bootstrap_room",
		}
		b.sized = true
	}
	group := *rr.AttnDPRank
	if *rr.SystemDPSize != 1 {
		group = *rr.SystemDPRank
	}
	b.ranks[[4]int{group, *rr.AttnCPRank, *rr.AttnTPRank, *rr.PPRank}] = rankEndpoint{RankIP: *rr.RankIP, RankPort: *rr.RankPort}
	b.registered++
	b.mu.Unlock()
	textResponse(w, http.StatusOK, "OK")
}

func (s *Sim) handleRouteGet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	names := [4]string{"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"}
	var key [4]int
	for i, n := range names {
		v := q.Get(n)
		if v == "" {
			textResponse(w, http.StatusBadRequest, "Missing inputs for bootstrap server.")
			return
		}
		x, err := strconv.Atoi(v)
		if err != nil {
			serverError(w, "ValueError: "+n+"="+strconv.Quote(v))
			return
		}
		key[i] = x
	}
	b := &s.boot
	b.mu.Lock()
	ready, registered, info := b.readyLocked(), b.registered, b.info
	ep, found := b.ranks[key]
	b.mu.Unlock()
	if !ready {
		textResponse(w, http.StatusServiceUnavailable, fmt.Sprintf("Prefill server not fully registered yet (%d workers registered).", registered))
		return
	}
	if key == [4]int{-1, -1, -1, -1} {
		writeJSON(w, info)
		return
	}
	if !found {
		textResponse(w, http.StatusNotFound, fmt.Sprintf("Bootstrap info not found for dp_rank=%d cp_rank=%d tp_rank=%d pp_rank=%d", key[0], key[1], key[2], key[3]))
		return
	}
	writeJSON(w, ep)
}

// handleRegisterDPRank records which DP rank took a room
// (_handle_register_dp_rank).
func (s *Sim) handleRegisterDPRank(w http.ResponseWriter, r *http.Request) {
	var m struct {
		Room   *json.Number `json:"bootstrap_room"`
		DPRank *json.Number `json:"dp_rank"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBootstrapBody)).Decode(&m); err != nil {
		serverError(w, "invalid JSON: "+err.Error())
		return
	}
	if m.Room == nil || m.DPRank == nil {
		serverError(w, "KeyError: 'bootstrap_room' and 'dp_rank' are required")
		return
	}
	room, err1 := strconv.ParseUint(m.Room.String(), 10, 64)
	dp, err2 := strconv.Atoi(m.DPRank.String())
	if err := errors.Join(err1, err2); err != nil {
		serverError(w, "ValueError: "+err.Error())
		return
	}
	b := &s.boot
	now := time.Now()
	b.mu.Lock()
	if len(b.roomDP) >= maxRoomDP {
		for k, v := range b.roomDP {
			if now.Sub(v.at) > roomDPTTL {
				delete(b.roomDP, k)
			}
		}
		if len(b.roomDP) >= maxRoomDP {
			clear(b.roomDP) // a flood of rooms: the oldest answers are the least useful
		}
	}
	b.roomDP[room] = roomDPRank{dp: dp, at: now}
	b.mu.Unlock()
	textResponse(w, http.StatusOK, "OK")
}

// handleQueryDPRanks answers the DP rank of each known room
// (_handle_query_dp_ranks): {"<room>": dp_rank}.
func (s *Sim) handleQueryDPRanks(w http.ResponseWriter, r *http.Request) {
	var m struct {
		Rooms []json.Number `json:"bootstrap_rooms"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBootstrapBody)).Decode(&m); err != nil {
		serverError(w, "invalid JSON: "+err.Error())
		return
	}
	out := map[string]int{}
	b := &s.boot
	b.mu.Lock()
	for _, n := range m.Rooms {
		room, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil {
			b.mu.Unlock()
			serverError(w, "ValueError: "+err.Error())
			return
		}
		if e, ok := b.roomDP[room]; ok && time.Since(e.at) <= roomDPTTL {
			out[strconv.FormatUint(room, 10)] = e.dp
		}
	}
	b.mu.Unlock()
	writeJSON(w, out)
}

// registerRank PUTs this prefill's one rank to its own bootstrap server, as
// every prefill rank's KV manager does at start.
func (s *Sim) registerRank(ctx context.Context) error {
	one, zero := 1, 0
	ip, port := s.host, s.rankPort
	page, dtype := s.cfg.PageSize, s.cfg.DType
	body, err := json.Marshal(rankRoute{
		AttnTPSize: &one, AttnTPRank: &zero, AttnCPSize: &one, AttnCPRank: &zero,
		AttnDPSize: &one, AttnDPRank: &zero, PPSize: &one, PPRank: &zero,
		SystemDPSize: &one, SystemDPRank: &zero, RankIP: &ip, RankPort: &port,
		PageSize: &page, KVCacheDtype: &dtype,
	})
	if err != nil {
		return err
	}
	u := "http://" + net.JoinHostPort(s.host, strconv.Itoa(s.bootstrapPort)) + "/route"
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("register with the bootstrap server: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("register with the bootstrap server: %d %s", resp.StatusCode, msg)
	}
	return nil
}

// listenRank binds the engine's rank socket (a ZeroMQ PULL, as every SGLang
// KV manager binds one on rank_port). Each decode's PUSH connection is read
// on a goroutine of its own through a buffer, as libzmq reads a socket in
// batches (go-zeromq's own listener reads every frame's header and body
// with a read call each); the messages of all connections are handled one
// at a time, as SGLang's bootstrap thread handles them.
func (s *Sim) listenRank(bindHost string) error {
	if bindHost == "" {
		bindHost = "0.0.0.0"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bindHost, "0"))
	if err != nil {
		return fmt.Errorf("listen on the rank socket: %w", err)
	}
	s.rankLn = ln
	s.rankPort = ln.Addr().(*net.TCPAddr).Port
	s.bg.Go(s.acceptRank)
	return nil
}

// rankHandshakeTimeout bounds a connection's ZMTP greeting and handshake.
const rankHandshakeTimeout = 5 * time.Second

// acceptRank accepts decodes' connections to the rank socket until Close.
// A failing accept (out of descriptors) is retried after a pause that
// doubles up to a second, as net/http's server does.
func (s *Sim) acceptRank() {
	var pause time.Duration
	for {
		c, err := s.rankLn.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.log.Warn().Err(err).Dur("retry_in", pause).Msg("rank socket: accept")
			if !sleepCtx(s.ctx, pause) {
				return
			}
			continue
		}
		pause = 0
		s.bg.Go(func() { s.serveRankConn(c) })
	}
}

// serveRankConn reads one decode's messages until it closes the
// connection or the engine closes.
func (s *Sim) serveRankConn(nc net.Conn) {
	defer nc.Close()
	stop := context.AfterFunc(s.ctx, func() { nc.Close() })
	defer stop()
	if err := nc.SetDeadline(time.Now().Add(rankHandshakeTimeout)); err != nil {
		return
	}
	zc, err := zmq4.Open(zmtp.Guard(nc, maxRankMessage), null.Security(), zmq4.Pull, zmq4.SocketIdentity(""), true, nil)
	if err != nil {
		s.log.Debug().Err(err).Msg("rank socket: ZMTP handshake")
		return
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return
	}
	for {
		msg, err := zc.RecvMsg()
		if err != nil {
			if s.ctx.Err() == nil && !errors.Is(err, io.EOF) {
				s.log.Warn().Err(err).Str("decode", nc.RemoteAddr().String()).Msg("rank socket: connection dropped")
			}
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command (PING is answered by RecvMsg)
		}
		s.rankMu.Lock()
		s.onRankMessage(msg.Frames)
		s.rankMu.Unlock()
	}
}

// onRankMessage handles one message a decode sent the rank socket.
func (s *Sim) onRankMessage(frames [][]byte) {
	m, err := bootstrapFrames(frames)
	if err != nil {
		s.counters.foreignMessages.Add(1)
		s.log.Warn().Err(err).Int("frames", len(frames)).Msg("rank socket: message dropped")
		return
	}
	if !s.cfg.Role.Prefills() {
		s.log.Warn().Msg("rank socket: a decode received bootstrap traffic; dropped")
		return
	}
	if string(m[0]) == sglangKVArgsRoom {
		s.onKVArgs(m)
	} else {
		s.onTransferInfo(m)
	}
}

// onKVArgs is the prefill's bootstrap thread on a registration: a known
// agent name is ignored (NixlKVManager._add_remote_peer); a new one enters
// the table first and is prepared after, so that a preparation that fails
// leaves the entry with neither a memory kind nor segments — the state in
// which every transfer to the agent raises "Missing NIXL destination KV
// memory kind", and stays so, since the agent's later registrations are
// ignored. Only a new agent name (a restarted decode) gets a fresh entry.
func (s *Sim) onKVArgs(m [][]byte) {
	a, err := decodeKVArgs(m)
	if err != nil {
		s.counters.foreignMessages.Add(1)
		s.log.Error().Err(err).Msg("decode KV args refused")
		return
	}
	e, fresh := s.decodes.add(a)
	if !fresh {
		s.counters.ignoredKVArgs.Add(1)
		s.log.Info().Str("decode_agent", a.AgentName).Msgf("Peer %s was already registered, ignoring.", a.AgentName)
		return
	}
	st := s.state.Load()
	if st == nil || st.worker == nil {
		return
	}
	_, release, err := st.worker.Cache().Acquire(e.peer())
	if err != nil {
		s.decodes.markBroken(a.AgentName)
		s.log.Warn().Err(err).Str("decode_agent", a.AgentName).Bool("kinds_sent", a.KindsSent).
			Msg("preparing the decode's KV destination failed; its entry stays without a memory kind")
		return
	}
	release()
	s.log.Info().Str("decode_agent", a.AgentName).Str("decode_endpoint", a.endpointKey()).
		Int64("decode_generation", e.gen).Msg("decode KV args registered")
}

// onTransferInfo records a request's destination in its room.
func (s *Sim) onTransferInfo(m [][]byte) {
	t, err := decodeTransferInfo(m)
	if err != nil {
		s.counters.foreignMessages.Add(1)
		s.log.Error().Err(err).Msg("transfer info refused")
		return
	}
	if t.RequiredDsts != 1 || (t.HasDummyFrame && t.IsDummyRank) {
		s.log.Warn().Uint64("room", t.Room).Int("required_dst_info_num", t.RequiredDsts).Bool("dummy", t.IsDummyRank).
			Msg("transfer info for a TP layout the simulator does not have; dropped")
		return
	}
	if err := s.preRooms.attach(&roomMsg{Room: t.Room, AgentName: t.AgentName, Pages: t.Pages}); err != nil {
		s.log.Warn().Err(err).Uint64("room", t.Room).Str("decode_agent", t.AgentName).Msg("transfer info dropped")
		return
	}
	s.kickPoller()
}

// The decode's side.

// prefillRank is the rank of the prefill at addr this decode sends to,
// fetched from its bootstrap server on first use (CommonKVReceiver: the
// prefill's parallel info, then the rank's endpoint), which also sends it
// the decode's KV args, and cached per agent. SGLang's scheduler builds
// its receivers one at a time, so the first request to a prefill has sent
// the KV args before any other request sends its destination; the sim's
// requests run at once, and the others wait here for the first
// (agentState.connectMu): a destination that overtook the KV args would
// fail its transfer with an unknown agent. retry reports an error that a
// fresh fetch may cure: the KV args could not be sent.
func (s *Sim) prefillRank(ctx context.Context, st *agentState, addr string, port int) (ep rankEndpoint, retry bool, err error) {
	if ep, ok := st.prefill(addr); ok {
		return ep, false, nil
	}
	st.connectMu.Lock()
	defer st.connectMu.Unlock()
	if ep, ok := st.prefill(addr); ok {
		return ep, false, nil // the request before this one connected
	}
	var info prefillServerInfo
	if err := s.getJSON(ctx, "http://"+addr+"/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", &info); err != nil {
		//lint:ignore ST1005 SGLang's record_failure text, verbatim: the client gets it in the abort message, as from a real decode.
		return ep, false, fmt.Errorf("Could not fetch prefill parallel info from bootstrap_addr: %s: %w", addr, err)
	}
	if info.AttnTPSize != 1 || info.PPSize != 1 || info.AttnCPSize != 1 {
		return ep, false, fmt.Errorf("prefill at %s has attn_tp_size %d, pp_size %d, attn_cp_size %d; the simulator pairs TP 1 only",
			addr, info.AttnTPSize, info.PPSize, info.AttnCPSize)
	}
	if info.PageSize != s.cfg.PageSize {
		return ep, false, fmt.Errorf("prefill at %s has page size %d, this decode %d", addr, info.PageSize, s.cfg.PageSize)
	}
	if err := s.getJSON(ctx, "http://"+addr+"/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", &ep); err != nil {
		//lint:ignore ST1005 SGLang's record_failure text, verbatim: the client gets it in the abort message, as from a real decode.
		return ep, false, fmt.Errorf("Could not fetch bootstrap info for: prefill_dp_rank: 0 prefill_cp_rank: 0 target_tp_rank: 0 and target_pp_rank 0 from %s: %w", addr, err)
	}
	withKinds := !s.breaksPair(port)
	if !withKinds {
		s.log.Warn().Str("prefill", addr).Str("agent", st.name).Msg("registering KV args without memory kinds (missing-mem-kind fault)")
	}
	if err := s.pushers.send(ctx, ep.endpoint(), encodeKVArgs(s.host, s.rankPort, st.name, st.metadata, st.geometry, 1, 0, withKinds)); err != nil {
		return ep, true, err
	}
	st.setPrefill(addr, ep)
	return ep, false, nil
}

// getJSON GETs target and decodes a 200 answer; any other answer is an
// error with the server's text.
func (s *Sim) getJSON(ctx context.Context, target string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBootstrapBody))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%d %s", resp.StatusCode, body)
	}
	return json.Unmarshal(body, out)
}

// exchangeRoom sends room's destination to the prefill at bs, its KV args
// first when this agent has not registered with that prefill yet. A failed
// send drops what is cached about the prefill (SGLang invalidates its
// bootstrap infos on a ZMQ error) and is tried once more, fetched afresh:
// the prefill may have restarted on the same bootstrap port.
func (s *Sim) exchangeRoom(st *agentState, bs bootstrap, room *decodeRoom) error {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	addr := net.JoinHostPort(bs.host, strconv.Itoa(bs.port))
	var last error
	for range 2 {
		ep, retry, err := s.prefillRank(ctx, st, addr, bs.port)
		if err != nil && !retry {
			return err
		}
		if err == nil {
			err = s.pushers.send(ctx, ep.endpoint(), encodeTransferInfo(bs.room, s.host, s.rankPort, st.name, room.pages))
		}
		if err == nil {
			return nil
		}
		st.forgetPrefill(addr)
		last = err
	}
	return fmt.Errorf("send_metadata to prefill %s failed: %w", addr, last)
}

// pushers holds a decode's PUSH connections to prefill rank sockets, one
// per endpoint.
type pushers struct {
	mu     sync.Mutex
	conns  map[string]*pushConn
	closed bool // closeAll was called: a connection made since is closed
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
}

// pushConn is one ZMTP PUSH connection. Sends on it are serialised (mu).
type pushConn struct {
	mu  sync.Mutex
	nc  net.Conn
	out *gatherWrites // nc, as zc writes to it
	zc  *zmq4.Conn
	// closed is set once the connection is of no more use: the prefill
	// closed its end or it broke (watch), or it was dropped.
	closed atomic.Bool
}

func (p *pushers) init() {
	p.conns = map[string]*pushConn{}
	p.dial = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
}

// send sends frames as one multipart message to endpoint. A connection the
// prefill is known to have closed (it restarted or went away: its close
// reached watch, or the socket says so now) is replaced before the send by
// a new one; a send that
// fails drops the connection and is an error. libzmq's PUSH instead queues
// the message until it has reconnected, and never fails the send; here the
// caller (exchangeRoom) fetches the prefill's rank again and tries once
// more. As with libzmq, a message sent while the prefill's close is still
// on its way is lost.
func (p *pushers) send(ctx context.Context, endpoint string, frames [][]byte) error {
	c, err := p.get(ctx, endpoint)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The socket is asked too: under load the prefill's close may have
	// arrived before watch's goroutine has run to see it.
	if c.closed.Load() || peerClosed(c.nc) {
		p.drop(endpoint, c)
		if c, err = p.get(ctx, endpoint); err != nil {
			return err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
	}
	if err := c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		p.drop(endpoint, c)
		return err
	}
	if err := c.sendMsg(zmq4.NewMsgFrom(frames...)); err != nil {
		p.drop(endpoint, c)
		return fmt.Errorf("send to %s: %w", endpoint, err)
	}
	return nil
}

func (p *pushers) get(ctx context.Context, endpoint string) (*pushConn, error) {
	p.mu.Lock()
	if c, ok := p.conns[endpoint]; ok {
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	nc, err := p.dial(ctx, "tcp", endpoint)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	if err := nc.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		nc.Close()
		return nil, err
	}
	out := &gatherWrites{Conn: nc}
	zc, err := zmq4.Open(out, null.Security(), zmq4.Push, zmq4.SocketIdentity(""), false, nil)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("ZMTP handshake with %s: %w", endpoint, err)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, err
	}
	c := &pushConn{nc: nc, out: out, zc: zc}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil, fmt.Errorf("connect to %s: the engine is closing", endpoint)
	}
	if old, ok := p.conns[endpoint]; ok {
		nc.Close() // another request connected meanwhile
		return old, nil
	}
	p.conns[endpoint] = c
	go c.watch()
	return c, nil
}

// drop forgets c (if it is still endpoint's connection) and closes it.
func (p *pushers) drop(endpoint string, c *pushConn) {
	p.mu.Lock()
	if p.conns[endpoint] == c {
		delete(p.conns, endpoint)
	}
	p.mu.Unlock()
	c.closed.Store(true)
	c.nc.Close()
}

// closeAll closes every connection (at Close), and every one made after.
func (p *pushers) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for k, c := range p.conns {
		c.nc.Close()
		delete(p.conns, k)
	}
}

// watch reads the connection until it ends, as libzmq keeps reading its
// sockets: a PULL peer sends nothing after the handshake (SGLang sets no
// ZMTP heartbeats; anything it did send would be dropped here), so the
// read fails only when the prefill closed its end or the connection broke.
// The next send then finds it closed before it writes: bytes written to a
// connection whose peer has only closed are accepted by the kernel and
// lost without an error. The connection is closed here, so that one whose
// prefill went for good does not linger half-closed.
func (c *pushConn) watch() {
	var b [64]byte
	for {
		if _, err := c.nc.Read(b[:]); err != nil {
			c.closed.Store(true)
			c.nc.Close()
			return
		}
	}
}

// sendMsg writes msg in one write. Called with c.mu held.
func (c *pushConn) sendMsg(msg zmq4.Msg) error {
	c.out.gather = true
	err := c.zc.SendMsg(msg)
	c.out.gather = false
	buf := c.out.buf
	c.out.buf = nil
	if cap(buf) <= maxKeptMessageBuffer {
		c.out.buf = buf[:0]
	}
	if err != nil {
		return err
	}
	_, err = c.nc.Write(buf)
	return err
}

// maxKeptMessageBuffer is the largest message buffer a connection keeps
// for its next send: a request's destination is a few hundred bytes; KV
// args, sent once per prefill, can carry MiBs of agent metadata.
const maxKeptMessageBuffer = 64 << 10

// gatherWrites holds a connection's writes while a message is encoded
// (gather), so that the message leaves in one write as libzmq's encoder
// batches it: go-zeromq's Conn.SendMsg writes every frame's header and
// body apart, two system calls a frame, 22 for a request's destination.
type gatherWrites struct {
	net.Conn
	gather bool
	buf    []byte
}

func (g *gatherWrites) Write(b []byte) (int, error) {
	if !g.gather {
		return g.Conn.Write(b)
	}
	g.buf = append(g.buf, b...)
	return len(b), nil
}
