package registry_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(s *registry.PeerSpec)
		field string
	}{
		{"valid", func(s *registry.PeerSpec) {}, ""},
		{"hostile name is allowed text", func(s *registry.PeerSpec) { s.Name = "<img src=x onerror=alert(1)>" }, ""},
		{"empty name", func(s *registry.PeerSpec) { s.Name = "" }, "name"},
		{"a space is a name", func(s *registry.PeerSpec) { s.Name = " " }, ""},
		{"NUL in name", func(s *registry.PeerSpec) { s.Name = "a\x00b" }, "name"},
		{"invalid UTF-8 in model", func(s *registry.PeerSpec) { s.Model = "m\xff" }, "model"},
		{"C1 control in instance", func(s *registry.PeerSpec) { s.InstanceID = "i\u0085" }, "instance_id"},
		{"name of 253 characters, 759 bytes", func(s *registry.PeerSpec) { s.Name = strings.Repeat("名", 253) }, ""},
		{"name of 254 characters", func(s *registry.PeerSpec) { s.Name = strings.Repeat("n", 254) }, "name"},
		{"NUL in label value", func(s *registry.PeerSpec) { s.Labels = map[string]string{"foo": "a\x00"} }, "labels.foo"},
		{"newline in label key", func(s *registry.PeerSpec) { s.Labels = map[string]string{"a\nb": "x"} }, "labels"},
		{"empty label key", func(s *registry.PeerSpec) { s.Labels = map[string]string{"": "x"} }, "labels"},
		{"empty label value is fine", func(s *registry.PeerSpec) { s.Labels = map[string]string{"k": ""} }, ""},
		{"NUL in url", func(s *registry.PeerSpec) { s.URL = "http://h\x00/" }, "url"},
		{"NUL in dtype", func(s *registry.PeerSpec) { s.KV.DType = "\x00" }, "kv.dtype"},
		{"NUL in transfer group", func(s *registry.PeerSpec) { s.TransferGroup = "g\x00" }, "transfer_group"},
		{"kv events", func(s *registry.PeerSpec) {
			s.KVEvents = registry.KVEvents{Endpoint: "tcp://10.0.0.7:5557", ReplayEndpoint: "tcp://[fd00::7]:5558", Topic: "kv"}
		}, ""},
		{"kv events bind address", func(s *registry.PeerSpec) { s.KVEvents.Endpoint = "tcp://*:5557" }, "kv_events.endpoint"},
		{"kv events not tcp", func(s *registry.PeerSpec) { s.KVEvents.Endpoint = "ipc:///tmp/kv" }, "kv_events.endpoint"},
		{"kv events port 0", func(s *registry.PeerSpec) { s.KVEvents.Endpoint = "tcp://h:0" }, "kv_events.endpoint"},
		{"kv events no port", func(s *registry.PeerSpec) { s.KVEvents.Endpoint = "tcp://h" }, "kv_events.endpoint"},
		{"kv events replay without endpoint", func(s *registry.PeerSpec) { s.KVEvents.ReplayEndpoint = "tcp://h:5558" }, "kv_events.endpoint"},
		{"kv events bad replay", func(s *registry.PeerSpec) {
			s.KVEvents = registry.KVEvents{Endpoint: "tcp://h:5557", ReplayEndpoint: "tcp://0.0.0.0:5558"}
		}, "kv_events.replay_endpoint"},
		{"kv events NUL in topic", func(s *registry.PeerSpec) { s.KVEvents = registry.KVEvents{Endpoint: "tcp://h:1", Topic: "\x00"} }, "kv_events.topic"},
		{"tp above int32", func(s *registry.PeerSpec) { s.Parallelism.TPSize = 1 << 32; s.Parallelism.AttnTPSize = 1 }, "parallelism.tp_size"},
		{"tp at int32 max", func(s *registry.PeerSpec) { s.Parallelism.TPSize = math.MaxInt32; s.Parallelism.AttnTPSize = 1 }, ""},
		{"head dim above int32", func(s *registry.PeerSpec) { s.KV.HeadDim = math.MaxInt32 + 1 }, "kv.head_dim"},
		{"rank above int32", func(s *registry.PeerSpec) { s.Ranks[0].Rank = 4294967301 }, "ranks[0].rank"},
		{"gpu above int32", func(s *registry.PeerSpec) { s.Ranks[0].GPUID = 4294967301 }, "ranks[0].gpu_id"},
		{"NUL in agent name", func(s *registry.PeerSpec) { s.Ranks[0].AgentName = "\x00" }, "ranks[0].agent_name"},
		{"too many aux regions", func(s *registry.PeerSpec) {
			s.Ranks[0].AuxDataPtrs = make([]uint64, registry.MaxRegions+1)
			s.Ranks[0].AuxDataLens = make([]uint64, registry.MaxRegions+1)
		}, "ranks[0].aux_data_ptrs"},
		{"control character in name", func(s *registry.PeerSpec) { s.Name = "a\nb" }, "name"},
		{"unknown engine", func(s *registry.PeerSpec) { s.Engine = "trt" }, "engine"},
		{"url without host", func(s *registry.PeerSpec) { s.URL = "http://" }, "url"},
		{"bootstrap port out of range", func(s *registry.PeerSpec) { s.BootstrapPort = 70000 }, "bootstrap_port"},
		{"no model", func(s *registry.PeerSpec) { s.Model = "" }, "model"},
		{"no instance", func(s *registry.PeerSpec) { s.InstanceID = "" }, "instance_id"},
		{"pp rank past pp size", func(s *registry.PeerSpec) { s.Parallelism.PPRank = 1 }, "parallelism.pp_rank"},
		{"attn tp above tp", func(s *registry.PeerSpec) { s.Parallelism.AttnTPSize = 2 }, "parallelism.attn_tp_size"},
		{"no layers", func(s *registry.PeerSpec) { s.KV.NumLayers = 0 }, "kv.num_layers"},
		{"no ranks", func(s *registry.PeerSpec) { s.Ranks = nil }, "ranks"},
		{"duplicate agent", func(s *registry.PeerSpec) { r := s.Ranks[0]; r.Rank = 1; s.Ranks = append(s.Ranks, r) }, "ranks[1].agent_name"},
		{"duplicate rank", func(s *registry.PeerSpec) { r := s.Ranks[0]; r.AgentName = "x"; s.Ranks = append(s.Ranks, r) }, "ranks[1].rank"},
		{"no regions", func(s *registry.PeerSpec) { s.Ranks[0].KVDataPtrs = nil }, "ranks[0].kv_data_ptrs"},
		{"lens short", func(s *registry.PeerSpec) { s.Ranks[0].KVDataLens = s.Ranks[0].KVDataLens[:1] }, "ranks[0].kv_data_lens"},
		{"item longer than region", func(s *registry.PeerSpec) { s.Ranks[0].KVItemLens[1] = 1 << 30 }, "ranks[0].kv_item_lens[1]"},
		{"kinds missing", func(s *registry.PeerSpec) { s.Ranks[0].KVMemKinds = nil }, "ranks[0].kv_mem_kinds"},
		{"kinds short", func(s *registry.PeerSpec) { s.Ranks[0].KVMemKinds = s.Ranks[0].KVMemKinds[:1] }, "ranks[0].kv_mem_kinds"},
		{"kind out of range", func(s *registry.PeerSpec) { s.Ranks[0].KVMemKinds[1] = 9 }, "ranks[0].kv_mem_kinds[1]"},
		{"null pointer", func(s *registry.PeerSpec) { s.Ranks[0].KVDataPtrs[0] = 0 }, "ranks[0].kv_data_ptrs[0]"},
		{"overlap", func(s *registry.PeerSpec) { s.Ranks[0].KVDataPtrs[1] = s.Ranks[0].KVDataPtrs[0] + 10 }, "ranks[0].kv_data_ptrs[1]"},
		{"same address, different kinds is fine", func(s *registry.PeerSpec) {
			s.Ranks[0].KVDataPtrs[1] = s.Ranks[0].KVDataPtrs[0]
			s.Ranks[0].KVMemKinds[1] = registry.DRAM
		}, ""},
		{"wraps", func(s *registry.PeerSpec) { s.Ranks[0].KVDataPtrs[0] = ^uint64(0) - 10 }, "ranks[0].kv_data_lens[0]"},
		{"transfer secret too short", func(s *registry.PeerSpec) { s.Ranks[0].TransferSecret = []byte("short") }, "ranks[0].transfer_secret"},
		{"agent metadata at its cap", func(s *registry.PeerSpec) { s.Ranks[0].AgentMetadata = make([]byte, registry.MaxAgentMetadata) }, ""},
		{"agent metadata a byte over its cap", func(s *registry.PeerSpec) { s.Ranks[0].AgentMetadata = make([]byte, registry.MaxAgentMetadata+1) }, "ranks[0].agent_metadata"},
		{"transfer secret of 128 bits", func(s *registry.PeerSpec) { s.Ranks[0].TransferSecret = make([]byte, 16) }, ""},

		// Provenance: what may be unknown, and that unknown means absent.
		{"ranks unknown", func(s *registry.PeerSpec) { s.Ranks, s.Unknown = nil, []string{"ranks"} }, ""},
		{"ranks unknown but given", func(s *registry.PeerSpec) { s.Unknown = []string{"ranks"} }, "ranks"},
		{"declared rank without kinds is still refused beside unknowns", func(s *registry.PeerSpec) {
			s.KV.NumLayers, s.Unknown = 0, []string{"kv.num_layers"}
			s.Ranks[0].KVMemKinds = nil
		}, "ranks[0].kv_mem_kinds"},
		{"layers unknown", func(s *registry.PeerSpec) { s.KV.NumLayers, s.Unknown = 0, []string{"kv.num_layers"} }, ""},
		{"layers unknown but given", func(s *registry.PeerSpec) { s.Unknown = []string{"kv.num_layers"} }, "kv.num_layers"},
		{"mla unknown but true", func(s *registry.PeerSpec) { s.KV.IsMLA, s.Unknown = true, []string{"kv.is_mla"} }, "kv.is_mla"},
		{"model cannot be unknown", func(s *registry.PeerSpec) { s.Unknown = []string{"model"} }, "unknown[0]"},
		{"page size cannot be unknown", func(s *registry.PeerSpec) { s.Unknown = []string{"kv.page_size"} }, "unknown[0]"},
		{"unknown listed twice", func(s *registry.PeerSpec) { s.Ranks, s.Unknown = nil, []string{"ranks", "ranks"} }, "unknown[1]"},
		{"observed and unknown", func(s *registry.PeerSpec) {
			s.Ranks, s.Observed, s.Unknown = nil, []string{"ranks"}, []string{"ranks"}
		}, "unknown[0]"},
		{"observed names no field", func(s *registry.PeerSpec) { s.Observed = []string{"kv.colour"} }, "observed[0]"},
		{"observed model", func(s *registry.PeerSpec) { s.Observed = []string{"model", "kv.dtype"} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := registrytest.Spec("p", registry.RolePrefill)
			tc.edit(&s)
			err := s.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("error %v, want a FieldError on %q", err, tc.field)
			}
		})
	}
}

