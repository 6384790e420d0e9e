package flashattn

// The fp8 forward (ConfigDesc.QDType, ForwardArgs.QDescale/KDescale/VDescale,
// C API 0.6): the forwards are tests/features/fp8_forward.cases
// (TestFeatures); here the checks no line describes yet:
// StatusInvalidArgument for an fp8 Q without an fp8 K/V, a misaligned
// descale and a Q descale with a 16-bit Q, StatusUnsupported on sm_80.

import "testing"

func TestFP8ForwardBad(t *testing.T) {
	const line = "forward batch=2 seqlen_q=40 seqlen_k=70 num_heads_q=4 num_heads_kv=2 head_dim=64 " +
		"q_dtype=e4m3 kv_dtype=e4m3 descale=batch_heads seed=83"
	featureReject(t, newRTsm(t, 89), line, func(fc *featureCall) { fc.fwd.QDescale += 2 },
		StatusInvalidArgument, "not 4-byte aligned")
	rt80 := newRTsm(t, 80)
	featureReject(t, rt80, line, func(*featureCall) {}, StatusUnsupported, "sm_89")
	// A Q descale with a 16-bit Q.
	featureReject(t, rt80, "forward seqlen_q=16 seqlen_k=16 num_heads_q=2 head_dim=64 seed=84",
		func(fc *featureCall) { fc.fwd.QDescale = fc.fwd.Q.Data }, StatusInvalidArgument, "q_descale")
	_, err := NewConfig(ConfigDesc{HeadDim: 64, NumHeadsQ: 2, QDType: FP8E4M3})
	wantErr(t, err, StatusInvalidArgument, "kv_dtype")
}
