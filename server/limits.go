package server

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/pdplane/pdplane/server/api"
)

// How large a body each /api/v1 operation takes. openapi.yaml states it:
// each operation with a request body declares x-pdplane-max-body (bytes),
// read here from the embedded spec when the server starts, as auth.go reads
// x-pdplane-access. limitBody enforces it, outermost on /api/v1, so that a
// body over its route's limit is refused from its Content-Length before a
// byte of it is read (and before the token is checked), or, sent chunked,
// as soon as it passes the limit: never buffered whole. The per-field
// limits (maxLength, maxItems, maxProperties) are the registry's
// (registry/validate.go); the body limit is what stops a request before
// they can be checked, and each route's is sized from its fields:
//
//   - registerPeer, 24 MiB: an engine of 8 ranks each at the largest agent
//     metadata (registry.MaxAgentMetadata, 2 MiB of base64) and 4096
//     regions (some 300 KiB of JSON a rank) is about 19 MiB; a DP engine of
//     32 ranks publishing 500 KiB each is about 22 MiB. A real 8-GPU
//     engine sends some MiB at most.
//   - publishProbe, 3 MiB: one agent's metadata (2 MiB of base64) and a few
//     short fields.
//   - markPeerStale, 1 MiB: an error of 65536 characters, each at most 12
//     bytes of JSON (a surrogate pair escaped), is 768 KiB.
//   - heartbeatPeer, 256 KiB: a heal error of 4096 characters and an
//     engine error of 1024, escaped, are 60 KiB.
//   - reportPreflight, 64 KiB: an error of 2048 characters and numbers.
//
// An operation without a body takes at most defaultMaxBody of one (nothing
// reads it). Config.MaxBodyBytes, when lower, caps every route.

// maxBodyExtension is the operation field of openapi.yaml that declares the
// largest body an operation accepts.
const maxBodyExtension = "x-pdplane-max-body"

// defaultMaxBody bounds the body of an operation that declares none.
const defaultMaxBody = 64 << 10

// routeMaxBodyFrom reads each /api/ operation's body limit from spec, as
// "METHOD route-pattern". An /api/ operation that takes a body must declare
// a positive limit; one without a body must not declare any.
func routeMaxBodyFrom(spec *openapi3.T) (map[string]int64, error) {
	table := map[string]int64{}
	var errs []error
	for path, item := range spec.Paths.Map() {
		if !strings.HasPrefix(path, "/api/") {
			continue // the router's routes bound their own bodies
		}
		for method, op := range item.Operations() {
			key := method + " " + path
			v, declared := op.Extensions[maxBodyExtension]
			hasBody := op.RequestBody != nil
			switch {
			case !declared && hasBody:
				errs = append(errs, fmt.Errorf("openapi.yaml: %s takes a body but declares no %s", key, maxBodyExtension))
				continue
			case !declared:
				continue
			case !hasBody:
				errs = append(errs, fmt.Errorf("openapi.yaml: %s declares %s but takes no body", key, maxBodyExtension))
				continue
			}
			n, ok := v.(float64) // a YAML number, as the loader decodes it
			if !ok || n < 1 || n != float64(int64(n)) {
				errs = append(errs, fmt.Errorf("openapi.yaml: %s has %s %v, want a positive whole number of bytes", key, maxBodyExtension, v))
				continue
			}
			table[key] = int64(n)
		}
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, errors.Join(errs...)
	}
	return table, nil
}

// loadRouteMaxBody is the body-limit table of the spec embedded in
// server/api, read once.
var loadRouteMaxBody = sync.OnceValues(func() (map[string]int64, error) {
	spec, err := api.GetSpec()
	if err != nil {
		return nil, fmt.Errorf("the embedded openapi.yaml: %w", err)
	}
	return routeMaxBodyFrom(spec)
})

// maxBodyFor is the largest body r's route accepts.
func (s *Server) maxBodyFor(r *http.Request) int64 {
	limit := int64(defaultMaxBody)
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if n, ok := s.maxBody[r.Method+" "+rc.RoutePattern()]; ok {
			limit = n
		}
	}
	return min(limit, s.cfg.MaxBodyBytes)
}

// limitBody caps request bodies at their route's limit: a declared length
// over it is refused before anything is read, and reading past it fails
// with *http.MaxBytesError; both become a 413 naming the limit, and the
// connection closes after it (net/http would otherwise read up to 256 KiB
// of the refused body away first, waiting for it to come).
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := s.maxBodyFor(r)
		if r.ContentLength > limit {
			w.Header().Set("Connection", "close")
			writeProblem(w, s.toProblem(r, &http.MaxBytesError{Limit: limit}))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		next.ServeHTTP(w, r)
	})
}

// tooLarge is the 413 for a body over limit bytes.
func tooLarge(limit int64) *Problem {
	return &Problem{Type: ProblemTooLarge, Title: "Body too large", Status: http.StatusRequestEntityTooLarge,
		Detail: fmt.Sprintf("the request body exceeds this operation's limit of %d bytes (%s; x-pdplane-max-body in openapi.yaml)", limit, sizeText(limit)),
		Field:  "body"}
}

// sizeText writes n bytes in the largest binary unit that divides it.
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
