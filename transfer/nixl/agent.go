package nixl

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// Thread synchronisation modes of an agent (nixl_capi_thread_sync_t).
const (
	threadSyncNone   = 0
	threadSyncStrict = 1
)

// AgentConfig configures an agent.
type AgentConfig struct {
	// NoProgressThread turns off NIXL's progress thread; transfers then
	// progress only while their status is polled.
	NoProgressThread bool
	// ProgressDelay is the progress thread's delay between polls (0: busy).
	ProgressDelay time.Duration
}

// agentConfigBytes lays out nixl_capi_agent_config_t, 40 bytes on x86-64.
// NIXL 1.5.x (checked against its nixl_capi_create_configured_agent) reads
//
//	bool enable_prog_thread @0, bool enable_listen_thread @1,
//	int listen_port @4, enum thread_sync @8, unsigned num_workers @12,
//	uint64 pthr_delay_us @16, uint64 lthr_delay_us @24, bool capture_telemetry @32;
//
// newer releases narrowed listen_port to uint16 @2, moving thread_sync to
// @4 and num_workers to @8. pdplane never starts the listen thread (the
// control plane carries metadata), so the port is unused and both layouts
// can be served at once: thread_sync is written at @4 and @8, which the old
// layout reads as (listen port, thread sync) and the new one as (thread
// sync, one worker). Libraries known to be new get the exact new layout.
func agentConfigBytes(cfg AgentConfig, sync uint32, compact bool) [40]byte {
	var b [40]byte
	if !cfg.NoProgressThread {
		b[0] = 1
	}
	put32 := func(off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
	put64 := func(off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }
	if compact {
		put32(4, sync)
		put32(8, 1)
	} else {
		put32(4, sync) // listen_port: unused without the listen thread
		put32(8, sync)
		put32(12, 1)
	}
	put64(16, uint64(cfg.ProgressDelay/time.Microsecond))
	put64(24, 100000) // the listen thread's delay, as NIXL's Python API sets it
	return b
}

// Agent is a NIXL agent. Every method is safe for concurrent use (the agent
// runs with thread sync STRICT, because goroutines move between threads);
// after Close every method fails.
type Agent struct {
	lib  *Library
	name string

	mu     sync.RWMutex // write-held only by Close
	h      uintptr
	closed bool

	notifMu  sync.Mutex
	notifMap uintptr

	bmu      sync.Mutex
	backends []*BackendHandle // created by CreateBackend, destroyed by Close

	handles atomic.Int64 // live requests and prepared lists
}

// NewAgent creates an agent named name. No backend exists until
// CreateBackend.
func (l *Library) NewAgent(name string, cfg AgentConfig) (*Agent, error) {
	if name == "" {
		return nil, fmt.Errorf("new nixl agent: empty name: %w", ErrInvalidParam)
	}
	cb := agentConfigBytes(cfg, threadSyncStrict, l.compactConfig)
	n := cstr(name)
	var h uintptr
	if err := check("nixl_capi_create_configured_agent", call(l.fn.createConfiguredAgent, uintptr(unsafe.Pointer(&n[0])), uintptr(unsafe.Pointer(&cb[0])), uintptr(unsafe.Pointer(&h)))); err != nil {
		return nil, fmt.Errorf("create agent %s: %w", name, err)
	}
	var m uintptr
	if err := check("nixl_capi_create_notif_map", call(l.fn.createNotifMap, uintptr(unsafe.Pointer(&m)))); err != nil {
		call(l.fn.destroyAgent, h)
		return nil, fmt.Errorf("create agent %s: %w", name, err)
	}
	return &Agent{lib: l, name: name, h: h, notifMap: m}, nil
}

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// OpenHandles returns the number of live transfer requests and prepared
// lists.
func (a *Agent) OpenHandles() int { return int(a.handles.Load()) }

// rlock holds the agent open for one call.
func (a *Agent) rlock() error {
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		return fmt.Errorf("agent %s: %w", a.name, errClosed)
	}
	return nil
}

