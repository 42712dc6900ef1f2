package tcp_test

import (
	"testing"

	"github.com/pdplane/pdplane/transfer/transfertest"
)

// BenchmarkWrite: DRAM to DRAM WRITE through the TCP backend, by size.
func BenchmarkWrite(b *testing.B) { transfertest.BenchWrite(b, newBackend, newBackend) }

// BenchmarkLoopbackTCP: the plain net.Conn baseline for BenchmarkWrite.
func BenchmarkLoopbackTCP(b *testing.B) { transfertest.BenchLoopback(b) }

// BenchmarkPreflight: whole preflights (4 KiB to 16 MiB) through the TCP
// backend, with the GB/s and latency they report.
func BenchmarkPreflight(b *testing.B) { transfertest.BenchPreflight(b, newBackend, 16<<20) }
