package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/rs/zerolog"
)

// Shutdown is in two steps. BeginShutdown, at the signal, makes /readyz
// answer 503 (load balancers stop sending), ends every event stream with
// a last comment (a status page would otherwise hold its connection open
// for as long as it stays, and the HTTP server's drain would wait for it)
// and refuses new ones. The requests in flight, streamed completions
// among them, go on; the caller then drains the HTTP server (serve's
// --shutdown-grace).

// shutdownRetryAfterSeconds is the Retry-After of an event stream refused
// while the server shuts down: about the time a replacement takes to come
// up.
const shutdownRetryAfterSeconds = 5

// BeginShutdown marks the server as shutting down: /readyz answers 503,
// open event streams end, new ones are refused. It is idempotent and
// never blocks; what else is in flight is left to finish.
func (s *Server) BeginShutdown() {
	s.shutdownOnce.Do(func() { close(s.shuttingDown) })
}

// ShuttingDown reports whether BeginShutdown was called.
func (s *Server) ShuttingDown() bool {
	select {
	case <-s.shuttingDown:
		return true
	default:
		return false
	}
}

// streamShutdownComment is the last thing an event stream sends when the
// server shuts down; EOF follows. EventSource ignores comments, then sees
// the end and reconnects (the status page with its own backoff).
const streamShutdownComment = ": pdplane is shutting down\n\n"

func writeShutdownComment(w io.Writer) error {
	_, err := io.WriteString(w, streamShutdownComment)
	return err
}

// refuseStreamShuttingDown answers an event stream asked for while the
// server shuts down.
func refuseStreamShuttingDown(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(shutdownRetryAfterSeconds))
	w.Header().Set("Connection", "close")
	writeProblem(w, &Problem{Type: ProblemUnavailable, Title: "Shutting down", Status: http.StatusServiceUnavailable,
		Detail: "this server is shutting down; retry on another replica, or here once it is back"})
}

// Shutdown is a serving replica's graceful stop, the second step after
// the signal: Run makes /readyz 503 and ends the event streams
// (BeginShutdown), closes idle connections and answers the rest with
// Connection: close, waits for the requests in flight (those on
// connections the router took over from net/http included) until the
// drain context ends, then cuts what is left: the HTTP server closes its
// connections, the front and the router theirs, and every request cut ends
// as a client leaving ends it. The store and the background work are the
// caller's to stop after it.
type Shutdown struct {
	Server   *Server
	HTTP     *http.Server
	InFlight *httpwire.InFlight // counts HTTP's handler
	// Conns is the listener HTTP serves, when it keeps connections of its
	// own (httpwire.Listener: its front, and connections taken over); nil
	// when none.
	Conns interface {
		DisableKeepAlives()
		CloseFront()
	}
	// Detached is the router, whose slow streams run on connections taken
	// over from net/http; nil when none.
	Detached interface {
		Detached() int
		WaitDetached(ctx context.Context) bool
		CloseDetached()
	}
	Log zerolog.Logger
}

// cutWait bounds how long Run waits, after the cut, for the handlers of
// the requests it cut to see their closed connections and return.
const cutWait = 5 * time.Second

// Run stops gracefully within drain and returns how many requests it had
// to cut.
func (s *Shutdown) Run(drain context.Context) (cut int64) {
	start := time.Now()
	s.Server.BeginShutdown()
	s.HTTP.SetKeepAlivesEnabled(false) // each answer closes its connection; idle ones close now
	if s.Conns != nil {
		s.Conns.DisableKeepAlives() // the same for the front's and taken-over connections
	}
	s.Log.Info().Int64("in_flight", s.busy()).Msg("shutting down: /readyz is 503 and event streams are closed; waiting for the requests in flight")
	s.waitIdle(drain)
	// Closes the listener, then waits for a request that came in since
	// (and for a stream it started that the router took over).
	err := s.HTTP.Shutdown(drain)
	if err == nil {
		s.waitIdle(drain)
	}
	if cut = s.busy(); cut > 0 || (err != nil && !errors.Is(err, http.ErrServerClosed)) {
		_ = s.HTTP.Close()
		if s.Conns != nil {
			s.Conns.CloseFront()
		}
		if s.Detached != nil {
			s.Detached.CloseDetached()
		}
		s.Log.Warn().Int64("requests_cut", cut).Str("reason", context.Cause(drain).Error()).
			Msgf("shutdown: cut %d request(s) still in flight", cut)
		// Their handlers see the closed connections and return.
		ctx, cancel := context.WithTimeout(context.Background(), cutWait)
		s.waitIdle(ctx)
		cancel()
	}
	s.Log.Info().Dur("took", time.Since(start)).Msg("requests drained")
	return cut
}

// busy is the number of requests in flight: in the HTTP handler, or
// streaming on a connection the router took over.
func (s *Shutdown) busy() int64 {
	n := s.InFlight.Count()
	if s.Detached != nil {
		n += int64(s.Detached.Detached())
	}
	return n
}

// waitIdle waits until no request is in flight anywhere, or ctx ends. A
// request that moves from the handler to a taken-over connection is seen
// by one count or the other, so it looks again until both are 0 at once.
func (s *Shutdown) waitIdle(ctx context.Context) {
	for s.busy() > 0 && ctx.Err() == nil {
		if !s.InFlight.Wait(ctx) {
			return
		}
		if s.Detached != nil && !s.Detached.WaitDetached(ctx) {
			return
		}
	}
}
