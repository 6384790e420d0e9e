package flashattn

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newRT creates an emulator runtime with a private cache directory.
func newRT(t *testing.T) *Runtime {
	t.Helper()
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheDir: t.TempDir()})
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func newCfg(t *testing.T, d ConfigDesc) *Config {
	t.Helper()
	c, err := NewConfig(d)
	if err != nil {
		t.Fatalf("NewConfig(%+v): %v", d, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantErr checks err is an *Error with status s whose message contains sub.
func wantErr(t *testing.T, err error, s Status, sub string) {
	t.Helper()
	var fe *Error
	if !errors.As(err, &fe) {
		t.Fatalf("want *Error{%v, ~%q}, got %T %v", s, sub, err, err)
	}
	if fe.Status != s || !strings.Contains(fe.Message, sub) {
		t.Fatalf("want status %v with message containing %q, got %v %q", s, sub, fe.Status, fe.Message)
	}
	if !errors.Is(err, s) {
		t.Fatalf("errors.Is(err, %v) is false", s)
	}
}

// randHalf returns n random fp16 values in [-a, a] and their float32 values.
func randHalf(r *rand.Rand, n int, a float32) ([]uint16, []float32) {
	h := make([]uint16, n)
	f := make([]float32, n)
	for i := range h {
		h[i] = Float32ToFP16((r.Float32()*2 - 1) * a)
		f[i] = FP16ToFloat32(h[i])
	}
	return h, f
}

// upload allocates device memory holding src.
func upload(t *testing.T, rt *Runtime, src interface{}) *DeviceMemory {
	t.Helper()
	var n uint64
	switch s := src.(type) {
	case []uint16:
		n = uint64(len(s)) * 2
	case []float32:
		n = uint64(len(s)) * 4
	case []int32:
		n = uint64(len(s)) * 4
	case []uint64:
		n = uint64(len(s)) * 8
	}
	if n == 0 {
		n = 16
	}
	m, err := rt.Malloc(n)
	if err != nil {
		t.Fatalf("Malloc(%d): %v", n, err)
	}
	t.Cleanup(func() { m.Free() })
	switch s := src.(type) {
	case []uint16:
		err = m.UploadUint16(s)
	case []float32:
		err = m.UploadFloat32(s)
	case []int32:
		err = m.UploadInt32(s)
	case []uint64:
		err = m.UploadUint64(s)
	}
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	return m
}

// poisoned allocates bytes filled with 0xff (fp16/fp32 NaN).
func poisoned(t *testing.T, rt *Runtime, bytes uint64) *DeviceMemory {
	t.Helper()
	m, err := rt.Malloc(bytes)
	if err != nil {
		t.Fatalf("Malloc: %v", err)
	}
	t.Cleanup(func() { m.Free() })
	if err := m.Memset(0xff); err != nil {
		t.Fatalf("Memset: %v", err)
	}
	return m
}

// problem is an attention problem for the float64 reference.
type problem struct {
	batch, sq, skMax, hq, hkv, d, dv int
	causal                           bool
	window                           *Window
	scale, softcap                   float64
	kvLen                            []int // valid keys per batch (forward: skMax)
	// tree: decode's tree mask [trees][sq][sq] (trees = batch, or 1 for the
	// whole batch), true = query i sees new token j; nil = none.
	tree []bool
	// alibi: ALiBi slopes, slope of (b, h) at alibi[b*alibiStride+h]; nil = none.
	alibi       []float32
	alibiStride int
	// pFP8: P as the fp8 forward rounds it (each 2^8 e^(s - rowmax) to e4m3,
	// divided by 2^8 and by the unrounded row sum): the yardstick of its
	// tolerance (twice this attention's error).
	pFP8 bool
}

// reference computes O [b, sq, hq, dv] and LSE [b, hq, sq] in float64 from
// q [b, sq, hq, d], k [b, skMax, hkv, d], v [b, skMax, hkv, dv].
func reference(p problem, q, k, v []float32) ([]float64, []float64) {
	o := make([]float64, p.batch*p.sq*p.hq*p.dv)
	lse := make([]float64, p.batch*p.hq*p.sq)
	s := make([]float64, p.skMax)
	for b := 0; b < p.batch; b++ {
		L := p.kvLen[b]
		for h := 0; h < p.hq; h++ {
			hk := h / (p.hq / p.hkv)
			for i := 0; i < p.sq; i++ {
				diag := i + L - p.sq
				m := math.Inf(-1)
				for j := 0; j < L; j++ {
					s[j] = math.Inf(-1)
					if p.causal && j > diag {
						continue
					}
					if jn := j - (L - p.sq); p.tree != nil && jn >= 0 {
						tb := b
						if len(p.tree) == p.sq*p.sq {
							tb = 0
						}
						if !p.tree[(tb*p.sq+i)*p.sq+jn] {
							continue
						}
					}
					if p.window != nil {
						if p.window.Left >= 0 && j < diag-int(p.window.Left) {
							continue
						}
						if !p.causal && p.window.Right >= 0 && j > diag+int(p.window.Right) {
							continue
						}
					}
					acc := 0.0
					for c := 0; c < p.d; c++ {
						acc += float64(q[((b*p.sq+i)*p.hq+h)*p.d+c]) * float64(k[((b*p.skMax+j)*p.hkv+hk)*p.d+c])
					}
					acc *= p.scale
					if p.softcap > 0 {
						acc = p.softcap * math.Tanh(acc/p.softcap)
					}
					if p.alibi != nil {
						acc -= float64(p.alibi[b*p.alibiStride+h]) * math.Abs(float64(diag-j))
					}
					s[j] = acc
					m = math.Max(m, acc)
				}
				li := (b*p.hq+h)*p.sq + i
				if math.IsInf(m, -1) {
					lse[li] = math.Inf(-1)
					continue // O stays 0
				}
				sum := 0.0
				for j := 0; j < L; j++ {
					if !math.IsInf(s[j], -1) {
						sum += math.Exp(s[j] - m)
					}
				}
				lse[li] = m + math.Log(sum)
				for j := 0; j < L; j++ {
					if math.IsInf(s[j], -1) {
						continue
					}
					w := math.Exp(s[j]-m) / sum
					if p.pFP8 {
						w = fp8Value(fp8Quantize(256*math.Exp(s[j]-m), false), false) / 256 / sum
					}
					for c := 0; c < p.dv; c++ {
						o[((b*p.sq+i)*p.hq+h)*p.dv+c] += w * float64(v[((b*p.skMax+j)*p.hkv+hk)*p.dv+c])
					}
				}
			}
		}
	}
	return o, lse
}

// compareO checks fp16 output bits against the reference (every element
// written: NaN poison fails).
func compareO(t *testing.T, what string, got []uint16, want []float64, tol float64) {
	t.Helper()
	compareValues(t, what, decodeBits(FP16, got), want, tol)
}

// decodeBits is the values of fp16 or bf16 bits.
func decodeBits(dt DType, bits []uint16) []float64 {
	out := make([]float64, len(bits))
	for i, h := range bits {
		if dt == BF16 {
			out[i] = float64(BF16ToFloat32(h))
		} else {
			out[i] = float64(FP16ToFloat32(h))
		}
	}
	return out
}

// compareValues checks output values against the reference: within tol plus
// 1e-2 relative, NaN (poison not overwritten) fails.
func compareValues(t *testing.T, what string, got []float64, want []float64, tol float64) {
	t.Helper()
	worst := 0.0
	for i, g := range got {
		d := math.Abs(g - want[i])
		if math.IsNaN(g) || d > tol+1e-2*math.Abs(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, g, want[i])
		}
		worst = math.Max(worst, d)
	}
	t.Logf("%s: %d values, max abs err %.3g", what, len(got), worst)
}

// compareLSE checks fp32 LSE against the reference (-inf must match).
func compareLSE(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	for i, g := range got {
		if math.IsInf(want[i], -1) {
			if !math.IsInf(float64(g), -1) {
				t.Fatalf("%s[%d] = %v, want -inf", what, i, g)
			}
			continue
		}
		if d := math.Abs(float64(g) - want[i]); !(d <= 2e-3*math.Max(1, math.Abs(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, g, want[i])
		}
	}
}

func TestVersion(t *testing.T) {
	want := fmt.Sprintf("%d.%d.%d", HeaderVersionNumber/10000, HeaderVersionNumber/100%100, HeaderVersionNumber%100)
	if Version() != want || VersionNumber() != HeaderVersionNumber {
		t.Fatalf("library %s (%d), header %s (%d)", Version(), VersionNumber(), want, HeaderVersionNumber)
	}
	if StatusInvalidArgument.String() == "" || StatusInvalidArgument.String() == StatusUnsupported.String() {
		t.Fatalf("status strings: %q %q", StatusInvalidArgument, StatusUnsupported)
	}
}

func TestFP16(t *testing.T) {
	// Every binary16 value survives a round trip through float32.
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := FP16ToFloat32(h)
		if f != f {
			if Float32ToFP16(f)&0x7c00 != 0x7c00 || Float32ToFP16(f)&0x3ff == 0 {
				t.Fatalf("NaN %#04x -> %#04x", h, Float32ToFP16(f))
			}
			continue
		}
		if got := Float32ToFP16(f); got != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, got)
		}
	}
	// Random float32 values round to the nearest binary16 (ties to even).
	r := rand.New(rand.NewSource(1))
	for n := 0; n < 200000; n++ {
		f := math.Float32frombits(r.Uint32())
		if f != f {
			continue
		}
		h := Float32ToFP16(f)
		g := float64(FP16ToFloat32(h))
		if math.Abs(float64(f)) >= 65520 { // rounds to infinity
			if !math.IsInf(g, 0) {
				t.Fatalf("%v -> %v, want inf", f, g)
			}
			continue
		}
		// Neighbours of h must not be closer.
		for _, nb := range []uint16{h - 1, h + 1} {
			if nb&0x7fff > 0x7c00 || (h&0x7fff == 0 && nb == 0xffff) {
				continue
			}
			n := float64(FP16ToFloat32(nb))
			if math.Signbit(n) != math.Signbit(g) && g != 0 {
				continue
			}
			if math.Abs(n-float64(f)) < math.Abs(g-float64(f)) ||
				(math.Abs(n-float64(f)) == math.Abs(g-float64(f)) && h&1 == 1) {
				t.Fatalf("%v -> %#04x (%v), but %#04x (%v) is nearer", f, h, g, nb, n)
			}
		}
	}
	if Float32ToFP16(1) != 0x3c00 || Float32ToFP16(-2) != 0xc000 || Float32ToFP16(65504) != 0x7bff ||
		Float32ToFP16(1e6) != 0x7c00 || Float32ToFP16(5.960464477539063e-08) != 0x0001 {
		t.Fatal("known fp16 values")
	}
	if Float32ToBF16(1) != 0x3f80 || BF16ToFloat32(0x4049) != 3.140625 || Float32ToBF16(1.00390625) != 0x3f80 {
		t.Fatal("known bf16 values")
	}
}

