package flashattn

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"runtime/cgo"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// WarmOptions says what CacheWarm writes (fa_cache_warm_options).
type WarmOptions struct {
	// SMs are the targets: 80, 86, 87, 89, 90 (sm_90a kernels where the
	// kernel takes them), 100, 103, 110, 120, 121; at least one. ParseSMs
	// reads the CLI's forms ("90a", "sm_100a").
	SMs []int
	// Presets are preset names (CacheWarmPresets); each may itself be a
	// comma-separated list.
	Presets []string
	// Specs are kernel spec lines (cache/README.md, "Warming"); "" = none.
	// At least one of Presets and Specs.
	Specs string
	// CacheDir is the cache to fill, as RuntimeOptions.CacheDir ("": the
	// default directory). It must pass the library's trust checks and be
	// writable.
	CacheDir string
	// Jobs is the number of kernels compiled at once; 0 = the online CPUs.
	Jobs int
	// PTXOnly writes PTX rows (the driver JIT-compiles them on first use);
	// otherwise the PTX compiler plugin builds cubins when it is found, and
	// PTX rows are written when it is not.
	PTXOnly bool
	// Progress, when set, is called on the calling goroutine after each
	// kernel. A panic in it cannot unwind through the C call: it is
	// recovered, Progress is not called again, the remaining kernels are
	// warmed, then CacheWarm panics with the same value.
	Progress func(WarmProgress)
}

// WarmCounts are the counts of a CacheWarm call (fa_cache_warm_progress).
type WarmCounts struct {
	Total    uint64        // distinct kernels asked for: (spec line, SM) pairs that SM runs
	Done     uint64        // of which finished: Built + Present + Failed
	Built    uint64        // rows written
	Present  uint64        // rows already there with this compiler's binary
	Failed   uint64        // kernels the compiler rejected
	Skipped  uint64        // (spec line, SM) pairs that SM cannot run: not in Total
	Bytes    uint64        // PTX + binary bytes of the rows written
	Elapsed  time.Duration // wall time since the call began
	Compiler string        // the PTX compiler plugin's version, or "" (PTX rows)
}

// WarmProgress is one progress report: the counts so far and the kernel
// just finished.
type WarmProgress struct {
	WarmCounts
	Spec string // the kernel, as CacheEntry.Spec
	SM   int
}

func warmCounts(p *C.fa_cache_warm_progress) WarmCounts {
	return WarmCounts{
		Total:    uint64(p.total),
		Done:     uint64(p.done),
		Built:    uint64(p.built),
		Present:  uint64(p.present),
		Failed:   uint64(p.failed),
		Skipped:  uint64(p.skipped),
		Bytes:    uint64(p.bytes),
		Elapsed:  time.Duration(float64(p.seconds) * float64(time.Second)),
		Compiler: C.GoString(&p.compiler[0]),
	}
}

// warmState is what the progress handle refers to during one call.
type warmState struct {
	fn       func(WarmProgress)
	panicked bool
	value    interface{}
}

//export fagoWarmProgress
func fagoWarmProgress(p *C.fa_cache_warm_progress, handle C.uintptr_t) {
	st := cgo.Handle(handle).Value().(*warmState)
	if st.panicked {
		return // it panicked before: the call runs on, unreported
	}
	defer func() {
		if v := recover(); v != nil {
			st.panicked, st.value = true, v
		}
	}()
	spec := ""
	if p.spec != nil {
		spec = C.GoString(p.spec)
	}
	st.fn(WarmProgress{WarmCounts: warmCounts(p), Spec: spec, SM: int(p.sm)})
}

// ParseSMs reads SMs in the CLI's --sm forms: a comma-separated list of
// "80", "90a", "sm_100a", "120f" (the sm_ prefix and an a / f suffix
// dropped). Errors: StatusInvalidArgument naming the item that is not an SM.
func ParseSMs(list string) ([]int, error) {
	var sms []int
	for _, item := range strings.Split(list, ",") {
		digits := strings.TrimPrefix(item, "sm_")
		if strings.HasSuffix(digits, "a") || strings.HasSuffix(digits, "f") {
			digits = digits[:len(digits)-1]
		}
		isDigits := digits != "" && len(digits) <= 4 && strings.Trim(digits, "0123456789") == ""
		v, err := strconv.Atoi(digits)
		if !isDigits || err != nil {
			return nil, goErr(StatusInvalidArgument, "sms: %q is not an SM (80, 90a, sm_100a, ...)", item)
		}
		sms = append(sms, v)
	}
	return sms, nil
}

