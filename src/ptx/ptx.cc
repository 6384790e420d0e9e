// PTX builder and emitter; see ptx.h.
#include "ptx/ptx.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fa {
namespace ptx {
namespace {

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
constexpr uint32_t kPrmt = 1u << static_cast<int>(Type::B32);
constexpr uint32_t kS32F =
    (1u << static_cast<int>(Type::S32)) | (1u << static_cast<int>(Type::F32));

// A short name stored in a fixed 16-byte slot with its length, so that the
// writers below copy it with one fixed-size memcpy (no strlen, no loop).
struct Piece {
  char s[24] = {};
  uint8_t n = 0;
  constexpr Piece(const char *a) {      // NOLINT: implicit from literals by design
    while (a[n] && n < sizeof s - 1) {  // longer names are cut, never overflow
      s[n] = a[n];
      ++n;
    }
  }
};

struct OpInfo {
  Piece name;
  uint32_t types;
  int arity;
};

// Indexed by Op.
constexpr OpInfo kOps[] = {
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
    {"prmt", kPrmt, 3},
    {"max", kF, 3},
};

constexpr Piece kCmpNames[] = {"eq",  "ne",  "lt",  "le",  "gt",  "ge",  "equ",
                               "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};
const Piece &cmp_name(Cmp c) { return kCmpNames[static_cast<int>(c)]; }

constexpr Piece kSpecialNames[] = {"%tid.x",
                                   "%ntid.x",
                                   "%ctaid.x",
                                   "%ctaid.y",
                                   "%ctaid.z",
                                   "%nctaid.x",
                                   "%nctaid.y",
                                   "%laneid",
                                   "%cluster_ctarank",
                                   "%cluster_nctarank",
                                   "%clusterid.x",
                                   "%clusterid.y",
                                   "%clusterid.z",
                                   "%nclusterid.x",
                                   "%nclusterid.y",
                                   "%nclusterid.z",
                                   "%cluster_ctaid.x",
                                   "%cluster_ctaid.y",
                                   "%cluster_ctaid.z",
                                   "%cluster_nctaid.x",
                                   "%cluster_nctaid.y",
                                   "%cluster_nctaid.z"};
static_assert(sizeof(kSpecialNames) / sizeof(kSpecialNames[0]) ==
                  static_cast<size_t>(Special::ClusterNctaidZ) + 1,
              "a name per Special");

constexpr Piece kTypeNames[] = {"pred", "b16", "u16", "f16", "bf16", "b32",
                                "u32",  "s32", "f32", "b64", "u64",  "s64"};
const Piece &type_piece(Type t) { return kTypeNames[static_cast<int>(t)]; }

}  // namespace

const char *type_name(Type t) { return type_piece(t).s; }

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
  o.imm = s.id;
  return o;
}
Operand sreg(Special s) {
  Operand o;
  o.kind = Operand::Kind::Special;
  o.special = s;
  return o;
}

// ---- text writers (generation time matters: every cache miss pays it) ----

namespace {

// The longest line any instruction prints, symbol names excluded: tab,
// guard, opcode and five operands of at most a 4-register vector each.
constexpr size_t kLineRoom = 512;

char *put_str(char *p, const char *s, size_t n) {
  std::memcpy(p, s, n);
  return p + n;
}

// "00" "01" ... "99": two digits per table lookup.
struct DigitPairs {
  char s[200] = {};
  constexpr DigitPairs() {
    for (int i = 0; i < 100; ++i) {
      s[2 * i] = static_cast<char>('0' + i / 10);
      s[2 * i + 1] = static_cast<char>('0' + i % 10);
    }
  }
};
constexpr DigitPairs kDigitPairs;

// Decimal v; values below 10000 (register ids, offsets) take a short path.
char *put_u(char *p, uint64_t v) {
  const char *d = kDigitPairs.s;
  if (v < 10) {
    *p = static_cast<char>('0' + v);
    return p + 1;
  }
  if (v < 100) {
    std::memcpy(p, d + 2 * v, 2);
    return p + 2;
  }
  if (v < 1000) {
    *p = static_cast<char>('0' + v / 100);
    std::memcpy(p + 1, d + 2 * (v % 100), 2);
    return p + 3;
  }
  if (v < 10000) {
    std::memcpy(p, d + 2 * (v / 100), 2);
    std::memcpy(p + 2, d + 2 * (v % 100), 2);
    return p + 4;
  }
  int n = 1;
  for (uint64_t t = v; t >= 10; t /= 10) ++n;
  char *e = p + n;
  do {
    *--e = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  return p + n;
}

char *put_i(char *p, int64_t v) {
  if (v >= 0) return put_u(p, static_cast<uint64_t>(v));
  *p++ = '-';
  return put_u(p, static_cast<uint64_t>(0) - static_cast<uint64_t>(v));
}

// "%r12": the prefix is copied as 4 bytes (room is always there) and the
// cursor moves by its length.
char *put_reg(char *p, Reg r) {
  static const char kPrefix[kNumRegClasses][4] = {"%p", "%h", "%r", "%rd", "%f"};
  static const uint8_t kLen[kNumRegClasses] = {2, 2, 2, 3, 2};
  int c = static_cast<int>(r.cls);
  std::memcpy(p, kPrefix[c], 4);
  return put_u(p + kLen[c], r.id);
}

// f32 immediates print their bits: 0fXXXXXXXX (PTX ISA "Floating-Point
// Constants").
char *put_f32(char *p, float f) {
  static const char kHex[] = "0123456789ABCDEF";
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  *p++ = '0';
  *p++ = 'f';
  for (int s = 28; s >= 0; s -= 4) *p++ = kHex[(bits >> s) & 15];
  return p;
}

}  // namespace

// An opcode assembled from pieces ("ld" ".global" ".nc" ".v4" ".u32"); s
// keeps slack past kCopy for the fixed-size piece copies (24 bytes each).
struct Builder::Opcode {
  static constexpr size_t kCopy = 96;  // bytes copied into a line; every opcode is shorter
  char s[128];
  size_t n = 0;
  template <size_t N>
  explicit Opcode(const char (&a)[N]) {
    add(a);
  }
  explicit Opcode(const Piece &p) { add(p); }
  explicit Opcode(const std::string &t) { str(t); }
  // A piece built at run time (cut at kCopy, never overflowing).
  Opcode &str(const std::string &t) {
    const size_t k = std::min(t.size(), kCopy + 1 - n);
    std::memcpy(s + n, t.data(), k);
    n += k;
    return *this;
  }
  template <size_t N>
  Opcode &add(const char (&a)[N]) {
    static_assert(N <= 48, "opcode piece too long");
    std::memcpy(s + n, a, N - 1);
    n += N - 1;
    return *this;
  }
  Opcode &add(const Piece &p) {
    std::memcpy(s + n, p.s, sizeof p.s);
    n += p.n;
    return *this;
  }
  Opcode &dot(const Piece &p) {
    s[n++] = '.';
    return add(p);
  }
  // what.SPACE[.nc][.vN].TYPE, e.g. "ld.global.nc.v4.u32".
  template <size_t N>
  static Opcode mem(const char (&what)[N], Space sp, bool nc, size_t nvec, Type t) {
    Opcode op(what);
    if (sp == Space::Global)
      op.add(".global");
    else if (sp == Space::Cluster)
      op.add(".shared::cluster");
    else
      op.add(".shared");
    if (nc) op.add(".nc");
    if (nvec == 2) op.add(".v2");
    if (nvec == 4) op.add(".v4");
    return op.dot(type_piece(t));
  }
};

// One instruction line of the body: "\t[@guard ]opcode a, b, c;\n". The
// constructor takes the pending guard and reserves room for the whole line;
// done() ends the line. Checks happen before a Line is started.
class Builder::Line {
 public:
  // `extra`: room beyond kLineRoom for long operand lists (wgmma).
  Line(Builder &b, const Opcode &op, size_t extra = 0) : b_(b) {
    size_t need = kLineRoom + 2 * b.max_name_ + extra;
    p_ = b.text_len_ + need <= b.text_.size() ? &b.text_[b.text_len_] : b.room(need);
    *p_++ = '\t';
    if (b.guard_.valid()) {
      if (b.guard_.cls != RegClass::Pred) b.misuse(op, "guard is not a predicate register");
      *p_++ = '@';
      if (b.guard_neg_) *p_++ = '!';
      p_ = put_reg(p_, b.guard_);
      *p_++ = ' ';
      b.guard_ = Reg{};
    }
    if (op.n > Opcode::kCopy) b.misuse(op, "opcode too long");
    std::memcpy(p_, op.s, Opcode::kCopy);  // fixed size: one or two vector moves
    p_ += op.n;
  }
  Line &reg(Reg r) {
    sep();
    p_ = put_reg(p_, r);
    return *this;
  }
  Line &imm(int64_t v) {
    sep();
    p_ = put_i(p_, v);
    return *this;
  }
  Line &label(Label l) {
    sep();
    p_ = put_str(p_, "L_", 2);
    p_ = put_u(p_, l.id);
    return *this;
  }
  Line &operand(const Operand &o) {
    sep();
    switch (o.kind) {
      case Operand::Kind::Reg:
        p_ = put_reg(p_, o.reg);
        break;
      case Operand::Kind::Imm:
        p_ = put_i(p_, o.imm);
        break;
      case Operand::Kind::F32:
        p_ = put_f32(p_, o.f);
        break;
      case Operand::Kind::Symbol:
        p_ = name(b_.shared_[static_cast<size_t>(o.imm)].name);
        break;
      case Operand::Kind::Special: {
        const Piece &n = kSpecialNames[static_cast<int>(o.special)];
        std::memcpy(p_, n.s, sizeof n.s);
        p_ += n.n;
        break;
      }
    }
    return *this;
  }
  Line &vec(std::initializer_list<Reg> regs) { return vec(regs.begin(), regs.size()); }
  Line &vec(const Reg *regs, size_t n) {
    sep();
    *p_++ = '{';
    for (size_t i = 0; i < n; ++i) {
      if (i) p_ = put_str(p_, ", ", 2);
      p_ = put_reg(p_, regs[i]);
    }
    *p_++ = '}';
    return *this;
  }
  // [reg+off], [NAME+off] (+off only when non-zero).
  Line &addr(const Addr &a) {
    sep();
    *p_++ = '[';
    if (a.base.valid())
      p_ = put_reg(p_, a.base);
    else
      p_ = name(b_.shared_[a.sym].name);
    return offset(a.offset);
  }
  // The parameter block's name (mov.u64 d, NAME).
  Line &param_name() {
    sep();
    p_ = name(b_.param_name_);
    return *this;
  }
  // A fixed operand text (at most 32 characters: %is_explicit_cluster).
  Line &raw(const char *text) {
    sep();
    const size_t n = std::strlen(text);
    std::memcpy(p_, text, n < 32 ? n : 32);
    p_ += n < 32 ? n : 32;
    return *this;
  }
  // "_": a discarded result (mbarrier.arrive's state).
  Line &sink() {
    sep();
    *p_++ = '_';
    return *this;
  }
  // 0xXXXXXXXX (a membermask).
  Line &hex(uint32_t v) {
    sep();
    *p_++ = '0';
    *p_++ = 'x';
    for (int sh = 28; sh >= 0; sh -= 4) *p_++ = "0123456789abcdef"[(v >> sh) & 15];
    return *this;
  }
  // "|p" right after the previous operand (d|p).
  Line &pipe(Reg p) {
    *p_++ = '|';
    p_ = put_reg(p_, p);
    return *this;
  }
  // [tmap, {c0, c1, ...}]
  Line &tensor(Reg tmap, const Reg *coords, size_t n) {
    sep();
    *p_++ = '[';
    p_ = put_reg(p_, tmap);
    first_ = false;
    vec(coords, n);
    *p_++ = ']';
    return *this;
  }
  Line &param_addr(uint32_t off) {
    sep();
    *p_++ = '[';
    p_ = name(b_.param_name_);
    return offset(off);
  }
  void done() {
    p_ = put_str(p_, ";\n", 2);
    b_.text_len_ = static_cast<size_t>(p_ - b_.text_.data());
    ++b_.num_instrs_;
  }

