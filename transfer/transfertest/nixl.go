package transfertest

import (
	"os"
	"testing"

	"github.com/pdplane/pdplane/transfer/nixl"
)

// EnvRequireNIXL names the variable that turns a missing NIXL library from a
// skip into a failure; CI sets it to 1.
const EnvRequireNIXL = "PDPLANE_REQUIRE_NIXL"

// RequireNIXL loads libnixl_capi.so (see nixl.Load) or stops the test: it
// skips when the library cannot be loaded and PDPLANE_REQUIRE_NIXL is unset,
// and fails when PDPLANE_REQUIRE_NIXL=1.
func RequireNIXL(t testing.TB) *nixl.Library {
	t.Helper()
	lib, err := nixl.Load()
	if err == nil {
		return lib
	}
	if os.Getenv(EnvRequireNIXL) == "1" {
		t.Fatalf("%s=1 but NIXL cannot be loaded: %v", EnvRequireNIXL, err)
	}
	t.Skipf("NIXL not available (set %s=1 to fail instead): %v", EnvRequireNIXL, err)
	return nil
}

// UseLoopbackUCX points UCX, under NIXL, at loopback TCP only (no GPU, no
// other interface), leaving UCX_TLS and UCX_NET_DEVICES alone where they
// are set. A TestMain calls it before any test loads the library.
func UseLoopbackUCX() {
	for k, v := range map[string]string{"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
}