func TestRuntimeInfo(t *testing.T) {
	rt := newRT(t)
	info, err := rt.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Backend != BackendEmulator || info.SM != 80 || info.NumSMs < 1 || info.DeviceName == "" {
		t.Fatalf("info %+v", info)
	}
	rt90, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, EmulatorSM: 90, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt90.Close()
	if info, err := rt90.Info(); err != nil || info.SM != 90 {
		t.Fatalf("sm 90 info %+v %v", info, err)
	}
	if err := rt.Synchronize(0); err != nil {
		t.Fatal(err)
	}
	if _, err = NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheMemory, PTXCompiler: PTXCompiler(5)}); err == nil ||
		!strings.Contains(err.Error(), "ptx_compiler") {
		t.Fatalf("bad PTXCompiler: %v", err)
	}
	_, err = NewRuntime(&RuntimeOptions{Backend: Backend(7)})
	wantErr(t, err, StatusInvalidArgument, "fa_runtime_create")
}

func TestCloseTwice(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.Malloc(1024)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := rt.Malloc(256) // left for rt.Close to free
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := m.Free(); err != nil {
			t.Fatalf("Free #%d: %v", i, err)
		}
	}
	wantErr(t, m.UploadFloat32([]float32{1}), StatusInvalidArgument, "freed")
	for i := 0; i < 2; i++ {
		if err := rt.Close(); err != nil {
			t.Fatalf("Runtime.Close #%d: %v", i, err)
		}
		if err := cfg.Close(); err != nil {
			t.Fatalf("Config.Close #%d: %v", i, err)
		}
	}
	if err := m2.Close(); err != nil { // already freed by rt.Close
		t.Fatal(err)
	}
	_, err = rt.Info()
	wantErr(t, err, StatusInvalidArgument, "runtime is closed")
	_, err = Generate(cfg, KernelForward, 80)
	wantErr(t, err, StatusInvalidArgument, "config is closed")
	var nilRT *Runtime
	_, err = nilRT.Malloc(16)
	wantErr(t, err, StatusInvalidArgument, "runtime is nil")
}

