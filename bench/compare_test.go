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

// peers are the routers installed here (PDPLANE_SMG, PDPLANE_VLLM_ROUTER);
// under CI=true both are required.
func peers(t *testing.T) []bench.Peer {
	t.Helper()
	var out []bench.Peer
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
// clients, a few held streams) against every router installed and checks
// that each measured something: requests served, no failures, streams held,
// and a table row per figure. It asserts no figure's size.
func TestBenchCompareSmoke(t *testing.T) {
	t.Parallel()
	ps := peers(t)
	var progress bytes.Buffer
	rep, err := bench.Compare(t.Context(), bench.Config{
		Pdplane: pdplaneBin, Peers: ps, Window: time.Second, Concurrency: []int{4},
		Modes: []bench.Mode{bench.Stream, bench.Unary}, Rounds: 1, HeldStreams: 8, Progress: &progress,
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
				if s.ReqPerSec() <= 0 || s.Failed != 0 || s.CPUPerRequest() <= 0 || s.TTFT50 <= 0 {
					t.Errorf("%s, %s: %+v: want requests served, none failed, CPU and TTFT measured", who, r.Mode, s)
				}
			}
		}
		for who, h := range map[string]*bench.Held{"pdplane": c.HeldPdplane, c.Peer: c.HeldPeer} {
			if who == "" {
				continue
			}
			if h == nil || h.Held != 8 || h.RSSBase <= 0 || h.FDsBase <= 0 {
				t.Errorf("%s: held streams %+v, want all 8 held and the base measured", who, h)
			}
		}
	}
	var out bytes.Buffer
	rep.Print(&out)
	for _, row := range []string{"| stream, 4 clients: req/s |", "| unary, 4 clients: CPU per request |", "| RSS per held stream |"} {
		if strings.Count(out.String(), row) != want {
			t.Errorf("the table has %d rows %q, want %d:\n%s", strings.Count(out.String(), row), row, want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}
