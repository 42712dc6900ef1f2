package httpwire

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// BodyDeadline bounds how long a client may take to send its request body.
// A client that trickles its body is cut off at the deadline: the read
// fails, the handler answers 408 (to nobody, usually), and net/http closes
// the connection since the body was not read to its end. The deadline is
// set per request, only when there is a body, and cleared at the body's
// end, so that nothing after it (a response stream, net/http's background
// read that notices a client leaving, the keep-alive wait) runs under it.
// There is no WriteTimeout to go with it: that would cut streams. Every
// server the binary runs (the control plane, the simulator) applies it.
func BodyDeadline(timeout time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if timeout <= 0 {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !HasBody(r) {
				next.ServeHTTP(w, r)
				return
			}
			b := &deadlineBody{ReadCloser: r.Body, rc: *http.NewResponseController(w)}
			if err := b.rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
				// A writer without deadlines (a test recorder): nothing to bound.
				next.ServeHTTP(w, r)
				return
			}
			r.Body = b
			next.ServeHTTP(w, r)
		})
	}
}

// deadlineBody clears the read deadline at the end of the body, so that the
// connection's idle wait and net/http's background read after the body are
// not bounded by it.
type deadlineBody struct {
	io.ReadCloser
	rc   http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// HasBody reports whether the client declared a body: a positive
// Content-Length, or one of unknown length (chunked).
func HasBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}
