package nixl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvLib names the environment variable holding an explicit path to
// libnixl_capi.so; it is tried before the loader's search path.
const EnvLib = "PDPLANE_NIXL_LIB"

// InstallHint says how to get the library.
const InstallHint = "run scripts/install-nixl.sh (it installs the nixl-cu12 wheel into .venv, searched from the working " +
	"directory and the executable's), or `pip install nixl-cu12` elsewhere and set " +
	EnvLib + " to the absolute path of libnixl_capi.so (find it with `find .venv -name 'libnixl_capi.so*'`)"

// LibraryNotFoundError lists every path tried and why each failed.
type LibraryNotFoundError struct {
	Tried  []string // in the order tried
	Errors []string // the loader's message for each path
}

// Error lists the attempts and says how to install NIXL.
func (e *LibraryNotFoundError) Error() string {
	var b strings.Builder
	b.WriteString("libnixl_capi.so not found (tried ")
	for i, p := range e.Tried {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p)
		if i < len(e.Errors) && e.Errors[i] != "" {
			b.WriteString(": ")
			b.WriteString(e.Errors[i])
		}
	}
	b.WriteString("); ")
	b.WriteString(InstallHint)
	return b.String()
}

// MissingSymbolError is a library that loaded but lacks C API functions
// this package needs (a NIXL older than 0.10.1, or not the C API at all).
type MissingSymbolError struct {
	Path    string   // the library loaded
	Symbols []string // the functions it lacks
}

// Error names the library and the missing functions.
func (e *MissingSymbolError) Error() string {
	return fmt.Sprintf("%s lacks %s: it is not a usable NIXL C API (need NIXL >= 0.10.1); %s", e.Path, strings.Join(e.Symbols, ", "), InstallHint)
}

// Library is a loaded libnixl_capi.so with every function this package calls
// bound. It is safe for concurrent use and is never unloaded.
type Library struct {
	path   string
	handle uintptr
	fn     funcs
	// compactConfig: the library uses the newer nixl_capi_agent_config_t
	// layout (uint16 listen_port at 2). See agentConfigBytes.
	compactConfig bool
	// memFree is nixl_capi_mem_free when the library has it (newer
	// releases require it for returned buffers), else libc free.
	memFree uintptr
}

// Path returns the path the library was loaded from, as tried.
func (l *Library) Path() string { return l.path }

var (
	loadOnce sync.Once
	loadLib  *Library
	loadErr  error
)

// Load loads libnixl_capi.so once per process: EnvLib first, then
// libnixl_capi.so.0 and libnixl_capi.so on the loader's path, then the
// nixl-cu12 wheel inside a virtual environment (VenvDirs, VenvLibGlobs:
// where scripts/install-nixl.sh puts it), so that a checkout needs no
// EnvLib after the script. Before the first attempt it sets
// UCX_ERROR_SIGNALS to empty and UCX_HANDLE_ERRORS=none (the Go runtime
// owns SIGSEGV and friends), and, when NIXL_PLUGIN_DIR is unset, points it
// at the folder holding libplugin_UCX.so next to the library. Later calls
// return the first result, error included; a missing library is a
// *LibraryNotFoundError listing every path and pattern tried.
func Load() (*Library, error) {
	loadOnce.Do(func() {
		loadLib, loadErr = open(candidates())
	})
	return loadLib, loadErr
}

// EnvVenv names the venv scripts/install-nixl.sh installs into when set
// (default: .venv at the repository root); Load searches it first.
const EnvVenv = "PDPLANE_VENV"

// VenvLibGlobs are where the nixl-cu12 wheel puts libnixl_capi.so inside a
// virtual environment, relative to the venv: pip's site-packages (any
// Python 3), and the folder scripts/install-nixl.sh unpacks the wheel into
// when no wheel fits the local Python.
var VenvLibGlobs = []string{
	"lib/python3*/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so*",
	"nixl-wheel/.nixl_cu12.mesonpy.libs/libnixl_capi.so*",
}

