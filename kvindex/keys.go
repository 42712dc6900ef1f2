package kvindex

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// seed is the key before a prompt's first block (key_{-1}).
const seed uint64 = 0x70647061_6e65_6b76 // "pdpanekv"

// Keys appends to dst[:0] the router's key of every full block of tokens,
// blockSize tokens each, and returns it; a last partial block has no key.
// Block i's key hashes block i-1's key (seed for the first) with block i's
// token IDs, so a key stands for the whole prefix up to its block, as an
// engine's block hash does. A key is never 0. It allocates nothing when dst
// has room.
func Keys(dst []uint64, tokens []int32, blockSize int) []uint64 {
	if blockSize < 1 {
		return dst[:0]
	}
	return appendKeys(dst[:0], seed, tokens, blockSize)
}

// appendKeys appends the keys of tokens' full blocks, chained from parent.
func appendKeys(dst []uint64, parent uint64, tokens []int32, blockSize int) []uint64 {
	var d xxhash.Digest
	var buf [8 + 4*64]byte
	for len(tokens) >= blockSize {
		block := tokens[:blockSize]
		tokens = tokens[blockSize:]
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:8], parent)
		n := 8
		for _, t := range block {
			if n == len(buf) {
				_, _ = d.Write(buf[:n])
				n = 0
			}
			binary.LittleEndian.PutUint32(buf[n:], uint32(t))
			n += 4
		}
		_, _ = d.Write(buf[:n])
		if parent = d.Sum64(); parent == 0 {
			parent = 1 // 0 is keySet's empty slot
		}
		dst = append(dst, parent)
	}
	return dst
}
