package memstore

import (
	"context"

	"github.com/pdplane/pdplane/registry"
)

// ReportPreflight implements registry.Store.
func (s *Store) ReportPreflight(_ context.Context, pf registry.Preflight) (registry.Preflight, error) {
	if err := registry.ValidatePreflight(pf); err != nil {
		return registry.Preflight{}, err
	}
	s.mu.Lock()
	p, err := s.find(pf.PrefillID)
	if err != nil {
		s.mu.Unlock()
		return registry.Preflight{}, err
	}
	d, err := s.find(pf.DecodeID)
	if err != nil {
		s.mu.Unlock()
		return registry.Preflight{}, err
	}
	pf.PrefillGeneration, pf.DecodeGeneration = p.Generation, d.Generation
	pf.CheckedAt = pf.CheckedAt.UTC()
	s.preflights[[2]string{pf.PrefillID, pf.DecodeID}] = pf
	s.mu.Unlock()
	s.publish(pf.PrefillID, pf.DecodeID)
	return pf, nil
}

// Preflights implements registry.Store. Preflights of removed peers are
// dropped here.
func (s *Store) Preflights(context.Context) ([]registry.Preflight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.Preflight, 0, len(s.preflights))
	for k, pf := range s.preflights {
		_, okP := s.byID[k[0]]
		_, okD := s.byID[k[1]]
		if !okP || !okD {
			delete(s.preflights, k)
			continue
		}
		out = append(out, pf)
	}
	return out, nil
}
