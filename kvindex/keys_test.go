package kvindex

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func seq(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// refKeys is Keys written plainly: each block's key is xxhash64 of the
// previous key (little-endian) followed by its token IDs (little-endian).
func refKeys(tokens []int32, blockSize int) []uint64 {
	var out []uint64
	parent := seed
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		b := binary.LittleEndian.AppendUint64(nil, parent)
		for _, t := range tokens[i : i+blockSize] {
			b = binary.LittleEndian.AppendUint32(b, uint32(t))
		}
		parent = xxhash.Sum64(b)
		out = append(out, parent)
	}
	return out
}

func TestKeysChain(t *testing.T) {
	t.Parallel()
	for _, bs := range []int{1, 16, 64, 65, 200} {
		tokens := seq(1000, 5*bs+bs/2)
		got := Keys(nil, tokens, bs)
		if want := refKeys(tokens, bs); !slices.Equal(got, want) {
			t.Fatalf("block size %d: Keys = %x, want %x", bs, got, want)
		}
		if len(got) != 5 {
			t.Fatalf("block size %d: %d keys for 5 full blocks and a partial one", bs, len(got))
		}
		if again := Keys(nil, slices.Clone(tokens), bs); !slices.Equal(got, again) {
			t.Fatalf("block size %d: the same tokens keyed twice differ", bs)
		}
		if prefix := Keys(nil, tokens[:3*bs], bs); !slices.Equal(prefix, got[:3]) {
			t.Fatalf("block size %d: a prompt's first blocks are keyed apart from what follows", bs)
		}
		// A different token in block 1 changes block 1's key and every
		// later one, and no earlier one.
		other := slices.Clone(tokens)
		other[bs] = -other[bs]
		changed := Keys(nil, other, bs)
		if changed[0] != got[0] {
			t.Fatalf("block size %d: block 0's key depends on block 1", bs)
		}
		for i := 1; i < len(got); i++ {
			if changed[i] == got[i] {
				t.Fatalf("block size %d: block %d's key did not change with block 1", bs, i)
			}
		}
		// The partial last block does not count.
		if len(tokens)%bs != 0 {
			partial := slices.Clone(tokens)
			partial[len(partial)-1]++
			if k := Keys(nil, partial, bs); !slices.Equal(k, got) {
				t.Fatalf("block size %d: the partial last block changed the keys", bs)
			}
		}
	}
	if k := Keys(nil, seq(0, 10), 0); len(k) != 0 {
		t.Fatalf("block size 0: %d keys", len(k))
	}
	if k := Keys(nil, seq(0, 10), 16); len(k) != 0 {
		t.Fatalf("10 tokens in blocks of 16: %d keys", len(k))
	}
}

func TestKeysAllocatesNothing(t *testing.T) {
	tokens := seq(0, 32*128)
	dst := make([]uint64, 0, 64)
	if n := testing.AllocsPerRun(100, func() { dst = Keys(dst, tokens, 128) }); n != 0 {
		t.Fatalf("Keys allocated %v times with room in dst", n)
	}
}

func BenchmarkKeys(b *testing.B) {
	tokens := seq(0, 32*16)
	dst := make([]uint64, 0, 32)
	b.SetBytes(int64(4 * len(tokens)))
	for b.Loop() {
		dst = Keys(dst, tokens, 16)
	}
}
