package router

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
)

// readKeep sizes its buffer from the answer's declared length: any length
// an engine may declare, up to 2^63-1, and none, keeps at most keep bytes
// and reads the rest away.
func TestReadKeepAnyDeclaredLength(t *testing.T) {
	for _, tc := range []struct {
		cl   int64
		body string
		keep int64
		want string
	}{
		{cl: math.MaxInt64, body: "{}", keep: 64 << 10, want: "{}"},
		{cl: math.MaxInt64 - 1, body: "{}", keep: 64 << 10, want: "{}"},
		{cl: -1, body: strings.Repeat("x", 3000), keep: 64 << 10, want: strings.Repeat("x", 3000)},
		{cl: 5, body: "hello", keep: 64 << 10, want: "hello"},
		{cl: 5, body: "hello", keep: 3, want: "hel"},
		{cl: 0, body: "", keep: 3, want: ""},
		{cl: -1, body: "hello", keep: 0, want: ""},
	} {
		r := strings.NewReader(tc.body)
		got, err := readKeep(&http.Response{ContentLength: tc.cl, Body: io.NopCloser(r)}, tc.keep)
		if err != nil || string(got) != tc.want {
			t.Errorf("length %d, keep %d: %q, %v; want %q", tc.cl, tc.keep, got, err, tc.want)
		}
		if r.Len() != 0 {
			t.Errorf("length %d, keep %d: %d bytes left unread", tc.cl, tc.keep, r.Len())
		}
	}
}
