package registry

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// FieldError says which field of a registration is wrong and why. Field uses
// the JSON path of the request body, e.g. "ranks[1].kv_mem_kinds".
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Is makes every *FieldError match ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// Field limits. They are the registry's one statement of what a stored
// field may hold: the PostgreSQL schema's column types bound the integers,
// the lengths are caps of this package (PostgreSQL text has none), and
// openapi.yaml repeats every one of them. Lengths count characters (Unicode
// code points), as JSON Schema's maxLength does.
const (
	MaxNameLen          = 253 // name, bootstrap_host, agent names
	MaxModelLen         = 512
	MaxInstanceIDLen    = 256
	MaxTransferGroupLen = 256
	MaxDTypeLen         = 64
	MaxURLLen           = 2048
	MaxRanks            = 1024
	MaxRegions          = 4096 // KV regions per rank, and aux regions per rank
	MaxLabels           = 64
	MaxLabelLen         = 256 // label keys and values
	MaxReasonLen        = 1024
	MaxErrorLen         = 64 << 10
	MaxEventPage        = 1000
	// MaxAgentMetadata bounds a rank's NIXL agent metadata (and a probe's),
	// in bytes. NIXL's serialized metadata is the agent's name, its UCX
	// worker address (some hundred bytes to a few KiB) and a descriptor
	// with a remote key per registered region: an SGLang rank registers
	// one region per layer's K and V (about 100 to 200 on today's models),
	// so a real 8-GPU rank publishes some KiB to a few hundred KiB. 1.5 MiB
	// is several times that and is 2 MiB of base64 exactly (a multiple of
	// 3 bytes, so openapi.yaml's maxLength says the same bound); the
	// finding it answers was a 45 MiB blob, accepted.
	MaxAgentMetadata = 3 << 19
	// MaxInt32 bounds every field stored in an integer column.
	MaxInt32 = math.MaxInt32
	// MaxPort bounds bootstrap_port; 0 means "the default".
	MaxPort = 65535
)

// WithDefaults returns a copy of the spec with unset optional fields filled
// in: parallelism sizes of 1, attention TP equal to TP, and SGLang's default
// bootstrap port for SGLang prefills. TP size is required, so it is not
// defaulted: a zero stays zero and fails validation.
func (s PeerSpec) WithDefaults() PeerSpec {
	p := &s.Parallelism
	if p.AttnTPSize == 0 {
		p.AttnTPSize = p.TPSize
	}
	if p.DPSize == 0 {
		p.DPSize = 1
	}
	if p.PPSize == 0 {
		p.PPSize = 1
	}
	if p.DCPSize == 0 {
		p.DCPSize = 1
	}
	if s.BootstrapPort == 0 && s.Role.Prefills() && s.Engine.Protocol() == EngineSGLang {
		s.BootstrapPort = DefaultBootstrapPort
	}
	return s
}

// Validate checks a registration (after WithDefaults) and returns a
// *FieldError naming the first wrong field. A spec that passes has a memory
// kind for every KV region, so memory-kind resolution can never fail later for
// lack of one, and every value fits its PostgreSQL column, so both stores
// accept exactly the same specs.
func (s *PeerSpec) Validate() error {
	if err := checkText("name", s.Name, required, MaxNameLen, lineText); err != nil {
		return err
	}
	if !s.Role.Valid() {
		return fieldErr("role", "unknown role %q (want prefill, decode or both)", s.Role)
	}
	if !s.Engine.Valid() {
		return fieldErr("engine", "unknown engine %q (want sglang, vllm or sim)", s.Engine)
	}
	if err := validateURL("url", s.URL); err != nil {
		return err
	}
	if err := checkInt("bootstrap_port", s.BootstrapPort, 0, MaxPort); err != nil {
		return err
	}
	for _, f := range []struct {
		name, v  string
		need     bool
		maxChars int
	}{
		{"bootstrap_host", s.BootstrapHost, optional, MaxNameLen},
		{"model", s.Model, required, MaxModelLen},
		{"instance_id", s.InstanceID, required, MaxInstanceIDLen},
		{"transfer_group", s.TransferGroup, optional, MaxTransferGroupLen},
	} {
		if err := checkText(f.name, f.v, f.need, f.maxChars, lineText); err != nil {
			return err
		}
	}
	if err := validateLabels(s.Labels); err != nil {
		return err
	}
	if err := s.KVEvents.validate(); err != nil {
		return err
	}
	if err := s.Parallelism.validate(); err != nil {
		return err
	}
	if err := s.validateProvenance(); err != nil {
		return err
	}
	if err := s.KV.validate(s); err != nil {
		return err
	}
	if !s.Knows(FieldRanks) {
		if len(s.Ranks) > 0 {
			return fieldErr("ranks", "listed in unknown, so it must be empty; got %d ranks", len(s.Ranks))
		}
		return nil
	}
	return validateRanks(s.Ranks)
}

