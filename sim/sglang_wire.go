package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// SGLang's disaggregation bootstrap plane, as its NIXL connector speaks it
// (python/sglang/srt/disaggregation/common/conn.py: CommonKVBootstrapServer,
// CommonKVReceiver; nixl/conn.py: NixlKVReceiver._register_kv_args and
// send_metadata, NixlKVManager's bootstrap thread, KVArgsRegisterInfo.from_zmq
// and TransferInfo.from_zmq):
//
//   - every prefill rank PUTs its rank_ip and rank_port to the bootstrap
//     server on the prefill's bootstrap port (PUT /route);
//   - a decode GETs the prefill's parallel layout (GET /route with every
//     rank -1), then the rank it pairs with (GET /route?prefill_dp_rank=…);
//   - it sends that rank, over a ZeroMQ PUSH socket to rank_ip:rank_port,
//     multipart messages that start with the guard frame "NixlMsgGuard":
//     once per prefill its KV args (room "None": agent name and metadata,
//     KV pointers, item lengths, memory kinds), then for every request the
//     room's destination pages (TransferInfo);
//   - the prefill WRITEs the KV with the notification
//     "<room>_kv_<chunk>_<is_last>_<pp_rank>" (mixed memory kinds: one
//     WRITE per segment, suffixed "_part_<i>_<n>"), which the decode polls
//     for. The prefill never answers a message: a decode whose prefill
//     failed waits out its own timeout.

// sglangGuard is the first frame of every bootstrap message (nixl/conn.py
// GUARD).
const sglangGuard = "NixlMsgGuard"

// sglangKVArgsRoom is the room frame of a KV-args registration.
const sglangKVArgsRoom = "None"

// rankRoute is what a prefill rank PUTs to /route
// (CommonKVBootstrapServer._handle_route_put reads every field but
// load_balance_method as required).
type rankRoute struct {
	AttnTPSize        *int    `json:"attn_tp_size"`
	AttnTPRank        *int    `json:"attn_tp_rank"`
	AttnCPSize        *int    `json:"attn_cp_size"`
	AttnCPRank        *int    `json:"attn_cp_rank"`
	AttnDPSize        *int    `json:"attn_dp_size"`
	AttnDPRank        *int    `json:"attn_dp_rank"`
	PPSize            *int    `json:"pp_size"`
	PPRank            *int    `json:"pp_rank"`
	SystemDPSize      *int    `json:"system_dp_size"`
	SystemDPRank      *int    `json:"system_dp_rank"`
	RankIP            *string `json:"rank_ip"`
	RankPort          *int    `json:"rank_port"`
	PageSize          *int    `json:"page_size"`
	KVCacheDtype      *string `json:"kv_cache_dtype"`
	LoadBalanceMethod string  `json:"load_balance_method,omitempty"`
}

// missing names the first required field the PUT lacks.
func (r *rankRoute) missing() string {
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"attn_tp_size", r.AttnTPSize != nil}, {"attn_tp_rank", r.AttnTPRank != nil},
		{"attn_cp_size", r.AttnCPSize != nil}, {"attn_cp_rank", r.AttnCPRank != nil},
		{"attn_dp_size", r.AttnDPSize != nil}, {"attn_dp_rank", r.AttnDPRank != nil},
		{"pp_size", r.PPSize != nil}, {"pp_rank", r.PPRank != nil},
		{"system_dp_size", r.SystemDPSize != nil}, {"system_dp_rank", r.SystemDPRank != nil},
		{"rank_ip", r.RankIP != nil}, {"rank_port", r.RankPort != nil},
		{"page_size", r.PageSize != nil}, {"kv_cache_dtype", r.KVCacheDtype != nil},
	} {
		if !f.set {
			return f.name
		}
	}
	return ""
}

// rankEndpoint is GET /route's answer for one rank (PrefillRankInfo).
type rankEndpoint struct {
	RankIP   string `json:"rank_ip"`
	RankPort int    `json:"rank_port"`
}

// endpoint is the rank socket's host:port.
func (e rankEndpoint) endpoint() string { return net.JoinHostPort(e.RankIP, strconv.Itoa(e.RankPort)) }

