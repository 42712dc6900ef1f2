package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// PublishedConfig configures a PublishedEngine: the engine, and what the
// operator declares because the engine does not publish it.
type PublishedConfig struct {
	// Engine is registry.EngineSGLang or registry.EngineVLLM.
	Engine registry.Engine
	// URL is the engine's HTTP base URL.
	URL string
	// Name is the peer's name; the URL's host:port when empty.
	Name string
	// ModelDir is a local model directory or Hugging Face cache snapshot
	// holding the model's config.json; without it the KV shape (layers,
	// KV heads, head dim, MLA) is registered as unknown.
	ModelDir string
	// Role is declared for vLLM, which does not publish it. For SGLang it
	// is read from disaggregation_mode and, when also set here, must agree.
	Role registry.Role
	// TPSize is declared for vLLM, whose HTTP API does not publish its
	// parallelism. Unused for SGLang.
	TPSize int
	// BootstrapHost, TransferGroup and Labels are declared as they are.
	BootstrapHost string
	TransferGroup string
	Labels        map[string]string
	// KVEvents is where the engine publishes its KV cache events, as its
	// --kv-events-config says, with a host routers reach instead of a bind
	// address; zero when it publishes none. No engine serves it over HTTP.
	KVEvents registry.KVEvents
	// Client reads the engine; a 5 s timeout client when nil.
	Client *http.Client
	// Nonce tells this agent process's health epochs from another's; the
	// start time of the agent when empty (see PublishedEngine).
	Nonce string
}

