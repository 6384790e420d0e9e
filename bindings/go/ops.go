package flashattn

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// Tensor is a 4-D view of device memory: address and strides in elements
// (fa_tensor). Stride[3] must be 1, the others multiples of 8.
type Tensor struct {
	Data   uint64
	Stride [4]int64
}

// Contiguous is a dense row-major view of data with dims [_, d1, d2, d3].
func Contiguous(data uint64, d1, d2, d3 int64) Tensor {
	return Tensor{Data: data, Stride: [4]int64{d1 * d2 * d3, d2 * d3, d3, 1}}
}

func (t Tensor) c() C.fa_tensor {
	var ct C.fa_tensor
	ct.data = C.uint64_t(t.Data)
	for i := 0; i < 4; i++ {
		ct.stride[i] = C.int64_t(t.Stride[i])
	}
	return ct
}

// PagesHND is an NHD view [num_pages, pageSize, heads, dim] of pages stored
// HND ([num_pages, heads, pageSize, dim], FlashInfer's layout): the token and
// head strides of Contiguous swapped.
func PagesHND(data uint64, pageSize, heads, dim int64) Tensor {
	return Tensor{Data: data, Stride: [4]int64{heads * pageSize * dim, dim, pageSize * dim, 1}}
}

// SeqTensor is the K or V tensor of a pointer-array cache (KVPtrArray):
// data 0 and the strides [_, token, head, 1] every sequence's
// [seqlen, heads, dim] tensor shares (Contiguous's for dense ones).
func SeqTensor(heads, dim int64) Tensor {
	return Tensor{Stride: [4]int64{0, heads * dim, dim, 1}}
}

// KVLayout says how K and V are addressed (fa_kv_layout, since 0.3).
type KVLayout int32

// KV cache layouts.
const (
	// KVContiguous: k/v [batch, seqlen_k, heads_kv, dim].
	KVContiguous KVLayout = C.FA_KV_CONTIGUOUS
	// KVPaged: k/v pages [num_pages, page_size, heads_kv, dim], any strides,
	// and a block table.
	KVPaged KVLayout = C.FA_KV_PAGED
	// KVPtrArray: sequence b's keys at KPtrs[b], values at VPtrs[b].
	KVPtrArray KVLayout = C.FA_KV_PTR_ARRAY
)

// DecodeInvariantSplit is the number of keys per split of a decode with
// BatchInvariant (FA_DECODE_INVARIANT_SPLIT).
const DecodeInvariantSplit = C.FA_DECODE_INVARIANT_SPLIT

// KVCacheLayout is fa_kv_cache_layout: how a call finds key j of sequence b.
// The zero value is a contiguous cache. BlockTable, KPtrs and VPtrs are
// device data the caller vouches for (not read by this package): every page
// of a valid key in [0, NumPages), every pointer 16-byte aligned and
// covering its sequence; a bad one is an out-of-bounds read (a launch error
// on the emulator, an illegal address that poisons the runtime on a GPU).
type KVCacheLayout struct {
	Layout KVLayout
	// KVPaged: key j of sequence b is token j % PageSize of page
	// BlockTable[b*BlockTableStride + j/PageSize].
	PageSize         int32  // tokens per page, >= 1
	NumPages         int32  // pages in K and V, >= 1
	MaxPagesPerSeq   int32  // used columns of BlockTable, >= ceil(keys / PageSize)
	BlockTable       uint64 // int32 [batch, MaxPagesPerSeq], 4-byte aligned
	BlockTableStride int64  // elements between rows, >= MaxPagesPerSeq
	// KVPtrArray: uint64 [batch] device addresses of each sequence's
	// [seqlen, heads_kv, dim] keys / values (with the strides of the K / V
	// tensor, whose Data must be 0: see SeqTensor).
	KPtrs, VPtrs uint64
}

// Paged describes a paged cache whose block table rows are maxPagesPerSeq
// entries apart.
func Paged(blockTable uint64, pageSize, numPages, maxPagesPerSeq int32) KVCacheLayout {
	return KVCacheLayout{Layout: KVPaged, PageSize: pageSize, NumPages: numPages,
		MaxPagesPerSeq: maxPagesPerSeq, BlockTable: blockTable, BlockTableStride: int64(maxPagesPerSeq)}
}