func TestGenerate(t *testing.T) {
	cfg := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 8, NumHeadsKV: 2, Causal: true})
	entries := map[KernelKind]string{
		KernelForward: ".entry fa_forward_", KernelDecode: ".entry fa_decode_",
		KernelReduce: ".entry fa_reduce_",
		// fa_backward's kernels (g4: the main kernel loops over the group).
		KernelBackwardPre:  ".entry fa_bwdpre_mma_f16_d64_dv64_g1_",
		KernelBackward:     ".entry fa_backward_mma_f16_d64_dv64_g4_",
		KernelBackwardPost: ".entry fa_bwdpost_mma_f16_d64_dv64_g1_",
	}
	for kind, entry := range entries {
		for _, sm := range []int{80, 86, 89, 90} {
			ptx, err := Generate(cfg, kind, sm)
			if err != nil {
				t.Fatalf("Generate(%d, %d): %v", kind, sm, err)
			}
			want := entry
			if kind == KernelBackward && sm == 90 {
				// sm_90: the main kernel in FlashAttention-3's structure (wgmma).
				want = ".entry fa_backward_wgmma_f16_d64_dv64_g4_"
			}
			if !strings.Contains(ptx, want) || !strings.Contains(ptx, ".address_size 64") {
				t.Fatalf("kind %d sm %d: no %s in %d bytes", kind, sm, want, len(ptx))
			}
			if strings.IndexByte(ptx, 0) >= 0 {
				t.Fatal("NUL inside the PTX string")
			}
			again, _ := Generate(cfg, kind, sm)
			if again != ptx {
				t.Fatal("Generate is not deterministic")
			}
		}
	}
	_, err := Generate(cfg, KernelForward, 75)
	wantErr(t, err, StatusUnsupported, "sm must be")
	_, err = Generate(cfg, KernelKind(9), 80)
	wantErr(t, err, StatusInvalidArgument, "kind must be")
	_, err = Generate(nil, KernelForward, 80)
	wantErr(t, err, StatusInvalidArgument, "cfg is NULL")
}

func TestConfigErrors(t *testing.T) {
	_, err := NewConfig(ConfigDesc{HeadDim: 64, NumHeadsQ: 6, NumHeadsKV: 4})
	wantErr(t, err, StatusInvalidArgument, "num_heads_q (6) must be a multiple of num_heads_kv (4)")
	_, err = NewConfig(ConfigDesc{HeadDim: 12, NumHeadsQ: 2})
	wantErr(t, err, StatusUnsupported, "head_dim must be a multiple of 8")
	_, err = NewConfig(ConfigDesc{HeadDim: 584, NumHeadsQ: 16, NumHeadsKV: 1})
	wantErr(t, err, StatusUnsupported, "fa_config_create: head_dim must be a multiple of 8 in 8..576, got 584")
	_, err = NewConfig(ConfigDesc{HeadDim: 576, HeadDimV: 520, NumHeadsQ: 16, NumHeadsKV: 1})
	wantErr(t, err, StatusUnsupported, "fa_config_create: head_dim_v must be a multiple of 8 in 8..512, got 520")
	_, err = NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2, Window: &Window{-3, 0}})
	wantErr(t, err, StatusInvalidArgument, "window_left")
	_, err = NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2, DType: FP8E4M3})
	wantErr(t, err, StatusInvalidArgument, "dtype")
	_, err = NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2, DType: FP32, KVDType: FP8E4M3})
	wantErr(t, err, StatusUnsupported, "FA_DTYPE_FP32")
	_, err = NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2, SoftmaxScale: float32(math.Inf(1))})
	wantErr(t, err, StatusInvalidArgument, "softmax_scale")
	if !strings.HasPrefix(err.Error(), "flashattn: ") {
		t.Fatalf("Error() = %q", err.Error())
	}
}

func TestMemory(t *testing.T) {
	rt := newRT(t)
	m, err := rt.Malloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if m.Ptr()%256 != 0 || m.Size() != 1000 {
		t.Fatalf("ptr %#x size %d", m.Ptr(), m.Size())
	}
	u := []uint16{1, 2, 0xffff, 0x3c00, 7}
	if err := m.UploadUint16(u); err != nil {
		t.Fatal(err)
	}
	gu := make([]uint16, len(u))
	if err := m.DownloadUint16(gu); err != nil || fmt.Sprint(gu) != fmt.Sprint(u) {
		t.Fatalf("uint16 %v %v", gu, err)
	}
	f := []float32{1.5, -2.25, float32(math.Inf(-1)), 3e-30}
	if err := m.UploadFloat32(f); err != nil {
		t.Fatal(err)
	}
	gf := make([]float32, len(f))
	if err := m.DownloadFloat32(gf); err != nil || fmt.Sprint(gf) != fmt.Sprint(f) {
		t.Fatalf("float32 %v %v", gf, err)
	}
	i32 := []int32{-1, 0, 1 << 30, 42}
	if err := m.UploadInt32(i32); err != nil {
		t.Fatal(err)
	}
	gi := make([]int32, len(i32))
	if err := m.DownloadInt32(gi); err != nil || fmt.Sprint(gi) != fmt.Sprint(i32) {
		t.Fatalf("int32 %v %v", gi, err)
	}
	if err := m.Memset(0x5a); err != nil {
		t.Fatal(err)
	}
	all := make([]uint16, 500)
	if err := m.DownloadUint16(all); err != nil {
		t.Fatal(err)
	}
	for i, v := range all {
		if v != 0x5a5a {
			t.Fatalf("memset: [%d] = %#x", i, v)
		}
	}
	wantErr(t, m.UploadFloat32(make([]float32, 251)), StatusInvalidArgument, "do not fit")
	_, err = rt.Malloc(0)
	wantErr(t, err, StatusInvalidArgument, "fa_malloc")
}

