package nixl

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestLibraryNotFoundListsEveryPath(t *testing.T) {
	t.Parallel()
	tried := []string{filepath.Join(t.TempDir(), "libnixl_capi.so"), "libnixl_capi_does_not_exist.so.0"}
	_, err := open(tried)
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("got %v, want *LibraryNotFoundError", err)
	}
	if len(nf.Tried) != 2 || nf.Tried[0] != tried[0] || nf.Tried[1] != tried[1] {
		t.Fatalf("tried %v", nf.Tried)
	}
	msg := err.Error()
	for _, want := range append(tried, "pip install nixl-cu12", EnvLib) {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
}

func TestCandidatesOrder(t *testing.T) {
	t.Setenv(EnvLib, "/opt/nixl/libnixl_capi.so")
	got := candidates()
	want := []string{"/opt/nixl/libnixl_capi.so", "libnixl_capi.so.0", "libnixl_capi.so"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("candidates %v, want %v", got, want)
	}
}

// TestMissingSymbolIsAnError: a library that loads but is not the C API
// (libc here) is refused with the missing functions named, not a crash on
// a nil call later.
func TestMissingSymbolIsAnError(t *testing.T) {
	t.Parallel()
	_, err := open([]string{"libc.so.6"})
	var ms *MissingSymbolError
	if !errors.As(err, &ms) {
		t.Fatalf("got %v, want *MissingSymbolError", err)
	}
	if len(ms.Symbols) == 0 || ms.Symbols[0] != "nixl_capi_create_configured_agent" {
		t.Fatalf("missing %v", ms.Symbols)
	}
}

func TestPluginDirFindsTheWheelLayout(t *testing.T) {
	t.Parallel()
	site := t.TempDir()
	lib := filepath.Join(site, ".nixl_cu12.mesonpy.libs")
	alt := filepath.Join(site, "nixl_cu12.libs", "nixl")
	for _, d := range []string{lib, alt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := PluginDir(lib); got != "" {
		t.Fatalf("no plugin yet, got %q", got)
	}
	if err := os.WriteFile(filepath.Join(alt, "libplugin_UCX.so"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := PluginDir(lib); got != alt {
		t.Fatalf("got %q, want %q", got, alt)
	}
	if err := os.MkdirAll(filepath.Join(lib, "plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "plugins", "libplugin_UCX.so"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := PluginDir(lib); got != filepath.Join(lib, "plugins") {
		t.Fatalf("got %q, want the plugins folder next to the library", got)
	}
}

// TestAgentConfigLayout pins nixl_capi_agent_config_t as NIXL 1.5.x reads
// it (bool@0, bool@1, int@4, enum@8, uint@12, u64@16, u64@24, bool@32; 40
// bytes) and as newer releases read it (uint16 port@2, enum@4, uint@8).
func TestAgentConfigLayout(t *testing.T) {
	t.Parallel()
	b := agentConfigBytes(AgentConfig{ProgressDelay: 7 * time.Microsecond}, threadSyncStrict, false)
	if unsafe.Sizeof(b) != 40 {
		t.Fatalf("size %d", unsafe.Sizeof(b))
	}
	le := binary.LittleEndian
	if b[0] != 1 || b[1] != 0 {
		t.Fatalf("threads %v", b[:2])
	}
	if got := le.Uint32(b[8:]); got != threadSyncStrict {
		t.Fatalf("thread_sync@8 = %d, want STRICT", got)
	}
	if le.Uint64(b[16:]) != 7 || le.Uint64(b[24:]) != 100000 || b[32] != 0 {
		t.Fatalf("delays/telemetry %v", b[16:])
	}
	// Read with the newer layout, the same bytes still mean STRICT.
	if le.Uint16(b[2:]) != 0 || le.Uint32(b[4:]) != threadSyncStrict {
		t.Fatalf("newer layout reads port %d sync %d", le.Uint16(b[2:]), le.Uint32(b[4:]))
	}
	c := agentConfigBytes(AgentConfig{NoProgressThread: true}, threadSyncStrict, true)
	if c[0] != 0 || le.Uint32(c[4:]) != threadSyncStrict || le.Uint32(c[8:]) != 1 {
		t.Fatalf("compact layout %v", c[:16])
	}
}

func TestStatusError(t *testing.T) {
	t.Parallel()
	cases := []struct {
		st   Status
		want error
	}{
		{StatusInvalidParam, ErrInvalidParam},
		{StatusBackend, ErrBackend},
		{StatusInvalidState, ErrInvalidState},
		{StatusException, ErrException},
		{StatusNotFound, ErrNotFound},
		{Status(-99), ErrUnexpectedStatus},
	}
	for _, tc := range cases {
		err := check("nixl_capi_x", tc.st)
		var se *StatusError
		if !errors.As(err, &se) || se.Status != tc.st || !errors.Is(err, tc.want) {
			t.Errorf("status %d: %v", tc.st, err)
		}
		if !strings.HasPrefix(err.Error(), "nixl_capi_x: ") {
			t.Errorf("message %q", err.Error())
		}
	}
	if check("f", StatusSuccess) != nil || check("f", StatusInProgress) != nil {
		t.Fatal("success or in-progress reported as an error")
	}
}
