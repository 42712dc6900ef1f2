package registry_test

import (
	"errors"
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
		{"empty name", func(s *registry.PeerSpec) { s.Name = " " }, "name"},
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
		{"transfer secret of 128 bits", func(s *registry.PeerSpec) { s.Ranks[0].TransferSecret = make([]byte, 16) }, ""},
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
