package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// The server on a prefill's bootstrap port. SGLang mode: SGLang's bootstrap
// server (sglang_bootstrap.go). vLLM mode: a side channel, sim-internal,
// modelled on vLLM's NIXL side channel (decodes fetch the prefill's agent
// metadata there).
const (
	pathAgent = "/sim/agent"
	// pathRelease: a vLLM decode whose READ failed tells the prefill to
	// free the blocks now rather than at their timeout.
	pathRelease = "/sim/release"
)

// maxBootstrapBody bounds a bootstrap request (metadata of NIXL agents
// runs to a few KiB).
const maxBootstrapBody = 8 << 20

func (s *Sim) bootstrapRoutes() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Engine == registry.EngineSGLang {
		s.sglangBootstrapRoutes(mux)
		mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { textResponse(w, http.StatusOK, "OK") })
		return mux
	}
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
	writeJSON(w, map[string]bool{"ok": true})
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
