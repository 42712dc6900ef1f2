package registry

import (
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"unicode"
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

// Limits on registration fields.
const (
	MaxNameLen  = 253
	MaxRanks    = 1024
	MaxRegions  = 4096
	MaxLabels   = 64
	MaxLabelLen = 256
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
// lack of one.
func (s *PeerSpec) Validate() error {
	if err := validateText("name", s.Name, MaxNameLen); err != nil {
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
	if s.BootstrapPort < 0 || s.BootstrapPort > 65535 {
		return fieldErr("bootstrap_port", "must be between 1 and 65535, got %d", s.BootstrapPort)
	}
	if s.BootstrapHost != "" {
		if err := validateText("bootstrap_host", s.BootstrapHost, MaxNameLen); err != nil {
			return err
		}
	}
	if err := validateText("model", s.Model, 512); err != nil {
		return err
	}
	if err := validateText("instance_id", s.InstanceID, 256); err != nil {
		return err
	}
	if s.TransferGroup != "" {
		if err := validateText("transfer_group", s.TransferGroup, 256); err != nil {
			return err
		}
	}
	if len(s.Labels) > MaxLabels {
		return fieldErr("labels", "at most %d labels, got %d", MaxLabels, len(s.Labels))
	}
	for _, k := range sortedKeys(s.Labels) {
		if err := validateText("labels", k, MaxLabelLen); err != nil {
			return err
		}
		if len(s.Labels[k]) > MaxLabelLen {
			return fieldErr("labels."+k, "longer than %d bytes", MaxLabelLen)
		}
	}
	if err := s.Parallelism.validate(); err != nil {
		return err
	}
	if err := s.KV.validate(); err != nil {
		return err
	}
	return validateRanks(s.Ranks)
}

func (p Parallelism) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"tp_size", p.TPSize}, {"attn_tp_size", p.AttnTPSize}, {"dp_size", p.DPSize}, {"pp_size", p.PPSize}, {"dcp_size", p.DCPSize}} {
		if f.v < 1 {
			return fieldErr("parallelism."+f.name, "must be at least 1, got %d", f.v)
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

func (g KVGeometry) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"page_size", g.PageSize}, {"num_layers", g.NumLayers}, {"num_kv_heads", g.NumKVHeads}, {"head_dim", g.HeadDim}} {
		if f.v < 1 {
			return fieldErr("kv."+f.name, "must be at least 1, got %d", f.v)
		}
	}
	return validateText("kv.dtype", g.DType, 64)
}

// Bounds of a rank's transfer secret: at least 128 bits, and short enough
// that nobody stores a payload in it.
const (
	MinTransferSecret = 16
	MaxTransferSecret = 64
)

func validateRanks(ranks []Rank) error {
	if len(ranks) == 0 {
		return fieldErr("ranks", "at least one rank is required")
	}
	if len(ranks) > MaxRanks {
		return fieldErr("ranks", "at most %d ranks, got %d", MaxRanks, len(ranks))
	}
	seenRank := map[int]bool{}
	seenAgent := map[string]bool{}
	for i := range ranks {
		r := &ranks[i]
		at := func(f string) string { return fmt.Sprintf("ranks[%d].%s", i, f) }
		if r.Rank < 0 {
			return fieldErr(at("rank"), "must not be negative, got %d", r.Rank)
		}
		if seenRank[r.Rank] {
			return fieldErr(at("rank"), "rank %d appears twice", r.Rank)
		}
		seenRank[r.Rank] = true
		if r.GPUID < -1 {
			return fieldErr(at("gpu_id"), "must be -1 (none) or a device index, got %d", r.GPUID)
		}
		if err := validateText(at("agent_name"), r.AgentName, MaxNameLen); err != nil {
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
		if len(r.AuxDataLens) != len(r.AuxDataPtrs) {
			return fieldErr(at("aux_data_lens"), "need one length per aux region: %d regions, %d lengths", len(r.AuxDataPtrs), len(r.AuxDataLens))
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

func validateText(field, v string, maxLen int) error {
	if strings.TrimSpace(v) == "" {
		return fieldErr(field, "is required")
	}
	if len(v) > maxLen {
		return fieldErr(field, "longer than %d bytes", maxLen)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return fieldErr(field, "must not contain control characters")
		}
	}
	return nil
}

func validateURL(field, v string) error {
	if v == "" {
		return fieldErr(field, "is required")
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

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