// PtrArray describes a pointer-array cache.
func PtrArray(kPtrs, vPtrs uint64) KVCacheLayout {
	return KVCacheLayout{Layout: KVPtrArray, KPtrs: kPtrs, VPtrs: vPtrs}
}

func (l KVCacheLayout) c() C.fa_kv_cache_layout {
	var cl C.fa_kv_cache_layout
	cl.layout = C.int32_t(l.Layout)
	cl.page_size = C.int32_t(l.PageSize)
	cl.num_pages = C.int32_t(l.NumPages)
	cl.max_pages_per_seq = C.int32_t(l.MaxPagesPerSeq)
	cl.block_table = C.uint64_t(l.BlockTable)
	cl.block_table_stride = C.int64_t(l.BlockTableStride)
	cl.k_ptrs = C.uint64_t(l.KPtrs)
	cl.v_ptrs = C.uint64_t(l.VPtrs)
	return cl
}

// ForwardArgs are the arguments of Runtime.Forward (fa_forward_args).
// Q [batch, seqlen_q, heads_q, dim], K/V [batch, seqlen_k, heads_kv, dim]
// (or as KV says), O [batch, seqlen_q, heads_q, dim_v], all of the config's
// dtype.
type ForwardArgs struct {
	Batch, SeqlenQ, SeqlenK int32
	Q, K, V, O              Tensor
	LSE                     uint64 // fp32 [batch, num_heads_q, seqlen_q]; 0 = none
	CuSeqlensQ, CuSeqlensK  uint64 // int32 [batch+1] prefix sums (varlen), or 0
	// KV: a paged or pointer-array cache makes this chunked prefill (the
	// queries are the last tokens of each sequence); such caches take their
	// key counts from SequsedK, not CuSeqlensK. Zero value: contiguous.
	KV KVCacheLayout
	// SequsedK: int32 [batch] or 0: sequence b has keys 0..SequsedK[b]-1
	// (clamped to [0, SeqlenK]); 0 = SeqlenK keys each. Not with CuSeqlensK.
	SequsedK uint64
	// Since 0.4.1, attention sinks (gpt-oss): fp32 [num_heads_q], 4-byte
	// aligned, or 0 = none. One natural-log logit per query head joins every
	// row's softmax denominator and adds no value: O = sum_j e^(s_j) v_j /
	// (sum_j e^(s_j) + e^(Sinks[h])), s_j = scale * q.k_j (after softcap),
	// the sink neither scaled nor masked; the LSE includes it (a row with no
	// key: O = 0, LSE = Sinks[h]).
	Sinks uint64
	// Since 0.5, ALiBi: fp32 slopes, 4-byte aligned, or 0 = none; the slope
	// of (b, h) is AlibiSlopes[b*AlibiSlopesStride + h] (stride 0: one
	// [num_heads_q] row for the batch, else >= num_heads_q). The logit of
	// query i, key j loses slope*|i + seqlen_k - seqlen_q - j| (after
	// softcap, per sequence), causal or not; the sink is not biased.
	AlibiSlopes       uint64
	AlibiSlopesStride int64
	// Since 0.6, the fp8 forward (ConfigDesc.QDType and KVDType fp8; Q, K
	// and V hold fp8 bytes, O is the config's DType): fp32 descales, 4-byte
	// aligned, or 0 = 1.0; an element of (b, h_kv) is fp8(byte) *
	// Descale[b*DescaleStride[0] + h_kv*DescaleStride[1]] ({0, 0}: one value
	// per tensor; FlashAttention-3's [batch, num_heads_kv]: {num_heads_kv,
	// 1}); a query head uses its KV head's QDescale.
	QDescale, KDescale, VDescale uint64
	DescaleStride                [2]int64
	// Since 0.8, the persistent sm_90a forward's work counter, or 0 = none:
	// device memory of at least ForwardWorkspaceSize bytes (8: two uint32),
	// 8-byte aligned, zeroed once before its first use (DeviceMemory.Memset(0)
	// after Malloc); every launch that uses it leaves it zero again, so it
	// serves back-to-back launches with no memset. One per stream: not to be
	// shared by launches that may run at the same time. With it the
	// persistent kernel (on a runtime created with
	// FLASHATTN_SM90_PERSISTENT=1 in the environment) hands out work items
	// dynamically; with 0 it keeps its static order. From byte 256 it holds
	// the split-KV forward's partial states when it is 256-byte aligned and
	// as large as ForwardWorkspaceSize says (else the launch runs unsplit);
	// every other kernel ignores it. A workspace that was not zero gives
	// wrong output.
	Workspace     uint64
	WorkspaceSize uint64 // bytes at Workspace: >= 8 with one, 0 without
	Stream        uintptr
}

