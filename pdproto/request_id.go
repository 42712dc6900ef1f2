package pdproto

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
)

// RequestIDHeader carries a request's ID: from the client when it sends a
// valid one, back to the client in the answer, and to both legs upstream
// (vLLM needs the same ID on the prefill and the decode).
//
// Both legs and the client see it: the router sets it on the engines'
// requests, and the control plane's middleware reads it from every request.
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds a client's request ID.
const maxRequestIDLen = 128

// ValidRequestID reports whether a client's request ID may be kept: short
// (1 to 128 bytes) and printable ASCII without spaces, so it cannot split a
// header or a log line.
func ValidRequestID(s string) bool {
	if s == "" || len(s) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// NewRequestID mints a request ID: 32 hex digits.
func NewRequestID() string {
	var b [16]byte
	for i := 0; i < len(b); i += 8 {
		u := rand.Uint64()
		for k := range 8 {
			b[i+k] = byte(u >> (8 * k))
		}
	}
	return hex.EncodeToString(b[:])
}

// AcceptRequestID returns the client's ID when it is valid and a new one
// otherwise.
func AcceptRequestID(client string) string {
	if ValidRequestID(client) {
		return client
	}
	return NewRequestID()
}

type requestIDKey struct{}

// ContextWithRequestID returns ctx carrying the request's ID.
func ContextWithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestIDFromContext returns the ID ContextWithRequestID stored, if any.
func RequestIDFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(requestIDKey{}).(string)
	return id, ok && id != ""
}
