package flashattn

// Speculative-decoding tree masks (DecodeArgs.TreeMask, C API 0.4) on the
// emulator: random trees per sequence and one for the batch against a
// float64 reference with poisoned outputs; a chain tree without causal is
// causal decoding bit for bit; bad masks are StatusInvalidArgument.

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand"
	"testing"
)

func randomTrees(r *rand.Rand, trees, n int) []bool {
	m := make([]bool, trees*n*n)
	for t := 0; t < trees; t++ {
		parent := make([]int, n)
		for i := 0; i < n; i++ {
			parent[i] = -1
			if i > 0 {
				parent[i] = r.Intn(i+1) - 1
			}
			for j := i; j >= 0; j = parent[j] {
				m[(t*n+i)*n+j] = true
			}
		}
	}
	return m
}

func TestDecodeTreeMask(t *testing.T) {
	rt := newRT(t)
	const B, SQ, SK, HQ, HKV, D = 2, 5, 64, 4, 2, 32
	cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: HQ, NumHeadsKV: HKV})
	r := rand.New(rand.NewSource(33))
	for _, trees := range []int{B, 1} {
		p := problem{batch: B, sq: SQ, skMax: SK, hq: HQ, hkv: HKV, d: D, dv: D,
			scale: 1 / math.Sqrt(D), kvLen: []int{SK, 11}, tree: randomTrees(r, trees, SQ)}
		s := newDecode(t, rt, p, int64(40+trees))
		words := uploadWords(t, rt, PackTreeMask(p.tree, SQ))
		o := poisoned(t, rt, uint64(len(s.want))*2)
		lse := poisoned(t, rt, uint64(len(s.wantLSE))*4)
		a := s.args
		a.NumSplits = 2
		a.O = Contiguous(o.Ptr(), SQ, HQ, D)
		a.LSE = lse.Ptr()
		a.TreeMask = words.Ptr()
		a.TreeMaskStride = [2]int64{SQ * 4, 4}
		if trees == 1 {
			a.TreeMaskStride[0] = 0
		}
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
		compareO(t, "tree decode O", got, s.want, 3e-3)
		compareLSE(t, "tree decode LSE", gotLSE, s.wantLSE)

		if trees == 1 {
			bad := a
			bad.TreeMaskStride[1] = 2
			wantErr(t, rt.Decode(cfg, &bad), StatusInvalidArgument, "tree_mask_stride[1]")
			bad = a
			bad.TreeMask = 0
			wantErr(t, rt.Decode(cfg, &bad), StatusInvalidArgument, "tree_mask is 0")
			bad = a
			bad.TreeMask++
			wantErr(t, rt.Decode(cfg, &bad), StatusInvalidArgument, "not 4-byte aligned")
		}
	}
}

func TestDecodeChainTreeIsCausal(t *testing.T) {
	rt := newRT(t)
	const B, SQ, SK, H, D = 2, 4, 40, 2, 32
	p := problem{batch: B, sq: SQ, skMax: SK, hq: H, hkv: H, d: D, dv: D, kvLen: []int{SK, 9}}
	s := newDecode(t, rt, p, 77)
	chain := make([]bool, SQ*SQ)
	for i := 0; i < SQ; i++ {
		for j := 0; j <= i; j++ {
			chain[i*SQ+j] = true
		}
	}
	words := uploadWords(t, rt, PackTreeMask(chain, SQ))
	run := func(causal bool, tree bool) []byte {
		cfg := newCfg(t, ConfigDesc{HeadDim: D, NumHeadsQ: H, Causal: causal})
		o := poisoned(t, rt, B*SQ*H*D*2)
		a := s.args
		a.O = Contiguous(o.Ptr(), SQ, H, D)
		if tree {
			a.TreeMask, a.TreeMaskStride = words.Ptr(), [2]int64{0, 4}
		}
		if err := rt.Decode(cfg, &a); err != nil {
			t.Fatalf("Decode: %v", err)
		}
		got := make([]uint16, B*SQ*H*D)
		if err := o.DownloadUint16(got); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		binary.Write(&buf, binary.LittleEndian, got)
		return buf.Bytes()
	}
	if !bytes.Equal(run(false, true), run(true, false)) {
		t.Fatal("a chain tree without causal differs from causal decoding")
	}
	if bytes.Equal(run(false, false), run(true, false)) {
		t.Fatal("causal made no difference: the test would not notice a mask doing nothing")
	}
}
