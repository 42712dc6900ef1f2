package router

import (
	"net/http"

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

// serverInfo is the subset of SGLang's /server_info that describes pdplane
// as a single OpenAI-compatible worker.
type serverInfo struct {
	ModelPath       string `json:"model_path"`
	ServedModelName string `json:"served_model_name"`
	// DisaggregationMode is "null", SGLang's value for a worker that takes
	// whole requests: pdplane splits them itself.
	DisaggregationMode string `json:"disaggregation_mode"`
	IsEmbedding        bool   `json:"is_embedding"`
	// Models lists every model the fleet serves; SGLang's single-model
	// fields above name the first.
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
	writeJSON(w, http.StatusOK, serverInfo{
		ModelPath: model, ServedModelName: model, DisaggregationMode: "null",
		Models: all,
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
