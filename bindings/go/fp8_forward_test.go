package flashattn

// The fp8 forward (ConfigDesc.QDType, ForwardArgs.QDescale/KDescale/VDescale,
// C API 0.6) on an sm_89 emulator: e4m3 and e5m2 Q, K and V bytes with
// per-(batch, KV head) and per-tensor descales, against the float64
// reference over the values the bytes hold, O poisoned, within the project's
// rule: twice the error of the same attention with P rounded as the kernel
// rounds it (problem.pFP8); StatusInvalidArgument for an fp8 Q without an
// fp8 K/V and a misaligned descale, StatusUnsupported on sm_80.

import (
	"math"
	"math/rand"
	"testing"
)

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
	p.pFP8 = true
	yard, _ := reference(p, qv, kv, vv)
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
	if err := rt.Forward(cfg, &a); err != nil {
		t.Fatalf("Forward: %v", err)
	}
	bits := make([]uint16, len(want))
	if err := o.DownloadUint16(bits); err != nil {
		t.Fatal(err)
	}
	// Within twice the error of P rounded to e4m3 (the yardstick; its O is
	// not rounded to the dtype: 1e-3 more in max abs, as the Python tests).
	var err2, ref2, yard2, errMax, yardMax float64
	for i, h := range bits {
		g := float64(FP16ToFloat32(h))
		if dtype == BF16 {
			g = float64(BF16ToFloat32(h))
		}
		if math.IsNaN(g) || math.IsInf(g, 0) {
			t.Fatalf("O[%d] = %v", i, g)
		}
		d, y := g-want[i], yard[i]-want[i]
		err2, ref2, yard2 = err2+d*d, ref2+want[i]*want[i], yard2+y*y
		errMax, yardMax = math.Max(errMax, math.Abs(d)), math.Max(yardMax, math.Abs(y))
	}
	if math.Sqrt(err2) > math.Max(2*math.Sqrt(yard2), 1e-2*math.Sqrt(ref2)) {
		t.Fatalf("L2 error %.3g over twice the yardstick's %.3g (|ref| %.3g)", math.Sqrt(err2),
			math.Sqrt(yard2), math.Sqrt(ref2))
	}
	if errMax > 2*yardMax+1e-3 {
		t.Fatalf("max abs error %.3g over twice the yardstick's %.3g + 1e-3", errMax, yardMax)
	}
	t.Logf("fp8 forward: max abs err %.3g (yardstick %.3g), L2 %.3g (yardstick %.3g)", errMax, yardMax,
		math.Sqrt(err2), math.Sqrt(yard2))
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
