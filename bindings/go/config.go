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

// Window is a sliding attention window: query i sees keys in
// [i + seqlen_k - seqlen_q - Left, i + seqlen_k - seqlen_q + Right];
// -1 = unbounded on that side.
type Window struct {
	Left, Right int32
}

// ConfigDesc describes an attention problem family (fa_config_desc). The
// zero values of the optional fields are the C defaults.
type ConfigDesc struct {
	DType        DType   // FP16, BF16 or FP32 (bf16 on load, O fp32); 0 = FP16
	HeadDim      int32   // multiple of 8, 8..576 (past 256: sm_80+ tensor-core kernels)
	HeadDimV     int32   // multiple of 8, 8..512; 0 = HeadDim
	NumHeadsQ    int32   // >= 1
	NumHeadsKV   int32   // >= 1, divides NumHeadsQ; 0 = NumHeadsQ
	Causal       bool    // bottom-right aligned
	Window       *Window // nil = no window
	SoftmaxScale float32 // 0 = 1/sqrt(HeadDim)
	Softcap      float32 // 0 = off
	// Since 0.5: 0 = DType, or FP8E4M3 / FP8E5M2: K and V (the KV cache)
	// hold fp8 bytes, scaled by DecodeArgs.KDescale/VDescale (Decode only,
	// sm_89+, head dims multiples of 16).
	KVDType DType
	// Since 0.6: 0 = DType, or FP8E4M3 / FP8E5M2 with an fp8 KVDType: Q is
	// fp8 bytes too, the fp8 forward (Forward only, sm_89+), scaled by
	// ForwardArgs.QDescale; O stays DType (FP16 or BF16).
	QDType DType
}

// Config is a validated, immutable attention config, shareable by
// goroutines and runtimes.
type Config struct {
	mu  sync.RWMutex // write-held by Close only
	ptr *C.fa_config
}

// NewConfig validates desc and creates a config.
func NewConfig(desc ConfigDesc) (*Config, error) {
	var d C.fa_config_desc
	d.struct_size = C.size_t(unsafe.Sizeof(d))
	d.dtype = C.FA_DTYPE_FP16
	if desc.DType != 0 {
		d.dtype = C.fa_dtype(desc.DType)
	}
	d.head_dim = C.int32_t(desc.HeadDim)
	d.head_dim_v = C.int32_t(desc.HeadDimV)
	d.num_heads_q = C.int32_t(desc.NumHeadsQ)
	d.num_heads_kv = C.int32_t(desc.NumHeadsKV)
	if desc.NumHeadsKV == 0 {
		d.num_heads_kv = d.num_heads_q
	}
	if desc.Causal {
		d.causal = 1
	}
	d.window_left, d.window_right = -1, -1
	if desc.Window != nil {
		d.window_left = C.int32_t(desc.Window.Left)
		d.window_right = C.int32_t(desc.Window.Right)
	}
	d.softmax_scale = C.float(desc.SoftmaxScale)
	d.softcap = C.float(desc.Softcap)
	d.kv_dtype = C.int64_t(desc.KVDType)
	d.q_dtype = C.int64_t(desc.QDType)
	var e C.fago_err
	var p *C.fa_config
	if err := check(C.fago_config_create(&d, &p, &e), &e); err != nil {
		return nil, err
	}
	c := &Config{ptr: p}
	runtime.SetFinalizer(c, (*Config).Close)
	return c, nil
}

// Close destroys the config; calling it again is a no-op.
func (c *Config) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr != nil {
		C.fa_config_destroy(c.ptr)
		c.ptr = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

// acquire read-locks c for one call and returns its handle. A nil config is
// passed to C as NULL (so the C library reports it); a closed one fails
// here. When err is nil the caller must call c.release().
func (c *Config) acquire(op string) (*C.fa_config, error) {
	if c == nil {
		return nil, nil
	}
	c.mu.RLock()
	if c.ptr == nil {
		c.mu.RUnlock()
		return nil, goErr(StatusInvalidArgument, "%s: config is closed", op)
	}
	return c.ptr, nil
}

func (c *Config) release() {
	if c != nil {
		c.mu.RUnlock()
	}
}

// Generate returns the PTX module the runtime would use for kind of cfg on
// SM sm (80, 86, 87, 89, 90, 100, 103, 110, 120, 121). Needs no GPU.
func Generate(cfg *Config, kind KernelKind, sm int) (string, error) {
	p, err := cfg.acquire("Generate")
	if err != nil {
		return "", err
	}
	defer cfg.release()
	var e C.fago_err
	var buf *C.char
	var n C.size_t
	if err := check(C.fago_generate(p, C.int32_t(kind), C.int32_t(sm), &buf, &n, &e), &e); err != nil {
		return "", err
	}
	defer C.free(unsafe.Pointer(buf))
	return C.GoStringN(buf, C.int(n)), nil
}