// acquireWith read-locks rt and cfg for one call (see Runtime.acquire and
// Config.acquire) and returns their handles; when err is nil the caller
// must call release.
func (rt *Runtime) acquireWith(cfg *Config, op string) (p *C.fa_runtime, cp *C.fa_config, release func(), err error) {
	if p, err = rt.acquire(op); err != nil {
		return nil, nil, nil, err
	}
	if cp, err = cfg.acquire(op); err != nil {
		rt.mu.RUnlock()
		return nil, nil, nil, err
	}
	return p, cp, func() { cfg.release(); rt.mu.RUnlock() }, nil
}

// c is a as fa_forward_args.
func (a *ForwardArgs) c() C.fa_forward_args {
	var ca C.fa_forward_args
	ca.struct_size = C.size_t(unsafe.Sizeof(ca))
	ca.batch = C.int32_t(a.Batch)
	ca.seqlen_q = C.int32_t(a.SeqlenQ)
	ca.seqlen_k = C.int32_t(a.SeqlenK)
	ca.q, ca.k, ca.v, ca.o = a.Q.c(), a.K.c(), a.V.c(), a.O.c()
	ca.lse = C.uint64_t(a.LSE)
	ca.cu_seqlens_q = C.uint64_t(a.CuSeqlensQ)
	ca.cu_seqlens_k = C.uint64_t(a.CuSeqlensK)
	ca.kv = a.KV.c()
	ca.seqused_k = C.uint64_t(a.SequsedK)
	ca.sinks = C.uint64_t(a.Sinks)
	ca.alibi_slopes = C.uint64_t(a.AlibiSlopes)
	ca.alibi_slopes_stride = C.int64_t(a.AlibiSlopesStride)
	ca.q_descale = C.uint64_t(a.QDescale)
	ca.k_descale = C.uint64_t(a.KDescale)
	ca.v_descale = C.uint64_t(a.VDescale)
	ca.descale_stride[0] = C.int64_t(a.DescaleStride[0])
	ca.descale_stride[1] = C.int64_t(a.DescaleStride[1])
	ca.workspace = C.uint64_t(a.Workspace)
	ca.workspace_size = C.size_t(a.WorkspaceSize)
	return ca
}