// WithDefaults fills in unset fields.
func (c PublishedConfig) WithDefaults() PublishedConfig {
	if c.Client == nil {
		c.Client = &http.Client{Timeout: 5 * time.Second}
	}
	if c.Name == "" {
		if u, err := url.Parse(c.URL); err == nil {
			c.Name = u.Host
		}
	}
	if c.Nonce == "" {
		c.Nonce = strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	c.URL = strings.TrimRight(c.URL, "/")
	return c
}

func (c PublishedConfig) validate() error {
	switch c.Engine {
	case registry.EngineSGLang:
		if c.Role != "" && !c.Role.Valid() {
			return fmt.Errorf("published engine: role: unknown role %q", c.Role)
		}
	case registry.EngineVLLM:
		if !c.Role.Valid() {
			return fmt.Errorf("published engine: role: vLLM does not publish its role; declare prefill, decode or both (got %q)", c.Role)
		}
		if c.TPSize < 1 {
			return fmt.Errorf("published engine: tp size: vLLM does not publish its parallelism; declare a TP size of at least 1 (got %d)", c.TPSize)
		}
	default:
		return fmt.Errorf("published engine: engine: want sglang or vllm, got %q", c.Engine)
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("published engine: engine URL %q: want an http(s) URL with a host", c.URL)
	}
	if c.Name == "" {
		return errors.New("published engine: name is empty")
	}
	return nil
}

// PublishedEngine is a stock SGLang or vLLM engine registered from what it
// publishes over HTTP, with no spec file: model, role, parallelism, page
// size and KV dtype are observed; the KV shape comes from config.json when
// a model directory is given; NIXL agents, KV regions and memory kinds are
// unknown (the engine keeps them inside its process and moves its KV
// itself). Nothing it cannot read is invented: a missing endpoint or field
// is an error naming the URL and endpoint, and the agent retries.
//
// Instance identity: the engine's process_start_time_seconds from /metrics
// when it publishes one; otherwise a health epoch, which advances each time
// /health comes back after failing, so a restart the agent saw still starts
// a new generation.
type PublishedEngine struct {
	cfg PublishedConfig

	mu     sync.Mutex
	epoch  int  // health epochs seen by this agent
	downed bool // /health failed since the epoch began
}

var _ Engine = (*PublishedEngine)(nil)

// NewPublishedEngine checks the configuration.
func NewPublishedEngine(cfg PublishedConfig) (*PublishedEngine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &PublishedEngine{cfg: cfg}, nil
}

// EndpointError is an engine endpoint that could not be read: no answer,
// a status other than 200, or a body that is not the JSON (or Prometheus
// text) the engine's source says it serves.
type EndpointError struct {
	URL      string // the engine's base URL
	Endpoint string // the path, e.g. /server_info
	Status   int    // the HTTP status, 0 when there was no answer
	Err      error
}

func (e *EndpointError) Error() string {
	switch {
	case e.Status != 0 && e.Err == nil:
		return fmt.Sprintf("engine %s: GET %s answered %d", e.URL, e.Endpoint, e.Status)
	case e.Status != 0:
		return fmt.Sprintf("engine %s: GET %s (status %d): %v", e.URL, e.Endpoint, e.Status, e.Err)
	}
	return fmt.Sprintf("engine %s: GET %s: %v", e.URL, e.Endpoint, e.Err)
}

func (e *EndpointError) Unwrap() error { return e.Err }

// notFound reports whether the endpoint does not exist on this version of
// the engine, so that its older or newer name is worth a try.
func notFound(err error) bool {
	var ee *EndpointError
	return errors.As(err, &ee) && ee.Status == http.StatusNotFound
}

// maxInfoBody bounds an info answer; SGLang's /server_info is a few KiB.
const maxInfoBody = 8 << 20

// get reads one endpoint; a status other than 200 or a body of another
// media type than want (any when empty) is an *EndpointError.
func (e *PublishedEngine) get(ctx context.Context, path, want string) ([]byte, error) {
	fail := func(status int, err error) ([]byte, error) {
		return nil, &EndpointError{URL: e.cfg.URL, Endpoint: path, Status: status, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.cfg.URL+path, nil)
	if err != nil {
		return fail(0, err)
	}
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		return fail(0, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxInfoBody))
	if err != nil {
		return fail(resp.StatusCode, fmt.Errorf("read body: %w", err))
	}
	if resp.StatusCode != http.StatusOK {
		return fail(resp.StatusCode, nil)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); want != "" && mt != want {
		return fail(resp.StatusCode, fmt.Errorf("answered %q, want %s (is this the engine?)", resp.Header.Get("Content-Type"), want))
	}
	return body, nil
}

// getJSON reads the first of paths that exists into v.
func (e *PublishedEngine) getJSON(ctx context.Context, v any, paths ...string) error {
	var err error
	for _, path := range paths {
		var body []byte
		body, err = e.get(ctx, path, "application/json")
		if notFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, v); err != nil {
			return &EndpointError{URL: e.cfg.URL, Endpoint: path, Status: http.StatusOK, Err: fmt.Errorf("parse JSON: %w", err)}
		}
		return nil
	}
	return err
}

// Spec reads what the engine publishes.
func (e *PublishedEngine) Spec(ctx context.Context) (registry.PeerSpec, error) {
	s := registry.PeerSpec{
		Name: e.cfg.Name, Engine: e.cfg.Engine, URL: e.cfg.URL, BootstrapHost: e.cfg.BootstrapHost,
		TransferGroup: e.cfg.TransferGroup, Labels: e.cfg.Labels, KVEvents: e.cfg.KVEvents,
	}
	var err error
	var modelPath string
	if e.cfg.Engine == registry.EngineSGLang {
		modelPath, err = e.sglang(ctx, &s)
	} else {
		modelPath, err = e.vllm(ctx, &s)
	}
	if err != nil {
		return registry.PeerSpec{}, err
	}
	if err := e.instance(ctx, &s); err != nil {
		return registry.PeerSpec{}, err
	}
	if e.cfg.ModelDir == "" {
		s.Unknown = append(s.Unknown, registry.FieldNumLayers, registry.FieldNumKVHeads, registry.FieldHeadDim, registry.FieldIsMLA)
	} else {
		cfg, err := ReadModelConfig(e.cfg.ModelDir)
		if err != nil {
			return registry.PeerSpec{}, err
		}
		if err := cfg.agrees(e.cfg.ModelDir, e.cfg.URL, modelPath); err != nil {
			return registry.PeerSpec{}, err
		}
		s.KV.NumLayers, s.KV.NumKVHeads, s.KV.HeadDim, s.KV.IsMLA = cfg.NumLayers, cfg.NumKVHeads, cfg.HeadDim, cfg.IsMLA
		s.Observed = append(s.Observed, registry.FieldNumLayers, registry.FieldNumKVHeads, registry.FieldHeadDim, registry.FieldIsMLA)
		if s.KV.DType == "auto" && cfg.TorchDType != "" {
			// "auto" is the model's own dtype (SGLang ServerArgs.kv_cache_dtype,
			// vLLM CacheConfig.cache_dtype).
			s.KV.DType = cfg.TorchDType
		}
	}
	s.Unknown = append(s.Unknown, registry.FieldRanks)
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return registry.PeerSpec{}, fmt.Errorf("engine %s published a registration the registry refuses: %w", e.cfg.URL, err)
	}
	return s, nil
}