func wantField(t *testing.T, what string, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("%s: unexpected error: %v", what, err)
		}
		return
	}
	var fe *registry.FieldError
	if !errors.As(err, &fe) || fe.Field != field || !errors.Is(err, registry.ErrInvalid) {
		t.Fatalf("%s: error %v, want a FieldError on %q", what, err, field)
	}
}

func TestValidateHeartbeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		hb    registry.Heartbeat
		field string
	}{
		{"valid", registry.Heartbeat{InstanceID: "i", Load: registry.Load{Running: math.MaxInt32, Queued: 0, KVUsage: 1}}, ""},
		{"no instance", registry.Heartbeat{}, "instance_id"},
		{"NUL in instance", registry.Heartbeat{InstanceID: "i\x00"}, "instance_id"},
		{"invalid UTF-8 instance", registry.Heartbeat{InstanceID: "\xc3"}, "instance_id"},
		{"running that int32 would wrap to 5", registry.Heartbeat{InstanceID: "i", Load: registry.Load{Running: 4294967301}}, "load.running"},
		{"negative queued", registry.Heartbeat{InstanceID: "i", Load: registry.Load{Queued: -1}}, "load.queued"},
		{"queued above int32", registry.Heartbeat{InstanceID: "i", Load: registry.Load{Queued: math.MaxInt32 + 1}}, "load.queued"},
		{"kv usage NaN", registry.Heartbeat{InstanceID: "i", Load: registry.Load{KVUsage: math.NaN()}}, "load.kv_usage"},
		{"kv usage above 1", registry.Heartbeat{InstanceID: "i", Load: registry.Load{KVUsage: 1.5}}, "load.kv_usage"},
	} {
		wantField(t, tc.name, tc.hb.Validate(), tc.field)
	}
}