// Plugins lists the backend plugins NIXL found.
func (a *Agent) Plugins() ([]string, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	var list uintptr
	if err := check("nixl_capi_get_available_plugins", call(f.getAvailablePlugins, a.h, uintptr(unsafe.Pointer(&list)))); err != nil {
		return nil, err
	}
	defer call(f.destroyStringList, list)
	var n uint64
	if err := check("nixl_capi_string_list_size", call(f.stringListSize, list, uintptr(unsafe.Pointer(&n)))); err != nil {
		return nil, err
	}
	out := make([]string, 0, n)
	for i := range n {
		var s uintptr
		if err := check("nixl_capi_string_list_get", call(f.stringListGet, list, uintptr(i), uintptr(unsafe.Pointer(&s)))); err != nil {
			return nil, err
		}
		out = append(out, goString(s))
	}
	return out, nil
}

// PluginParams returns the memory kinds a plugin supports and its default
// initialisation parameters.
func (a *Agent) PluginParams(plugin string) ([]registry.MemKind, map[string]string, error) {
	if err := a.rlock(); err != nil {
		return nil, nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	p := cstr(plugin)
	var mems, params uintptr
	if err := check("nixl_capi_get_plugin_params", call(f.getPluginParams, a.h, uintptr(unsafe.Pointer(&p[0])), uintptr(unsafe.Pointer(&mems)), uintptr(unsafe.Pointer(&params)))); err != nil {
		return nil, nil, fmt.Errorf("plugin %s: %w", plugin, err)
	}
	defer call(f.destroyMemList, mems)
	defer call(f.destroyParams, params)
	kinds, err := a.memList(mems)
	if err != nil {
		return nil, nil, err
	}
	m, err := a.paramMap(params)
	if err != nil {
		return nil, nil, err
	}
	return kinds, m, nil
}

func (a *Agent) memList(list uintptr) ([]registry.MemKind, error) {
	f := &a.lib.fn
	var n uint64
	if err := check("nixl_capi_mem_list_size", call(f.memListSize, list, uintptr(unsafe.Pointer(&n)))); err != nil {
		return nil, err
	}
	out := make([]registry.MemKind, 0, n)
	for i := range n {
		var k int32
		if err := check("nixl_capi_mem_list_get", call(f.memListGet, list, uintptr(i), uintptr(unsafe.Pointer(&k)))); err != nil {
			return nil, err
		}
		out = append(out, registry.MemKind(k))
	}
	return out, nil
}

func (a *Agent) paramMap(params uintptr) (map[string]string, error) {
	f := &a.lib.fn
	out := map[string]string{}
	var empty bool
	if err := check("nixl_capi_params_is_empty", call(f.paramsIsEmpty, params, uintptr(unsafe.Pointer(&empty)))); err != nil {
		return nil, err
	}
	if empty {
		return out, nil
	}
	var it uintptr
	if err := check("nixl_capi_params_create_iterator", call(f.paramsCreateIterator, params, uintptr(unsafe.Pointer(&it)))); err != nil {
		return nil, err
	}
	defer call(f.paramsDestroyIterator, it)
	for {
		var k, v uintptr
		var more bool
		if err := check("nixl_capi_params_iterator_next", call(f.paramsIteratorNext, it, uintptr(unsafe.Pointer(&k)), uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&more)))); err != nil {
			return nil, err
		}
		if k != 0 {
			out[goString(k)] = goString(v)
		}
		if !more {
			return out, nil
		}
	}
}

// BackendHandle is a backend (a plugin instance) of an agent.
type BackendHandle struct {
	a      *Agent
	h      uintptr
	plugin string
	// plain is opt args naming only this backend, shared (read-only) by
	// every call that needs no notification; destroyed with the agent.
	plain uintptr
}

// Plugin returns the plugin name.
func (b *BackendHandle) Plugin() string { return b.plugin }

