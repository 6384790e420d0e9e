package flashattn_test

import (
	"fmt"

	"flashattn.dev/flashattn"
)

// With Q = 0 every key gets the same weight, so each output row is the mean
// of the V rows: here (1+2+3+4)/4 = 2.5 in every element.
func Example() {
	rt, err := flashattn.NewRuntime(&flashattn.RuntimeOptions{Backend: flashattn.BackendEmulator})
	if err != nil {
		panic(err)
	}
	defer rt.Close()
	cfg, err := flashattn.NewConfig(flashattn.ConfigDesc{HeadDim: 8, NumHeadsQ: 1})
	if err != nil {
		panic(err)
	}
	defer cfg.Close()
	const S, D = 4, 8
	q, _ := rt.Malloc(S * D * 2)
	v, _ := rt.Malloc(S * D * 2)
	o, _ := rt.Malloc(S * D * 2)
	q.Memset(0)
	vals := make([]float32, S*D)
	for i := range vals {
		vals[i] = float32(i/D + 1)
	}
	v.UploadUint16(flashattn.ToFP16(vals))
	err = rt.Forward(cfg, &flashattn.ForwardArgs{Batch: 1, SeqlenQ: S, SeqlenK: S,
		Q: flashattn.Contiguous(q.Ptr(), S, 1, D), K: flashattn.Contiguous(q.Ptr(), S, 1, D),
		V: flashattn.Contiguous(v.Ptr(), S, 1, D), O: flashattn.Contiguous(o.Ptr(), S, 1, D)})
	if err != nil {
		panic(err)
	}
	out := make([]uint16, S*D)
	o.DownloadUint16(out)
	fmt.Println(flashattn.FromFP16(out)[:D])

	bad := flashattn.Contiguous(q.Ptr(), S, 1, D)
	bad.Stride[3] = 2
	err = rt.Forward(cfg, &flashattn.ForwardArgs{Batch: 1, SeqlenQ: S, SeqlenK: S,
		Q: bad, K: bad, V: bad, O: bad})
	fmt.Println(err)
	// Output:
	// [2.5 2.5 2.5 2.5 2.5 2.5 2.5 2.5]
	// flashattn: invalid argument: fa_launch: q.stride[3] must be 1, got 2
}
