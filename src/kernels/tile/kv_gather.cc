#include "kernels/tile/kv_gather.h"

#include "kernels/tile/swizzle.h"

namespace fa::kgen::tile {

void KvGather::page_rows(Reg n, const KvRows &kr, const KvRows &vr) const {
  ptx::Builder &b = e.b;
  b.comment("row addresses of the tile, one page lookup per row");
  b.bar_sync(bar, threads);
  for (int r0 = 0; r0 < block_n; r0 += threads) {
    ptx::Label skip = b.label();
    Reg t = r0 ? e.op(Op::Add, Type::U32, tid, imm(r0)) : tid;
    if (block_n - r0 < threads)
      b.when(e.setp(Cmp::Ge, Type::U32, tid, imm(block_n - r0))).bra(skip);
    Reg j = e.op(Op::Min, Type::S32, e.op(Op::Add, Type::S32, n, t),
                 e.op(Op::Sub, Type::S32, seqlen_k, imm(1)));
    Reg pi, off;
    kr.page_of(e, j, &pi, &off);
    Reg pg = b.b32();
    b.ld(Space::Global, Type::S32, pg, at(e.index(kr.table, pi, 4)), true);
    Reg slot = e.op(Op::MadLo, Type::U32, t, imm(8), smem);
    Reg ka = e.index(e.index(kr.base, pg, kr.page), off, kr.row);
    Reg va = e.index(e.index(vr.base, pg, vr.page), off, vr.row);
    b.st(Space::Shared, Type::U64, at(slot, rows), ka);
    b.st(Space::Shared, Type::U64, at(slot, rows + 8 * static_cast<uint32_t>(block_n)), va);
    b.bind(skip);
  }
  b.bar_sync(bar, threads);
}

void KvGather::tile(Reg dst, uint32_t base, uint32_t atom_bytes, int chunks, int data, Reg n,
                    const KvRows &kv, int half_off) const {
  ptx::Builder &b = e.b;
  b.op(Op::Add, Type::U32, dst, dst, smem);
  auto copy = [&](const std::function<Reg(Reg)> &row_addr) {
    gather_rows(e, tid, dst, base, atom_bytes, block_n, chunks, data, n, seqlen_k, row_addr, fp8,
                half, threads);
  };
  if (row_table) {
    copy([&](Reg j) {
      Reg slot = e.op(Op::Sub, Type::S32, j, n);
      b.op(Op::MadLo, Type::U32, slot, slot, imm(8), smem);
      Reg a = b.b64();
      b.ld(Space::Shared, Type::U64, a, at(slot, rows + static_cast<uint32_t>(half_off)));
      return a;
    });
    return;
  }
  if (page_tiles) {
    Reg pi = e.op(Op::Div, Type::U32, n, kv.page_size);
    Reg off = e.op(Op::Rem, Type::U32, n, kv.page_size);
    Reg pg = b.b32();
    b.ld(Space::Global, Type::S32, pg, at(e.index(kv.table, pi, 4)), true);
    Reg row0 = e.index(e.index(kv.base, pg, kv.page), off, kv.row);
    // Rows past seqlen_k are not read (zeros), so the page's rows suffice.
    copy([&](Reg j) { return e.index(row0, e.op(Op::Sub, Type::S32, j, n), kv.row); });
    return;
  }
  copy([&](Reg j) { return kv.at(e, j); });
}

}  // namespace fa::kgen::tile