// CreateBackend instantiates a plugin with its default parameters
// overridden by params (nixl_capi_get_plugin_params, then
// nixl_capi_create_backend): the C API creates no backend by itself.
func (a *Agent) CreateBackend(plugin string, params map[string]string) (*BackendHandle, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	p := cstr(plugin)
	var mems, cparams uintptr
	if err := check("nixl_capi_get_plugin_params", call(f.getPluginParams, a.h, uintptr(unsafe.Pointer(&p[0])), uintptr(unsafe.Pointer(&mems)), uintptr(unsafe.Pointer(&cparams)))); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", plugin, err)
	}
	defer call(f.destroyMemList, mems)
	defer call(f.destroyParams, cparams)
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck, cv := cstr(k), cstr(params[k])
		if err := check("nixl_capi_params_add", call(f.paramsAdd, cparams, uintptr(unsafe.Pointer(&ck[0])), uintptr(unsafe.Pointer(&cv[0])))); err != nil {
			return nil, fmt.Errorf("plugin %s parameter %s: %w", plugin, k, err)
		}
	}
	var h uintptr
	if err := check("nixl_capi_create_backend", call(f.createBackend, a.h, uintptr(unsafe.Pointer(&p[0])), cparams, uintptr(unsafe.Pointer(&h)))); err != nil {
		return nil, fmt.Errorf("create %s backend: %w", plugin, err)
	}
	b := &BackendHandle{a: a, h: h, plugin: plugin}
	plain, err := a.newOptArgs(b, nil)
	if err != nil {
		call(f.destroyBackend, h)
		return nil, fmt.Errorf("create %s backend: %w", plugin, err)
	}
	b.plain = plain
	a.bmu.Lock()
	a.backends = append(a.backends, b)
	a.bmu.Unlock()
	return b, nil
}

// optArgs returns opt args naming backend and, when notif is not nil,
// carrying a notification. own reports whether the caller must destroy
// them; without a notification they are the backend's shared ones.
func (a *Agent) optArgs(backend *BackendHandle, notif []byte) (o uintptr, own bool, err error) {
	if notif == nil && backend != nil && backend.plain != 0 {
		return backend.plain, false, nil
	}
	o, err = a.newOptArgs(backend, notif)
	return o, err == nil, err
}

// destroyOpt destroys opt args that optArgs said the caller owns.
func (a *Agent) destroyOpt(o uintptr, own bool) {
	if own {
		call(a.lib.fn.destroyOptArgs, o)
	}
}

// newOptArgs builds opt args naming backend (and a notification when notif
// is not nil). The caller destroys them.
func (a *Agent) newOptArgs(backend *BackendHandle, notif []byte) (uintptr, error) {
	f := &a.lib.fn
	var o uintptr
	if err := check("nixl_capi_create_opt_args", call(f.createOptArgs, uintptr(unsafe.Pointer(&o)))); err != nil {
		return 0, err
	}
	if backend != nil {
		if err := check("nixl_capi_opt_args_add_backend", call(f.optArgsAddBackend, o, backend.h)); err != nil {
			call(f.destroyOptArgs, o)
			return 0, err
		}
	}
	if notif != nil {
		var p uintptr
		if len(notif) > 0 {
			p = uintptr(unsafe.Pointer(&notif[0]))
		}
		if err := check("nixl_capi_opt_args_set_notif_msg", call(f.optArgsSetNotifMsg, o, p, uintptr(len(notif)))); err != nil {
			call(f.destroyOptArgs, o)
			return 0, err
		}
		if err := check("nixl_capi_opt_args_set_has_notif", call(f.optArgsSetHasNotif, o, 1)); err != nil {
			call(f.destroyOptArgs, o)
			return 0, err
		}
	}
	return o, nil
}

func (a *Agent) regDlist(l transfer.DescList) (uintptr, error) {
	f := &a.lib.fn
	var d uintptr
	if err := check("nixl_capi_create_reg_dlist", call(f.createRegDlist, uintptr(l.Kind), uintptr(unsafe.Pointer(&d)))); err != nil {
		return 0, err
	}
	for _, x := range l.Descs {
		if err := check("nixl_capi_reg_dlist_add_desc", call(f.regDlistAddDesc, d, uintptr(x.Addr), uintptr(x.Len), uintptr(x.DevID), 0, 0)); err != nil {
			call(f.destroyRegDlist, d)
			return 0, err
		}
	}
	return d, nil
}