// validateProvenance checks the observed and unknown lists: known field
// paths, each once, none both observed and unknown, and only fields that
// may be unknown listed as unknown.
func (s *PeerSpec) validateProvenance() error {
	seen := map[string]string{}
	for _, l := range []struct {
		name    string
		list    []string
		allowed []string
	}{{"observed", s.Observed, ProvenanceFields()}, {"unknown", s.Unknown, UnknownableFields()}} {
		for i, f := range l.list {
			at := fmt.Sprintf("%s[%d]", l.name, i)
			if !contains(l.allowed, f) {
				return fieldErr(at, "%q is not a field that may be %s (want one of %s)", f, l.name, strings.Join(l.allowed, ", "))
			}
			if prev, ok := seen[f]; ok {
				return fieldErr(at, "%q is already listed in %s", f, prev)
			}
			seen[f] = l.name
		}
	}
	return nil
}

func validateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fieldErr("labels", "at most %d labels, got %d", MaxLabels, len(labels))
	}
	for _, k := range sortedKeys(labels) {
		// A bad key cannot name its own field, so the field is the map.
		if err := checkText("labels", k, required, MaxLabelLen, lineText); err != nil {
			return fieldErr("labels", "label key %q: %s", k, err.(*FieldError).Detail)
		}
		if err := checkText("labels."+k, labels[k], optional, MaxLabelLen, lineText); err != nil {
			return err
		}
	}
	return nil
}

func (p Parallelism) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"tp_size", p.TPSize}, {"attn_tp_size", p.AttnTPSize}, {"dp_size", p.DPSize}, {"pp_size", p.PPSize}, {"dcp_size", p.DCPSize}} {
		if err := checkInt("parallelism."+f.name, f.v, 1, MaxInt32); err != nil {
			return err
		}
	}
	if p.PPRank < 0 || p.PPRank >= p.PPSize {
		return fieldErr("parallelism.pp_rank", "must be in [0, pp_size=%d), got %d", p.PPSize, p.PPRank)
	}
	if p.DCPRank < 0 || p.DCPRank >= p.DCPSize {
		return fieldErr("parallelism.dcp_rank", "must be in [0, dcp_size=%d), got %d", p.DCPSize, p.DCPRank)
	}
	if p.AttnTPSize > p.TPSize {
		return fieldErr("parallelism.attn_tp_size", "must not exceed tp_size=%d, got %d", p.TPSize, p.AttnTPSize)
	}
	return nil
}

// validate checks the geometry; a field the spec lists as unknown must hold
// its zero value, so that nothing unknown is ever stored as if it were known.
func (g KVGeometry) validate(s *PeerSpec) error {
	if err := checkInt("kv.page_size", g.PageSize, 1, MaxInt32); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int
	}{{FieldNumLayers, g.NumLayers}, {FieldNumKVHeads, g.NumKVHeads}, {FieldHeadDim, g.HeadDim}} {
		if !s.Knows(f.name) {
			if f.v != 0 {
				return fieldErr(f.name, "listed in unknown, so it must be absent; got %d", f.v)
			}
			continue
		}
		if f.v == 0 {
			return fieldErr(f.name, "is required, or list it in unknown")
		}
		if err := checkInt(f.name, f.v, 1, MaxInt32); err != nil {
			return err
		}
	}
	if !s.Knows(FieldIsMLA) && g.IsMLA {
		return fieldErr(FieldIsMLA, "listed in unknown, so it must be absent; got true")
	}
	return checkText("kv.dtype", g.DType, required, MaxDTypeLen, lineText)
}

// Bounds of a rank's transfer secret: at least 128 bits, and short enough
// that nobody stores a payload in it.
const (
	MinTransferSecret = 16
	MaxTransferSecret = 64
)

