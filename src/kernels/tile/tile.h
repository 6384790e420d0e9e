// Tile primitives of the mma.sync kernels (sm_80 and up): lane coordinates,
// f32 accumulator fragments, padded shared-memory tiles with their ldmatrix
// addressing, cp.async copy plans, and the online-softmax step. Generators
// compose them and read as their algorithm; each primitive names the PTX ISA
// layout it follows, and tests/test_tile.cc runs each one on the emulator
// against that layout, element by element.
#pragma once

#include <array>
#include <functional>
#include <vector>

#include "kernels/codegen.h"

namespace fa::kgen::tile {

// A warp's lane coordinates (PTX ISA, "Matrix Fragments for mma.m16n8k16
// with floating point type"): group g = lane / 4 holds fragment rows g and
// g + 8, quad index q = lane % 4 holds columns 2q and 2q + 1 of each 8-column
// block. ldmatrix takes the row addresses of matrix i from lanes 8i .. 8i+7
// (PTX ISA "ldmatrix"): l8 = lane % 8, h1 = (lane / 8) % 2, h2 = lane / 16.
struct Lanes {
  Reg lane, g, q, l8, h1, h2;
};
Lanes make_lanes(Emitter &e, Reg lane);

// Four b32 registers: an A fragment (m16 x k16 of 16-bit values) or two B
// fragments (each k16 x n8) from one ldmatrix .x4.
using Frag4 = std::array<Reg, 4>;
Frag4 frag4(ptx::Builder &b);

// An f32 accumulator tile of 16 rows x 8n columns: n mma C fragments of four
// registers. Element i of fragment j holds row g + 8 (i / 2), column
// 8j + 2q + (i & 1).
struct AccTile {
  std::vector<Frag4> f;
  int n() const { return static_cast<int>(f.size()); }
};
AccTile acc_tile(ptx::Builder &b, int n);  // registers allocated, not set
void zero(ptx::Builder &b, const AccTile &t);

// d[j] = a x (b0, b1) + c with mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16};
// c = d[j] (accumulate), or the given fragment (e.g. zeros, to start a sum
// without clearing d first).
void mma(ptx::Builder &b, Type half, const AccTile &d, int j, const Frag4 &a, const Reg *b2,
         const Frag4 *c = nullptr);

// The fp8 form (sm_89+, PTX ISA 8.4): d[j] = a x (b0, b1) + c with
// mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32. a is an
// m16 x k32 block of fp8 bytes, b2 one k32 x n8 block; the C/D layout is
// AccTile's. The non-transposed ldmatrix of a [m][k] (or [n][k]) byte tile
// gives these fragments with the 16-bit addressing: an A (ldsm Role::A)
// block of 16 x 16 16-bit columns is 16 x 32 bytes, one k32 step (PTX ISA
// "Matrix Fragments for mma.m16n8k32": lane (g, q) holds bytes 4q .. 4q + 3
// of its rows, which is what ldmatrix gives it); tests/test_tile.cc reads B
// with .x2 (B_NK .x4 for two n-tiles should work alike: not tested yet).
void mma_fp8(ptx::Builder &b, ptx::Fp8 ta, ptx::Fp8 tb, const AccTile &d, int j, const Frag4 &a,
             const Reg *b2, const Frag4 *c = nullptr);

// 2^x in f32 on the FMA pipe, two at a time (FlashAttention-4 section
// 3.1: exp2 emulated for a share of the elements, so that MUFU is not the
// only unit doing exponentials). Per element x, clamped to >= -127: j =
// round(x) by adding 1.5 x 2^23 + 127 (the sum's low mantissa bits are
// then j + 127, 2^j's biased exponent), f = x - j in [-0.5, 0.5], 2^f by a
// degree-3 minimax polynomial (relative error 7.5e-5), times 2^j made by a
// shift. x < -126.5 (and -inf) gives +0, x up to 127 the power. The pair
// runs on the packed f32x2 forms (sm_100, PTX ISA 8.6): eleven
// instructions for two elements (two max, three add, three fma, two shl,
// one mul). The constructor puts the constants in registers (b64 pairs:
// f32x2 takes no immediates) once, before a loop.
class Exp2Poly3 {
 public:
  explicit Exp2Poly3(Emitter &e);
  // d0 = 2^x0, d1 = 2^x1 (f32 registers; d may be x).
  void operator()(Reg d0, Reg d1, Reg x0, Reg x1) const;