func TestValidateReports(t *testing.T) {
	t.Parallel()
	const id = "6f1c3c55-1111-4222-8333-444455556666"
	for _, tc := range []struct {
		name  string
		f     registry.TransferFailure
		field string
	}{
		{"valid", registry.TransferFailure{Reason: "r", Error: "Traceback:\n\tline 1", PrefillID: id, DecodeAgent: "a"}, ""},
		{"no reason", registry.TransferFailure{}, "reason"},
		{"NUL in reason", registry.TransferFailure{Reason: "\x00"}, "reason"},
		{"reason too long", registry.TransferFailure{Reason: strings.Repeat("r", registry.MaxReasonLen+1)}, "reason"},
		{"NUL in error", registry.TransferFailure{Reason: "r", Error: "e\x00"}, "error"},
		{"invalid UTF-8 in error", registry.TransferFailure{Reason: "r", Error: "e\xff"}, "error"},
		{"prefill id not a uuid", registry.TransferFailure{Reason: "r", PrefillID: "p0"}, "prefill_id"},
		{"prefill id in upper case", registry.TransferFailure{Reason: "r", PrefillID: strings.ToUpper(id)}, "prefill_id"},
		{"control character in agent", registry.TransferFailure{Reason: "r", DecodeAgent: "a\tb"}, "agent_name"},
	} {
		wantField(t, tc.name, tc.f.Validate(), tc.field)
	}
}

