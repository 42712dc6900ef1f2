package sim

import (
	"bytes"
	"os"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// eventKeys walks a msgpack KVEventBatch and returns, per event type, the
// member names of its first event of that type in order, and the code the
// batch's ts is written with.
func eventKeys(t *testing.T, payload []byte) (keys map[string][]string, tsCode byte) {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	n, err := d.DecodeArrayLen()
	must(err)
	if n != 3 {
		t.Fatalf("a batch of %d members, want [ts, events, data_parallel_rank]", n)
	}
	tsCode, err = d.PeekCode()
	must(err)
	must(d.Skip())
	m, err := d.DecodeArrayLen()
	must(err)
	keys = map[string][]string{}
	for range m {
		k, err := d.DecodeMapLen()
		must(err)
		var names []string
		var typ string
		for range k {
			name, err := d.DecodeString()
			must(err)
			names = append(names, name)
			if name == "type" {
				typ, err = d.DecodeString()
				must(err)
				continue
			}
			must(d.Skip())
		}
		if _, seen := keys[typ]; !seen {
			keys[typ] = names
		}
	}
	return keys, tsCode
}

// TestKVBatchEncodingIsVLLMs: the sim's batches have the shape of the
// batch vLLM 0.32's own encoder wrote (kvevents/testdata, made as its
// README says): an array [ts as a float64, events, rank], each event a map
// of the members vLLM always sends, in vLLM's order, led by its type.
func TestKVBatchEncodingIsVLLMs(t *testing.T) {
	t.Parallel()
	fixture, err := os.ReadFile("../kvevents/testdata/vllm-batch.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	want, wantTS := eventKeys(t, fixture)
	c := newPrefixCache(4, 2)
	var ch cacheChange
	c.onChange = func(x cacheChange) { ch = x }
	c.insert([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) // three blocks in a cache of two
	got, gotTS := eventKeys(t, encodeKVBatch(1796580000.25, ch, 4))
	if gotTS != wantTS || gotTS != msgpcode.Double {
		t.Errorf("ts written with code %#x, vLLM's with %#x", gotTS, wantTS)
	}
	for _, typ := range []string{"BlockStored", "BlockRemoved"} {
		if !slices.Equal(got[typ], want[typ]) {
			t.Errorf("%s members %v, vLLM's %v", typ, got[typ], want[typ])
		}
	}
}
