package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

// Who may call what. openapi.yaml states it: each operation's
// x-pdplane-access names one of the levels below (and its security list
// says the same for tools). This file reads those declarations from the
// spec embedded in server/api when the server starts and enforces them;
// handlers only read the principal the middleware put in the request's
// context. What each caller may do:
//
//   - The admin token may do anything.
//   - A join token admits new peers: it registers a new name (and claims a
//     name whose lease ran out; registry.AuthorizeRegistration decides).
//   - A peer credential (issued by a registration) acts as its own peer:
//     re-register, heartbeat, report itself. It may also report the failed
//     transfers of its own pairs (a prefill about a decode it pairs with,
//     rate-limited per reporter and per victim; checkReport decides) and
//     read the full registrations of its counterparts (the other half of
//     its PD split, same model; checkRegistrationRead), which its transfer
//     agent needs to connect to them.
//   - A bearer token that is none of these is refused (401), even on reads,
//     so that a revoked credential shows at once.
//   - Reads of the summary API are open.
//
// A control plane with neither an admin nor a join token is open: every
// caller may do everything (`pdplane dev` on loopback, or `serve
// --insecure`).
//
// An operation that declares no access is never open: one without a
// declaration in the embedded spec (above all a write: POST, PUT, PATCH,
// DELETE) stops the server from starting (routeAccessFrom), and a route
// missing from the table is refused with 403 on every control plane, open
// or not. TestSpecDeclaresAccess walks openapi.yaml itself.

// access is who may call an operation; accessNames gives each its
// x-pdplane-access value.
type access int

const (
	accessOpen     access = iota // open: reads; the status page needs them
	accessRegister               // register: a join token, the admin token, or a peer credential (the store decides)
	accessSelf                   // self: the peer's own credential or the admin token
	accessReport                 // report: any peer credential or the admin token (stale reports)
	accessPeer                   // peer: a peer credential (checkRegistrationRead narrows it) or the admin token
	accessAdmin                  // admin: operator actions
)

// accessExtension is the operation field of openapi.yaml that declares who
// may call it.
const accessExtension = "x-pdplane-access"

// accessNames are the values accessExtension takes on /api/v1.
var accessNames = map[string]access{
	"open":     accessOpen,
	"register": accessRegister,
	"self":     accessSelf,
	"report":   accessReport,
	"peer":     accessPeer,
	"admin":    accessAdmin,
}

// routeAccessFrom reads who may call each operation of spec, as
// "METHOD route-pattern" (chi's pattern: the spec's path). Every operation
// must declare a known level; a write that declares none is an error, so
// that a new write route cannot be served open by omission.
func routeAccessFrom(spec *openapi3.T) (map[string]access, error) {
	table := map[string]access{}
	var errs []error
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			key := method + " " + path
			v, declared := op.Extensions[accessExtension]
			if !declared {
				what := "operation"
				if writeMethod(method) {
					what = "write"
				}
				errs = append(errs, fmt.Errorf("openapi.yaml: %s %s declares no %s; an unscoped %s is refused", what, key, accessExtension, what))
				continue
			}
			name, _ := v.(string)
			a, ok := accessNames[name]
			if !ok {
				errs = append(errs, fmt.Errorf("openapi.yaml: %s has %s %v, want one of open, register, self, report, peer, admin", key, accessExtension, v))
				continue
			}
			table[key] = a
		}
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, errors.Join(errs...)
	}
	return table, nil
}

// writeMethod reports whether method changes state.
func writeMethod(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// loadRouteAccess is the access table of the spec embedded in server/api,
// read once.
var loadRouteAccess = sync.OnceValues(func() (map[string]access, error) {
	spec, err := api.GetSpec()
	if err != nil {
		return nil, fmt.Errorf("the embedded openapi.yaml: %w", err)
	}
	return routeAccessFrom(spec)
})

// principalKind is what a bearer token proved.
type principalKind int

const (
	anonymous principalKind = iota
	admin
	joiner
	peerCred
)

// principal is the authenticated caller of a request.
type principal struct {
	kind principalKind
	// peerID, peerName, role and model are the credential's peer (kind
	// peerCred).
	peerID, peerName string
	role             registry.Role
	model            string
	// credential is the bearer a peerCred presented.
	credential string
}

// Name is how events and logs name the caller.
func (p principal) Name() string {
	switch p.kind {
	case admin:
		return "admin"
	case joiner:
		return "join-token"
	case peerCred:
		return p.peerName
	}
	return "anonymous"
}

type principalKey struct{}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// open reports whether the control plane runs without tokens.
func (s *Server) open() bool { return s.cfg.AdminToken == "" && len(s.cfg.JoinTokens) == 0 }

func unauthorized(detail string) *Problem {
	return &Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail, Field: "Authorization"}
}

