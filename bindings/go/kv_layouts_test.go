package flashattn

// KV cache layouts (C API 0.3) on the emulator; the paged (page sizes 16 and
// 3) and pointer-array decodes and a page size of 0 are
// tests/features/kv_layouts.cases (TestFeatures). Here: paged caches of page
// size 1 and HND pages (shuffled block tables with padded rows), an empty
// pointer-array sequence, and Forward over paged and pointer-array caches
// (chunked prefill with SequsedK), each compared with the same data laid out
// contiguously; batch-invariant decode bit for bit; the library's other
// checks of the new fields.

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

const (
	kvHQ, kvHKV, kvD = 8, 2, 64 // GQA: 4 query heads per KV head
	fp16NaN          = 0x7e00
)

// kvCache is a contiguous cache k/v [batch, skMax, kvHKV, kvD] (fp16 bits and
// values), V NaN past each sequence's length (never read).
type kvCache struct {
	batch, skMax int
	lens         []int
	kh, vh       []uint16
	kf, vf       []float32
}

func newKVCache(r *rand.Rand, batch, skMax int, lens []int) *kvCache {
	c := &kvCache{batch: batch, skMax: skMax, lens: lens}
	c.kh, c.kf = randHalf(r, batch*skMax*kvHKV*kvD, 1)
	c.vh, c.vf = randHalf(r, batch*skMax*kvHKV*kvD, 1)
	for b, n := range lens {
		for i := (b*skMax + n) * kvHKV * kvD; i < (b+1)*skMax*kvHKV*kvD; i++ {
			c.vh[i], c.vf[i] = fp16NaN, float32(math.NaN())
		}
	}
	return c
}

// kvPages is the same cache as shuffled pages: each sequence owns
// ceil(skMax/pageSize) pages in random order, 3 spare pages hold NaN, and
// block table rows are maxPages+2 entries apart with a -1 tail.
type kvPages struct {
	k, v                           []uint16
	table                          []int32
	numPages, maxPages, row, pSize int
	hnd                            bool
}

func newKVPages(r *rand.Rand, c *kvCache, pageSize int, hnd bool) *kvPages {
	mp := (c.skMax + pageSize - 1) / pageSize
	np := c.batch*mp + 3
	perm := r.Perm(np)
	p := &kvPages{numPages: np, maxPages: mp, row: mp + 2, pSize: pageSize, hnd: hnd,
		table: make([]int32, c.batch*(mp+2)),
		k:     make([]uint16, np*pageSize*kvHKV*kvD), v: make([]uint16, np*pageSize*kvHKV*kvD)}
	for i := range p.k {
		p.k[i], p.v[i] = fp16NaN, fp16NaN
	}
	for i := range p.table {
		p.table[i] = -1
	}
	for b := 0; b < c.batch; b++ {
		for i := 0; i < mp; i++ {
			p.table[b*p.row+i] = int32(perm[b*mp+i])
		}
		for j := 0; j < c.skMax; j++ {
			page, tok := int(p.table[b*p.row+j/pageSize]), j%pageSize
			for h := 0; h < kvHKV; h++ {
				src := ((b*c.skMax+j)*kvHKV + h) * kvD
				dst := ((page*pageSize+tok)*kvHKV + h) * kvD
				if hnd {
					dst = ((page*kvHKV+h)*pageSize + tok) * kvD
				}
				copy(p.k[dst:dst+kvD], c.kh[src:src+kvD])
				copy(p.v[dst:dst+kvD], c.vh[src:src+kvD])
			}
		}
	}
	return p
}

// upload returns the KV layout and the K/V page tensors on the device.
func (p *kvPages) upload(t *testing.T, rt *Runtime) (KVCacheLayout, Tensor, Tensor) {
	k, v, table := upload(t, rt, p.k), upload(t, rt, p.v), upload(t, rt, p.table)
	kv := Paged(table.Ptr(), int32(p.pSize), int32(p.numPages), int32(p.maxPages))
	kv.BlockTableStride = int64(p.row)
	if p.hnd {
		return kv, PagesHND(k.Ptr(), int64(p.pSize), kvHKV, kvD), PagesHND(v.Ptr(), int64(p.pSize), kvHKV, kvD)
	}
	return kv, Contiguous(k.Ptr(), int64(p.pSize), kvHKV, kvD), Contiguous(v.Ptr(), int64(p.pSize), kvHKV, kvD)
}

