package registry

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// compatKeyFmt is CompatKey as it was written with fmt: the hand-appended
// key must stay the same string, field for field.
func compatKeyFmt(s *PeerSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%q|%q|%d|%q|%t|%d|%d|%d", s.Engine.Protocol(), s.Model, s.TransferGroup,
		s.KV.PageSize, s.KV.DType, s.KV.IsMLA, s.KV.NumLayers, s.Parallelism.PPSize, s.Parallelism.AttnTPSize)
	for i := range s.Ranks {
		b.WriteString("|")
		for _, k := range s.Ranks[i].KVMemKinds {
			b.WriteString(strconv.Itoa(int(k)))
		}
		b.WriteString("/")
		b.WriteString(strconv.Itoa(len(s.Ranks[i].KVDataPtrs)))
	}
	fmt.Fprintf(&b, "|unknown=%q", s.Unknown)
	return b.String()
}

func TestCompatKeyMatchesFmt(t *testing.T) {
	specs := []PeerSpec{
		{},
		{Engine: EngineSim, Model: "m \"quoted\"\n", TransferGroup: "g", KV: KVGeometry{PageSize: 64, DType: "bf16", IsMLA: true, NumLayers: 61},
			Parallelism: Parallelism{PPSize: 2, AttnTPSize: 8},
			Ranks:       []Rank{{KVMemKinds: []MemKind{1, 2}, KVDataPtrs: []uint64{1, 2}}, {}},
			Unknown:     []string{"kv.dtype", "é\x00"}},
		{Engine: EngineVLLM, Unknown: []string{}},
	}
	for i := range specs {
		if got, want := CompatKey(&specs[i]), compatKeyFmt(&specs[i]); got != want {
			t.Errorf("spec %d: CompatKey %q, fmt gives %q", i, got, want)
		}
	}
}
