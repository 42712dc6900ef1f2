package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/pdplane/pdplane/httpwire"
)

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
		if !httpwire.HasBody(r) {
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