// sglangModelInfo is SGLang's /get_model_info (/model_info on newer
// versions): http_server.py get_model_info.
type sglangModelInfo struct {
	ModelPath    string `json:"model_path"`
	IsGeneration *bool  `json:"is_generation"`
}

// openAIModels is /v1/models as both engines serve it.
type openAIModels struct {
	Data []struct {
		ID          string `json:"id"`
		Root        string `json:"root"`
		MaxModelLen int    `json:"max_model_len"`
	} `json:"data"`
}

func (e *PublishedEngine) missing(endpoint, field string) error {
	return &EndpointError{URL: e.cfg.URL, Endpoint: endpoint, Status: http.StatusOK, Err: fmt.Errorf("no %s in the answer", field)}
}

func (e *PublishedEngine) sglang(ctx context.Context, s *registry.PeerSpec) (string, error) {
	var info pdproto.SGLangServerInfo
	if err := e.getJSON(ctx, &info, "/server_info", "/get_server_info"); err != nil {
		return "", err
	}
	const ep = "/server_info"
	var mi sglangModelInfo
	if err := e.getJSON(ctx, &mi, "/get_model_info", "/model_info"); err != nil {
		return "", err
	}
	if mi.IsGeneration != nil && !*mi.IsGeneration {
		return "", &EndpointError{URL: e.cfg.URL, Endpoint: "/get_model_info", Status: http.StatusOK, Err: errors.New("is_generation is false: an embedding model serves no PD split")}
	}
	switch {
	case info.DisaggregationMode == nil:
		return "", e.missing(ep, "disaggregation_mode")
	case info.PageSize == nil:
		return "", e.missing(ep, "page_size")
	case info.TPSize == nil:
		return "", e.missing(ep, "tp_size")
	case info.KVCacheDType == "":
		return "", e.missing(ep, "kv_cache_dtype")
	}
	var role registry.Role
	switch *info.DisaggregationMode {
	case "prefill":
		role = registry.RolePrefill
	case "decode":
		role = registry.RoleDecode
	default:
		// "null": the engine serves whole requests and takes part in no
		// PD split; SGLang has no mode that does both halves.
		return "", &EndpointError{URL: e.cfg.URL, Endpoint: ep, Status: http.StatusOK,
			Err: fmt.Errorf("disaggregation_mode is %q: the engine was not started as a prefill or decode server", *info.DisaggregationMode)}
	}
	if e.cfg.Role != "" && e.cfg.Role != role {
		return "", fmt.Errorf("engine %s: declared role %s, but GET %s says disaggregation_mode %q", e.cfg.URL, e.cfg.Role, ep, *info.DisaggregationMode)
	}
	s.Role = role
	s.Model = info.ServedModelName
	if s.Model == "" {
		s.Model = info.ModelPath
	}
	if err := e.servesModel(ctx, s.Model); err != nil {
		return "", err
	}
	s.Parallelism.TPSize = *info.TPSize
	s.Parallelism.DPSize, s.Parallelism.PPSize = info.DPSize, info.PPSize
	s.Observed = append(s.Observed, "role", "model", "parallelism.tp_size", "parallelism.dp_size", "parallelism.pp_size")
	if info.EnableDPAttention {
		// SGLang's DP attention splits the TP group into dp_size attention
		// groups (server_args.py: attention TP = tp_size // dp_size).
		if info.DPSize < 1 || *info.TPSize%info.DPSize != 0 {
			return "", &EndpointError{URL: e.cfg.URL, Endpoint: ep, Status: http.StatusOK,
				Err: fmt.Errorf("enable_dp_attention with tp_size %d and dp_size %d: tp_size must be a multiple of dp_size", *info.TPSize, info.DPSize)}
		}
		s.Parallelism.AttnTPSize = *info.TPSize / info.DPSize
		s.Observed = append(s.Observed, "parallelism.attn_tp_size")
	}
	s.KV.PageSize = *info.PageSize
	s.KV.DType = info.KVCacheDType
	if s.KV.DType == "auto" && info.DType != "" && info.DType != "auto" {
		s.KV.DType = info.DType
	}
	s.Observed = append(s.Observed, "kv.page_size", "kv.dtype")
	if role.Prefills() && info.DisaggregationBootstrapPort != 0 {
		s.BootstrapPort = info.DisaggregationBootstrapPort
		s.Observed = append(s.Observed, "bootstrap_port")
	}
	modelPath := mi.ModelPath
	if modelPath == "" {
		modelPath = info.ModelPath
	}
	return modelPath, nil
}

