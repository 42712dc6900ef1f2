package sim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// The frame layouts below are SGLang's NIXL connector's
// (python/sglang/srt/disaggregation/nixl/conn.py): NixlKVReceiver.
// _register_kv_args builds the registration, KVArgsRegisterInfo.from_zmq
// reads it; NixlKVReceiver.send_metadata builds a request's destination,
// TransferInfo.from_zmq reads it. Both start with GUARD = b"NixlMsgGuard".

func TestKVArgsFrames(t *testing.T) {
	t.Parallel()
	g := transfer.RankGeometry{
		KVDataPtrs: []uint64{0x1000, 0x9000},
		KVDataLens: []uint64{4096 * 8, 4096 * 8},
		KVItemLens: []uint64{4096, 4096},
		KVMemKinds: []registry.MemKind{registry.DRAM, registry.VRAM},
		GPUID:      3,
	}
	f := encodeKVArgs("10.0.0.7", 17001, "d0-agent", []byte("md"), g, 2, 1, true)
	if len(f) != 24 || string(f[0]) != "NixlMsgGuard" || string(f[1]) != "None" {
		t.Fatalf("%d frames, first %q %q", len(f), f[0], f[1])
	}
	// After the guard (from_zmq's indices): 1 ip, 2 port, 3 agent, 4
	// metadata, 5 packed "Q" pointers, 8 gpu_id, 9 decode_tp_size, 10
	// decode_tp_rank (engine_rank), 11 dst_kv_item_len, 16 dst_num_slots, 17
	// comma-separated kinds, 18 packed "Q" item lengths.
	m := f[1:]
	for i, want := range map[int]string{1: "10.0.0.7", 2: "17001", 3: "d0-agent", 4: "md", 8: "3", 9: "2", 10: "1", 11: "4096", 16: "8", 17: "DRAM,VRAM"} {
		if string(m[i]) != want {
			t.Fatalf("frame %d = %q, want %q", i, m[i], want)
		}
	}
	if !bytes.Equal(m[5], binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 0x1000), 0x9000)) {
		t.Fatalf("pointers %x", m[5])
	}
	a, err := decodeKVArgs(m)
	if err != nil {
		t.Fatal(err)
	}
	got := a.geometry()
	if !a.KindsSent || a.TPSize != 2 || a.TPRank != 1 || a.endpointKey() != "10.0.0.7:17001" ||
		got.GPUID != 3 || got.KVDataLens[1] != 4096*8 || got.KVMemKinds[0] != registry.DRAM || got.KVMemKinds[1] != registry.VRAM {
		t.Fatalf("decoded %+v geometry %+v", a, got)
	}

	// A decode that sends no kinds is read as all VRAM, as from_zmq reads
	// it (_unpack_kv_mem_kinds of b"").
	a, err = decodeKVArgs(encodeKVArgs("h", 1, "x", nil, g, 1, 0, false)[1:])
	if err != nil || a.KindsSent || a.MemKinds[0] != registry.VRAM || a.MemKinds[1] != registry.VRAM {
		t.Fatalf("no kinds: %+v %v", a, err)
	}
	// Older decodes stop before frame 17: the same.
	a, err = decodeKVArgs(m[:17])
	if err != nil || a.KindsSent || a.MemKinds[0] != registry.VRAM || a.ItemLens[1] != 4096 {
		t.Fatalf("short registration: %+v %v", a, err)
	}

	for name, bad := range map[string]func([][]byte){
		"kinds count":   func(m [][]byte) { m[17] = []byte("VRAM") },
		"unknown kind":  func(m [][]byte) { m[17] = []byte("VRAM,HBM") },
		"ragged ptrs":   func(m [][]byte) { m[5] = m[5][:7] },
		"port":          func(m [][]byte) { m[2] = []byte("x") },
		"item lens len": func(m [][]byte) { m[18] = m[18][:8] },
	} {
		c := append([][]byte(nil), m...)
		bad(c)
		if _, err := decodeKVArgs(c); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}

func TestTransferInfoFrames(t *testing.T) {
	t.Parallel()
	f := encodeTransferInfo(9223372036854775807, "10.0.0.7", 17001, "d0-agent", []int{5, 0, 70000})
	// send_metadata: GUARD, room, ip, port, agent, int32 indices, aux index,
	// required_dst_info_num, state indices, decode_prefix_len, is_dummy.
	if len(f) != 11 || string(f[0]) != sglangGuard || string(f[1]) != "9223372036854775807" || len(f[5]) != 12 || string(f[7]) != "1" {
		t.Fatalf("frames %q", f)
	}
	ti, err := decodeTransferInfo(f[1:])
	if err != nil || ti.Room != 9223372036854775807 || ti.AgentName != "d0-agent" || ti.Port != 17001 ||
		len(ti.Pages) != 3 || ti.Pages[2] != 70000 || ti.RequiredDsts != 1 || ti.IsDummyRank {
		t.Fatalf("%+v %v", ti, err)
	}
	if _, err := bootstrapFrames([][]byte{[]byte("hello"), []byte("1")}); !errors.Is(err, errForeignTraffic) {
		t.Fatalf("foreign traffic: %v", err)
	}
	if _, err := decodeTransferInfo([][]byte{[]byte("-1"), nil, []byte("1"), nil, nil, nil, []byte("1")}); err == nil {
		t.Fatal("negative room accepted")
	}
}

func TestSGLangKVNotif(t *testing.T) {
	t.Parallel()
	n := sglangKVNotif(77)
	if n != "77_kv_0_1_0" || !strings.HasPrefix(n+"_part_0_2", n) {
		t.Fatal(n)
	}
	room, last, parts, ok := parseSGLangNotif(n + "_part_1_2")
	if !ok || room != 77 || !last || parts != 2 {
		t.Fatal(room, last, parts, ok)
	}
}
