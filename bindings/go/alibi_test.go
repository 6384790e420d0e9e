package flashattn

// ALiBi (ForwardArgs/DecodeArgs.AlibiSlopes, C API 0.5) on the emulator:
// decode with splits and per-sequence slopes (an empty sequence: O = 0, LSE
// = -inf) and a non-causal forward with one row of slopes, against the
// float64 reference with the bias -slope*|i + L - sq - j|, outputs
// poisoned; a misaligned pointer and a short stride are
// StatusInvalidArgument.

import (
	"math"
	"testing"
)

func TestAlibi(t *testing.T) {
	rt := newRT(t)
	const B, SQ, SK, HQ, HKV, D = 2, 3, 150, 4, 2, 32
	slopes := []float32{0.25, 0.0625, 0.5, 0.125, 0.3, 0.05, 1.0, 0.01}
	sd := upload(t, rt, slopes)
	download := func(o, lse *DeviceMemory, n, nl int) ([]uint16, []float32) {
		got := make([]uint16, n)
		gotLSE := make([]float32, nl)
		if err := o.DownloadUint16(got); err != nil {
			t.Fatal(err)
		}
		if err := lse.DownloadFloat32(gotLSE); err != nil {
			t.Fatal(err)
		}
		return got, gotLSE
	}

	// Decode with 3 splits and per-sequence slopes; sequence 1 holds no key.
	cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV, Causal: true})
	p := problem{batch: B, sq: SQ, skMax: SK, hq: HQ, hkv: HKV, d: D, dv: D, causal: true,
		scale: 1 / math.Sqrt(D), kvLen: []int{SK, 0}, alibi: slopes, alibiStride: HQ}
	s := newDecode(t, rt, p, 91)
	o := poisoned(t, rt, uint64(len(s.want))*2)
	lse := poisoned(t, rt, uint64(len(s.wantLSE))*4)
	a := s.args
	a.NumSplits = 3
	a.O = Contiguous(o.Ptr(), SQ, HQ, D)
	a.LSE = lse.Ptr()
	a.AlibiSlopes, a.AlibiSlopesStride = sd.Ptr(), HQ
	if err := rt.Decode(cfg, &a); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	got, gotLSE := download(o, lse, len(s.want), len(s.wantLSE))
	compareO(t, "alibi decode O", got, s.want, 3e-3)
	compareLSE(t, "alibi decode LSE", gotLSE, s.wantLSE)

	// A non-causal forward over every key, one row of slopes for the batch.
	cfgNC := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV})
	p.causal, p.kvLen, p.alibiStride = false, []int{SK, SK}, 0
	s = newDecode(t, rt, p, 92)
	o = poisoned(t, rt, uint64(len(s.want))*2)
	lse = poisoned(t, rt, uint64(len(s.wantLSE))*4)
	f := ForwardArgs{Batch: B, SeqlenQ: SQ, SeqlenK: SK, Q: s.args.Q, K: s.args.KCache,
		V: s.args.VCache, O: Contiguous(o.Ptr(), SQ, HQ, D), LSE: lse.Ptr(), AlibiSlopes: sd.Ptr()}
	if err := rt.Forward(cfgNC, &f); err != nil {
		t.Fatalf("Forward: %v", err)
	}
	got, gotLSE = download(o, lse, len(s.want), len(s.wantLSE))
	compareO(t, "alibi forward O", got, s.want, 3e-3)
	compareLSE(t, "alibi forward LSE", gotLSE, s.wantLSE)

	f.AlibiSlopes = sd.Ptr() + 2
	wantErr(t, rt.Forward(cfgNC, &f), StatusInvalidArgument, "alibi_slopes")
	f.AlibiSlopes, f.AlibiSlopesStride = sd.Ptr(), HQ-1
	wantErr(t, rt.Forward(cfgNC, &f), StatusInvalidArgument, "alibi_slopes_stride")
	a.AlibiSlopes = sd.Ptr() + 1
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "not 4-byte aligned")
}