// CacheWarm fills a kernel cache, on a machine without a GPU or driver, with
// the rows a runtime on each SM of opts.SMs would build for the kernels the
// presets and spec lines name (fa_cache_warm). A runtime on such a GPU (or an
// emulator runtime with that EmulatorSM) over the cache then compiles
// nothing. Rows already current are left alone; kernels an SM cannot run
// are skipped and counted. The kernel choice follows this process's
// environment (FLASHATTN_SCALAR_FORWARD and the like), as a runtime's does.
//
// Errors: StatusInvalidArgument (no SM, an SM or Jobs beyond int32, an
// unknown preset, a spec line that does not parse or that the library's
// config / generate checks refuse: the message names the line and the key),
// StatusUnsupported (an SM not supported), StatusCache (the directory cannot
// be used or written: nothing written), StatusCompile (some kernels failed
// to compile: the others are written, the counts are returned with the
// error, and the message names the first). Safe for concurrent use; several
// processes may warm one cache.
func CacheWarm(opts WarmOptions) (WarmCounts, error) {
	const maxInt32 = 1<<31 - 1
	if opts.Jobs < 0 || opts.Jobs > maxInt32 {
		return WarmCounts{}, goErr(StatusInvalidArgument, "jobs must be in [0, 2^31) (0 = the online CPUs), got %d", opts.Jobs)
	}
	var o C.fa_cache_warm_options
	o.struct_size = C.size_t(unsafe.Sizeof(o))
	o.jobs = C.int32_t(opts.Jobs)
	o.ptx_compiler = C.FA_PTX_COMPILER_AUTO
	if opts.PTXOnly {
		o.ptx_compiler = C.FA_PTX_COMPILER_OFF
	}
	if n := len(opts.SMs); n > 0 {
		// C memory: the options struct passed to C may hold no Go pointers.
		sms := (*C.int32_t)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.int32_t(0)))))
		defer C.free(unsafe.Pointer(sms))
		for i, sm := range opts.SMs {
			if sm < -maxInt32-1 || sm > maxInt32 {
				return WarmCounts{}, goErr(StatusInvalidArgument, "sms[%d] = %d does not fit int32", i, sm)
			}
			unsafe.Slice(sms, n)[i] = C.int32_t(sm)
		}
		o.sms, o.num_sms = sms, C.int32_t(n)
	}
	if opts.CacheDir != "" {
		o.cache_dir = C.CString(opts.CacheDir)
		defer C.free(unsafe.Pointer(o.cache_dir))
	}
	if len(opts.Presets) > 0 {
		o.presets = C.CString(strings.Join(opts.Presets, ","))
		defer C.free(unsafe.Pointer(o.presets))
	}
	if opts.Specs != "" {
		o.specs = C.CString(opts.Specs)
		defer C.free(unsafe.Pointer(o.specs))
	}
	var st *warmState
	var handle C.uintptr_t
	if opts.Progress != nil {
		st = &warmState{fn: opts.Progress}
		h := cgo.NewHandle(st)
		defer h.Delete()
		handle = C.uintptr_t(h)
	}
	var r C.fa_cache_warm_progress
	r.struct_size = C.size_t(unsafe.Sizeof(r))
	var e C.fago_err
	err := check(C.fago_cache_warm(&o, handle, &r, &e), &e)
	if st != nil && st.panicked {
		panic(st.value)
	}
	if err != nil && !errors.Is(err, StatusCompile) {
		return WarmCounts{}, err
	}
	return warmCounts(&r), err
}

// WarmPreset is one built-in preset of CacheWarmPresets.
type WarmPreset struct {
	Name, Description string
}

// CacheWarmPresets returns the built-in presets in the library's order
// (fa_cache_warm_presets): Llama 3, Qwen, Mistral, Gemma 2 / 3, gpt-oss,
// DeepSeek MLA.
func CacheWarmPresets() []WarmPreset {
	var out []WarmPreset
	for _, line := range strings.Split(C.GoString(C.fa_cache_warm_presets()), "\n") {
		if name, description, ok := strings.Cut(line, ":"); ok {
			out = append(out, WarmPreset{strings.TrimSpace(name), strings.TrimSpace(description)})
		}
	}
	return out
}

// CacheWarmPreset returns the spec lines of preset name
// (fa_cache_warm_preset). Errors: StatusInvalidArgument naming the presets
// when there is no such preset.
func CacheWarmPreset(name string) (string, error) {
	c := C.CString(name)
	defer C.free(unsafe.Pointer(c))
	var e C.fago_err
	text := C.fago_cache_warm_preset(c, &e)
	if text == nil {
		return "", check(C.FA_ERROR_INVALID_ARGUMENT, &e)
	}
	return C.GoString(text), nil
}