 private:
  Emitter &e_;
  Reg round_, c_[4];
};

// Packs the f32 C fragments j, j+1 of t (16 rows x 16 columns) into the A
// fragment of the same 16x16 block (P in O += P V: the C layout of an m16n8
// pair is the A layout of m16k16, PTX ISA fragment figures).
void pack_a(ptx::Builder &b, Type half, const AccTile &t, int j, const Frag4 &a);

// O += P V in fp8 (the fp8 forward). An m16n8k32 fp8 fragment holds four
// consecutive k per register (PTX ISA "Matrix Fragments for
// mma.m16n8k32"), but a C fragment of P gives a lane two consecutive keys
// of each 8-key block, and ldmatrix .trans moves 16-bit pairs, not bytes.
// Both fit one permutation of the 32 keys of a k32 step (a sum over keys
// does not depend on their order): k = 4q + j (and 16 + 4q + j) stands for
// key 2q + j when j < 2, else 8 + 2q + j - 2 (plus 16).
// pack_a_fp8: the C fragments j .. j + 3 of t (16 rows x 32 keys) rounded
// to e4m3 (cvt.rn.satfinite.e4m3x2.f32, mov.b32 {lo, hi}) as the A fragment
// of that order.
// regs 2: a[0], a[1] only (keys 0..15 of the step from fragments j, j + 1;
// the caller holds a[2] = a[3] = 0: a k32 step over 16 keys, the fp8 KV
// decode's mode (b)).
void pack_a_fp8(ptx::Builder &b, const AccTile &t, int j, const Frag4 &a, int regs = 4);
// v_frags_fp8: from a Role::B_KN_T8 read of one 16-byte column chunk, the
// B fragments (k32 x n8, keys in that order) of two n8 blocks: `even` holds
// the chunk's columns 0, 2, .., 14 (n = g: column 2g), `odd` 1, 3, .., 15
// (prmt.b32, selectors 0x6420 and 0x7531). Their accumulators then hold,
// in element i, chunk column 4q + 2 (i & 1) (even) and 4q + 2 (i & 1) + 1
// (odd), rows g + 8 (i / 2): a lane's four consecutive columns.
// halves 1: even[0], odd[0] only, from r[0], r[1] (an .x2 read of keys
// 0..15; the caller holds even[1] = odd[1] = 0, with pack_a_fp8's regs 2).
void v_frags_fp8(ptx::Builder &b, const Frag4 &r, Reg even[2], Reg odd[2], int halves = 2);

// A row-major matrix of 16-bit values in shared memory, each row padded by 16
// bytes so the eight rows of an ldmatrix phase start on distinct 16-byte
// bank groups (conflict-free) and cp.async writes of a row stay 16-byte
// aligned. Columns [cols, cols_pad) are head-dim padding (cols_pad = cols
// rounded up to the mma k step of 16); they must hold zeros when read.
struct SmemTile {
  uint32_t offset = 0;  // bytes from the dynamic shared memory base
  int rows = 0, cols = 0, cols_pad = 0;
  int pitch = 0;  // bytes per row: 2 cols_pad + 16
  uint32_t bytes() const { return static_cast<uint32_t>(rows) * static_cast<uint32_t>(pitch); }
  int at(int row, int col) const { return row * pitch + 2 * col; }  // byte offset
};
SmemTile smem_tile(uint32_t offset, int rows, int cols);

// The three ways an m16n8k16 operand is read with ldmatrix .x4 (PTX ISA
// "ldmatrix"): which row and 16-byte chunk of a 16 x 16 block lane l
// addresses, so that each register pair is one mma operand (the mma wants
// a B fragment in two consecutive registers):
//  A       an m16 x k16 block of a [m][k] tile: row l8 + 8 h1, chunk h2
//  B_NK    two n8 x k16 blocks of a [n][k] tile (K in S = Q K^T):
//          row l8 + 8 h2, chunk h1; registers 0, 1 are block n0, 2, 3 n0 + 8
//  B_KN_T  two k16 x n8 blocks of a [k][n] tile, .trans (V in O += P V):
//          row l8 + 8 h1, chunk h2; registers 0, 1 are n0, 2, 3 n0 + 8
//  B_KN_T8 four k8 x 16-byte blocks of a [k][n] tile of fp8 bytes, .trans
//          (V in the fp8 forward): row l (keys 0..31 of a k32 step),
//          chunk 0; register i holds keys 8i .. 8i + 7, lane (g, q) the
//          bytes 2g, 2g + 1 of keys 8i + 2q and 8i + 2q + 1 (v_frags_fp8
//          makes them B fragments)
//  A_T     an m16 x k16 block of a [k][m] tile, .trans (dS in the
//          backward's dQ = dS K, from the dS^T tile its warps wrote): row
//          l8 + 8 h2, chunk h1 (B_NK's addressing); register 0 holds
//          (m 0-7, k 0-7), 1 (m 8-15, k 0-7), 2 (m 0-7, k 8-15), 3 (m 8-15,
//          k 8-15): A's fragment order
// A and B_KN_T address alike, so tiles of one pitch can share a base.
enum class Role { A, B_NK, B_KN_T, B_KN_T8, A_T };
// The lane's address of block (0, 0) from tile row `row0` (a u32 register,
// or invalid for 0); a block at (row, col) is then this + t.at(row, col).
Reg ldsm_base(Emitter &e, const Lanes &l, const SmemTile &t, Role role, Reg smem_base, Reg row0);
// n: the matrices read (.x4, or .x2 into d[0], d[1]; .x2 takes the
// addresses of lanes 0 .. 15).
void ldsm(ptx::Builder &b, Role role, const Frag4 &d, Reg base, int offset, int n = 4);

// How the CTA's threads copy a rows x cols tile of 16-bit values from global
// memory (row r at tile + r * stride bytes) into a SmemTile with 16-byte
// cp.async.cg (PTX ISA "cp.async"). A row's C = cols_pad / 8 chunks are
// shared by L threads (L the largest power of two dividing C): thread t
// copies chunks t % L, t % L + L, ... (J = C / L of them, at immediate
// offsets) of rows t / L, t / L + threads / L, ... So every round is the
// first moved down threads / L rows: the interior copy is one 64-bit add and
// J cp.async per round, shared offsets immediate, predicates loop-invariant.
// Padding chunks (cols .. cols_pad) are never copied: zero_padding() clears
// them once.
// A plan of 32 threads is one warp's own (tid = the lane): each warp of a
// CTA then copies its own tiles.
class CopyPlan {
 public:
  CopyPlan() = default;
  // `share`: a plan of the same shape (threads, rows, columns, pitch) into
  // another tile whose per-thread registers this one reuses, shared
  // offsets moved by the difference of the two tiles' offsets.
  // `round_bytes`: stride * round_rows() when the caller has it (a kernel
  // parameter costs no register); invalid: computed here.
  // `src_f32`: the global rows hold fp32 values (4 bytes each): each 16-byte
  // chunk of dst is 32 source bytes, read by two ld.global.v4.f32 and
  // rounded to bf16 (cvt.rn.bf16x2.f32, round to nearest even) into one
  // st.shared.v4 (convert-on-load, FA_DTYPE_FP32; dst holds bf16). The
  // copies are then synchronous: ordering them needs only the barriers a
  // cp.async plan's reader already has (wait_group then bar.sync).
  // `src_fp8` (1 e4m3, 2 e5m2; 0 none): the global rows hold fp8 bytes, 8 per
  // 16-byte chunk of dst, read by one ld.global.v2.b32 and converted
  // exactly to f16 (cvt.rn.f16x2.{e4m3x2,e5m2x2}, sm_89+) into one
  // st.shared.v4: synchronous likewise (dst holds f16).
  CopyPlan(Emitter &e, Reg tid, int threads, const SmemTile &dst, Reg smem_base, Reg stride,
           const CopyPlan *share = nullptr, Reg round_bytes = Reg(), bool src_f32 = false,
           int src_fp8 = 0);
  // Rows one round covers, for a caller's round_bytes.
  static int round_rows(int threads, const SmemTile &dst);
  // The thread's byte offset from the tile's first row: callers keep
  // tile + base_offset() as a running pointer.
  Reg base_offset() const { return goff0_; }
  // Every row present: tp = tile + base_offset().
  void interior(Reg tp) const;
  // Rows >= rows_left are zero-filled (src-size 0 from `safe`, a valid global
  // address that is not read).
  void boundary(Reg tp, Reg rows_left, Reg safe) const;
  // Rows found one by one (a paged KV cache whose pages are shorter than a
  // tile): row_addr(r) gives the global address of tile row r (an s32
  // register; it may be past the tile or rows_left, and must then still be
  // a readable row, which is not read). Rows >= rows_left are zero-filled;
  // an invalid rows_left means every row is present.
  void gather(const std::function<Reg(Reg)> &row_addr, Reg rows_left, Reg safe) const;
  // Zeroes the padding columns of every row (once, before they are read).
  void zero_padding() const;

