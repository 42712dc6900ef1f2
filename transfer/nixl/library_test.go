package nixl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestLibraryNotFoundListsEveryPath(t *testing.T) {
	t.Parallel()
	tried := []string{filepath.Join(t.TempDir(), "libnixl_capi.so"), "libnixl_capi_does_not_exist.so.0"}
	_, err := open(paths(tried...))
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
	venv := filepath.Join(t.TempDir(), "venv")
	t.Setenv(EnvLib, "/opt/nixl/libnixl_capi.so")
	t.Setenv(EnvVenv, venv)
	t.Setenv("VIRTUAL_ENV", "")
	var got []string
	for _, c := range candidates() {
		got = append(got, c.path)
	}
	want := []string{
		"/opt/nixl/libnixl_capi.so", "libnixl_capi.so.0", "libnixl_capi.so",
		filepath.Join(venv, VenvLibGlobs[0]), filepath.Join(venv, VenvLibGlobs[1]),
	}
	if len(got) < len(want) || strings.Join(got[:len(want)], ",") != strings.Join(want, ",") {
		t.Fatalf("candidates %v, want them to start with %v", got, want)
	}
}

// mkfile creates an empty file and its folders.
func mkfile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVenvCandidatesFindTheWheelLayouts: pip's site-packages layout (any
// Python 3, every libnixl_capi.so* in sorted order) and the unpacked-wheel
// layout of scripts/install-nixl.sh are found; a pattern that matches
// nothing stays in the list as a miss, so the error names it.
func TestVenvCandidatesFindTheWheelLayouts(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	pip := filepath.Join(root, "pip", ".venv")
	unpacked := filepath.Join(root, "unpacked", ".venv")
	empty := filepath.Join(root, "empty", ".venv")
	libs := filepath.Join(pip, "lib", "python3.12", "site-packages", ".nixl_cu12.mesonpy.libs")
	mkfile(t, filepath.Join(libs, "libnixl_capi.so.0"))
	mkfile(t, filepath.Join(libs, "libnixl_capi.so"))
	mkfile(t, filepath.Join(libs, "libnixl.so")) // not a candidate
	wheel := filepath.Join(unpacked, "nixl-wheel", ".nixl_cu12.mesonpy.libs", "libnixl_capi.so")
	mkfile(t, wheel)

	got := venvCandidates([]string{pip, empty, unpacked})
	want := []candidate{
		{path: filepath.Join(libs, "libnixl_capi.so")},
		{path: filepath.Join(libs, "libnixl_capi.so.0")},
		{path: filepath.Join(pip, VenvLibGlobs[1]), miss: true},
		{path: filepath.Join(empty, VenvLibGlobs[0]), miss: true},
		{path: filepath.Join(empty, VenvLibGlobs[1]), miss: true},
		{path: filepath.Join(unpacked, VenvLibGlobs[0]), miss: true},
		{path: wheel},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("candidates\n got %v\nwant %v", got, want)
	}

	// None of them loads (empty files): the error lists every one, misses
	// included, in order.
	_, err := open(got)
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("got %v, want *LibraryNotFoundError", err)
	}
	if len(nf.Tried) != len(want) {
		t.Fatalf("tried %v, want all %d", nf.Tried, len(want))
	}
	for i, c := range want {
		if nf.Tried[i] != c.path {
			t.Errorf("tried[%d] = %q, want %q", i, nf.Tried[i], c.path)
		}
		if !strings.Contains(err.Error(), c.path) {
			t.Errorf("error does not name %s", c.path)
		}
	}
	if nf.Errors[2] != "no such file" || nf.Errors[0] == "no such file" {
		t.Errorf("errors %q: a miss says no such file, a failed dlopen says why", nf.Errors)
	}
}

// TestVenvDirsOrder: $PDPLANE_VENV, $VIRTUAL_ENV, then .venv in the working
// directory, beside the executable and in its parent, each once.
func TestVenvDirsOrder(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	wd, _ = os.Getwd() // the temp dir may sit behind a symlink
	t.Setenv(EnvVenv, "/opt/pdplane-venv")
	t.Setenv("VIRTUAL_ENV", filepath.Join(wd, ".venv")) // the same as the working directory's: once
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	want := []string{"/opt/pdplane-venv", filepath.Join(wd, ".venv"),
		filepath.Join(filepath.Dir(exe), ".venv"), filepath.Join(filepath.Dir(filepath.Dir(exe)), ".venv")}
	if got := VenvDirs(); !slices.Equal(got, want) {
		t.Fatalf("VenvDirs %v, want %v", got, want)
	}
}

// The test binary re-runs itself with this set to load NIXL the way a
// fresh pdplane process does: see TestLoadFindsTheRepoVenv.
const envLoadHelper = "PDPLANE_TEST_NIXL_LOAD_HELPER"

