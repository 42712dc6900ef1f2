package sim

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// The engine's health and load endpoints, in each engine's own format, so
// that an agent probing the simulator reads it exactly as it reads a real
// engine.

// handleHealth is GET /health (and SGLang's /health_generate): 200 with an
// empty body while the engine serves. SGLang (entrypoints/http_server.py
// health_generate) and vLLM (entrypoints/openai/api_server.py health)
// answer 503 while starting, shutting down or dead; the sim's gate answers
// 503 once it is closing, and its crash fault drops the connection as a
// dead process would.
func (s *Sim) handleHealth(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
}

// sglangRankLoad is one DP rank of SGLang's GET /v1/loads: the core fields
// of managers/load_snapshot.py LoadSnapshot.to_dict.
type sglangRankLoad struct {
	DPRank             int     `json:"dp_rank"`
	NumRunningReqs     int     `json:"num_running_reqs"`
	NumWaitingReqs     int     `json:"num_waiting_reqs"`
	NumUsedTokens      int     `json:"num_used_tokens"`
	NumTotalTokens     int     `json:"num_total_tokens"`
	MaxTotalNumTokens  int     `json:"max_total_num_tokens"`
	MaxRunningRequests int     `json:"max_running_requests"`
	TokenUsage         float64 `json:"token_usage"`
	GenThroughput      float64 `json:"gen_throughput"`
	CacheHitRate       float64 `json:"cache_hit_rate"`
	Utilization        float64 `json:"utilization"`
}

// sglangLoads is the whole GET /v1/loads answer (entrypoints/v1_loads.py
// get_loads).
type sglangLoads struct {
	Timestamp       string           `json:"timestamp"`
	Version         string           `json:"version"`
	Accelerator     *string          `json:"accelerator"`
	NumAccelerators int              `json:"num_accelerators"`
	Loads           []sglangRankLoad `json:"loads"`
}

// rankLoad is the sim's one DP rank.
func (s *Sim) rankLoad() sglangRankLoad {
	l := s.Load()
	total := s.cfg.Pages * s.cfg.PageSize
	used := int(l.KVUsage * float64(total))
	return sglangRankLoad{
		NumRunningReqs: l.Running, NumWaitingReqs: l.Queued,
		NumUsedTokens: used, NumTotalTokens: used, MaxTotalNumTokens: total,
		MaxRunningRequests: s.cfg.Pages, TokenUsage: l.KVUsage, Utilization: l.KVUsage,
		CacheHitRate: s.cacheHitRate(),
	}
}

// cacheHitRate is SGLang's cache_hit_rate: the share of the last prefill
// batch's prompt tokens found in the prefix cache
// (managers/scheduler_metrics_mixin.py log_prefill_stats: log_hit_tokens
// over log_input_tokens + log_hit_tokens). The simulator's batch is one
// prompt.
func (s *Sim) cacheHitRate() float64 {
	if s.cache == nil {
		return 0
	}
	cs := s.cache.stats()
	if cs.lastQueried == 0 {
		return 0
	}
	return float64(cs.lastHit) / float64(cs.lastQueried)
}

// handleSGLangMetrics is SGLang's GET /metrics (--enable-metrics): the
// scheduler's gauges of metrics/collector.py SchedulerMetricsCollector that
// the simulator has, labelled as managers/scheduler_metrics_mixin.py labels
// them (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank).
func (s *Sim) handleSGLangMetrics(w http.ResponseWriter, r *http.Request) {
	l := s.Load()
	engineType := "prefill"
	if s.cfg.Role == registry.RoleDecode {
		engineType = "decode"
	}
	labels := `{model_name="` + labelEscaper.Replace(s.cfg.Model) + `",engine_type="` + engineType + `",tp_rank="0",pp_rank="0",moe_ep_rank="0"}`
	var b strings.Builder
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s%s %s\n", name, help, name, name, labels, promFloat(v))
	}
	gauge("sglang:num_running_reqs", "The number of running requests.", float64(l.Running))
	gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(l.Queued))
	gauge("sglang:token_usage", "The token usage.", l.KVUsage)
	gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", s.cacheHitRate())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