// VenvDirs returns the virtual environments Load searches, each once, in
// order: $PDPLANE_VENV, $VIRTUAL_ENV (an activated venv), .venv in the
// working directory, then .venv in the executable's directory and in its
// parent (symlinks resolved; ./pdplane or bin/pdplane in a checkout).
func VenvDirs() []string {
	var dirs []string
	add := func(d string) {
		if d == "" {
			return
		}
		if abs, err := filepath.Abs(d); err == nil {
			d = abs
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	add(os.Getenv(EnvVenv))
	add(os.Getenv("VIRTUAL_ENV"))
	if wd, err := os.Getwd(); err == nil {
		add(filepath.Join(wd, ".venv"))
	}
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		add(filepath.Join(filepath.Dir(exe), ".venv"))
		// `make build` puts the binary in bin/ of the checkout.
		add(filepath.Join(filepath.Dir(exe), "..", ".venv"))
	}
	return dirs
}

// candidate is one place to try: a path for dlopen, or a pattern that
// matched no file (miss), kept so that the not-found error names it.
type candidate struct {
	path string
	miss bool
}

func candidates() []candidate {
	var c []candidate
	if p := os.Getenv(EnvLib); p != "" {
		c = append(c, candidate{path: p})
	}
	// Then the loader's search path, versioned name first.
	c = append(c, candidate{path: "libnixl_capi.so.0"}, candidate{path: "libnixl_capi.so"})
	return append(c, venvCandidates(VenvDirs())...)
}

// venvCandidates expands VenvLibGlobs in each venv: every match, in
// sorted order (libnixl_capi.so before libnixl_capi.so.0), or, for a
// pattern matching nothing, the pattern itself as a miss.
func venvCandidates(venvs []string) []candidate {
	var c []candidate
	for _, v := range venvs {
		for _, g := range VenvLibGlobs {
			pat := filepath.Join(v, g)
			m, _ := filepath.Glob(pat) // the only error is a bad pattern
			if len(m) == 0 {
				c = append(c, candidate{path: pat, miss: true})
				continue
			}
			sort.Strings(m)
			for _, p := range m {
				c = append(c, candidate{path: p})
			}
		}
	}
	return c
}

// paths makes candidates of plain paths.
func paths(ps ...string) []candidate {
	c := make([]candidate, len(ps))
	for i, p := range ps {
		c[i] = candidate{path: p}
	}
	return c
}

// open tries each candidate in turn and binds the first that loads.
func open(cands []candidate) (*Library, error) {
	prepareEnv(cands)
	nf := &LibraryNotFoundError{}
	for _, c := range cands {
		if c.miss {
			nf.Tried = append(nf.Tried, c.path)
			nf.Errors = append(nf.Errors, "no such file")
			continue
		}
		h, err := purego.Dlopen(c.path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			nf.Tried = append(nf.Tried, c.path)
			nf.Errors = append(nf.Errors, err.Error())
			continue
		}
		l := &Library{path: c.path, handle: h}
		if err := l.bind(); err != nil {
			return nil, err
		}
		return l, nil
	}
	return nil, nf
}

// prepareEnv sets what UCX and NIXL read at start-up. It must run before the
// library (and with it UCX) is loaded.
func prepareEnv(cands []candidate) {
	// UCX installs handlers for SIGSEGV, SIGBUS and SIGFPE to print
	// backtraces; in a Go process those signals belong to the runtime.
	os.Setenv("UCX_ERROR_SIGNALS", "")
	os.Setenv("UCX_HANDLE_ERRORS", "none")
	if os.Getenv("NIXL_PLUGIN_DIR") != "" {
		return
	}
	for _, c := range cands {
		if c.miss {
			continue
		}
		for _, lib := range resolve(c.path) {
			if dir := PluginDir(filepath.Dir(lib)); dir != "" {
				os.Setenv("NIXL_PLUGIN_DIR", dir)
				return
			}
		}
	}
}

// resolve returns the files a dlopen of p could load: p itself when it has
// a slash, else p in each LD_LIBRARY_PATH folder.
func resolve(p string) []string {
	if strings.Contains(p, "/") {
		return []string{p}
	}
	var out []string
	for _, dir := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if dir == "" {
			continue
		}
		f := filepath.Join(dir, p)
		if _, err := os.Stat(f); err == nil {
			out = append(out, f)
		}
	}
	return out
}

