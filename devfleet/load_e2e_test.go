package devfleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/devfleet"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestLoadPoliciesPreferIdleDecode: of two decodes, one is kept busy by
// requests sent to it directly (slow decoding, held streams: load only its
// engine knows of), the other is idle. Its agent's probes read the busy
// engine's load, the heartbeats carry it, and the router's least_load and
// power_of_two policies send the new requests to the idle decode.
func TestLoadPoliciesPreferIdleDecode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy router.Policy
		engine registry.Engine
	}{
		{"least_load", registry.EngineSGLang},
		{"least_load", registry.EngineVLLM},
		{"power_of_two", registry.EngineSGLang},
	} {
		t.Run(string(tc.policy)+"/"+string(tc.engine), func(t *testing.T) {
			t.Parallel()
			log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
			cp := startControlPlane(t, cpConfig{heartbeat: 50 * time.Millisecond, leaseTTL: 5 * time.Second, decodePolicy: tc.policy}, log)
			ctx := context.Background()

			engines := map[string]*sim.Sim{}
			for _, c := range []sim.Config{
				simtest.Config("prefill-0", registry.RolePrefill, tc.engine),
				simtest.Config("decode-idle", registry.RoleDecode, tc.engine),
				simtest.Config("decode-busy", registry.RoleDecode, tc.engine),
			} {
				if c.Name == "decode-busy" {
					c.DecodeTimePerToken = 20 * time.Millisecond
				}
				// A vLLM prefill holds each request's pages until the decode's
				// read notification arrives; on a loaded machine those lag, and
				// simtest's 64 pages ran out mid-test (503). The split is what
				// is measured here, not the pool.
				c.Pages = 512
				c.SharedTransferSecret = nil // the control plane hands out the secrets
				e := startEngine(t, ctx, devfleet.EngineConfig{Sim: c, ControlPlane: cp.BaseURL, JoinToken: joinToken}, log)
				engines[c.Name] = e.Sim()
			}
			p, busy, idle := engines["prefill-0"], engines["decode-busy"], engines["decode-idle"]
			waitSnapshot(t, cp, "both decodes routable", func(s *replica.Snapshot) bool {
				r := s.Routes(sim.DefaultModel)
				return r != nil && len(r.Prefills) == 1 && len(r.DecodesFor(r.Prefills[0].ID)) == 2
			})

			// Four long streams held on the busy decode, sent around the router.
			const held = 4
			hctx, hcancel := context.WithCancel(ctx)
			done := make(chan struct{}, held)
			t.Cleanup(func() {
				hcancel()
				for range held {
					<-done
				}
			})
			for range held {
				go func() {
					defer func() { done <- struct{}{} }()
					c := simtest.NewClient()
					body := map[string]any{"model": "sim-model", "stream": true, "max_tokens": 4000,
						"messages": []any{map[string]any{"role": "user", "content": "hold the decode"}}}
					if tc.engine == registry.EngineVLLM {
						c.VLLM(hctx, p, busy, "/v1/chat/completions", body)
					} else {
						c.SGLang(hctx, p, busy, "/v1/chat/completions", body, simtest.Room())
					}
				}()
			}
			waitSnapshot(t, cp, "the busy decode's reported load", func(s *replica.Snapshot) bool {
				d := peerByName(s, "decode-busy")
				l, ok := s.Load(d)
				return ok && l.Load.Running == held
			})

			const n = 40
			before := [2]int64{idle.Stats().Requests, busy.Stats().Requests}
			for i := range n {
				body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 2,
					"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("request %d", i)}}})
				resp, err := http.Post(cp.BaseURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				var buf bytes.Buffer
				buf.ReadFrom(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, buf.String())
				}
			}
			toIdle, toBusy := idle.Stats().Requests-before[0], busy.Stats().Requests-before[1]
			t.Logf("%s: %d of %d new requests to the idle decode, %d to the busy one", tc.policy, toIdle, n, toBusy)
			if toIdle+toBusy != n || toIdle*100 < n*80 {
				t.Fatalf("%s sent %d of %d requests to the idle decode and %d to the busy one; want at least 80%% to the idle one",
					tc.policy, toIdle, n, toBusy)
			}
		})
	}
}
