package transfertest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// PreflightConfig is the small ladder the preflight suite runs: 4 KiB to
// 256 KiB, two rounds, a 10 s deadline.
func PreflightConfig() transfer.PreflightConfig {
	return transfer.PreflightConfig{MinSize: 4 << 10, MaxSize: 256 << 10, Rounds: 2, Timeout: 10 * time.Second}
}

// ProbePair is an initiator with local probe memory and a target hosting a
// probe region, both on backends from one factory.
type ProbePair struct {
	From   transfer.Backend
	Local  transfer.HostProbe
	Target *transfer.ProbeHost
	cfg    transfer.PreflightConfig
}

// NewProbePair makes the two sides; cleanup closes both.
func NewProbePair(t testing.TB, f Factory, cfg transfer.PreflightConfig) *ProbePair {
	t.Helper()
	cfg = cfg.WithDefaults()
	from := NewAgent(t, f, UniqueName("pf-from"), 2*cfg.MaxSize)
	tb := f(t, UniqueName("pf-to"))
	buf, err := transfer.AllocHost(2 * cfg.MaxSize)
	if err != nil {
		t.Fatalf("alloc probe region: %v", err)
	}
	host, err := transfer.NewProbeHost(tb, transfer.HostProbe{HostBuffer: buf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		host.Close()
		tb.Close()
		buf.Free()
	})
	return &ProbePair{From: from.B, Local: transfer.HostProbe{HostBuffer: from.Buf}, Target: host, cfg: cfg}
}

// Run preflights the target with peer (the target's own when zero).
func (p *ProbePair) Run(t testing.TB, peer transfer.PreflightPeer) transfer.PreflightResult {
	t.Helper()
	if peer.Agent == "" {
		var err error
		if peer, err = p.Target.Peer(); err != nil {
			t.Fatal(err)
		}
	}
	return transfer.RunPreflight(context.Background(), p.From, p.Local, peer, p.cfg)
}

// RunPreflightSuite runs the preflight against backends from f: a passing
// ladder whose notifications reach the target, a shorter one to a peer with
// a smaller region, then each fault as a failed
// preflight with its own stage: metadata that does not load, a pattern
// that does not read back, a probe region deregistered on the target, and
// a target that is gone.
func RunPreflightSuite(t *testing.T, f Factory) {
	cfg := PreflightConfig()
	t.Run("Passes", func(t *testing.T) {
		p := NewProbePair(t, f, cfg)
		res := p.Run(t, transfer.PreflightPeer{})
		if !res.Passed() {
			t.Fatalf("preflight failed: %v", res.Err)
		}
		if len(res.Rungs) != len(cfg.Ladder()) || res.GBps <= 0 || res.Latency <= 0 || res.MemKind != registry.DRAM {
			t.Fatalf("result %+v: want %d rungs, GB/s and latency measured, DRAM", res, len(cfg.Ladder()))
		}
		want := len(cfg.Ladder()) * cfg.Rounds
		waitFor(t, "preflight notifications on the target", func() bool {
			n, err := p.Target.DrainNotifs()
			return err == nil && n >= want
		})
		if again := p.Run(t, transfer.PreflightPeer{}); !again.Passed() {
			t.Fatalf("second preflight of the same peer failed: %v", again.Err)
		}
	})
	t.Run("SmallerPeerRegion", func(t *testing.T) {
		// A peer whose agent runs with a smaller --preflight-max-size: the
		// ladder stops at what its region holds, and the pair passes.
		p := NewProbePair(t, f, cfg)
		peer, _ := p.Target.Peer()
		d := peer.Region.Descs[0]
		d.Len = uint64(cfg.MaxSize / 4)
		peer.Region.Descs = []transfer.Desc{d}
		res := p.Run(t, peer)
		if !res.Passed() {
			t.Fatalf("preflight of a peer with a smaller region failed: %v", res.Err)
		}
		if last := res.Rungs[len(res.Rungs)-1].Size; last != cfg.MaxSize/4 {
			t.Fatalf("last rung %d bytes, want the peer's %d", last, cfg.MaxSize/4)
		}
	})
	t.Run("BadMetadata", func(t *testing.T) {
		p := NewProbePair(t, f, cfg)
		peer, _ := p.Target.Peer()
		peer.Metadata = []byte("not an agent's metadata")
		ExpectStage(t, p.Run(t, peer), transfer.StageMetadata, nil)
	})
	t.Run("PatternMismatch", func(t *testing.T) {
		p := NewProbePair(t, f, cfg)
		peer, _ := p.Target.Peer()
		res := transfer.RunPreflight(context.Background(), p.From, corruptingProbe{p.Local}, peer, p.cfg)
		ExpectStage(t, res, transfer.StageVerify, transfer.ErrPatternMismatch)
	})
	t.Run("ProbeDeregistered", func(t *testing.T) {
		p := NewProbePair(t, f, cfg)
		if err := p.Target.Deregister(); err != nil {
			t.Fatal(err)
		}
		ExpectStage(t, p.Run(t, transfer.PreflightPeer{}), transfer.StageWrite, nil)
	})
	t.Run("TargetGone", func(t *testing.T) {
		p := NewProbePair(t, f, cfg)
		peer, _ := p.Target.Peer()
		p.Target.Close()
		p.Target.Backend().Close()
		// UCX connects when the metadata loads, the TCP backend on the
		// first transfer: either stage names the gone peer.
		ExpectStage(t, p.Run(t, peer), transfer.StageWrite, nil, transfer.StageMetadata)
	})
}