// PluginDir returns the folder holding libplugin_UCX.so for a library in
// libDir, looking where the nixl-cu12 wheel and source installs put it, or
// "" when none does.
func PluginDir(libDir string) string {
	for _, rel := range []string{"plugins", "../nixl_cu12.libs/nixl", "nixl", "../lib/plugins", "."} {
		d := filepath.Clean(filepath.Join(libDir, rel))
		if _, err := os.Stat(filepath.Join(d, "libplugin_UCX.so")); err == nil {
			return d
		}
	}
	return ""
}

// funcs are the bound C API functions.
type funcs struct {
	createConfiguredAgent, destroyAgent                                        uintptr
	getAvailablePlugins, destroyStringList, stringListSize, stringListGet      uintptr
	getPluginParams, destroyMemList, destroyParams                             uintptr
	memListSize, memListGet                                                    uintptr
	paramsAdd, paramsCreateIterator, paramsIteratorNext, paramsDestroyIterator uintptr
	paramsIsEmpty                                                              uintptr
	createBackend, destroyBackend                                              uintptr
	createOptArgs, destroyOptArgs, optArgsAddBackend                           uintptr
	optArgsSetNotifMsg, optArgsSetHasNotif                                     uintptr
	createRegDlist, destroyRegDlist, regDlistAddDesc                           uintptr
	registerMem, deregisterMem                                                 uintptr
	getLocalMD, loadRemoteMD, invalidateRemoteMD, checkRemoteMD                uintptr
	createXferDlist, destroyXferDlist, xferDlistAddDesc                        uintptr
	createXferReq, postXferReq, getXferStatus, releaseXferReq, destroyXferReq  uintptr
	prepXferDlist, releaseXferDlistHandle, makeXferReq                         uintptr
	createNotifMap, destroyNotifMap, getNotifs, notifMapSize                   uintptr
	notifMapGetAgentAt, notifMapGetNotifsSize, notifMapGetNotif                uintptr
	notifMapClear                                                              uintptr
}

