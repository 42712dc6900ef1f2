package server

import (
	"context"

	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// GetFleet counts the routing snapshot's peers and pairs and names the
// replica, store and version that answer: the status page's header. It
// reads no rank, so it stays cheap at any fleet size.
func (h handlers) GetFleet(context.Context, api.GetFleetRequestObject) (api.GetFleetResponseObject, error) {
	snap := h.snaps.Snapshot()
	counts := snap.Counts()
	out := apiconv.FleetCounts(&counts)
	out.Replica, out.Store, out.Version = h.cfg.Replica, api.FleetSummaryStore(h.cfg.StoreKind), h.cfg.Version
	out.SnapshotVersion = int64(snap.Version)
	if h.breakers != nil {
		peers, pairs := h.breakers.OpenBreakers()
		out.Breakers = &api.FleetBreakers{PeersOpen: peers, PairsOpen: pairs}
	}
	return api.GetFleet200JSONResponse(out), nil
}

// ListPairGroups groups the snapshot's pairs by geometry class and model.
func (h handlers) ListPairGroups(context.Context, api.ListPairGroupsRequestObject) (api.ListPairGroupsResponseObject, error) {
	snap := h.snaps.Snapshot()
	groups := snap.PairGroups()
	out := api.ListPairGroups200JSONResponse{Groups: make([]api.PairGroup, len(groups)), Pairs: snap.PairCount()}
	for i := range groups {
		out.Groups[i] = apiconv.PairGroup(&groups[i])
	}
	return out, nil
}

// peerBreaker is the router's breaker for a peer, nil without a router.
func (s *Server) peerBreaker(id string) *api.Breaker {
	if s.breakers == nil {
		return nil
	}
	return apiconv.Breaker(s.breakers.PeerBreaker(id))
}

// pairBreaker is the router's breaker for a pair, nil when it has none.
func (s *Server) pairBreaker(prefillID, decodeID string) *api.Breaker {
	if s.breakers == nil {
		return nil
	}
	return apiconv.Breaker(s.breakers.PairBreaker(prefillID, decodeID))
}
