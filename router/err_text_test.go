package router

import (
	"bytes"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

// TestErrTextIsAlwaysReportable pins that what the router quotes of an
// engine's error answer is accepted by the registry whatever the bytes: a
// refused report would leave a broken decode in routing.
func TestErrTextIsAlwaysReportable(t *testing.T) {
	t.Parallel()
	long := append(bytes.Repeat([]byte("x"), errTextLimit-1), "名"...) // the cut splits the character
	for _, body := range [][]byte{
		[]byte(`{"error": "Missing NIXL destination KV memory kind"}`),
		[]byte("Missing NIXL destination KV memory kind\x00\xff\xfe"),
		long,
	} {
		got := errText(body)
		if err := registry.ValidateStaleMark("transfer failed", got); err != nil {
			t.Errorf("errText(%.40q) = %.40q, which the registry refuses: %v", body, got, err)
		}
		if len(got) > errTextLimit+len("\uFFFD") {
			t.Errorf("errText kept %d bytes, want at most about %d", len(got), errTextLimit)
		}
	}
}
