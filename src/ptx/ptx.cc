// PTX builder and emitter; see ptx.h.
#include "ptx/ptx.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fa {
namespace ptx {
namespace {

constexpr uint32_t kParamSym = 0xfffffffeu;

bool is_float(Type t) { return t == Type::F32; }
bool is_int(Type t) {
  return t == Type::U16 || t == Type::U32 || t == Type::S32 || t == Type::U64 || t == Type::S64;
}
bool is_bits(Type t) { return t == Type::B16 || t == Type::B32 || t == Type::B64; }
bool is_64(Type t) { return t == Type::B64 || t == Type::U64 || t == Type::S64; }

uint32_t bit(Type t) { return 1u << static_cast<int>(t); }
constexpr uint32_t kI32 = (1u << static_cast<int>(Type::S32)) | (1u << static_cast<int>(Type::U32));
constexpr uint32_t kI64 = (1u << static_cast<int>(Type::S64)) | (1u << static_cast<int>(Type::U64));
constexpr uint32_t kInt = kI32 | kI64;
constexpr uint32_t kF = 1u << static_cast<int>(Type::F32);
constexpr uint32_t kLogic = (1u << static_cast<int>(Type::B32)) |
                            (1u << static_cast<int>(Type::B64)) |
                            (1u << static_cast<int>(Type::Pred));
constexpr uint32_t kShl = (1u << static_cast<int>(Type::B32)) | (1u << static_cast<int>(Type::B64));
constexpr uint32_t kShr = kShl | kInt;
constexpr uint32_t kS32F =
    (1u << static_cast<int>(Type::S32)) | (1u << static_cast<int>(Type::F32));

struct OpInfo {
  const char *name;
  uint32_t types;
  int arity;
};

// Indexed by Op.
const OpInfo kOps[] = {
    {"add", kInt | kF, 2},
    {"sub", kInt | kF, 2},
    {"mul.lo", kInt, 2},
    {"mad.lo", kInt, 3},
    {"div", kInt, 2},
    {"rem", kInt, 2},
    {"min", kInt | kF, 2},
    {"max", kInt | kF, 2},
    {"neg", kS32F, 1},
    {"abs", kS32F, 1},
    {"and", kLogic, 2},
    {"or", kLogic, 2},
    {"xor", kLogic, 2},
    {"not", kLogic, 1},
    {"shl", kShl, 2},
    {"shr", kShr, 2},
    {"mul", kF, 2},
    {"mul.ftz", kF, 2},
    {"add.ftz", kF, 2},
    {"sub.ftz", kF, 2},
    {"fma.rn", kF, 3},
    {"fma.rn.ftz", kF, 3},
    {"div.rn", kF, 2},
    {"div.approx", kF, 2},
    {"rcp.rn", kF, 1},
    {"rcp.approx.ftz", kF, 1},
    {"sqrt.rn", kF, 1},
    {"ex2.approx.ftz", kF, 1},
    {"lg2.approx.ftz", kF, 1},
    {"tanh.approx", kF, 1},
};

const char *cmp_name(Cmp c) {
  static const char *const n[] = {"eq",  "ne",  "lt",  "le",  "gt",  "ge",  "equ",
                                  "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};
  return n[static_cast<int>(c)];
}

const char *special_name(Special s) {
  static const char *const n[] = {"%tid.x",   "%ntid.x",   "%ctaid.x",  "%ctaid.y",
                                  "%ctaid.z", "%nctaid.x", "%nctaid.y", "%laneid"};
  return n[static_cast<int>(s)];
}

// Fast appenders (generation time matters: every cache miss pays it).
void put_u(std::string &o, uint64_t v) {
  char buf[24];
  int n = 0;
  do {
    buf[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) o.push_back(buf[--n]);
}
void put_i(std::string &o, int64_t v) {
  if (v < 0) {
    o.push_back('-');
    put_u(o, static_cast<uint64_t>(0) - static_cast<uint64_t>(v));
  } else {
    put_u(o, static_cast<uint64_t>(v));
  }
}
void put_reg(std::string &o, Reg r) {
  o += class_prefix(r.cls);
  put_u(o, r.id);
}

}  // namespace

const char *type_name(Type t) {
  static const char *const n[] = {"pred", "b16", "u16", "f16", "bf16", "b32",
                                  "u32",  "s32", "f32", "b64", "u64",  "s64"};
  return n[static_cast<int>(t)];
}

RegClass class_of(Type t) {
  switch (t) {
    case Type::Pred:
      return RegClass::Pred;
    case Type::B16:
    case Type::U16:
    case Type::F16:
    case Type::BF16:
      return RegClass::B16;
    case Type::B32:
    case Type::U32:
    case Type::S32:
      return RegClass::B32;
    case Type::F32:
      return RegClass::F32;
    default:
      return RegClass::B64;
  }
}

const char *class_prefix(RegClass c) {
  static const char *const n[] = {"%p", "%h", "%r", "%rd", "%f"};
  return n[static_cast<int>(c)];
}

Operand imm(int64_t v) {
  Operand o;
  o.kind = Operand::Kind::Imm;
  o.imm = v;
  return o;
}
Operand fimm(float v) {
  Operand o;
  o.kind = Operand::Kind::F32;
  o.f = v;
  return o;
}
Operand sym(Symbol s) {
  Operand o;
  o.kind = Operand::Kind::Symbol;
  o.sym = s.id;
  return o;
}
Operand sreg(Special s) {
  Operand o;
  o.kind = Operand::Kind::Special;
  o.special = s;
  return o;
}

Builder::Builder(std::string entry, uint32_t param_bytes)
    : entry_(std::move(entry)), param_bytes_(param_bytes) {
  body_.reserve(1024);
}

Reg Builder::reg(RegClass c) { return Reg{c, counts_[static_cast<int>(c)]++}; }

Label Builder::label() { return Label{labels_++}; }

void Builder::bind(Label l) {
  Instr in;
  in.label = l.id;
  if (guard_.valid() || l.id >= labels_) misuse(in, "label bound with a guard or not created");
  body_.push_back(in);
}

Symbol Builder::shared(const std::string &name, uint32_t align, uint32_t bytes) {
  shared_.push_back({name, align, bytes});
  return Symbol{static_cast<uint32_t>(shared_.size() - 1)};
}

uint32_t Builder::shared_bytes() const {
  uint32_t total = 0;
  for (const auto &s : shared_) total = (total + s.align - 1) / s.align * s.align + s.bytes;
  return total;
}

Builder &Builder::when(Reg p) {
  guard_ = p;
  guard_neg_ = false;
  return *this;
}
Builder &Builder::unless(Reg p) {
  guard_ = p;
  guard_neg_ = true;
  return *this;
}

void Builder::comment(const std::string &text) {
  Instr in;
  in.op = "// " + text;
  body_.push_back(in);
}

Instr &Builder::push(std::string op) {
  body_.emplace_back();
  Instr &in = body_.back();
  in.op = std::move(op);
  if (guard_.valid()) {
    if (guard_.cls != RegClass::Pred) misuse(in, "guard is not a predicate register");
    in.guard = guard_;
    in.guard_neg = guard_neg_;
    guard_ = Reg{};
  }
  return in;
}

void Builder::misuse(const Instr &in, const char *what) const {
  std::fprintf(stderr, "flashattn ptx builder (%s): %s in `%s`\n", entry_.c_str(), what,
               in.op.c_str());
  std::abort();
}

void Builder::check_reg(const Instr &in, Reg r, Type t, const char *what) const {
  if (!r.valid() || r.id >= counts_[static_cast<int>(r.cls)]) misuse(in, "unallocated register");
  RegClass want = class_of(t);
  // A .b32 instruction accepts any 32-bit register (PTX ISA "Types": bit-size
  // types are compatible with every type of the same size).
  bool ok = r.cls == want || (t == Type::B32 && r.cls == RegClass::F32);
  if (!ok) misuse(in, what);
}

void Builder::check(const Instr &in, const Operand &o, Type t, const char *what) const {
  switch (o.kind) {
    case Operand::Kind::Reg:
      check_reg(in, o.reg, t, what);
      break;
    case Operand::Kind::Imm:
      if (!(is_int(t) || is_bits(t))) misuse(in, "integer immediate for a non-integer type");
      break;
    case Operand::Kind::F32:
      if (!is_float(t)) misuse(in, "f32 immediate for a non-f32 type");
      break;
    case Operand::Kind::Symbol:
      if (t != Type::U32 && t != Type::B32) misuse(in, "symbol address needs a u32/b32 type");
      if (o.sym >= shared_.size()) misuse(in, "unknown symbol");
      break;
    case Operand::Kind::Special:
      if (t != Type::U32 && t != Type::B32 && t != Type::S32)
        misuse(in, "special register needs a 32-bit integer type");
      break;
  }
}

void Builder::check_addr(const Instr &in, const Addr &a, Space s) const {
  if (a.offset < 0) misuse(in, "negative address offset");
  if (a.base.valid()) {
    RegClass want = s == Space::Global ? RegClass::B64 : RegClass::B32;
    if (a.base.cls != want) misuse(in, "address register of the wrong width for the space");
    if (a.base.id >= counts_[static_cast<int>(a.base.cls)]) misuse(in, "unallocated register");
  } else if (a.sym == kParamSym || a.sym >= shared_.size() || s != Space::Shared) {
    misuse(in, "symbol address outside shared memory");
  }
}

Arg Builder::arg(const Operand &o) const {
  Arg a;
  switch (o.kind) {
    case Operand::Kind::Reg:
      a.kind = Arg::Kind::Reg;
      a.reg = o.reg;
      break;
    case Operand::Kind::Imm:
      a.kind = Arg::Kind::Imm;
      a.imm = o.imm;
      break;
    case Operand::Kind::F32:
      a.kind = Arg::Kind::F32;
      a.f = o.f;
      break;
    case Operand::Kind::Symbol:
      a.kind = Arg::Kind::Symbol;
      a.imm = o.sym;
      break;
    case Operand::Kind::Special:
      a.kind = Arg::Kind::Special;
      a.special = o.special;
      break;
  }
  return a;
}

Arg Builder::arg(const Addr &ad) const {
  Arg a;
  a.kind = Arg::Kind::Addr;
  a.reg = ad.base;
  a.imm = ad.offset;
  a.nvec = 0;
  a.vec[0].id = ad.sym;  // symbol id when no base register
  return a;
}

namespace {
Arg reg_arg(Reg r) {
  Arg a;
  a.kind = Arg::Kind::Reg;
  a.reg = r;
  return a;
}
Arg vec_arg(std::initializer_list<Reg> regs) {
  Arg a;
  a.kind = Arg::Kind::Vec;
  for (Reg r : regs) a.vec[a.nvec++] = r;
  return a;
}
bool ld_type_ok(Type t, bool vec) {
  if (vec) return t == Type::U32 || t == Type::B32 || t == Type::F32;
  return t == Type::U16 || t == Type::B16 || t == Type::U32 || t == Type::S32 || t == Type::B32 ||
         t == Type::F32 || t == Type::U64 || t == Type::S64 || t == Type::B64;
}
bool st_type_ok(Type t, bool vec) {
  if (vec) return t == Type::U32 || t == Type::B32 || t == Type::F32;
  return t == Type::U16 || t == Type::B16 || t == Type::U32 || t == Type::B32 || t == Type::F32 ||
         t == Type::U64 || t == Type::B64;
}
std::string mem_op(const char *what, Space s, bool nc, size_t n, Type t) {
  std::string op = what;
  op += s == Space::Global ? ".global" : ".shared";
  if (nc) op += ".nc";
  if (n == 2) op += ".v2";
  if (n == 4) op += ".v4";
  op += '.';
  op += type_name(t);
  return op;
}
}  // namespace

void Builder::ld_param(Type t, Reg d, uint32_t offset) {
  Instr &in = push(std::string("ld.param.") + type_name(t));
  if (t != Type::U32 && t != Type::S32 && t != Type::U64 && t != Type::S64 && t != Type::F32)
    misuse(in, "ld.param type outside the subset");
  check_reg(in, d, t, "destination register class");
  if (offset + (is_64(t) ? 8u : 4u) > param_bytes_) misuse(in, "ld.param beyond the parameter");
  in.args[0] = reg_arg(d);
  Arg a;
  a.kind = Arg::Kind::Addr;
  a.imm = offset;
  a.vec[0].id = kParamSym;
  in.args[1] = a;
  in.nargs = 2;
}

void Builder::ld(Space s, Type t, Reg d, Addr a, bool nc) {
  Instr &in = push(mem_op("ld", s, nc, 1, t));
  if (!ld_type_ok(t, false) || (nc && s != Space::Global)) misuse(in, "load outside the subset");
  check_reg(in, d, t, "destination register class");
  check_addr(in, a, s);
  in.args[0] = reg_arg(d);
  in.args[1] = arg(a);
  in.nargs = 2;
}

void Builder::ld_v(Space s, Type t, std::initializer_list<Reg> d, Addr a, bool nc) {
  Instr &in = push(mem_op("ld", s, nc, d.size(), t));
  if (!ld_type_ok(t, true) || (d.size() != 2 && d.size() != 4) || (nc && s != Space::Global))
    misuse(in, "vector load outside the subset");
  for (Reg r : d) check_reg(in, r, t, "vector element register class");
  check_addr(in, a, s);
  in.args[0] = vec_arg(d);
  in.args[1] = arg(a);
  in.nargs = 2;
}

void Builder::st(Space s, Type t, Addr a, Reg v) {
  Instr &in = push(mem_op("st", s, false, 1, t));
  if (!st_type_ok(t, false)) misuse(in, "store outside the subset");
  check_reg(in, v, t, "source register class");
  check_addr(in, a, s);
  in.args[0] = arg(a);
  in.args[1] = reg_arg(v);
  in.nargs = 2;
}

void Builder::st_v(Space s, Type t, Addr a, std::initializer_list<Reg> v) {
  Instr &in = push(mem_op("st", s, false, v.size(), t));
  if (!st_type_ok(t, true) || (v.size() != 2 && v.size() != 4))
    misuse(in, "vector store outside the subset");
  for (Reg r : v) check_reg(in, r, t, "vector element register class");
  check_addr(in, a, s);
  in.args[0] = arg(a);
  in.args[1] = vec_arg(v);
  in.nargs = 2;
}

void Builder::cvta_to_global(Reg d, Reg a) {
  Instr &in = push("cvta.to.global.u64");
  check_reg(in, d, Type::U64, "destination register class");
  check_reg(in, a, Type::U64, "source register class");
  in.args[0] = reg_arg(d);
  in.args[1] = reg_arg(a);
  in.nargs = 2;
}

void Builder::mov(Type t, Reg d, Operand a) {
  Instr &in = push(std::string("mov.") + type_name(t));
  if (t == Type::F16 || t == Type::BF16) misuse(in, "mov type outside the subset");
  check_reg(in, d, t, "destination register class");
  if (a.kind == Operand::Kind::Symbol && t != Type::U32) misuse(in, "symbol needs mov.u32");
  if (a.kind == Operand::Kind::Imm && t == Type::Pred) misuse(in, "immediate predicate");
  check(in, a, t, "source register class");
  in.args[0] = reg_arg(d);
  in.args[1] = arg(a);
  in.nargs = 2;
}

void Builder::op(Op o, Type t, Reg d, Operand a) { op(o, t, d, a, Operand{}, Operand{}); }
void Builder::op(Op o, Type t, Reg d, Operand a, Operand b) { op(o, t, d, a, b, Operand{}); }

void Builder::op(Op o, Type t, Reg d, Operand a, Operand b, Operand c) {
  const OpInfo &info = kOps[static_cast<int>(o)];
  Instr &in = push(std::string(info.name) + '.' + type_name(t));
  if (!(info.types & bit(t))) misuse(in, "type not allowed for this operation");
  check_reg(in, d, t, "destination register class");
  const Operand *src[3] = {&a, &b, &c};
  in.args[0] = reg_arg(d);
  for (int i = 0; i < 3; ++i) {
    bool used = i < info.arity;
    bool given = src[i]->reg.valid() || src[i]->kind != Operand::Kind::Reg;
    if (used != given) misuse(in, "wrong operand count");
    if (!used) continue;
    if (i == 1 && (o == Op::Shl || o == Op::Shr))
      check(in, *src[i], Type::U32, "shift amount must be a 32-bit register or immediate");
    else
      check(in, *src[i], t, "source register class");
    in.args[1 + i] = arg(*src[i]);
  }
  in.nargs = static_cast<uint8_t>(1 + info.arity);
}

void Builder::mul_wide(Type t, Reg d, Operand a, Operand b) {
  Instr &in = push(std::string("mul.wide.") + type_name(t));
  if (t != Type::S32 && t != Type::U32) misuse(in, "mul.wide needs s32/u32");
  check_reg(in, d, Type::B64, "destination must be 64-bit");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  in.args[0] = reg_arg(d);
  in.args[1] = arg(a);
  in.args[2] = arg(b);
  in.nargs = 3;
}

void Builder::mad_wide(Type t, Reg d, Operand a, Operand b, Operand c) {
  Instr &in = push(std::string("mad.wide.") + type_name(t));
  if (t != Type::S32 && t != Type::U32) misuse(in, "mad.wide needs s32/u32");
  check_reg(in, d, Type::B64, "destination must be 64-bit");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  check(in, c, Type::B64, "addend must be 64-bit");
  in.args[0] = reg_arg(d);
  in.args[1] = arg(a);
  in.args[2] = arg(b);
  in.args[3] = arg(c);
  in.nargs = 4;
}

void Builder::setp(Cmp c, Type t, Reg p, Operand a, Operand b) {
  Instr &in = push(std::string("setp.") + cmp_name(c) + '.' + type_name(t));
  bool type_ok = t == Type::S32 || t == Type::U32 || t == Type::S64 || t == Type::U64 ||
                 t == Type::F32 || t == Type::B32;
  if (!type_ok) misuse(in, "setp type outside the subset");
  if (c > Cmp::Ge && t != Type::F32) misuse(in, "unordered comparison needs f32");
  check_reg(in, p, Type::Pred, "destination must be a predicate");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  in.args[0] = reg_arg(p);
  in.args[1] = arg(a);
  in.args[2] = arg(b);
  in.nargs = 3;
}

void Builder::selp(Type t, Reg d, Operand a, Operand b, Reg p) {
  Instr &in = push(std::string("selp.") + type_name(t));
  bool type_ok = t == Type::B32 || t == Type::U32 || t == Type::S32 || t == Type::F32 ||
                 t == Type::B64 || t == Type::U64 || t == Type::S64;
  if (!type_ok) misuse(in, "selp type outside the subset");
  check_reg(in, d, t, "destination register class");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  check_reg(in, p, Type::Pred, "selector must be a predicate");
  in.args[0] = reg_arg(d);
  in.args[1] = arg(a);
  in.args[2] = arg(b);
  in.args[3] = reg_arg(p);
  in.nargs = 4;
}

void Builder::cvt(Type dt, Type st, Round r, Reg d, Reg a) {
  static const struct {
    Type d, s;
    Round r;
  } kAllowed[] = {
      {Type::F32, Type::F16, Round::None}, {Type::F16, Type::F32, Round::Rn},
      {Type::BF16, Type::F32, Round::Rn},  {Type::F32, Type::S32, Round::Rn},
      {Type::F32, Type::U32, Round::Rn},   {Type::S32, Type::F32, Round::Rzi},
      {Type::S32, Type::F32, Round::Rni},  {Type::U64, Type::U32, Round::None},
      {Type::S64, Type::S32, Round::None}, {Type::U32, Type::U64, Round::None},
      {Type::S32, Type::S64, Round::None}, {Type::U32, Type::U16, Round::None},
      {Type::U16, Type::U32, Round::None},
  };
  static const char *const kRound[] = {"", ".rn", ".rzi", ".rni"};
  Instr &in = push(std::string("cvt") + kRound[static_cast<int>(r)] + '.' + type_name(dt) + '.' +
                   type_name(st));
  bool ok = false;
  for (const auto &c : kAllowed) ok = ok || (c.d == dt && c.s == st && c.r == r);
  if (!ok) misuse(in, "conversion outside the subset");
  check_reg(in, d, dt, "destination register class");
  check_reg(in, a, st, "source register class");
  in.args[0] = reg_arg(d);
  in.args[1] = reg_arg(a);
  in.nargs = 2;
}

void Builder::bra(Label l, bool uni) {
  Instr &in = push(uni ? "bra.uni" : "bra");
  if (l.id >= labels_) misuse(in, "unknown label");
  in.args[0].kind = Arg::Kind::Label;
  in.args[0].imm = l.id;
  in.nargs = 1;
}

void Builder::ret() { push("ret"); }
void Builder::exit() { push("exit"); }

void Builder::bar_sync() {
  Instr &in = push("bar.sync");
  in.args[0].kind = Arg::Kind::Imm;
  in.args[0].imm = 0;
  in.nargs = 1;
}

void Builder::bar_warp_sync(uint32_t mask) {
  Instr &in = push("bar.warp.sync");
  in.args[0].kind = Arg::Kind::Imm;
  in.args[0].imm = mask;
  in.nargs = 1;
}

void Builder::shfl(Shfl m, Reg d, Reg a, Operand b, Operand c, uint32_t membermask) {
  static const char *const kMode[] = {"bfly", "idx", "up", "down"};
  Instr &in = push(std::string("shfl.sync.") + kMode[static_cast<int>(m)] + ".b32");
  check_reg(in, d, Type::B32, "destination must be 32-bit");
  check_reg(in, a, Type::B32, "source must be 32-bit");
  check(in, b, Type::B32, "lane operand must be b32");
  check(in, c, Type::B32, "clamp operand must be b32");
  in.args[0] = reg_arg(d);
  in.args[1] = reg_arg(a);
  in.args[2] = arg(b);
  in.args[3] = arg(c);
  in.args[4].kind = Arg::Kind::Imm;
  in.args[4].imm = membermask;
  in.nargs = 5;
}

std::string Builder::emit(int isa_version_x10, int sm, uint32_t maxntid) const {
  std::string o;
  o.reserve(64 + body_.size() * 40);
  o += "//\n// Generated by flashattn. Do not edit.\n//\n\n.version ";
  put_u(o, isa_version_x10 / 10);
  o += '.';
  put_u(o, isa_version_x10 % 10);
  o += "\n.target sm_";
  put_u(o, sm);
  o += "\n.address_size 64\n\n.visible .entry ";
  o += entry_;
  o += "(\n\t.param .align 8 .b8 ";
  o += entry_;
  o += "_param[";
  put_u(o, param_bytes_);
  o += "]\n)\n";
  if (maxntid) {
    o += ".maxntid ";
    put_u(o, maxntid);
    o += ", 1, 1\n";
  }
  o += "{\n";
  static const char *const kDecl[] = {".pred", ".b16", ".b32", ".b64", ".f32"};
  for (int c = 0; c < kNumRegClasses; ++c) {
    if (!counts_[c]) continue;
    o += "\t.reg ";
    o += kDecl[c];
    o += ' ';
    o += class_prefix(static_cast<RegClass>(c));
    o += '<';
    put_u(o, counts_[c]);
    o += ">;\n";
  }
  for (const auto &s : shared_) {
    o += "\t.shared .align ";
    put_u(o, s.align);
    o += " .b8 ";
    o += s.name;
    o += '[';
    put_u(o, s.bytes);
    o += "];\n";
  }
  o += '\n';
  for (const Instr &in : body_) {
    if (in.op.empty()) {
      o += "L_";
      put_u(o, in.label);
      o += ":\n";
      continue;
    }
    o += '\t';
    if (in.guard.valid()) {
      o += in.guard_neg ? "@!" : "@";
      put_reg(o, in.guard);
      o += ' ';
    }
    o += in.op;
    for (int i = 0; i < in.nargs; ++i) {
      o += i ? ", " : " ";
      const Arg &a = in.args[i];
      switch (a.kind) {
        case Arg::Kind::None:
          break;
        case Arg::Kind::Reg:
          put_reg(o, a.reg);
          break;
        case Arg::Kind::Imm:
          put_i(o, a.imm);
          break;
        case Arg::Kind::F32: {
          uint32_t bits;
          std::memcpy(&bits, &a.f, 4);
          char buf[16];
          std::snprintf(buf, sizeof buf, "0f%08X", bits);
          o += buf;
          break;
        }
        case Arg::Kind::Symbol:
          o += shared_[a.imm].name;
          break;
        case Arg::Kind::Special:
          o += special_name(a.special);
          break;
        case Arg::Kind::Label:
          o += "L_";
          put_u(o, static_cast<uint64_t>(a.imm));
          break;
        case Arg::Kind::Vec:
          o += '{';
          for (int k = 0; k < a.nvec; ++k) {
            if (k) o += ", ";
            put_reg(o, a.vec[k]);
          }
          o += '}';
          break;
        case Arg::Kind::Addr:
          o += '[';
          if (a.reg.valid()) {
            put_reg(o, a.reg);
          } else if (a.vec[0].id == kParamSym) {
            o += entry_;
            o += "_param";
          } else {
            o += shared_[a.vec[0].id].name;
          }
          if (a.imm) {
            o += '+';
            put_i(o, a.imm);
          }
          o += ']';
          break;
      }
    }
    if (in.op[0] != '/') o += ';';
    o += '\n';
  }
  o += "}\n";
  return o;
}

}  // namespace ptx
}  // namespace fa
