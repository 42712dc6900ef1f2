package transfertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/pdplane/pdplane/transfer"
)

// SizeName names a size as the benchmarks do ("4KiB", "64MiB").
func SizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchWrite reports DRAM to DRAM WRITE bandwidth between two agents of one
// process, one transfer per op (create, post, wait, release), for every
// size in DefaultSizes. The source agent comes from src, the destination from
// dst (they may differ in configuration, e.g. progress threads).
func BenchWrite(b *testing.B, src, dst Factory) {
	for _, size := range DefaultSizes() {
		b.Run(SizeName(size), func(b *testing.B) {
			s := NewAgent(b, src, UniqueName("bench-src"), size)
			d := NewAgent(b, dst, UniqueName("bench-dst"), size)
			Connect(b, s, d)
			Fill(s.Buf.Bytes(), 1)
			x := transfer.Xfer{Op: transfer.OpWrite, Remote: d.B.AgentName(), Local: s.Buf.Region(), Dst: d.Buf.Region()}
			ctx := context.Background()
			// Warm up the connection.
			if err := transfer.Do(ctx, s.B, x); err != nil {
				b.Fatal(err)
			}
			if err := Verify(d.Buf.Bytes(), 1); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for b.Loop() {
				if err := transfer.Do(ctx, s.B, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchLoopback is the baseline: one plain loopback net.Conn, the sender
// writes size bytes from a buffer, the receiver reads them into a buffer
// and answers one byte, per op.
func BenchLoopback(b *testing.B) {
	for _, size := range DefaultSizes() {
		b.Run(SizeName(size), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				buf := make([]byte, size)
				ack := []byte{1}
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						done <- nil
						return
					}
					if _, err := c.Write(ack); err != nil {
						done <- err
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, size)
			Fill(buf, 1)
			ack := make([]byte, 1)
			op := func() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, ack); err != nil {
					b.Fatal(err)
				}
			}
			op()
			b.SetBytes(int64(size))
			b.ResetTimer()
			for b.Loop() {
				op()
			}
			b.StopTimer()
			c.Close()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
