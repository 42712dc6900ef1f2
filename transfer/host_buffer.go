package transfer

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/pdplane/pdplane/registry"
)

// HostBuffer is host memory mapped outside the Go heap, so that its address
// is stable and a backend (or a NIXL plugin on another thread) may read and
// write it at any time. Deregister it from every backend before Free.
type HostBuffer struct {
	b []byte
}

// AllocHost maps size bytes of zeroed, page-aligned anonymous memory. The
// pages are touched once so that the first transfer does not pay for the
// page faults.
func AllocHost(size int) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("host buffer of %d bytes: %w", size, ErrInvalidRegion)
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
	return &HostBuffer{b: b}, nil
}

// Bytes returns the mapped memory. It is valid until Free.
func (h *HostBuffer) Bytes() []byte { return h.b }

// Addr returns the address of the first byte.
func (h *HostBuffer) Addr() uint64 {
	if len(h.b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&h.b[0])))
}

// Len returns the size in bytes.
func (h *HostBuffer) Len() int { return len(h.b) }

// Region returns the whole buffer as a one-span DRAM list, ready to register.
func (h *HostBuffer) Region() DescList {
	return DescList{Kind: registry.DRAM, Descs: []Desc{{Addr: h.Addr(), Len: uint64(len(h.b))}}}
}

// Span returns the DRAM span [off, off+n) of the buffer.
func (h *HostBuffer) Span(off, n int) Desc {
	return Desc{Addr: h.Addr() + uint64(off), Len: uint64(n)}
}

// Free unmaps the buffer. It is idempotent.
func (h *HostBuffer) Free() error {
	if h.b == nil {
		return nil
	}
	b := h.b
	h.b = nil
	if err := syscall.Munmap(b); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// HostBytes returns the n bytes at addr as a slice. The memory must be
// mapped outside the Go heap (registered host memory) and stay mapped while
// the slice is used; backends call it only for spans they have checked
// against their registered regions.
func HostBytes(addr uint64, n uint64) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(addr))), int(n))
}
