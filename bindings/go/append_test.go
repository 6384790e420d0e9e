package flashattn

// KV append with rotary embedding (DecodeArgs.KNew/VNew/Rotary*, C API 0.5):
// the appends (cache checked afterwards) and the rotary_dim rejects are
// tests/features/append.cases (TestFeatures); here what no line describes
// yet: explicit RotaryPositions (equal to the default ones, rows 3 apart
// with a -7 pad: the same result), and an append without VNew or with
// SeqlenNew past SeqlenKMax is StatusInvalidArgument.

import "testing"

func TestDecodeAppendExtra(t *testing.T) {
	rt := newRTsm(t, 80)
	featureLine(t, rt, "decode batch=2 seqlen_q=2 seqlen_k=48 cache_seqlens=30,5 num_heads_q=4 num_heads_kv=2 "+
		"head_dim=64 causal=1 seqlen_new=2 rotary_dim=32 rotary_interleaved=1 num_splits=2 seed=91",
		func(fc *featureCall) {
			fc.dec.RotaryPositions = upload(t, rt, []int32{30, 31, -7, 5, 6, -7}).Ptr()
			fc.dec.RotaryPositionsStride = 3
		})
	const line = "decode seqlen_q=1 seqlen_k=8 cache_seqlens=3 num_heads_q=4 num_heads_kv=2 head_dim=64 " +
		"seqlen_new=1 rotary_dim=32 seed=92"
	featureReject(t, rt, line, func(fc *featureCall) { fc.dec.VNew = Tensor{} }, StatusInvalidArgument, "v_new")
	featureReject(t, rt, line, func(fc *featureCall) { fc.dec.SeqlenNew = 9 }, StatusInvalidArgument,
		"seqlen_new must be in 1..seqlen_k_max")
}
