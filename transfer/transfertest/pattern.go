// Package transfertest holds the helpers that test transfer backends: the
// backend contract suite that the NIXL and TCP backends both pass, the
// two-process harness, byte patterns, and RequireNIXL, which skips or fails
// a test when libnixl_capi.so cannot be loaded.
package transfertest

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Fill writes a deterministic pseudo-random pattern derived from seed into b.
func Fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(seed + uint64(i))
	}
}

// Verify checks that b holds Fill's pattern for seed and names the first
// byte that differs.
func Verify(b []byte, seed uint64) error {
	want := make([]byte, len(b))
	Fill(want, seed)
	if bytes.Equal(b, want) {
		return nil
	}
	for i := range b {
		if b[i] != want[i] {
			return fmt.Errorf("byte %d of %d is %#x, want %#x", i, len(b), b[i], want[i])
		}
	}
	return nil
}