func (a *Agent) xferDlist(l transfer.DescList) (uintptr, error) {
	f := &a.lib.fn
	var d uintptr
	// 1.5.x takes (mem_type, dlist*); older releases took a third "sorted"
	// flag, which the zero in the next register leaves false.
	if err := check("nixl_capi_create_xfer_dlist", call(f.createXferDlist, uintptr(l.Kind), uintptr(unsafe.Pointer(&d)), 0)); err != nil {
		return 0, err
	}
	for _, x := range l.Descs {
		if err := check("nixl_capi_xfer_dlist_add_desc", call(f.xferDlistAddDesc, d, uintptr(x.Addr), uintptr(x.Len), uintptr(x.DevID))); err != nil {
			call(f.destroyXferDlist, d)
			return 0, err
		}
	}
	return d, nil
}

// RegisterMem registers memory with backend (nil: every backend that
// supports the kind).
func (a *Agent) RegisterMem(l transfer.DescList, backend *BackendHandle) error {
	return a.regOp("nixl_capi_register_mem", a.lib.fn.registerMem, l, backend)
}

// DeregisterMem deregisters memory registered with RegisterMem.
func (a *Agent) DeregisterMem(l transfer.DescList, backend *BackendHandle) error {
	return a.regOp("nixl_capi_deregister_mem", a.lib.fn.deregisterMem, l, backend)
}

func (a *Agent) regOp(name string, fn uintptr, l transfer.DescList, backend *BackendHandle) error {
	if err := a.rlock(); err != nil {
		return err
	}
	defer a.mu.RUnlock()
	d, err := a.regDlist(l)
	if err != nil {
		return err
	}
	defer call(a.lib.fn.destroyRegDlist, d)
	o, own, err := a.optArgs(backend, nil)
	if err != nil {
		return err
	}
	defer a.destroyOpt(o, own)
	return check(name, call(fn, a.h, d, o))
}

// LocalMD returns the agent's metadata. Take it after registering memory.
func (a *Agent) LocalMD() ([]byte, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	var p uintptr
	var n uint64
	if err := check("nixl_capi_get_local_md", call(a.lib.fn.getLocalMD, a.h, uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)))); err != nil {
		return nil, err
	}
	defer a.lib.free(p)
	return goBytes(p, n), nil
}

// LoadRemoteMD loads a remote agent's metadata and returns its name.
func (a *Agent) LoadRemoteMD(md []byte) (string, error) {
	if len(md) == 0 {
		return "", fmt.Errorf("load remote metadata: empty: %w", ErrInvalidParam)
	}
	if err := a.rlock(); err != nil {
		return "", err
	}
	defer a.mu.RUnlock()
	var name uintptr
	if err := check("nixl_capi_load_remote_md", call(a.lib.fn.loadRemoteMD, a.h, uintptr(unsafe.Pointer(&md[0])), uintptr(len(md)), uintptr(unsafe.Pointer(&name)))); err != nil {
		return "", err
	}
	defer a.lib.free(name)
	return goString(name), nil
}

// InvalidateRemoteMD forgets a remote agent's metadata.
func (a *Agent) InvalidateRemoteMD(remote string) error {
	if err := a.rlock(); err != nil {
		return err
	}
	defer a.mu.RUnlock()
	r := cstr(remote)
	return check("nixl_capi_invalidate_remote_md", call(a.lib.fn.invalidateRemoteMD, a.h, uintptr(unsafe.Pointer(&r[0]))))
}

// CheckRemoteMD reports (nil) whether metadata for remote is loaded and, when
// descs is not nil, covers those spans.
func (a *Agent) CheckRemoteMD(remote string, descs *transfer.DescList) error {
	if err := a.rlock(); err != nil {
		return err
	}
	defer a.mu.RUnlock()
	var d uintptr
	if descs != nil {
		var err error
		if d, err = a.xferDlist(*descs); err != nil {
			return err
		}
		defer call(a.lib.fn.destroyXferDlist, d)
	}
	r := cstr(remote)
	return check("nixl_capi_check_remote_md", call(a.lib.fn.checkRemoteMD, a.h, uintptr(unsafe.Pointer(&r[0])), d))
}

// XferReq is a transfer request. Release it exactly once when it is no
// longer in progress.
type XferReq struct {
	a        *Agent
	h        uintptr
	opt      uintptr
	ownOpt   bool
	released bool
}