 private:
  Reg guard(int k, int j) const;
  // src_f32: one chunk from global address ga + goff (ld predicated on lp
  // when valid; with `zero` the values are zeros where it is false) to
  // shared saddr0 + soff (st predicated on g when valid).
  void f32_chunk(Reg ga, int goff, int soff, Reg lp, Reg g, bool zero) const;
  // src_f32: chunk j of round k from row address ga; rows_checked: ok_
  // holds whether the row is present (else zeros are stored).
  void f32_rows(int k, int j, Reg ga, bool rows_checked) const;
  // The plan's thread index re-derived from %tid.x (the lane for a plan of
  // 32 threads: one warp's own copies).
  Reg thread_index() const;
  int soff(int k, int j) const { return k * step_ * dst_.pitch + 16 * L_ * j + delta_; }
  Emitter *e_ = nullptr;
  SmemTile dst_;
  int threads_ = 0, L_ = 1, J_ = 1, step_ = 0, rounds_ = 0, pad_ = 0, delta_ = 0;
  Reg tid_, smem_, stride_, row0_, saddr0_, goff0_, step_bytes_, ga_, src_, size_, ok_, rl_;
  Reg last_ok_, rows_ok_;
  static constexpr int kF32Batch = 4;  // src_f32, a warp's plan: chunks between warp syncs
  bool f32_ = false;                   // a converting (synchronous) copy: src_f32 or src_fp8
  int fp8_ = 0;                        // src_fp8
  int src_chunk_ = 16;                 // source bytes per 16-byte chunk of dst
  std::array<Reg, 2> y_;               // src_fp8: one chunk's fp8 bytes
  std::array<Reg, 2> h_;               // src_fp8: their b16 halves
  std::array<Reg, 8> x_;               // src_f32: one chunk's fp32 values
  std::array<Reg, 4> w_;               // src_f32: the same as bf16 pairs
  Reg lp_;                             // src_f32: row present and chunk not padding
};

// A rows x bytes tile of raw bytes (an fp8 K or V tile) in the form a
// CopyPlan copies and ldmatrix reads: bytes / 2 "16-bit" columns, bytes a
// multiple of 16 (whole 16-byte chunks, so no padding columns), rows `pitch`
// bytes apart with pitch / 16 odd (bytes, or bytes + 16 when bytes / 16 is
// even): the 8 rows of an ldmatrix phase, one 16-byte chunk each, then fall
// on distinct bank groups (conflict-free). A block at byte b of row r is at
// at(r, b / 2).
SmemTile byte_tile(uint32_t offset, int rows, int bytes);

// Eight fp8 values (bytes[0], bytes[1]: b32, lowest byte first) to eight
// 16-bit `half` values in out[0..3] (b32 pairs, the lower value in the low
// half): four cvt.rn.f16x2.{e4m3x2,e5m2x2} (exact: every e4m3 and e5m2 value
// is an f16), then for bf16 each f16 through cvt.f32.f16 and
// cvt.rn.bf16x2.f32 (exact too). Scratch: halves[4] (b16; may repeat a
// register: halves[2i], halves[2i + 1] are live together only), and for
// bf16 lo16, hi16 (b16), lo, hi (f32). Needs sm_89+ (the fp8 cvt).
void fp8x8_to_half(ptx::Builder &b, bool e5m2, Type half, const Reg bytes[2], const Reg halves[4],
                   const Reg out[4], Reg lo16, Reg hi16, Reg lo, Reg hi);

// ---- fp8 bytes straight into f16 mma operands (the fp8 KV decode) ----
// ldmatrix (.b16, non-transposed) of an 8 x 8 matrix over 8 rows x 16 bytes
// gives lane (g, q) bytes 4q .. 4q + 3 of row g; converted in registers
// (cvt.rn.f16x2.{e4m3x2,e5m2x2}, exact: every e4m3 and e5m2 value is an
// f16) they are two B-operand registers of the m16n8k16 mma whose k order
// is permuted within each 16-column chunk (the sum over k does not care):
//   mma k 2q + x      stands for column 4q + x       (x = 0, 1)
//   mma k 8 + 2q + x  stands for column 4q + 2 + x
// "kperm". The A operand must then come in the same order: kperm_rows
// rewrites a [m][k] SmemTile of 16-bit values (the f16 Q of the fp8 KV
// decode) in place so that column 2w + x of each 16-column chunk holds the
// old column 4w + x (w < 4) or 4 (w - 4) + 2 + x (w >= 4): the 32-bit words
// 0, 2, 4, 6, 1, 3, 5, 7 of the chunk. An ldmatrix (Role::A) of the
// rewritten tile is then the kperm A fragment: register r of lane (g, q)
// holds row g + 8 (r % 2), old columns 4q + 2 (r / 2) + {0, 1} of the chunk.
// `threads` threads (tid = %tid.x < threads) each move whole chunks (two
// ld.shared.v4.b32, two st.shared.v4.b32); the caller orders it: every
// value written before (a bar.sync), and a bar.sync after, before any
// ldmatrix reads the tile.
void kperm_rows(Emitter &e, Reg tid, int threads, const SmemTile &t, Reg smem_base);
// K in S = Q K^T: `raw` from an ldmatrix (non-transposed; Role::A
// addressing on a byte_tile [n][k]: register i of the .x4 is rows 8 (i % 2)
// .. + 7, bytes 16 (i / 2) .. + 15 of the block) holds n = g, bytes 4q ..
// 4q + 3 of a 16-byte k chunk; b2 becomes that n8 block's B fragment in the
// kperm order: b2[0] = f16x2(bytes 4q, 4q + 1), b2[1] = f16x2(bytes 4q + 2,
// 4q + 3), lower byte in the low half.
void b_frag_fp8_nk(ptx::Builder &b, bool e5m2, Reg raw, const Reg b2[2]);
// V in O += P V: lo and hi from an ldmatrix .trans (Role::A addressing on a
// byte_tile [k][n]: register i of the .x4 is keys 8 (i % 2) .. + 7, bytes
// 16 (i / 2) .. + 15) of keys 0..7 and 8..15 of one 16-byte column chunk:
// lane (g, q) holds bytes 2g, 2g + 1 of keys 2q, 2q + 1 (of 8 + 2q, 9 + 2q
// in hi). One prmt.b32 (selector 0x3120) per register pairs the keys of
// each byte, one cvt per pair: `even` becomes the B fragment (keys in mma
// order, k16 x n8) of the chunk's columns 0, 2, .., 14 (n = g: column 2g),
// `odd` that of columns 1, 3, .., 15. O's accumulators are then in
// AccCols::EvenOdd order.
void b_frags_fp8_kn(ptx::Builder &b, bool e5m2, Reg lo, Reg hi, const Reg even[2],
                    const Reg odd[2]);

// The column order of an AccTile's elements.
//  Natural  element i of fragment j: column 8j + 2q + (i & 1) (the mma's)
//  EvenOdd  fragments 2c, 2c + 1 hold the 16 columns 16c .. 16c + 15, 2c
//           the even ones (b_frags_fp8_kn, and the fp8 forward's
//           v_frags_fp8): element i of fragment 2c + p holds column 16c +
//           4q + 2 (i & 1) + p, so a lane's row holds four consecutive
//           columns 16c + 4q .. + 3 per chunk
// Rows are g + 8 (i / 2) in both.
enum class AccCols { Natural, EvenOdd };
// The column of element i of fragment j of lane quad q under `order`.
int acc_col(AccCols order, int j, int i, int q);
// Stores row half h (row g + 8h) of the lane's elements of t (f32) into a
// row of f32 in shared memory in column order: `row` (u32) is the row's
// address on entry and is moved in place to the lane's first column (4
// bytes per column); columns from `cols` on are not stored (cols a
// multiple of 8, of 16 for EvenOdd). Natural: st.shared.v2.f32 per
// fragment at column 8j + 2q; EvenOdd: st.shared.v4.f32 per fragment pair
// at column 16c + 4q. A caller that stores both halves passes each its own
// row address.
void st_acc_row(ptx::Builder &b, const Lanes &l, const AccTile &t, AccCols order, int h, Reg row,
                int cols);

// Rounds a 16-row bf16 tile in shared memory (q: row r at smem_base +
// q.offset + r q.pitch, q.cols values, cols a multiple of 8) to f16 in
// place, each row r times the power of two 2^k_r that puts its largest
// magnitude in [2^14, 2^15) (k_r clamped to [-126, 126]; an all-zero row
// gets 2^126). The f16 value is then exact for every element down to 2^-10
// of its row's largest (f16 normals), and within f16's absolute rounding of
// 2^-24 below that: as accurate as the bf16 row itself but for elements
// 2^-14 of the largest and smaller, whose contributions are that much
// smaller (NaN and infinities stay so). For an mma in f16 on a bf16 Q (the
// fp8 KV decode, whose K/V convert to f16 in one cvt). Returns, for the
// lane's fragment rows ln.g and ln.g + 8, 2^-k_r: a score from the scaled
// row times it is the score of the bf16 row. All num_warps warps of the CTA
// call it; it holds the two bar.sync it needs (every lane's maximum is read
// before any conversion is written, and every conversion is written before
// it returns). PTX ISA: cvt.rn.f16x2.f32, shfl.sync.bfly, bar.sync.
std::array<Reg, 2> rows_bf16_to_f16(Emitter &e, const Lanes &ln, Reg warp, int num_warps,
                                    const SmemTile &q, Reg smem_base);
// Quantises a 16-row tile of `half` values (F16 or BF16; q as for
// rows_bf16_to_f16, cols a multiple of 8) to e4m3 bytes into q8 (a
// byte_tile of q.cols bytes per row), each row r times the power of two
// 2^k_r that puts its largest magnitude in [256, 448] (or in (224, 256)
// when its mantissa is past 1.75, which would round past 448), k_r clamped
// to [-126, 126] (an all-zero row: 2^126): cvt.rn.satfinite.e4m3x2.f32,
// nearest even, so each element within 2^-4 relative of its scaled value
// down to e4m3's normals (2^-6: 2^14 below the row's largest), absolute
// 2^-10 below that; NaN stays NaN, an infinity saturates to 448 (its row's
// others then round to 0). A power of two, not 448 / amax: the scaling and
// its inverse are exact (only the e4m3 rounding errs) and the inverse is
// built from the exponent alone; it leaves at most one binade of e4m3's
// range unused at the top. The fp8 KV decode's mode (b) (Q on the fp8
// mma). Returns, for the lane's rows ln.g and ln.g + 8, 2^-k_r: a score of
// the quantised row times it is that of the row. All num_warps warps call
// it; it ends with the bar.sync that orders its writes before any read of
// q8. PTX ISA: cvt.rn.satfinite.e4m3x2.f32 (sm_89+), shfl.sync.bfly.
std::array<Reg, 2> rows_to_e4m3(Emitter &e, const Lanes &ln, Reg warp, int num_warps, Type half,
                                const SmemTile &q, const SmemTile &q8, Reg smem_base);

// The online softmax of FlashAttention-2 (Dao, 2023) over the score rows a
// thread holds: for mt m-tiles, row (mi, h) is elements 2h, 2h+1 of every
// fragment of s[mi] (the 4 lanes of a quad share a row). In the log2 domain
// with c = scale_log2 (or 1 when the scores are already scaled), per row:
//   m' = max(m, max_j s_j)
//   if (m' - m) c > kRescaleLog2 in any row of the warp (a uniform branch):
//     alpha = 2^((m - m') c); O *= alpha; l *= alpha; m = m'   (every row)
//   p_j = 2^((s_j - m) c) <= 2^kRescaleLog2;  l += sum_j p_j (per lane)
// The exponentials use a maximum at most kRescaleLog2 below the true one, so
// O and l are rescaled only when the maximum grows by a factor 2^8, not on
// every tile (the conditional rescaling of FlashAttention-4); the final
// O / l and LSE = (m c + log2 l) ln 2 are exact either way. -inf - -inf
// never reaches an exponential: an empty row uses the offset 0.
// Each exponent is formed as (s - m) c (FADD, FMUL), not as FlashAttention-2's
// one FFMA s c - m c: that cancels at large scores (|m c| past 2^24: an
// error of up to ulp(m c) / 2 in every exponent, 2^9 at 1e10; p over- or
// underflows), while s - m is exact near the maximum, so p = 1 there at any
// finite magnitude. Scores, maxima and LSE stay f32: scores differing by
// less than their f32 rounding are not told apart (docs/kernels.md,
// "Large scores").
// OnlineSoftmax's form: when it rescales (the maximum grew by more than
// rescale_log2) and the offset p_offset_log2 of its exponentials.
struct SoftmaxForm {
  float rescale_log2 = 8.0f;
  float p_offset_log2 = 0.0f;
};

// The end of a softmax row without a sink: the row's maximum m (raw
// scores, scaled to the log2 domain by c; c invalid: already log2) and the
// sum l of its exponentials (offset by p_offset_log2, SoftmaxForm). l > 0:
// inv = 1 / l (rcp.rn) and LSE = (m c + log2 l - p_offset_log2) ln 2;
// else (no key) inv = 0 and LSE = -inf. The sink form is sink_row
// (tile/merge.h).
struct RowEnd {
  Reg inv, lse;
};
RowEnd row_end(Emitter &e, Reg m, Reg c, Reg l, float p_offset_log2 = 0.0f);

// The online softmax of rows held one per thread in registers (or split
// between lanes t and t ^ partner_xor of a warp), FlashAttention-4's form on
// sm_100 (tcgen05: a row of S read from tensor memory): the row maximum
// with three-input max.f32, conditional rescaling (section 3.2: the offset
// the exponentials use moves to the new maximum only when that grows by more
// than form.rescale_log2 in the log2 domain, so p stays <= 2^rescale_log2),
// p = 2^(s c - m c) on f32x2 pairs, MUFU ex2 or, for pairs q with q % 16 <
// poly, tile::Exp2Poly3 (section 3.1). The caller rescales O by alpha (only
// where some row of its warp moved: step's `moved`).
class RowSoftmax {
 public:
  // c: f32, scores to the log2 domain, or invalid (scores already log2);
  // poly: pairs of each 16 on the FMA pipe (0..16); partner_xor: 0 (a row
  // in one thread) or the lane mask (shfl.sync.bfly) of the thread holding
  // the rest of the row. Puts its constants in registers (before a loop).
  RowSoftmax(Emitter &e, Reg c, SoftmaxForm form, int poly, int partner_xor = 0);
  // The running maximum (raw scores; -inf before any key) and this
  // thread's share of the sum of the exponentials.
  Reg m, l;
  struct Step {
    Reg alpha;  // f32: O's factor (1 where the offset stayed)
    Reg moved;  // pred: this row's offset moved
  };
  // One K/V tile: s (an even count >= 8 of f32 scores, masked to -inf)
  // becomes p in place; m and l move.
  Step step(const std::vector<Reg> &s);
  // The row's whole l (the partner's share added; a new register).
  Reg row_l();

