// Command paged_decode decodes over a paged KV cache (vLLM / FlashAttention
// style) on the emulator: 3 sequences of 100, 37 and 64 tokens in pages of 16
// tokens handed out in a shuffled order, GQA 8:2, one new query token each.
// The same cache laid out contiguously must give the same output: it prints
// the max abs difference and PASS, else FAIL (exit status 1).
//
//	go run ./examples/paged_decode
package main

import (
	"fmt"
	"math"
	"math/rand"
	"os"

	"flashattn.dev/flashattn"
)

const (
	batch, headsQ, headsKV, headDim, pageSize = 3, 8, 2, 64, 16
	maxLen                                    = 100
)

func main() {
	ok, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "paged_decode:", err)
	}
	if !ok || err != nil {
		fmt.Println("FAIL")
		os.Exit(1)
	}
	fmt.Println("PASS")
}

func run() (bool, error) {
	lens := []int32{100, 37, 64} // tokens in each sequence's cache
	r := rand.New(rand.NewSource(1))
	values := func(n int) []uint16 {
		f := make([]float32, n)
		for i := range f {
			f[i] = r.Float32()*2 - 1
		}
		return flashattn.ToFP16(f)
	}
	k := values(batch * maxLen * headsKV * headDim) // [batch, maxLen, headsKV, headDim]
	v := values(batch * maxLen * headsKV * headDim)
	q := values(batch * headsQ * headDim) // [batch, 1, headsQ, headDim]

	// The page pool [numPages, pageSize, headsKV, headDim] and the block
	// table: sequence b's token j is token j % pageSize of page
	// blockTable[b*pagesPerSeq + j/pageSize].
	pagesPerSeq := (maxLen + pageSize - 1) / pageSize
	numPages := batch * pagesPerSeq
	blockTable := make([]int32, numPages)
	for i, p := range r.Perm(numPages) {
		blockTable[i] = int32(p)
	}
	row := headsKV * headDim // one token
	kPages := make([]uint16, numPages*pageSize*row)
	vPages := make([]uint16, numPages*pageSize*row)
	for b, n := range lens {
		for j := 0; j < int(n); j++ {
			page := int(blockTable[b*pagesPerSeq+j/pageSize])
			dst, src := (page*pageSize+j%pageSize)*row, (b*maxLen+j)*row
			copy(kPages[dst:dst+row], k[src:src+row])
			copy(vPages[dst:dst+row], v[src:src+row])
		}
	}

	rt, err := flashattn.NewRuntime(&flashattn.RuntimeOptions{Backend: flashattn.BackendEmulator})
	if err != nil {
		return false, err
	}
	defer rt.Close() // also frees the memory below
	cfg, err := flashattn.NewConfig(flashattn.ConfigDesc{HeadDim: headDim, NumHeadsQ: headsQ, NumHeadsKV: headsKV})
	if err != nil {
		return false, err
	}
	defer cfg.Close()
	put := func(n int, fill func(m *flashattn.DeviceMemory) error) *flashattn.DeviceMemory {
		if err != nil {
			return nil
		}
		var m *flashattn.DeviceMemory
		if m, err = rt.Malloc(uint64(n)); err == nil {
			err = fill(m)
		}
		return m
	}
	put16 := func(x []uint16) *flashattn.DeviceMemory {
		return put(2*len(x), func(m *flashattn.DeviceMemory) error { return m.UploadUint16(x) })
	}
	put32 := func(x []int32) *flashattn.DeviceMemory {
		return put(4*len(x), func(m *flashattn.DeviceMemory) error { return m.UploadInt32(x) })
	}
	dq, dkPages, dvPages, dk, dv := put16(q), put16(kPages), put16(vPages), put16(k), put16(v)
	dTable, dLens := put32(blockTable), put32(lens)
	dOut := put(4*len(q), func(m *flashattn.DeviceMemory) error { return m.Memset(0xff) }) // 2 outputs, NaN
	if err != nil {
		return false, err
	}
	oPaged, oContiguous := dOut.Ptr(), dOut.Ptr()+uint64(len(q))*2

	// The paged cache: page tensors and the block table in KV.
	err = rt.Decode(cfg, &flashattn.DecodeArgs{
		Batch: batch, SeqlenQ: 1, SeqlenKMax: int32(pagesPerSeq * pageSize),
		Q:            flashattn.Contiguous(dq.Ptr(), 1, headsQ, headDim),
		KCache:       flashattn.Contiguous(dkPages.Ptr(), pageSize, headsKV, headDim),
		VCache:       flashattn.Contiguous(dvPages.Ptr(), pageSize, headsKV, headDim),
		KV:           flashattn.Paged(dTable.Ptr(), pageSize, int32(numPages), int32(pagesPerSeq)),
		CacheSeqlens: dLens.Ptr(),
		O:            flashattn.Contiguous(oPaged, 1, headsQ, headDim),
	})
	if err != nil {
		return false, err
	}
	// The same cache, contiguous [batch, maxLen, headsKV, headDim].
	err = rt.Decode(cfg, &flashattn.DecodeArgs{
		Batch: batch, SeqlenQ: 1, SeqlenKMax: maxLen,
		Q:            flashattn.Contiguous(dq.Ptr(), 1, headsQ, headDim),
		KCache:       flashattn.Contiguous(dk.Ptr(), maxLen, headsKV, headDim),
		VCache:       flashattn.Contiguous(dv.Ptr(), maxLen, headsKV, headDim),
		CacheSeqlens: dLens.Ptr(),
		O:            flashattn.Contiguous(oContiguous, 1, headsQ, headDim),
	})
	if err != nil {
		return false, err
	}
	out := make([]uint16, 2*len(q))
	if err := dOut.DownloadUint16(out); err != nil {
		return false, err
	}
	got, want := flashattn.FromFP16(out[:len(q)]), flashattn.FromFP16(out[len(q):])
	worst, ok := 0.0, true
	for i := range got {
		d := math.Abs(float64(got[i] - want[i]))
		ok = ok && d <= 2e-3 // NaN (not written) fails
		worst = math.Max(worst, d)
	}
	fmt.Printf("paged decode (page size %d, %d pages, GQA %d:%d) vs contiguous: max abs err %.3g\n",
		pageSize, numPages, headsQ, headsKV, worst)
	return ok, nil
}