 private:
  // " " before the first operand, ", " before the others.
  void sep() {
    p_[0] = first_ ? ' ' : ',';
    p_[1] = ' ';
    p_ += first_ ? 1 : 2;
    first_ = false;
  }
  char *name(const std::string &n) { return put_str(p_, n.data(), n.size()); }
  Line &offset(int64_t off) {
    if (off) {
      *p_++ = '+';
      p_ = put_i(p_, off);
    }
    *p_++ = ']';
    return *this;
  }
  Builder &b_;
  char *p_;
  bool first_ = true;
};

// The body buffer's capacity doubles from kTextInitial; its size (the bytes
// Line may write) grows kTextStep at a time, so the zero-fill of resize()
// touches each page about when it is written anyway. Measured: starting
// with a small buffer and doubling costs page faults on every generation
// of an 80 KB module (glibc trims the freed buffers).
constexpr size_t kTextInitial = 128 * 1024, kTextStep = 8 * 1024;

char *Builder::room(size_t n) {
  size_t need = text_len_ + n;
  if (need > text_.size()) {
    if (need > text_.capacity()) {
      text_.resize(text_len_);  // only the written bytes move to a new buffer
      text_.reserve(std::max(std::max(2 * text_.capacity(), kTextInitial), need));
    }
    text_.resize(std::min(text_.capacity(), need + kTextStep));
  }
  return &text_[text_len_];
}

Builder::Builder(std::string entry, uint32_t param_bytes)
    : entry_(std::move(entry)), param_name_(entry_ + "_param"), param_bytes_(param_bytes) {
  max_name_ = param_name_.size();
}

Reg Builder::reg(RegClass c) { return Reg{c, counts_[static_cast<int>(c)]++}; }

Label Builder::label() { return Label{labels_++}; }

void Builder::bind(Label l) {
  if (guard_.valid() || l.id >= labels_)
    misuse(Opcode("label"), "label bound with a guard or not created");
  char *p = room(kLineRoom);
  p = put_str(p, "L_", 2);
  p = put_u(p, l.id);
  p = put_str(p, ":\n", 2);
  text_len_ = static_cast<size_t>(p - text_.data());
}

Symbol Builder::shared(const std::string &name, uint32_t align, uint32_t bytes) {
  shared_.push_back({name, align, bytes, false});
  if (name.size() > max_name_) max_name_ = name.size();
  return Symbol{static_cast<uint32_t>(shared_.size() - 1)};
}

Symbol Builder::extern_shared(const std::string &name, uint32_t align) {
  Symbol s = shared(name, align, 0);
  shared_.back().is_extern = true;
  return s;
}

uint32_t Builder::shared_bytes() const {
  uint32_t total = 0;
  for (const auto &s : shared_)
    if (!s.is_extern) total = (total + s.align - 1) / s.align * s.align + s.bytes;
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

// "\t// text\n"; a pending guard stays for the next instruction.
void Builder::comment(const std::string &text) {
  char *p = room(text.size() + 8);
  p = put_str(p, "\t// ", 4);
  p = put_str(p, text.data(), text.size());
  *p++ = '\n';
  text_len_ = static_cast<size_t>(p - text_.data());
}

void Builder::misuse(const Opcode &in, const char *what) const {
  std::fprintf(stderr, "flashattn ptx builder (%s): %s in `%.*s`\n", entry_.c_str(), what,
               static_cast<int>(in.n), in.s);
  std::abort();
}

inline void Builder::check_reg(const Opcode &in, Reg r, Type t, const char *what) const {
  if (!r.valid() || r.id >= counts_[static_cast<int>(r.cls)]) misuse(in, "unallocated register");
  RegClass want = class_of(t);
  // A .b32 instruction accepts any 32-bit register (PTX ISA "Types": bit-size
  // types are compatible with every type of the same size).
  bool ok = r.cls == want || (t == Type::B32 && r.cls == RegClass::F32);
  if (!ok) misuse(in, what);
}

inline void Builder::check(const Opcode &in, const Operand &o, Type t, const char *what) const {
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
      if (o.imm < 0 || static_cast<size_t>(o.imm) >= shared_.size()) misuse(in, "unknown symbol");
      break;
    case Operand::Kind::Special:
      if (t != Type::U32 && t != Type::B32 && t != Type::S32)
        misuse(in, "special register needs a 32-bit integer type");
      break;
  }
}

inline void Builder::check_addr(const Opcode &in, const Addr &a, Space s) const {
  if (a.offset < 0) misuse(in, "negative address offset");
  if (a.base.valid()) {
    RegClass want = s == Space::Global ? RegClass::B64 : RegClass::B32;
    if (a.base.cls != want) misuse(in, "address register of the wrong width for the space");
    if (a.base.id >= counts_[static_cast<int>(a.base.cls)]) misuse(in, "unallocated register");
  } else if (a.sym >= shared_.size() || s == Space::Global) {
    misuse(in, "symbol address outside shared memory");
  }
}

namespace {
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
}  // namespace

void Builder::ld_param(Type t, Reg d, uint32_t offset) {
  Opcode in("ld.param");
  in.dot(type_piece(t));
  if (t != Type::U32 && t != Type::S32 && t != Type::U64 && t != Type::S64 && t != Type::F32)
    misuse(in, "ld.param type outside the subset");
  check_reg(in, d, t, "destination register class");
  if (offset + (is_64(t) ? 8u : 4u) > param_bytes_) misuse(in, "ld.param beyond the parameter");
  Line(*this, in).reg(d).param_addr(offset).done();
}

void Builder::ld(Space s, Type t, Reg d, Addr a, bool nc) {
  Opcode in = Opcode::mem("ld", s, nc, 1, t);
  if (!ld_type_ok(t, false) || (nc && s != Space::Global)) misuse(in, "load outside the subset");
  check_reg(in, d, t, "destination register class");
  check_addr(in, a, s);
  space_needs(s);
  Line(*this, in).reg(d).addr(a).done();
}

void Builder::ld_v(Space s, Type t, std::initializer_list<Reg> d, Addr a, bool nc) {
  Opcode in = Opcode::mem("ld", s, nc, d.size(), t);
  if (!ld_type_ok(t, true) || (d.size() != 2 && d.size() != 4) || (nc && s != Space::Global))
    misuse(in, "vector load outside the subset");
  for (Reg r : d) check_reg(in, r, t, "vector element register class");
  check_addr(in, a, s);
  space_needs(s);
  Line(*this, in).vec(d).addr(a).done();
}

void Builder::st(Space s, Type t, Addr a, Reg v) {
  Opcode in = Opcode::mem("st", s, false, 1, t);
  if (!st_type_ok(t, false)) misuse(in, "store outside the subset");
  check_reg(in, v, t, "source register class");
  check_addr(in, a, s);
  space_needs(s);
  Line(*this, in).addr(a).reg(v).done();
}

void Builder::atom_add(bool acq_rel, Type t, Reg d, Addr a, Operand b) {
  Opcode in("atom.global");
  if (acq_rel)
    in.add(".acq_rel.gpu.add");
  else
    in.add(".relaxed.gpu.add");
  in.dot(type_piece(t));
  if (t != Type::U32 && t != Type::S32) misuse(in, "atom.add takes .u32 or .s32");
  check_reg(in, d, t, "destination register class");
  check_addr(in, a, Space::Global);
  check(in, b, t, "b must be a b32 register or an immediate");
  require(70, 60, "atom with .sem and .scope");
  Line(*this, in).reg(d).addr(a).operand(b).done();
}

// atom / red .add: "atom.global.relaxed.gpu.add.f32".
void Builder::atomic_add_opcode(Opcode &in, Space s, const char *sem, Type t) const {
  if (s == Space::Global)
    in.add(".global");
  else if (s == Space::Shared)
    in.add(".shared");
  else
    misuse(in, "atom / red .add takes Space::Global or Space::Shared");
  in.str(std::string(".") + sem + (s == Space::Global ? ".gpu.add" : ".cta.add"));
  in.dot(type_piece(t));
  if (t != Type::U32 && t != Type::S32 && t != Type::F32)
    misuse(in, ".add takes .u32, .s32 or .f32");
}

// A value operand of atom / red of type t: for .f32 an f32 or b32 register
// (PTX ISA "Types": .b32 registers hold any 32-bit type) or an f32
// immediate.
void Builder::check_word(const Opcode &in, const Operand &o, Type t, const char *what) const {
  if (t == Type::F32 && o.kind == Operand::Kind::Reg && o.reg.cls == RegClass::B32)
    return check_reg(in, o.reg, Type::B32, what);
  check(in, o, t, what);
}

void Builder::atom_add(Space s, bool acq_rel, Type t, Reg d, Addr a, Operand b) {
  Opcode in("atom");
  atomic_add_opcode(in, s, acq_rel ? "acq_rel" : "relaxed", t);
  check_word(in, d, t, "destination register class");
  check_addr(in, a, s);
  check_word(in, b, t, "b must be a register of the type or an immediate");
  require(70, 60, "atom with .sem and .scope");
  Line(*this, in).reg(d).addr(a).operand(b).done();
}

void Builder::red_add(Space s, bool release, Type t, Addr a, Operand b) {
  Opcode in("red");
  atomic_add_opcode(in, s, release ? "release" : "relaxed", t);
  check_addr(in, a, s);
  check_word(in, b, t, "b must be a register of the type or an immediate");
  require(70, 60, "red with .sem and .scope");
  Line(*this, in).addr(a).operand(b).done();
}

void Builder::red_add_v(Addr a, std::initializer_list<Reg> v) {
  Opcode in("red.global.relaxed.gpu.add");
  in.add(v.size() == 4 ? ".v4.f32" : ".v2.f32");
  if (v.size() != 2 && v.size() != 4) misuse(in, "vector red takes 2 or 4 registers");
  for (Reg r : v) check_word(in, r, Type::F32, "vector elements must be f32 or b32 registers");
  check_addr(in, a, Space::Global);
  require(90, 81, "red with a vector type");
  Line(*this, in).addr(a).vec(v).done();
}

void Builder::st_v(Space s, Type t, Addr a, std::initializer_list<Reg> v) {
  Opcode in = Opcode::mem("st", s, false, v.size(), t);
  if (!st_type_ok(t, true) || (v.size() != 2 && v.size() != 4))
    misuse(in, "vector store outside the subset");
  for (Reg r : v) check_reg(in, r, t, "vector element register class");
  check_addr(in, a, s);
  space_needs(s);
  Line(*this, in).addr(a).vec(v).done();
}

void Builder::cvta_to_global(Reg d, Reg a) {
  Opcode in("cvta.to.global.u64");
  check_reg(in, d, Type::U64, "destination register class");
  check_reg(in, a, Type::U64, "source register class");
  Line(*this, in).reg(d).reg(a).done();
}

void Builder::mov(Type t, Reg d, Operand a) {
  Opcode in("mov");
  in.dot(type_piece(t));
  if (t == Type::F16 || t == Type::BF16) misuse(in, "mov type outside the subset");
  check_reg(in, d, t, "destination register class");
  if (a.kind == Operand::Kind::Symbol && t != Type::U32) misuse(in, "symbol needs mov.u32");
  if (a.kind == Operand::Kind::Imm && t == Type::Pred) misuse(in, "immediate predicate");
  check(in, a, t, "source register class");
  if (a.kind == Operand::Kind::Special && a.special >= Special::ClusterCtarank)
    require(90, 78, "a cluster special register");
  Line(*this, in).reg(d).operand(a).done();
}

void Builder::op(Op o, Type t, Reg d, Operand a) { op(o, t, d, a, Operand{}, Operand{}); }
void Builder::op(Op o, Type t, Reg d, Operand a, Operand b) { op(o, t, d, a, b, Operand{}); }

void Builder::op(Op o, Type t, Reg d, Operand a, Operand b, Operand c) {
  const OpInfo &info = kOps[static_cast<int>(o)];
  Opcode in(info.name);
  in.dot(type_piece(t));
  if (!(info.types & bit(t))) misuse(in, "type not allowed for this operation");
  check_reg(in, d, t, "destination register class");
  if (o == Op::Max3) require(100, 88, "max.f32 with three inputs");
  const Operand *src[3] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i) {
    bool used = i < info.arity;
    bool given = src[i]->reg.valid() || src[i]->kind != Operand::Kind::Reg;
    if (used != given) misuse(in, "wrong operand count");
    if (!used) continue;
    if (i == 1 && (o == Op::Shl || o == Op::Shr))
      check(in, *src[i], Type::U32, "shift amount must be a 32-bit register or immediate");
    else
      check(in, *src[i], t, "source register class");
  }
  Line line(*this, in);
  line.reg(d);
  for (int i = 0; i < info.arity; ++i) line.operand(*src[i]);
  line.done();
}

void Builder::mul_wide(Type t, Reg d, Operand a, Operand b) {
  Opcode in("mul.wide");
  in.dot(type_piece(t));
  if (t != Type::S32 && t != Type::U32) misuse(in, "mul.wide needs s32/u32");
  check_reg(in, d, Type::B64, "destination must be 64-bit");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  Line(*this, in).reg(d).operand(a).operand(b).done();
}

void Builder::mad_wide(Type t, Reg d, Operand a, Operand b, Operand c) {
  Opcode in("mad.wide");
  in.dot(type_piece(t));
  if (t != Type::S32 && t != Type::U32) misuse(in, "mad.wide needs s32/u32");
  check_reg(in, d, Type::B64, "destination must be 64-bit");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  check(in, c, Type::B64, "addend must be 64-bit");
  Line(*this, in).reg(d).operand(a).operand(b).operand(c).done();
}

void Builder::setp(Cmp c, Type t, Reg p, Operand a, Operand b) {
  Opcode in("setp");
  in.dot(cmp_name(c)).dot(type_piece(t));
  bool type_ok = t == Type::S32 || t == Type::U32 || t == Type::S64 || t == Type::U64 ||
                 t == Type::F32 || t == Type::B32;
  if (!type_ok) misuse(in, "setp type outside the subset");
  if (c > Cmp::Ge && t != Type::F32) misuse(in, "unordered comparison needs f32");
  check_reg(in, p, Type::Pred, "destination must be a predicate");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  Line(*this, in).reg(p).operand(a).operand(b).done();
}

void Builder::selp(Type t, Reg d, Operand a, Operand b, Reg p) {
  Opcode in("selp");
  in.dot(type_piece(t));
  bool type_ok = t == Type::B32 || t == Type::U32 || t == Type::S32 || t == Type::F32 ||
                 t == Type::B64 || t == Type::U64 || t == Type::S64;
  if (!type_ok) misuse(in, "selp type outside the subset");
  check_reg(in, d, t, "destination register class");
  check(in, a, t, "source register class");
  check(in, b, t, "source register class");
  check_reg(in, p, Type::Pred, "selector must be a predicate");
  Line(*this, in).reg(d).operand(a).operand(b).reg(p).done();
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
  static constexpr Piece kRound[] = {"", ".rn", ".rzi", ".rni"};
  Opcode in("cvt");
  in.add(kRound[static_cast<int>(r)]).dot(type_piece(dt)).dot(type_piece(st));
  bool ok = false;
  for (const auto &c : kAllowed) ok = ok || (c.d == dt && c.s == st && c.r == r);
  if (!ok) misuse(in, "conversion outside the subset");
  check_reg(in, d, dt, "destination register class");
  check_reg(in, a, st, "source register class");
  Line(*this, in).reg(d).reg(a).done();
}

void Builder::bra(Label l, bool uni) {
  Opcode in(Piece(uni ? "bra.uni" : "bra"));
  if (l.id >= labels_) misuse(in, "unknown label");
  Line(*this, in).label(l).done();
}

void Builder::ret() { Line(*this, Opcode("ret")).done(); }
void Builder::exit() { Line(*this, Opcode("exit")).done(); }

void Builder::bar_sync() { Line(*this, Opcode("bar.sync")).imm(0).done(); }

void Builder::bar_warp_sync(uint32_t mask) {
  Line(*this, Opcode("bar.warp.sync")).imm(mask).done();
}

void Builder::shfl(Shfl m, Reg d, Reg a, Operand b, Operand c, uint32_t membermask) {
  static constexpr Piece kMode[] = {"bfly", "idx", "up", "down"};
  Opcode in("shfl.sync");
  in.dot(kMode[static_cast<int>(m)]).add(".b32");
  check_reg(in, d, Type::B32, "destination must be 32-bit");
  check_reg(in, a, Type::B32, "source must be 32-bit");
  check(in, b, Type::B32, "lane operand must be b32");
  check(in, c, Type::B32, "clamp operand must be b32");
  Line(*this, in).reg(d).reg(a).operand(b).operand(c).imm(membermask).done();
}

void Builder::vote(bool all, Reg d, Reg a, uint32_t membermask) {
  Opcode in(all ? "vote.sync.all.pred" : "vote.sync.any.pred");
  check_reg(in, d, Type::Pred, "destination must be a predicate");
  check_reg(in, a, Type::Pred, "source must be a predicate");
  Line(*this, in).reg(d).reg(a).imm(membermask).done();
}

void Builder::mma_m16n8k16(Type ab, const Reg *d, const Reg *a, const Reg *b, const Reg *c) {
  Opcode in("mma.sync.aligned.m16n8k16.row.col.f32");
  in.dot(type_piece(ab)).dot(type_piece(ab)).add(".f32");
  if (ab != Type::F16 && ab != Type::BF16) misuse(in, "mma operands must be f16 or bf16");
  for (int i = 0; i < 4; ++i) {
    check_reg(in, d[i], Type::F32, "D must be f32 registers");
    check_reg(in, c[i], Type::F32, "C must be f32 registers");
    if (a[i].cls != RegClass::B32) misuse(in, "A must be b32 registers");
    check_reg(in, a[i], Type::B32, "A must be b32 registers");
  }
  for (int i = 0; i < 2; ++i) {
    if (b[i].cls != RegClass::B32) misuse(in, "B must be b32 registers");
    check_reg(in, b[i], Type::B32, "B must be b32 registers");
  }
  Line(*this, in).vec(d, 4).vec(a, 4).vec(b, 2).vec(c, 4).done();
}

void Builder::mma_m16n8k32_f8(Fp8 a_type, Fp8 b_type, const Reg *d, const Reg *a, const Reg *b,
                              const Reg *c) {
  Opcode in("mma.sync.aligned.m16n8k32.row.col.f32");
  in.str(a_type == Fp8::E5M2 ? ".e5m2" : ".e4m3");
  in.str(b_type == Fp8::E5M2 ? ".e5m2" : ".e4m3");
  in.add(".f32");
  for (int i = 0; i < 4; ++i) {
    check_reg(in, d[i], Type::F32, "D must be f32 registers");
    check_reg(in, c[i], Type::F32, "C must be f32 registers");
    if (a[i].cls != RegClass::B32) misuse(in, "A must be b32 registers");
    check_reg(in, a[i], Type::B32, "A must be b32 registers");
  }
  for (int i = 0; i < 2; ++i) {
    if (b[i].cls != RegClass::B32) misuse(in, "B must be b32 registers");
    check_reg(in, b[i], Type::B32, "B must be b32 registers");
  }
  // PTX ISA "mma", Target ISA notes and PTX ISA notes: .e4m3 / .e5m2 on
  // m16n8k32 need sm_89 and PTX ISA 8.4 (ptxas 13 says the same).
  require(89, 84, "mma with fp8 (.e4m3/.e5m2) operands");
  Line(*this, in).vec(d, 4).vec(a, 4).vec(b, 2).vec(c, 4).done();
}

// ldmatrix / stmatrix .m8n8 .b16: the opcode `in` gets the shape, count
// and .shared.b16; count 1, 2 or 4 b32 registers and a shared address.
void Builder::matrix_m8n8(Opcode &in, bool trans, const Reg *r, int count, Addr a,
                          const char *bad_count, const char *bad_reg) const {
  if (count == 1)
    in.add(".x1");
  else if (count == 2)
    in.add(".x2");
  else
    in.add(".x4");
  if (trans) in.add(".trans");
  in.add(".shared.b16");
  if (count != 1 && count != 2 && count != 4) misuse(in, bad_count);
  for (int i = 0; i < count; ++i) {
    if (r[i].cls != RegClass::B32) misuse(in, bad_reg);
    check_reg(in, r[i], Type::B32, bad_reg);
  }
  check_addr(in, a, Space::Shared);
}

void Builder::ldmatrix(bool trans, const Reg *d, int count, Addr a) {
  Opcode in("ldmatrix.sync.aligned.m8n8");
  matrix_m8n8(in, trans, d, count, a, "ldmatrix takes 1, 2 or 4 registers",
              "ldmatrix destinations must be b32 registers");
  Line(*this, in).vec(d, static_cast<size_t>(count)).addr(a).done();
}

void Builder::stmatrix(bool trans, const Reg *r, int count, Addr a) {
  Opcode in("stmatrix.sync.aligned.m8n8");
  matrix_m8n8(in, trans, r, count, a, "stmatrix takes 1, 2 or 4 registers",
              "stmatrix sources must be b32 registers");
  Line(*this, in).addr(a).vec(r, static_cast<size_t>(count)).done();
}

void Builder::cp_async_cg16(Addr dst, Addr src, Operand src_size) {
  Opcode in("cp.async.cg.shared.global");
  check_addr(in, dst, Space::Shared);
  check_addr(in, src, Space::Global);
  if (src_size.kind == Operand::Kind::Imm && (src_size.imm < 0 || src_size.imm > 16))
    misuse(in, "src-size outside 0..16");
  if (src_size.kind != Operand::Kind::Imm && src_size.kind != Operand::Kind::Reg)
    misuse(in, "src-size must be a b32 register or an immediate");
  check(in, src_size, Type::B32, "src-size must be a b32 register");
  if (src_size.kind == Operand::Kind::Reg && src_size.reg.cls != RegClass::B32)
    misuse(in, "src-size must be a b32 register");
  Line(*this, in).addr(dst).addr(src).imm(16).operand(src_size).done();
}

void Builder::cp_async_cg16(Addr dst, Addr src) {
  Opcode in("cp.async.cg.shared.global");
  check_addr(in, dst, Space::Shared);
  check_addr(in, src, Space::Global);
  Line(*this, in).addr(dst).addr(src).imm(16).done();
}

void Builder::cp_async_ca(Addr dst, Addr src, int cp_size, Operand src_size) {
  Opcode in("cp.async.ca.shared.global");
  check_addr(in, dst, Space::Shared);
  check_addr(in, src, Space::Global);
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) misuse(in, "cp-size must be 4, 8 or 16");
  if (src_size.kind == Operand::Kind::Imm && (src_size.imm < 0 || src_size.imm > cp_size))
    misuse(in, "src-size outside 0..cp-size");
  if (src_size.kind != Operand::Kind::Imm && src_size.kind != Operand::Kind::Reg)
    misuse(in, "src-size must be a b32 register or an immediate");
  check(in, src_size, Type::B32, "src-size must be a b32 register");
  if (src_size.kind == Operand::Kind::Reg && src_size.reg.cls != RegClass::B32)
    misuse(in, "src-size must be a b32 register");
  Line(*this, in).addr(dst).addr(src).imm(cp_size).operand(src_size).done();
}