 private:
  Emitter &e_;
  Reg c_, c2_;
  SoftmaxForm form_;
  int poly_, xor_;
  Exp2Poly3 exp2_;
};

class OnlineSoftmax {
 public:
  using Form = SoftmaxForm;
  static constexpr float kRescaleLog2 = 8.0f;
  // The fp8 forward's form (P rounded to e4m3 for the mma): the maximum the
  // exponentials use is always the row's own (rescale_log2 0: O and l move
  // whenever it grows), and p = 2^((s - m) c + p_offset_log2) with offset 8
  // (FlashAttention-3's fp8 max offset; the add rides in the FFMA): p <= 256
  // up to the exp2's rounding, 256 at the row's largest score, and e4m3's
  // subnormals start 2^8 lower in p. l sums the same p; finish takes the
  // offset back out of O and LSE.
  static Form fp8_form() { return Form{0.0f, 8.0f}; }
  // scale_log2: f32 register, or invalid when scores are already log2-domain.
  OnlineSoftmax(Emitter &e, int m_tiles, Reg scale_log2, Form form = Form());
  // Back to the state the constructor leaves (m = -inf, l = 0, in the same
  // registers): a persistent kernel's next row block.
  void reset();
  // One K/V tile: s becomes p (f32, in place); o and l rescaled when needed.
  void step(const std::vector<AccTile> &s, const std::vector<AccTile> &o);
  // step() in two halves, for a kernel whose O is still being written by an
  // asynchronous MMA while it runs the softmax (FlashAttention-3's overlap):
  // step_scores does everything but O *= alpha (s becomes p; m and l move),
  // rescale applies the pending alpha to O afterwards (a no-op when no row
  // of the warp moved its maximum). Same results as step().
  void step_scores(const std::vector<AccTile> &s);
  void rescale(const std::vector<AccTile> &o);
  // After the last tile: l summed over the quad, O *= 1 / l (0 when l = 0);
  // lse[r] = (m c + log2 l) ln 2, or -inf when l = 0.
  void finish(const std::vector<AccTile> &o, std::vector<Reg> *lse);
  // finish() with an attention sink (gpt-oss): sink_log2 (f32, the logit in
  // the log2 domain, the same for every row) joins each row's denominator
  // and contributes no value (see sink_row; -inf, +inf and NaN included).
  void finish(const std::vector<AccTile> &o, std::vector<Reg> *lse, Reg sink_log2);

