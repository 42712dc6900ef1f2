package router

import "testing"

// TestBlockCount: the blocks a vLLM prefill hands its decode are the IDs in
// kv_transfer_params.remote_block_ids, one list per KV cache group
// (vLLM 0.32's NixlConnector; sim/testdata/vllm records a real answer).
func TestBlockCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kv   string
		want int
	}{
		{`{"do_remote_prefill":true,"remote_block_ids":[[1,2,3]],"remote_port":5600}`, 3},
		{`{"remote_block_ids":[[10, 11], [12]]}`, 3},
		{`{"remote_block_ids":[[]]}`, 0},
		{`{"remote_block_ids":null}`, -1},
		{`{"remote_block_ids":[["a"]]}`, -1},
		{`{"remote_engine_id":"e"}`, -1},
		{`not json`, -1},
	} {
		if got := blockCount([]byte(tc.kv)); got != tc.want {
			t.Errorf("blockCount(%s) = %d, want %d", tc.kv, got, tc.want)
		}
	}
}
