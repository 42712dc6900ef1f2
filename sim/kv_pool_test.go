package sim

import (
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

func testPool(t *testing.T) *kvPool {
	t.Helper()
	c := Config{Name: "t", Role: registry.RolePrefill, PageSize: 4, NumLayers: 2, NumKVHeads: 1, HeadDim: 3, DType: "fp8_e4m3", Pages: 8}.WithDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	p, err := newKVPool(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.close() })
	return p
}

func TestKVPoolAllocRelease(t *testing.T) {
	t.Parallel()
	p := testPool(t)
	a, ok := p.alloc(3)
	if !ok || len(a) != 3 || a[0] != 0 || a[2] != 2 {
		t.Fatalf("alloc %v %t", a, ok)
	}
	if _, ok := p.alloc(6); ok {
		t.Fatal("allocated more pages than free")
	}
	if u := p.usage(); u != 3.0/8 {
		t.Fatalf("usage %v", u)
	}
	p.release(a)
	if u := p.usage(); u != 0 {
		t.Fatalf("usage after release %v", u)
	}
	if b, _ := p.alloc(3); b[0] != 0 || b[1] != 1 {
		t.Fatalf("released pages not reused in order: %v", b)
	}
}

func TestKVFillVerify(t *testing.T) {
	t.Parallel()
	p := testPool(t)
	prompt := tokenize("a prompt of a few words, odd slot sizes")
	seeds := promptSeeds(prompt)
	pages, _ := p.alloc(p.pagesFor(len(prompt)))
	p.poison(pages)
	if err := p.verify(seeds, pages); err == nil {
		t.Fatal("poisoned pages verified")
	}
	p.fill(seeds, pages)
	if err := p.verify(seeds, pages); err != nil {
		t.Fatal(err)
	}
	// Another prompt's KV does not pass.
	if err := p.verify(promptSeeds(tokenize("another prompt of a few words, odd slot sizes")), pages); err == nil {
		t.Fatal("another prompt's KV verified")
	}
	// A single flipped byte is caught, and named.
	p.item(1, pages[len(pages)-1])[0] ^= 1
	err := p.verify(seeds, pages)
	if err == nil || !strings.Contains(err.Error(), "region 1") {
		t.Fatalf("flipped byte: %v", err)
	}
	p.fill(seeds, pages)
	p.corrupt(pages)
	if err := p.verify(seeds, pages); err == nil {
		t.Fatal("corrupted pages verified")
	}
	// Regions differ for the same position.
	if string(p.item(0, pages[0])) == string(p.item(1, pages[0])) {
		t.Fatal("regions 0 and 1 hold the same bytes")
	}
}

func TestKVGeometry(t *testing.T) {
	t.Parallel()
	p := testPool(t)
	g := p.geometry("a")
	if len(g.KVDataPtrs) != 4 || g.KVItemLens[0] != 12 || g.KVDataLens[0] != 96 || g.KVDataPtrs[1]-g.KVDataPtrs[0] != 96 || g.KVDataPtrs[0] != p.buf.Addr() {
		t.Fatalf("geometry %+v", g)
	}
}

func TestTokenize(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		text string
		n    int
	}{{"", 1}, {"a", 2}, {"abcd", 2}, {"abcde", 3}, {"  two  words ", 4}} {
		if got := tokenize(tt.text); len(got) != tt.n || got[0] != bosToken {
			t.Fatalf("tokenize(%q) = %v, want %d tokens", tt.text, got, tt.n)
		}
	}
	if a, b := tokenize("same text"), tokenize("same text"); a[1] != b[1] || a[2] != b[2] {
		t.Fatal("tokenize is not deterministic")
	}
}

func TestParseNotif(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		msg, kind, id string
		total         int
		ok            bool
	}{
		// SGLang's KV tag, f"{room}_kv_{chunk_id}_{is_last}_{pp_rank}"
		// (nixl/conn.py, NixlKVManager), and its mixed-kinds parts
		// (send_kvcache_mixed: f"{notif}_part_{part_idx}_{num_parts}").
		{"42_kv_0_1_0", notifRoom, "42", 1, true},
		{"42_kv_0_1_0_part_1_3", notifRoom, "42", 3, true},
		{"9223372036854775807_kv_0_1_0", notifRoom, "9223372036854775807", 1, true},
		{"42_kv_0_0_0", "", "", 0, false}, // not the last chunk
		{"42_aux", "", "", 0, false},      // the simulator sends no aux
		{"42_kv_0_1_0_part_3_3", "", "", 0, false},
		{"x_kv_0_1_0", "", "", 0, false},
		{"done:req-1-p0-7", notifDone, "req-1-p0-7", 1, true},
		{"done:a_part_x", notifDone, "a_part_x", 1, true},
		{"done:", "", "", 0, false},
		{"hello", "", "", 0, false},
	} {
		kind, id, total, ok := parseNotif(tt.msg)
		if kind != tt.kind || id != tt.id || total != tt.total || ok != tt.ok {
			t.Fatalf("parseNotif(%q) = %q %q %d %t", tt.msg, kind, id, total, ok)
		}
	}
}
