// Package cuda is a purego binding to the few CUDA runtime functions a VRAM
// probe region needs (libcudart.so: cudaGetDeviceCount, cudaSetDevice,
// cudaMalloc, cudaFree, cudaMemcpy), loaded at run time like NIXL, without
// cgo. On a host without the runtime or a device, Load and DeviceCount say
// so with a clear error, and callers skip VRAM.
package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// EnvLib names the variable holding an explicit path to libcudart.so; it is
// tried before the loader's search path.
const EnvLib = "PDPLANE_CUDART_LIB"

// NotFoundError lists every path tried and why each failed.
type NotFoundError struct {
	Tried, Errors []string
}

// Error lists the attempts.
func (e *NotFoundError) Error() string {
	parts := make([]string, len(e.Tried))
	for i, p := range e.Tried {
		parts[i] = p + ": " + e.Errors[i]
	}
	return "CUDA runtime (libcudart.so) not found, so no VRAM probe region (tried " + strings.Join(parts, "; ") +
		"); install the CUDA runtime or set " + EnvLib + " to its path"
}

// Runtime is a loaded libcudart.so. It is never unloaded.
type Runtime struct {
	path           string
	getDeviceCount func(count *int32) int32
	setDevice      func(dev int32) int32
	malloc         func(ptr *uintptr, size uint64) int32
	free           func(ptr uintptr) int32
	// cudaMemcpy, bound twice so that the device side stays a uintptr
	// and the host side a pointer the garbage collector sees.
	memcpyToDevice func(dst uintptr, src unsafe.Pointer, count uint64, kind int32) int32
	memcpyToHost   func(dst unsafe.Pointer, src uintptr, count uint64, kind int32) int32
}

// cudaMemcpyKind values.
const (
	memcpyHostToDevice = 1
	memcpyDeviceToHost = 2
)

var (
	loadOnce sync.Once
	loaded   *Runtime
	loadErr  error
)

// candidates returns the paths Load tries, in order.
func candidates() []string {
	var out []string
	if p := os.Getenv(EnvLib); p != "" {
		out = append(out, p)
	}
	return append(out, "libcudart.so", "libcudart.so.12", "libcudart.so.11.0")
}

// Load loads the CUDA runtime once per process.
func Load() (*Runtime, error) {
	loadOnce.Do(func() { loaded, loadErr = load(candidates()) })
	return loaded, loadErr
}

func load(paths []string) (*Runtime, error) {
	nf := &NotFoundError{}
	for _, p := range paths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			nf.Tried, nf.Errors = append(nf.Tried, p), append(nf.Errors, err.Error())
			continue
		}
		r := &Runtime{path: p}
		for name, fn := range map[string]any{
			"cudaGetDeviceCount": &r.getDeviceCount, "cudaSetDevice": &r.setDevice,
			"cudaMalloc": &r.malloc, "cudaFree": &r.free,
		} {
			sym, err := purego.Dlsym(h, name)
			if err != nil {
				return nil, fmt.Errorf("%s lacks %s: %w", p, name, err)
			}
			purego.RegisterFunc(fn, sym)
		}
		sym, err := purego.Dlsym(h, "cudaMemcpy")
		if err != nil {
			return nil, fmt.Errorf("%s lacks cudaMemcpy: %w", p, err)
		}
		purego.RegisterFunc(&r.memcpyToDevice, sym)
		purego.RegisterFunc(&r.memcpyToHost, sym)
		return r, nil
	}
	return nil, nf
}

// Path returns the path the runtime was loaded from.
func (r *Runtime) Path() string { return r.path }

// StatusError is a CUDA runtime call that returned an error code.
type StatusError struct {
	Call string
	Code int32
}

// Error names the call and its cudaError_t.
func (e *StatusError) Error() string { return fmt.Sprintf("%s: cudaError %d", e.Call, e.Code) }

func check(call string, code int32) error {
	if code != 0 {
		return &StatusError{Call: call, Code: code}
	}
	return nil
}

// DeviceCount returns how many CUDA devices the runtime sees.
func (r *Runtime) DeviceCount() (int, error) {
	var n int32
	if err := check("cudaGetDeviceCount", r.getDeviceCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Buffer is device memory that a VRAM probe region is made of; it
// implements transfer.ProbeMemory (host access goes through cudaMemcpy).
type Buffer struct {
	r   *Runtime
	dev int
	ptr uintptr
	n   int
}

// Alloc allocates n bytes on device dev.
func (r *Runtime) Alloc(dev, n int) (*Buffer, error) {
	// cudaSetDevice chooses the device of the calling OS thread, and
	// cudaMalloc allocates on it: both must run on one thread, which a
	// goroutine may otherwise leave between the two calls.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check("cudaSetDevice", r.setDevice(int32(dev))); err != nil {
		return nil, err
	}
	var p uintptr
	if err := check("cudaMalloc", r.malloc(&p, uint64(n))); err != nil {
		return nil, err
	}
	return &Buffer{r: r, dev: dev, ptr: p, n: n}, nil
}

// Region returns the buffer as a one-span VRAM list.
func (b *Buffer) Region() transfer.DescList {
	return transfer.DescList{Kind: registry.VRAM, Descs: []transfer.Desc{{Addr: uint64(b.ptr), Len: uint64(b.n), DevID: uint64(b.dev)}}}
}

// Len returns the size in bytes.
func (b *Buffer) Len() int { return b.n }

// WriteAt copies p to the device at off.
func (b *Buffer) WriteAt(p []byte, off int) error {
	if off < 0 || off+len(p) > b.n {
		return fmt.Errorf("write %d bytes at %d of %d: %w", len(p), off, b.n, transfer.ErrOutOfRange)
	}
	if len(p) == 0 {
		return nil
	}
	return check("cudaMemcpy", b.r.memcpyToDevice(b.ptr+uintptr(off), unsafe.Pointer(&p[0]), uint64(len(p)), memcpyHostToDevice))
}

// ReadAt copies the device's bytes at off into p.
func (b *Buffer) ReadAt(p []byte, off int) error {
	if off < 0 || off+len(p) > b.n {
		return fmt.Errorf("read %d bytes at %d of %d: %w", len(p), off, b.n, transfer.ErrOutOfRange)
	}
	if len(p) == 0 {
		return nil
	}
	return check("cudaMemcpy", b.r.memcpyToHost(unsafe.Pointer(&p[0]), b.ptr+uintptr(off), uint64(len(p)), memcpyDeviceToHost))
}

// Free releases the device memory; deregister it from every backend
// first. It is idempotent.
func (b *Buffer) Free() error {
	if b.ptr == 0 {
		return nil
	}
	p := b.ptr
	b.ptr = 0
	return check("cudaFree", b.r.free(p))
}
