package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/replica"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// handlers implements api.StrictServerInterface over the store and the
// mirror's snapshot. Errors are returned, not written: toProblem turns them
// into problem+json at the edge.
type handlers struct{ *Server }

var _ api.StrictServerInterface = handlers{}

func (h handlers) RegisterPeer(ctx context.Context, req api.RegisterPeerRequestObject) (api.RegisterPeerResponseObject, error) {
	if req.Body == nil {
		return nil, malformed("body", "a JSON body is required")
	}
	spec, err := specFromAPI(req.Body)
	if err != nil {
		return nil, err
	}
	if err := h.cfg.PeerNetworks.Check(&spec); err != nil {
		return nil, err
	}
	who := principalFrom(ctx)
	claim := registry.Claim{Open: h.open(), Admin: who.kind == admin, Join: who.kind == joiner, Credential: who.credential}
	// The store validates the spec (a *registry.FieldError is a 422).
	res, err := h.store.Register(ctx, spec, claim)
	if err != nil {
		return nil, fmt.Errorf("register peer %s: %w", spec.Name, err)
	}
	h.metrics.registrations.WithLabelValues(string(spec.Role), created(res.Created)).Inc()
	out := apiconv.Peer(&res.Peer, h.timing())
	out.Credential = apiconv.Opt(res.Credential)
	if res.Created {
		return api.RegisterPeer201JSONResponse(out), nil
	}
	return api.RegisterPeer200JSONResponse(out), nil
}

func created(c bool) string {
	if c {
		return "created"
	}
	return "updated"
}

func (h handlers) ListPeers(ctx context.Context, req api.ListPeersRequestObject) (api.ListPeersResponseObject, error) {
	var f registry.Filter
	if r := req.Params.Role; r != nil {
		if f.Role = registry.Role(*r); !f.Role.Valid() {
			return nil, malformed("role", fmt.Sprintf("unknown role %q (want prefill, decode or both)", *r))
		}
	}
	if s := req.Params.State; s != nil {
		if f.State = registry.State(*s); !f.State.Valid() {
			return nil, malformed("state", fmt.Sprintf("unknown state %q", *s))
		}
	}
	f.Model = apiconv.Deref(req.Params.Model)
	if err := f.Validate(); err != nil {
		return nil, badParam(err)
	}
	peers, err := h.store.List(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("list peers: %w", err)
	}
	view := api.Full
	if v := req.Params.View; v != nil {
		if !v.Valid() {
			return nil, malformed("view", fmt.Sprintf("unknown view %q (want full or summary)", *v))
		}
		view = *v
	}
	out := api.ListPeers200JSONResponse{Peers: make([]api.PeerSummary, len(peers))}
	for i := range peers {
		out.Peers[i] = apiconv.PeerSummary(&peers[i], h.timing())
		if view == api.Summary {
			out.Peers[i].Ranks = nil
		}
		out.Peers[i].Breaker = h.peerBreaker(peers[i].ID)
	}
	return out, nil
}

