package memstore

import (
	"context"
	"time"

	"github.com/pdplane/pdplane/registry"
)

// LiftQuarantine implements registry.Store.
func (s *Store) LiftQuarantine(_ context.Context, prefillID, decodeID, by string) error {
	s.mu.Lock()
	if _, err := s.find(prefillID); err != nil {
		s.mu.Unlock()
		return err
	}
	d, err := s.find(decodeID)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	key := [2]string{prefillID, decodeID}
	var cur *registry.Quarantine
	if q, ok := s.quarantines[key]; ok {
		cur = &q
	}
	events, err := registry.LiftQuarantine(cur, prefillID, decodeID, by)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.quarantines, key)
	s.log(d, events)
	s.mu.Unlock()
	s.publish(decodeID)
	return nil
}

// ExpireQuarantines implements registry.Store.
func (s *Store) ExpireQuarantines(_ context.Context, now time.Time) (int, error) {
	s.mu.Lock()
	var ids []string
	for k, q := range s.quarantines {
		next, events, changed := registry.ExpireQuarantine(q, now)
		if !changed {
			continue
		}
		s.quarantines[k] = next
		if d, ok := s.byID[q.DecodeID]; ok {
			s.log(d, events)
		}
		ids = append(ids, q.DecodeID)
	}
	s.mu.Unlock()
	if len(ids) > 0 {
		s.publish(ids...)
	}
	return len(ids), nil
}

// ReportTransferSuccess implements registry.Store.
func (s *Store) ReportTransferSuccess(_ context.Context, prefillID, decodeID, reporter string) (bool, error) {
	s.mu.Lock()
	if _, err := s.find(prefillID); err != nil {
		s.mu.Unlock()
		return false, err
	}
	d, err := s.find(decodeID)
	if err != nil {
		s.mu.Unlock()
		return false, err
	}
	key := [2]string{prefillID, decodeID}
	var cur *registry.Quarantine
	if q, ok := s.quarantines[key]; ok {
		cur = &q
	}
	events, lifted := registry.ApplyTrialSuccess(cur, reporter)
	if lifted {
		delete(s.quarantines, key)
		s.log(d, events)
	}
	s.mu.Unlock()
	if lifted {
		s.publish(decodeID)
	}
	return lifted, nil
}
