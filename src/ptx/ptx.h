// PTX builder: typed virtual registers, an instruction list checked operand
// by operand when each instruction is built, counter-derived labels, and an
// emitter that prints one deterministic module (header, one entry with a
// single .param byte array, register and shared declarations, body).
//
// Only the PTX subset listed in notes/common.md (and docs/kernels.md) can be
// built. A type mismatch (an f32 register given to add.s32, a b64 address for
// a shared access, a cvt pair outside the subset, ...) is a bug in a
// generator, never a user error: the builder prints the offending
// instruction to stderr and calls std::abort(), in every build type. The
// generators are deterministic and tests/test_ptxas.cc builds every kind, so
// such a bug cannot hide behind a particular user input.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace fa {
namespace ptx {

// Register classes: one `.reg` declaration line and one name prefix each.
enum class RegClass : uint8_t { Pred = 0, B16, B32, B64, F32 };
constexpr int kNumRegClasses = 5;

// Instruction type suffixes (.s32, .f32, ...).
enum class Type : uint8_t { Pred, B16, U16, F16, BF16, B32, U32, S32, F32, B64, U64, S64 };

const char *type_name(Type t);       // "s32"
RegClass class_of(Type t);           // register class that holds a value of t
const char *class_prefix(RegClass);  // "%r"

struct Reg {
  RegClass cls = RegClass::B32;
  uint32_t id = UINT32_MAX;
  bool valid() const { return id != UINT32_MAX; }
};

struct Label {
  uint32_t id = UINT32_MAX;
};

// A shared-memory (or other module-level) symbol declared by the builder.
struct Symbol {
  uint32_t id = UINT32_MAX;
};

enum class Special : uint8_t { TidX, NtidX, CtaidX, CtaidY, CtaidZ, NctaidX, NctaidY, LaneId };

// A source operand: register, integer immediate, f32 immediate (printed as
// 0fXXXXXXXX), symbol address (mov.u32 d, NAME) or special register.
struct Operand {
  enum class Kind : uint8_t { Reg, Imm, F32, Symbol, Special };
  Kind kind = Kind::Reg;
  Reg reg;
  int64_t imm = 0;
  float f = 0;
  uint32_t sym = 0;
  Special special = Special::TidX;
  Operand(Reg r) : kind(Kind::Reg), reg(r) {}  // NOLINT: implicit by design
  Operand() = default;
};
Operand imm(int64_t v);
Operand fimm(float v);
Operand sym(Symbol s);
Operand sreg(Special s);

// A memory address: [reg+offset] or [NAME+offset], offset >= 0.
struct Addr {
  Reg base;                   // valid: register base
  uint32_t sym = UINT32_MAX;  // else: symbol base
  int64_t offset = 0;
};
inline Addr at(Reg r, int64_t off = 0) { return Addr{r, UINT32_MAX, off}; }
inline Addr at(Symbol s, int64_t off = 0) { return Addr{Reg{}, s.id, off}; }

enum class Space : uint8_t { Global, Shared };
enum class Cmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, Equ, Neu, Ltu, Leu, Gtu, Geu, Num, Nan };
enum class Shfl : uint8_t { Bfly, Idx, Up, Down };
enum class Round : uint8_t { None, Rn, Rzi, Rni };

// Arithmetic and logic operations, each "name.type d, a[, b[, c]]".
enum class Op : uint8_t {
  Add,
  Sub,
  MulLo,
  MadLo,
  Div,
  Rem,
  Min,
  Max,
  Neg,
  Abs,  // integer (add/sub/min/max/neg/abs also f32)
  And,
  Or,
  Xor,
  Not,
  Shl,
  Shr,  // bits
  Mul,
  MulFtz,
  AddFtz,
  SubFtz,
  Fma,
  FmaFtz,
  DivRn,
  DivApprox,
  RcpRn,
  RcpApprox,
  Sqrt,
  Ex2,
  Lg2,
  Tanh  // f32 only
};

// One instruction argument as stored in the list.
struct Arg {
  enum class Kind : uint8_t { None, Reg, Imm, F32, Symbol, Special, Addr, Vec, Label };
  Kind kind = Kind::None;
  uint8_t nvec = 0;
  Special special = Special::TidX;
  float f = 0;
  int64_t imm = 0;  // immediate, address offset, symbol or label id
  Reg reg;          // register, or address base
  Reg vec[4];
};