void Builder::cp_async_commit() { Line(*this, Opcode("cp.async.commit_group")).done(); }

void Builder::cp_async_wait(int n) {
  Opcode in("cp.async.wait_group");
  if (n < 0) misuse(in, "negative group count");
  Line(*this, in).imm(n).done();
}

void Builder::cvt_pack(Type half, Reg d, Reg hi, Reg lo) {
  Opcode in("cvt.rn");
  in.dot(type_piece(half)).add("x2.f32");
  if (half != Type::F16 && half != Type::BF16) misuse(in, "packed cvt needs f16 or bf16");
  if (d.cls != RegClass::B32) misuse(in, "destination must be a b32 register");
  check_reg(in, d, Type::B32, "destination must be a b32 register");
  check_reg(in, hi, Type::F32, "sources must be f32 registers");
  check_reg(in, lo, Type::F32, "sources must be f32 registers");
  Line(*this, in).reg(d).reg(hi).reg(lo).done();
}

void Builder::cvt_f8x2_f32(bool e5m2, Reg d, Reg hi, Reg lo) {
  Opcode in("cvt.rn.satfinite");
  in.str(e5m2 ? ".e5m2x2.f32" : ".e4m3x2.f32");
  check_reg(in, d, Type::B16, "destination must be a b16 register");
  check_reg(in, hi, Type::F32, "sources must be f32 registers");
  check_reg(in, lo, Type::F32, "sources must be f32 registers");
  Line(*this, in).reg(d).reg(hi).reg(lo).done();
}

