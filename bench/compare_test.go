package bench_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
)

// pdplaneBin is the binary the harness runs, built once by TestMain.
var pdplaneBin string

func TestMain(m *testing.M) {
	os.Exit(bench.RunWithPdplane("../cmd/pdplane", func(bin string) int {
		pdplaneBin = bin
		return m.Run()
	}))
}

// peers are the routers installed here (PDPLANE_SMG, PDPLANE_VLLM_ROUTER),
// under CI=true both required, the two floors and the baseline (this
// pdplane again), which are always here.
func peers(t *testing.T) []bench.Peer {
	t.Helper()
	out := []bench.Peer{{Name: bench.PeerFloor, Bin: pdplaneBin}, {Name: bench.PeerFloorNetHTTP, Bin: pdplaneBin},
		{Name: bench.PeerBaseline, Bin: pdplaneBin}}
	for _, p := range []struct{ name, env string }{{bench.PeerSMG, "PDPLANE_SMG"}, {bench.PeerVLLMRouter, "PDPLANE_VLLM_ROUTER"}} {
		bin := os.Getenv(p.env)
		if bin == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set; under CI=true the routers are installed (scripts/install-routers.sh)", p.env)
			}
			t.Logf("%s is not set: measuring without %s", p.env, p.name)
			continue
		}
		out = append(out, bench.Peer{Name: p.name, Bin: bin})
	}
	return out
}

// TestBenchCompareSmoke runs the harness for a moment (1 s windows, 4
// clients, two levels of a few held streams with a short probe of new
// requests at each) against every router installed and checks that each
// measured something: requests served, no failures, streams held, new
// requests served while they were, and a table row per figure. It asserts
// no figure's size.
func TestBenchCompareSmoke(t *testing.T) {
	t.Parallel()
	ps := peers(t)
	var progress bytes.Buffer
	rep, err := bench.Compare(t.Context(), bench.Config{
		Pdplane: pdplaneBin, Peers: ps, Window: time.Second, Concurrency: []int{4},
		Modes: []bench.Mode{bench.Stream, bench.Unary}, Rounds: 1, HeldStreams: []int{8, 3}, ProbeClients: 2, ProbeWindow: 300 * time.Millisecond, ProbeRounds: 2, Progress: &progress,
	})
	if err != nil {
		t.Fatalf("compare: %v\n%s", err, progress.String())
	}
	want := max(len(ps), 1)
	if len(rep.Comparisons) != want {
		t.Fatalf("%d comparisons, want %d", len(rep.Comparisons), want)
	}
	for _, c := range rep.Comparisons {
		if len(c.Rows) != 2 {
			t.Fatalf("%s: %d rows, want stream and unary", c.Peer, len(c.Rows))
		}
		for _, r := range c.Rows {
			measured := map[string]bench.Stats{"pdplane": r.Pdplane}
			if c.Peer != "" {
				if r.Peer == nil {
					t.Fatalf("%s %s: no figures for the peer", c.Peer, r.Mode)
				}
				measured[c.Peer] = *r.Peer
			}
			for who, s := range measured {
				if s.ReqPerSec() <= 0 || s.Failed != 0 || s.CPUPerRequest() <= 0 || s.EngineCPUPerRequest() <= 0 || s.TTFT50 <= 0 {
					t.Errorf("%s, %s: %+v: want requests served, none failed, CPU (the router's and its engines') and TTFT measured", who, r.Mode, s)
				}
			}
		}
		for who, hs := range map[string][]bench.Held{"pdplane": c.HeldPdplane, c.Peer: c.HeldPeer} {
			if who == "" {
				continue
			}
			checkHeldLevels(t, who, hs, []int{3, 8})
		}
	}
	if rep.FDLimit == 0 {
		t.Error("the report has no open-files limit")
	}
	var out bytes.Buffer
	rep.Print(&out)
	rows := []string{"| stream, 4 clients: req/s |", "| unary, 4 clients: CPU per request |", "| unary, 4 clients: engines' CPU per request |",
		"| pdplane | 3 of 3 |", "| pdplane | 8 of 8 |"}
	for _, p := range ps {
		rows = append(rows, "| "+p.Name+" | 3 of 3 |", "| "+p.Name+" | 8 of 8 |")
	}
	for _, row := range rows {
		if n := strings.Count(out.String(), row); n < 1 {
			t.Errorf("the table has no row %q:\n%s", row, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

// checkHeldLevels checks one router's held-stream levels: one per level in
// increasing order, every stream held, the base measured, and new requests
// served (none failed) while the streams were held.
func checkHeldLevels(t *testing.T, who string, hs []bench.Held, levels []int) {
	t.Helper()
	if len(hs) != len(levels) {
		t.Errorf("%s: %d held-stream levels, want %d", who, len(hs), len(levels))
		return
	}
	for i, h := range hs {
		if len(h.WindowP99s) != 2 || h.Probe.TTFT99 != min(h.WindowP99s[0], h.WindowP99s[1]) {
			t.Errorf("%s: level %d: probe windows' p99s %v, level p99 %v: want 2 windows and the lower middle one", who, i, h.WindowP99s, h.Probe.TTFT99)
		}
		if h.Opened != levels[i] || h.Held != levels[i] || h.RSSBase <= 0 || h.FDsBase <= 0 || h.FDs <= 0 {
			t.Errorf("%s: level %d: %+v, want all %d held and the base measured", who, i, h, levels[i])
		}
		if h.Probe.Requests == 0 || h.Probe.Failed != 0 || h.Probe.TTFT50 <= 0 || h.Probe.TTFT99 < h.Probe.TTFT50 {
			t.Errorf("%s: %d held: new requests %+v, want some served, none failed, TTFT measured", who, levels[i], h.Probe)
		}
	}
}

// TestSimIgnoresServesProfileAndGCEnvironment: the router's profiling and
// GC variables in the harness's environment do not reach its engines (a
// sim that took this address would not start).
func TestSimIgnoresServesProfileAndGCEnvironment(t *testing.T) {
	t.Setenv("PDPLANE_PPROF_ADDR", "not-an-address")
	t.Setenv("PDPLANE_GC_MIN_HEAP_MIB", "-1")
	s, err := bench.StartSim(t.Context(), pdplaneBin, bench.SimSpec{Engine: "sglang", Role: "decode", TransferSecret: "0123456789abcdef"})
	if err != nil {
		t.Fatalf("a sim with serve's profile and GC variables set: %v", err)
	}
	s.Stop()
}
