package pdproto

import (
	"encoding/json"
	"testing"
)

// TestVLLMPrefillKVTransferParams pins the prefill's hand-off request to
// what vLLM's proxy sends (tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py send_request_to_service: do_remote_decode True,
// do_remote_prefill False, remote_engine_id, remote_block_ids, remote_host
// and remote_port None) and checks it reads back into KVTransferParams.
func TestVLLMPrefillKVTransferParams(t *testing.T) {
	t.Parallel()
	var raw map[string]map[string]any
	if err := json.Unmarshal([]byte("{"+VLLMPrefillKVTransferParams+"}"), &raw); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	got := raw["kv_transfer_params"]
	if len(got) != len(want) {
		t.Fatalf("members %v, want %v", got, want)
	}
	for k, v := range want {
		if gv, ok := got[k]; !ok || gv != v {
			t.Errorf("%s = %v, want %v", k, gv, v)
		}
	}
	var p struct {
		KV KVTransferParams `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte("{"+VLLMPrefillKVTransferParams+"}"), &p); err != nil || !p.KV.DoRemoteDecode || p.KV.DoRemotePrefill ||
		p.KV.RemoteEngineID != nil || p.KV.RemoteHost != nil || p.KV.RemotePort != nil || p.KV.RemoteBlockIDs != nil {
		t.Fatalf("%+v %v", p.KV, err)
	}
}
