package flashattn

// Speculative-decoding tree masks (DecodeArgs.TreeMask, C API 0.4): the
// decodes and a short row stride are tests/features/tree_mask.cases
// (TestFeatures); here what no line describes: a chain tree without causal
// is causal decoding bit for bit; a null and a misaligned mask with strides
// set are StatusInvalidArgument.

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestDecodeTreeMaskBad(t *testing.T) {
	rt := newRTsm(t, 80)
	const line = "decode batch=2 seqlen_q=5 seqlen_k=64 cache_seqlens=64,11 num_heads_q=4 num_heads_kv=2 " +
		"head_dim=32 tree_mask=shared seed=41"
	featureReject(t, rt, line, func(fc *featureCall) { fc.dec.TreeMask = 0 }, StatusInvalidArgument, "tree_mask is 0")
	featureReject(t, rt, line, func(fc *featureCall) { fc.dec.TreeMask++ }, StatusInvalidArgument, "not 4-byte aligned")
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
