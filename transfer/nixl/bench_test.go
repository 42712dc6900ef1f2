package nixl_test

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

// BenchmarkWrite: DRAM to DRAM WRITE through the purego NIXL binding (UCX
// over loopback TCP), by size; compare with testdata/bench_nixl_py.py, which
// sets up NIXL's Python API the same way. The source agent runs without a
// progress thread (its waits poll, and so progress, the transfer) and the
// destination with NIXL's default busy progress thread: two busy progress
// threads in one process would fight the poller for the two cores of the
// machines this runs on.
func BenchmarkWrite(b *testing.B) {
	lib := transfertest.RequireNIXL(b)
	src := func(t testing.TB, name string) transfer.Backend {
		be, err := lib.NewBackend(nixl.Config{AgentName: name, UCXTLS: "tcp", Agent: nixl.AgentConfig{NoProgressThread: true}}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		return be
	}
	transfertest.BenchWrite(b, src, newBackend)
}

// BenchmarkLoopbackTCP: the plain net.Conn baseline, in the same run.
func BenchmarkLoopbackTCP(b *testing.B) { transfertest.BenchLoopback(b) }

// BenchmarkPreflight: whole preflights (4 KiB to 16 MiB) through the NIXL
// binding, both agents configured as `pdplane agent --preflight nixl`
// configures its worker, with the GB/s and latency they report.
func BenchmarkPreflight(b *testing.B) {
	transfertest.RequireNIXL(b)
	transfertest.BenchPreflight(b, newBackend, 16<<20)
}