 private:
  // The offset to_log2 subtracts for a row of maximum m: m, or 0 when m =
  // -inf (no key yet: no -inf - -inf); for log2-domain scores less `add`.
  Reg row_offset(Reg m, float add);
  // d = (x - off) c + add, or x - off for log2-domain scores (add is in
  // off): the exponent of p (x a score) or of alpha (x the old maximum).
  void to_log2(Reg d, Reg x, Reg off, float add);
  // step's body; with `o` null the rescale of O is left to rescale().
  void step_impl(const std::vector<AccTile> &s, const std::vector<AccTile> *o);
  Emitter &e_;
  int rows_;
  Reg c_;
  Form form_;
  std::vector<Reg> m_, l_;
  Reg any_;                 // step_scores: some row of the warp moved its maximum
  std::vector<Reg> alpha_;  // step_scores: each row's pending factor for O
};

// Rotary position embedding (RoPE; Su et al. 2021, "RoFormer") of 16-byte
// chunks of a row of 16-bit values, as FlashAttention's rotary kernels pair
// the columns: GPT-NeoX (i, i + rotary_dim / 2) or GPT-J interleaved
// (2i, 2i + 1), angle table row p = position (clamped to the table), column
// i. Each output is y = fma(partner, +-sin, rn(own cos)) in f32 (sin
// negated for the pair's first element), rounded once to the 16-bit type:
// the same bits as flashattn.h documents for fa_decode_args.rotary_dim.
struct RopeTable {
  Reg cos, sin;    // global addresses of row 0 ([rows, rotary_dim / 2])
  Reg rotary_dim;  // s32, a multiple of 16
  Reg last_row;    // s32, rows - 1
  bool interleaved = false;
  bool half_table = false;  // the table holds `half` values, else f32
  Type half = Type::F16;    // the rows' (and a half table's) type
};
// Rotates x (four b32: columns col8 .. col8 + 7 of a row whose column 0 is
// at the global address row; col8 a multiple of 8) for position pos;
// chunks at or past rotary_dim are left as they are. NeoX reads the
// partner chunk from the row.
void rope_chunk(Emitter &e, const RopeTable &t, Reg row, Reg col8, Reg pos,
                const std::array<Reg, 4> &x);

// fp8 quantisation of a 16-byte chunk x (four b32: eight `half` values,
// F16 or BF16): each value to f32 (exact), divided by the f32 `descale`
// (div.rn.f32), rounded by cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (nearest
// even; beyond the largest finite: it; NaN: NaN). Returns the 8 bytes in
// column order as two b32 (sm_89+: the KV append into an fp8 cache).
std::array<Reg, 2> quantise_fp8_chunk(Emitter &e, Type half, const std::array<Reg, 4> &x,
                                      Reg descale, bool e5m2);

}  // namespace fa::kgen::tile
