package cuda_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/cuda"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// EnvRequireCUDA turns a missing CUDA runtime or device into a failure
// (a GPU CI job sets it to 1).
const EnvRequireCUDA = "PDPLANE_REQUIRE_CUDA"

// requireDevice loads the CUDA runtime and checks for a device, or skips
// with the reason.
func requireDevice(t *testing.T) *cuda.Runtime {
	t.Helper()
	stop := t.Skipf
	if os.Getenv(EnvRequireCUDA) == "1" {
		stop = t.Fatalf
	}
	rt, err := cuda.Load()
	if err != nil {
		stop("VRAM preflight skipped: %v", err)
		return nil
	}
	n, err := rt.DeviceCount()
	if err != nil || n == 0 {
		stop("VRAM preflight skipped: %s loaded but sees no CUDA device (%d devices, %v)", rt.Path(), n, err)
		return nil
	}
	return rt
}

func TestLoadNamesWhatItTried(t *testing.T) {
	t.Parallel()
	if _, err := cuda.Load(); err != nil {
		var nf *cuda.NotFoundError
		if !errors.As(err, &nf) || len(nf.Tried) == 0 {
			t.Fatalf("Load: %v, want a NotFoundError listing the paths tried", err)
		}
		t.Logf("no CUDA runtime here: %v", err)
	}
}

// TestVRAMPreflight preflights VRAM to VRAM between two NIXL agents on
// device 0 and prints the GB/s (scripts/gpu-check.sh runs it).
func TestVRAMPreflight(t *testing.T) {
	rt := requireDevice(t)
	lib := transfertest.RequireNIXL(t)
	cfg := transfer.PreflightConfig{MaxSize: 64 << 20, Timeout: time.Minute}.WithDefaults()
	alloc := func(n int) *cuda.Buffer {
		b, err := rt.Alloc(0, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		return b
	}
	newAgent := func(name string, mem transfer.ProbeMemory) transfer.Backend {
		b, err := lib.NewBackend(nixl.Config{AgentName: transfertest.UniqueName(name), UCXTLS: os.Getenv("PDPLANE_GPU_UCX_TLS")}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		if err := b.RegisterMemory(mem.Region()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.DeregisterMemory(mem.Region()) })
		return b
	}
	local, far := alloc(2*cfg.MaxSize), alloc(cfg.MaxSize)
	from := newAgent("vram-from", local)
	to := newAgent("vram-to", far)
	md, err := to.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	res := transfer.RunPreflight(context.Background(), from, local, transfer.PreflightPeer{Agent: to.AgentName(), Metadata: md, Region: far.Region()}, cfg)
	if !res.Passed() || res.MemKind != registry.VRAM {
		t.Fatalf("VRAM preflight: %+v", res)
	}
	t.Logf("VRAM preflight 4 KiB..%s: %.2f GB/s, %.1f µs", transfertest.SizeName(cfg.MaxSize), res.GBps, float64(res.Latency.Nanoseconds())/1e3)
}