// prefillServerInfo is GET /route's answer when every rank is -1
// (PrefillServerInfo).
type prefillServerInfo struct {
	AttnTPSize          int    `json:"attn_tp_size"`
	AttnCPSize          int    `json:"attn_cp_size"`
	DPSize              int    `json:"dp_size"`
	PPSize              int    `json:"pp_size"`
	PageSize            int    `json:"page_size"`
	KVCacheDtype        string `json:"kv_cache_dtype"`
	FollowBootstrapRoom bool   `json:"follow_bootstrap_room"`
}

// sglangKVArgs is a decode rank's KV args as the prefill reads them
// (KVArgsRegisterInfo.from_zmq): the frames after the guard.
type sglangKVArgs struct {
	Endpoint   string // the decode rank's IP (frame 1)
	Port       int    // its rank_port (frame 2)
	AgentName  string // its NIXL agent (frame 3)
	Metadata   []byte // the agent's metadata (frame 4)
	KVDataPtrs []uint64
	GPUID      uint64
	TPSize     int // the decode's attention TP size (frame 9)
	TPRank     int // its engine rank (frame 10)
	ItemLen    uint64
	NumSlots   uint64 // pages per region (frame 16)
	// MemKinds is frame 17, comma-separated "VRAM"/"DRAM". A decode that
	// sends no kinds frame (SGLang before per-region kinds) or an empty one
	// is read as all VRAM, as from_zmq reads it.
	MemKinds []registry.MemKind
	// KindsSent reports whether the kinds frame was present and not empty.
	KindsSent bool
	ItemLens  []uint64 // frame 18; item_len for every region when absent
}

// endpointKey identifies the decode rank's process: its rank socket.
func (a *sglangKVArgs) endpointKey() string {
	return a.Endpoint + ":" + strconv.Itoa(a.Port)
}

// geometry is the destination the KV args describe.
func (a *sglangKVArgs) geometry() transfer.RankGeometry {
	g := transfer.RankGeometry{
		AgentName:  a.AgentName,
		KVDataPtrs: a.KVDataPtrs,
		KVItemLens: a.ItemLens,
		KVMemKinds: a.MemKinds,
		GPUID:      a.GPUID,
	}
	for _, l := range a.ItemLens {
		g.KVDataLens = append(g.KVDataLens, l*a.NumSlots)
	}
	return g
}

// encodeKVArgs builds the registration message a decode rank sends
// (NixlKVReceiver._register_kv_args): 24 frames, guard first. Aux, state,
// staging and layer-id frames are empty: the simulator has none of them.
// withKinds false leaves the kinds frame out, as a decode predating
// per-region kinds sends it (from_zmq then assumes VRAM).
func encodeKVArgs(ip string, port int, agentName string, metadata []byte, g transfer.RankGeometry, tpSize, tpRank int, withKinds bool) [][]byte {
	var itemLen, slots uint64
	if len(g.KVItemLens) > 0 && g.KVItemLens[0] > 0 {
		itemLen = g.KVItemLens[0]
		slots = g.KVDataLens[0] / itemLen
	}
	kinds := make([]string, len(g.KVMemKinds))
	for i, k := range g.KVMemKinds {
		kinds[i] = nixlKindName(k)
	}
	frames := [][]byte{
		[]byte(sglangGuard),
		[]byte(sglangKVArgsRoom),
		[]byte(ip),
		[]byte(strconv.Itoa(port)),
		[]byte(agentName),
		metadata,
		packU64(g.KVDataPtrs),
		nil, // aux data pointers
		nil, // state data pointers
		[]byte(strconv.FormatUint(g.GPUID, 10)),
		[]byte(strconv.Itoa(tpSize)),
		[]byte(strconv.Itoa(tpRank)),
		[]byte(strconv.FormatUint(itemLen, 10)),
		nil, // state item lengths
		nil, // state dims per tensor
		nil, // staging base pointer
		nil, // staging size
		[]byte(strconv.FormatUint(slots, 10)),
		[]byte(strings.Join(kinds, ",")),
		packU64(g.KVItemLens),
		nil,         // state layer ids
		nil,         // KV layer ids
		[]byte("1"), // DCP size
		[]byte("0"), // DCP rank
	}
	if !withKinds {
		frames[18] = nil
	}
	return frames
}