// bind resolves every function through dlsym; a missing one is an error,
// never a nil call.
func (l *Library) bind() error {
	f := &l.fn
	table := []struct {
		name string
		dst  *uintptr
	}{
		{"nixl_capi_create_configured_agent", &f.createConfiguredAgent},
		{"nixl_capi_destroy_agent", &f.destroyAgent},
		{"nixl_capi_get_available_plugins", &f.getAvailablePlugins},
		{"nixl_capi_destroy_string_list", &f.destroyStringList},
		{"nixl_capi_string_list_size", &f.stringListSize},
		{"nixl_capi_string_list_get", &f.stringListGet},
		{"nixl_capi_get_plugin_params", &f.getPluginParams},
		{"nixl_capi_destroy_mem_list", &f.destroyMemList},
		{"nixl_capi_destroy_params", &f.destroyParams},
		{"nixl_capi_mem_list_size", &f.memListSize},
		{"nixl_capi_mem_list_get", &f.memListGet},
		{"nixl_capi_params_add", &f.paramsAdd},
		{"nixl_capi_params_is_empty", &f.paramsIsEmpty},
		{"nixl_capi_params_create_iterator", &f.paramsCreateIterator},
		{"nixl_capi_params_iterator_next", &f.paramsIteratorNext},
		{"nixl_capi_params_destroy_iterator", &f.paramsDestroyIterator},
		{"nixl_capi_create_backend", &f.createBackend},
		{"nixl_capi_destroy_backend", &f.destroyBackend},
		{"nixl_capi_create_opt_args", &f.createOptArgs},
		{"nixl_capi_destroy_opt_args", &f.destroyOptArgs},
		{"nixl_capi_opt_args_add_backend", &f.optArgsAddBackend},
		{"nixl_capi_opt_args_set_notif_msg", &f.optArgsSetNotifMsg},
		{"nixl_capi_opt_args_set_has_notif", &f.optArgsSetHasNotif},
		{"nixl_capi_create_reg_dlist", &f.createRegDlist},
		{"nixl_capi_destroy_reg_dlist", &f.destroyRegDlist},
		{"nixl_capi_reg_dlist_add_desc", &f.regDlistAddDesc},
		{"nixl_capi_register_mem", &f.registerMem},
		{"nixl_capi_deregister_mem", &f.deregisterMem},
		{"nixl_capi_get_local_md", &f.getLocalMD},
		{"nixl_capi_load_remote_md", &f.loadRemoteMD},
		{"nixl_capi_invalidate_remote_md", &f.invalidateRemoteMD},
		{"nixl_capi_check_remote_md", &f.checkRemoteMD},
		{"nixl_capi_create_xfer_dlist", &f.createXferDlist},
		{"nixl_capi_destroy_xfer_dlist", &f.destroyXferDlist},
		{"nixl_capi_xfer_dlist_add_desc", &f.xferDlistAddDesc},
		{"nixl_capi_create_xfer_req", &f.createXferReq},
		{"nixl_capi_post_xfer_req", &f.postXferReq},
		{"nixl_capi_get_xfer_status", &f.getXferStatus},
		{"nixl_capi_release_xfer_req", &f.releaseXferReq},
		{"nixl_capi_destroy_xfer_req", &f.destroyXferReq},
		{"nixl_capi_prep_xfer_dlist", &f.prepXferDlist},
		{"nixl_capi_release_xfer_dlist_handle", &f.releaseXferDlistHandle},
		{"nixl_capi_make_xfer_req", &f.makeXferReq},
		{"nixl_capi_create_notif_map", &f.createNotifMap},
		{"nixl_capi_destroy_notif_map", &f.destroyNotifMap},
		{"nixl_capi_get_notifs", &f.getNotifs},
		{"nixl_capi_notif_map_size", &f.notifMapSize},
		{"nixl_capi_notif_map_get_agent_at", &f.notifMapGetAgentAt},
		{"nixl_capi_notif_map_get_notifs_size", &f.notifMapGetNotifsSize},
		{"nixl_capi_notif_map_get_notif", &f.notifMapGetNotif},
		{"nixl_capi_notif_map_clear", &f.notifMapClear},
	}
	var missing []string
	for _, s := range table {
		p, err := purego.Dlsym(l.handle, s.name)
		if err != nil || p == 0 {
			missing = append(missing, s.name)
			continue
		}
		*s.dst = p
	}
	if len(missing) > 0 {
		return &MissingSymbolError{Path: l.path, Symbols: missing}
	}
	// Newer releases free returned buffers with their own function and
	// describe the agent config with a 16-bit listen port; both arrived
	// with nixl_capi_get_version.
	if p, err := purego.Dlsym(l.handle, "nixl_capi_mem_free"); err == nil && p != 0 {
		l.memFree = p
	} else if p, err := purego.Dlsym(l.handle, "free"); err == nil && p != 0 {
		// dlsym on the library's handle searches its dependencies, libc
		// among them.
		l.memFree = p
	} else {
		return &MissingSymbolError{Path: l.path, Symbols: []string{"free"}}
	}
	if p, err := purego.Dlsym(l.handle, "nixl_capi_get_version"); err == nil && p != 0 {
		l.compactConfig = true
	}
	return nil
}

// call calls a C function with integer and pointer arguments and returns
// its int status. Go pointers converted to uintptr in the call's argument
// list stay alive and unmoved until the call returns.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) Status {
	r1, _, _ := purego.SyscallN(fn, args...)
	return Status(int32(uint32(r1)))
}

// free releases a buffer the library returned.
func (l *Library) free(p uintptr) {
	if p != 0 {
		purego.SyscallN(l.memFree, p)
	}
}

// cstr returns s as a NUL-terminated byte slice; pass &b[0] to C.
func cstr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// goString copies the NUL-terminated C string at p.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *(*byte)(cptr(p + uintptr(n))) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(cptr(p)), n))
}

// goBytes copies n bytes of C memory at p.
func goBytes(p uintptr, n uint64) []byte {
	if p == 0 || n == 0 {
		return []byte{}
	}
	return append([]byte{}, unsafe.Slice((*byte)(cptr(p)), int(n))...)
}

// cptr turns an address of C (non-Go) memory into a pointer.
func cptr(p uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), p) }

var errClosed = errors.New("nixl agent closed")
