// Package nixl binds NVIDIA's NIXL through its C API, libnixl_capi.so,
// loaded at run time with purego: no cgo, so pdplane builds with
// CGO_ENABLED=0 and runs where NIXL is absent (the transfer worker then uses
// transfer/tcp).
//
// Load finds the library (PDPLANE_NIXL_LIB, then libnixl_capi.so.0, then
// libnixl_capi.so) once per process, never in init, after setting the UCX
// environment a Go process needs (UCX_ERROR_SIGNALS empty,
// UCX_HANDLE_ERRORS=none) and NIXL_PLUGIN_DIR when it is unset. Every C
// function is bound through dlsym up front, so a missing one is an error
// (*MissingSymbolError), never a crash. The nixl-cu12 wheel ships the
// library; scripts/install-nixl.sh installs it.
//
// Agent is a thin, safe Go API over the C API: agents with thread sync
// STRICT, plugin backends created explicitly with parameters, memory
// registration, metadata, descriptor lists, transfer requests (simple and
// prepared), notifications. Every status other than success and in-progress
// becomes a *StatusError that matches the Err* sentinels with errors.Is.
// Backend implements transfer.Backend over one Agent and one UCX backend,
// checking spans against registered memory before NIXL sees them and
// counting the handles it holds.
//
// It owns the ABI facts (struct layouts, signatures) of the NIXL release it
// was checked against (nixl-cu12 1.5.1, with the newer agent-config layout
// handled); it does not plan transfers.
package nixl