// forwardCase runs one forward problem on rt and checks it against the
// float64 reference.
func forwardCase(t *testing.T, rt *Runtime, cfg *Config, p problem, seed int64) {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	qh, qf := randHalf(r, p.batch*p.sq*p.hq*p.d, 1)
	kh, kf := randHalf(r, p.batch*p.skMax*p.hkv*p.d, 1)
	vh, vf := randHalf(r, p.batch*p.skMax*p.hkv*p.dv, 1)
	p.kvLen = make([]int, p.batch)
	for b := range p.kvLen {
		p.kvLen[b] = p.skMax
	}
	want, wantLSE := reference(p, qf, kf, vf)
	q, k, v := upload(t, rt, qh), upload(t, rt, kh), upload(t, rt, vh)
	o := poisoned(t, rt, uint64(len(want))*2)
	lse := poisoned(t, rt, uint64(len(wantLSE))*4)
	forwardContiguous(t, rt, cfg, p, q, k, v, o, lse)
	got := make([]uint16, len(want))
	gotLSE := make([]float32, len(wantLSE))
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotLSE); err != nil {
		t.Fatal(err)
	}
	compareO(t, "forward O", got, want, 3e-3)
	compareLSE(t, "forward LSE", gotLSE, wantLSE)
}

// forwardContiguous runs Forward on contiguous [b, s, h, d] device tensors
// of problem p, failing the test on an error.
func forwardContiguous(t *testing.T, rt *Runtime, cfg *Config, p problem, q, k, v, o, lse *DeviceMemory) {
	t.Helper()
	a := denseForwardArgs(p, q, k, v, o, lse)
	if err := rt.Forward(cfg, &a); err != nil {
		t.Fatalf("Forward: %v", err)
	}
}

// denseForwardArgs are Forward's arguments for contiguous [b, s, h, d] device
// tensors of problem p.
func denseForwardArgs(p problem, q, k, v, o, lse *DeviceMemory) ForwardArgs {
	return ForwardArgs{
		Batch: int32(p.batch), SeqlenQ: int32(p.sq), SeqlenK: int32(p.skMax),
		Q:   Contiguous(q.Ptr(), int64(p.sq), int64(p.hq), int64(p.d)),
		K:   Contiguous(k.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.d)),
		V:   Contiguous(v.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.dv)),
		O:   Contiguous(o.Ptr(), int64(p.sq), int64(p.hq), int64(p.dv)),
		LSE: lse.Ptr(),
	}
}

func TestForward(t *testing.T) {
	rt := newRT(t)
	cases := []struct {
		desc ConfigDesc
		p    problem
	}{
		{ConfigDesc{HeadDim: 32, NumHeadsQ: 4, NumHeadsKV: 2},
			problem{batch: 2, sq: 37, skMax: 53, hq: 4, hkv: 2, d: 32, dv: 32}},
		{ConfigDesc{HeadDim: 64, NumHeadsQ: 2, NumHeadsKV: 1, Causal: true, SoftmaxScale: 0.2},
			problem{batch: 1, sq: 20, skMax: 45, hq: 2, hkv: 1, d: 64, dv: 64, causal: true}},
		{ConfigDesc{HeadDim: 16, NumHeadsQ: 2, Window: &Window{5, 3}, Softcap: 2},
			problem{batch: 1, sq: 30, skMax: 30, hq: 2, hkv: 2, d: 16, dv: 16, window: &Window{5, 3}, softcap: 2}},
		{ConfigDesc{HeadDim: 128, HeadDimV: 64, NumHeadsQ: 4, NumHeadsKV: 1, Causal: true},
			problem{batch: 2, sq: 130, skMax: 200, hq: 4, hkv: 1, d: 128, dv: 64, causal: true}},
	}
	for i, c := range cases {
		c := c
		t.Run(fmt.Sprintf("case%d", i), func(t *testing.T) {
			cfg := newCfg(t, c.desc)
			c.p.scale = 1 / math.Sqrt(float64(c.p.d))
			if c.desc.SoftmaxScale != 0 {
				c.p.scale = float64(c.desc.SoftmaxScale)
			}
			forwardCase(t, rt, cfg, c.p, int64(i+10))
		})
	}
}

// TestForwardFP32: DType FP32 takes float32 tensors and writes float32 O;
// the reference runs on the inputs rounded to bf16 as the kernel rounds them.
func TestForwardFP32(t *testing.T) {
	rt := newRT(t)
	p := problem{batch: 2, sq: 33, skMax: 47, hq: 4, hkv: 2, d: 64, dv: 64, causal: true}
	p.scale = 1 / math.Sqrt(float64(p.d))
	p.kvLen = []int{p.skMax, p.skMax}
	cfg := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 4, NumHeadsKV: 2, Causal: true, DType: FP32})
	r := rand.New(rand.NewSource(42))
	gen := func(n int) ([]float32, []float32) {
		x, xr := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i] = r.Float32()*2 - 1
			xr[i] = BF16ToFloat32(Float32ToBF16(x[i]))
		}
		return x, xr
	}
	qf, qr := gen(p.batch * p.sq * p.hq * p.d)
	kf, kr := gen(p.batch * p.skMax * p.hkv * p.d)
	vf, vr := gen(p.batch * p.skMax * p.hkv * p.dv)
	want, wantLSE := reference(p, qr, kr, vr)
	q, k, v := upload(t, rt, qf), upload(t, rt, kf), upload(t, rt, vf)
	o := poisoned(t, rt, uint64(len(want))*4)
	lse := poisoned(t, rt, uint64(len(wantLSE))*4)
	forwardContiguous(t, rt, cfg, p, q, k, v, o, lse)
	got := make([]float32, len(want))
	gotLSE := make([]float32, len(wantLSE))
	if err := o.DownloadFloat32(got); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotLSE); err != nil {
		t.Fatal(err)
	}
	maxErr, rounded := 0.0, 0
	for i, g := range got {
		if g != g {
			t.Fatalf("O[%d] not written", i)
		}
		maxErr = math.Max(maxErr, math.Abs(float64(g)-want[i]))
		if BF16ToFloat32(Float32ToBF16(g)) == g {
			rounded++
		}
	}
	if maxErr > 4e-3 { // P in bf16: observed about 1e-3
		t.Fatalf("fp32 forward O: max abs error %g", maxErr)
	}
	if rounded*4 > len(got) {
		t.Fatalf("%d of %d outputs are bf16 numbers: O looks rounded", rounded, len(got))
	}
	compareLSE(t, "fp32 forward LSE", gotLSE, wantLSE)
}