// CreateXferReq creates a request moving local <-> remote spans of agent
// remoteAgent through backend, with a notification when notif is not nil.
func (a *Agent) CreateXferReq(op transfer.Op, local, remote transfer.DescList, remoteAgent string, notif []byte, backend *BackendHandle) (*XferReq, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	ld, err := a.xferDlist(local)
	if err != nil {
		return nil, err
	}
	defer call(f.destroyXferDlist, ld)
	rd, err := a.xferDlist(remote)
	if err != nil {
		return nil, err
	}
	defer call(f.destroyXferDlist, rd)
	o, own, err := a.optArgs(backend, notif)
	if err != nil {
		return nil, err
	}
	r := cstr(remoteAgent)
	var h uintptr
	if err := check("nixl_capi_create_xfer_req", call(f.createXferReq, a.h, uintptr(op), ld, rd, uintptr(unsafe.Pointer(&r[0])), uintptr(unsafe.Pointer(&h)), o)); err != nil {
		a.destroyOpt(o, own)
		return nil, err
	}
	a.handles.Add(1)
	return &XferReq{a: a, h: h, opt: o, ownOpt: own}, nil
}

// PreppedDlist is a descriptor list prepared for one agent (this one, for
// local lists), from which requests pick spans by index.
type PreppedDlist struct {
	a        *Agent
	h        uintptr
	n        int
	released bool
}

// Len returns the number of spans.
func (p *PreppedDlist) Len() int { return p.n }

// PrepXferDlist prepares l for transfers with agent (the empty name
// prepares a local list).
func (a *Agent) PrepXferDlist(agent string, l transfer.DescList, backend *BackendHandle) (*PreppedDlist, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	d, err := a.xferDlist(l)
	if err != nil {
		return nil, err
	}
	defer call(f.destroyXferDlist, d)
	o, own, err := a.optArgs(backend, nil)
	if err != nil {
		return nil, err
	}
	defer a.destroyOpt(o, own)
	n := cstr(agent)
	var h uintptr
	if err := check("nixl_capi_prep_xfer_dlist", call(f.prepXferDlist, a.h, uintptr(unsafe.Pointer(&n[0])), d, uintptr(unsafe.Pointer(&h)), o)); err != nil {
		return nil, err
	}
	a.handles.Add(1)
	return &PreppedDlist{a: a, h: h, n: len(l.Descs)}, nil
}

// Release frees the prepared list; releasing twice does nothing.
func (p *PreppedDlist) Release() error {
	if p.released {
		return nil
	}
	if err := p.a.rlock(); err != nil {
		return err
	}
	defer p.a.mu.RUnlock()
	return p.releaseLocked()
}

func (p *PreppedDlist) releaseLocked() error {
	if p.released {
		return nil
	}
	if err := check("nixl_capi_release_xfer_dlist_handle", call(p.a.lib.fn.releaseXferDlistHandle, p.a.h, p.h)); err != nil {
		return err
	}
	p.released = true
	p.a.handles.Add(-1)
	return nil
}

// MakeXferReq creates a request from prepared lists, moving
// local[localIdx[i]] <-> remote[remoteIdx[i]].
func (a *Agent) MakeXferReq(op transfer.Op, local *PreppedDlist, localIdx []int, remote *PreppedDlist, remoteIdx []int, notif []byte, backend *BackendHandle) (*XferReq, error) {
	if len(localIdx) == 0 || len(localIdx) != len(remoteIdx) {
		return nil, fmt.Errorf("make xfer req: %d local and %d remote indices: %w", len(localIdx), len(remoteIdx), ErrInvalidParam)
	}
	li, ri := make([]int32, len(localIdx)), make([]int32, len(remoteIdx))
	for i := range localIdx {
		li[i], ri[i] = int32(localIdx[i]), int32(remoteIdx[i])
	}
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	f := &a.lib.fn
	o, own, err := a.optArgs(backend, notif)
	if err != nil {
		return nil, err
	}
	var h uintptr
	if err := check("nixl_capi_make_xfer_req", call(f.makeXferReq, a.h, uintptr(op),
		local.h, uintptr(unsafe.Pointer(&li[0])), uintptr(len(li)),
		remote.h, uintptr(unsafe.Pointer(&ri[0])), uintptr(len(ri)),
		uintptr(unsafe.Pointer(&h)), o)); err != nil {
		a.destroyOpt(o, own)
		return nil, err
	}
	a.handles.Add(1)
	return &XferReq{a: a, h: h, opt: o, ownOpt: own}, nil
}