// servesModel checks that /v1/models lists the model.
func (e *PublishedEngine) servesModel(ctx context.Context, name string) error {
	var models openAIModels
	if err := e.getJSON(ctx, &models, "/v1/models"); err != nil {
		return err
	}
	var ids []string
	for _, m := range models.Data {
		if m.ID == name {
			return nil
		}
		ids = append(ids, m.ID)
	}
	return fmt.Errorf("engine %s: GET /v1/models lists %q, not the served model %q", e.cfg.URL, ids, name)
}

// vLLM's cache configuration, published as the info gauge
// vllm:cache_config_info whose labels are CacheConfig's fields
// (vllm/v1/metrics/loggers.py PrometheusStatLogger.log_metrics_info,
// vllm/config/cache.py CacheConfig.metrics_info).
const (
	vllmCacheConfigInfo = "vllm:cache_config_info"
	processStartTime    = "process_start_time_seconds"
)

func (e *PublishedEngine) vllm(ctx context.Context, s *registry.PeerSpec) (string, error) {
	var models openAIModels
	if err := e.getJSON(ctx, &models, "/v1/models"); err != nil {
		return "", err
	}
	if len(models.Data) == 0 || models.Data[0].ID == "" {
		return "", e.missing("/v1/models", "model")
	}
	// /version (entrypoints/openai/api_server.py show_version) carries
	// nothing the registry stores; reading it confirms that the URL is a
	// vLLM server and not some other OpenAI-compatible one.
	var version struct {
		Version *string `json:"version"`
	}
	if err := e.getJSON(ctx, &version, "/version"); err != nil {
		return "", err
	}
	if version.Version == nil {
		return "", e.missing("/version", "version")
	}
	fams, err := e.metrics(ctx)
	if err != nil {
		return "", err
	}
	labels, err := vllmCacheConfig(fams)
	if err != nil {
		return "", &EndpointError{URL: e.cfg.URL, Endpoint: "/metrics", Status: http.StatusOK, Err: err}
	}
	block, err := strconv.Atoi(labels["block_size"])
	if err != nil {
		return "", &EndpointError{URL: e.cfg.URL, Endpoint: "/metrics", Status: http.StatusOK,
			Err: fmt.Errorf("%s block_size %q is not a number", vllmCacheConfigInfo, labels["block_size"])}
	}
	if labels["cache_dtype"] == "" {
		return "", e.missing("/metrics", vllmCacheConfigInfo+" cache_dtype")
	}
	s.Role, s.Model = e.cfg.Role, models.Data[0].ID
	s.Parallelism.TPSize = e.cfg.TPSize
	s.KV.PageSize, s.KV.DType = block, labels["cache_dtype"]
	s.Observed = append(s.Observed, "model", "kv.page_size", "kv.dtype")
	return models.Data[0].Root, nil
}