func TestForwardErrors(t *testing.T) {
	rt := newRT(t)
	cfg := newCfg(t, ConfigDesc{HeadDim: 32, NumHeadsQ: 2})
	n := 8 * 2 * 32
	r := rand.New(rand.NewSource(3))
	qh, _ := randHalf(r, n, 1)
	q := upload(t, rt, qh)
	o := poisoned(t, rt, uint64(n)*2)
	good := ForwardArgs{Batch: 1, SeqlenQ: 8, SeqlenK: 8,
		Q: Contiguous(q.Ptr(), 8, 2, 32), K: Contiguous(q.Ptr(), 8, 2, 32),
		V: Contiguous(q.Ptr(), 8, 2, 32), O: Contiguous(o.Ptr(), 8, 2, 32)}

	bad := good
	bad.Q.Stride[3] = 2
	wantErr(t, rt.Forward(cfg, &bad), StatusInvalidArgument, "q.stride[3] must be 1, got 2")
	bad = good
	bad.Q.Data = 0
	wantErr(t, rt.Forward(cfg, &bad), StatusInvalidArgument, "q.data is 0")
	bad = good
	bad.K.Data += 2
	wantErr(t, rt.Forward(cfg, &bad), StatusInvalidArgument, "not 16-byte aligned")
	bad = good
	bad.SeqlenK = 0
	wantErr(t, rt.Forward(cfg, &bad), StatusInvalidArgument, "seqlen_k must be >= 1")
	wantErr(t, rt.Forward(nil, &good), StatusInvalidArgument, "cfg is NULL")
	wantErr(t, rt.Forward(cfg, nil), StatusInvalidArgument, "args is nil")
	// Nothing was written by the rejected calls.
	got := make([]uint16, n)
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	for i, h := range got {
		if h != 0xffff {
			t.Fatalf("o[%d] written by a rejected call: %#x", i, h)
		}
	}
	// The valid call still works, and writes every element.
	if err := rt.Forward(cfg, &good); err != nil {
		t.Fatal(err)
	}
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	for i, h := range got {
		if f := FP16ToFloat32(h); f != f {
			t.Fatalf("o[%d] not written", i)
		}
	}
}

// decodeSetup holds a decode problem on the device.
type decodeSetup struct {
	p                 problem
	args              DecodeArgs
	want, wantLSE     []float64
	outElems, lseElem int
}

func newDecode(t *testing.T, rt *Runtime, p problem, seed int64) *decodeSetup {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	qh, qf := randHalf(r, p.batch*p.sq*p.hq*p.d, 1)
	kh, kf := randHalf(r, p.batch*p.skMax*p.hkv*p.d, 1)
	vh, vf := randHalf(r, p.batch*p.skMax*p.hkv*p.dv, 1)
	want, wantLSE := reference(p, qf, kf, vf)
	lens := make([]int32, p.batch)
	for b, l := range p.kvLen {
		lens[b] = int32(l)
	}
	q, k, v, cl := upload(t, rt, qh), upload(t, rt, kh), upload(t, rt, vh), upload(t, rt, lens)
	return &decodeSetup{p: p, want: want, wantLSE: wantLSE, args: DecodeArgs{
		Batch: int32(p.batch), SeqlenQ: int32(p.sq), SeqlenKMax: int32(p.skMax),
		Q:            Contiguous(q.Ptr(), int64(p.sq), int64(p.hq), int64(p.d)),
		KCache:       Contiguous(k.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.d)),
		VCache:       Contiguous(v.Ptr(), int64(p.skMax), int64(p.hkv), int64(p.dv)),
		CacheSeqlens: cl.Ptr(),
	}}
}

// decodeChecked runs Decode on s with splits (the workspace allocated by
// Decode, O and LSE poisoned first) and checks O and LSE against the
// reference; it returns the arguments used and O.
func decodeChecked(t *testing.T, rt *Runtime, cfg *Config, s *decodeSetup, splits int32) (DecodeArgs, *DeviceMemory) {
	t.Helper()
	o := poisoned(t, rt, uint64(len(s.want))*2)
	lse := poisoned(t, rt, uint64(len(s.wantLSE))*4)
	a := s.args
	a.NumSplits = splits
	a.O = Contiguous(o.Ptr(), int64(s.p.sq), int64(s.p.hq), int64(s.p.dv))
	a.LSE = lse.Ptr()
	if err := rt.Decode(cfg, &a); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	got := make([]uint16, len(s.want))
	gotLSE := make([]float32, len(s.wantLSE))
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotLSE); err != nil {
		t.Fatal(err)
	}
	compareO(t, "decode O", got, s.want, 3e-3)
	compareLSE(t, "decode LSE", gotLSE, s.wantLSE)
	return a, o
}