// Post starts the transfer: StatusSuccess when it completed at once,
// StatusInProgress when it runs on.
func (r *XferReq) Post() (Status, error) {
	if err := r.a.rlock(); err != nil {
		return 0, err
	}
	defer r.a.mu.RUnlock()
	st := call(r.a.lib.fn.postXferReq, r.a.h, r.h, 0)
	return st, check("nixl_capi_post_xfer_req", st)
}

// Status polls the transfer: StatusSuccess, StatusInProgress, or an error.
func (r *XferReq) Status() (Status, error) {
	if err := r.a.rlock(); err != nil {
		return 0, err
	}
	defer r.a.mu.RUnlock()
	st := call(r.a.lib.fn.getXferStatus, r.a.h, r.h)
	return st, check("nixl_capi_get_xfer_status", st)
}

// Release releases the request (aborting it if it is still in progress,
// where the backend can) and frees it; releasing twice does nothing.
func (r *XferReq) Release() error {
	if r.released {
		return nil
	}
	if err := r.a.rlock(); err != nil {
		return err
	}
	defer r.a.mu.RUnlock()
	return r.releaseLocked()
}

func (r *XferReq) releaseLocked() error {
	if r.released {
		return nil
	}
	f := &r.a.lib.fn
	if err := check("nixl_capi_release_xfer_req", call(f.releaseXferReq, r.a.h, r.h)); err != nil {
		return err
	}
	call(f.destroyXferReq, r.h)
	r.a.destroyOpt(r.opt, r.ownOpt)
	r.released = true
	r.a.handles.Add(-1)
	return nil
}

// GetNotifs drains the notifications received since the last call. NIXL
// appends to the map it is given, so the map is cleared after each drain.
func (a *Agent) GetNotifs() ([]transfer.Notif, error) {
	if err := a.rlock(); err != nil {
		return nil, err
	}
	defer a.mu.RUnlock()
	a.notifMu.Lock()
	defer a.notifMu.Unlock()
	f := &a.lib.fn
	m := a.notifMap
	if err := check("nixl_capi_get_notifs", call(f.getNotifs, a.h, m, 0)); err != nil {
		return nil, err
	}
	defer call(f.notifMapClear, m)
	var agents uint64
	if err := check("nixl_capi_notif_map_size", call(f.notifMapSize, m, uintptr(unsafe.Pointer(&agents)))); err != nil {
		return nil, err
	}
	var out []transfer.Notif
	for i := range agents {
		var name uintptr
		if err := check("nixl_capi_notif_map_get_agent_at", call(f.notifMapGetAgentAt, m, uintptr(i), uintptr(unsafe.Pointer(&name)))); err != nil {
			return nil, err
		}
		agent := goString(name)
		var n uint64
		if err := check("nixl_capi_notif_map_get_notifs_size", call(f.notifMapGetNotifsSize, m, name, uintptr(unsafe.Pointer(&n)))); err != nil {
			return nil, err
		}
		for j := range n {
			var data uintptr
			var l uint64
			if err := check("nixl_capi_notif_map_get_notif", call(f.notifMapGetNotif, m, name, uintptr(j), uintptr(unsafe.Pointer(&data)), uintptr(unsafe.Pointer(&l)))); err != nil {
				return nil, err
			}
			out = append(out, transfer.Notif{Agent: agent, Msg: goBytes(data, l)})
		}
	}
	return out, nil
}

// Close destroys the agent's backend handles and then the agent. Release
// requests and prepared lists and deregister memory first; Close waits for
// calls in progress on other goroutines.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	f := &a.lib.fn
	a.bmu.Lock()
	for _, b := range a.backends {
		call(f.destroyOptArgs, b.plain)
		call(f.destroyBackend, b.h)
	}
	a.backends = nil
	a.bmu.Unlock()
	call(f.destroyNotifMap, a.notifMap)
	if err := check("nixl_capi_destroy_agent", call(f.destroyAgent, a.h)); err != nil {
		return fmt.Errorf("destroy agent %s: %w", a.name, err)
	}
	return nil
}