func validateRanks(ranks []Rank) error {
	if len(ranks) == 0 {
		return fieldErr("ranks", "at least one rank is required, or list ranks in unknown")
	}
	if len(ranks) > MaxRanks {
		return fieldErr("ranks", "at most %d ranks, got %d", MaxRanks, len(ranks))
	}
	seenRank := map[int]bool{}
	seenAgent := map[string]bool{}
	for i := range ranks {
		r := &ranks[i]
		at := func(f string) string { return fmt.Sprintf("ranks[%d].%s", i, f) }
		if err := checkInt(at("rank"), r.Rank, 0, MaxInt32); err != nil {
			return err
		}
		if seenRank[r.Rank] {
			return fieldErr(at("rank"), "rank %d appears twice", r.Rank)
		}
		seenRank[r.Rank] = true
		if r.GPUID < -1 || r.GPUID > MaxInt32 {
			return fieldErr(at("gpu_id"), "must be -1 (none) or a device index up to %d, got %d", MaxInt32, r.GPUID)
		}
		if err := checkText(at("agent_name"), r.AgentName, required, MaxNameLen, lineText); err != nil {
			return err
		}
		if seenAgent[r.AgentName] {
			return fieldErr(at("agent_name"), "agent name %q is used by another rank", r.AgentName)
		}
		seenAgent[r.AgentName] = true
		n := len(r.KVDataPtrs)
		if n == 0 {
			return fieldErr(at("kv_data_ptrs"), "at least one KV region is required")
		}
		if n > MaxRegions {
			return fieldErr(at("kv_data_ptrs"), "at most %d regions, got %d", MaxRegions, n)
		}
		if len(r.KVDataLens) != n {
			return fieldErr(at("kv_data_lens"), "need one length per region: %d regions, %d lengths", n, len(r.KVDataLens))
		}
		if len(r.KVItemLens) != n {
			return fieldErr(at("kv_item_lens"), "need one item length per region: %d regions, %d item lengths", n, len(r.KVItemLens))
		}
		if len(r.KVMemKinds) == 0 {
			return fieldErr(at("kv_mem_kinds"), "is required: one memory kind per region, or the destination memory kind cannot be resolved")
		}
		if len(r.KVMemKinds) != n {
			return fieldErr(at("kv_mem_kinds"), "need one memory kind per region: %d regions, %d kinds", n, len(r.KVMemKinds))
		}
		for j := 0; j < n; j++ {
			if r.KVDataPtrs[j] == 0 {
				return fieldErr(fmt.Sprintf("ranks[%d].kv_data_ptrs[%d]", i, j), "must not be zero")
			}
			if r.KVDataLens[j] == 0 {
				return fieldErr(fmt.Sprintf("ranks[%d].kv_data_lens[%d]", i, j), "must be positive")
			}
			if r.KVItemLens[j] == 0 || r.KVItemLens[j] > r.KVDataLens[j] {
				return fieldErr(fmt.Sprintf("ranks[%d].kv_item_lens[%d]", i, j), "must be positive and at most the region length %d, got %d", r.KVDataLens[j], r.KVItemLens[j])
			}
			if !r.KVMemKinds[j].Valid() {
				return fieldErr(fmt.Sprintf("ranks[%d].kv_mem_kinds[%d]", i, j), "unknown memory kind %d", int(r.KVMemKinds[j]))
			}
			if r.KVDataPtrs[j]+r.KVDataLens[j] < r.KVDataPtrs[j] {
				return fieldErr(fmt.Sprintf("ranks[%d].kv_data_lens[%d]", i, j), "region wraps past the end of the address space")
			}
		}
		if j, k, ok := overlap(r.KVDataPtrs, r.KVDataLens, r.KVMemKinds); ok {
			return fieldErr(fmt.Sprintf("ranks[%d].kv_data_ptrs[%d]", i, k), "region overlaps region %d", j)
		}
		if len(r.AuxDataPtrs) > MaxRegions {
			return fieldErr(at("aux_data_ptrs"), "at most %d aux regions, got %d", MaxRegions, len(r.AuxDataPtrs))
		}
		if len(r.AuxDataLens) != len(r.AuxDataPtrs) {
			return fieldErr(at("aux_data_lens"), "need one length per aux region: %d regions, %d lengths", len(r.AuxDataPtrs), len(r.AuxDataLens))
		}
		if len(r.AgentMetadata) > MaxAgentMetadata {
			return fieldErr(at("agent_metadata"), "at most %d bytes (%d of base64), got %d", MaxAgentMetadata, base64Len(MaxAgentMetadata), len(r.AgentMetadata))
		}
		if n := len(r.TransferSecret); n != 0 && (n < MinTransferSecret || n > MaxTransferSecret) {
			return fieldErr(at("transfer_secret"), "must be %d to %d bytes (at least 128 random bits), got %d", MinTransferSecret, MaxTransferSecret, n)
		}
	}
	return nil
}

