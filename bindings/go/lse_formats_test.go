package flashattn

// LSE interchange (fa_lse_format, C API 0.4): the reduces in every
// input/output pair and a bad output format are
// tests/features/lse_formats.cases (TestFeatures); here the check no line
// describes yet: a bad lse_partial_format.

import "testing"

func TestLSEFormatsExtra(t *testing.T) {
	featureReject(t, newRTsm(t, 80), "reduce batch=1 seqlen_q=1 num_heads_q=2 head_dim_v=32 num_splits=2 seed=17",
		func(fc *featureCall) { fc.red.LSEPartialFormat = 2 }, StatusInvalidArgument,
		"lse_partial_format must be an fa_lse_format")
}
