package server

import (
	"io"
	"net/http"
	"strconv"
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
