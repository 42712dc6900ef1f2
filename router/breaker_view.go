package router

import "time"

// PeerBreaker reports the state of this router's circuit breaker for a peer
// ("closed", "open" or "half_open") and when it last opened (zero while
// closed); false when the peer is not in the router's current view. It is
// the router's own observation, for the control plane to show beside what
// the registry says.
func (rt *Router) PeerBreaker(peerID string) (state string, since time.Time, ok bool) {
	st, ok := rt.currentView().byID[peerID]
	if !ok {
		return "", time.Time{}, false
	}
	s, at := st.breaker.observe()
	return s.String(), at, true
}

// PairBreaker is PeerBreaker for a pair; false when the pair never failed
// (it has no breaker, which reads as closed).
func (rt *Router) PairBreaker(prefillID, decodeID string) (state string, since time.Time, ok bool) {
	b := rt.pairs.get(prefillID, decodeID)
	if b == nil {
		return "", time.Time{}, false
	}
	s, at := b.observe()
	return s.String(), at, true
}

// OpenBreakers counts this router's peer and pair breakers that are not
// closed.
func (rt *Router) OpenBreakers() (peers, pairs int) {
	for _, st := range rt.currentView().byID {
		if st.breaker.current() != breakerClosed {
			peers++
		}
	}
	return peers, int(rt.pairs.notClosed.Load())
}

// observe returns the breaker's state and when it last opened (zero while
// closed).
func (b *breaker) observe() (breakerState, time.Time) {
	if s := b.current(); s == breakerClosed {
		return s, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.current()
	if s == breakerClosed {
		return s, time.Time{}
	}
	return s, b.openedAt
}

// InFlight is the requests this router has in flight with the peer, as
// prefill or decode (an attempt counts on both from its start to its end,
// the KV handoff between them included); 0 for a peer it does not know.
func (rt *Router) InFlight(peerID string) int64 {
	st, ok := rt.currentView().byID[peerID]
	if !ok {
		return 0
	}
	return st.inflight.Load()
}