func TestDecode(t *testing.T) {
	rt := newRT(t)
	cases := []struct {
		desc   ConfigDesc
		p      problem
		splits int32
	}{
		{ConfigDesc{HeadDim: 32, NumHeadsQ: 4, NumHeadsKV: 2},
			problem{batch: 3, sq: 1, skMax: 160, hq: 4, hkv: 2, d: 32, dv: 32, kvLen: []int{0, 17, 160}}, 0},
		{ConfigDesc{HeadDim: 32, NumHeadsQ: 4, NumHeadsKV: 2},
			problem{batch: 3, sq: 1, skMax: 160, hq: 4, hkv: 2, d: 32, dv: 32, kvLen: []int{0, 17, 160}}, 3},
		{ConfigDesc{HeadDim: 64, NumHeadsQ: 2, NumHeadsKV: 1, Causal: true},
			problem{batch: 3, sq: 2, skMax: 96, hq: 2, hkv: 1, d: 64, dv: 64, causal: true, kvLen: []int{1, 0, 70}}, 2},
		{ConfigDesc{HeadDim: 128, NumHeadsQ: 8, NumHeadsKV: 2},
			problem{batch: 2, sq: 1, skMax: 1000, hq: 8, hkv: 2, d: 128, dv: 128, kvLen: []int{1000, 613}}, 0},
		// DeepSeek MLA's shape (0.5): Q/K 576 over one KV head, V/O 512 (two column slices).
		{ConfigDesc{HeadDim: 576, HeadDimV: 512, NumHeadsQ: 16, NumHeadsKV: 1},
			problem{batch: 2, sq: 1, skMax: 200, hq: 16, hkv: 1, d: 576, dv: 512, kvLen: []int{200, 77}}, 2},
	}
	for i, c := range cases {
		c := c
		t.Run(fmt.Sprintf("case%d", i), func(t *testing.T) {
			cfg := newCfg(t, c.desc)
			c.p.scale = 1 / math.Sqrt(float64(c.p.d))
			s := newDecode(t, rt, c.p, int64(i+20))
			a, o := decodeChecked(t, rt, cfg, s, c.splits)
			got := make([]uint16, len(s.want))

			// Partial states only (O.Data 0), merged by DecodeReduce, agree too.
			a.O, a.LSE = Tensor{}, 0
			wsBytes, splits, err := rt.DecodeWorkspaceSize(cfg, &a)
			if err != nil || wsBytes == 0 || splits < 1 || (c.splits > 0 && splits > int(c.splits)) {
				t.Fatalf("DecodeWorkspaceSize = %d, %d, %v", wsBytes, splits, err)
			}
			wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "both 0")
			ws := poisoned(t, rt, wsBytes)
			a.Workspace, a.WorkspaceSize = ws.Ptr(), wsBytes
			if err := rt.Decode(cfg, &a); err != nil {
				t.Fatalf("Decode (partials): %v", err)
			}
			p := c.p
			oElems := uint64(splits * p.batch * p.sq * p.hq * p.dv)
			lseOff := (oElems*4 + 255) / 256 * 256
			if err := o.Memset(0xff); err != nil {
				t.Fatal(err)
			}
			err = rt.DecodeReduce(cfg, &ReduceArgs{
				NumSplits: int32(splits), Batch: int32(p.batch), SeqlenQ: int32(p.sq),
				OPartial: ws.Ptr(),
				OPartialStride: [5]int64{int64(p.batch * p.sq * p.hq * p.dv), int64(p.sq * p.hq * p.dv),
					int64(p.hq * p.dv), int64(p.dv), 1},
				LSEPartial:       ws.Ptr() + lseOff,
				LSEPartialStride: [4]int64{int64(p.batch * p.hq * p.sq), int64(p.hq * p.sq), int64(p.sq), 1},
				O:                Contiguous(o.Ptr(), int64(p.sq), int64(p.hq), int64(p.dv)),
			})
			if err != nil {
				t.Fatalf("DecodeReduce: %v", err)
			}
			if err := o.DownloadUint16(got); err != nil {
				t.Fatal(err)
			}
			compareO(t, "decode partials + reduce O", got, s.want, 3e-3)
		})
	}
}

func TestDecodeReduce(t *testing.T) {
	rt := newRT(t)
	const S, B, SQ, H, DV = 3, 2, 2, 2, 16
	cfg := newCfg(t, ConfigDesc{HeadDim: DV, NumHeadsQ: H})
	r := rand.New(rand.NewSource(5))
	op := make([]float32, S*B*SQ*H*DV)
	for i := range op {
		op[i] = r.Float32()*2 - 1
	}
	lp := make([]float32, S*B*H*SQ)
	ninf := float32(math.Inf(-1))
	for i := range lp {
		lp[i] = r.Float32()*6 - 3
	}
	// Row (b=0, h=1, t=0): one split empty; row (b=1, h=0, t=1): all empty.
	lp[(0*B+0)*H*SQ+1*SQ+0] = ninf
	for s := 0; s < S; s++ {
		lp[(s*B+1)*H*SQ+0*SQ+1] = ninf
	}
	// The merge formula, in float64.
	want := make([]float64, B*SQ*H*DV)
	wantLSE := make([]float64, B*H*SQ)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for tq := 0; tq < SQ; tq++ {
				m := math.Inf(-1)
				for s := 0; s < S; s++ {
					m = math.Max(m, float64(lp[((s*B+b)*H+h)*SQ+tq]))
				}
				if math.IsInf(m, -1) {
					wantLSE[(b*H+h)*SQ+tq] = m
					continue
				}
				sum := 0.0
				for s := 0; s < S; s++ {
					w := math.Exp(float64(lp[((s*B+b)*H+h)*SQ+tq]) - m)
					sum += w
					for c := 0; c < DV; c++ {
						want[((b*SQ+tq)*H+h)*DV+c] += w * float64(op[(((s*B+b)*SQ+tq)*H+h)*DV+c])
					}
				}
				for c := 0; c < DV; c++ {
					want[((b*SQ+tq)*H+h)*DV+c] /= sum
				}
				wantLSE[(b*H+h)*SQ+tq] = m + math.Log(sum)
			}
		}
	}
	opd, lpd := upload(t, rt, op), upload(t, rt, lp)
	o := poisoned(t, rt, uint64(len(want))*2)
	lse := poisoned(t, rt, uint64(len(wantLSE))*4)
	args := ReduceArgs{NumSplits: S, Batch: B, SeqlenQ: SQ,
		OPartial: opd.Ptr(), OPartialStride: [5]int64{B * SQ * H * DV, SQ * H * DV, H * DV, DV, 1},
		LSEPartial: lpd.Ptr(), LSEPartialStride: [4]int64{B * H * SQ, H * SQ, SQ, 1},
		O: Contiguous(o.Ptr(), SQ, H, DV), LSE: lse.Ptr()}
	if err := rt.DecodeReduce(cfg, &args); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, len(want))
	gotLSE := make([]float32, len(wantLSE))
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotLSE); err != nil {
		t.Fatal(err)
	}
	compareO(t, "reduce O", got, want, 1e-3)
	compareLSE(t, "reduce LSE", gotLSE, wantLSE)
	bad := args
	bad.OPartialStride[4] = 3
	wantErr(t, rt.DecodeReduce(cfg, &bad), StatusInvalidArgument, "o_partial_stride[4] must be 1")
	bad = args
	bad.NumSplits = 0
	wantErr(t, rt.DecodeReduce(cfg, &bad), StatusInvalidArgument, "num_splits must be >= 1")
}

