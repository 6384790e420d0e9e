package flashattn

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// DeviceMemory is an allocation from fa_malloc (256-byte aligned). On the
// emulator it is the only memory kernels may touch. Free it when done;
// whatever is still allocated is freed by Runtime.Close (or the runtime's
// finalizer). DeviceMemory has no finalizer of its own on purpose: kernels
// use it through the plain address Ptr(), which the garbage collector cannot
// see, so collecting an unreferenced DeviceMemory could free memory a launch
// still reads.
type DeviceMemory struct {
	rt    *Runtime
	ptr   uint64
	size  uint64
	mu    sync.RWMutex // read-held by copies and Memset, write-held by Free
	freed bool
}

// Malloc allocates bytes (> 0) of device memory.
func (rt *Runtime) Malloc(bytes uint64) (*DeviceMemory, error) {
	p, err := rt.acquire("Malloc")
	if err != nil {
		return nil, err
	}
	defer rt.mu.RUnlock()
	var e C.fago_err
	var ptr C.uint64_t
	if err := check(C.fago_malloc(p, C.size_t(bytes), &ptr, &e), &e); err != nil {
		return nil, err
	}
	rt.allocMu.Lock()
	rt.allocs[uint64(ptr)] = struct{}{}
	rt.allocMu.Unlock()
	return &DeviceMemory{rt: rt, ptr: uint64(ptr), size: bytes}, nil
}

// Ptr is the device address, for Tensor.Data and the other pointer fields.
func (m *DeviceMemory) Ptr() uint64 { return m.ptr }

// Size is the allocation's size in bytes.
func (m *DeviceMemory) Size() uint64 { return m.size }

// Free releases the memory; calling it again (or after the runtime was
// closed) is a no-op.
func (m *DeviceMemory) Free() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed {
		return nil
	}
	m.freed = true
	rt := m.rt
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.ptr == nil {
		return nil // Runtime.Close freed it
	}
	rt.allocMu.Lock()
	_, live := rt.allocs[m.ptr]
	delete(rt.allocs, m.ptr)
	rt.allocMu.Unlock()
	if !live {
		return nil
	}
	var e C.fago_err
	return check(C.fago_free(rt.ptr, C.uint64_t(m.ptr), &e), &e)
}

// Close is Free (io.Closer).
func (m *DeviceMemory) Close() error { return m.Free() }

// copyOp runs a host<->device copy or memset after checking m is live and
// that bytes fit. m stays read-locked for the whole copy, so a concurrent
// Free waits for it instead of freeing the memory under it.
func (m *DeviceMemory) copyOp(op string, bytes uint64, f func(p *C.fa_runtime, e *C.fago_err) C.fa_status) error {
	if m == nil {
		return goErr(StatusInvalidArgument, "%s: memory is nil", op)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.freed {
		return goErr(StatusInvalidArgument, "%s: memory was freed", op)
	}
	if bytes > m.size {
		return goErr(StatusInvalidArgument, "%s: %d bytes do not fit in an allocation of %d", op, bytes, m.size)
	}
	p, err := m.rt.acquire(op)
	if err != nil {
		return err
	}
	defer m.rt.mu.RUnlock()
	var e C.fago_err
	return check(f(p, &e), &e)
}

// upload copies n bytes from host memory at src (a Go slice's first element).
func (m *DeviceMemory) upload(op string, src unsafe.Pointer, n uint64) error {
	return m.copyOp(op, n, func(p *C.fa_runtime, e *C.fago_err) C.fa_status {
		return C.fago_memcpy_htod(p, C.uint64_t(m.ptr), src, C.size_t(n), e)
	})
}

// download copies n bytes to host memory at dst.
func (m *DeviceMemory) download(op string, dst unsafe.Pointer, n uint64) error {
	return m.copyOp(op, n, func(p *C.fa_runtime, e *C.fago_err) C.fa_status {
		return C.fago_memcpy_dtoh(p, dst, C.uint64_t(m.ptr), C.size_t(n), e)
	})
}

// UploadUint16 copies src (fp16 / bf16 bits) to the start of m.
func (m *DeviceMemory) UploadUint16(src []uint16) error {
	if len(src) == 0 {
		return nil
	}
	return m.upload("UploadUint16", unsafe.Pointer(&src[0]), uint64(len(src))*2)
}

// UploadFloat32 copies src to the start of m.
func (m *DeviceMemory) UploadFloat32(src []float32) error {
	if len(src) == 0 {
		return nil
	}
	return m.upload("UploadFloat32", unsafe.Pointer(&src[0]), uint64(len(src))*4)
}

// UploadInt32 copies src to the start of m.
func (m *DeviceMemory) UploadInt32(src []int32) error {
	if len(src) == 0 {
		return nil
	}
	return m.upload("UploadInt32", unsafe.Pointer(&src[0]), uint64(len(src))*4)
}

// UploadUint64 copies src (e.g. the device addresses of a KVPtrArray cache)
// to the start of m.
func (m *DeviceMemory) UploadUint64(src []uint64) error {
	if len(src) == 0 {
		return nil
	}
	return m.upload("UploadUint64", unsafe.Pointer(&src[0]), uint64(len(src))*8)
}

// DownloadUint16 fills dst from the start of m.
func (m *DeviceMemory) DownloadUint16(dst []uint16) error {
	if len(dst) == 0 {
		return nil
	}
	return m.download("DownloadUint16", unsafe.Pointer(&dst[0]), uint64(len(dst))*2)
}

// DownloadFloat32 fills dst from the start of m.
func (m *DeviceMemory) DownloadFloat32(dst []float32) error {
	if len(dst) == 0 {
		return nil
	}
	return m.download("DownloadFloat32", unsafe.Pointer(&dst[0]), uint64(len(dst))*4)
}

// DownloadInt32 fills dst from the start of m.
func (m *DeviceMemory) DownloadInt32(dst []int32) error {
	if len(dst) == 0 {
		return nil
	}
	return m.download("DownloadInt32", unsafe.Pointer(&dst[0]), uint64(len(dst))*4)
}

// Memset sets every byte of m to value.
func (m *DeviceMemory) Memset(value byte) error {
	return m.copyOp("Memset", 0, func(p *C.fa_runtime, e *C.fago_err) C.fa_status {
		return C.fago_memset(p, C.uint64_t(m.ptr), C.uint8_t(value), C.size_t(m.size), e)
	})
}