func forbidden(detail string) *Problem {
	return &Problem{Type: ProblemForbidden, Title: "Forbidden", Status: http.StatusForbidden, Detail: detail, Field: "Authorization"}
}

// authenticate finds out who presented the bearer token. A token that is
// none of the configured ones and no valid credential is refused, except
// on an open control plane, where it counts as no token.
func (s *Server) authenticate(r *http.Request) (principal, *Problem) {
	got, ok := bearer(r)
	if !ok {
		return principal{}, nil
	}
	if s.cfg.AdminToken != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.AdminToken)) == 1 {
		return principal{kind: admin}, nil
	}
	for _, t := range s.cfg.JoinTokens {
		if subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 {
			return principal{kind: joiner}, nil
		}
	}
	p, err := s.peerFor(r.Context(), got)
	if errors.Is(err, registry.ErrUnavailable) {
		// Whether the credential is current cannot be told now; a 401
		// would send the agent back to its join token for nothing.
		return principal{}, unavailable()
	}
	if p != nil {
		return principal{kind: peerCred, peerID: p.ID, peerName: p.Name, role: p.Role, model: p.Model, credential: got}, nil
	}
	if s.open() {
		return principal{}, nil
	}
	return principal{}, unauthorized("the bearer token is not accepted: it is no configured token and no current peer credential")
}

// peerFor returns the peer whose current credential is cred. It asks the
// routing snapshot first (no I/O on the heartbeat path) and the store when
// the snapshot has not caught up yet (a peer registered a moment ago on
// another replica, or a credential that was just reissued).
// It returns nil when cred is no current credential, and
// registry.ErrUnavailable when the store had to be asked and could not be.
func (s *Server) peerFor(ctx context.Context, cred string) (*registry.Peer, error) {
	id, ok := registry.CredentialPeerID(cred)
	if !ok {
		return nil, nil
	}
	if p, ok := s.snaps.Snapshot().Peer(id); ok && registry.CredentialMatches(p.CredentialHash, cred) {
		return p, nil
	}
	p, err := s.store.Get(ctx, id)
	switch {
	case errors.Is(err, registry.ErrUnavailable):
		return nil, err
	case err != nil || !registry.CredentialMatches(p.CredentialHash, cred):
		return nil, nil
	}
	return &p, nil
}

