package flashattn

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// RuntimeOptions configures NewRuntime. The zero value is
// FA_RUNTIME_OPTIONS_INIT: auto backend, device 0, default cache.
type RuntimeOptions struct {
	Backend    Backend
	Device     int32     // CUDA device ordinal (cuda backend)
	CacheMode  CacheMode // CacheDefault, CacheDisk or CacheMemory
	CacheDir   string    // "": $FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn, ~/.cache/flashattn
	EmulatorSM int32     // SM the emulator targets (80, 86, 87, 89, 90, 100, 103, 110, 120, 121); 0 = 80
	// PTXCompiler (since 0.6): PTXCompilerAuto uses the PTX compiler plugin
	// when present and trusted (cuda backend), PTXCompilerOff the driver's JIT.
	PTXCompiler PTXCompiler
}

// PTXCompiler is fa_ptx_compiler.
type PTXCompiler int64

const (
	PTXCompilerAuto PTXCompiler = C.FA_PTX_COMPILER_AUTO
	PTXCompilerOff  PTXCompiler = C.FA_PTX_COMPILER_OFF
)

// Runtime is a device binding (a CUDA context or the emulator) with its
// loaded kernels and kernel cache. Its methods may be called from any
// goroutine concurrently; Close waits for calls in flight.
type Runtime struct {
	mu  sync.RWMutex // write-held by Close only
	ptr *C.fa_runtime

	allocMu sync.Mutex
	allocs  map[uint64]struct{} // live fa_malloc pointers, freed by Close
}

// NewRuntime creates a runtime; opts may be nil (all defaults).
func NewRuntime(opts *RuntimeOptions) (*Runtime, error) {
	var o C.fa_runtime_options
	o.struct_size = C.size_t(unsafe.Sizeof(o))
	o.backend = C.FA_BACKEND_AUTO
	o.cache_mode = C.FA_CACHE_DEFAULT
	if opts != nil {
		o.backend = C.fa_backend(opts.Backend)
		o.device = C.int32_t(opts.Device)
		o.cache_mode = C.fa_cache_mode(opts.CacheMode)
		o.emulator_sm = C.int32_t(opts.EmulatorSM)
		o.ptx_compiler = C.int64_t(opts.PTXCompiler)
		if opts.CacheDir != "" {
			dir := C.CString(opts.CacheDir)
			defer C.free(unsafe.Pointer(dir))
			o.cache_dir = dir
		}
	}
	var e C.fago_err
	var p *C.fa_runtime
	if err := check(C.fago_runtime_create(&o, &p, &e), &e); err != nil {
		return nil, err
	}
	rt := &Runtime{ptr: p, allocs: make(map[uint64]struct{})}
	runtime.SetFinalizer(rt, (*Runtime).Close)
	return rt, nil
}

// Close frees the memory still allocated through rt, then destroys it.
// Calling it again is a no-op. Later calls on rt fail with
// StatusInvalidArgument.
func (rt *Runtime) Close() error {
	if rt == nil {
		return nil
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.ptr == nil {
		return nil
	}
	var first error
	rt.allocMu.Lock()
	for p := range rt.allocs {
		var e C.fago_err
		if err := check(C.fago_free(rt.ptr, C.uint64_t(p), &e), &e); err != nil && first == nil {
			first = err
		}
		delete(rt.allocs, p)
	}
	rt.allocMu.Unlock()
	C.fa_runtime_destroy(rt.ptr)
	rt.ptr = nil
	runtime.SetFinalizer(rt, nil)
	return first
}

// acquire read-locks rt for one call and returns its handle, or an error if
// rt is nil or closed. The caller must call rt.mu.RUnlock when err is nil.
func (rt *Runtime) acquire(op string) (*C.fa_runtime, error) {
	if rt == nil {
		return nil, goErr(StatusInvalidArgument, "%s: runtime is nil", op)
	}
	rt.mu.RLock()
	if rt.ptr == nil {
		rt.mu.RUnlock()
		return nil, goErr(StatusInvalidArgument, "%s: runtime is closed", op)
	}
	return rt.ptr, nil
}

// RuntimeInfo describes the device behind a runtime.
type RuntimeInfo struct {
	Backend       Backend // the backend actually in use
	SM            int     // compute capability * 10, e.g. 80
	NumSMs        int
	DriverVersion int // 0 on the emulator
	DeviceName    string
}

// Info returns the backend and device in use.
func (rt *Runtime) Info() (RuntimeInfo, error) {
	p, err := rt.acquire("Info")
	if err != nil {
		return RuntimeInfo{}, err
	}
	defer rt.mu.RUnlock()
	var info C.fa_runtime_info
	info.struct_size = C.size_t(unsafe.Sizeof(info))
	var e C.fago_err
	if err := check(C.fago_runtime_get_info(p, &info, &e), &e); err != nil {
		return RuntimeInfo{}, err
	}
	return RuntimeInfo{
		Backend:       Backend(info.backend),
		SM:            int(info.sm),
		NumSMs:        int(info.num_sms),
		DriverVersion: int(info.driver_version),
		DeviceName:    C.GoString(&info.device_name[0]),
	}, nil
}

// Synchronize waits for all work on stream (0 = the default stream).
func (rt *Runtime) Synchronize(stream uintptr) error {
	p, err := rt.acquire("Synchronize")
	if err != nil {
		return err
	}
	defer rt.mu.RUnlock()
	var e C.fago_err
	return check(C.fago_synchronize(p, C.uint64_t(stream), &e), &e)
}