// runDecode decodes into NaN-poisoned O and LSE and returns them.
func runDecode(t *testing.T, rt *Runtime, cfg *Config, a DecodeArgs) ([]uint16, []float32) {
	t.Helper()
	nO := int(a.Batch * a.SeqlenQ * kvHQ * kvD)
	nL := int(a.Batch * kvHQ * a.SeqlenQ)
	o, lse := poisoned(t, rt, uint64(nO)*2), poisoned(t, rt, uint64(nL)*4)
	a.O = Contiguous(o.Ptr(), int64(a.SeqlenQ), kvHQ, kvD)
	a.LSE = lse.Ptr()
	if err := rt.Decode(cfg, &a); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	gotO, gotL := make([]uint16, nO), make([]float32, nL)
	if err := o.DownloadUint16(gotO); err != nil {
		t.Fatal(err)
	}
	if err := lse.DownloadFloat32(gotL); err != nil {
		t.Fatal(err)
	}
	return gotO, gotL
}

// sameAs checks O (every element written, within 2e-3) and LSE (-inf in the
// same places, else within 1e-4) against the contiguous layout's.
func sameAs(t *testing.T, what string, o, oRef []uint16, lse, lseRef []float32) {
	t.Helper()
	worst := 0.0
	for i := range o {
		g, w := float64(FP16ToFloat32(o[i])), float64(FP16ToFloat32(oRef[i]))
		d := math.Abs(g - w)
		if !(d <= 2e-3) { // NaN fails too
			t.Fatalf("%s: O[%d] = %v, contiguous %v", what, i, g, w)
		}
		worst = math.Max(worst, d)
	}
	for i := range lse {
		g, w := float64(lse[i]), float64(lseRef[i])
		if math.IsInf(w, -1) != math.IsInf(g, -1) || (!math.IsInf(w, -1) && !(math.Abs(g-w) <= 1e-4)) {
			t.Fatalf("%s: LSE[%d] = %v, contiguous %v", what, i, g, w)
		}
	}
	t.Logf("%s: max abs err %.3g vs contiguous", what, worst)
}

func kvCfg(t *testing.T, causal bool) *Config {
	return newCfg(t, ConfigDesc{HeadDim: kvD, NumHeadsQ: kvHQ, NumHeadsKV: kvHKV, Causal: causal})
}

// contiguousArgs are decode args over c laid out contiguously.
func contiguousArgs(t *testing.T, rt *Runtime, c *kvCache, q *DeviceMemory, sq int) DecodeArgs {
	lens := make([]int32, c.batch)
	for b, n := range c.lens {
		lens[b] = int32(n)
	}
	k, v := upload(t, rt, c.kh), upload(t, rt, c.vh)
	return DecodeArgs{Batch: int32(c.batch), SeqlenQ: int32(sq), SeqlenKMax: int32(c.skMax),
		Q:      Contiguous(q.Ptr(), int64(sq), kvHQ, kvD),
		KCache: Contiguous(k.Ptr(), int64(c.skMax), kvHKV, kvD),
		VCache: Contiguous(v.Ptr(), int64(c.skMax), kvHKV, kvD), CacheSeqlens: upload(t, rt, lens).Ptr()}
}

func TestPagedDecode(t *testing.T) {
	rt := newRT(t)
	cases := []struct {
		pageSize, sq int
		hnd, causal  bool
	}{{1, 1, false, true}, {16, 1, true, false}} // page sizes 16 and 3 NHD: kv_layouts.cases
	for i, c := range cases {
		c := c
		t.Run(fmt.Sprintf("page%d_hnd%v_causal%v_sq%d", c.pageSize, c.hnd, c.causal, c.sq), func(t *testing.T) {
			r := rand.New(rand.NewSource(int64(40 + i)))
			const batch, skMax = 3, 90
			lens := []int{skMax, 1, skMax - c.pageSize/2 - 5} // full, one key, ends mid-page
			qh, qf := randHalf(r, batch*c.sq*kvHQ*kvD, 1)
			kc := newKVCache(r, batch, skMax, lens)
			cfg := kvCfg(t, c.causal)
			a := contiguousArgs(t, rt, kc, upload(t, rt, qh), c.sq)
			oRef, lseRef := runDecode(t, rt, cfg, a)
			a.KV, a.KCache, a.VCache = newKVPages(r, kc, c.pageSize, c.hnd).upload(t, rt)
			o, lse := runDecode(t, rt, cfg, a)
			sameAs(t, "paged", o, oRef, lse, lseRef)
			want, _ := reference(problem{batch: batch, sq: c.sq, skMax: skMax, hq: kvHQ, hkv: kvHKV, d: kvD,
				dv: kvD, causal: c.causal, scale: 1 / math.Sqrt(kvD), kvLen: lens}, qf, kc.kf, kc.vf)
			compareO(t, "paged vs reference", o, want, 3e-3)
		})
	}
}

