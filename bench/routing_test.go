package bench_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
)

// TestRoutingSmoke runs the routing benchmark at a small scale (2 prefills
// and 1 decode per router, 40 prefix-heavy requests) through pdplane-ring
// and the oracle, and checks that every request was served and that the
// oracle's prefills found cached tokens: the prefix cache counters are
// read, and the workload shares prefixes that a router picking on the
// caches finds. It compares no figure between routers.
func TestRoutingSmoke(t *testing.T) {
	t.Parallel()
	var progress bytes.Buffer
	rep, err := bench.Routing(t.Context(), bench.RoutingConfig{
		Pdplane:  pdplaneBin,
		Routers:  []bench.Peer{{Name: bench.RouterPdplaneRing}, {Name: bench.RouterOracle}},
		Requests: 40, Prefills: 2, Decodes: 1, PrefillTimePerToken: 20 * time.Microsecond,
		Workload: bench.WorkloadSpec{Open: 4},
		Progress: &progress,
	})
	if err != nil {
		t.Fatalf("routing: %v\n%s", err, progress.String())
	}
	if len(rep.Runs) != 1 || len(rep.Runs[0].Results) != 2 {
		t.Fatalf("want one workload through two routers, got %+v", rep.Runs)
	}
	for _, r := range rep.Runs[0].Results {
		if r.Err != "" || r.Failed != 0 || r.OK != 40 || r.PromptTokens == 0 || r.TTFTPercentile(50) <= 0 || r.RPS() <= 0 {
			t.Errorf("%s: not measured (%s) or %d ok, %d failed (%s), %d prompt tokens counted\n%s",
				r.Router, r.Err, r.OK, r.Failed, r.FirstError, r.PromptTokens, progress.String())
		}
		if r.Router == bench.RouterOracle && r.HitRate() <= 0 {
			t.Errorf("oracle: hit rate %v (%d of %d prompt tokens cached), want some", r.HitRate(), r.CachedTokens, r.PromptTokens)
		}
	}
	var out bytes.Buffer
	rep.Print(&out)
	for _, row := range []string{"| pdplane-ring |", "| oracle |"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("the table has no row %q:\n%s", row, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}
