package server

import (
	"bytes"
	"encoding/json"
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
// There is no WriteTimeout to go with it: that would cut streams. Exported
// so that every server the binary runs (the control plane, the simulator)
// applies the same rule.
func BodyDeadline(timeout time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if timeout <= 0 {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !hasBody(r) {
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

// oneJSONValue refuses anything after the JSON body. The generated decoder
// stops at the end of the first value and would silently ignore the rest
// ("{...} {...}" or "{...}garbage"), so the body is read here (as it
// arrives, never sized from Content-Length, under limitBody's cap), checked
// to be exactly one JSON value, and handed on from memory. A body that is
// not valid JSON is passed on untouched for the decoder to report, so a
// malformed body gets one wording wherever it fails. It runs after the
// token check, so an unauthenticated caller's body is never read.
func (s *Server) oneJSONValue(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasBody(r) {
			next.ServeHTTP(w, r)
			return
		}
		data, err := io.ReadAll(r.Body)
		if err != nil {
			s.requestError(w, r, err)
			return
		}
		if trailingData(data) {
			writeProblem(w, malformed("body", "the body must be exactly one JSON value; there is data after it"))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
		next.ServeHTTP(w, r)
	})
}

// trailingData reports whether data is a valid JSON value followed by
// anything but white space.
func trailingData(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return false
	}
	_, err := dec.Token()
	return !errors.Is(err, io.EOF)
}
