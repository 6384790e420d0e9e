package flashattn

// Attention sinks (ForwardArgs/DecodeArgs/ReduceArgs.Sinks, C API 0.4.1) on
// the emulator: forward, decode with splits (an empty sequence: O = 0, LSE =
// sink) and a reduce, against the float64 reference of the plain softmax
// turned into the sink softmax (the sink is one more term e^sink[h] of each
// row's denominator with no value: LSE' = logaddexp(LSE, sink), O' = O
// e^(LSE - LSE')), outputs poisoned; a misaligned pointer is
// StatusInvalidArgument.

import (
	"math"
	"testing"
)

func TestSinks(t *testing.T) {
	rt := newRT(t)
	const B, SQ, SK, HQ, HKV, D = 2, 3, 200, 4, 2, 32
	cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV, Causal: true})
	sinks := []float32{1.5, -0.5, 3, float32(math.Inf(-1))}
	sd := upload(t, rt, sinks)
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

	// Decode with 3 splits; sequence 1 holds no key.
	p := problem{batch: B, sq: SQ, skMax: SK, hq: HQ, hkv: HKV, d: D, dv: D, causal: true,
		scale: 1 / math.Sqrt(D), kvLen: []int{SK, 0}}
	s := newDecode(t, rt, p, 77)
	want, wantLSE := withSinks(p, s.want, s.wantLSE, sinks)
	o := poisoned(t, rt, uint64(len(want))*2)
	lse := poisoned(t, rt, uint64(len(wantLSE))*4)
	a := s.args
	a.NumSplits = 3
	a.O = Contiguous(o.Ptr(), SQ, HQ, D)
	a.LSE = lse.Ptr()
	a.Sinks = sd.Ptr()
	if err := rt.Decode(cfg, &a); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	got, gotLSE := download(o, lse, len(want), len(wantLSE))
	compareO(t, "sink decode O", got, want, 3e-3)
	compareLSE(t, "sink decode LSE", gotLSE, wantLSE)
	if gotLSE[(HQ+0)*SQ] != sinks[0] {
		t.Fatalf("empty sequence: LSE %v, want the sink %v", gotLSE[HQ*SQ], sinks[0])
	}

	// Forward over the same tensors, every key.
	p.kvLen = []int{SK, SK}
	s = newDecode(t, rt, p, 78)
	want, wantLSE = withSinks(p, s.want, s.wantLSE, sinks)
	o = poisoned(t, rt, uint64(len(want))*2)
	lse = poisoned(t, rt, uint64(len(wantLSE))*4)
	f := ForwardArgs{Batch: B, SeqlenQ: SQ, SeqlenK: SK, Q: s.args.Q, K: s.args.KCache,
		V: s.args.VCache, O: Contiguous(o.Ptr(), SQ, HQ, D), LSE: lse.Ptr(), Sinks: sd.Ptr()}
	if err := rt.Forward(cfg, &f); err != nil {
		t.Fatalf("Forward: %v", err)
	}
	got, gotLSE = download(o, lse, len(want), len(wantLSE))
	compareO(t, "sink forward O", got, want, 3e-3)
	compareLSE(t, "sink forward LSE", gotLSE, wantLSE)

	// DecodeReduce with sinks over one state per row: the plain softmax.
	op := make([]float32, len(s.want))
	for i, x := range s.want {
		op[i] = float32(x)
	}
	lp := make([]float32, len(s.wantLSE))
	for i, x := range s.wantLSE {
		lp[i] = float32(x)
	}
	opd, lpd := upload(t, rt, op), upload(t, rt, lp)
	o = poisoned(t, rt, uint64(len(want))*2)
	lse = poisoned(t, rt, uint64(len(wantLSE))*4)
	r := ReduceArgs{NumSplits: 1, Batch: B, SeqlenQ: SQ, OPartial: opd.Ptr(),
		OPartialStride: [5]int64{B * SQ * HQ * D, SQ * HQ * D, HQ * D, D, 1},
		LSEPartial:     lpd.Ptr(), LSEPartialStride: [4]int64{B * HQ * SQ, HQ * SQ, SQ, 1},
		O: Contiguous(o.Ptr(), SQ, HQ, D), LSE: lse.Ptr(), Sinks: sd.Ptr()}
	if err := rt.DecodeReduce(cfg, &r); err != nil {
		t.Fatalf("DecodeReduce: %v", err)
	}
	got, gotLSE = download(o, lse, len(want), len(wantLSE))
	compareO(t, "sink reduce O", got, want, 3e-3)
	compareLSE(t, "sink reduce LSE", gotLSE, wantLSE)

	f.Sinks = sd.Ptr() + 2
	wantErr(t, rt.Forward(cfg, &f), StatusInvalidArgument, "sinks")
	a.Sinks = sd.Ptr() + 1
	wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, "not 4-byte aligned")
}