func TestValidateQueries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"events default", registry.EventQuery{}.Validate(), ""},
		{"events negative before", registry.EventQuery{Before: -1}.Validate(), "before"},
		{"events negative after", registry.EventQuery{After: -1}.Validate(), "after"},
		{"events limit too big", registry.EventQuery{Limit: registry.MaxEventPage + 1}.Validate(), "limit"},
		{"events peer not a uuid", registry.EventQuery{PeerID: "x\x00"}.Validate(), "peer_id"},
		{"filter default", registry.Filter{}.Validate(), ""},
		{"filter NUL model", registry.Filter{Model: "\x00"}.Validate(), "model"},
		{"filter bad role", registry.Filter{Role: "router"}.Validate(), "role"},
		{"filter bad state", registry.Filter{State: "gone"}.Validate(), "state"},
	} {
		wantField(t, tc.name, tc.err, tc.field)
	}
}

func TestCleanText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"fine\nline", 100, "fine\nline"},
		{"nul\x00here", 100, "nul\uFFFDhere"},
		{"cut mid-rune \xe5\x90", 100, "cut mid-rune \uFFFD"},
		{strings.Repeat("名", 5), 4, strings.Repeat("名", 4)},
		{strings.Repeat("e", registry.MaxErrorLen+10), registry.MaxErrorLen, strings.Repeat("e", registry.MaxErrorLen)},
	} {
		got := registry.CleanText(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("CleanText(%.40q, %d) = %.40q, want %.40q", tc.in, tc.max, got, tc.want)
		}
		if err := registry.ValidateStaleMark("r", got); err != nil {
			t.Errorf("cleaned text %.40q is refused: %v", got, err)
		}
	}
}
