package flashattn

// ALiBi (ForwardArgs/DecodeArgs.AlibiSlopes, C API 0.5): the forwards,
// decodes and rejects are tests/features/alibi.cases (TestFeatures); here
// the check no line describes yet (a line for alibi.cases, run through the
// same driver): a misaligned decode slopes pointer.

import "testing"

func TestAlibiExtra(t *testing.T) {
	featureLine(t, newRTsm(t, 80), "reject of=decode batch=2 seqlen_q=1 seqlen_k=16 num_heads_q=2 head_dim=32 "+
		"alibi_slopes=batch bad=alibi_slopes_misaligned message=alibi_slopes", nil)
}
