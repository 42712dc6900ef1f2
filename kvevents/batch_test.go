package kvevents

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func seq(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

func digest(from byte) Hash {
	b := make([]byte, 32)
	for i := range b {
		b[i] = from + byte(i)
	}
	return Hash(b)
}

// TestDecodeVLLMBatch reads a batch vLLM's own encoder wrote
// (testdata/README.md).
func TestDecodeVLLMBatch(t *testing.T) {
	payload, err := os.ReadFile("testdata/vllm-batch.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 1796580000.25 || b.DPRank != 0 || len(b.Events) != 4 {
		t.Fatalf("batch %v, rank %d, %d events", b.TS, b.DPRank, len(b.Events))
	}
	want := []Event{
		{Kind: BlockStored, BlockHashes: []Hash{digest(0), digest(1)}, TokenIDs: seq(0, 256), BlockSize: 128, Medium: "GPU"},
		{Kind: BlockStored, BlockHashes: []Hash{digest(2)}, ParentHash: digest(1), TokenIDs: seq(256, 128), BlockSize: 128, Medium: "GPU"},
		{Kind: BlockRemoved, BlockHashes: []Hash{digest(0)}, Medium: "GPU"},
		{Kind: AllBlocksCleared},
	}
	for i, e := range b.Events {
		w := want[i]
		if e.Kind != w.Kind || !slices.Equal(e.BlockHashes, w.BlockHashes) || e.ParentHash != w.ParentHash ||
			!slices.Equal(e.TokenIDs, w.TokenIDs) || e.BlockSize != w.BlockSize || e.Medium != w.Medium || e.GroupIdx != w.GroupIdx {
			t.Errorf("events[%d] = %+v, want %+v", i, e, w)
		}
	}
}

// TestDecodeRefusesMalformed: a truncated, oversized or mistyped batch is
// refused as ErrMalformed, however it was cut.
func TestDecodeRefusesMalformed(t *testing.T) {
	payload, err := os.ReadFile("testdata/vllm-batch.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(payload) {
		if _, err := Decode(payload[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("the batch cut at %d of %d bytes: %v, want ErrMalformed", n, len(payload), err)
		}
	}
	enc := func(v any) []byte {
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	stored := func(tokens int) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": [][]byte{make([]byte, 32)}, "parent_block_hash": nil,
			"token_ids": make([]int, tokens), "block_size": 16}
	}
	for name, p := range map[string][]byte{
		"not an array":               enc(map[string]any{"ts": 1.0}),
		"an unknown event":           enc([]any{1.0, []any{map[string]any{"type": "BlockMoved"}}}),
		"an event with no type":      enc([]any{1.0, []any{map[string]any{"medium": "GPU"}}}),
		"tokens and blocks disagree": enc([]any{1.0, []any{stored(15)}}),
		"a negative token ID": enc([]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": [][]byte{{1}},
			"token_ids": []int{-1}, "block_size": 1}}}),
		"an empty hash":   enc([]any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": [][]byte{{}}}}}),
		"too many events": append(enc([]any{1.0}), []byte{0xdd, 0x7f, 0xff, 0xff, 0xff}...),
		"too large":       make([]byte, MaxPayloadBytes+1),
	} {
		if name == "too many events" {
			p[0] = 0x92 // an array of 2: ts, then the events' header
		}
		if _, err := Decode(p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	// The same event, well formed, passes: the cases above fail for
	// their own reason.
	if _, err := Decode(enc([]any{1.0, []any{stored(16)}})); err != nil {
		t.Fatalf("a well-formed event: %v", err)
	}
	// vLLM's offloading connectors tell of copies to another medium
	// without token IDs, with a block size of 0 (newer vLLM) or the GPU's.
	for _, size := range []int{0, 16} {
		copied := map[string]any{"type": "BlockStored", "block_hashes": [][]byte{make([]byte, 32)}, "token_ids": []int{},
			"block_size": size, "medium": "CPU"}
		if _, err := Decode(enc([]any{1.0, []any{copied}})); err != nil {
			t.Errorf("a copy to the CPU of block size %d: %v", size, err)
		}
	}
}

// TestDecodeTellsBlocksKeyedByMore: blocks of a LoRA, or with extra keys
// (multimodal inputs, a cache salt), are marked Extra: their tokens alone
// do not name them (vllm/distributed/kv_events.py, BlockStored).
func TestDecodeTellsBlocksKeyedByMore(t *testing.T) {
	for name, tc := range map[string]struct {
		members map[string]any
		extra   bool
	}{
		"base model":         {map[string]any{"lora_id": nil, "lora_name": nil, "extra_keys": nil}, false},
		"no extra per block": {map[string]any{"extra_keys": []any{nil}}, false},
		"a LoRA by id":       {map[string]any{"lora_id": 3}, true},
		"a LoRA by name":     {map[string]any{"lora_name": "sql-adapter"}, true},
		"multimodal":         {map[string]any{"extra_keys": []any{[]any{"mm-hash", 0}}}, true},
	} {
		ev := map[string]any{"type": "BlockStored", "block_hashes": [][]byte{make([]byte, 32)}, "token_ids": make([]int, 16), "block_size": 16}
		for k, v := range tc.members {
			ev[k] = v
		}
		var buf bytes.Buffer
		if err := msgpack.NewEncoder(&buf).Encode([]any{1.0, []any{ev}}); err != nil {
			t.Fatal(err)
		}
		b, err := Decode(buf.Bytes())
		if err != nil || b.Events[0].Extra != tc.extra {
			t.Errorf("%s: %+v, %v; want Extra %v", name, b.Events, err, tc.extra)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	payload, err := os.ReadFile("testdata/vllm-batch.msgpack")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, err := Decode(payload); err != nil {
			b.Fatal(err)
		}
	}
}
