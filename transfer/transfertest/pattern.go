// Package transfertest holds the helpers that test transfer backends: the
// backend contract suite that the NIXL and TCP backends both pass, the
// two-process harness, byte patterns, and RequireNIXL, which skips or fails
// a test when libnixl_capi.so cannot be loaded.
package transfertest

import "github.com/pdplane/pdplane/transfer"

// Fill writes a deterministic pseudo-random pattern derived from seed into b
// (transfer.FillPattern, the one the preflight writes).
func Fill(b []byte, seed uint64) { transfer.FillPattern(b, seed) }

// Verify checks that b holds Fill's pattern for seed and names the first
// byte that differs.
func Verify(b []byte, seed uint64) error { return transfer.CheckPattern(b, seed) }