func (s *Sim) handleLoads(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, sglangLoads{
		Timestamp: s.cfg.Now().UTC().Format(time.RFC3339Nano), Version: "pdplane-sim",
		NumAccelerators: 1, Loads: []sglangRankLoad{s.rankLoad()},
	})
}

// handleGetLoad is SGLang's deprecated GET /get_load (http_server.py
// get_load): one entry per DP rank, num_reqs counting running and waiting
// requests together.
func (s *Sim) handleGetLoad(w http.ResponseWriter, r *http.Request) {
	l := s.rankLoad()
	writeJSON(w, []map[string]any{{
		"dp_rank": l.DPRank, "num_reqs": l.NumRunningReqs + l.NumWaitingReqs, "num_waiting_reqs": l.NumWaitingReqs,
		"num_tokens": l.NumUsedTokens, "num_pending_tokens": 0, "ts_tic": float64(s.cfg.Now().UnixNano()) / 1e9,
	}})
}

// labelEscaper escapes a Prometheus text-format label value.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// handleVLLMMetrics is vLLM's GET /metrics: the scheduler gauges of
// v1/metrics/loggers.py PrometheusStatLogger, one series per engine (DP
// rank) labelled engine and model_name, in Prometheus text format.
func (s *Sim) handleVLLMMetrics(w http.ResponseWriter, r *http.Request) {
	l := s.Load()
	labels := `{engine="0",model_name="` + labelEscaper.Replace(s.cfg.Model) + `"}`
	var b strings.Builder
	gauge := func(name, help, value string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s%s %s\n", name, help, name, name, labels, value)
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", strconv.Itoa(l.Running)+".0")
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", strconv.Itoa(l.Queued)+".0")
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", strconv.FormatFloat(l.KVUsage, 'g', -1, 64))
	// The cache configuration as an info gauge whose labels are
	// CacheConfig's fields (v1/metrics/loggers.py log_metrics_info,
	// config/cache.py CacheConfig.metrics_info), and prometheus_client's
	// process collector's start time.
	fmt.Fprintf(&b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"+
		"vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"%s\",engine=\"0\",num_gpu_blocks=\"%d\"} 1.0\n",
		s.cfg.PageSize, labelEscaper.Replace(s.cfg.DType), s.cfg.Pages)
	// What the decode counts of its KV (v1/metrics/loggers.py
	// prompt_tokens_by_source and request_success; the NixlConnector's
	// KVConnectorPromMetrics): every prompt token of a PD request arrives
	// by transfer (as on a real decode: realengine's TestVLLM), unless the
	// recompute fault is in effect.
	c := &s.counters
	fmt.Fprintf(&b, "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.\n# TYPE vllm:prompt_tokens_by_source_total counter\n")
	for _, src := range []struct {
		name string
		n    int64
	}{{"local_compute", c.promptComputed.Load()}, {"local_cache_hit", c.promptCached.Load()}, {"external_kv_transfer", c.promptTransferred.Load()}} {
		fmt.Fprintf(&b, "vllm:prompt_tokens_by_source_total{engine=\"0\",model_name=%q,source=%q} %d.0\n", s.cfg.Model, src.name, src.n)
	}
	// The prefix cache's lookups, in prompt tokens (v1/metrics/loggers.py
	// counter_prefix_cache_queries and counter_prefix_cache_hits, from
	// the scheduler's PrefixCacheStats); a decode's stay 0.
	var cs cacheStats
	if s.cache != nil {
		cs = s.cache.stats()
	}
	counter := func(name, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s%s %d.0\n", name, help, name, name, labels, v)
	}
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", cs.queried)
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", cs.hit)
	fmt.Fprintf(&b, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter\n"+
		"vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=%q} %d.0\n", s.cfg.Model, c.succeeded.Load())
	fmt.Fprintf(&b, "# HELP vllm:nixl_num_failed_transfers_total Number of failed NIXL KV Cache transfers.\n"+
		"# TYPE vllm:nixl_num_failed_transfers_total counter\nvllm:nixl_num_failed_transfers_total%s %d.0\n", labels, c.transferErrors.Load())
	fmt.Fprintf(&b, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"+
		"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %s\n",
		strconv.FormatFloat(float64(s.startedAt.UnixNano())/1e9, 'f', -1, 64))
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// promFloat writes v as prometheus_client writes a float: Python's repr
// (1.0, 0.25).
func promFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e16 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