void Builder::cvt_f16x2_f8x2(bool e5m2, Reg d, Reg a) {
  Opcode in("cvt.rn.f16x2");
  in.str(e5m2 ? ".e5m2x2" : ".e4m3x2");
  check_reg(in, d, Type::B32, "destination must be a b32 register");
  check_reg(in, a, Type::B16, "source must be a b16 register");
  Line(*this, in).reg(d).reg(a).done();
}

void Builder::unpack_b32(Reg lo, Reg hi, Reg a) {
  Opcode in("mov.b32");
  check_reg(in, lo, Type::B16, "destinations must be b16 registers");
  check_reg(in, hi, Type::B16, "destinations must be b16 registers");
  check_reg(in, a, Type::B32, "source must be a b32 register");
  Line(*this, in).vec({lo, hi}).reg(a).done();
}

void Builder::pack_b32(Reg d, Reg lo, Reg hi) {
  Opcode in("mov.b32");
  check_reg(in, d, Type::B32, "destination must be a b32 register");
  check_reg(in, lo, Type::B16, "sources must be b16 registers");
  check_reg(in, hi, Type::B16, "sources must be b16 registers");
  Line(*this, in).reg(d).vec({lo, hi}).done();
}

void Builder::param_address(Reg d) {
  Opcode in("mov.u64");
  check_reg(in, d, Type::B64, "the address is a b64 register");
  {
    Line l(*this, in);
    l.reg(d).param_name().done();
  }
  Opcode c("cvta.param.u64");
  Line(*this, c).reg(d).reg(d).done();
}