// repoVenvLib returns the repository root and the libnixl_capi.so files in
// its .venv. With none it skips, unless CI=true or PDPLANE_REQUIRE_NIXL=1
// (as under scripts/test.sh, which installs it), where it fails.
func repoVenvLib(t *testing.T) (root string, found []string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not at %s: %v", root, err)
	}
	for _, c := range venvCandidates([]string{filepath.Join(root, ".venv")}) {
		if !c.miss {
			found = append(found, c.path)
		}
	}
	if len(found) == 0 {
		msg := "no NIXL in " + filepath.Join(root, ".venv") + ": run scripts/install-nixl.sh"
		if os.Getenv("CI") == "true" || os.Getenv("PDPLANE_REQUIRE_NIXL") == "1" {
			t.Fatal(msg + " (required under CI=true or PDPLANE_REQUIRE_NIXL=1)")
		}
		t.Skip(msg)
	}
	return root, found
}

// runChild re-runs this test binary in dir with the tests matching run,
// none of the variables that point at NIXL set (PDPLANE_NIXL_LIB,
// NIXL_PLUGIN_DIR, PDPLANE_VENV, VIRTUAL_ENV, LD_LIBRARY_PATH) but those in
// env, and returns its output; it fails the test if the child fails.
func runChild(t *testing.T, dir, run string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case EnvLib, "NIXL_PLUGIN_DIR", EnvVenv, "VIRTUAL_ENV", "LD_LIBRARY_PATH":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "UCX_TLS=tcp", "UCX_NET_DEVICES=lo")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s in %s: %v\n%s", run, dir, err, out)
	}
	return string(out)
}

// TestLoadFindsTheRepoVenv: in a checkout where scripts/install-nixl.sh has
// run, Load finds the library in .venv with none of PDPLANE_NIXL_LIB,
// NIXL_PLUGIN_DIR, PDPLANE_VENV, VIRTUAL_ENV or LD_LIBRARY_PATH set, from
// the repository root, and the agent it makes has the UCX plugin. It runs
// in a child process, since Load happens once per process.
func TestLoadFindsTheRepoVenv(t *testing.T) {
	root, found := repoVenvLib(t)
	out := runChild(t, root, "^TestLoadHelper$", envLoadHelper+"=1")
	if want := "loaded " + found[0] + "\n"; !strings.Contains(out, want) {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
}

// TestRuntimeLibsSuffice: what scripts/nixl-runtime-libs.sh copies out of
// the wheel (the agent image's /opt/nixl) is enough to load NIXL, find the
// UCX plugin without NIXL_PLUGIN_DIR, and move bytes over UCX TCP: the
// low-level and backend suites run in a child on the copy alone.
func TestRuntimeLibsSuffice(t *testing.T) {
	root, found := repoVenvLib(t)
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("no ldd")
	}
	site := filepath.Dir(filepath.Dir(found[0]))
	dest := t.TempDir()
	script := exec.Command("bash", filepath.Join(root, "scripts", "nixl-runtime-libs.sh"), site, dest)
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("nixl-runtime-libs.sh: %v\n%s", err, out)
	} else {
		t.Logf("%s", out)
	}
	lib := filepath.Join(dest, ".nixl_cu12.mesonpy.libs", "libnixl_capi.so")
	out := runChild(t, dest, "^(TestLoadHelper|TestAgentLowLevel|TestBackendContract)$",
		envLoadHelper+"=1", EnvLib+"="+lib, "PDPLANE_REQUIRE_NIXL=1")
	if want := "loaded " + lib + "\n"; !strings.Contains(out, want) {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
	for _, want := range []string{"--- PASS: TestAgentLowLevel", "--- PASS: TestBackendContract"} {
		if !strings.Contains(out, want) || strings.Contains(out, "--- SKIP") {
			t.Fatalf("child output lacks %q or skipped a test:\n%s", want, out)
		}
	}
}

// TestLoadHelper is the child of TestLoadFindsTheRepoVenv.
func TestLoadHelper(t *testing.T) {
	if os.Getenv(envLoadHelper) != "1" {
		t.Skip("run by TestLoadFindsTheRepoVenv")
	}
	lib, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("NIXL_PLUGIN_DIR")
	if dir == "" {
		t.Fatal("NIXL_PLUGIN_DIR was not set from the library's folder")
	}
	a, err := lib.NewAgent("venv-load-helper", AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	plugins, err := a.Plugins()
	if err != nil || !slices.Contains(plugins, "UCX") {
		t.Fatalf("plugins %v from %s: %v", plugins, dir, err)
	}
	fmt.Printf("loaded %s\n", lib.Path())
}

// TestMissingSymbolIsAnError: a library that loads but is not the C API
// (libc here) is refused with the missing functions named, not a crash on
// a nil call later.
func TestMissingSymbolIsAnError(t *testing.T) {
	t.Parallel()
	_, err := open(paths("libc.so.6"))
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
