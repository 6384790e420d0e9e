package flashattn

// fp8 KV cache (ConfigDesc.KVDType, DecodeArgs.KDescale/VDescale, C API 0.5)
// on an sm_89 emulator: e4m3 and e5m2 bytes with per-(batch, KV head) and
// per-tensor descales, against the float64 reference over the values the
// bytes hold (decoded here from the formats' definitions), outputs poisoned;
// StatusUnsupported on sm_80, StatusInvalidArgument for a misaligned descale.

import (
	"math"
	"math/rand"
	"testing"
)

func runFP8(t *testing.T, e5m2, perHead bool) {
	rt, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, EmulatorSM: 89, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	const B, SQ, SK, HQ, HKV, D = 2, 2, 80, 4, 2, 64
	kvd := FP8E4M3
	fmax := 448.0
	if e5m2 {
		kvd, fmax = FP8E5M2, 57344.0
	}
	cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV, Causal: true, KVDType: kvd})
	rng := rand.New(rand.NewSource(81))
	lens := []int{SK, 50}
	nd := 1
	if perHead {
		nd = B * HKV
	}
	kd, vd := make([]float32, nd), make([]float32, nd)
	for i := range kd {
		kd[i] = float32(2 / fmax * (0.5 + 1.5*rng.Float64()))
		vd[i] = float32(2 / fmax * (0.5 + 1.5*rng.Float64()))
	}
	cache := func(ds []float32) ([]uint8, []float32) {
		codes := make([]uint8, B*SK*HKV*D)
		vals := make([]float32, len(codes))
		for i := range codes {
			codes[i] = 0x7f // NaN past a sequence: never read
		}
		for b := 0; b < B; b++ {
			for s := 0; s < lens[b]; s++ {
				for h := 0; h < HKV; h++ {
					d := float64(ds[0])
					if perHead {
						d = float64(ds[b*HKV+h])
					}
					for x := 0; x < D; x++ {
						i := ((b*SK+s)*HKV+h)*D + x
						codes[i] = fp8Quantize((4*rng.Float64()-2)/d, e5m2)
						vals[i] = float32(fp8Value(codes[i], e5m2) * d)
					}
				}
			}
		}
		return codes, vals
	}
	kc, kv := cache(kd)
	vc, vv := cache(vd)
	qb := make([]uint16, B*SQ*HQ*D)
	qv := make([]float32, len(qb))
	for i := range qb {
		qb[i] = Float32ToFP16(float32(2*rng.Float64() - 1))
		qv[i] = FP16ToFloat32(qb[i])
	}
	p := problem{batch: B, sq: SQ, skMax: SK, hq: HQ, hkv: HKV, d: D, dv: D, causal: true,
		scale: 1 / math.Sqrt(D), kvLen: lens}
	want, wantLSE := reference(p, qv, kv, vv)
	q, k, v := upload(t, rt, qb), upload(t, rt, bytesAsUint16(kc)), upload(t, rt, bytesAsUint16(vc))
	kdd, vdd := upload(t, rt, kd), upload(t, rt, vd)
	cs := upload(t, rt, []int32{int32(lens[0]), int32(lens[1])})
	o := poisoned(t, rt, uint64(len(want))*2)
	lse := poisoned(t, rt, uint64(len(wantLSE))*4)
	a := DecodeArgs{Batch: B, SeqlenQ: SQ, SeqlenKMax: SK, Q: Contiguous(q.Ptr(), SQ, HQ, D),
		KCache: Contiguous(k.Ptr(), SK, HKV, D), VCache: Contiguous(v.Ptr(), SK, HKV, D),
		CacheSeqlens: cs.Ptr(), NumSplits: 2, O: Contiguous(o.Ptr(), SQ, HQ, D), LSE: lse.Ptr(),
		KDescale: kdd.Ptr(), VDescale: vdd.Ptr()}
	if perHead {
		a.DescaleStride = [2]int64{HKV, 1}
	}
	if err := rt.Decode(cfg, &a); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	got := make([]uint16, len(want))
	gotLSE := make([]float32, len(wantLSE))
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotLSE); err != nil {
		t.Fatal(err)
	}
	compareO(t, "fp8 decode O", got, want, 4e-3)
	compareLSE(t, "fp8 decode LSE", gotLSE, wantLSE)

	bad := a
	bad.KDescale = kdd.Ptr() + 2
	wantErr(t, rt.Decode(cfg, &bad), StatusInvalidArgument, "not 4-byte aligned")

	rt80, err := NewRuntime(&RuntimeOptions{Backend: BackendEmulator, CacheMode: CacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer rt80.Close()
	q8, k8, cs8 := upload(t, rt80, qb), upload(t, rt80, bytesAsUint16(kc)), upload(t, rt80, []int32{SK, 50})
	o8 := poisoned(t, rt80, uint64(len(want))*2)
	a8 := DecodeArgs{Batch: B, SeqlenQ: SQ, SeqlenKMax: SK, Q: Contiguous(q8.Ptr(), SQ, HQ, D),
		KCache: Contiguous(k8.Ptr(), SK, HKV, D), VCache: Contiguous(k8.Ptr(), SK, HKV, D),
		CacheSeqlens: cs8.Ptr(), O: Contiguous(o8.Ptr(), SQ, HQ, D)}
	wantErr(t, rt80.Decode(cfg, &a8), StatusUnsupported, "sm_89")
}

func TestFP8E4M3PerHead(t *testing.T)   { runFP8(t, false, true) }
func TestFP8E5M2PerTensor(t *testing.T) { runFP8(t, true, false) }