// errForeignTraffic: a message that does not start with the guard.
var errForeignTraffic = errors.New("first frame is not " + sglangGuard + ": foreign traffic")

// bootstrapFrames strips the guard; the room frame comes first after it.
func bootstrapFrames(frames [][]byte) ([][]byte, error) {
	if len(frames) < 2 || string(frames[0]) != sglangGuard {
		return nil, errForeignTraffic
	}
	return frames[1:], nil
}

// decodeKVArgs reads a registration (frames after the guard) as
// KVArgsRegisterInfo.from_zmq does.
func decodeKVArgs(m [][]byte) (*sglangKVArgs, error) {
	if len(m) < 12 {
		return nil, fmt.Errorf("KV args: %d frames, want at least 12", len(m))
	}
	a := &sglangKVArgs{Endpoint: string(m[1]), AgentName: string(m[3]), Metadata: m[4]}
	var err error
	if a.Port, err = strconv.Atoi(string(m[2])); err != nil {
		return nil, fmt.Errorf("KV args: dst_port: %w", err)
	}
	if len(m[5])%8 != 0 {
		return nil, fmt.Errorf("KV args: %d bytes of KV pointers is not a multiple of 8", len(m[5]))
	}
	a.KVDataPtrs = unpackU64(m[5])
	n := len(a.KVDataPtrs)
	ints := []struct {
		frame int
		dst   *int
		name  string
	}{{9, &a.TPSize, "decode_tp_size"}, {10, &a.TPRank, "decode_tp_rank"}}
	for _, f := range ints {
		if *f.dst, err = strconv.Atoi(string(m[f.frame])); err != nil {
			return nil, fmt.Errorf("KV args: %s: %w", f.name, err)
		}
	}
	if a.GPUID, err = strconv.ParseUint(string(m[8]), 10, 64); err != nil {
		return nil, fmt.Errorf("KV args: gpu_id: %w", err)
	}
	if a.ItemLen, err = strconv.ParseUint(string(m[11]), 10, 64); err != nil {
		return nil, fmt.Errorf("KV args: dst_kv_item_len: %w", err)
	}
	if len(m) > 16 && len(m[16]) > 0 {
		if a.NumSlots, err = strconv.ParseUint(string(m[16]), 10, 64); err != nil {
			return nil, fmt.Errorf("KV args: dst_num_slots: %w", err)
		}
	}
	a.MemKinds = make([]registry.MemKind, n)
	for i := range a.MemKinds {
		a.MemKinds[i] = registry.VRAM
	}
	if len(m) > 17 && len(m[17]) > 0 {
		names := strings.Split(string(m[17]), ",")
		if len(names) != n {
			return nil, fmt.Errorf("kv_data_mem_kinds length mismatch: got %d, expected %d", len(names), n)
		}
		for i, s := range names {
			k, ok := nixlKind(s)
			if !ok {
				return nil, fmt.Errorf("KV args: unsupported NIXL KV memory kind %q", s)
			}
			a.MemKinds[i] = k
		}
		a.KindsSent = true
	}
	a.ItemLens = make([]uint64, n)
	for i := range a.ItemLens {
		a.ItemLens[i] = a.ItemLen
	}
	if len(m) > 18 && len(m[18]) > 0 {
		lens := unpackU64(m[18])
		if len(lens) != n || len(m[18])%8 != 0 {
			return nil, fmt.Errorf("dst_kv_item_lens length mismatch: got %d, expected %d", len(lens), n)
		}
		a.ItemLens = lens
	}
	return a, nil
}

// sglangTransferInfo is one request's destination as the prefill reads it
// (TransferInfo.from_zmq).
type sglangTransferInfo struct {
	Room          uint64
	Endpoint      string
	Port          int
	AgentName     string
	Pages         []int // dst_kv_indices, int32
	RequiredDsts  int   // required_dst_info_num
	DecodePrefix  int
	IsDummyRank   bool
	HasDummyFrame bool
}