// vllmCacheConfig returns the labels of vllm:cache_config_info; with
// several engines (DP) every engine's series must agree.
func vllmCacheConfig(fams map[string]*dto.MetricFamily) (map[string]string, error) {
	f, ok := fams[vllmCacheConfigInfo]
	if !ok || len(f.GetMetric()) == 0 {
		return nil, fmt.Errorf("no %s series", vllmCacheConfigInfo)
	}
	var out map[string]string
	for _, m := range f.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			if p.GetName() != "engine" {
				l[p.GetName()] = p.GetValue()
			}
		}
		if out == nil {
			out = l
			continue
		}
		for _, k := range []string{"block_size", "cache_dtype"} {
			if l[k] != out[k] {
				return nil, fmt.Errorf("%s: engines disagree on %s (%q and %q)", vllmCacheConfigInfo, k, out[k], l[k])
			}
		}
	}
	return out, nil
}

func (e *PublishedEngine) metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	body, err := e.get(ctx, "/metrics", "text/plain")
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, &EndpointError{URL: e.cfg.URL, Endpoint: "/metrics", Status: http.StatusOK, Err: fmt.Errorf("parse Prometheus text: %w", err)}
	}
	return fams, nil
}

// instance sets the instance ID: the engine process's start time when
// /metrics publishes it, else this agent's health epoch.
func (e *PublishedEngine) instance(ctx context.Context, s *registry.PeerSpec) error {
	id, observed, err := e.instanceID(ctx)
	if err != nil {
		return err
	}
	s.InstanceID = id
	if observed {
		s.Observed = append(s.Observed, "instance_id")
	}
	return nil
}

func (e *PublishedEngine) instanceID(ctx context.Context) (string, bool, error) {
	fams, err := e.metrics(ctx)
	switch {
	case err == nil:
		if f, ok := fams[processStartTime]; ok && len(f.GetMetric()) > 0 {
			start := f.GetMetric()[0].GetGauge().GetValue()
			return "start-" + strconv.FormatFloat(start, 'f', -1, 64), true, nil
		}
	case !notFound(err):
		// An engine that did not answer is not known to be a new
		// instance; a health epoch now would read as a restart.
		return "", false, err
	}
	// SGLang serves /metrics only with --enable-metrics; without a start
	// time the restarts this agent saw (/health down, then up) count.
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprintf("health-%s-%d", e.cfg.Nonce, e.epoch), false, nil
}

// observeHealth feeds the health epoch: a /health that fails and then
// passes again starts a new epoch, and so a new instance ID.
func (e *PublishedEngine) observeHealth(healthy bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !healthy:
		e.downed = true
	case e.downed:
		e.downed = false
		e.epoch++
	}
}

// Restarted reports whether the engine is a new instance since the spec
// whose instance ID is registered; the agent then registers again, which
// starts a new generation. Errors read as "not known to have restarted":
// the probes report an engine that does not answer.
func (e *PublishedEngine) Restarted(ctx context.Context, registered string) bool {
	id, observed, err := e.instanceID(ctx)
	if err != nil || !observed {
		// No start time read: look at /health (SGLang http_server.py
		// health, vLLM api_server.py health: 200 when serving) to move the
		// epoch on a down-then-up. An engine that does not answer
		// /metrics at all (a restarting process: connection refused) is
		// down too: its /health must be looked at then, or the down half
		// of a restart is never seen.
		_, herr := e.get(ctx, "/health", "")
		e.observeHealth(herr == nil)
		id, _, err = e.instanceID(ctx)
	}
	return err == nil && id != registered
}

// Reregister cannot give a stock engine fresh NIXL agents: only a restart
// does (SGLang creates its agent once, inside the engine process).
func (e *PublishedEngine) Reregister(context.Context, string) error {
	return errors.New("a stock engine gets fresh NIXL agents only by restarting; restart it (the agent registers the new instance)")
}