void Builder::mbarrier_init(Addr a, Operand count) {
  Opcode in("mbarrier.init.shared::cta.b64");
  check_addr(in, a, Space::Shared);
  check(in, count, Type::B32, "count must be a b32 register or an immediate");
  if (count.kind == Operand::Kind::Imm && (count.imm < 1 || count.imm > (1 << 20) - 1))
    misuse(in, "count outside 1..2^20-1");
  Line(*this, in).addr(a).operand(count).done();
}

void Builder::mbarrier_arrive(Addr a) {
  Opcode in("mbarrier.arrive.shared::cta.b64");
  check_addr(in, a, Space::Shared);
  Line(*this, in).sink().addr(a).done();
}

void Builder::mbarrier_arrive_expect_tx(Addr a, Operand tx) {
  Opcode in("mbarrier.arrive.expect_tx.shared::cta.b64");
  check_addr(in, a, Space::Shared);
  check(in, tx, Type::B32, "tx must be a b32 register or an immediate");
  if (tx.kind == Operand::Kind::Imm && (tx.imm < 0 || tx.imm > (1 << 20) - 1))
    misuse(in, "tx-count outside 0..2^20-1");
  Line(*this, in).sink().addr(a).operand(tx).done();
}

void Builder::mbarrier_try_wait_parity(Reg p, Addr a, Operand parity) {
  Opcode in("mbarrier.try_wait.parity.shared::cta.b64");
  if (p.cls != RegClass::Pred) misuse(in, "the result is a predicate");
  check_addr(in, a, Space::Shared);
  check(in, parity, Type::B32, "parity must be a b32 register or an immediate");
  Line(*this, in).reg(p).addr(a).operand(parity).done();
}

void Builder::fence_proxy_async() { Line(*this, Opcode("fence.proxy.async.shared::cta")).done(); }
void Builder::griddepcontrol_wait() { Line(*this, Opcode("griddepcontrol.wait")).done(); }
void Builder::griddepcontrol_launch_dependents() {
  Line(*this, Opcode("griddepcontrol.launch_dependents")).done();
}

// The opcode of cp.async.bulk.tensor.Nd (tile, global -> shared::cluster,
// mbarrier completion) with its operands checked; `multicast` appends
// .multicast::cluster.
void Builder::bulk_tensor_opcode(Opcode &in, Addr dst, Reg tmap, const Reg *coords, int n,
                                 Addr mbar, bool multicast) const {
  if (n < 1 || n > 5) misuse(in, "1 to 5 coordinates");
  in.str("." + std::to_string(n) + "d.shared::cluster.global.mbarrier::complete_tx::bytes");
  if (multicast) in.str(".multicast::cluster");
  check_addr(in, dst, Space::Shared);
  check_addr(in, mbar, Space::Shared);
  check_reg(in, tmap, Type::B64, "the tensor map is a b64 generic address");
  for (int i = 0; i < n; ++i) {
    if (coords[i].cls != RegClass::B32) misuse(in, "coordinates are b32 registers");
    check_reg(in, coords[i], Type::S32, "coordinates are b32 registers");
  }
}

void Builder::cp_async_bulk_tensor(Addr dst, Reg tmap, const Reg *coords, int n, Addr mbar) {
  Opcode in("cp.async.bulk.tensor");
  bulk_tensor_opcode(in, dst, tmap, coords, n, mbar, false);
  Line(*this, in).addr(dst).tensor(tmap, coords, static_cast<size_t>(n)).addr(mbar).done();
}

void Builder::cp_reduce_async_bulk_add(Type t, Addr dst, Addr src, Operand size) {
  Opcode in("cp.reduce.async.bulk");
  in.add(".global.shared::cta.bulk_group.add");
  in.dot(type_piece(t));
  if (t != Type::F32 && t != Type::U32 && t != Type::S32) misuse(in, ".add takes f32, u32 or s32");
  check_addr(in, dst, Space::Global);
  check_addr(in, src, Space::Shared);
  if (dst.offset % 16 || src.offset % 16) misuse(in, "offsets must keep 16-byte alignment");
  check(in, size, Type::U32, "size must be a b32 register or an immediate");
  if (size.kind == Operand::Kind::Imm && (size.imm < 0 || size.imm % 16))
    misuse(in, "size must be a multiple of 16");
  require(90, 80, "cp.reduce.async.bulk");
  Line(*this, in).addr(dst).addr(src).operand(size).done();
}