func (h handlers) GetPeer(ctx context.Context, req api.GetPeerRequestObject) (api.GetPeerResponseObject, error) {
	p, err := h.store.Get(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	out := apiconv.PeerSummary(&p, h.timing())
	out.Breaker = h.peerBreaker(p.ID)
	return api.GetPeer200JSONResponse(out), nil
}

// GetPeerRegistration returns the full registration; auth.go admits only
// peer credentials (of the peer or its counterparts) and the admin token.
func (h handlers) GetPeerRegistration(ctx context.Context, req api.GetPeerRegistrationRequestObject) (api.GetPeerRegistrationResponseObject, error) {
	p, err := h.readableRegistration(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	return api.GetPeerRegistration200JSONResponse(apiconv.Peer(&p, h.timing())), nil
}

// readableRegistration returns the peer id names if the caller may read its
// full registration (checkRegistrationRead), and the problem otherwise. It
// gates the registration and the probe alike: the same peers may read both.
func (h handlers) readableRegistration(ctx context.Context, id string) (registry.Peer, error) {
	p, err := h.store.Get(ctx, id)
	if err != nil {
		return registry.Peer{}, err
	}
	if prob := h.checkRegistrationRead(principalFrom(ctx), &p); prob != nil {
		return registry.Peer{}, prob
	}
	return p, nil
}

func (h handlers) DeletePeer(ctx context.Context, req api.DeletePeerRequestObject) (api.DeletePeerResponseObject, error) {
	if err := h.store.Delete(ctx, req.Id); err != nil {
		return nil, err
	}
	return api.DeletePeer204Response{}, nil
}

func (h handlers) DrainPeer(ctx context.Context, req api.DrainPeerRequestObject) (api.DrainPeerResponseObject, error) {
	p, err := h.store.Drain(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	return api.DrainPeer200JSONResponse(apiconv.PeerSummary(&p, h.timing())), nil
}

// GetDrain says whether a draining peer may be stopped (registry.DrainSafe).
func (h handlers) GetDrain(ctx context.Context, req api.GetDrainRequestObject) (api.GetDrainResponseObject, error) {
	p, err := h.store.Get(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	var inFlight int64
	if h.breakers != nil {
		inFlight = h.breakers.InFlight(p.ID)
	}
	safe, reason := registry.DrainSafe(&p, inFlight)
	load := apiconv.Load(p.Load)
	out := api.DrainStatus{Id: p.ID, Name: p.Name, State: api.State(p.State), Safe: safe, Reason: reason, InFlightHere: inFlight,
		LoadAt: p.LastHeartbeat, Load: &load}
	if p.State == registry.StateDraining {
		out.DrainingSince = &p.UpdatedAt
	}
	return api.GetDrain200JSONResponse(out), nil
}

func (h handlers) HeartbeatPeer(ctx context.Context, req api.HeartbeatPeerRequestObject) (api.HeartbeatPeerResponseObject, error) {
	if req.Body == nil {
		return nil, malformed("body", "a JSON body is required")
	}
	hb := registry.Heartbeat{PeerID: req.Id, InstanceID: req.Body.InstanceId, EngineError: apiconv.Deref(req.Body.EngineError),
		HealError: apiconv.Deref(req.Body.HealError)}
	if l := req.Body.Load; l != nil {
		hb.Load = registry.Load{Running: l.Running, Queued: l.Queued, KVUsage: l.KvUsage}
	}
	if req.Body.EngineHealthy != nil {
		hb.EngineDown = !*req.Body.EngineHealthy
	}
	// The store validates the heartbeat (a *registry.FieldError is a 422).
	reply, err := h.store.Heartbeat(ctx, hb)
	if err != nil {
		return nil, err
	}
	h.metrics.heartbeats.WithLabelValues(string(reply.Action)).Inc()
	return api.HeartbeatPeer200JSONResponse{Action: api.HeartbeatReplyAction(reply.Action), Reason: apiconv.Opt(reply.Reason), State: api.State(reply.State)}, nil
}

func (h handlers) MarkPeerStale(ctx context.Context, req api.MarkPeerStaleRequestObject) (api.MarkPeerStaleResponseObject, error) {
	if req.Body == nil {
		return nil, malformed("body", "a JSON body is required")
	}
	// The store validates the report (a *registry.FieldError is a 422).
	who := principalFrom(ctx)
	if p := h.checkReport(ctx, who, req.Id, req.Body); p != nil {
		return nil, p
	}
	if req.Body.PrefillId == nil && req.Body.AgentName == nil {
		// The reporter is added to the reason below; the caller's own
		// reason is what must meet the limits.
		if err := registry.ValidateStaleMark(req.Body.Reason, apiconv.Deref(req.Body.Error)); err != nil {
			return nil, err
		}
		p, err := h.store.MarkStale(ctx, req.Id, registry.ReportedBy(req.Body.Reason, who.Name()), apiconv.Deref(req.Body.Error))
		if err != nil {
			return nil, err
		}
		h.metrics.staleMarks.WithLabelValues("api", string(registry.OutcomeStale)).Inc()
		return api.MarkPeerStale200JSONResponse(apiconv.PeerSummary(&p, h.timing())), nil
	}
	p, out, err := h.store.ReportTransferFailure(ctx, registry.TransferFailure{
		DecodeID: req.Id, DecodeAgent: apiconv.Deref(req.Body.AgentName), PrefillID: apiconv.Deref(req.Body.PrefillId),
		Reason: req.Body.Reason, Error: apiconv.Deref(req.Body.Error), Reporter: who.Name(),
	})
	if err != nil {
		return nil, err
	}
	h.metrics.staleMarks.WithLabelValues("transfer_report", string(out)).Inc()
	return api.MarkPeerStale200JSONResponse(apiconv.PeerSummary(&p, h.timing())), nil
}

func (h handlers) ListPairs(ctx context.Context, req api.ListPairsRequestObject) (api.ListPairsResponseObject, error) {
	limit := 10000
	if l := req.Params.Limit; l != nil {
		if *l < 1 || *l > 100000 {
			return nil, malformed("limit", "limit must be between 1 and 100000")
		}
		limit = *l
	}
	for field, v := range map[string]*string{"prefill_class": req.Params.PrefillClass, "decode_class": req.Params.DecodeClass} {
		if v != nil && !isClassID(*v) {
			return nil, malformed(field, field+" must be a geometry class id: hexadecimal digits")
		}
	}
	if pf := req.Params.Prefill; pf != nil && !registry.IsPeerID(*pf) {
		return nil, malformed("prefill", "prefill must be a peer id: a UUID in lowercase canonical form")
	}
	pc, dc := apiconv.Deref(req.Params.PrefillClass), apiconv.Deref(req.Params.DecodeClass)
	var pairs []replica.PairView
	var total int
	switch {
	case req.Params.Prefill != nil && (pc != "" || dc != ""):
		return nil, invalidField("prefill", "prefill cannot be combined with prefill_class and decode_class")
	case req.Params.Prefill != nil:
		pairs, total = h.snaps.Snapshot().PairsOf(*req.Params.Prefill, limit)
	case pc == "" && dc == "":
		pairs, total = h.snaps.Snapshot().Pairs(limit)
	case pc == "":
		return nil, invalidField("prefill_class", "prefill_class is required with decode_class")
	case dc == "":
		return nil, invalidField("decode_class", "decode_class is required with prefill_class")
	default:
		pairs, total = h.snaps.Snapshot().PairsBetween(pc, dc, limit)
	}
	// The pairs come from the snapshot and answer through a store outage;
	// their last exchanges come from the cache (exchanges.go).
	exchanged := h.exchanges.get(ctx)
	out := api.ListPairs200JSONResponse{Pairs: make([]api.Pair, len(pairs)), Total: total}
	for i, p := range pairs {
		ap := api.Pair{
			Prefill:    api.PeerRef{Id: p.Prefill.ID, Name: p.Prefill.Name},
			Decode:     api.PeerRef{Id: p.Decode.ID, Name: p.Decode.Name},
			Compatible: p.Verdict.Compatible, Routable: p.Routable,
		}
		if p.Verdict.Path != "" {
			path := api.PairPath(p.Verdict.Path)
			ap.Path = &path
		}
		if p.Verdict.Compatible {
			verified := p.Verdict.Verified()
			ap.Verified = &verified
			if !p.Verdict.Verified() {
				unverified := p.Verdict.Unverified
				ap.Unverified = &unverified
			}
		}
		reason := p.Verdict.Reason
		if pf := p.Preflight; pf != nil {
			v := apiconv.PairPreflight(pf, pf.Current(p.Prefill, p.Decode))
			ap.Preflight = &v
		}
		if q := p.Quarantined; q != nil {
			ap.Quarantine = &api.PairQuarantine{Detail: q.Detail, At: q.At, ExpiresAt: q.ExpiresAt, Trial: q.Trial}
		}
		switch {
		case p.Quarantined != nil && p.Quarantined.Active():
			reason = "quarantined: " + p.Quarantined.Detail
			ap.Quarantined = apiconv.Opt(true)
		case p.PreflightBlocks && reason == "":
			reason = registry.PreflightReason(*p.Preflight)
		case p.Quarantined != nil && reason == "" && p.Routable:
			reason = "on trial after its quarantine expired: the next transfer decides"
		case reason == "" && !p.Routable:
			reason = fmt.Sprintf("not both ready (prefill %s, decode %s)", p.Prefill.State, p.Decode.State)
		}
		ap.Reason = apiconv.Opt(reason)
		ap.Breaker = h.pairBreaker(p.Prefill.ID, p.Decode.ID)
		if at, ok := exchanged[[2]string{p.Prefill.ID, p.Decode.ID}]; ok {
			ap.LastExchangeAt = &at
		}
		out.Pairs[i] = ap
	}
	return out, nil
}

func (h handlers) LiftQuarantine(ctx context.Context, req api.LiftQuarantineRequestObject) (api.LiftQuarantineResponseObject, error) {
	err := h.store.LiftQuarantine(ctx, req.Prefill, req.Decode, principalFrom(ctx).Name())
	if errors.Is(err, registry.ErrNotQuarantined) {
		return nil, &Problem{Type: ProblemNotFound, Title: "Not found", Status: 404,
			Detail: "the pair " + req.Prefill + " → " + req.Decode + " is not quarantined"}
	}
	if err != nil {
		return nil, err
	}
	return api.LiftQuarantine204Response{}, nil
}

func (h handlers) ListEvents(ctx context.Context, req api.ListEventsRequestObject) (api.ListEventsResponseObject, error) {
	q := registry.EventQuery{Limit: 100, Before: apiconv.Deref(req.Params.Before), PeerID: apiconv.Deref(req.Params.PeerId)}
	if req.Params.PeerId != nil && q.PeerID == "" {
		// The store reads an empty ID as "every peer"; a caller who sent
		// the parameter meant one peer.
		return nil, malformed("peer_id", "peer_id must be a peer id; leave it out for every peer's events")
	}
	if l := req.Params.Limit; l != nil {
		if *l < 1 || *l > 1000 {
			return nil, malformed("limit", "limit must be between 1 and 1000")
		}
		q.Limit = *l
	}
	if err := q.Validate(); err != nil {
		return nil, badParam(err)
	}
	evs, err := h.store.Events(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := api.ListEvents200JSONResponse{Events: make([]api.Event, len(evs))}
	for i := range evs {
		out.Events[i] = apiconv.Event(&evs[i])
	}
	if len(evs) == q.Limit {
		out.NextCursor = &evs[len(evs)-1].ID
	}
	return out, nil
}

// badParam turns a query parameter's *registry.FieldError into a 400 naming
// the parameter, as every other malformed query parameter is answered.
func badParam(err error) error {
	var fe *registry.FieldError
	if errors.As(err, &fe) {
		return malformed(fe.Field, fe.Error())
	}
	return err
}

// PublishProbe records the peer's probe region; auth.go admits only the
// peer's own credential and the admin token.
func (h handlers) PublishProbe(ctx context.Context, req api.PublishProbeRequestObject) (api.PublishProbeResponseObject, error) {
	if req.Body == nil {
		return nil, malformed("body", "a JSON body is required")
	}
	pr, err := apiconv.Probe(req.Id, req.Body)
	if err != nil {
		return nil, err
	}
	// The store validates the probe (a *registry.FieldError is a 422).
	out, err := h.store.PublishProbe(ctx, pr)
	if err != nil {
		return nil, err
	}
	return api.PublishProbe200JSONResponse(apiconv.ProbeOut(&out)), nil
}

// GetProbe returns a peer's probe to the peers that may preflight it (the
// same ones that may read its registration).
func (h handlers) GetProbe(ctx context.Context, req api.GetProbeRequestObject) (api.GetProbeResponseObject, error) {
	if _, err := h.readableRegistration(ctx, req.Id); err != nil {
		return nil, err
	}
	pr, err := h.store.Probe(ctx, req.Id)
	if err != nil {
		return nil, err
	}
	return api.GetProbe200JSONResponse(apiconv.ProbeOut(&pr)), nil
}

// ReportPreflight records a pair's preflight; only the prefill (the side
// that ran it) or the admin token may.
func (h handlers) ReportPreflight(ctx context.Context, req api.ReportPreflightRequestObject) (api.ReportPreflightResponseObject, error) {
	if req.Body == nil {
		return nil, malformed("body", "a JSON body is required")
	}
	if who := principalFrom(ctx); !h.open() && who.kind != admin && who.peerID != req.Prefill {
		return nil, forbidden("a preflight is reported by the prefill that ran it (" + req.Prefill + "), not by " + who.Name())
	}
	pf, err := apiconv.Preflight(req.Prefill, req.Decode, req.Body)
	if err != nil {
		return nil, err
	}
	// The store validates the preflight (a *registry.FieldError is a 422).
	out, err := h.store.ReportPreflight(ctx, pf)
	if err != nil {
		return nil, err
	}
	h.metrics.preflights.WithLabelValues(out.Backend, string(out.State)).Inc()
	return api.ReportPreflight200JSONResponse(apiconv.PairPreflight(&out, true)), nil
}

// isClassID reports whether s has the form of a GeometryClass id, as
// openapi.yaml states it: one or more lowercase hexadecimal digits.
func isClassID(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
