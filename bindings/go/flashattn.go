// Package flashattn is a thin cgo binding of the flashattn C API
// (include/flashattn.h): runtimes, configs, device memory helpers, PTX
// generation, the forward pass, Flash-Decoding and the kernel cache.
//
// Every failing call returns an *Error carrying the C status code and the
// detailed message of fa_last_error(), copied in the same C call that failed.
// Handles (Runtime, Config, DeviceMemory) have an idempotent Close; a
// finalizer is only a backstop.
package flashattn

/*
#cgo pkg-config: flashattn
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// Status is an fa_status code. Codes are never renumbered.
type Status int

// The fa_status codes of flashattn.h.
const (
	StatusSuccess         Status = C.FA_SUCCESS
	StatusInvalidArgument Status = C.FA_ERROR_INVALID_ARGUMENT
	StatusUnsupported     Status = C.FA_ERROR_UNSUPPORTED
	StatusOutOfMemory     Status = C.FA_ERROR_OUT_OF_MEMORY
	StatusNoDriver        Status = C.FA_ERROR_NO_DRIVER
	StatusNoDevice        Status = C.FA_ERROR_NO_DEVICE
	StatusCUDA            Status = C.FA_ERROR_CUDA
	StatusCompile         Status = C.FA_ERROR_COMPILE
	StatusLaunch          Status = C.FA_ERROR_LAUNCH
	StatusRuntimePoisoned Status = C.FA_ERROR_RUNTIME_POISONED
	StatusBufferTooSmall  Status = C.FA_ERROR_BUFFER_TOO_SMALL
	StatusInternal        Status = C.FA_ERROR_INTERNAL
	StatusCache           Status = C.FA_ERROR_CACHE
)

// String is the library's static text for the code (fa_status_string).
func (s Status) String() string {
	return C.GoString(C.fa_status_string(C.fa_status(s)))
}

// Error makes a Status usable as an errors.Is target:
// errors.Is(err, flashattn.StatusInvalidArgument).
func (s Status) Error() string { return "flashattn: " + s.String() }

// Error is a failed flashattn call: its status and the detailed message
// ("fa_launch: q.stride[3] must be 1, got 2"). Checks made by this package
// before calling C use the same type with a "flashattn(go): " message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "flashattn: " + e.Status.String()
	}
	return "flashattn: " + e.Status.String() + ": " + e.Message
}

// Is reports whether target is this error's Status, or an *Error with the
// same Status.
func (e *Error) Is(target error) bool {
	var s Status
	if errors.As(target, &s) {
		return s == e.Status
	}
	var o *Error
	if errors.As(target, &o) {
		return o.Status == e.Status
	}
	return false
}

// check turns a status and the message copied by the shim into an error.
func check(st C.fa_status, e *C.fago_err) error {
	if st == C.FA_SUCCESS {
		return nil
	}
	return &Error{Status: Status(st), Message: C.GoString(&e.msg[0])}
}

// goErr is an error detected on the Go side, before any C call.
func goErr(s Status, format string, args ...interface{}) error {
	return &Error{Status: s, Message: "flashattn(go): " + fmt.Sprintf(format, args...)}
}

// VersionNumber is FLASHATTN_VERSION_NUMBER of the loaded library.
func VersionNumber() int { return int(C.fa_version_number()) }

// Version is the loaded library's "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.fa_version_string()) }

// HeaderVersionNumber is FLASHATTN_VERSION_NUMBER of the header this package
// was compiled against.
const HeaderVersionNumber = C.FLASHATTN_VERSION_NUMBER

// Backend selects where kernels run.
type Backend int32

// Backends (fa_backend).
const (
	BackendAuto     Backend = C.FA_BACKEND_AUTO
	BackendCUDA     Backend = C.FA_BACKEND_CUDA
	BackendEmulator Backend = C.FA_BACKEND_EMULATOR
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCUDA:
		return "cuda"
	case BackendEmulator:
		return "emulator"
	}
	return fmt.Sprintf("Backend(%d)", int32(b))
}

// DType is an element type (fa_dtype).
type DType int32

// Data types.
const (
	FP16 DType = C.FA_DTYPE_FP16
	BF16 DType = C.FA_DTYPE_BF16
	FP32 DType = C.FA_DTYPE_FP32
	// Since 0.5: fp8 formats, only as ConfigDesc.KVDType (an fp8 KV cache)
	// and, since 0.6, ConfigDesc.QDType (the fp8 forward).
	FP8E4M3 DType = C.FA_DTYPE_FP8_E4M3
	FP8E5M2 DType = C.FA_DTYPE_FP8_E5M2
)

// KernelKind selects the kernel fa_generate emits.
type KernelKind int32

// Kernel kinds (fa_kernel_kind).
const (
	KernelForward KernelKind = C.FA_KERNEL_FORWARD
	KernelDecode  KernelKind = C.FA_KERNEL_DECODE
	KernelReduce  KernelKind = C.FA_KERNEL_REDUCE
	// Since 0.9: the backward's three kernels, in fa_backward's launch order.
	KernelBackwardPre  KernelKind = C.FA_KERNEL_BACKWARD_PRE
	KernelBackward     KernelKind = C.FA_KERNEL_BACKWARD
	KernelBackwardPost KernelKind = C.FA_KERNEL_BACKWARD_POST
)

// CacheMode selects where compiled kernels are kept (fa_cache_mode).
type CacheMode int32

// Cache modes.
const (
	CacheDefault CacheMode = C.FA_CACHE_DEFAULT
	CacheDisk    CacheMode = C.FA_CACHE_DISK
	CacheMemory  CacheMode = C.FA_CACHE_MEMORY
)
