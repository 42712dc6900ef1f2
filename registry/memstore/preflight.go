package memstore

import (
	"bytes"
	"context"
	"fmt"

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

// Preflights implements registry.Store.
func (s *Store) Preflights(context.Context) ([]registry.Preflight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.Preflight, 0, len(s.preflights))
	for _, pf := range s.preflights {
		out = append(out, pf)
	}
	return out, nil
}

// PublishProbe implements registry.Store.
func (s *Store) PublishProbe(_ context.Context, pr registry.Probe) (registry.Probe, error) {
	if err := registry.ValidateProbe(pr); err != nil {
		return registry.Probe{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.find(pr.PeerID)
	if err != nil {
		return registry.Probe{}, err
	}
	pr.Generation, pr.UpdatedAt = p.Generation, s.now()
	pr.Metadata, pr.TransferSecret = bytes.Clone(pr.Metadata), bytes.Clone(pr.TransferSecret)
	s.probes[pr.PeerID] = pr
	return pr, nil
}

// Probe implements registry.Store.
func (s *Store) Probe(_ context.Context, peerID string) (registry.Probe, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pr, ok := s.probes[peerID]
	if _, err := s.find(peerID); err != nil || !ok {
		return registry.Probe{}, fmt.Errorf("probe of peer %s: %w", peerID, registry.ErrNotFound)
	}
	pr.Metadata, pr.TransferSecret = bytes.Clone(pr.Metadata), bytes.Clone(pr.TransferSecret)
	return pr, nil
}

// forgetPreflights drops a removed peer's probe (up to a MiB of agent
// metadata) and its pairs' preflights, as PostgreSQL's ON DELETE CASCADE
// does for pgstore; the caller holds mu.
func (s *Store) forgetPreflights(id string) {
	delete(s.probes, id)
	for k := range s.preflights {
		if k[0] == id || k[1] == id {
			delete(s.preflights, k)
		}
	}
	for k := range s.exchanges {
		if k[0] == id || k[1] == id {
			delete(s.exchanges, k)
		}
	}
}
