package flashattn

// fp8 KV cache (ConfigDesc.KVDType, DecodeArgs.KDescale/VDescale, C API 0.5):
// the decodes are tests/features/fp8_kv.cases (TestFeatures); here the
// checks no line describes yet: a misaligned descale is
// StatusInvalidArgument, an fp8 cache on sm_80 StatusUnsupported.

import "testing"

func TestFP8KVBad(t *testing.T) {
	const line = "decode batch=2 seqlen_q=2 seqlen_k=80 cache_seqlens=80,50 num_heads_q=4 num_heads_kv=2 " +
		"head_dim=64 causal=1 kv_dtype=e4m3 descale=batch_heads num_splits=2 seed=81"
	featureReject(t, newRTsm(t, 89), line, func(fc *featureCall) { fc.dec.KDescale += 2 },
		StatusInvalidArgument, "not 4-byte aligned")
	featureReject(t, newRTsm(t, 80), line, func(*featureCall) {}, StatusUnsupported, "sm_89")
}