func TestPtrArrayDecode(t *testing.T) {
	// One allocation per sequence, each as long as it needs; the last holds
	// no key (O = 0, LSE = -inf). No kv_layouts.cases line has an empty one.
	featureLine(t, newRTsm(t, 80), "decode batch=3 seqlen_q=2 seqlen_k=75 cache_seqlens=75,20,0 num_heads_q=8 "+
		"num_heads_kv=2 head_dim=64 causal=1 kv_layout=ptr_array seed=11", nil)
}

func TestBatchInvariantDecode(t *testing.T) {
	// A sequence of 3000 keys (paged, page size 16) alone and as the last of a
	// batch of 3 (others 4500 and 700 keys): with BatchInvariant the splits are
	// DecodeInvariantSplit keys (2 alone, 3 for the batch's 4500-key capacity)
	// and its O and LSE bits are identical.
	rt := newRT(t)
	cfg := kvCfg(t, false)
	r := rand.New(rand.NewSource(21))
	const L, other0, other1 = 3000, 4500, 700
	qOwn, _ := randHalf(r, kvHQ*kvD, 1)
	own := newKVCache(r, 1, L, []int{L})
	run := func(c *kvCache, q []uint16) ([]uint16, []float32, int) {
		a := contiguousArgs(t, rt, c, upload(t, rt, q), 1)
		a.KV, a.KCache, a.VCache = newKVPages(r, c, 16, false).upload(t, rt)
		a.BatchInvariant = true
		_, splits, err := rt.DecodeWorkspaceSize(cfg, &a)
		if err != nil {
			t.Fatal(err)
		}
		o, lse := runDecode(t, rt, cfg, a)
		n := c.batch - 1
		for _, x := range lse {
			if math.IsInf(float64(x), 0) || x != x {
				t.Fatalf("LSE not finite: %v", x)
			}
		}
		return o[n*kvHQ*kvD:], lse[n*kvHQ:], splits
	}
	oA, lA, sA := run(own, qOwn)
	batch := newKVCache(r, 3, other0, []int{other0, other1, L})
	row := kvHKV * kvD
	copy(batch.kh[2*other0*row:], own.kh)
	copy(batch.vh[2*other0*row:], own.vh)
	q, _ := randHalf(r, 3*kvHQ*kvD, 1)
	copy(q[2*kvHQ*kvD:], qOwn)
	oB, lB, sB := run(batch, q)
	div := func(n int) int { return (n + DecodeInvariantSplit - 1) / DecodeInvariantSplit }
	if sA != div(L) || sB != div(other0) || sA != 2 || sB != 3 {
		t.Fatalf("splits alone %d, in the batch %d; want 2 and 3", sA, sB)
	}
	for i := range oA {
		if oA[i] != oB[i] {
			t.Fatalf("O[%d] bits %#x alone, %#x in the batch", i, oA[i], oB[i])
		}
	}
	for i := range lA {
		if math.Float32bits(lA[i]) != math.Float32bits(lB[i]) {
			t.Fatalf("LSE[%d] %v alone, %v in the batch", i, lA[i], lB[i])
		}
	}
}