void Builder::cp_reduce_async_bulk_tensor_add(Reg tmap, const Reg *coords, int n, Addr src) {
  Opcode in("cp.reduce.async.bulk.tensor");
  if (n < 1 || n > 5) misuse(in, "1 to 5 coordinates");
  in.str("." + std::to_string(n) + "d.global.shared::cta.add.tile.bulk_group");
  check_addr(in, src, Space::Shared);
  check_reg(in, tmap, Type::B64, "the tensor map is a b64 generic address");
  for (int i = 0; i < n; ++i) {
    if (coords[i].cls != RegClass::B32) misuse(in, "coordinates are b32 registers");
    check_reg(in, coords[i], Type::S32, "coordinates are b32 registers");
  }
  require(90, 80, "cp.reduce.async.bulk.tensor");
  Line(*this, in).tensor(tmap, coords, static_cast<size_t>(n)).addr(src).done();
}

void Builder::cp_async_bulk_commit() {
  require(90, 80, "cp.async.bulk.commit_group");
  Line(*this, Opcode("cp.async.bulk.commit_group")).done();
}

void Builder::cp_async_bulk_wait(int n, bool read) {
  Opcode in("cp.async.bulk.wait_group");
  if (read) in.add(".read");
  if (n < 0 || n > 63) misuse(in, "wait_group takes 0..63");
  require(90, 80, "cp.async.bulk.wait_group");
  Line(*this, in).imm(n).done();
}

void Builder::wgmma_fence() { Line(*this, Opcode("wgmma.fence.sync.aligned")).done(); }
void Builder::wgmma_commit() { Line(*this, Opcode("wgmma.commit_group.sync.aligned")).done(); }
void Builder::wgmma_wait(int n) {
  Opcode in("wgmma.wait_group.sync.aligned");
  if (n < 0 || n > 7) misuse(in, "wait_group takes 0..7");
  Line(*this, in).imm(n).done();
}

namespace {
// "wgmma.mma_async.sync.aligned.m64nNk16.f32.AB.AB"
std::string wgmma_opcode(Type ab, int n) {
  std::string o = "wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + "k16.f32";
  const char *t = ab == Type::BF16 ? ".bf16" : ".f16";
  return o + t + t;
}
}  // namespace

void Builder::wgmma_ss(Type ab, int n, const Reg *d, Reg desc_a, Reg desc_b, Operand scale_d,
                       bool trans_b) {
  Opcode in(wgmma_opcode(ab, n));
  if (ab != Type::F16 && ab != Type::BF16) misuse(in, "wgmma operands must be f16 or bf16");
  const int trans[2] = {0, trans_b ? 1 : 0};
  wgmma_line(in, n, d, nullptr, desc_a, desc_b, scale_d, trans, 2);
}

void Builder::wgmma_rs(Type ab, int n, const Reg *d, const Reg *a, Reg desc_b, Operand scale_d,
                       bool trans_b) {
  Opcode in(wgmma_opcode(ab, n));
  if (ab != Type::F16 && ab != Type::BF16) misuse(in, "wgmma operands must be f16 or bf16");
  const int trans[1] = {trans_b ? 1 : 0};
  wgmma_line(in, n, d, a, Reg(), desc_b, scale_d, trans, 1);
}

namespace {
// "wgmma.mma_async.sync.aligned.m64nNk32.f32.A.B", A and B e4m3 / e5m2
std::string wgmma_fp8_opcode(Fp8 a, Fp8 b, int n) {
  auto t = [](Fp8 f) { return f == Fp8::E5M2 ? ".e5m2" : ".e4m3"; };
  return "wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + "k32.f32" + t(a) + t(b);
}
}  // namespace

void Builder::wgmma_ss_fp8(Fp8 a_type, Fp8 b_type, int n, const Reg *d, Reg desc_a, Reg desc_b,
                           Operand scale_d) {
  wgmma_line(Opcode(wgmma_fp8_opcode(a_type, b_type, n)), n, d, nullptr, desc_a, desc_b, scale_d,
             nullptr, 0);
}

void Builder::wgmma_rs_fp8(Fp8 a_type, Fp8 b_type, int n, const Reg *d, const Reg *a, Reg desc_b,
                           Operand scale_d) {
  wgmma_line(Opcode(wgmma_fp8_opcode(a_type, b_type, n)), n, d, a, Reg(), desc_b, scale_d, nullptr,
             0);
}

// d, then {a} (a set) or desc_a, desc_b, scale-d, imm-scale-a/b = 1 and the
// imm-trans operands.
void Builder::wgmma_line(const Opcode &in, int n, const Reg *d, const Reg *a, Reg desc_a,
                         Reg desc_b, const Operand &scale_d, const int *trans, int ntrans) {
  if (n < 8 || n > 256 || n % 8) misuse(in, "N must be a multiple of 8 in 8..256");
  for (int i = 0; i < n / 2; ++i) check_reg(in, d[i], Type::F32, "D must be f32 registers");
  if (scale_d.kind == Operand::Kind::Imm) {
    if (scale_d.imm != 0 && scale_d.imm != 1) misuse(in, "scale-d is 0 or 1");
  } else if (scale_d.kind != Operand::Kind::Reg || scale_d.reg.cls != RegClass::Pred) {
    misuse(in, "scale-d is an immediate or a predicate");
  }
  if (a) {
    for (int i = 0; i < 4; ++i) {
      if (a[i].cls != RegClass::B32) misuse(in, "A must be b32 registers");
      check_reg(in, a[i], Type::B32, "A must be b32 registers");
    }
  } else {
    check_reg(in, desc_a, Type::B64, "descriptors are b64 registers");
  }
  check_reg(in, desc_b, Type::B64, "descriptors are b64 registers");
  Line l(*this, in, 10 * static_cast<size_t>(n));
  l.vec(d, static_cast<size_t>(n / 2));
  if (a)
    l.vec(a, 4);
  else
    l.reg(desc_a);
  l.reg(desc_b).operand(scale_d).imm(1).imm(1);
  for (int i = 0; i < ntrans; ++i) l.imm(trans[i]);
  l.done();
}

void Builder::elect_sync(Reg pred, uint32_t membermask) {
  Opcode in("elect.sync");
  if (pred.cls != RegClass::Pred) misuse(in, "the result is a predicate");
  Line l(*this, in);
  l.sink();
  l.pipe(pred).hex(membermask).done();
}

void Builder::elect_sync(Reg d, Reg pred, uint32_t membermask) {
  Opcode in("elect.sync");
  if (d.cls != RegClass::B32) misuse(in, "the lane id is a b32 register");
  check_reg(in, d, Type::B32, "the lane id is a b32 register");
  if (pred.cls != RegClass::Pred) misuse(in, "the result is a predicate");
  Line(*this, in).reg(d).pipe(pred).hex(membermask).done();
}

void Builder::setmaxnreg(bool inc, int n) {
  Opcode in(std::string(inc ? "setmaxnreg.inc" : "setmaxnreg.dec") + ".sync.aligned.u32");
  if (n < 24 || n > 256 || n % 8) misuse(in, "register count must be a multiple of 8 in 24..256");
  Line(*this, in).imm(n).done();
}

void Builder::require(int sm, int isa, const char *what, bool arch) {
  if (need_sm_ < sm || need_isa_ < isa) {
    need_sm_ = std::max(need_sm_, sm);
    need_isa_ = std::max(need_isa_, isa);
    need_what_ = what;
  }
  need_tcgen05_ = need_tcgen05_ || arch;
}

// ----------------------------------------------------------- clusters ----
// PTX ISA "Cluster of Cooperative Thread Arrays", "mapa", "barrier.cluster",
// "mbarrier.arrive", "membar/fence", "cp.async.bulk.tensor" (sm_90, PTX ISA
// 7.8; the multicast TMA and the remote mbarrier arrive 8.0).

void Builder::set_cluster_dims(uint32_t x, uint32_t y, uint32_t z) {
  const uint64_t n = uint64_t{x} * y * z;
  if (n == 0 && (x || y || z)) {
    std::fprintf(stderr, "flashattn ptx builder (%s): cluster shape %ux%ux%u has a zero\n",
                 entry_.c_str(), x, y, z);
    std::abort();
  }
  if (n > 16) {
    std::fprintf(stderr, "flashattn ptx builder (%s): cluster shape %ux%ux%u exceeds 16 CTAs\n",
                 entry_.c_str(), x, y, z);
    std::abort();
  }
  cluster_[0] = x;
  cluster_[1] = y;
  cluster_[2] = z;
  if (n) require(90, 78, ".reqnctapercluster");
}

void Builder::is_explicit_cluster(Reg p) {
  Opcode in("mov.pred");
  if (p.cls != RegClass::Pred) misuse(in, "%is_explicit_cluster is a predicate");
  check_reg(in, p, Type::Pred, "destination register class");
  require(90, 78, "%is_explicit_cluster");
  Line line(*this, in);
  line.reg(p).raw("%is_explicit_cluster").done();
}

