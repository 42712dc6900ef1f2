package realengine

import (
	"flag"
	"testing"

	"github.com/pdplane/pdplane/sim/simtest"
)

var update = flag.Bool("update", false, "rewrite sim/testdata/vllm from the real engines' answers")

// TestRecordedAnswers asks the real engines what pdplane asks them
// (simtest.VLLMCases) and holds their answers to the recording in
// sim/testdata/vllm, which sim's TestRecordedVLLMAnswers holds the
// simulator to: a vLLM whose answers changed shape fails here, and
// -update records them again. It runs first, on fresh engines.
func TestRecordedAnswers(t *testing.T) {
	s := needSuite(t)
	cl := simtest.NewClient()
	for _, c := range simtest.VLLMCases() {
		got, err := cl.RecordCase(t.Context(), c, s.prefill.URL(), s.decode.URL(), servedModel)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if *update {
			if err := simtest.WriteRecorded(simtest.RecordedDir(), got); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := simtest.ReadRecorded(simtest.RecordedDir(), c.Name)
		if err != nil {
			t.Errorf("%s: %v (go test ./realengine -update records it)", c.Name, err)
			continue
		}
		for _, d := range simtest.ShapeDiff(want, got) {
			t.Errorf("%s: vLLM's answer no longer has the recorded shape: %s", c.Name, d)
		}
	}
}