struct Instr {
  std::string op;  // full opcode ("ld.global.nc.v4.u32"); empty: label definition
  Reg guard;       // valid: @guard / @!guard
  bool guard_neg = false;
  uint8_t nargs = 0;
  uint32_t label = 0;  // defined label when op is empty
  Arg args[5];
};

class Builder {
 public:
  // `entry`: the entry name; `param_bytes`: size of its single parameter.
  Builder(std::string entry, uint32_t param_bytes);

  Reg reg(RegClass c);
  Reg pred() { return reg(RegClass::Pred); }
  Reg b16() { return reg(RegClass::B16); }
  Reg b32() { return reg(RegClass::B32); }
  Reg b64() { return reg(RegClass::B64); }
  Reg f32() { return reg(RegClass::F32); }
  uint32_t num_regs(RegClass c) const { return counts_[static_cast<int>(c)]; }

  Label label();
  void bind(Label l);  // "L_<id>:" at this point
  // Declares `.shared .align A .b8 NAME[bytes]`.
  Symbol shared(const std::string &name, uint32_t align, uint32_t bytes);
  uint32_t shared_bytes() const;

  // Guards the next instruction built with @p (when) or @!p (unless).
  // Build the operands first: in `b.when(p).st(..., at(e.index(...)), v)`
  // the guard would land on the first instruction index() emits.
  Builder &when(Reg p);
  Builder &unless(Reg p);
  void comment(const std::string &text);

  // ---- memory (PTX ISA "Data Movement and Conversion Instructions": ld, st, cvta) ----
  void ld_param(Type t, Reg d, uint32_t offset);
  void ld(Space s, Type t, Reg d, Addr a, bool nc = false);
  void ld_v(Space s, Type t, std::initializer_list<Reg> d, Addr a, bool nc = false);
  void st(Space s, Type t, Addr a, Reg v);
  void st_v(Space s, Type t, Addr a, std::initializer_list<Reg> v);
  void cvta_to_global(Reg d, Reg a);

  // ---- data movement, arithmetic, comparison, conversion ----
  void mov(Type t, Reg d, Operand a);
  void op(Op o, Type t, Reg d, Operand a);
  void op(Op o, Type t, Reg d, Operand a, Operand b);
  void op(Op o, Type t, Reg d, Operand a, Operand b, Operand c);
  void mul_wide(Type t, Reg d, Operand a, Operand b);             // t: s32/u32, d: b64
  void mad_wide(Type t, Reg d, Operand a, Operand b, Operand c);  // c: b64
  void setp(Cmp c, Type t, Reg p, Operand a, Operand b);
  void selp(Type t, Reg d, Operand a, Operand b, Reg p);
  void cvt(Type dt, Type st, Round r, Reg d, Reg a);

  // ---- control flow and collectives (PTX ISA "Control Flow Instructions",
  // "Parallel Synchronization and Communication Instructions": bar, bar.warp.sync) ----
  void bra(Label l, bool uni = false);
  void ret();
  void exit();
  void bar_sync();                    // bar.sync 0
  void bar_warp_sync(uint32_t mask);  // bar.warp.sync mask
  // shfl.sync.MODE.b32 d, a, b, c, membermask (PTX ISA "Data Movement and
  // Conversion Instructions: shfl.sync"; 9.7.8.6 in the 7.x manuals).
  void shfl(Shfl m, Reg d, Reg a, Operand b, Operand c, uint32_t membermask);

  const std::vector<Instr> &instrs() const { return body_; }

  // The module text: `.version`, `.target sm_<sm>`, `.address_size 64`, the
  // entry with `.maxntid maxntid, 1, 1` (0: none), declarations and body.
  std::string emit(int isa_version_x10, int sm, uint32_t maxntid) const;

 private:
  Instr &push(std::string op);
  [[noreturn]] void misuse(const Instr &in, const char *what) const;
  void check(const Instr &in, const Operand &o, Type t, const char *what) const;
  void check_reg(const Instr &in, Reg r, Type t, const char *what) const;
  void check_addr(const Instr &in, const Addr &a, Space s) const;
  Arg arg(const Operand &o) const;
  Arg arg(const Addr &a) const;

  std::string entry_;
  uint32_t param_bytes_;
  uint32_t counts_[kNumRegClasses] = {0, 0, 0, 0, 0};
  uint32_t labels_ = 0;
  struct SharedDecl {
    std::string name;
    uint32_t align, bytes;
  };
  std::vector<SharedDecl> shared_;
  std::vector<Instr> body_;
  Reg guard_;
  bool guard_neg_ = false;
};

}  // namespace ptx
}  // namespace fa