// overlap finds two regions of the same memory kind whose byte ranges
// intersect, returning their indices.
func overlap(ptrs, lens []uint64, kinds []MemKind) (int, int, bool) {
	idx := make([]int, len(ptrs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		if kinds[idx[a]] != kinds[idx[b]] {
			return kinds[idx[a]] < kinds[idx[b]]
		}
		return ptrs[idx[a]] < ptrs[idx[b]]
	})
	for n := 1; n < len(idx); n++ {
		a, b := idx[n-1], idx[n]
		if kinds[a] == kinds[b] && ptrs[a]+lens[a] > ptrs[b] {
			return min(a, b), max(a, b), true
		}
	}
	return 0, 0, false
}

// Whether a text field must be set.
const (
	required = true
	optional = false
)

// textRule says which characters a text field may hold. PostgreSQL refuses
// only NUL (and invalid UTF-8) in text and jsonb; the registry refuses more
// in identifiers and names, which are shown and compared, never free prose.
type textRule int

const (
	// lineText is for identifiers and names: no control characters
	// (C0, DEL, C1) at all.
	lineText textRule = iota
	// freeText is for messages such as a stale report's error, which may
	// be a multi-line traceback: anything but NUL.
	freeText
)

// checkText applies the text rules to one field: valid UTF-8, set when
// required, at most maxChars characters, and the characters rule allows.
func checkText(field, v string, need bool, maxChars int, rule textRule) error {
	if !utf8.ValidString(v) {
		return fieldErr(field, "is not valid UTF-8")
	}
	if v == "" {
		if need {
			return fieldErr(field, "is required")
		}
		return nil
	}
	if n := utf8.RuneCountInString(v); n > maxChars {
		return fieldErr(field, "longer than %d characters (%d)", maxChars, n)
	}
	for _, r := range v {
		switch {
		case r == 0:
			return fieldErr(field, "must not contain NUL characters")
		case rule == lineText && unicode.IsControl(r):
			return fieldErr(field, "must not contain control characters (U+%04X)", r)
		}
	}
	return nil
}

// CleanText makes text from outside the registry's control (an engine's
// error answer, cut at a byte limit) fit a free-text field of at most
// maxChars characters: invalid UTF-8 and NUL become U+FFFD and the rest is
// cut at a character boundary. Callers that report what they observed use
// it so that their report is never refused for the bytes it quotes.
func CleanText(s string, maxChars int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if utf8.RuneCountInString(s) <= maxChars {
		return s
	}
	n := 0
	for i := range s {
		if n == maxChars {
			return s[:i]
		}
		n++
	}
	return s
}

// checkInt bounds an integer field; every integer the registry stores fits
// in PostgreSQL's integer (int32) column, so nothing is ever truncated.
func checkInt(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fieldErr(field, "must be between %d and %d, got %d", lo, hi, v)
	}
	return nil
}

