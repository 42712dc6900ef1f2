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
	"net/url"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/transfer"
)

// The bootstrap server runs on a prefill's bootstrap port. It is
// sim-internal, modelled on SGLang's NIXL connector (decodes register their
// KV args once per agent, then send each room's destination pages) and on
// vLLM's NIXL side channel (decodes fetch the prefill's agent metadata).
const (
	pathKVArgs = "/sim/kv_args"
	pathRoom   = "/sim/room"
	pathAgent  = "/sim/agent"
	// pathRelease: a vLLM decode whose READ failed tells the prefill to
	// free the blocks now rather than at their timeout.
	pathRelease = "/sim/release"
)

// maxBootstrapBody bounds a bootstrap request (metadata of NIXL agents
// runs to a few KiB; page lists to a few hundred KiB).
const maxBootstrapBody = 8 << 20

func (s *Sim) bootstrapRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+pathKVArgs, s.handleKVArgs)
	mux.HandleFunc("POST "+pathRoom, s.handleRoom)
	mux.HandleFunc("GET "+pathAgent, s.handleAgentInfo)
	mux.HandleFunc("POST "+pathRelease, s.handleRelease)
	mux.HandleFunc("GET /health", s.handleHealth)
	return mux
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBootstrapBody)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid body: "+err.Error(), "BadRequestError")
		return false
	}
	return true
}

// handleKVArgs records a decode's KV args. An entry whose memory kinds
// changed (a registration whose preparation "failed") replaces the loaded
// destination, which is prepared again on the next transfer.
func (s *Sim) handleKVArgs(w http.ResponseWriter, r *http.Request) {
	var a kvArgs
	if !decodeBody(w, r, &a) {
		return
	}
	switch {
	case a.AgentName == "":
		writeError(w, http.StatusBadRequest, "agent_name is required", "BadRequestError")
		return
	case len(a.AgentMetadata) == 0:
		writeError(w, http.StatusBadRequest, "agent_metadata is required", "BadRequestError")
		return
	case len(a.Geometry.KVDataPtrs) == 0:
		writeError(w, http.StatusBadRequest, "geometry.kv_data_ptrs is required", "BadRequestError")
		return
	case a.AttnTPSize < 1:
		a.AttnTPSize = 1
	}
	changed, gone := s.decodes.put(&a)
	ev := s.log.Info()
	if len(a.Geometry.KVMemKinds) == 0 {
		ev = s.log.Warn()
	}
	ev.Str("decode", a.Name).Str("decode_agent", a.AgentName).Int64("decode_generation", a.Generation).
		Int("mem_kinds", len(a.Geometry.KVMemKinds)).Bool("changed", changed).Msg("decode KV args registered")
	if st := s.state.Load(); st != nil && st.worker != nil {
		cache := st.worker.Cache()
		if agent, _, ok := cache.Loaded(a.key()); changed && ok && agent == a.AgentName {
			if err := cache.Evict(a.key()); err != nil {
				s.log.Warn().Err(err).Str("decode_agent", a.AgentName).Msg("evict decode")
			}
		}
		if gone != "" {
			if err := cache.Evict(gone); err != nil {
				s.log.Warn().Err(err).Str("decode", gone).Msg("evict a restarted decode's old instance")
			}
		}
	}
	writeJSON(w, roomResult{OK: true})
}