void Builder::mapa(Reg d, Operand a, Operand rank) {
  Opcode in("mapa.shared::cluster.u32");
  check_reg(in, d, Type::U32, "d must be a b32 register");
  if (a.kind != Operand::Kind::Reg && a.kind != Operand::Kind::Symbol)
    misuse(in, "the address is a b32 register or a shared symbol");
  check(in, a, Type::U32, "the address is a b32 register or a shared symbol");
  check(in, rank, Type::U32, "the rank is a b32 register or an immediate");
  if (rank.kind == Operand::Kind::Imm && (rank.imm < 0 || rank.imm > 15))
    misuse(in, "rank outside 0..15");
  require(90, 78, "mapa");
  Line(*this, in).reg(d).operand(a).operand(rank).done();
}

void Builder::barrier_cluster_arrive(bool relaxed) {
  require(90, relaxed ? 80 : 78, "barrier.cluster.arrive");
  Line(*this, Opcode(std::string(relaxed ? "barrier.cluster.arrive.relaxed.aligned"
                                         : "barrier.cluster.arrive.aligned")))
      .done();
}

void Builder::barrier_cluster_wait() {
  require(90, 78, "barrier.cluster.wait");
  Line(*this, Opcode("barrier.cluster.wait.aligned")).done();
}

void Builder::mbarrier_arrive_cluster(Addr a) {
  Opcode in(std::string("mbarrier.arrive.release.cluster.shared::cluster.b64"));
  check_addr(in, a, Space::Cluster);
  require(90, 80, "mbarrier.arrive on shared::cluster");
  Line(*this, in).sink().addr(a).done();
}

void Builder::fence_mbarrier_init() {
  require(90, 80, "fence.mbarrier_init");
  Line(*this, Opcode("fence.mbarrier_init.release.cluster")).done();
}

void Builder::cp_async_bulk_tensor_multicast(Addr dst, Reg tmap, const Reg *coords, int n,
                                             Addr mbar, Reg cta_mask) {
  Opcode in("cp.async.bulk.tensor");
  bulk_tensor_opcode(in, dst, tmap, coords, n, mbar, true);
  check_reg(in, cta_mask, Type::B16, "ctaMask is a b16 register");
  require(90, 80, "cp.async.bulk.tensor .multicast::cluster");
  Line(*this, in)
      .addr(dst)
      .tensor(tmap, coords, static_cast<size_t>(n))
      .addr(mbar)
      .reg(cta_mask)
      .done();
}

// ------------------------------------------------------------ tcgen05 ----
// PTX ISA "tcgen05" (Target ISA notes: sm_100a / sm_103a; PTX ISA 8.6).

void Builder::tcgen05_ncols(const Opcode &in, const Operand &ncols) const {
  check(in, ncols, Type::B32, "nCols must be a b32 register or an immediate");
  if (ncols.kind == Operand::Kind::Imm &&
      (ncols.imm < 32 || ncols.imm > 512 || (ncols.imm & (ncols.imm - 1))))
    misuse(in, "nCols must be a power of 2 in 32..512");
}

// ".cta_group::1" / ".cta_group::2" (anything else: "::?", refused by
// check_cta_group).
std::string Builder::cta_group_text(int cta_group) {
  return cta_group == 1 ? ".cta_group::1" : cta_group == 2 ? ".cta_group::2" : ".cta_group::?";
}

void Builder::check_cta_group(const Opcode &in, int cta_group) const {
  if (cta_group != 1 && cta_group != 2) misuse(in, "cta_group is 1 or 2");
}

void Builder::tcgen05_alloc(Addr dst, Operand ncols, int cta_group) {
  Opcode in("tcgen05.alloc" + cta_group_text(cta_group) + ".sync.aligned.shared::cta.b32");
  check_cta_group(in, cta_group);
  check_addr(in, dst, Space::Shared);
  tcgen05_ncols(in, ncols);
  require(100, 86, "tcgen05", true);
  Line(*this, in).addr(dst).operand(ncols).done();
}

void Builder::tcgen05_dealloc(Reg taddr, Operand ncols, int cta_group) {
  Opcode in("tcgen05.dealloc" + cta_group_text(cta_group) + ".sync.aligned.b32");
  check_cta_group(in, cta_group);
  check_reg(in, taddr, Type::B32, "taddr must be a b32 register");
  tcgen05_ncols(in, ncols);
  require(100, 86, "tcgen05", true);
  Line(*this, in).reg(taddr).operand(ncols).done();
}

void Builder::tcgen05_relinquish_alloc_permit(int cta_group) {
  Opcode in("tcgen05.relinquish_alloc_permit" + cta_group_text(cta_group) + ".sync.aligned");
  check_cta_group(in, cta_group);
  require(100, 86, "tcgen05", true);
  Line(*this, in).done();
}

// tcgen05.ld / st .32x32b.xN.b32: n registers (1, 2, 4, .., 128), a b32 taddr.
void Builder::tcgen05_32x32b(const char *op, const Reg *r, int n, Reg taddr, bool ld) {
  Opcode in{std::string(op)};
  if (n < 1 || n > 128 || (n & (n - 1))) misuse(in, "the register count must be 1, 2, 4, .., 128");
  in.add(".x");
  in.str(std::to_string(n));
  in.add(".b32");
  check_reg(in, taddr, Type::B32, "taddr must be a b32 register");
  // 32-bit registers: b32, or f32 (PTX ISA "Types": a .b32 operand takes
  // any 32-bit register).
  for (int i = 0; i < n; ++i) check_reg(in, r[i], Type::B32, "the registers must be 32-bit");
  require(100, 86, "tcgen05", true);
  const Addr a = at(taddr);
  Line line(*this, in, 16 * static_cast<size_t>(n));
  if (ld)
    line.vec(r, static_cast<size_t>(n)).addr(a).done();
  else
    line.addr(a).vec(r, static_cast<size_t>(n)).done();
}

void Builder::tcgen05_ld_32x32b(const Reg *d, int n, Reg taddr) {
  tcgen05_32x32b("tcgen05.ld.sync.aligned.32x32b", d, n, taddr, true);
}

void Builder::tcgen05_st_32x32b(Reg taddr, const Reg *v, int n) {
  tcgen05_32x32b("tcgen05.st.sync.aligned.32x32b", v, n, taddr, false);
}

void Builder::tcgen05_wait_ld() {
  require(100, 86, "tcgen05", true);
  Line(*this, Opcode("tcgen05.wait::ld.sync.aligned")).done();
}
void Builder::tcgen05_wait_st() {
  require(100, 86, "tcgen05", true);
  Line(*this, Opcode("tcgen05.wait::st.sync.aligned")).done();
}
void Builder::tcgen05_fence_before_thread_sync() {
  require(100, 86, "tcgen05", true);
  Line(*this, Opcode("tcgen05.fence::before_thread_sync")).done();
}
void Builder::tcgen05_fence_after_thread_sync() {
  require(100, 86, "tcgen05", true);
  Line(*this, Opcode("tcgen05.fence::after_thread_sync")).done();
}

namespace {
const char *mma_kind_name(Builder::MmaKind k) {
  return k == Builder::MmaKind::F16 ? "f16" : "f8f6f4";
}
}  // namespace

void Builder::tcgen05_mma_line(MmaKind kind, Reg d_taddr, Reg a, bool a_tmem, Reg desc_b,
                               const Operand &idesc, const Operand &enable_input_d, int cta_group) {
  Opcode in("tcgen05.mma" + cta_group_text(cta_group) + ".kind::" + mma_kind_name(kind));
  check_cta_group(in, cta_group);
  check_reg(in, d_taddr, Type::B32, "the D taddr must be a b32 register");
  if (a_tmem)
    check_reg(in, a, Type::B32, "the A taddr must be a b32 register");
  else
    check_reg(in, a, Type::B64, "descriptors are b64 registers");
  check_reg(in, desc_b, Type::B64, "descriptors are b64 registers");
  check(in, idesc, Type::B32, "idesc must be a b32 register or an immediate");
  if (idesc.kind == Operand::Kind::Imm && (idesc.imm < 0 || idesc.imm > 0xffffffffll))
    misuse(in, "idesc is 32 bits");
  if (enable_input_d.kind == Operand::Kind::Imm) {
    if (enable_input_d.imm != 0 && enable_input_d.imm != 1) misuse(in, "enable-input-d is 0 or 1");
  } else if (enable_input_d.kind != Operand::Kind::Reg ||
             enable_input_d.reg.cls != RegClass::Pred) {
    misuse(in, "enable-input-d is an immediate or a predicate");
  }
  require(100, 86, "tcgen05", true);
  Line l(*this, in);
  l.addr(at(d_taddr));
  if (a_tmem)
    l.addr(at(a));
  else
    l.reg(a);
  l.reg(desc_b).operand(idesc).operand(enable_input_d).done();
}