// encodeTransferInfo builds the per-request message a decode rank sends
// (NixlKVReceiver.send_metadata): guard, room, IP, port, agent name, the
// destination page indices as int32, aux index, required_dst_info_num,
// state indices, decode prefix length, is_dummy.
func encodeTransferInfo(room uint64, ip string, port int, agentName string, pages []int) [][]byte {
	idx := make([]byte, 4*len(pages))
	for i, p := range pages {
		binary.LittleEndian.PutUint32(idx[4*i:], uint32(int32(p)))
	}
	return [][]byte{
		[]byte(sglangGuard),
		[]byte(strconv.FormatUint(room, 10)),
		[]byte(ip),
		[]byte(strconv.Itoa(port)),
		[]byte(agentName),
		idx,
		[]byte("0"), // aux index: the simulator has no aux buffers
		[]byte("1"), // required_dst_info_num: equal TP
		nil,         // state indices
		[]byte("0"), // decode prefix length
		[]byte("0"), // is_dummy
	}
}

// decodeTransferInfo reads a request's destination (frames after the
// guard).
func decodeTransferInfo(m [][]byte) (*sglangTransferInfo, error) {
	if len(m) < 7 {
		return nil, fmt.Errorf("transfer info: %d frames, want at least 7", len(m))
	}
	t := &sglangTransferInfo{Endpoint: string(m[1]), AgentName: string(m[3])}
	var err error
	if t.Room, err = strconv.ParseUint(string(m[0]), 10, 64); err != nil {
		return nil, fmt.Errorf("transfer info: room: %w", err)
	}
	if t.Port, err = strconv.Atoi(string(m[2])); err != nil {
		return nil, fmt.Errorf("transfer info: dst_port: %w", err)
	}
	if len(m[4])%4 != 0 {
		return nil, fmt.Errorf("transfer info: %d bytes of page indices is not a multiple of 4", len(m[4]))
	}
	t.Pages = make([]int, len(m[4])/4)
	for i := range t.Pages {
		t.Pages[i] = int(int32(binary.LittleEndian.Uint32(m[4][4*i:])))
	}
	if t.RequiredDsts, err = strconv.Atoi(string(m[6])); err != nil {
		return nil, fmt.Errorf("transfer info: required_dst_info_num: %w", err)
	}
	if len(m) > 8 && len(m[8]) > 0 {
		if t.DecodePrefix, err = strconv.Atoi(string(m[8])); err != nil {
			return nil, fmt.Errorf("transfer info: decode_prefix_len: %w", err)
		}
	}
	if len(m) > 9 && len(m[9]) > 0 {
		t.HasDummyFrame, t.IsDummyRank = true, string(m[9]) != "0"
	}
	return t, nil
}

func packU64(v []uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func unpackU64(b []byte) []uint64 {
	out := make([]uint64, len(b)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out
}

// nixlKindName is NIXL's name of a memory kind, as SGLang writes it.
func nixlKindName(k registry.MemKind) string {
	if k == registry.DRAM {
		return "DRAM"
	}
	return "VRAM"
}

func nixlKind(s string) (registry.MemKind, bool) {
	switch s {
	case "VRAM":
		return registry.VRAM, true
	case "DRAM":
		return registry.DRAM, true
	}
	return 0, false
}

// sglangKVNotif is the notification of a room's KV: one chunk, the last,
// pipeline rank 0 (NixlKVManager: f"{room}_kv_{chunk_id}_{is_last}_{pp_rank}").
func sglangKVNotif(room uint64) string { return strconv.FormatUint(room, 10) + "_kv_0_1_0" }

// parseSGLangNotif reads a KV notification: its room, whether it is the
// last chunk, and the number of parts (mixed kinds). ok is false for any
// other message.
func parseSGLangNotif(msg string) (room uint64, last bool, parts int, ok bool) {
	parts = 1
	if i := strings.Index(msg, "_part_"); i >= 0 {
		var p, n int
		if _, err := fmt.Sscanf(msg[i:], "_part_%d_%d", &p, &n); err != nil || n < 1 || p < 0 || p >= n {
			return 0, false, 0, false
		}
		msg, parts = msg[:i], n
	}
	f := strings.Split(msg, "_")
	if len(f) < 4 || len(f) > 5 || f[1] != "kv" {
		return 0, false, 0, false
	}
	room, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || (f[3] != "0" && f[3] != "1") {
		return 0, false, 0, false
	}
	return room, f[3] == "1", parts, true
}
