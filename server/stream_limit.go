package server

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/go-chi/chi/v5"
)

// Reasons a request is refused before its handler runs: the values of
// pdplane_api_rejected_total's reason label.
const (
	rejectEventStreams = "max_event_streams"
	rejectCrossOrigin  = "cross_origin"
	rejectMediaType    = "media_type"
	rejectHost         = "host"
	rejectShuttingDown = "shutting_down"
)

// ProblemTooManyStreams is the type of the answer to an event stream over
// Config.MaxEventStreams.
const ProblemTooManyStreams = problemBase + "too-many-event-streams"

const eventStreamRoute = "GET /api/v1/events/stream"

// streamSlots counts open event streams against Config.MaxEventStreams.
// Each stream holds a store subscription and a few goroutines for as long
// as the client stays, so without a cap a client could open them until the
// process runs out of memory.
type streamSlots struct{ open atomic.Int64 }

// limitEventStreams refuses an event stream over the cap with 503 and
// Retry-After; other operations pass. It runs inside chi's routing, where
// the route pattern is known.
func (s *Server) limitEventStreams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+chi.RouteContext(r.Context()).RoutePattern() != eventStreamRoute {
			next.ServeHTTP(w, r)
			return
		}
		if s.ShuttingDown() {
			s.metrics.rejected.WithLabelValues(rejectShuttingDown).Inc()
			refuseStreamShuttingDown(w)
			return
		}
		if n := s.streams.open.Add(1); n > int64(s.cfg.MaxEventStreams) {
			s.streams.open.Add(-1)
			s.metrics.rejected.WithLabelValues(rejectEventStreams).Inc()
			w.Header().Set("Retry-After", strconv.Itoa(streamRetryAfterSeconds))
			writeProblem(w, &Problem{Type: ProblemTooManyStreams, Title: "Too many event streams", Status: http.StatusServiceUnavailable,
				Detail: "the server already serves " + strconv.Itoa(s.cfg.MaxEventStreams) + " event streams (--max-event-streams); retry later or poll GET /api/v1/events"})
			return
		}
		s.metrics.eventStreams.Inc()
		defer func() {
			s.streams.open.Add(-1)
			s.metrics.eventStreams.Dec()
		}()
		next.ServeHTTP(w, r)
	})
}

// streamRetryAfterSeconds matches the retry the stream itself announces
// (retry: 1000 ms) rounded up to what Retry-After can say, times five: a
// full server should not be asked again at once by every waiting browser.
const streamRetryAfterSeconds = 5
