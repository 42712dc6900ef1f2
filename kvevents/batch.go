// Package kvevents reads the KV cache events an engine publishes: vLLM's
// (--kv-events-config) ZMQ PUB socket sends multipart messages (topic,
// sequence number as 8 bytes big-endian, payload), each payload a msgpack
// KVEventBatch of BlockStored, BlockRemoved and AllBlocksCleared events
// (vllm/distributed/kv_events.py, vLLM 0.32). They say which blocks of
// prompt tokens each engine's prefix cache holds: what a router needs to
// send a prompt where its prefix is cached.
package kvevents

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is what an event says of the engine's cache.
type Kind uint8

// The kinds, as vLLM's msgspec tags them ("type").
const (
	// BlockStored: the blocks now hold TokenIDs (BlockSize tokens each),
	// chained from ParentHash.
	BlockStored Kind = iota + 1
	// BlockRemoved: the blocks were evicted.
	BlockRemoved
	// AllBlocksCleared: the whole cache was dropped.
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Hash is a block's hash as the engine publishes it: the bytes of its
// digest (vLLM's default), or an integer written as 8 bytes big-endian
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
type Hash string

// Event is one event of a batch. Members an event kind does not carry are
// zero.
type Event struct {
	Kind        Kind
	BlockHashes []Hash
	ParentHash  Hash // "" for a chain's first block
	TokenIDs    []int32
	BlockSize   int
	Medium      string // "GPU", "CPU", "STORAGE" or "" (unspecified)
	GroupIdx    int    // the KV cache group; 0 unless the engine names another
	// Extra says the blocks' hashes mix in more than their token IDs: a
	// LoRA adapter (lora_id, lora_name) or extra keys (multimodal inputs,
	// a cache salt). Their tokens alone do not name them.
	Extra bool
}

// Batch is one published message: the events of one engine step.
type Batch struct {
	TS     float64 // Unix seconds at the engine
	Events []Event
	DPRank int // the data-parallel rank that published it
}

// Bounds of one batch, above what an engine step stores: a malformed or
// hostile publisher is refused rather than allowed to fill memory.
const (
	MaxPayloadBytes  = 16 << 20
	MaxEvents        = 1 << 16
	MaxTokenIDs      = 1 << 21 // in all of a batch's events
	MaxHashBytes     = 64
	maxMemberNameLen = 64
)

// ErrMalformed wraps every decoding failure of a batch.
var ErrMalformed = errors.New("malformed KV event batch")

// Decode reads a batch's msgpack payload: the array [ts, events,
// data_parallel_rank] of msgspec's array_like EventBatch, each event a map
// tagged by "type". Members it does not know are skipped.
func Decode(payload []byte) (Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return Batch{}, fmt.Errorf("%w: %d bytes, at most %d", ErrMalformed, len(payload), MaxPayloadBytes)
	}
	d := decoder{Decoder: msgpack.NewDecoder(bytes.NewReader(payload))}
	b, err := d.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return b, nil
}

type decoder struct {
	*msgpack.Decoder
	tokens int // token IDs read so far in the batch
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 || n > 3 {
		return b, fmt.Errorf("a batch of %d members, want [ts, events] or [ts, events, data_parallel_rank]", n)
	}
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	m, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	if m < 0 || m > MaxEvents {
		return b, fmt.Errorf("events: %d, at most %d", m, MaxEvents)
	}
	b.Events = make([]Event, m)
	for i := range b.Events {
		if b.Events[i], err = d.event(); err != nil {
			return b, fmt.Errorf("events[%d]: %w", i, err)
		}
	}
	if n == 3 {
		if b.DPRank, err = d.optInt(); err != nil {
			return b, fmt.Errorf("data_parallel_rank: %w", err)
		}
	}
	return b, nil
}