// handleRoom receives a decode's destination for one room and answers once
// the room's transfer is over (or never happens).
func (s *Sim) handleRoom(w http.ResponseWriter, r *http.Request) {
	var m roomMsg
	if !decodeBody(w, r, &m) {
		return
	}
	if _, ok := s.decodes.get(m.AgentName); !ok {
		writeError(w, http.StatusNotFound, "unknown decode agent "+m.AgentName+": register its KV args first", "NotFound")
		return
	}
	if len(m.Pages) == 0 {
		writeError(w, http.StatusBadRequest, "pages is required", "BadRequestError")
		return
	}
	room, err := s.preRooms.attach(&m)
	var dropped *roomDroppedError
	switch {
	case errors.As(err, &dropped):
		writeJSON(w, roomResult{Error: err.Error()})
		return
	case err != nil:
		writeError(w, http.StatusConflict, err.Error(), "Conflict")
		return
	}
	s.kickPoller()
	tm := time.NewTimer(s.cfg.RoomTimeout)
	defer tm.Stop()
	var res error
	select {
	case <-room.claimed:
		select {
		case res = <-room.result:
		case <-r.Context().Done():
			return
		}
	case res = <-room.result:
	case <-tm.C:
		if s.preRooms.abandon(room) {
			s.counters.roomTimeouts.Add(1)
			res = errRoomTimeout
			break
		}
		select {
		case res = <-room.result:
		case <-r.Context().Done():
			return
		}
	case <-r.Context().Done():
		s.preRooms.abandon(room)
		return
	}
	out := roomResult{OK: res == nil}
	if res != nil {
		out.Error = res.Error()
		var mk *transfer.MissingMemKindError
		out.MissingMemKind = errors.As(res, &mk)
	}
	writeJSON(w, out)
}

// agentInfo is what a vLLM prefill's side channel serves: its agent, so
// that decodes can READ from it.
type agentInfo struct {
	EngineID string `json:"engine_id"`
	PeerID   string `json:"peer_id,omitempty"` // the prefill's peer ID in the registry
	agentRecord
}

// handleAgentInfo serves the current agent; an engine_id naming an older
// agent is 404 (the prefill re-registered).
func (s *Sim) handleAgentInfo(w http.ResponseWriter, r *http.Request) {
	st := s.state.Load()
	if st == nil {
		writeError(w, http.StatusServiceUnavailable, "no transfer agent", "ServiceUnavailable")
		return
	}
	if id := r.URL.Query().Get("engine_id"); id != "" && id != st.name {
		writeError(w, http.StatusNotFound, "engine "+id+" is gone; this engine is "+st.name, "NotFound")
		return
	}
	writeJSON(w, agentInfo{EngineID: st.name, PeerID: s.PeerID(), agentRecord: agentRecord{
		Name: s.cfg.Name, InstanceID: s.instanceID, AgentName: st.name,
		AgentMetadata: st.metadata, Generation: st.gen, Geometry: st.geometry, AttnTPSize: 1,
	}})
}

// releaseMsg names held blocks to free.
type releaseMsg struct {
	RequestID string `json:"request_id"`
}

// handleRelease frees held blocks a decode gave up on.
func (s *Sim) handleRelease(w http.ResponseWriter, r *http.Request) {
	var m releaseMsg
	if !decodeBody(w, r, &m) {
		return
	}
	s.held.done(m.RequestID, 1, s.pool)
	writeJSON(w, roomResult{OK: true})
}

// releaseBlocks tells a vLLM prefill, in the background, to free the blocks
// of a READ that failed.
func (s *Sim) releaseBlocks(host string, port int, requestID string) {
	s.bg.Go(func() {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		defer cancel()
		u := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + pathRelease
		if _, err := s.postJSON(ctx, u, releaseMsg{RequestID: requestID}, nil); err != nil {
			s.log.Debug().Err(err).Str("request", requestID).Msg("release the prefill's blocks")
		}
	})
}

// The decode's side of the bootstrap protocol.

// postJSON posts v to url and decodes a 200 answer into out; any other
// status comes back with the engine's message.
func (s *Sim) postJSON(ctx context.Context, target string, v, out any) (int, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	return s.do(req, out)
}

func (s *Sim) do(req *http.Request, out any) (int, error) {
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBootstrapBody))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		var e engineError
		if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
			return resp.StatusCode, fmt.Errorf("%s answered %d: %s", req.URL.Host, resp.StatusCode, e.Error.Message)
		}
		return resp.StatusCode, fmt.Errorf("%s answered %d", req.URL.Host, resp.StatusCode)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode answer of %s: %w", req.URL.Host, err)
		}
	}
	return resp.StatusCode, nil
}