// authorize checks the principal against what the route needs. id is the
// route's peer ID, if any.
func (s *Server) authorize(need access, who principal, id string) *Problem {
	if need == accessOpen || s.open() || who.kind == admin {
		return nil
	}
	if who.kind == anonymous {
		return unauthorized("a bearer token is required (Authorization: Bearer <token>)")
	}
	switch need {
	case accessRegister:
		return nil // the store decides which names the token may take
	case accessSelf:
		if who.kind == peerCred && who.peerID == id {
			return nil
		}
		return forbidden("this operation needs the credential of peer " + id + " (or the admin token)")
	case accessReport, accessPeer:
		if who.kind == peerCred {
			return nil
		}
		return forbidden("this operation needs a peer credential (or the admin token); a join token only admits new peers")
	}
	return forbidden("this operation needs the admin token")
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

// routeNeeds returns what r's route needs, and false when openapi.yaml
// declares nothing for it.
func (s *Server) routeNeeds(r *http.Request) (access, bool) {
	pattern := chi.RouteContext(r.Context()).RoutePattern()
	need, ok := s.access[r.Method+" "+pattern]
	if !ok && r.Method == http.MethodHead {
		need, ok = s.access[http.MethodGet+" "+pattern]
	}
	return need, ok
}

// authMiddleware authenticates the caller and enforces the access openapi.yaml
// declares (s.access). It runs inside chi's routing (so the route pattern is
// known) and before the generated wrapper reads the body, so an
// unauthenticated caller gets 401 without its body being parsed. A route
// that declares no access is refused, on an open control plane too.
func (s *Server) authMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		need, declared := s.routeNeeds(r)
		if !declared {
			writeProblem(w, forbidden("openapi.yaml declares no x-pdplane-access for "+r.Method+" "+
				chi.RouteContext(r.Context()).RoutePattern()+"; an unscoped route is refused"))
			return
		}
		who, p := s.authenticate(r)
		if p == nil {
			p = s.authorize(need, who, chi.URLParam(r, "id"))
		}
		if p != nil {
			if p.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="pdplane"`)
			}
			writeProblem(w, p)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, who)))
	})
}

// checkRegistrationRead decides whether who may read target's full
// registration. A peer reads its own, and those of the peers its transfer
// agent may have to connect to: the other half of a PD split serving the
// same model (a prefill WRITEs to decodes, a vLLM decode READs from
// prefills). Nobody else's: a credential leaked from one engine opens only
// what that engine could reach anyway.
func (s *Server) checkRegistrationRead(who principal, target *registry.Peer) *Problem {
	if s.open() || who.kind == admin || (who.kind == peerCred && who.peerID == target.ID) {
		return nil
	}
	counterpart := (who.role.Prefills() && target.Role.Decodes()) || (who.role.Decodes() && target.Role.Prefills())
	if who.kind == peerCred && counterpart && who.model == target.Model {
		return nil
	}
	return forbidden("peer " + who.Name() + " does not transfer KV with peer " + target.Name +
		" (a peer reads the registrations of the other half of its PD split, for the same model)")
}

// checkReport is the one decision of who may file a stale report about
// peer id, and so spend its heal budget. Every report path goes through it
// (POST /api/v1/peers/{id}/stale; the router replicas call the store in
// process and report only pairs they routed). What it accepts:
//
//   - the admin token, anything (an operator; also what a router outside
//     the process would use: there is no router identity);
//   - a peer about itself (a vLLM decode that could not pull KV);
//   - about another peer, only a failed transfer of a pair the reporter is
//     a party to: prefill_id is the reporter's own ID, the reporter
//     prefills, the victim decodes, and the registry's pairing verdict
//     admits the pair (same model, compatible geometry). A compatible pair
//     rather than a routable one: the report lags the failure, and the
//     failure's first report may already have quarantined the pair; a late
//     duplicate changes nothing in the store but is no attack.
//
// Then two rate limits, per reporter and per victim, both taken only for a
// report that passed the checks above, so that a refused report spends
// neither a limit nor the victim's heal budget.
func (s *Server) checkReport(ctx context.Context, who principal, id string, body *api.StaleReport) *Problem {
	if s.open() || who.kind == admin || (who.kind == peerCred && who.peerID == id) {
		return nil
	}
	if body.PrefillId == nil && body.AgentName == nil {
		return forbidden("marking another peer stale outright needs the admin token; a peer reports a failed transfer to it (agent_name, prefill_id)")
	}
	if body.PrefillId == nil || *body.PrefillId != who.peerID {
		p := forbidden("prefill_id must be the reporting peer's own ID (" + who.peerID + "): a peer reports only the failed transfers of its own pairs")
		p.Field = "prefill_id"
		return p
	}
	if p := s.checkReportPair(ctx, who, id); p != nil {
		return p
	}
	if ok, wait := s.reports.allow(who.peerID); !ok {
		return &Problem{Type: ProblemRateLimited, Title: "Too many reports", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("peer %s reports other peers stale too often (at most %g a second, %d at once)",
				who.peerName, s.cfg.StaleReportRate, s.cfg.StaleReportBurst),
			RetryAfter: wait}
	}
	if ok, wait := s.victims.allow(id); !ok {
		return &Problem{Type: ProblemRateLimited, Title: "Too many reports", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("peer %s is reported stale too often (at most %g a second, %d at once, from all reporters)",
				id, s.cfg.StaleVictimRate, s.cfg.StaleVictimBurst),
			RetryAfter: wait}
	}
	return nil
}

// checkReportPair refuses a report from who about victimID unless who
// prefills and the pair (who, victim) is one the registry pairs. It reads
// the routing snapshot, and the store for a peer the snapshot has not
// caught up with yet. A victim that does not exist is left to the store
// (404).
func (s *Server) checkReportPair(ctx context.Context, who principal, victimID string) *Problem {
	snap := s.snaps.Snapshot()
	get := func(id string) (*registry.Peer, error) {
		if p, ok := snap.Peer(id); ok {
			return p, nil
		}
		p, err := s.store.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return &p, nil
	}
	reporter, err := get(who.peerID)
	if err != nil {
		return s.reportLookupProblem(err)
	}
	victim, err := get(victimID)
	if errors.Is(err, registry.ErrNotFound) {
		return nil
	}
	if err != nil {
		return s.reportLookupProblem(err)
	}
	if !reporter.Role.Prefills() || !victim.Role.Decodes() {
		return forbidden("peer " + who.peerName + " (" + string(reporter.Role) + ") is no prefill of a pair with peer " +
			victim.Name + " (" + string(victim.Role) + "): a peer reports only the failed transfers of its own pairs")
	}
	if v := snap.Verdict(reporter, victim); !v.Compatible {
		return forbidden("peer " + who.peerName + " and peer " + victim.Name +
			" are no pair the registry routes (" + v.Reason + "): a peer reports only the failed transfers of its own pairs")
	}
	return nil
}

func (s *Server) reportLookupProblem(err error) *Problem {
	if errors.Is(err, registry.ErrUnavailable) {
		return unavailable()
	}
	return forbidden("the reporting peer is not registered")
}
