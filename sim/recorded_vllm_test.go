package sim_test

import (
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestRecordedVLLMAnswers holds the simulator in vLLM mode to what a real
// vLLM answers: each request of simtest.VLLMCases goes to a sim pair, and
// the answer must have the shape of the real engine's, recorded by the
// real-engine suite (go test ./realengine -update) in testdata/vllm: the
// same status and media type, SSE framing, metric families and labels,
// and the same JSON field names and types.
func TestRecordedVLLMAnswers(t *testing.T) {
	t.Parallel()
	prefill, decode := simtest.Pair(t, registry.EngineVLLM, nil)
	cl := simtest.NewClient()
	for _, c := range simtest.VLLMCases() {
		want, err := simtest.ReadRecorded("testdata/vllm", c.Name)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if want.VLLMVersion != simtest.RecordedVLLMVersion {
			t.Errorf("%s: recorded from vLLM %s, want %s", c.Name, want.VLLMVersion, simtest.RecordedVLLMVersion)
		}
		got, err := cl.RecordCase(t.Context(), c, prefill.URL(), decode.URL(), "sim-model")
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		for _, d := range simtest.ShapeDiff(want, got) {
			t.Errorf("%s: the simulator's answer differs from vLLM %s's: %s", c.Name, want.VLLMVersion, d)
		}
	}
}
