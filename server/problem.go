package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// Problem types: stable URIs that clients can switch on.
const (
	problemBase         = "https://pdplane.dev/problems/"
	ProblemInvalidField = problemBase + "invalid-field"
	ProblemMalformed    = problemBase + "malformed-request"
	ProblemTooLarge     = problemBase + "body-too-large"
	ProblemUnauthorized = problemBase + "unauthorized"
	ProblemForbidden    = problemBase + "forbidden"
	ProblemRateLimited  = problemBase + "rate-limited"
	ProblemNotFound     = problemBase + "not-found"
	ProblemConflict     = problemBase + "conflict"
	ProblemInternal     = problemBase + "internal"
	ProblemUnavailable  = problemBase + "unavailable"
)

// Problem is an RFC 9457 problem; handlers return it as an error and the
// strict server's error handler writes it, as the generated api.Problem.
type Problem struct {
	Type   string
	Title  string
	Status int
	Detail string
	// Field is the JSON path of the offending request field; empty for
	// none.
	Field string
	// RetryAfter, when positive, is sent as the Retry-After header (in
	// whole seconds): the request may succeed if repeated then.
	RetryAfter time.Duration
}

func (p *Problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail) }

func invalidField(field, detail string) *Problem {
	return &Problem{Type: ProblemInvalidField, Title: "Invalid field", Status: http.StatusUnprocessableEntity, Detail: detail, Field: field}
}

func malformed(field, detail string) *Problem {
	return &Problem{Type: ProblemMalformed, Title: "Malformed request", Status: http.StatusBadRequest, Detail: detail, Field: field}
}

func conflict(field, detail string) *Problem {
	return &Problem{Type: ProblemConflict, Title: "Conflict", Status: http.StatusConflict, Detail: detail, Field: field}
}

// writeProblem writes p as application/problem+json.
func writeProblem(w http.ResponseWriter, p *Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(api.Problem{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail, Field: apiconv.Opt(p.Field)})
}

// storeRetryAfter is what a 503 for an unreachable store suggests: a
// PostgreSQL restart or failover usually takes seconds, and agents retry
// with their own backoff anyway.
const storeRetryAfter = time.Second

func unavailable() *Problem {
	return &Problem{Type: ProblemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the registry store cannot be reached; retry later or on another replica", RetryAfter: storeRetryAfter}
}

// toProblem classifies an error at the HTTP edge. Anything unexpected is a
// 500 whose detail says nothing about the cause; the cause goes to the log.
func (s *Server) toProblem(r *http.Request, err error) *Problem {
	var p *Problem
	var fe *registry.FieldError
	var big *http.MaxBytesError
	var ff *registry.ForbiddenFieldError
	var taken *registry.AgentNameTakenError
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &fe):
		return invalidField(fe.Field, fe.Error())
	case errors.As(err, &ff):
		p := forbidden(ff.Error())
		p.Field = ff.Field
		return p
	case errors.As(err, &taken):
		return conflict(taken.Field, taken.Error())
	case errors.As(err, &big):
		return tooLarge(big.Limit)
	case errors.Is(err, registry.ErrForbidden):
		return forbidden(err.Error())
	case errors.Is(err, registry.ErrNotFound):
		return &Problem{Type: ProblemNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: "no such peer"}
	case errors.Is(err, registry.ErrUnavailable):
		// Nothing was changed that the caller can rely on; an agent retries
		// or fails over to another replica. The cause is logged, not echoed,
		// at debug level: during an outage every heartbeat of the fleet
		// lands here, and the sweeper and the listener report the outage.
		s.requestLog(r).Debug().Err(err).Msg("registry store unavailable (503)")
		return unavailable()
	case errors.Is(err, registry.ErrConflict):
		return conflict("", "the request conflicts with a stored peer")
	}
	s.requestLog(r).Error().Err(err).Msg("request failed")
	return &Problem{Type: ProblemInternal, Title: "Internal error", Status: http.StatusInternalServerError,
		Detail: "the server could not complete the request; see its log"}
}
