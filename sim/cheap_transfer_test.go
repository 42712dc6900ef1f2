package sim_test

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestSimCheapTransferKeepsProtocolMovesOnePage runs a prompt of several
// pages through both engines' PD protocols with CheapTransfer: the request
// succeeds through the transfer and its notification, each side counts one
// transfer, and exactly one page per region crosses, not the prompt's.
func TestSimCheapTransferKeepsProtocolMovesOnePage(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("the prompt spans several pages of KV ", 8)
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			p, d := simtest.Pair(t, engine, func(c *sim.Config) { c.CheapTransfer = true; c.Pages = 64 })
			_, dr := pdOK(t, p, d, "/v1/chat/completions", chatBody(long, 5, false))
			if n := len(strings.Fields(decodeAnswer(t, dr).Choices[0].Message.Content)); n != 5 {
				t.Fatalf("%d words, want 5", n)
			}
			cfg := d.Config()
			page := int64(cfg.PageSize * cfg.NumKVHeads * cfg.HeadDim * 2 * 2 * cfg.NumLayers) // bfloat16, K and V
			ds := d.Stats()
			if ds.Transfers != 1 || ds.BytesMoved != page {
				t.Fatalf("decode counted %d transfers of %d bytes, want 1 of one page (%d bytes)", ds.Transfers, ds.BytesMoved, page)
			}
		})
	}
}
