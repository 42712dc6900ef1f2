package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

func sampleMetadata() metadata {
	return metadata{
		Name:     "decode-7f3a",
		Addr:     "127.0.0.1:40123",
		Instance: 0xfeedface,
		Regions: []transfer.DescList{
			{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: 0x7f0000000000, Len: 1 << 20}, {Addr: 0x7f0000200000, Len: 4096}}},
		},
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	t.Parallel()
	m := sampleMetadata()
	got, err := decodeMetadata(encodeMetadata(m))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("got %+v, want %+v", got, m)
	}
}

func TestMetadataRejects(t *testing.T) {
	t.Parallel()
	good := encodeMetadata(sampleMetadata())
	flipped := bytes.Clone(good)
	flipped[len(mdMagic)+3] ^= 0xff
	cases := map[string][]byte{
		"empty":         nil,
		"wrong magic":   append([]byte("PDTCPMD0"), good[8:]...),
		"truncated":     good[:len(good)-9],
		"bit flip":      flipped,
		"no name":       encodeMetadata(metadata{Addr: "127.0.0.1:1"}),
		"unknown kind":  encodeMetadata(metadata{Name: "x", Addr: "a", Regions: []transfer.DescList{{Kind: registry.MemKind(77), Descs: []transfer.Desc{{Addr: 1, Len: 1}}}}}),
		"nixl metadata": []byte("nixlSerDes|agent|..."),
	}
	for name, b := range cases {
		if _, err := decodeMetadata(b); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: got %v, want ErrBadMetadata", name, err)
		}
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add(encodeMetadata(sampleMetadata()))
	f.Add([]byte(mdMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, transfer.ErrBadMetadata) {
				t.Fatalf("error %v is not ErrBadMetadata", err)
			}
			return
		}
		if m.Name == "" || m.Addr == "" {
			t.Fatalf("accepted metadata without a name or address: %+v", m)
		}
		if _, err := decodeMetadata(encodeMetadata(m)); err != nil {
			t.Fatalf("re-encoded metadata does not decode: %v", err)
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	h := make([]byte, headerBytes)
	putHeader(h, header{Op: transfer.OpWrite, HasNotif: true, Spans: 2, NotifLen: 3, Total: 8192})
	f.Add(h, []byte{})
	f.Add(make([]byte, headerBytes), make([]byte, 32))
	f.Fuzz(func(t *testing.T, hdr []byte, spans []byte) {
		if len(hdr) < headerBytes {
			return
		}
		h, err := parseHeader(hdr[:headerBytes])
		if err != nil {
			return
		}
		if h.Spans == 0 || h.Spans > maxSpans || h.NotifLen > maxNotif {
			t.Fatalf("accepted header %+v", h)
		}
		n := min(len(spans)/spanBytes, int(h.Spans)) * spanBytes
		ds, err := parseSpans(spans[:n], h.Total)
		if err != nil {
			return
		}
		var sum uint64
		for _, d := range ds {
			if d.Len == 0 {
				t.Fatal("accepted a zero-length span")
			}
			sum += d.Len
		}
		if sum != h.Total {
			t.Fatalf("spans add up to %d, header says %d", sum, h.Total)
		}
	})
}

func FuzzReadHello(f *testing.F) {
	f.Add(encodeHello(hello{Initiator: "a", Target: "b", Instance: 7}))
	f.Add([]byte("PDTH"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		if got, err := readHello(bytes.NewReader(encodeHello(h))); err != nil || got != h {
			t.Fatalf("hello %+v does not round-trip: %+v, %v", h, got, err)
		}
	})
}

// TestReadSpansAllocatesAsTheyArrive: spans announced but not sent cost
// one chunk, not the announcement (4,194,304 spans were 64 MiB at once),
// and spans that are sent are read whole and checked against the total.
func TestReadSpansAllocatesAsTheyArrive(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := readSpans(bytes.NewReader(make([]byte, 3*spanBytes)), maxSpans, maxSpans); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("spans announced, three sent: %v", err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Fatalf("reading 3 of %d announced spans allocated %d bytes", maxSpans, got)
	}

	var wire []byte
	want := make([]transfer.Desc, 2*spanChunk+5)
	for i := range want {
		want[i] = transfer.Desc{Addr: uint64(i) * 8, Len: 8}
		wire = binary.LittleEndian.AppendUint64(wire, want[i].Addr)
		wire = binary.LittleEndian.AppendUint64(wire, want[i].Len)
	}
	got, err := readSpans(bytes.NewReader(wire), uint32(len(want)), uint64(len(want))*8)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%d spans over three chunks: %d back, %v", len(want), len(got), err)
	}
	for name, total := range map[string]uint64{"short of the total": uint64(len(want))*8 + 1, "past the total": 8} {
		if _, err := readSpans(bytes.NewReader(wire), uint32(len(want)), total); !errors.Is(err, errBadSpans) {
			t.Fatalf("spans %s: %v, want errBadSpans", name, err)
		}
	}
}