// corruptingProbe is a fake probe memory that flips one byte of every
// read-back, standing in for a fabric that corrupts data.
type corruptingProbe struct{ transfer.HostProbe }

func (c corruptingProbe) ReadAt(p []byte, off int) error {
	if err := c.HostProbe.ReadAt(p, off); err != nil {
		return err
	}
	p[len(p)/2] ^= 0xff
	return nil
}

// ExpectStage fails the test unless res failed at stage (or one of the
// alternatives) with an error that is is (when not nil).
func ExpectStage(t testing.TB, res transfer.PreflightResult, stage string, is error, alternatives ...string) {
	t.Helper()
	var pe *transfer.PreflightError
	if !errors.As(res.Err, &pe) {
		t.Fatalf("result %+v: want a failed preflight at stage %s", res, stage)
	}
	if (pe.Stage != stage && !slices.Contains(alternatives, pe.Stage)) || (is != nil && !errors.Is(res.Err, is)) {
		t.Fatalf("preflight failed with %v (stage %s), want stage %s (%v)", res.Err, pe.Stage, stage, is)
	}
	t.Logf("failed as expected: %v", res.Err)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchPreflight runs whole preflights (4 KiB to maxSize, the agent's
// default three rounds a rung) between two agents of one process, and
// reports the preflight's own figures beside the benchmark's: gbps at the
// largest rung and the 4 KiB WRITE latency in µs, the best seen over the
// iterations.
func BenchPreflight(b *testing.B, f Factory, maxSize int) {
	cfg := transfer.PreflightConfig{MaxSize: maxSize, Timeout: time.Minute}
	p := NewProbePair(b, f, cfg)
	peer, err := p.Target.Peer()
	if err != nil {
		b.Fatal(err)
	}
	var best transfer.PreflightResult
	for b.Loop() {
		res := p.Run(b, peer)
		if !res.Passed() {
			b.Fatal(res.Err)
		}
		if res.GBps > best.GBps {
			best.GBps = res.GBps
		}
		if best.Latency == 0 || res.Latency < best.Latency {
			best.Latency = res.Latency
		}
		if _, err := p.Target.DrainNotifs(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(best.GBps, "gbps")
	b.ReportMetric(float64(best.Latency.Nanoseconds())/1e3, "latency_us")
}
