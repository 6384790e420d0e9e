package flashattn

// LSE interchange (fa_lse_format, C API 0.4) on the emulator: partial
// states with natural-log or base-2 (FlashInfer) LSEs merged by
// DecodeReduce in every input/output pair against a float64 merge, outputs
// poisoned first; a bad format is StatusInvalidArgument.

import (
	"math"
	"math/rand"
	"testing"
)

func TestDecodeReduceLSEFormats(t *testing.T) {
	rt := newRT(t)
	const S, B, SQ, H, DV = 3, 2, 2, 2, 16
	cfg := newCfg(t, ConfigDesc{HeadDim: DV, NumHeadsQ: H})
	r := rand.New(rand.NewSource(17))
	op := make([]float32, S*B*SQ*H*DV)
	for i := range op {
		op[i] = r.Float32()*2 - 1
	}
	lnat := make([]float32, S*B*H*SQ) // natural logs [S, B, H, SQ]
	for i := range lnat {
		lnat[i] = r.Float32()*12 - 6
	}
	ninf := float32(math.Inf(-1))
	lnat[(1*B+0)*H*SQ+1*SQ+0] = ninf // one empty split
	for s := 0; s < S; s++ {
		lnat[(s*B+1)*H*SQ+0*SQ+1] = ninf // a row with no state
	}
	for _, f := range []struct{ in, out LSEFormat }{
		{LSENatural, LSENatural}, {LSENatural, LSEBase2}, {LSEBase2, LSENatural}, {LSEBase2, LSEBase2},
	} {
		lp := make([]float32, len(lnat))
		asNat := make([]float64, len(lnat)) // what the handed-over values stand for
		for i, x := range lnat {
			lp[i] = x
			asNat[i] = float64(x)
			if f.in == LSEBase2 {
				lp[i] = float32(float64(x) * math.Log2E)
				asNat[i] = float64(lp[i]) / math.Log2E
			}
		}
		want := make([]float64, B*SQ*H*DV)
		wantLSE := make([]float64, B*H*SQ)
		for b := 0; b < B; b++ {
			for h := 0; h < H; h++ {
				for tq := 0; tq < SQ; tq++ {
					m := math.Inf(-1)
					for s := 0; s < S; s++ {
						m = math.Max(m, asNat[((s*B+b)*H+h)*SQ+tq])
					}
					if math.IsInf(m, -1) {
						wantLSE[(b*H+h)*SQ+tq] = m
						continue
					}
					sum := 0.0
					for s := 0; s < S; s++ {
						w := math.Exp(asNat[((s*B+b)*H+h)*SQ+tq] - m)
						sum += w
						for c := 0; c < DV; c++ {
							want[((b*SQ+tq)*H+h)*DV+c] += w * float64(op[(((s*B+b)*SQ+tq)*H+h)*DV+c])
						}
					}
					for c := 0; c < DV; c++ {
						want[((b*SQ+tq)*H+h)*DV+c] /= sum
					}
					wantLSE[(b*H+h)*SQ+tq] = m + math.Log(sum)
					if f.out == LSEBase2 {
						wantLSE[(b*H+h)*SQ+tq] *= math.Log2E
					}
				}
			}
		}
		opd, lpd := upload(t, rt, op), upload(t, rt, lp)
		o := poisoned(t, rt, uint64(len(want))*2)
		lse := poisoned(t, rt, uint64(len(wantLSE))*4)
		args := ReduceArgs{NumSplits: S, Batch: B, SeqlenQ: SQ,
			OPartial: opd.Ptr(), OPartialStride: [5]int64{B * SQ * H * DV, SQ * H * DV, H * DV, DV, 1},
			LSEPartial: lpd.Ptr(), LSEPartialStride: [4]int64{B * H * SQ, H * SQ, SQ, 1},
			O: Contiguous(o.Ptr(), SQ, H, DV), LSE: lse.Ptr(),
			LSEPartialFormat: f.in, LSEFormat: f.out}
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
		if f.in == LSEBase2 && f.out == LSENatural {
			bad := args
			bad.LSEPartialFormat = 2
			wantErr(t, rt.DecodeReduce(cfg, &bad), StatusInvalidArgument,
				"lse_partial_format must be an fa_lse_format")
			bad = args
			bad.LSEFormat = -1
			wantErr(t, rt.DecodeReduce(cfg, &bad), StatusInvalidArgument,
				"lse_format must be an fa_lse_format")
		}
	}
}