func (d *decoder) event() (Event, error) {
	var e Event
	n, err := d.DecodeMapLen()
	if err != nil {
		return e, err
	}
	for range n {
		key, err := d.DecodeString()
		if err != nil {
			return e, err
		}
		if len(key) > maxMemberNameLen {
			return e, fmt.Errorf("a member name of %d bytes", len(key))
		}
		switch key {
		case "type":
			t, err := d.DecodeString()
			if err != nil {
				return e, fmt.Errorf("type: %w", err)
			}
			switch t {
			case "BlockStored":
				e.Kind = BlockStored
			case "BlockRemoved":
				e.Kind = BlockRemoved
			case "AllBlocksCleared":
				e.Kind = AllBlocksCleared
			default:
				return e, fmt.Errorf("type %.64q is no KV event vLLM publishes", t)
			}
		case "block_hashes":
			if e.BlockHashes, err = d.hashes(); err != nil {
				return e, fmt.Errorf("block_hashes: %w", err)
			}
		case "parent_block_hash":
			if e.ParentHash, err = d.optHash(); err != nil {
				return e, fmt.Errorf("parent_block_hash: %w", err)
			}
		case "token_ids":
			if e.TokenIDs, err = d.tokenIDs(); err != nil {
				return e, fmt.Errorf("token_ids: %w", err)
			}
		case "block_size":
			// 0 where vLLM's offloading connectors tell of copies to
			// another medium, without token IDs.
			if e.BlockSize, err = d.DecodeInt(); err != nil || e.BlockSize < 0 {
				return e, fmt.Errorf("block_size %d: %v", e.BlockSize, err)
			}
		case "lora_id":
			id, err := d.optInt()
			if err != nil {
				return e, fmt.Errorf("lora_id: %w", err)
			}
			e.Extra = e.Extra || id != 0
		case "lora_name":
			name, err := d.optString()
			if err != nil {
				return e, fmt.Errorf("lora_name: %w", err)
			}
			e.Extra = e.Extra || name != ""
		case "extra_keys":
			extra, err := d.extraKeys()
			if err != nil {
				return e, fmt.Errorf("extra_keys: %w", err)
			}
			e.Extra = e.Extra || extra
		case "medium":
			if e.Medium, err = d.optString(); err != nil {
				return e, fmt.Errorf("medium: %w", err)
			}
		case "group_idx":
			if e.GroupIdx, err = d.optInt(); err != nil {
				return e, fmt.Errorf("group_idx: %w", err)
			}
		default:
			if err := d.Skip(); err != nil {
				return e, fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	if e.Kind == 0 {
		return e, errors.New("no type")
	}
	if e.Kind == BlockStored && len(e.TokenIDs) > 0 && len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		return e, fmt.Errorf("%d token IDs for %d blocks of %d", len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
	}
	return e, nil
}

func (d *decoder) hashes() ([]Hash, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > MaxTokenIDs {
		return nil, fmt.Errorf("%d hashes", n)
	}
	out := make([]Hash, n)
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

func (d *decoder) optHash() (Hash, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return "", d.DecodeNil()
	}
	return d.hash()
}

// hash reads bytes (a digest) or an integer (8 bytes big-endian).
func (d *decoder) hash() (Hash, error) {
	c, err := d.PeekCode()
	if err != nil {
		return "", err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := d.DecodeBytes()
		if err != nil {
			return "", err
		}
		if len(b) == 0 || len(b) > MaxHashBytes {
			return "", fmt.Errorf("a hash of %d bytes", len(b))
		}
		return Hash(b), nil
	}
	v, err := d.DecodeUint64()
	if err != nil {
		return "", err
	}
	var b [8]byte
	for i := range b {
		b[7-i] = byte(v >> (8 * i))
	}
	return Hash(b[:]), nil
}

func (d *decoder) tokenIDs() ([]int32, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || d.tokens+n > MaxTokenIDs {
		return nil, fmt.Errorf("%d more token IDs, past the batch's %d", n, MaxTokenIDs)
	}
	d.tokens += n
	out := make([]int32, n)
	for i := range out {
		v, err := d.DecodeInt64()
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		if v < 0 || v > 1<<31-1 {
			return nil, fmt.Errorf("[%d]: token ID %d", i, v)
		}
		out[i] = int32(v)
	}
	return out, nil
}

// extraKeys reads a stored event's extra keys (one entry per block, nil
// for a block without): whether any block has some.
func (d *decoder) extraKeys() (bool, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return false, d.DecodeNil()
	}
	n, err := d.DecodeArrayLen()
	if err != nil || n > MaxEvents {
		return false, fmt.Errorf("%d entries: %v", n, err)
	}
	extra := false
	for range n {
		if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
			if err := d.DecodeNil(); err != nil {
				return false, err
			}
			continue
		}
		extra = true
		if err := d.Skip(); err != nil {
			return false, err
		}
	}
	return extra, nil
}

func (d *decoder) optInt() (int, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return 0, d.DecodeNil()
	}
	return d.DecodeInt()
}

func (d *decoder) optString() (string, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return "", d.DecodeNil()
	}
	s, err := d.DecodeString()
	if len(s) > maxMemberNameLen {
		return "", fmt.Errorf("%d bytes", len(s))
	}
	return s, err
}
