package registrytest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// testExchanges: a pair keeps the latest exchange any report gave it (a
// batch may name a pair twice, and an older report changes nothing);
// pairs of a peer that is gone are left out of a report and forgotten
// with the peer; a bad report is refused naming the entry.
func testExchanges(t *testing.T, s registry.Store) {
	p0, p1, d, _ := readyPairs(t, s)
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	list := func() map[[2]string]time.Time {
		t.Helper()
		xs, err := s.Exchanges(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		m := map[[2]string]time.Time{}
		for _, x := range xs {
			m[[2]string{x.PrefillID, x.DecodeID}] = x.At
		}
		return m
	}
	if err := s.RecordExchanges(ctx(t), []registry.Exchange{
		{PrefillID: p0.ID, DecodeID: d.ID, At: at(5)},
		{PrefillID: p0.ID, DecodeID: d.ID, At: at(9)},
		{PrefillID: p1.ID, DecodeID: d.ID, At: at(3)},
		{PrefillID: "00000000-0000-4000-8000-000000000000", DecodeID: d.ID, At: at(4)}, // no such peer
	}); err != nil {
		t.Fatal(err)
	}
	// An older report, from a replica that saw the pair earlier.
	if err := s.RecordExchanges(ctx(t), []registry.Exchange{{PrefillID: p0.ID, DecodeID: d.ID, At: at(7)}}); err != nil {
		t.Fatal(err)
	}
	got := list()
	want := map[[2]string]time.Time{{p0.ID, d.ID}: at(9), {p1.ID, d.ID}: at(3)}
	if len(got) != len(want) || !got[[2]string{p0.ID, d.ID}].Equal(at(9)) || !got[[2]string{p1.ID, d.ID}].Equal(at(3)) {
		t.Fatalf("exchanges %v, want %v", got, want)
	}
	for _, bad := range []struct {
		xs    []registry.Exchange
		field string
	}{
		{[]registry.Exchange{{PrefillID: "x", DecodeID: d.ID, At: at(1)}}, "exchanges[0].prefill_id"},
		{[]registry.Exchange{{PrefillID: p0.ID, DecodeID: d.ID, At: at(1)}, {PrefillID: p0.ID, DecodeID: "", At: at(1)}}, "exchanges[1].decode_id"},
		{[]registry.Exchange{{PrefillID: p0.ID, DecodeID: d.ID}}, "exchanges[0].at"},
		{slices.Repeat([]registry.Exchange{{PrefillID: p0.ID, DecodeID: d.ID, At: at(1)}}, registry.MaxExchangesPerReport+1), "exchanges"},
	} {
		err := s.RecordExchanges(ctx(t), bad.xs)
		var ve *registry.FieldError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("report naming %s: %v, want a validation error naming it", bad.field, err)
		}
	}
	if err := s.Delete(ctx(t), p1.ID); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 1 || !got[[2]string{p0.ID, d.ID}].Equal(at(9)) {
		t.Fatalf("after prefill-1 left: %v, want only p0 -> d at %v", got, at(9))
	}
}