// Forward computes O = softmax(scale * Q K^T) V (fa_launch). Errors: an
// *Error with the library's status (StatusInvalidArgument for sizes,
// strides, alignment and KV layout fields, and a Workspace not 8-byte
// aligned or a WorkspaceSize under 8 with one / not 0 without one: the
// message names "workspace" / "workspace_size"; nothing is written then).
func (rt *Runtime) Forward(cfg *Config, a *ForwardArgs) error {
	if a == nil {
		return goErr(StatusInvalidArgument, "Forward: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "Forward")
	if err != nil {
		return err
	}
	defer release()
	ca := a.c()
	var e C.fago_err
	return check(C.fago_launch(p, cp, &ca, C.uint64_t(a.Stream), &e), &e)
}

// ForwardWorkspaceSize returns the bytes of ForwardArgs.Workspace Forward
// uses for a on rt (fa_forward_workspace_size, since 0.8): 8 when it would
// run on the persistent sm_90a kernel (rt created with
// FLASHATTN_SM90_PERSISTENT=1 on an sm_90 device), which then takes its
// work items from the workspace's counter; 256 plus the split-KV partial
// states when it would split the keys of a fixed-length launch whose CTAs
// leave SMs idle (FLASHATTN_FORWARD_SPLITS=0: never); else 0 (a workspace
// given is ignored). Reads only a's host fields (sizes, strides, layout, which
// pointers are set; not Workspace), touches no memory. Errors: an *Error
// with StatusInvalidArgument for sizes and strides Forward would refuse.
func (rt *Runtime) ForwardWorkspaceSize(cfg *Config, a *ForwardArgs) (uint64, error) {
	if a == nil {
		return 0, goErr(StatusInvalidArgument, "ForwardWorkspaceSize: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "ForwardWorkspaceSize")
	if err != nil {
		return 0, err
	}
	defer release()
	ca := a.c()
	var n C.size_t
	var e C.fago_err
	if err := check(C.fago_forward_workspace_size(p, cp, &ca, &n, &e), &e); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// BackwardArgs are the arguments of Runtime.Backward (fa_backward_args,
// since 0.9): the forward as given to Forward (Fwd, with O its output and
// LSE its LSE, both required; contiguous K/V, no SequsedK; Fwd.Workspace
// and Fwd.Stream are ignored) and the upstream gradient DOut (like Fwd.O).
// DQ, DK and DV are written, like Fwd.Q, Fwd.K (summed over each KV head's
// query heads with GQA) and Fwd.V; all of the config's dtype.
type BackwardArgs struct {
	Fwd        ForwardArgs
	DOut       Tensor
	DQ, DK, DV Tensor
	// DSinks: fp32 [num_heads_q], written, with Fwd.Sinks (required then):
	// DSinks[h] = -sum over the head's rows of e^(Sinks[h] - LSE_i) D_i,
	// D_i = rowsum(dO_i o O_i); else 0.
	DSinks uint64
	// Workspace: BackwardWorkspaceSize bytes, 256-byte aligned (Malloc's
	// are): fp32 dQ accumulators and row statistics, contents on entry do
	// not matter; not shared by launches that may run at the same time.
	Workspace     uint64
	WorkspaceSize uint64
	// Deterministic: the same bits on every run (dQ summed over key blocks
	// in a fixed order); false: atomic accumulation, faster.
	Deterministic bool
	Stream        uintptr
}

// c is a as fa_backward_args.
func (a *BackwardArgs) c() C.fa_backward_args {
	var ca C.fa_backward_args
	ca.struct_size = C.size_t(unsafe.Sizeof(ca))
	ca.fwd = a.Fwd.c()
	ca.fwd.workspace, ca.fwd.workspace_size = 0, 0
	ca.dout, ca.dq, ca.dk, ca.dv = a.DOut.c(), a.DQ.c(), a.DK.c(), a.DV.c()
	ca.dsinks = C.uint64_t(a.DSinks)
	ca.workspace = C.uint64_t(a.Workspace)
	ca.workspace_size = C.size_t(a.WorkspaceSize)
	if a.Deterministic {
		ca.deterministic = 1
	}
	return ca
}

// Backward writes dQ, dK and dV (and DSinks) of the forward in a.Fwd for the
// upstream gradient a.DOut (fa_backward, since 0.9; FlashAttention-2's
// backward: P recomputed from Q, K and the forward's LSE), under the
// config's causal, window, softcap, scale and GQA; asynchronously on
// a.Stream (the emulator: synchronously). Errors: an *Error with the
// library's status: StatusInvalidArgument for sizes, strides and alignment
// (the forward's checks prefixed "fwd: "), Fwd.O or Fwd.LSE 0, DSinks
// missing with sinks, a workspace not 256-byte aligned or smaller than
// BackwardWorkspaceSize ("workspace ..."); StatusUnsupported for fp8 and
// fp32 configs, head dims past 256 (past 128: multiples of 16), paged or pointer-array K/V. Nothing is
// written when an argument is rejected.
func (rt *Runtime) Backward(cfg *Config, a *BackwardArgs) error {
	if a == nil {
		return goErr(StatusInvalidArgument, "Backward: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "Backward")
	if err != nil {
		return err
	}
	defer release()
	ca := a.c()
	var e C.fago_err
	return check(C.fago_backward(p, cp, &ca, C.uint64_t(a.Stream), &e), &e)
}

// BackwardWorkspaceSize returns the bytes of BackwardArgs.Workspace Backward
// uses for a on rt (fa_backward_workspace_size, since 0.9). Reads only a's
// host fields, touches no memory. Errors: as Backward's argument checks.
func (rt *Runtime) BackwardWorkspaceSize(cfg *Config, a *BackwardArgs) (uint64, error) {
	if a == nil {
		return 0, goErr(StatusInvalidArgument, "BackwardWorkspaceSize: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "BackwardWorkspaceSize")
	if err != nil {
		return 0, err
	}
	defer release()
	ca := a.c()
	var n C.size_t
	var e C.fago_err
	if err := check(C.fago_backward_workspace_size(p, cp, &ca, &n, &e), &e); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// DecodeArgs are the arguments of Runtime.Decode (fa_decode_args). Q
// [batch, seqlen_q, heads_q, dim]; KCache/VCache [batch, seqlen_k_max,
// heads_kv, dim(_v)], or pages / SeqTensor views as KV says; O [batch,
// seqlen_q, heads_q, dim_v].
type DecodeArgs struct {
	Batch, SeqlenQ, SeqlenKMax int32 // KVPaged: SeqlenKMax <= MaxPagesPerSeq * PageSize
	Q, KCache, VCache          Tensor
	CacheSeqlens               uint64 // int32 [batch], each clamped to [0, SeqlenKMax]
	NumSplits                  int32  // 0 = automatic
	// Workspace for the partial states; 0 = Decode allocates and frees one.
	Workspace     uint64
	WorkspaceSize uint64
	O             Tensor        // O.Data 0: leave the partial states in Workspace
	LSE           uint64        // fp32 [batch, num_heads_q, seqlen_q]; 0 = none
	KV            KVCacheLayout // zero value: contiguous
	// BatchInvariant: splits of DecodeInvariantSplit keys, so a sequence's
	// output bits do not depend on the rest of the batch (NumSplits must be 0).
	BatchInvariant bool
	// Since 0.4, speculative decoding: a tree mask among the new tokens, or
	// 0 = none. 32-bit words [batch or 1, seqlen_q, words] (PackTreeMask):
	// query i of sequence b sees new token j (key CacheSeqlens[b] - SeqlenQ
	// + j) iff bit j % 32 of word j / 32 of row (b, i) is set; the cached
	// prefix stays visible, the config's causal and window apply on top.
	// 4-byte aligned.
	TreeMask uint64
	// Bytes between sequences (0 = one mask for the batch) and between query
	// rows (a multiple of 4, >= 4 * ceil(SeqlenQ / 32)).
	TreeMaskStride [2]int64
	// Since 0.4.1: attention sinks as in ForwardArgs.Sinks, or 0; each row's
	// sink joins its denominator once, in the combine (O.Data must be set).
	Sinks uint64
	// Since 0.5: ALiBi slopes as in ForwardArgs (new token i of sequence b,
	// key j: bias -slope*|i + L - seqlen_q - j|, L = CacheSeqlens[b], plus
	// SeqlenNew with an append), or 0.
	AlibiSlopes       uint64
	AlibiSlopesStride int64
	// Since 0.5, an fp8 KV cache (ConfigDesc.KVDType): fp32 descales, 4-byte
	// aligned, or 0 = 1.0; (b, h_kv) at element b * DescaleStride[0] + h_kv *
	// DescaleStride[1] ({0, 0}: one value per tensor).
	KDescale, VDescale uint64
	DescaleStride      [2]int64
	// Since 0.5, KV append with rotary embedding (as FlashAttention's
	// flash_attn_with_kvcache), in the same launch: with KNew.Data != 0 the
	// SeqlenNew new keys KNew [batch, seqlen_new, heads_kv, dim] and values
	// VNew [batch, seqlen_new, heads_kv, dim_v] (config dtype) of sequence b
	// are written into the cache (any KV layout) at positions
	// CacheSeqlens[b] .. CacheSeqlens[b] + SeqlenNew - 1 and attended to.
	// CacheSeqlens are then the lengths BEFORE the append (clamped to [0,
	// SeqlenKMax - SeqlenNew]; not updated): the cache needs room for
	// CacheSeqlens[b] + SeqlenNew keys. KNew.Data 0 = no append (every
	// field below zero).
	KNew, VNew Tensor
	SeqlenNew  int32 // 1..SeqlenKMax with KNew
	// RotaryDim > 0 rotates Q and the new keys first (RoPE; a multiple of
	// 16, <= head_dim): pair (x0, x1) = columns (i, i + RotaryDim/2)
	// (GPT-NeoX) or (2i, 2i+1) (GPT-J, RotaryInterleaved) at position p
	// becomes (x0 cos - x1 sin, x0 sin + x1 cos) in fp32 (exact rounding in
	// flashattn.h), cos/sin = RotaryCos/RotarySin[p][i], then rounded to the
	// cache dtype; columns >= RotaryDim are copied. New token t of sequence
	// b is at p = CacheSeqlens[b] + t, query t likewise when causal or
	// windowed (else at CacheSeqlens[b]), unless RotaryPositions is set.
	RotaryDim int32
	// RotaryCos, RotarySin: [SeqlenRo, RotaryDim / 2] contiguous, of
	// RotaryDType (FP32, or the config's dtype; 0 = FP32), element-aligned.
	RotaryCos, RotarySin uint64
	SeqlenRo             int32 // rows of the tables, >= 1 (later positions read the last row)
	RotaryInterleaved    bool  // GPT-J pairs (2i, 2i+1); false = GPT-NeoX
	RotaryDType          DType
	// RotaryPositions: int32 [batch, max(SeqlenQ, SeqlenNew)] or 0: query /
	// new token t of sequence b is at RotaryPositions[b *
	// RotaryPositionsStride + t] (elements; >= 0). 4-byte aligned.
	RotaryPositions       uint64
	RotaryPositionsStride int64
	// Since 0.8: SplitCounters, int32 counters the caller zeroed once (every
	// Decode leaves them zero), at least DecodeSplitCounters(batch,
	// numHeadsQ, numHeadsKV, seqlenQ) of them in SplitCountersSize bytes,
	// 4-byte aligned: the combine fused into the decode kernel (one
	// launch). 0 = two launches.
	SplitCounters     uint64
	SplitCountersSize uint64
	Stream            uintptr
}

// DecodeSplitCounters is the int32 counters DecodeArgs.SplitCounters must
// hold (flashattn.h's FA_DECODE_SPLIT_COUNTERS).
func DecodeSplitCounters(batch, numHeadsQ, numHeadsKV, seqlenQ int) int {
	return batch * numHeadsKV * ((numHeadsQ/numHeadsKV*seqlenQ + 15) / 16)
}

// PackTreeMask packs bool masks [trees][seqlenQ][seqlenQ] (true = query i
// sees new token j) into rows of ceil(seqlenQ / 32) little-endian uint32
// words, the layout DecodeArgs.TreeMask reads (the bytes of
// numpy.packbits(bitorder="little"), rows padded to whole words). Upload the
// result and set TreeMaskStride to {seqlenQ * words * 4 (or 0 for one
// tree), words * 4}.
func PackTreeMask(bits []bool, seqlenQ int) []uint32 {
	if seqlenQ <= 0 {
		return nil
	}
	words := (seqlenQ + 31) / 32
	rows := len(bits) / seqlenQ
	out := make([]uint32, rows*words)
	for r := 0; r < rows; r++ {
		for j := 0; j < seqlenQ; j++ {
			if bits[r*seqlenQ+j] {
				out[r*words+j/32] |= 1 << (j % 32)
			}
		}
	}
	return out
}

func (a *DecodeArgs) c() C.fa_decode_args {
	var ca C.fa_decode_args
	ca.struct_size = C.size_t(unsafe.Sizeof(ca))
	ca.batch = C.int32_t(a.Batch)
	ca.seqlen_q = C.int32_t(a.SeqlenQ)
	ca.seqlen_k_max = C.int32_t(a.SeqlenKMax)
	ca.q, ca.k_cache, ca.v_cache, ca.o = a.Q.c(), a.KCache.c(), a.VCache.c(), a.O.c()
	ca.cache_seqlens = C.uint64_t(a.CacheSeqlens)
	ca.num_splits = C.int32_t(a.NumSplits)
	ca.workspace = C.uint64_t(a.Workspace)
	ca.workspace_size = C.size_t(a.WorkspaceSize)
	ca.lse = C.uint64_t(a.LSE)
	ca.kv = a.KV.c()
	if a.BatchInvariant {
		ca.batch_invariant = 1
	}
	ca.tree_mask = C.uint64_t(a.TreeMask)
	ca.tree_mask_stride[0] = C.int64_t(a.TreeMaskStride[0])
	ca.tree_mask_stride[1] = C.int64_t(a.TreeMaskStride[1])
	ca.sinks = C.uint64_t(a.Sinks)
	ca.alibi_slopes = C.uint64_t(a.AlibiSlopes)
	ca.alibi_slopes_stride = C.int64_t(a.AlibiSlopesStride)
	ca.k_descale = C.uint64_t(a.KDescale)
	ca.v_descale = C.uint64_t(a.VDescale)
	ca.descale_stride[0] = C.int64_t(a.DescaleStride[0])
	ca.descale_stride[1] = C.int64_t(a.DescaleStride[1])
	ca.k_new, ca.v_new = a.KNew.c(), a.VNew.c()
	ca.seqlen_new = C.int32_t(a.SeqlenNew)
	ca.rotary_dim = C.int32_t(a.RotaryDim)
	ca.rotary_cos = C.uint64_t(a.RotaryCos)
	ca.rotary_sin = C.uint64_t(a.RotarySin)
	ca.seqlen_ro = C.int32_t(a.SeqlenRo)
	if a.RotaryInterleaved {
		ca.rotary_interleaved = 1
	}
	ca.rotary_dtype = C.int32_t(a.RotaryDType)
	ca.rotary_positions = C.uint64_t(a.RotaryPositions)
	ca.rotary_positions_stride = C.int64_t(a.RotaryPositionsStride)
	ca.split_counters = C.uint64_t(a.SplitCounters)
	ca.split_counters_size = C.size_t(a.SplitCountersSize)
	return ca
}

// DecodeWorkspaceSize returns the workspace bytes Decode needs for a and
// the number of splits it will use (fa_decode_workspace_size).
func (rt *Runtime) DecodeWorkspaceSize(cfg *Config, a *DecodeArgs) (bytes uint64, numSplits int, err error) {
	if a == nil {
		return 0, 0, goErr(StatusInvalidArgument, "DecodeWorkspaceSize: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "DecodeWorkspaceSize")
	if err != nil {
		return 0, 0, err
	}
	defer release()
	ca := a.c()
	var e C.fago_err
	var n C.size_t
	var s C.int32_t
	if err := check(C.fago_decode_workspace_size(p, cp, &ca, &n, &s, &e), &e); err != nil {
		return 0, 0, err
	}
	return uint64(n), int(s), nil
}

// Decode runs Flash-Decoding over a KV cache in any layout (fa_decode).
// With a.Workspace == 0 it sizes, allocates and frees a workspace itself
// (then a.O.Data must be set, or the partial states would be lost). Errors:
// an *Error with the library's status (StatusInvalidArgument for sizes,
// strides, KV layout fields, NumSplits with BatchInvariant, a small
// workspace; nothing is written then).
func (rt *Runtime) Decode(cfg *Config, a *DecodeArgs) error {
	if a == nil {
		return goErr(StatusInvalidArgument, "Decode: args is nil")
	}
	args := *a
	if args.Workspace == 0 {
		if args.O.Data == 0 {
			return goErr(StatusInvalidArgument,
				"Decode: O.Data and Workspace are both 0: the partial states would be discarded")
		}
		n, _, err := rt.DecodeWorkspaceSize(cfg, &args)
		if err != nil {
			return err
		}
		ws, err := rt.Malloc(n)
		if err != nil {
			return err
		}
		defer ws.Free()
		args.Workspace, args.WorkspaceSize = ws.Ptr(), n
	}
	p, cp, release, err := rt.acquireWith(cfg, "Decode")
	if err != nil {
		return err
	}
	defer release()
	ca := args.c()
	var e C.fago_err
	return check(C.fago_decode(p, cp, &ca, C.uint64_t(args.Stream), &e), &e)
}

// LSEFormat is the logarithm base of LSE values (fa_lse_format, since 0.4).
type LSEFormat int32

// LSE formats.
const (
	// LSENatural: ln of the softmax denominator (flashattn, FlashAttention).
	LSENatural LSEFormat = C.FA_LSE_NATURAL
	// LSEBase2: log2 of it, lse2 = lse * log2(e) (FlashInfer's states).
	LSEBase2 LSEFormat = C.FA_LSE_BASE2
)

// ReduceArgs are the arguments of Runtime.DecodeReduce (fa_reduce_args).
type ReduceArgs struct {
	NumSplits, Batch, SeqlenQ int32
	OPartial                  uint64   // fp32 [splits, batch, seqlen_q, heads_q, head_dim_v]
	OPartialStride            [5]int64 // elements; [4] must be 1
	LSEPartial                uint64   // fp32 [splits, batch, heads_q, seqlen_q]
	LSEPartialStride          [4]int64
	O                         Tensor // cfg dtype, written
	LSE                       uint64 // fp32 [batch, heads_q, seqlen_q]; 0 = none
	// Since 0.4: the base of the LSEs in LSEPartial and of those written to
	// LSE (zero value: natural logs); the kernel converts on load and store.
	LSEPartialFormat, LSEFormat LSEFormat
	// Since 0.4.1: attention sinks fp32 [num_heads_q] (natural logs), one
	// more state per row with O = 0, or 0 = none.
	Sinks  uint64
	Stream uintptr
}

// DecodeReduce merges partial attention states (fa_decode_reduce):
// m = max LSE_s, w_s = exp(LSE_s - m), O = sum w_s O_s / sum w_s,
// LSE = m + log sum w_s, with each LSE in the base its format says.
func (rt *Runtime) DecodeReduce(cfg *Config, a *ReduceArgs) error {
	if a == nil {
		return goErr(StatusInvalidArgument, "DecodeReduce: args is nil")
	}
	p, cp, release, err := rt.acquireWith(cfg, "DecodeReduce")
	if err != nil {
		return err
	}
	defer release()
	var ca C.fa_reduce_args
	ca.struct_size = C.size_t(unsafe.Sizeof(ca))
	ca.num_splits = C.int32_t(a.NumSplits)
	ca.batch = C.int32_t(a.Batch)
	ca.seqlen_q = C.int32_t(a.SeqlenQ)
	ca.o_partial = C.uint64_t(a.OPartial)
	for i := 0; i < 5; i++ {
		ca.o_partial_stride[i] = C.int64_t(a.OPartialStride[i])
	}
	ca.lse_partial = C.uint64_t(a.LSEPartial)
	for i := 0; i < 4; i++ {
		ca.lse_partial_stride[i] = C.int64_t(a.LSEPartialStride[i])
	}
	ca.o = a.O.c()
	ca.lse = C.uint64_t(a.LSE)
	ca.lse_partial_format = C.int32_t(a.LSEPartialFormat)
	ca.lse_format = C.int32_t(a.LSEFormat)
	ca.sinks = C.uint64_t(a.Sinks)
	var e C.fago_err
	return check(C.fago_decode_reduce(p, cp, &ca, C.uint64_t(a.Stream), &e), &e)
}
