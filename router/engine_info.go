package router

import (
	"net/http"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry/replica"
)

// Another router (SMG, SGLang's router) in front of pdplane treats it as one
// SGLang worker. On registration it identifies the worker's engine by
// GET /server_info (SMG: workflow/steps/local/detect_backend.rs) and reads
// its model from /server_info and /model_info, falling back to the older
// /get_server_info and /get_model_info on 404
// (workflow/steps/local/discover_metadata.rs). pdplane answers with the
// subset of SGLang's fields that describe what it serves as a whole; the
// per-engine fields (parallelism, KV geometry) belong to the engines behind
// it and are left out rather than invented.

// routerServerInfo is pdplane's /server_info: SGLang's fields that describe
// it as one worker, and pdplane_models, every model the fleet serves
// (SGLang's single-model fields name the first).
type routerServerInfo struct {
	pdproto.SGLangServerInfo
	Models []string `json:"pdplane_models"`
}

// modelInfoResponse is SGLang's /model_info.
type modelInfoResponse struct {
	ModelPath     string `json:"model_path"`
	TokenizerPath string `json:"tokenizer_path"`
	IsGeneration  bool   `json:"is_generation"`
}

// firstModel returns the first model (by name) that has a routable pair, or
// "" when none has: then there is nothing to describe yet.
func firstModel(s *replica.Snapshot) (string, []string) {
	models := s.Models()
	if len(models) == 0 {
		return "", nil
	}
	return models[0], models
}

func (rt *Router) serveServerInfo(w http.ResponseWriter, _ *http.Request) {
	model, all := firstModel(rt.snaps.Snapshot())
	if model == "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "no model is served yet: no ready prefill/decode pair"})
		return
	}
	whole := "null" // SGLang's mode of a worker that takes whole requests: pdplane splits them itself
	writeJSON(w, http.StatusOK, routerServerInfo{
		SGLangServerInfo: pdproto.SGLangServerInfo{ModelPath: model, ServedModelName: model, DisaggregationMode: &whole},
		Models:           all,
	})
}

func (rt *Router) serveModelInfo(w http.ResponseWriter, _ *http.Request) {
	model, _ := firstModel(rt.snaps.Snapshot())
	if model == "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "no model is served yet: no ready prefill/decode pair"})
		return
	}
	writeJSON(w, http.StatusOK, modelInfoResponse{ModelPath: model, TokenizerPath: model, IsGeneration: true})
}