func TestCache(t *testing.T) {
	dir := t.TempDir()
	open := func() *Runtime {
		rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheDisk, CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	p := problem{batch: 1, sq: 8, skMax: 8, hq: 1, hkv: 1, d: 16, dv: 16, scale: 0.25}
	cfg := newCfg(t, ConfigDesc{HeadDim: 16, NumHeadsQ: 1})
	rt := open()
	forwardCase(t, rt, cfg, p, 1)
	st, err := rt.CacheStats()
	if err != nil {
		t.Fatal(err)
	}
	if !st.Persistent || st.Misses < 1 || st.Entries < 1 || st.Bytes == 0 || !strings.HasPrefix(st.Path, dir) {
		t.Fatalf("stats after first launch %+v", st)
	}
	// The cold kernel was built under a compile lease; the default cap is on.
	if st.Leases != st.Misses || st.LeaseWaits != 0 || st.Collisions != 0 || st.Resets != 0 || st.MaxBytes == 0 {
		t.Fatalf("lease and cap counters after first launch %+v", st)
	}
	// 0.6: the emulator compiles nothing; its note names what cuda would use.
	if st.CompilerMode != CompilerNone || st.Compiler != "" || st.CubinRefusals != 0 ||
		!strings.HasPrefix(st.CompilerNote, "the emulator runs the PTX") {
		t.Fatalf("compiler fields %+v", st)
	}
	list, err := rt.CacheList()
	if err != nil || len(list) != int(st.Entries) {
		t.Fatalf("CacheList: %d entries (stats say %d), %v", len(list), st.Entries, err)
	}
	hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for _, e := range list {
		if !hex.MatchString(e.Key) || e.Spec == "" || e.SM != 80 || e.PTXBytes == 0 || e.Created.IsZero() || e.Compiler != "" {
			t.Fatalf("entry %+v", e)
		}
	}
	rt.Close()

	rt = open() // a fresh runtime finds the kernel on disk
	defer rt.Close()
	forwardCase(t, rt, cfg, p, 2)
	st, err = rt.CacheStats()
	if err != nil || st.DiskHits < 1 || st.Misses != 0 {
		t.Fatalf("stats after reopening %+v %v", st, err)
	}
	if err := rt.CacheClear(); err != nil {
		t.Fatal(err)
	}
	if st, err = rt.CacheStats(); err != nil || st.Entries != 0 {
		t.Fatalf("after clear %+v %v", st, err)
	}
	if list, err = rt.CacheList(); err != nil || len(list) != 0 {
		t.Fatalf("list after clear: %d %v", len(list), err)
	}
	forwardCase(t, rt, cfg, p, 3) // loaded kernels stay usable
}

func TestConcurrent(t *testing.T) {
	rt := newRT(t)
	cfg := newCfg(t, ConfigDesc{HeadDim: 32, NumHeadsQ: 2, NumHeadsKV: 1, Causal: true})
	p := problem{batch: 1, sq: 24, skMax: 40, hq: 2, hkv: 1, d: 32, dv: 32, causal: true,
		scale: 1 / math.Sqrt(32)}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		g := g
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(fmt.Sprintf("forward%d", g), func(t *testing.T) { forwardCase(t, rt, cfg, p, int64(100+g)) })
		}()
	}
	// Failing calls from many goroutines each get their own message, even
	// though fa_last_error is per OS thread.
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		g := g
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				heads := int32(3 + g)
				_, err := NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: heads * 2, NumHeadsKV: 4})
				want := fmt.Sprintf("num_heads_q (%d) must be a multiple of num_heads_kv (4)", heads*2)
				if heads*2%4 == 0 {
					if err != nil {
						errs <- err.Error()
					}
					continue
				}
				var fe *Error
				if !errors.As(err, &fe) || !strings.Contains(fe.Message, want) {
					errs <- fmt.Sprintf("goroutine %d: got %v, want %q", g, err, want)
					return
				}
				stride := int64(g + 2)
				err = rt.Forward(cfg, &ForwardArgs{Batch: 1, SeqlenQ: 1, SeqlenK: 1,
					Q: Tensor{Data: 256, Stride: [4]int64{64, 64, 32, stride}}})
				want = fmt.Sprintf("q.stride[3] must be 1, got %d", stride)
				if !errors.As(err, &fe) || !strings.Contains(fe.Message, want) {
					errs <- fmt.Sprintf("goroutine %d: got %v, want %q", g, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// Close of a Runtime or a Config while goroutines are inside calls on it
// (issue 9, part 3): Close waits for the calls in flight, calls made after it
// fail with "runtime is closed" / "config is closed", nothing crashes, and
// the race detector (test.sh runs -race) sees no data race.
func TestCloseWhileInUse(t *testing.T) {
	for _, mode := range []string{"runtime", "config", "both"} {
		mode := mode
		t.Run(mode, func(t *testing.T) {
			inFlight := int64(0)
			for round := 0; round < 3; round++ {
				inFlight += closeWhileInUse(t, mode, round)
			}
			// The race was exercised: goroutines were inside calls as Close began.
			if inFlight == 0 {
				t.Fatal("no call was in flight when Close began")
			}
		})
	}
}

// closeWhileInUse runs one round and returns how many goroutines were inside
// a call when Close began.
func closeWhileInUse(t *testing.T, mode string, round int) int64 {
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	cfg, err := NewConfig(ConfigDesc{HeadDim: 32, NumHeadsQ: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Close()
	const S, H, D = 48, 2, 32
	r := rand.New(rand.NewSource(int64(round)))
	qh, _ := randHalf(r, 2*S*H*D, 1)
	q := upload(t, rt, qh)
	o := poisoned(t, rt, S*H*D*2)
	o1 := poisoned(t, rt, 2*H*D*2)
	lse1 := poisoned(t, rt, 2*H*4)
	lens := upload(t, rt, []int32{S, 20})
	calls := map[string]func() error{
		"forward": func() error {
			return rt.Forward(cfg, &ForwardArgs{Batch: 1, SeqlenQ: S, SeqlenK: S,
				Q: Contiguous(q.Ptr(), S, H, D), K: Contiguous(q.Ptr(), S, H, D),
				V: Contiguous(q.Ptr(), S, H, D), O: Contiguous(o.Ptr(), S, H, D)})
		},
		"decode": func() error { // allocates and frees its own workspace
			return rt.Decode(cfg, &DecodeArgs{Batch: 2, SeqlenQ: 1, SeqlenKMax: S,
				Q: Contiguous(q.Ptr(), 1, H, D), KCache: Contiguous(q.Ptr(), S, H, D),
				VCache: Contiguous(q.Ptr(), S, H, D), CacheSeqlens: lens.Ptr(),
				O: Contiguous(o1.Ptr(), 1, H, D), LSE: lse1.Ptr()})
		},
		"memory": func() error {
			m, err := rt.Malloc(4096)
			if err != nil {
				return err
			}
			defer m.Free()
			if err := m.UploadUint16(qh[:2048]); err != nil {
				return err
			}
			back := make([]uint16, 2048)
			if err := m.DownloadUint16(back); err != nil {
				return err
			}
			return m.Memset(0)
		},
		"query": func() error {
			if _, err := rt.CacheStats(); err != nil {
				return err
			}
			_, err := rt.Info()
			return err
		},
		"generate": func() error {
			_, err := Generate(cfg, KernelReduce, 80)
			return err
		},
	}
	usesRuntime := map[string]bool{"forward": true, "decode": true, "memory": true, "query": true}
	usesConfig := map[string]bool{"forward": true, "decode": true, "generate": true}
	affected := func(kind string) bool {
		return (mode != "config" && usesRuntime[kind]) || (mode != "runtime" && usesConfig[kind])
	}
	kinds := []string{"forward", "forward", "decode", "decode", "memory", "query", "generate"}
	var closed int32 // 1 once Close has returned
	var inside int64 // goroutines inside a call now
	var wg sync.WaitGroup
	errs := make(chan string, len(kinds))
	start := make(chan struct{})
	for _, kind := range kinds {
		kind := kind
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for refusedAfter := 0; refusedAfter < 3; {
				wasClosed := atomic.LoadInt32(&closed) == 1
				atomic.AddInt64(&inside, 1)
				err := calls[kind]()
				atomic.AddInt64(&inside, -1)
				if err == nil {
					if wasClosed {
						if affected(kind) {
							errs <- kind + ": a call started after Close succeeded"
						}
						return
					}
					continue
				}
				var fe *Error
				if !errors.As(err, &fe) || fe.Status != StatusInvalidArgument ||
					!(strings.Contains(fe.Message, "runtime is closed") ||
						strings.Contains(fe.Message, "config is closed")) {
					errs <- fmt.Sprintf("%s: %v", kind, err)
					return
				}
				if !affected(kind) {
					errs <- fmt.Sprintf("%s: refused (%v) but it uses nothing closed", kind, err)
					return
				}
				if wasClosed {
					refusedAfter++
				}
			}
		}()
	}
	close(start)
	time.Sleep(time.Duration(20+10*round) * time.Millisecond)
	in := atomic.LoadInt64(&inside)
	if mode != "config" {
		if err := rt.Close(); err != nil {
			t.Errorf("Runtime.Close: %v", err)
		}
	}
	if mode != "runtime" {
		if err := cfg.Close(); err != nil {
			t.Errorf("Config.Close: %v", err)
		}
	}
	atomic.StoreInt32(&closed, 1)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("round %d: %s", round, e)
	}
	return in
}

// DeviceMemory.Free while other goroutines copy to and from the same memory:
// every copy either completes or fails with "memory was freed"; none runs on
// memory already returned to the allocator.
func TestFreeWhileCopying(t *testing.T) {
	rt := newRT(t)
	for round := 0; round < 20; round++ {
		m, err := rt.Malloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		src := make([]float32, 1<<14)
		var wg sync.WaitGroup
		errs := make(chan string, 4)
		for g := 0; g < 4; g++ {
			g := g
			wg.Add(1)
			go func() {
				defer wg.Done()
				dst := make([]float32, 1<<14)
				for {
					var err error
					switch g % 3 {
					case 0:
						err = m.UploadFloat32(src)
					case 1:
						err = m.DownloadFloat32(dst)
					default:
						err = m.Memset(1)
					}
					if err == nil {
						continue
					}
					var fe *Error
					if !errors.As(err, &fe) || !strings.Contains(fe.Message, "memory was freed") {
						errs <- err.Error()
					}
					return
				}
			}()
		}
		time.Sleep(time.Millisecond)
		if err := m.Free(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("round %d: %s", round, e)
		}
	}
}

func TestMain(m *testing.M) {
	if os.Getenv("FLASHATTN_CACHE_DIR") == "" {
		dir, err := os.MkdirTemp("", "flashattn-go-cache")
		if err == nil {
			os.Setenv("FLASHATTN_CACHE_DIR", dir)
			code := m.Run()
			os.RemoveAll(dir)
			os.Exit(code)
		}
	}
	os.Exit(m.Run())
}
