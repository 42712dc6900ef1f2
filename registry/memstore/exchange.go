package memstore

import (
	"context"

	"github.com/pdplane/pdplane/registry"
)

// RecordExchanges implements registry.Store.
func (s *Store) RecordExchanges(_ context.Context, xs []registry.Exchange) error {
	if err := registry.ValidateExchanges(xs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range xs {
		if s.byID[x.PrefillID] == nil || s.byID[x.DecodeID] == nil {
			continue
		}
		k := [2]string{x.PrefillID, x.DecodeID}
		if at, ok := s.exchanges[k]; !ok || x.At.After(at) {
			s.exchanges[k] = x.At.UTC()
		}
	}
	return nil
}

// Exchanges implements registry.Store.
func (s *Store) Exchanges(context.Context) ([]registry.Exchange, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.Exchange, 0, len(s.exchanges))
	for k, at := range s.exchanges {
		out = append(out, registry.Exchange{PrefillID: k[0], DecodeID: k[1], At: at})
	}
	return out, nil
}