// kvArgsOf is this decode's registration for st. Under the missing-mem-kind
// fault the memory kinds are left out: the registration whose preparation
// "failed".
func (s *Sim) kvArgsOf(st *agentState) kvArgs {
	g := st.geometry
	if s.Fault() == FaultMissingMemKind {
		g.KVMemKinds = nil
	}
	return kvArgs{PeerID: s.PeerID(), agentRecord: agentRecord{
		Name: s.cfg.Name, InstanceID: s.instanceID,
		AgentName: st.name, AgentMetadata: st.metadata, Generation: st.gen,
		Geometry: g, AttnTPSize: 1, AttnTPRank: 0,
	}}
}

// registerWith sends st's KV args to the prefill at addr.
func (s *Sim) registerWith(ctx context.Context, st *agentState, addr string) error {
	args := s.kvArgsOf(st)
	if _, err := s.postJSON(ctx, "http://"+addr+pathKVArgs, args, nil); err != nil {
		return fmt.Errorf("register KV args with %s: %w", addr, err)
	}
	st.setRegistered(addr, true)
	if len(args.Geometry.KVMemKinds) == 0 {
		s.log.Warn().Str("prefill", addr).Str("agent", st.name).Msg("registered KV args without memory kinds (missing-mem-kind fault)")
	}
	return nil
}

// prefillError is a prefill's report that a room's transfer failed.
type prefillError struct {
	msg            string
	missingMemKind bool
}

func (e *prefillError) Error() string { return "prefill: " + e.msg }

// exchangeRoom tells the prefill at bs where room's KV goes, registering
// the KV args first if that prefill has not seen this agent, and returns
// when the prefill says the transfer is over.
func (s *Sim) exchangeRoom(st *agentState, bs bootstrap, room *decodeRoom) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RoomTimeout+s.cfg.TransferTimeout+5*time.Second)
	defer cancel()
	addr := net.JoinHostPort(bs.host, strconv.Itoa(bs.port))
	if !st.isRegistered(addr) {
		if err := s.registerWith(ctx, st, addr); err != nil {
			return err
		}
	}
	msg := roomMsg{Room: bs.room, AgentName: st.name, PeerID: s.PeerID(), Pages: room.pages}
	var res roomResult
	status, err := s.postJSON(ctx, "http://"+addr+pathRoom, msg, &res)
	if status == http.StatusNotFound {
		// The prefill does not know this agent (it restarted): register
		// again and retry once.
		st.setRegistered(addr, false)
		if err := s.registerWith(ctx, st, addr); err != nil {
			return err
		}
		_, err = s.postJSON(ctx, "http://"+addr+pathRoom, msg, &res)
	}
	if err != nil {
		return fmt.Errorf("room %d at %s: %w", bs.room, addr, err)
	}
	if !res.OK {
		return &prefillError{msg: res.Error, missingMemKind: res.MissingMemKind}
	}
	return nil
}

// fetchAgent gets a vLLM prefill's agent from its side channel, cached by
// engine id.
func (s *Sim) fetchAgent(ctx context.Context, host string, port int, engineID string) (agentInfo, error) {
	if a, ok := s.sides.get(engineID); ok {
		return a, nil
	}
	u := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + pathAgent + "?engine_id=" + url.QueryEscape(engineID)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return agentInfo{}, err
	}
	var a agentInfo
	if _, err := s.do(req, &a); err != nil {
		return agentInfo{}, fmt.Errorf("side channel of %s: %w", engineID, err)
	}
	if a.EngineID != engineID {
		return agentInfo{}, fmt.Errorf("side channel answered for engine %s, not %s", a.EngineID, engineID)
	}
	s.sides.put(a)
	return a, nil
}
