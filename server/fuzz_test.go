package server_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// FuzzRegister feeds arbitrary bodies to the registration endpoint: the
// answer must be a 2xx or a 4xx problem, never a 5xx or a dropped connection.
func FuzzRegister(f *testing.F) {
	good := specJSON(registrytest.Spec("p0", registry.RolePrefill))
	f.Add(good)
	f.Add([]byte(`{"name":"x","ranks":[{"kv_mem_kinds":["VRAM",null]}]}`))
	f.Add([]byte(`{"ranks":[{"kv_data_ptrs":[18446744073709551615],"kv_data_lens":[1]}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"parallelism":{"tp_size":1e400}}`))
	b := setup(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _ := http.NewRequest("POST", b.url+"/api/v1/peers", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+joinToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("status %d for body %q", resp.StatusCode, body)
		}
		if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("status %d without problem+json for body %q", resp.StatusCode, body)
		}
	})
}