void Builder::tcgen05_mma_ss(MmaKind kind, Reg d_taddr, Reg desc_a, Reg desc_b, Operand idesc,
                             Operand enable_input_d, int cta_group) {
  tcgen05_mma_line(kind, d_taddr, desc_a, false, desc_b, idesc, enable_input_d, cta_group);
}

void Builder::tcgen05_mma_ts(MmaKind kind, Reg d_taddr, Reg a_taddr, Reg desc_b, Operand idesc,
                             Operand enable_input_d, int cta_group) {
  tcgen05_mma_line(kind, d_taddr, a_taddr, true, desc_b, idesc, enable_input_d, cta_group);
}

void Builder::tcgen05_commit(Addr mbar, int cta_group) {
  Opcode in("tcgen05.commit" + cta_group_text(cta_group) +
            ".mbarrier::arrive::one.shared::cluster.b64");
  check_cta_group(in, cta_group);
  check_addr(in, mbar, Space::Shared);
  require(100, 86, "tcgen05", true);
  Line(*this, in).addr(mbar).done();
}

void Builder::tcgen05_commit_multicast(Addr mbar, Reg cta_mask, int cta_group) {
  Opcode in("tcgen05.commit" + cta_group_text(cta_group) +
            ".mbarrier::arrive::one.shared::cluster.multicast::cluster.b64");
  check_cta_group(in, cta_group);
  check_addr(in, mbar, Space::Shared);
  check_reg(in, cta_mask, Type::B16, "ctaMask is a b16 register");
  require(100, 86, "tcgen05", true);
  Line(*this, in).addr(mbar).reg(cta_mask).done();
}

void Builder::f32x2(Op o, Reg d, Reg a, Reg b, Reg c) {
  const char *name = o == Op::Add   ? "add.f32x2"
                     : o == Op::Sub ? "sub.f32x2"
                     : o == Op::Mul ? "mul.f32x2"
                     : o == Op::Fma ? "fma.rn.f32x2"
                                    : nullptr;
  Opcode in(std::string(name ? name : "f32x2"));
  if (!name) misuse(in, "only add, sub, mul and fma have an f32x2 form");
  if (c.valid() != (o == Op::Fma)) misuse(in, "fma takes three sources, the others two");
  check_reg(in, d, Type::B64, "f32x2 values are b64 registers");
  check_reg(in, a, Type::B64, "f32x2 values are b64 registers");
  check_reg(in, b, Type::B64, "f32x2 values are b64 registers");
  if (c.valid()) check_reg(in, c, Type::B64, "f32x2 values are b64 registers");
  require(100, 86, "f32x2 arithmetic");
  Line l(*this, in);
  l.reg(d).reg(a).reg(b);
  if (c.valid()) l.reg(c);
  l.done();
}

void Builder::pack_f32x2(Reg d, Reg lo, Reg hi) {
  Opcode in("mov.b64");
  check_reg(in, d, Type::B64, "destination must be a b64 register");
  check_reg(in, lo, Type::F32, "sources must be f32 registers");
  check_reg(in, hi, Type::F32, "sources must be f32 registers");
  Line(*this, in).reg(d).vec({lo, hi}).done();
}

void Builder::unpack_f32x2(Reg lo, Reg hi, Reg a) {
  Opcode in("mov.b64");
  check_reg(in, lo, Type::F32, "destinations must be f32 registers");
  check_reg(in, hi, Type::F32, "destinations must be f32 registers");
  check_reg(in, a, Type::B64, "source must be a b64 register");
  Line(*this, in).vec({lo, hi}).reg(a).done();
}

void Builder::tcgen05_cp(TmemCpShape shape, Reg taddr, Reg s_desc) {
  Opcode in(std::string("tcgen05.cp.cta_group::1.") +
            (shape == TmemCpShape::k128x256b ? "128x256b" : "128x128b"));
  check_reg(in, taddr, Type::B32, "taddr must be a b32 register");
  check_reg(in, s_desc, Type::B64, "descriptors are b64 registers");
  require(100, 86, "tcgen05", true);
  Line(*this, in).addr(at(taddr)).reg(s_desc).done();
}

void Builder::bar_sync(int id, int count) {
  Opcode in("bar.sync");
  if (id < 0 || id > 15) misuse(in, "barrier id outside 0..15");
  if (count <= 0 || count % 32) misuse(in, "thread count must be a positive multiple of 32");
  Line(*this, in).imm(id).imm(count).done();
}

void Builder::bar_arrive(int id, int count) {
  Opcode in("bar.arrive");
  if (id < 0 || id > 15) misuse(in, "barrier id outside 0..15");
  if (count <= 0 || count % 32) misuse(in, "thread count must be a positive multiple of 32");
  Line(*this, in).imm(id).imm(count).done();
}

std::string Builder::header(int isa_version_x10, int sm, uint32_t maxntid) const {
  if (sm < need_sm_ || isa_version_x10 < need_isa_) {
    std::fprintf(stderr,
                 "flashattn ptx builder (%s): %s needs .target sm_%d or higher and PTX ISA "
                 "%d.%d or later; emit() was asked for sm_%d with PTX ISA %d.%d\n",
                 entry_.c_str(), need_what_, need_sm_, need_isa_ / 10, need_isa_ % 10, sm,
                 isa_version_x10 / 10, isa_version_x10 % 10);
    std::abort();
  }
  if (need_tcgen05_ &&
      (!arch_specific_ || (sm != 100 && sm != 103) || (sm == 103 && isa_version_x10 < 88))) {
    std::fprintf(stderr,
                 "flashattn ptx builder (%s): tcgen05 needs .target sm_100a (PTX ISA 8.6) or "
                 "sm_103a (PTX ISA 8.8; set_arch_specific); emit() was asked for sm_%d%s with "
                 "PTX ISA %d.%d\n",
                 entry_.c_str(), sm, arch_specific_ ? "a" : "", isa_version_x10 / 10,
                 isa_version_x10 % 10);
    std::abort();
  }
  std::string o;
  o.reserve(512 + 64 * shared_.size() + 2 * entry_.size());
  o += "//\n// Generated by flashattn. Do not edit.\n//\n\n.version ";
  o += std::to_string(isa_version_x10 / 10);
  o += '.';
  o += std::to_string(isa_version_x10 % 10);
  o += "\n.target sm_";
  o += std::to_string(sm);
  if (arch_specific_) o += 'a';
  o += "\n.address_size 64\n\n";
  // Dynamic shared arrays are declared at module scope (ptxas rejects
  // .extern inside an entry).
  for (const auto &s : shared_) {
    if (!s.is_extern) continue;
    o += ".extern .shared .align ";
    o += std::to_string(s.align);
    o += " .b8 ";
    o += s.name;
    o += "[];\n\n";
  }
  o += ".visible .entry ";
  o += entry_;
  o += "(\n\t.param .align ";
  o += std::to_string(param_align_);
  o += " .b8 ";
  o += param_name_;
  o += '[';
  o += std::to_string(param_bytes_);
  o += "]\n)\n";
  if (maxntid) {
    o += ".maxntid ";
    o += std::to_string(maxntid);
    o += ", 1, 1\n";
    if (min_ctas_) {
      o += ".minnctapersm ";
      o += std::to_string(min_ctas_);
      o += '\n';
    }
  }
  if (cluster_[0]) {
    o += ".reqnctapercluster ";
    o += std::to_string(cluster_[0]);
    o += ", ";
    o += std::to_string(cluster_[1]);
    o += ", ";
    o += std::to_string(cluster_[2]);
    o += '\n';
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
    o += std::to_string(counts_[c]);
    o += ">;\n";
  }
  for (const auto &s : shared_) {
    if (s.is_extern) continue;
    o += "\t.shared .align ";
    o += std::to_string(s.align);
    o += " .b8 ";
    o += s.name;
    o += '[';
    o += std::to_string(s.bytes);
    o += "];\n";
  }
  o += '\n';
  return o;
}

std::string Builder::emit(int isa_version_x10, int sm, uint32_t maxntid) const & {
  std::string o = header(isa_version_x10, sm, maxntid);
  o.reserve(o.size() + text_len_ + 2);
  o.append(text_.data(), text_len_);
  o += "}\n";
  return o;
}

std::string Builder::emit(int isa_version_x10, int sm, uint32_t maxntid) && {
  std::string h = header(isa_version_x10, sm, maxntid);
  text_.resize(text_len_);
  text_.reserve(h.size() + text_len_ + 2);
  text_.insert(0, h);  // moves the body up within the buffer
  text_ += "}\n";
  text_len_ = 0;
  return std::move(text_);
}

}  // namespace ptx
}  // namespace fa
