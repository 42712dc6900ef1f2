package server

import (
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// access is who may call an operation.
type access int

const (
	accessOpen  access = iota // reads: the status page needs them
	accessPeer                // what agents call
	accessAdmin               // operator actions
)

// routeAccess maps "METHOD route-pattern" to who may call it; anything not
// listed is open.
var routeAccess = map[string]access{
	"POST /api/v1/peers":                accessPeer,
	"POST /api/v1/peers/{id}/heartbeat": accessPeer,
	"POST /api/v1/peers/{id}/stale":     accessPeer, // agents report stale peers; operators mark them
	"DELETE /api/v1/peers/{id}":         accessAdmin,
	"POST /api/v1/peers/{id}/drain":     accessAdmin,
}

// authorize checks the bearer token for an operation. The admin token is
// accepted wherever a peer token is. With no admin token configured, the
// peer token guards admin operations too, so one token never leaves
// deletion open while guarding registration.
func (s *Server) authorize(need access, r *http.Request) *Problem {
	if need == accessOpen {
		return nil
	}
	var accepted []string
	if s.cfg.AdminToken != "" {
		accepted = append(accepted, s.cfg.AdminToken)
	}
	if s.cfg.PeerToken != "" && (need == accessPeer || s.cfg.AdminToken == "") {
		accepted = append(accepted, s.cfg.PeerToken)
	}
	if s.cfg.AdminToken == "" && s.cfg.PeerToken == "" {
		return nil
	}
	got, ok := bearer(r)
	if !ok {
		return &Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
			Detail: "a bearer token is required (Authorization: Bearer <token>)", Field: "Authorization"}
	}
	for _, t := range accepted {
		if subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 {
			return nil
		}
	}
	detail := "the bearer token is not accepted for this operation"
	if need == accessAdmin {
		detail = "this operation needs the admin token"
	}
	return &Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail, Field: "Authorization"}
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

// authMiddleware enforces tokens. It runs inside chi's routing (so the route
// pattern is known) and before the generated wrapper reads the body, so an
// unauthenticated caller gets 401 without its body being parsed.
func (s *Server) authMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Method + " " + chi.RouteContext(r.Context()).RoutePattern()
		if p := s.authorize(routeAccess[key], r); p != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pdplane"`)
			writeProblem(w, p)
			return
		}
		next.ServeHTTP(w, r)
	})
}