func validateURL(field, v string) error {
	if err := checkText(field, v, required, MaxURLLen, lineText); err != nil {
		return err
	}
	u, err := url.Parse(v)
	if err != nil {
		return fieldErr(field, "not a URL: %v", errors.Unwrap(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fieldErr(field, "scheme must be http or https, got %q", u.Scheme)
	}
	if u.Host == "" {
		return fieldErr(field, "has no host")
	}
	return nil
}

// MaxKVEventsTopicLen bounds kv_events.topic.
const MaxKVEventsTopicLen = 256

// validate checks an engine's KV events publisher: none at all, or a PUB
// endpoint routers can dial (tcp://HOST:PORT, not a bind address such as
// tcp://*:5557), with an optional replay endpoint of the same form.
func (k *KVEvents) validate() error {
	if k.Endpoint == "" {
		if k.ReplayEndpoint != "" || k.Topic != "" {
			return fieldErr("kv_events.endpoint", "is required when replay_endpoint or topic is set")
		}
		return nil
	}
	for _, f := range []struct{ name, v string }{{"kv_events.endpoint", k.Endpoint}, {"kv_events.replay_endpoint", k.ReplayEndpoint}} {
		if f.v == "" {
			continue
		}
		if err := validateZMQEndpoint(f.name, f.v); err != nil {
			return err
		}
	}
	return checkText("kv_events.topic", k.Topic, optional, MaxKVEventsTopicLen, lineText)
}

// validateZMQEndpoint checks a ZeroMQ TCP endpoint a router dials.
func validateZMQEndpoint(field, v string) error {
	if err := checkText(field, v, required, MaxURLLen, lineText); err != nil {
		return err
	}
	hostPort, ok := strings.CutPrefix(v, "tcp://")
	if !ok {
		return fieldErr(field, "must be tcp://HOST:PORT, got %q", v)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fieldErr(field, "must be tcp://HOST:PORT: %v", err)
	}
	if host == "" || host == "*" || host == "0.0.0.0" || host == "::" {
		return fieldErr(field, "names no host routers can reach (%q is a bind address): give the engine's host", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > MaxPort {
		return fieldErr(field, "port must be 1 to %d, got %q", MaxPort, port)
	}
	return nil
}

// Validate checks a heartbeat's fields (not its peer ID: an ID that names
// no peer is ErrNotFound, not a bad field).
func (hb *Heartbeat) Validate() error {
	if err := checkText("instance_id", hb.InstanceID, required, MaxInstanceIDLen, lineText); err != nil {
		return err
	}
	if !hb.EngineDown && hb.EngineError != "" {
		return fieldErr("engine_error", "is set only when engine_healthy is false")
	}
	if err := checkText("engine_error", hb.EngineError, optional, MaxEngineErrorLen, lineText); err != nil {
		return err
	}
	if err := checkText("heal_error", hb.HealError, optional, MaxHealErrorLen, freeText); err != nil {
		return err
	}
	return hb.Load.validate()
}

func (l Load) validate() error {
	if err := checkInt("load.running", l.Running, 0, MaxInt32); err != nil {
		return err
	}
	if err := checkInt("load.queued", l.Queued, 0, MaxInt32); err != nil {
		return err
	}
	if math.IsNaN(l.KVUsage) || l.KVUsage < 0 || l.KVUsage > 1 {
		return fieldErr("load.kv_usage", "must be between 0 and 1, got %v", l.KVUsage)
	}
	return nil
}

// ValidateStaleMark checks the reason and error text of a stale mark.
func ValidateStaleMark(reason, errText string) error {
	if err := checkText("reason", reason, required, MaxReasonLen, freeText); err != nil {
		return err
	}
	return checkText("error", errText, optional, MaxErrorLen, freeText)
}

// Validate checks a failed-transfer report. Field names are those of the
// stale report body (prefill_id, agent_name), which carries it.
func (f *TransferFailure) Validate() error {
	if err := ValidateStaleMark(f.Reason, f.Error); err != nil {
		return err
	}
	if f.PrefillID != "" && !IsPeerID(f.PrefillID) {
		return fieldErr("prefill_id", "not a peer id (a UUID)")
	}
	return checkText("agent_name", f.DecodeAgent, optional, MaxNameLen, lineText)
}

// Validate checks a peer listing's filter.
func (f Filter) Validate() error {
	if f.Role != "" && !f.Role.Valid() {
		return fieldErr("role", "unknown role %q (want prefill, decode or both)", f.Role)
	}
	if f.State != "" && !f.State.Valid() {
		return fieldErr("state", "unknown state %q", f.State)
	}
	return checkText("model", f.Model, optional, MaxModelLen, lineText)
}

// Validate checks an event query. A zero Limit means the default page.
func (q EventQuery) Validate() error {
	switch {
	case q.Before < 0:
		return fieldErr("before", "must not be negative, got %d", q.Before)
	case q.After < 0:
		return fieldErr("after", "must not be negative, got %d", q.After)
	case q.Limit < 0 || q.Limit > MaxEventPage:
		return fieldErr("limit", "must be between 1 and %d, got %d", MaxEventPage, q.Limit)
	case q.PeerID != "" && !IsPeerID(q.PeerID):
		return fieldErr("peer_id", "not a peer id (a UUID)")
	}
	return nil
}

// IsPeerID reports whether s has the form of a peer ID: a UUID in the
// canonical lowercase 36-character form that both stores issue. A string of
// any other form (upper case, braces, no hyphens: forms PostgreSQL's uuid
// would accept and the embedded store would not) names no peer.
func IsPeerID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		default:
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// MaxLoadCount bounds the running and queued counts of a load; the
// PostgreSQL store keeps them in integer columns.
const MaxLoadCount = 1<<31 - 1

// MaxEngineErrorLen bounds the probe error a heartbeat may carry; it
// becomes the peer's state reason.
const MaxEngineErrorLen = 1024

// MaxHealErrorLen bounds a failed heal action's report (its error and the
// tail of its output).
const MaxHealErrorLen = 4096

// base64Len is the length of n bytes in padded base64, as the API carries
// them.
func base64Len(n int) int { return (n + 2) / 3 * 4 }