func TestChunkedPrefill(t *testing.T) {
	// Forward with 5 queries per sequence, the last tokens of 70, 9 and 41
	// keys (causal, bottom-right) over paged caches (page sizes 16 and 3) and
	// a pointer array, against contiguous K/V with the same SequsedK.
	rt := newRT(t)
	cfg := kvCfg(t, true)
	r := rand.New(rand.NewSource(31))
	const batch, sq, sk = 3, 5, 70
	used := []int{70, 9, 41}
	qh, qf := randHalf(r, batch*sq*kvHQ*kvD, 1)
	kc := newKVCache(r, batch, sk, used)
	q := upload(t, rt, qh)
	k, v := upload(t, rt, kc.kh), upload(t, rt, kc.vh)
	forward := func(a ForwardArgs) ([]uint16, []float32) {
		nO, nL := batch*sq*kvHQ*kvD, batch*kvHQ*sq
		o, lse := poisoned(t, rt, uint64(nO)*2), poisoned(t, rt, uint64(nL)*4)
		a.Batch, a.SeqlenQ, a.SeqlenK = batch, sq, sk
		a.Q, a.O, a.LSE = Contiguous(q.Ptr(), sq, kvHQ, kvD), Contiguous(o.Ptr(), sq, kvHQ, kvD), lse.Ptr()
		a.SequsedK = upload(t, rt, []int32{70, 9, 41}).Ptr()
		if err := rt.Forward(cfg, &a); err != nil {
			t.Fatalf("Forward: %v", err)
		}
		gotO, gotL := make([]uint16, nO), make([]float32, nL)
		if err := o.DownloadUint16(gotO); err != nil {
			t.Fatal(err)
		}
		if err := lse.DownloadFloat32(gotL); err != nil {
			t.Fatal(err)
		}
		return gotO, gotL
	}
	oRef, lseRef := forward(ForwardArgs{K: Contiguous(k.Ptr(), sk, kvHKV, kvD), V: Contiguous(v.Ptr(), sk, kvHKV, kvD)})
	want, _ := reference(problem{batch: batch, sq: sq, skMax: sk, hq: kvHQ, hkv: kvHKV, d: kvD, dv: kvD,
		causal: true, scale: 1 / math.Sqrt(kvD), kvLen: used}, qf, kc.kf, kc.vf)
	compareO(t, "contiguous prefill vs reference", oRef, want, 3e-3)
	for _, ps := range []int{16, 3} {
		var a ForwardArgs
		a.KV, a.K, a.V = newKVPages(r, kc, ps, false).upload(t, rt)
		o, lse := forward(a)
		sameAs(t, fmt.Sprintf("prefill paged %d", ps), o, oRef, lse, lseRef)
	}
	row := kvHKV * kvD
	kp, vp := make([]uint64, batch), make([]uint64, batch)
	for b := 0; b < batch; b++ {
		kp[b] = upload(t, rt, kc.kh[b*sk*row:][:used[b]*row]).Ptr()
		vp[b] = upload(t, rt, kc.vh[b*sk*row:][:used[b]*row]).Ptr()
	}
	o, lse := forward(ForwardArgs{KV: PtrArray(upload(t, rt, kp).Ptr(), upload(t, rt, vp).Ptr()),
		K: SeqTensor(kvHKV, kvD), V: SeqTensor(kvHKV, kvD)})
	sameAs(t, "prefill pointer array", o, oRef, lse, lseRef)
}

func TestKVLayoutErrors(t *testing.T) {
	// The library's checks of the new fields come back as *Error with its
	// message, and nothing is written.
	rt := newRT(t)
	cfg := kvCfg(t, false)
	r := rand.New(rand.NewSource(5))
	kc := newKVCache(r, 2, 64, []int{64, 10})
	qh, _ := randHalf(r, 2*kvHQ*kvD, 1)
	base := contiguousArgs(t, rt, kc, upload(t, rt, qh), 1)
	base.KV, base.KCache, base.VCache = newKVPages(r, kc, 16, false).upload(t, rt)
	o := poisoned(t, rt, 2*kvHQ*kvD*2)
	base.O = Contiguous(o.Ptr(), 1, kvHQ, kvD)
	cases := []struct {
		name, want string
		edit       func(a *DecodeArgs)
	}{
		{"short table stride", "block_table_stride", func(a *DecodeArgs) { a.KV.BlockTableStride = 3 }},
		{"too few pages", "max_pages_per_seq", func(a *DecodeArgs) { a.KV.MaxPagesPerSeq = 3 }},
		{"invariant with splits", "num_splits", func(a *DecodeArgs) { a.BatchInvariant, a.NumSplits = true, 2 }},
		{"layout 3", "fa_kv_layout", func(a *DecodeArgs) { a.KV.Layout = 3 }},
		{"ptr array with k data", "k_cache.data", func(a *DecodeArgs) { a.KV = PtrArray(a.CacheSeqlens, a.CacheSeqlens) }},
	}
	for _, c := range cases {
		a := base
		c.edit(&a)
		wantErr(t, rt.Decode(cfg, &a), StatusInvalidArgument, c.want)
	}
	// Forward: CuSeqlensK with a paged cache (which counts keys with SequsedK).
	f := ForwardArgs{Batch: 2, SeqlenQ: 1, SeqlenK: 64, Q: base.Q, K: base.KCache, V: base.VCache, O: base.O,
		KV: base.KV, CuSeqlensQ: base.CacheSeqlens, CuSeqlensK: base.CacheSeqlens}
	wantErr(t, rt.Forward(cfg, &f), StatusInvalidArgument, "seqused_k")
	got := make([]uint16, 2*kvHQ*kvD)
	if err := o.DownloadUint16(got); err != nil {
		t.Fatal(err)
	}
	for i, h := range got {
		if h != 0xffff {
			t.Fatalf("O[%d] written by a rejected call: %#x", i, h)
		}
	}
	// The valid args decode.
	if err := rt.Decode(cfg, &base); err != nil {
		t.Fatal(err)
	}
}
