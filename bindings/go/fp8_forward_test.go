package flashattn

// The fp8 forward (ConfigDesc.QDType, ForwardArgs.QDescale/KDescale/VDescale,
// C API 0.6) on an sm_89 emulator: e4m3 and e5m2 Q, K and V bytes with
// per-(batch, KV head) and per-tensor descales, against the float64
// reference over the values the bytes hold, O poisoned; StatusInvalidArgument
// for an fp8 Q without an fp8 K/V and a misaligned descale, StatusUnsupported
// on sm_80. Until the fp8 forward kernel lands, Forward answers
// StatusUnsupported "no kernel for ..." or StatusInternal "generator produced
// no PTX for ..."; the numerics then skip (fp8KernelMissing) and run as soon
// as the kernel is there.

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// fp8KernelMissing is true when err says the library has no fp8 forward
// kernel yet: the only errors the numerics may skip on.
func fp8KernelMissing(err error) bool {
	var fe *Error
	if !errors.As(err, &fe) {
		return false
	}
	return (fe.Status == StatusUnsupported && strings.Contains(fe.Message, "no kernel for")) ||
		(fe.Status == StatusInternal && strings.Contains(fe.Message, "produced no PTX"))
}

func runFP8Forward(t *testing.T, qd, kvd, dtype DType, perHead bool) {
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, EmulatorSM: 89, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	const B, SQ, SK, HQ, HKV, D = 2, 40, 70, 4, 2, 64
	cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV, Causal: perHead,
		DType: dtype, QDType: qd, KVDType: kvd})
	rng := rand.New(rand.NewSource(83))
	nd := 1
	if perHead {
		nd = B * HKV
	}
	descales := func(f DType) []float32 {
		fmax := 448.0
		if f == FP8E5M2 {
			fmax = 57344.0
		}
		ds := make([]float32, nd)
		for i := range ds {
			ds[i] = float32(2 / fmax * (0.5 + 1.5*rng.Float64()))
		}
		return ds
	}
	qds, kds, vds := descales(qd), descales(kvd), descales(kvd)
	// data quantises [B, S, H, D] values; head h uses KV head h / (H / HKV).
	data := func(f DType, ds []float32, s, h int) ([]uint8, []float32) {
		codes := make([]uint8, B*s*h*D)
		vals := make([]float32, len(codes))
		for i := range codes {
			d := float64(ds[0])
			if perHead {
				d = float64(ds[i/(s*h*D)*HKV+i/D%h/(h/HKV)])
			}
			codes[i] = fp8Quantize((4*rng.Float64()-2)/d, f == FP8E5M2)
			vals[i] = float32(fp8Value(codes[i], f == FP8E5M2) * d)
		}
		return codes, vals
	}
	qc, qv := data(qd, qds, SQ, HQ)
	kc, kv := data(kvd, kds, SK, HKV)
	vc, vv := data(kvd, vds, SK, HKV)
	p := problem{batch: B, sq: SQ, skMax: SK, hq: HQ, hkv: HKV, d: D, dv: D, causal: perHead,
		scale: 1 / math.Sqrt(D), kvLen: []int{SK, SK}}
	want, _ := reference(p, qv, kv, vv)
	q, k, v := upload(t, rt, bytesAsUint16(qc)), upload(t, rt, bytesAsUint16(kc)), upload(t, rt, bytesAsUint16(vc))
	qdd, kdd, vdd := upload(t, rt, qds), upload(t, rt, kds), upload(t, rt, vds)
	o := poisoned(t, rt, uint64(len(want))*2)
	a := ForwardArgs{Batch: B, SeqlenQ: SQ, SeqlenK: SK, Q: Contiguous(q.Ptr(), SQ, HQ, D),
		K: Contiguous(k.Ptr(), SK, HKV, D), V: Contiguous(v.Ptr(), SK, HKV, D),
		O: Contiguous(o.Ptr(), SQ, HQ, D), QDescale: qdd.Ptr(), KDescale: kdd.Ptr(), VDescale: vdd.Ptr()}
	if perHead {
		a.DescaleStride = [2]int64{HKV, 1}
	}
	bad := a
	bad.QDescale = qdd.Ptr() + 2
	wantErr(t, rt.Forward(cfg, &bad), StatusInvalidArgument, "not 4-byte aligned")
	if err := rt.Forward(cfg, &a); fp8KernelMissing(err) {
		t.Skipf("the fp8 forward kernel has not landed yet: %v", err)
	} else if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	bits := make([]uint16, len(want))
	if err := o.DownloadUint16(bits); err != nil {
		t.Fatal(err)
	}
	// P is rounded to e4m3 in the kernel (2^-4 relative per probability).
	var err2, ref2, errMax, refMax float64
	for i, h := range bits {
		g := float64(FP16ToFloat32(h))
		if dtype == BF16 {
			g = float64(BF16ToFloat32(h))
		}
		if math.IsNaN(g) || math.IsInf(g, 0) {
			t.Fatalf("O[%d] = %v", i, g)
		}
		d := g - want[i]
		err2, ref2 = err2+d*d, ref2+want[i]*want[i]
		errMax, refMax = math.Max(errMax, math.Abs(d)), math.Max(refMax, math.Abs(want[i]))
	}
	if rel := math.Sqrt(err2 / ref2); rel > 3e-2 {
		t.Fatalf("relative L2 error %.3g", rel)
	}
	if errMax > 3e-2*refMax+1e-3 {
		t.Fatalf("max abs error %.3g (max |ref| %.3g)", errMax, refMax)
	}
	t.Logf("fp8 forward: max abs err %.3g, relative L2 %.3g", errMax, math.Sqrt(err2/ref2))
}

func TestFP8ForwardE4M3PerHead(t *testing.T) { runFP8Forward(t, FP8E4M3, FP8E4M3, FP16, true) }
func TestFP8ForwardE5M2PerTensor(t *testing.T) {
	runFP8Forward(t, FP8E5M2, FP8E5M2, BF16, false)
}

func TestFP8ForwardBad(t *testing.T) {
	_, err := NewConfig(ConfigDesc{HeadDim: 64, NumHeadsQ: 2, QDType: FP8E4M3})
	wantErr(t, err, StatusInvalidArgument, "kv_dtype")
	rt80, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt80.Close()
	cfg := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 2, QDType: FP8E4M3, KVDType: FP8E4M3})
	buf := poisoned(t, rt80, 16*2*64)
	a := ForwardArgs{Batch: 1, SeqlenQ: 16, SeqlenK: 16, Q: Contiguous(buf.Ptr(), 16, 2, 64),
		K: Contiguous(buf.Ptr(), 16, 2, 64), V: Contiguous(buf.Ptr(), 16, 2, 64),
		O: Contiguous(poisoned(t, rt80, 2*16*2*64).Ptr(), 16, 2, 64)}
	wantErr(t, rt80.Forward(cfg, &a), StatusUnsupported, "sm_89")
	// A Q descale with a 16-bit Q.
	cfg16 := newCfg(t, ConfigDesc{HeadDim: 64, NumHeadsQ: 2})
	a.QDescale = buf.Ptr()
	wantErr(t, rt80.Forward(cfg16, &a), StatusInvalidArgument, "q_descale")
}
