package server

import (
	"context"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// hangingExchanges is a real store whose exchange reads hang until
// release closes, as a store whose connection black-holes does.
type hangingExchanges struct {
	registry.Store
	release chan struct{}
}

func (h hangingExchanges) Exchanges(ctx context.Context) ([]registry.Exchange, error) {
	<-h.release
	return h.Store.Exchanges(ctx)
}

// TestExchangeCacheNeverHoldsAnAnswer: with the store's read hanging, the
// first answer waits at most exchangeFirstWait and later ones not at all;
// once the read comes back, answers carry its exchanges.
func TestExchangeCacheNeverHoldsAnAnswer(t *testing.T) {
	store := memstore.New(memstore.Config{})
	ctx := context.Background()
	p, err := store.Register(ctx, registrytest.Spec("p0", registry.RolePrefill), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := store.Register(ctx, registrytest.Spec("d0", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Second)
	if err := store.RecordExchanges(ctx, []registry.Exchange{{PrefillID: p.Peer.ID, DecodeID: d.Peer.ID, At: at}}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	c := exchangeCache{store: hangingExchanges{store, release}}
	start := time.Now()
	if m := c.get(ctx); len(m) != 0 {
		t.Fatalf("exchanges %v before any read ended", m)
	}
	if took := time.Since(start); took > exchangeFirstWait+time.Second {
		t.Fatalf("the first answer waited %s", took)
	}
	start = time.Now()
	c.get(ctx)
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("a later answer waited %s on the hanging read", took)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got, ok := c.get(ctx)[[2]string{p.Peer.ID, d.Peer.ID}]; ok && got.Equal(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the read's exchanges never reached an answer")
		}
		time.Sleep(10 * time.Millisecond) // a poll with a deadline
	}
}
