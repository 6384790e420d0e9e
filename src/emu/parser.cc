// PTX text -> emu::Module. A small lexer, then a statement parser that
// decodes each instruction into an Inst (emu/ptx_ir.h) with operand types
// checked against the register declarations. Errors are "line N: message".
// Internally errors are C++ exceptions; parse_module() catches them all.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/numeric.h"
#include "emu/ptx_ir.h"

namespace fa {
namespace emu {
namespace {

struct ParseError {
  int line;
  std::string message;
};

[[noreturn]] void error_at(int line, const std::string &message) {
  throw ParseError{line, message};
}

// ---------------------------------------------------------------- lexer ----

enum class Tok { kIdent, kNumber, kPunct, kEnd };

struct Token {
  Tok kind;
  std::string text;
  int line;
};

bool ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '%' ||
         c == '.';
}
bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.';
}

std::vector<Token> lex(const std::string &s) {
  std::vector<Token> out;
  int line = 1;
  size_t i = 0, n = s.size();
  while (i < n) {
    char c = s[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      while (i < n && s[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      int start = line;
      i += 2;
      while (i + 1 < n && !(s[i] == '*' && s[i + 1] == '/')) {
        if (s[i] == '\n') ++line;
        ++i;
      }
      if (i + 1 >= n) error_at(start, "unterminated /* comment");
      i += 2;
    } else if (ident_start(c)) {
      size_t j = i + 1;
      // "::" belongs to cache-hint modifiers such as .L1::no_allocate.
      while (j < n && (ident_char(s[j]) || (s[j] == ':' && j + 1 < n && s[j + 1] == ':' &&
                                            j + 2 < n && ident_char(s[j + 2])))) {
        j += (s[j] == ':') ? 2 : 1;
      }
      out.push_back({Tok::kIdent, s.substr(i, j - i), line});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i + 1;
      while (j < n && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.' ||
                       ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E') &&
                        !(s[i] == '0' && i + 1 < n &&
                          (s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == 'f' ||
                           s[i + 1] == 'F' || s[i + 1] == 'd' || s[i + 1] == 'D')))))
        ++j;
      out.push_back({Tok::kNumber, s.substr(i, j - i), line});
      i = j;
    } else if (std::strchr(",;{}[]()<>+-@!:|=", c)) {
      out.push_back({Tok::kPunct, std::string(1, c), line});
      ++i;
    } else {
      error_at(line, std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({Tok::kEnd, "", line});
  return out;
}

// Parses an integer literal (decimal, 0x hex, optional U suffix).
bool parse_int(const std::string &t, uint64_t *v) {
  std::string s = t;
  if (!s.empty() && (s.back() == 'U' || s.back() == 'u')) s.pop_back();
  if (s.empty()) return false;
  char *end = nullptr;
  errno = 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    *v = std::strtoull(s.c_str() + 2, &end, 16);
  } else {
    for (char ch : s)
      if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
    *v = std::strtoull(s.c_str(), &end, 10);
  }
  return end && *end == 0 && errno == 0;
}

// ------------------------------------------------------------- operands ----

// Register classes by width in bits (1 = predicate).
struct RegInfo {
  uint32_t slot;
  int bits;
  bool is_float;
};

struct Operand {
  enum Kind { kReg, kInt, kFloat, kSym, kAddr, kVec } kind = kReg;
  int line = 0;
  RegInfo reg{0, 0, false};
  uint32_t pipe_slot = kNoSlot;  // d|p second destination (a predicate; kNoSlot for '_')
  bool pipe = false;             // a '|' second destination was given
  bool special = false;
  uint64_t ival = 0;   // kInt (two's complement), kAddr offset
  uint32_t fbits = 0;  // kFloat f32 bits
  std::string sym;     // kSym, kAddr with symbol base
  bool addr_has_reg = false;
  std::vector<Operand> elems;  // kVec
};

struct TypeInfo {
  int bits = 0;   // 1 for pred
  char kind = 0;  // 'u','s','b','f','p'
};

bool type_info(const std::string &t, TypeInfo *ti) {
  static const std::map<std::string, TypeInfo> types = {
      {"u8", {8, 'u'}},     {"u16", {16, 'u'}},   {"u32", {32, 'u'}},   {"u64", {64, 'u'}},
      {"s8", {8, 's'}},     {"s16", {16, 's'}},   {"s32", {32, 's'}},   {"s64", {64, 's'}},
      {"b8", {8, 'b'}},     {"b16", {16, 'b'}},   {"b32", {32, 'b'}},   {"b64", {64, 'b'}},
      {"f16", {16, 'f'}},   {"bf16", {16, 'f'}},  {"f16x2", {32, 'f'}}, {"bf16x2", {32, 'f'}},
      {"f32", {32, 'f'}},   {"f64", {64, 'f'}},   {"pred", {1, 'p'}},   {"e4m3x2", {16, 'f'}},
      {"f32x2", {64, 'f'}}, {"e5m2x2", {16, 'f'}}};
  auto it = types.find(t);
  if (it == types.end()) return false;
  *ti = it->second;
  return true;
}

// Instruction modifiers split by kind.
struct Mods {
  std::vector<std::string> types;
  std::string space;
  int vec = 1;
  std::string rnd;
  std::string cmp;
  std::string mode;
  bool ftz = false, sat = false, approx = false, full = false, wide = false, lo = false, hi = false,
       uni = false, to = false, sync = false;
  std::vector<std::string> other;
};

struct SharedSym {
  std::string name;
  uint32_t align = 1;
  uint32_t size = 0;
  bool is_extern = false;
};

// ---------------------------------------------------------------- parser ----

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::shared_ptr<Module> run() {
    auto mod = std::make_shared<Module>();
    mod_ = mod.get();
    while (peek().kind != Tok::kEnd) {
      const Token &tk = next();
      if (tk.text == ".version") {
        const Token &v = next();
        if (v.kind != Tok::kNumber) error_at(v.line, "expected a version number");
        mod->version = static_cast<int>(std::strtod(v.text.c_str(), nullptr) * 10 + 0.5);
      } else if (tk.text == ".target") {
        for (;;) {
          const Token &v = next();
          if (v.kind != Tok::kIdent) error_at(v.line, "expected a target name");
          if (v.text.compare(0, 3, "sm_") == 0) {
            mod->target_sm = std::atoi(v.text.c_str() + 3);
            mod->arch_specific = v.text.back() == 'a';  // sm_90a (PTX ISA ".target")
          }
          if (!accept(",")) break;
        }
        if (mod->target_sm == 0) error_at(tk.line, ".target names no sm_NN");
      } else if (tk.text == ".address_size") {
        const Token &v = next();
        if (v.text != "64") error_at(v.line, "only .address_size 64 is supported");
      } else if (tk.text == ".visible" || tk.text == ".weak") {
        // linkage of the .entry that follows
      } else if (tk.text == ".entry") {
        parse_entry(tk.line);
      } else if (tk.text == ".extern" && peek().text == ".shared") {
        next();
        module_shared_.push_back(parse_shared_decl(tk.line, true));
      } else if (tk.text == ".shared") {
        module_shared_.push_back(parse_shared_decl(tk.line, false));
      } else {
        error_at(tk.line, "unsupported or unexpected '" + tk.text + "' at module scope");
      }
    }
    if (mod->entries.empty()) error_at(t_.back().line, "module has no .entry");
    return mod;
  }

 private:
  // --- token helpers
  const Token &peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token &next() {
    const Token &tk = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return tk;
  }
  bool accept(const char *text) {
    if (peek().text == text && peek().kind != Tok::kEnd) {
      next();
      return true;
    }
    return false;
  }
  const Token &expect(const char *text) {
    const Token &tk = next();
    if (tk.text != text)
      error_at(tk.line, std::string("expected '") + text + "', got '" + tk.text + "'");
    return tk;
  }
  uint64_t expect_int() {
    const Token &tk = next();
    uint64_t v;
    if (tk.kind != Tok::kNumber || !parse_int(tk.text, &v))
      error_at(tk.line, "expected an integer, got '" + tk.text + "'");
    return v;
  }
  std::string expect_ident(const char *what) {
    const Token &tk = next();
    if (tk.kind != Tok::kIdent || tk.text[0] == '.' || tk.text[0] == '%')
      error_at(tk.line, std::string("expected ") + what + ", got '" + tk.text + "'");
    return tk.text;
  }

  // `.shared .align A .b8 NAME[N];` (after .shared); extern: NAME[].
  SharedSym parse_shared_decl(int line, bool is_extern) {
    if (is_extern) {
      // ".extern" was consumed and ".shared" too.
    }
    SharedSym s;
    s.is_extern = is_extern;
    uint32_t elem = 0;
    for (;;) {
      const Token &tk = next();
      if (tk.text == ".align") {
        s.align = static_cast<uint32_t>(expect_int());
        if (s.align == 0 || (s.align & (s.align - 1))) error_at(tk.line, "bad .align");
      } else if (tk.kind == Tok::kIdent && tk.text[0] == '.') {
        TypeInfo ti;
        if (!type_info(tk.text.substr(1), &ti) || ti.bits < 8)
          error_at(tk.line, "bad .shared type '" + tk.text + "'");
        elem = static_cast<uint32_t>(ti.bits / 8);
      } else if (tk.kind == Tok::kIdent) {
        s.name = tk.text;
        break;
      } else {
        error_at(tk.line, "bad .shared declaration near '" + tk.text + "'");
      }
    }
    if (elem == 0) error_at(line, ".shared declaration without a type");
    if (s.align < elem) s.align = elem;
    uint64_t count = 1;
    if (accept("[")) {
      if (accept("]")) {
        if (!is_extern) error_at(line, "only .extern .shared arrays may be unsized");
        count = 0;
      } else {
        count = expect_int();
        expect("]");
        if (is_extern) error_at(line, ".extern .shared arrays must be unsized");
      }
    } else if (is_extern) {
      error_at(line, ".extern .shared must be an unsized array");
    }
    expect(";");
    if (count * elem > (1u << 30)) error_at(line, ".shared array too large");
    s.size = static_cast<uint32_t>(count * elem);
    return s;
  }

  // ----------------------------------------------------------- entries ----

  void parse_entry(int line) {
    mod_->entries.emplace_back();
    e_ = &mod_->entries.back();
    e_->line = static_cast<uint32_t>(line);
    e_->name = expect_ident("an entry name");
    for (const Entry &o : mod_->entries)
      if (&o != e_ && o.name == e_->name) error_at(line, "duplicate entry '" + e_->name + "'");
    regs_.clear();
    params_.clear();
    shared_.clear();
    cta_group_line_[0] = cta_group_line_[1] = 0;
    labels_.clear();
    fixups_.clear();
    consts_.clear();
    extern_slots_.clear();
    e_->slot_init.assign(kNumSpecialSlots, 0);
    static const char *specials[] = {"%tid.x",
                                     "%tid.y",
                                     "%tid.z",
                                     "%ntid.x",
                                     "%ntid.y",
                                     "%ntid.z",
                                     "%ctaid.x",
                                     "%ctaid.y",
                                     "%ctaid.z",
                                     "%nctaid.x",
                                     "%nctaid.y",
                                     "%nctaid.z",
                                     "%laneid",
                                     "%warpid",
                                     "%nwarpid",
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
                                     "%cluster_nctaid.z",
                                     "%is_explicit_cluster"};
    static_assert(sizeof(specials) / sizeof(specials[0]) == kNumSpecialSlots, "special names");
    e_->slot_name.assign(specials, specials + kNumSpecialSlots);

    // Parameters.
    expect("(");
    uint32_t poff = 0;
    if (!accept(")")) {
      for (;;) {
        const Token &pt = expect(".param");
        uint32_t align = 0, elem = 0;
        std::string name;
        for (;;) {
          const Token &tk = next();
          if (tk.text == ".align") {
            align = static_cast<uint32_t>(expect_int());
          } else if (tk.kind == Tok::kIdent && tk.text[0] == '.') {
            TypeInfo ti;
            if (!type_info(tk.text.substr(1), &ti) || ti.bits < 8)
              error_at(tk.line, "bad .param type '" + tk.text + "'");
            elem = static_cast<uint32_t>(ti.bits / 8);
          } else if (tk.kind == Tok::kIdent) {
            name = tk.text;
            break;
          } else {
            error_at(tk.line, "bad .param near '" + tk.text + "'");
          }
        }
        if (elem == 0) error_at(pt.line, ".param without a type");
        uint64_t count = 1;
        if (accept("[")) {
          count = expect_int();
          expect("]");
        }
        if (align == 0) align = elem;
        poff = (poff + align - 1) / align * align;
        params_[name] = {poff, static_cast<uint32_t>(count * elem)};
        poff += static_cast<uint32_t>(count * elem);
        if (accept(")")) break;
        expect(",");
      }
    }
    e_->param_size = poff;

    // Performance directives.
    for (;;) {
      const Token &tk = peek();
      if (tk.text == ".maxntid" || tk.text == ".reqntid") {
        next();
        uint32_t *dst = tk.text == ".maxntid" ? e_->maxntid : e_->reqntid;
        dst[0] = static_cast<uint32_t>(expect_int());
        dst[1] = dst[2] = 1;
        if (accept(",")) dst[1] = static_cast<uint32_t>(expect_int());
        if (accept(",")) dst[2] = static_cast<uint32_t>(expect_int());
      } else if (tk.text == ".reqnctapercluster" || tk.text == ".explicitcluster" ||
                 tk.text == ".maxclusterrank") {
        parse_cluster_directive();
      } else if (tk.text == ".minnctapersm" || tk.text == ".maxnreg" ||
                 tk.text == ".maxnctapersm") {
        next();
        expect_int();
      } else if (tk.text == ".noreturn") {
        next();
      } else {
        break;
      }
    }

    // Module-scope shared symbols come first in the shared window.
    shared_off_ = 0;
    for (const SharedSym &s : module_shared_) add_shared(s, line);

    expect("{");
    int depth = 1;
    while (depth > 0) {
      const Token &tk = peek();
      if (tk.kind == Tok::kEnd) error_at(tk.line, "missing '}' at end of entry " + e_->name);
      if (tk.text == "{") {
        next();
        ++depth;
      } else if (tk.text == "}") {
        next();
        --depth;
        if (depth == 0) end_line_ = tk.line;
      } else {
        parse_statement();
      }
    }
    // Falling off the end exits.
    Inst ex;
    ex.op = Op::kExit;
    ex.line = static_cast<uint32_t>(end_line_);
    emit(ex, "exit");
    // Labels.
    for (const auto &f : fixups_) {
      auto it = labels_.find(f.name);
      if (it == labels_.end()) error_at(f.line, "undefined label '" + f.name + "'");
      e_->code[f.pc].imm = it->second;
    }
    // Dynamic shared memory starts after every static symbol.
    uint32_t dyn_align = 16;
    for (const auto &s : shared_)
      if (s.second.is_extern && s.second.align > dyn_align) dyn_align = s.second.align;
    e_->static_smem = shared_off_;
    e_->dynamic_smem_offset = (shared_off_ + dyn_align - 1) / dyn_align * dyn_align;
    for (uint32_t slot : extern_slots_) e_->slot_init[slot] = e_->dynamic_smem_offset;
    e_->num_slots = static_cast<uint32_t>(e_->slot_init.size());
  }

  // .reqnctapercluster nx{, ny{, nz}}, .explicitcluster, .maxclusterrank n
  // (PTX ISA "Performance-Tuning Directives"; PTX ISA 7.8, sm_90).
  void parse_cluster_directive() {
    const Token &tk = next();
    if (mod_->target_sm < 90 || mod_->version < 78)
      error_at(tk.line, tk.text + " requires .target sm_90 or higher and .version 7.8 or higher");
    if (tk.text == ".explicitcluster") {
      e_->explicitcluster = true;
      return;
    }
    if (tk.text == ".maxclusterrank") {
      e_->maxclusterrank = static_cast<uint32_t>(expect_int());
      if (e_->maxclusterrank == 0) error_at(tk.line, ".maxclusterrank must be positive");
      return;
    }
    uint32_t *q = e_->reqnctapercluster;
    q[0] = static_cast<uint32_t>(expect_int());
    q[1] = q[2] = 1;
    if (accept(",")) q[1] = static_cast<uint32_t>(expect_int());
    if (accept(",")) q[2] = static_cast<uint32_t>(expect_int());
    if (!q[0] || !q[1] || !q[2]) error_at(tk.line, ".reqnctapercluster needs positive sizes");
  }

  struct SharedInfo {
    uint32_t offset;
    uint32_t size;
    uint32_t align;
    bool is_extern;
  };

  void add_shared(const SharedSym &s, int line) {
    if (shared_.count(s.name) || params_.count(s.name))
      error_at(line, "duplicate symbol '" + s.name + "'");
    SharedInfo info{0, s.size, s.align, s.is_extern};
    if (!s.is_extern) {
      shared_off_ = (shared_off_ + s.align - 1) / s.align * s.align;
      info.offset = shared_off_;
      shared_off_ += s.size;
    }
    shared_[s.name] = info;
  }

  void declare_regs(const Token &first) {
    // `.reg .TYPE name<N>;` or `.reg .TYPE a, b;`
    const Token &ty = next();
    TypeInfo ti;
    if (ty.kind != Tok::kIdent || ty.text[0] != '.' || !type_info(ty.text.substr(1), &ti))
      error_at(ty.line, "bad register type '" + ty.text + "'");
    if (ti.bits == 8) ti.bits = 16;  // 8-bit registers are at least 16 bits wide
    for (;;) {
      const Token &nm = next();
      if (nm.kind != Tok::kIdent || nm.text[0] == '.')
        error_at(nm.line, "expected a register name, got '" + nm.text + "'");
      if (accept("<")) {
        uint64_t count = expect_int();
        expect(">");
        if (count > (1u << 20)) error_at(nm.line, "too many registers");
        for (uint64_t k = 0; k < count; ++k) add_reg(nm.text + std::to_string(k), ti, nm.line);
      } else {
        add_reg(nm.text, ti, nm.line);
      }
      if (accept(";")) break;
      if (!accept(",")) error_at(first.line, "expected ',' or ';' in .reg declaration");
    }
  }

  void add_reg(const std::string &name, const TypeInfo &ti, int line) {
    if (regs_.count(name)) error_at(line, "register '" + name + "' declared twice");
    uint32_t slot = static_cast<uint32_t>(e_->slot_init.size());
    e_->slot_init.push_back(0);
    e_->slot_name.push_back(name);
    regs_[name] = RegInfo{slot, ti.bits, ti.kind == 'f'};
  }

  uint32_t const_slot(uint64_t value) {
    auto it = consts_.find(value);
    if (it != consts_.end()) return it->second;
    uint32_t slot = static_cast<uint32_t>(e_->slot_init.size());
    e_->slot_init.push_back(value);
    e_->slot_name.push_back("<const>");
    consts_[value] = slot;
    return slot;
  }

  // The slot holding a shared symbol's offset (extern symbols patched at end).
  uint32_t shared_sym_slot(const std::string &name, int line) {
    auto it = shared_.find(name);
    if (it == shared_.end()) {
      if (params_.count(name))
        error_at(line, "the address of .param '" + name + "' cannot be taken here");
      error_at(line, "undefined symbol '" + name + "'");
    }
    if (!it->second.is_extern) return const_slot(it->second.offset);
    uint32_t slot = static_cast<uint32_t>(e_->slot_init.size());
    e_->slot_init.push_back(0);
    e_->slot_name.push_back(name);
    extern_slots_.push_back(slot);
    return slot;
  }

  void parse_statement() {
    const Token &tk = peek();
    if (tk.text == ".reg") {
      next();
      declare_regs(tk);
      return;
    }
    if (tk.text == ".shared") {
      next();
      add_shared(parse_shared_decl(tk.line, false), tk.line);
      return;
    }
    if (tk.text == ".extern") {
      next();
      expect(".shared");
      add_shared(parse_shared_decl(tk.line, true), tk.line);
      return;
    }
    if (tk.kind == Tok::kIdent && tk.text[0] == '.')
      error_at(tk.line, "unsupported directive '" + tk.text + "'");
    if (tk.kind == Tok::kIdent && peek(1).text == ":") {
      next();
      next();
      if (labels_.count(tk.text)) error_at(tk.line, "label '" + tk.text + "' defined twice");
      labels_[tk.text] = static_cast<uint32_t>(e_->code.size());
      return;
    }
    parse_instruction();
  }

  // ------------------------------------------------------ instructions ----

  void parse_instruction() {
    uint32_t guard = kNoSlot;
    int line = peek().line;
    if (accept("@")) {
      bool neg = accept("!");
      const Token &p = next();
      auto it = regs_.find(p.text);
      if (it == regs_.end()) error_at(p.line, "undeclared register '" + p.text + "'");
      if (it->second.bits != 1) error_at(p.line, "guard '" + p.text + "' is not a predicate");
      guard = it->second.slot | (neg ? kGuardNeg : 0);
    }
    const Token &opt = next();
    if (opt.kind != Tok::kIdent || opt.text[0] == '.' || opt.text[0] == '%')
      error_at(opt.line, "expected an instruction, got '" + opt.text + "'");
    line = opt.line;
    std::vector<Operand> ops;
    if (!accept(";")) {
      for (;;) {
        ops.push_back(parse_operand());
        if (accept(";")) break;
        const Token &sep = next();
        if (sep.text != ",")
          error_at(sep.line, "expected ',' or ';' after an operand of " + opt.text + ", got '" +
                                 sep.text + "'");
      }
    }
    line_ = line;
    op_text_ = opt.text;
    guard_ = guard;
    decode(opt.text, ops);
  }

  Operand parse_operand() {
    Operand o;
    const Token &tk = next();
    o.line = tk.line;
    if (tk.text == "{") {
      o.kind = Operand::kVec;
      for (;;) {
        o.elems.push_back(parse_operand());
        if (accept("}")) break;
        expect(",");
      }
      return o;
    }
    if (tk.text == "[") {
      o.kind = Operand::kAddr;
      const Token &b = next();
      if (b.kind == Tok::kIdent && b.text[0] == '%') {
        o.reg = lookup_reg(b, &o.special);
        o.addr_has_reg = true;
      } else if (b.kind == Tok::kIdent && b.text[0] != '.') {
        o.sym = b.text;
      } else {
        error_at(b.line, "bad address base '" + b.text + "'");
      }
      if (accept("+")) {
        bool neg = accept("-");
        uint64_t v = expect_int();
        o.ival = neg ? (0 - v) : v;
      } else if (accept("-")) {
        o.ival = 0 - expect_int();
      }
      // [tensorMap, {c0, ..}] (cp.async.bulk.tensor): the coordinates.
      if (accept(",")) {
        Operand v = parse_operand();
        if (v.kind != Operand::kVec) error_at(v.line, "expected {coordinates} after ','");
        o.elems = std::move(v.elems);
      }
      expect("]");
      return o;
    }
    if (tk.text == "-" || tk.kind == Tok::kNumber) {
      bool neg = tk.text == "-";
      const Token &num = neg ? next() : tk;
      if (num.kind != Tok::kNumber) error_at(num.line, "expected a number after '-'");
      const std::string &s = num.text;
      if (s.size() == 10 && s[0] == '0' && (s[1] == 'f' || s[1] == 'F')) {
        o.kind = Operand::kFloat;
        o.fbits = static_cast<uint32_t>(std::strtoul(s.c_str() + 2, nullptr, 16));
        if (neg) o.fbits ^= 0x80000000u;
        return o;
      }
      if (s.size() == 18 && s[0] == '0' && (s[1] == 'd' || s[1] == 'D')) {
        uint64_t bits = std::strtoull(s.c_str() + 2, nullptr, 16);
        double d;
        std::memcpy(&d, &bits, 8);
        o.kind = Operand::kFloat;
        o.fbits = f32_bits(static_cast<float>(neg ? -d : d));
        return o;
      }
      uint64_t v;
      if (parse_int(s, &v)) {
        o.kind = Operand::kInt;
        o.ival = neg ? (0 - v) : v;
        return o;
      }
      char *end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!end || *end) error_at(num.line, "bad number '" + s + "'");
      o.kind = Operand::kFloat;
      o.fbits = f32_bits(static_cast<float>(neg ? -d : d));
      return o;
    }
    if (tk.kind == Tok::kIdent && tk.text[0] == '%') {
      o.kind = Operand::kReg;
      o.reg = lookup_reg(tk, &o.special);
      parse_pipe(&o);
      return o;
    }
    if (tk.kind == Tok::kIdent && tk.text[0] != '.') {
      o.kind = Operand::kSym;
      o.sym = tk.text;
      if (tk.text == "_") parse_pipe(&o);  // elect.sync _|p
      return o;
    }
    error_at(tk.line, "bad operand '" + tk.text + "'");
  }

  // `|p` after a destination: a predicate register or the sink `_`.
  void parse_pipe(Operand *o) {
    if (!accept("|")) return;
    o->pipe = true;
    const Token &p = next();
    if (p.text == "_") return;
    bool sp;
    RegInfo pr = lookup_reg(p, &sp);
    if (pr.bits != 1) error_at(p.line, "'" + p.text + "' after '|' must be a predicate");
    o->pipe_slot = pr.slot;
  }

  RegInfo lookup_reg(const Token &tk, bool *special) {
    *special = false;
    auto it = regs_.find(tk.text);
    if (it != regs_.end()) return it->second;
    for (uint32_t k = 0; k < kNumSpecialSlots; ++k) {
      if (e_->slot_name[k] == tk.text) {
        *special = true;
        return RegInfo{k, k == kIsExplicitCluster ? 1 : 32, false};
      }
    }
    error_at(tk.line, "undeclared register '" + tk.text + "'");
  }

  // --- operand checks

  [[noreturn]] void bad(const std::string &msg) { error_at(line_, op_text_ + ": " + msg); }

  void want_count(const std::vector<Operand> &ops, size_t n) {
    if (ops.size() != n)
      bad("expected " + std::to_string(n) + " operands, got " + std::to_string(ops.size()));
  }

  // Destination register of width `bits` (exact unless `at_least`).
  uint32_t dst(const Operand &o, int bits, bool at_least = false) {
    if (o.kind != Operand::kReg) bad("destination must be a register");
    if (o.special) bad("special register cannot be a destination");
    if (o.pipe) bad("unexpected '|' destination");
    check_width(o, bits, at_least);
    return o.reg.slot;
  }

  void check_width(const Operand &o, int bits, bool at_least) {
    int have = o.reg.bits;
    bool ok = at_least ? (have >= bits && (have == 1) == (bits == 1)) : have == bits;
    if (!ok) {
      std::string want = bits == 1 ? "a predicate" : std::to_string(bits) + "-bit";
      std::string got = have == 1 ? "a predicate" : std::to_string(have) + "-bit";
      bad("operand '" + e_->slot_name[o.reg.slot] + "' is " + got + ", expected " + want);
    }
  }

  // Source operand of width `bits`; immediates become constant slots.
  uint32_t src(const Operand &o, int bits, bool is_float, bool at_least = false) {
    switch (o.kind) {
      case Operand::kReg:
        if (o.pipe) bad("unexpected '|' operand");
        check_width(o, bits, at_least);
        return o.reg.slot;
      case Operand::kInt:
        if (bits == 1) bad("predicate operand must be a register");
        if (is_float && bits == 32)
          return const_slot(f32_bits(static_cast<float>(static_cast<int64_t>(o.ival))));
        return const_slot(o.ival);
      case Operand::kFloat:
        if (bits != 32) bad("f32 immediate used as a " + std::to_string(bits) + "-bit operand");
        return const_slot(o.fbits);
      default:
        bad("expected a register or an immediate");
    }
  }

  void emit(Inst in, const std::string &text) {
    if (in.line == 0) in.line = static_cast<uint32_t>(line_);
    e_->code.push_back(in);
    e_->op_text.push_back(text);
  }

  Inst base_inst() {
    Inst in;
    in.guard = guard_;
    in.line = static_cast<uint32_t>(line_);
    return in;
  }

  Mods split_mods(const std::string &text, std::string *base) {
    Mods m;
    size_t dot = text.find('.');
    *base = text.substr(0, dot);
    static const char *spaces[] = {"global", "shared", "param", "local", "const"};
    static const char *rnds[] = {"rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"};
    static const char *cmps[] = {"eq",  "ne",  "lt",  "le",  "gt",  "ge",  "ls",  "hs",
                                 "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};
    static const char *modes[] = {"up", "down", "bfly", "idx"};
    while (dot != std::string::npos) {
      size_t nd = text.find('.', dot + 1);
      std::string p = text.substr(dot + 1, nd == std::string::npos ? nd : nd - dot - 1);
      dot = nd;
      TypeInfo ti;
      bool done = false;
      if (type_info(p, &ti)) {
        m.types.push_back(p);
        continue;
      }
      for (const char *s : spaces)
        if (p == s) m.space = p, done = true;
      for (const char *s : rnds)
        if (p == s) m.rnd = p, done = true;
      for (const char *s : cmps)
        if (p == s) m.cmp = p, done = true;
      for (const char *s : modes)
        if (p == s) m.mode = p, done = true;
      if (done) continue;
      if (p == "v2")
        m.vec = 2;
      else if (p == "v4")
        m.vec = 4;
      else if (p == "ftz")
        m.ftz = true;
      else if (p == "sat")
        m.sat = true;
      else if (p == "approx")
        m.approx = true;
      else if (p == "full")
        m.full = true;
      else if (p == "wide")
        m.wide = true;
      else if (p == "lo")
        m.lo = true;
      else if (p == "hi")
        m.hi = true;
      else if (p == "uni")
        m.uni = true;
      else if (p == "to")
        m.to = true;
      else if (p == "sync")
        m.sync = true;
      else
        m.other.push_back(p);
    }
    return m;
  }

  // Exactly one type modifier.
  TypeInfo one_type(const Mods &m) {
    if (m.types.size() != 1) bad("expected exactly one type modifier");
    TypeInfo ti;
    type_info(m.types[0], &ti);
    return ti;
  }

  void no_other(const Mods &m, std::initializer_list<const char *> allowed = {}) {
    for (const std::string &o : m.other) {
      bool ok = false;
      for (const char *a : allowed)
        if (o == a) ok = true;
      if (!ok) bad("unsupported modifier '." + o + "'");
    }
  }

  // --- the decoder

  void decode(const std::string &text, const std::vector<Operand> &ops) {
    std::string b;
    Mods m = split_mods(text, &b);
    Inst in = base_inst();
    if (b == "mov") return decode_mov(m, ops, in);
    if (b == "ld" || b == "st") return decode_ldst(b == "ld", m, ops, in);
    if (b == "mapa") return decode_mapa(text, ops, in);
    if (b == "barrier" && text.compare(0, 16, "barrier.cluster.") == 0)
      return decode_barrier_cluster(text, ops, in);
    if (text == "fence.mbarrier_init.release.cluster") {  // PTX ISA "membar/fence"
      need_sm90(false);
      in.op = Op::kFenceMbarInit;
      return emit(in, text);
    }
    if (b == "atom" || b == "red") return decode_atom(m, ops, in, text, b == "red");
    if (b == "cvta") return decode_cvta(ops, in, text);
    if (b == "setp") return decode_setp(m, ops, in);
    if (b == "selp") {
      no_other(m);
      TypeInfo ti = one_type(m);
      if (ti.bits < 16) bad("bad selp type");
      want_count(ops, 4);
      in.op = Op::kSelp;
      in.d = dst(ops[0], ti.bits);
      in.a = src(ops[1], ti.bits, ti.kind == 'f');
      in.b = src(ops[2], ti.bits, ti.kind == 'f');
      in.c = src(ops[3], 1, false);
      return emit(in, text);
    }
    if (b == "cvt") return decode_cvt(m, ops, in, text);
    if (b == "bra") {
      no_other(m);
      want_count(ops, 1);
      if (ops[0].kind != Operand::kSym) bad("branch target must be a label");
      in.op = Op::kBra;
      fixups_.push_back({static_cast<uint32_t>(e_->code.size()), ops[0].sym, line_});
      return emit(in, text);
    }
    if (b == "ret" || b == "exit") {
      no_other(m);
      want_count(ops, 0);
      in.op = Op::kExit;
      return emit(in, text);
    }
    if (b == "bar" || b == "barrier") {
      if (m.other.size() == 1 && m.other[0] == "warp" && m.sync) {
        want_count(ops, 1);
        in.op = Op::kBarWarpSync;
        in.a = src(ops[0], 32, false);
        return emit(in, text);
      }
      return decode_bar(m, ops, in, text);
    }
    if (b == "mbarrier") return decode_mbarrier(text, ops, in);
    if (b == "wgmma") return decode_wgmma(text, ops, in);
    if (b == "tcgen05") return decode_tcgen05(text, ops, in);
    if (b == "setmaxnreg") return decode_setmaxnreg(text, ops, in);
    if (b == "vote") {
      // vote.sync.{any,all}.pred d, a, membermask (PTX ISA "vote.sync").
      if (!m.sync) bad("only vote.sync is supported");
      if (m.other.size() != 1 || (m.other[0] != "any" && m.other[0] != "all"))
        bad("only vote.sync.any.pred and vote.sync.all.pred are supported");
      if (one_type(m).kind != 'p') bad("vote.sync.any/all need .pred");
      want_count(ops, 3);
      in.op = Op::kVote;
      in.sub = m.other[0] == "any" ? 0 : 1;
      in.d = dst(ops[0], 1);
      in.a = src(ops[1], 1, false);
      in.e = src(ops[2], 32, false);
      return emit(in, text);
    }
    if (b == "shfl") {
      no_other(m);
      if (!m.sync) bad("only shfl.sync is supported");
      if (m.mode.empty()) bad("missing mode (.up/.down/.bfly/.idx)");
      TypeInfo ti = one_type(m);
      if (ti.bits != 32 || m.types[0] != "b32") bad("shfl.sync needs .b32");
      want_count(ops, 5);
      in.op = Op::kShfl;
      in.sub = m.mode == "up"     ? kShflUp
               : m.mode == "down" ? kShflDown
               : m.mode == "bfly" ? kShflBfly
                                  : kShflIdx;
      if (ops[0].kind != Operand::kReg) bad("destination must be a register");
      Operand d0 = ops[0];
      in.v[0] = d0.pipe_slot;
      d0.pipe_slot = kNoSlot;
      d0.pipe = false;
      in.d = dst(d0, 32);
      in.a = src(ops[1], 32, false);
      in.b = src(ops[2], 32, false);
      in.c = src(ops[3], 32, false);
      in.e = src(ops[4], 32, false);
      return emit(in, text);
    }
    if (b == "mma") return decode_mma(text, ops, in);
    if (b == "ldmatrix" || b == "stmatrix") return decode_ldmatrix(b == "stmatrix", text, ops, in);
    if (b == "elect") return decode_elect(m, ops, in, text);
    if (b == "cp") return decode_cp_async(text, ops, in);
    if (b == "fence" && text.compare(0, 17, "fence.proxy.async") == 0) {
      return decode_fence_proxy_async(text, in);
    }
    if (b == "membar" || b == "fence") return;  // one thread at a time: ordering is free
    if (b == "nop") return;
    if (b == "griddepcontrol") {  // PTX ISA "griddepcontrol" (sm_90)
      if (text == "griddepcontrol.launch_dependents") return;
      if (text != "griddepcontrol.wait") bad("only griddepcontrol.wait and .launch_dependents");
      in.op = Op::kGridDepWait;
      return emit(in, text);
    }
    decode_arith(b, m, ops, in, text);
  }

  // "a.b.c" -> {"a", "b", "c"}.
  static std::vector<std::string> dot_parts(const std::string &text) {
    std::vector<std::string> out;
    size_t start = 0;
    for (;;) {
      size_t dot = text.find('.', start);
      out.push_back(text.substr(start, dot == std::string::npos ? dot : dot - start));
      if (dot == std::string::npos) return out;
      start = dot + 1;
    }
  }

  // The constant slot holding a full-warp membermask (.aligned collectives).
  uint32_t full_warp_slot() { return const_slot(0xffffffffu); }

  // A brace-enclosed vector of exactly n 32-bit registers.
  void reg_vector(const Operand &o, size_t n, bool is_dst, const char *what, uint32_t *slots) {
    if (o.kind != Operand::kVec || o.elems.size() != n)
      bad(std::string(what) + " must be a vector of " + std::to_string(n) + " registers");
    for (size_t k = 0; k < n; ++k) {
      if (o.elems[k].kind != Operand::kReg) bad(std::string(what) + " elements must be registers");
      slots[k] = is_dst ? dst(o.elems[k], 32) : src(o.elems[k], 32, false);
    }
  }

  // mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.f32.{f16,bf16}.{f16,bf16}.f32
  // and mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32
  // (PTX ISA "Warp Level Matrix Multiply-Accumulate Instructions: mma"; fp8:
  // .target sm_89 or higher and PTX ISA 8.4, its Target ISA and PTX ISA notes,
  // as ptxas 13 applies them).
  void decode_mma(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    auto f8 = [](const std::string &t) { return t == "e4m3" || t == "e5m2"; };
    const bool head = p.size() == 10 && p[1] == "sync" && p[2] == "aligned" && p[4] == "row" &&
                      p[5] == "col" && p[6] == "f32" && p[9] == "f32";
    const bool half = head && p[7] == p[8] && (p[7] == "f16" || p[7] == "bf16") &&
                      (p[3] == "m16n8k16" || p[3] == "m16n8k8");
    const bool fp8 = head && p[3] == "m16n8k32" && f8(p[7]) && f8(p[8]);
    if (!half && !fp8)
      bad("only mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.f32.{f16,bf16}.{f16,bf16}.f32 and "
          "mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32 are supported");
    const bool k16 = p[3] == "m16n8k16", bf = p[7] == "bf16";
    if (fp8) {
      if (mod_->target_sm < 89)
        bad("mma with fp8 operands requires .target sm_89 or higher (the module targets sm_" +
            std::to_string(mod_->target_sm) + ")");
      if (mod_->version < 84) bad("mma with fp8 operands requires .version 8.4 or higher");
      in.sub = static_cast<uint8_t>(kMmaF8K32 + 2 * (p[7] == "e5m2") + (p[8] == "e5m2"));
    } else {
      in.sub = k16 ? (bf ? kMmaBF16K16 : kMmaF16K16) : (bf ? kMmaBF16K8 : kMmaF16K8);
    }
    want_count(ops, 4);
    uint32_t s[14];
    std::fill(s, s + 14, kNoSlot);
    reg_vector(ops[0], 4, true, "D", s);
    reg_vector(ops[1], k16 || fp8 ? 4 : 2, false, "A", s + 4);
    reg_vector(ops[2], k16 || fp8 ? 2 : 1, false, "B", s + 8);
    reg_vector(ops[3], 4, false, "C", s + 10);
    in.op = Op::kMma;
    in.imm = static_cast<int64_t>(e_->operand_slots.size());
    e_->operand_slots.insert(e_->operand_slots.end(), s, s + 14);
    in.e = full_warp_slot();
    emit(in, text);
  }

  // Operand `[reg+imm]` / `[NAME+imm]` in .shared: sets in->a and in->imm.
  void shared_address(const Operand &addr, Inst *in) {
    if (addr.kind != Operand::kAddr) bad("expected an address operand [..]");
    if (addr.addr_has_reg) {
      if (addr.reg.bits != 32 && addr.reg.bits != 64) bad("bad shared address register");
      in->a = addr.reg.slot;
    } else {
      in->a = shared_sym_slot(addr.sym, addr.line);
    }
    in->imm = static_cast<int64_t>(addr.ival);
  }

  // ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared{::cta}.b16 d, [a] (PTX ISA
  // "Warp-level matrix load instruction: ldmatrix") and, store = true,
  // stmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared{::cta}.b16 [a], r
  // ("Warp-level matrix store instruction: stmatrix": PTX ISA 7.8, sm_90).
  void decode_ldmatrix(bool store, const std::string &text, const std::vector<Operand> &ops,
                       Inst in) {
    const char *name = store ? "stmatrix" : "ldmatrix";
    std::vector<std::string> p = dot_parts(text);
    size_t i = 4;
    bool ok = p.size() >= 7 && p[1] == "sync" && p[2] == "aligned" && p[3] == "m8n8";
    int count = 0;
    if (ok) count = p[i] == "x1" ? 1 : p[i] == "x2" ? 2 : p[i] == "x4" ? 4 : 0;
    ++i;
    if (ok && i < p.size() && p[i] == "trans") {
      in.flags |= kTrans;
      ++i;
    }
    ok = ok && count && i + 2 == p.size() && (p[i] == "shared" || p[i] == "shared::cta") &&
         p[i + 1] == "b16";
    if (!ok)
      bad(std::string("only ") + name +
          ".sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 is supported");
    if (store) need_sm90(false, 78);
    want_count(ops, 2);
    const Operand &regs = ops[store ? 1 : 0];
    if (regs.kind == Operand::kReg && count == 1) {
      in.v[0] = store ? src(regs, 32, false) : dst(regs, 32);
    } else {
      reg_vector(regs, static_cast<size_t>(count), !store, store ? "source" : "destination", in.v);
    }
    shared_address(ops[store ? 0 : 1], &in);
    in.sub = static_cast<uint8_t>(count);
    in.op = store ? Op::kStmatrix : Op::kLdmatrix;
    in.e = full_warp_slot();
    emit(in, text);
  }

  // cp.async.{ca,cg}.shared{::cta}.global{.L2::64B,128B,256B}{.L2::cache_hint}
  //   [dst], [src], cp-size{, src-size | , ignore-src}{, cache-policy};
  // cp.async.commit_group; cp.async.wait_group N; cp.async.wait_all
  // (PTX ISA "Data Movement: cp.async", "cp.async.commit_group", "cp.async.wait_group").
  void decode_cp_async(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    if (p.size() >= 4 && p[1] == "reduce" && p[2] == "async" && p[3] == "bulk")
      return decode_bulk_reduce(p, ops, in, text);
    if (p.size() < 3 || p[1] != "async") bad("only cp.async is supported");
    if (p.size() >= 4 && p[2] == "bulk" && (p[3] == "commit_group" || p[3] == "wait_group"))
      return decode_bulk_group(p, ops, in, text);
    if (p.size() == 3 && p[2] == "commit_group") {
      want_count(ops, 0);
      in.op = Op::kCpAsyncCommit;
      return emit(in, text);
    }
    if (p.size() == 3 && p[2] == "wait_all") {
      want_count(ops, 0);
      in.op = Op::kCpAsyncWait;
      in.imm = -1;
      return emit(in, text);
    }
    if (p.size() == 3 && p[2] == "wait_group") {
      want_count(ops, 1);
      if (ops[0].kind != Operand::kInt || ops[0].ival > 1000000)
        bad("wait_group takes a non-negative integer constant");
      in.op = Op::kCpAsyncWait;
      in.imm = static_cast<int64_t>(ops[0].ival);
      return emit(in, text);
    }
    if (p[2] == "bulk") return decode_bulk_tensor(p, ops, in, text);
    bool cg = p[2] == "cg";
    bool ok = p.size() >= 5 && (p[2] == "ca" || cg) &&
              (p[3] == "shared" || p[3] == "shared::cta") && p[4] == "global";
    bool hint = false;
    for (size_t i = 5; ok && i < p.size(); ++i) {
      if (p[i] == "L2::cache_hint")
        hint = true;
      else if (p[i] != "L2::64B" && p[i] != "L2::128B" && p[i] != "L2::256B")
        ok = false;
    }
    if (!ok) bad("only cp.async.{ca,cg}.shared.global is supported");
    size_t n = ops.size() - (hint ? 1 : 0);
    if (hint && ops.size() >= 4 && ops.back().kind == Operand::kReg) src(ops.back(), 64, false);
    if (n != 3 && n != 4) bad("expected [dst], [src], cp-size{, src-size}");
    if (ops[2].kind != Operand::kInt) bad("cp-size must be an integer constant");
    uint64_t size = ops[2].ival;
    if (cg ? size != 16 : (size != 4 && size != 8 && size != 16))
      bad(cg ? "cp.async.cg needs cp-size 16" : "cp.async.ca needs cp-size 4, 8 or 16");
    in.sub = static_cast<uint8_t>(size);
    shared_address(ops[0], &in);
    const Operand &s = ops[1];
    if (s.kind != Operand::kAddr || !s.addr_has_reg || s.reg.bits != 64)
      bad("the source must be [%rd] or [%rd+imm] with a 64-bit register");
    in.b = s.reg.slot;
    in.c = const_slot(s.ival);
    if (n == 4) {
      const Operand &x = ops[3];
      if (x.kind == Operand::kReg && x.reg.bits == 1) {
        in.v[0] = x.reg.slot;  // ignore-src
      } else {
        if (x.kind == Operand::kInt && x.ival > size) bad("src-size exceeds cp-size");
        in.e = src(x, 32, false);
      }
    }
    in.op = Op::kCpAsync;
    emit(in, text);
  }

  // ------------------------------------------------- sm_90 (Hopper) ----

  // Target requirements of an instruction (PTX ISA "Target ISA Notes" of
  // each): sm >= 90, and the architecture-specific sm_90a target for
  // wgmma and setmaxnreg (ptxas rejects them elsewhere, so does the emulator).
  // sm100a_too: also sm_100a and sm_103a (setmaxnreg; wgmma is sm_90a only).
  void need_sm90(bool arch_specific, int min_version = 80, bool sm100a_too = false) {
    if (mod_->target_sm < 90)
      bad("requires .target sm_90 or higher (the module targets sm_" +
          std::to_string(mod_->target_sm) + ")");
    const int sm = mod_->target_sm;
    const bool ok = sm == 90 || (sm100a_too && (sm == 100 || sm == 103));
    if (arch_specific && !(mod_->arch_specific && ok))
      bad(sm100a_too ? "requires .target sm_90a, sm_100a or sm_103a" : "requires .target sm_90a");
    if (mod_->version < min_version)
      bad("requires .version " + std::to_string(min_version / 10) + "." +
          std::to_string(min_version % 10) + " or higher");
  }

  // elect.sync d|p, membermask (PTX ISA "elect.sync": 8.0, sm_90); d and p
  // may each be the sink `_`.
  void decode_elect(const Mods &m, const std::vector<Operand> &ops, Inst in,
                    const std::string &text) {
    if (!m.sync || !m.types.empty() || !m.other.empty() || !m.space.empty())
      bad("only elect.sync d|p, membermask is supported");
    need_sm90(false);
    want_count(ops, 2);
    Operand d = ops[0];
    if (!d.pipe) bad("expected d|p (a b32 register or _, '|', a predicate or _)");
    in.v[0] = d.pipe_slot;
    d.pipe = false;
    d.pipe_slot = kNoSlot;
    if (d.kind == Operand::kSym && d.sym == "_")
      in.d = kNoSlot;
    else
      in.d = dst(d, 32);
    in.e = src(ops[1], 32, false);
    in.op = Op::kElect;
    emit(in, text);
  }

  // fence.proxy.async{.shared::cta,.shared::cluster,.global} and the
  // one-directional fence.proxy.async::generic.release.* (PTX ISA "membar /
  // fence"): orders the thread's generic-proxy accesses with the async
  // proxy. Only the shared-memory forms matter to the emulator (the check
  // of docs/emulator.md, "Proxies"); .global and acquire forms are no-ops.
  void decode_fence_proxy_async(const std::string &text, Inst in) {
    if (text.find(".global") != std::string::npos || text.find(".acquire") != std::string::npos)
      return;
    in.op = Op::kFenceProxyAsync;
    emit(in, text);
  }

  // cvta{.to}.{global,shared{::cta},param{::entry}}.u64 d, a (PTX ISA
  // "cvta"). Generic = global addresses; the parameter block and the shared
  // window have generic addresses of their own (host addresses of the
  // launch's parameter copy and of the CTA's shared memory).
  void decode_cvta(const std::vector<Operand> &ops, Inst in, const std::string &text) {
    std::vector<std::string> p = dot_parts(text);
    bool to = p.size() == 4 && p[1] == "to";
    const std::string sp = p.size() >= 3 ? p[to ? 2 : 1] : "";
    const std::string ty = p.back();
    if (p.size() != (to ? 4u : 3u) || (ty != "u64" && ty != "b64"))
      bad("only cvta{.to}.{global,shared,param}.u64 is supported");
    want_count(ops, 2);
    in.d = dst(ops[0], 64);
    const bool shared = sp == "shared" || sp == "shared::cta";
    const bool param = sp == "param" || sp == "param::entry";
    if (sp == "global") {
      in.op = Op::kMov;
      in.a = src(ops[1], 64, false);
    } else if (shared && to) {
      in.op = Op::kCvtaToShared;
      in.a = src(ops[1], 64, false);
    } else if (shared) {
      in.op = Op::kCvtaShared;
      in.a = ops[1].kind == Operand::kSym ? shared_sym_slot(ops[1].sym, ops[1].line)
                                          : src(ops[1], 64, false);
    } else if (param && !to) {
      in.op = Op::kCvtaParam;
      if (ops[1].kind == Operand::kSym) {
        auto it = params_.find(ops[1].sym);
        if (it == params_.end()) bad("'" + ops[1].sym + "' is not a kernel parameter");
        in.a = const_slot(it->second.offset);
      } else {
        in.a = src(ops[1], 64, false);
      }
    } else {
      bad("only cvta{.to}.{global,shared,param}.u64 is supported");
    }
    emit(in, text);
  }

  // bar{.cta}.sync a{, b}; bar{.cta}.arrive a, b; barrier{.cta}.sync /
  // .arrive{.aligned} (PTX ISA "bar, barrier"): a = barrier 0..15 (an
  // immediate), b = participating threads, a multiple of the warp size
  // (all threads of the CTA when absent; bar.arrive needs it).
  void decode_bar(const Mods &m, const std::vector<Operand> &ops, Inst in,
                  const std::string &text) {
    bool arrive = false;
    for (const std::string &o : m.other) {
      if (o == "arrive")
        arrive = true;
      else if (o != "aligned" && o != "cta")
        bad("unsupported modifier '." + o + "'");
    }
    if (arrive == m.sync || !m.types.empty())
      bad("only bar.sync / bar.arrive (barrier.sync / barrier.arrive) are supported");
    if (ops.size() != 1 && ops.size() != 2) bad("expected a barrier id and a thread count");
    if (ops[0].kind != Operand::kInt || ops[0].ival > 15)
      bad("barrier id must be an immediate 0..15");
    in.imm = static_cast<int64_t>(ops[0].ival);
    if (ops.size() == 2) {
      const Operand &c = ops[1];
      if (c.kind == Operand::kInt && (c.ival == 0 || c.ival % 32 || c.ival > 1024))
        bad("the thread count must be a multiple of 32 in 32..1024");
      in.b = src(c, 32, false);
    } else if (arrive) {
      bad("bar.arrive needs a thread count");
    }
    in.op = arrive ? Op::kBarArrive : Op::kBarSync;
    emit(in, text);
  }

  // mbarrier on .shared::cta (PTX ISA "mbarrier"):
  //   mbarrier.init.shared{::cta}.b64 [a], count;
  //   mbarrier.inval.shared{::cta}.b64 [a];
  //   mbarrier.arrive{.expect_tx}{.sem.scope}.shared{::cta}.b64 state|_, [a]{, count|tx};
  //   mbarrier.expect_tx{.sem.scope}.shared{::cta}.b64 [a], tx;
  //   mbarrier.try_wait.parity{.sem.scope}.shared{::cta}.b64 p, [a], parity{, hint};
  void decode_mbarrier(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    const std::string op = p.size() > 1 ? p[1] : "";
    bool expect_tx = false, parity = false, shared = false, b64 = false, cluster = false;
    for (size_t i = 2; i < p.size(); ++i) {
      const std::string &q = p[i];
      if (q == "expect_tx" && op == "arrive")
        expect_tx = true;
      else if (q == "parity" && op == "try_wait")
        parity = true;
      else if (q == "shared" || q == "shared::cta")
        shared = true;
      else if (q == "shared::cluster")
        shared = cluster = true;
      else if (q == "b64")
        b64 = true;
      else if (q != "release" && q != "acquire" && q != "relaxed" && q != "cta" && q != "cluster")
        bad("unsupported modifier '." + q + "'");
    }
    if (op != "init" && op != "inval" && op != "arrive" && op != "expect_tx" && op != "try_wait")
      bad("only mbarrier.{init,inval,arrive,expect_tx,try_wait.parity} are supported");
    if (!shared || !b64)
      bad("needs .shared::cta and .b64 (generic mbarrier addresses are not supported)");
    if (mod_->target_sm < 80) bad("requires .target sm_80 or higher");
    if (cluster) mbarrier_cluster_form(op, ops, &in);
    auto count_operand = [&](const Operand &o, const char *what) {
      if (o.kind == Operand::kInt && (o.ival == 0 || o.ival > (1u << 20) - 1))
        bad(std::string(what) + " must be in 1..2^20-1");
      return src(o, 32, false);
    };
    if (op == "init") {
      want_count(ops, 2);
      shared_address(ops[0], &in);
      in.b = count_operand(ops[1], "the count");
      in.op = Op::kMbarInit;
    } else if (op == "inval") {
      want_count(ops, 1);
      shared_address(ops[0], &in);
      in.op = Op::kMbarInval;
    } else if (op == "expect_tx") {
      need_sm90(false);
      want_count(ops, 2);
      shared_address(ops[0], &in);
      in.c = count_operand(ops[1], "the tx count");
      in.sub = 1;
      in.op = Op::kMbarArrive;
    } else if (op == "arrive") {
      if (expect_tx) need_sm90(false);
      if (ops.size() != 2 && ops.size() != 3) bad("expected state, [addr]{, count}");
      if (expect_tx && ops.size() != 3) bad("mbarrier.arrive.expect_tx needs a tx count");
      if (ops[0].kind == Operand::kSym && ops[0].sym == "_")
        in.d = kNoSlot;
      else
        in.d = dst(ops[0], 64);
      shared_address(ops[1], &in);
      if (ops.size() == 3) {
        if (expect_tx)
          in.c = count_operand(ops[2], "the tx count");
        else
          in.b = count_operand(ops[2], "the count");
      }
      in.op = Op::kMbarArrive;
    } else {
      if (!parity) bad("only mbarrier.try_wait.parity is supported");
      need_sm90(false);
      if (ops.size() != 3 && ops.size() != 4) bad("expected p, [addr], parity{, hint}");
      in.d = dst(ops[0], 1);
      shared_address(ops[1], &in);
      in.b = src(ops[2], 32, false);
      if (ops.size() == 4) src(ops[3], 32, false);  // suspendTimeHint: no effect
      in.op = Op::kMbarTryWait;
    }
    emit(in, text);
  }

  // wgmma.fence / commit_group / wait_group N and
  // wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}
  //   d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b;
  //   d, {a0..a3}, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b;
  // wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2}
  //   d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b;
  //   d, {a0..a3}, b-desc, scale-d, imm-scale-a, imm-scale-b;
  // (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
  // Instructions": fp8 operands are K-major only, no imm-trans operands).
  void decode_wgmma(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    need_sm90(true);
    const bool sa = p.size() >= 4 && p[2] == "sync" && p[3] == "aligned";
    if (sa && p.size() == 4 && (p[1] == "fence" || p[1] == "commit_group")) {
      want_count(ops, 0);
      in.op = p[1] == "fence" ? Op::kWgmmaFence : Op::kWgmmaCommit;
      return emit(in, text);
    }
    if (sa && p.size() == 4 && p[1] == "wait_group") {
      want_count(ops, 1);
      if (ops[0].kind != Operand::kInt || ops[0].ival > 1000000)
        bad("wait_group takes a non-negative integer constant");
      in.op = Op::kWgmmaWait;
      in.imm = static_cast<int64_t>(ops[0].ival);
      return emit(in, text);
    }
    int n = 0, k = 0;
    const bool shape_ok = p.size() == 8 && sa && p[1] == "mma_async" &&
                          std::sscanf(p[4].c_str(), "m64n%dk%d", &n, &k) == 2 &&
                          p[4] == "m64n" + std::to_string(n) + "k" + std::to_string(k);
    auto is_fp8 = [](const std::string &t) { return t == "e4m3" || t == "e5m2"; };
    const bool f16_ok = shape_ok && k == 16 && p[6] == p[7] && (p[6] == "f16" || p[6] == "bf16");
    const bool fp8 = shape_ok && k == 32 && is_fp8(p[6]) && is_fp8(p[7]);
    if (!shape_ok || p[5] != "f32" || !(f16_ok || fp8))
      bad("only wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} and "
          ".m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2} are supported");
    if (n < 8 || n > 256 || n % 8) bad("N must be a multiple of 8 in 8..256");
    const bool rs = ops.size() == (fp8 ? 6u : 7u) && ops[1].kind == Operand::kVec;
    if (fp8 && !rs && ops.size() != 6)
      bad("expected d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b (or d, {a}, b-desc, "
          "scale-d, imm-scale-a, imm-scale-b): fp8 wgmma has no imm-trans operands (K-major "
          "only)");
    if (!fp8 && !rs && ops.size() != 8)
      bad("expected d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, "
          "imm-trans-b (or d, {a}, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b)");
    std::vector<uint32_t> s(static_cast<size_t>(n / 2 + (rs ? 4 : 0)), kNoSlot);
    reg_vector(ops[0], static_cast<size_t>(n / 2), true, "D", s.data());
    if (rs) {
      reg_vector(ops[1], 4, false, "A", s.data() + n / 2);
      in.sub |= kWgRegA;
    } else {
      if (ops[1].kind != Operand::kReg) bad("a-desc must be a 64-bit register");
      in.a = src(ops[1], 64, false);
    }
    if (ops[2].kind != Operand::kReg) bad("b-desc must be a 64-bit register");
    in.b = src(ops[2], 64, false);
    const Operand &sd = ops[3];
    if (sd.kind == Operand::kInt) {
      if (sd.ival > 1) bad("scale-d must be 0, 1 or a predicate");
      in.c = const_slot(sd.ival);
    } else {
      in.c = src(sd, 1, false);
    }
    auto imm_of = [&](const Operand &o, const char *what, bool sign) -> int64_t {
      const int64_t v = static_cast<int64_t>(o.ival);
      if (o.kind != Operand::kInt || (sign ? (v != 1 && v != -1) : (v != 0 && v != 1)))
        bad(std::string(what) + (sign ? " must be 1 or -1" : " must be 0 or 1"));
      return v;
    };
    if (imm_of(ops[4], "imm-scale-a", true) < 0) in.sub |= kWgNegA;
    if (imm_of(ops[5], "imm-scale-b", true) < 0) in.sub |= kWgNegB;
    if (fp8) {
      in.flags = static_cast<uint8_t>(kWgFp8 | (p[6] == "e5m2" ? kWgE5M2A : 0) |
                                      (p[7] == "e5m2" ? kWgE5M2B : 0));
    } else {
      if (!rs && imm_of(ops[6], "imm-trans-a", false)) in.sub |= kWgTransA;
      if (imm_of(ops[rs ? 6 : 7], "imm-trans-b", false)) in.sub |= kWgTransB;
      if (p[6] == "bf16") in.sub |= kWgBF16;
    }
    in.vec = static_cast<uint8_t>(n / 8);
    in.op = Op::kWgmma;
    in.imm = static_cast<int64_t>(e_->operand_slots.size());
    e_->operand_slots.insert(e_->operand_slots.end(), s.begin(), s.end());
    emit(in, text);
  }

  // ------------------------------------------------ sm_100 (Blackwell) ----

  // tcgen05 (PTX ISA "tcgen05" instructions, "Target ISA Notes": PTX ISA
  // 8.6 with sm_100a, 8.8 with sm_103a, as ptxas 13 applies them), the
  // forms the emulator runs (G = 1 or 2: .cta_group::G, one value per
  // entry: ptxas refuses a function that mixes them):
  //   tcgen05.alloc.cta_group::G.sync.aligned.shared::cta.b32 [dst], nCols;
  //   tcgen05.dealloc.cta_group::G.sync.aligned.b32 taddr, nCols;
  //   tcgen05.relinquish_alloc_permit.cta_group::G.sync.aligned;
  //   tcgen05.ld.sync.aligned.32x32b.xN.b32 {r0..rN-1}, [taddr];
  //   tcgen05.st.sync.aligned.32x32b.xN.b32 [taddr], {r0..rN-1};
  //   tcgen05.wait::{ld,st}.sync.aligned;
  //   tcgen05.fence::{before,after}_thread_sync (no instruction: the
  //   emulator runs one thread's tcgen05 ops in program order).
  // N = 1, 2, 4, .., 128. The asynchronous ops (emu/sm100.h), one thread each:
  //   tcgen05.mma.cta_group::G.kind::{f16,f8f6f4} [d], a-desc|[a], b-desc, idesc,
  //     enable-input-d;
  //   tcgen05.commit.cta_group::G.mbarrier::arrive::one{.shared::cluster}
  //     {.multicast::cluster}.b64 [mbar]{, ctaMask};
  //   tcgen05.cp.cta_group::1.{128x256b,128x128b} [taddr], s-desc;
  // The .16x64b / .16x128b / .16x256b / .16x32bx2 shapes, .pack::16b /
  // .unpack::16b, mma's .ws, .sp, block scaling, disable-output-lane and
  // scale-input-d, tcgen05.cp.cta_group::2, cp's other shapes and
  // decompression, and tcgen05.shift are refused.
  void decode_tcgen05(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    const std::string op = p.size() > 1 ? p[1] : "";
    if (!mod_->arch_specific || (mod_->target_sm != 100 && mod_->target_sm != 103))
      bad("requires .target sm_100a or sm_103a");
    if (mod_->version < (mod_->target_sm == 103 ? 88 : 86))
      bad(mod_->target_sm == 103 ? "requires .version 8.8 or higher (.target sm_103a)"
                                 : "requires .version 8.6 or higher");
    auto tail = [&](size_t from, std::initializer_list<const char *> want) {
      std::vector<std::string> w(want.begin(), want.end());
      return p.size() == from + w.size() && std::equal(w.begin(), w.end(), p.begin() + from);
    };
    if (op == "fence::before_thread_sync" || op == "fence::after_thread_sync") {
      if (p.size() != 2) bad("unsupported tcgen05.fence form");
      want_count(ops, 0);
      return;
    }
    if (op == "mma" || op == "commit" || op == "cp" || op == "shift") {
      if (p.size() > 2 && (p[2] == "ws" || p[2] == "sp"))
        bad("tcgen05.mma." + p[2] + " is not modelled");
      if (op != "shift") cta_group(p);
      return decode_tcgen05_async(op, p, text, ops, in);
    }
    in.e = full_warp_slot();
    if (op == "alloc" || op == "dealloc" || op == "relinquish_alloc_permit") {
      // sub 1: .cta_group::2 (the pair's warps perform it together).
      in.sub = cta_group(p) == 2 ? 1 : 0;
      if (op == "alloc") {
        if (!tail(3, {"sync", "aligned", "shared::cta", "b32"}))
          bad("expected tcgen05.alloc.cta_group::N.sync.aligned.shared::cta.b32 [dst], nCols");
        want_count(ops, 2);
        shared_address(ops[0], &in);
        in.b = ncols_operand(ops[1]);
        in.op = Op::kTmemAlloc;
      } else if (op == "dealloc") {
        if (!tail(3, {"sync", "aligned", "b32"}))
          bad("expected tcgen05.dealloc.cta_group::N.sync.aligned.b32 taddr, nCols");
        want_count(ops, 2);
        if (ops[0].kind != Operand::kReg) bad("taddr must be a 32-bit register");
        in.a = src(ops[0], 32, false);
        in.b = ncols_operand(ops[1]);
        in.op = Op::kTmemDealloc;
      } else {
        if (!tail(3, {"sync", "aligned"}))
          bad("expected tcgen05.relinquish_alloc_permit.cta_group::N.sync.aligned");
        want_count(ops, 0);
        in.op = Op::kTmemRelinquish;
      }
      return emit(in, text);
    }
    if (op == "wait::ld" || op == "wait::st") {
      if (!tail(2, {"sync", "aligned"})) bad("expected tcgen05." + op + ".sync.aligned");
      want_count(ops, 0);
      in.op = Op::kTmemWait;
      in.sub = op == "wait::st" ? 1 : 0;
      return emit(in, text);
    }
    if (op != "ld" && op != "st")
      bad("only tcgen05.{alloc,dealloc,relinquish_alloc_permit,ld,st,wait,fence,mma,commit,cp} "
          "are supported");
    const bool ld = op == "ld";
    int n = 0;
    if (p.size() == 7 && p[2] == "sync" && p[3] == "aligned" && p[6] == "b32" && p[5].size() > 1 &&
        p[5][0] == 'x')
      n = std::atoi(p[5].c_str() + 1);
    if (p.size() != 7 || n < 1 || n > 128 || (n & (n - 1)) || p[5] != "x" + std::to_string(n))
      bad("expected tcgen05." + op + ".sync.aligned.32x32b.xN.b32 (N = 1, 2, 4, .., 128)");
    if (p[4] != "32x32b")
      bad("shape ." + p[4] + " is not supported (only .32x32b; the .16x* shapes are not modelled)");
    want_count(ops, 2);
    in.a = tmem_address(ops[ld ? 1 : 0], "the tensor memory address");
    const Operand &regs = ops[ld ? 0 : 1];
    std::vector<uint32_t> s(static_cast<size_t>(n), kNoSlot);
    reg_vector(regs, s.size(), ld, ld ? "the destination" : "the source", s.data());
    in.vec = static_cast<uint8_t>(n);
    in.imm = static_cast<int64_t>(e_->operand_slots.size());
    e_->operand_slots.insert(e_->operand_slots.end(), s.begin(), s.end());
    in.op = ld ? Op::kTmemLd : Op::kTmemSt;
    emit(in, text);
  }

  // The .cta_group::N of p[2] (1 or 2; else an error), recorded for the
  // entry: ptxas refuses a function whose tcgen05 instructions use both
  // ("uses single CTA (.cta_group::1) and CTA pair granularity
  // (.cta_group::2) and that is not allowed"), so the emulator does too.
  int cta_group(const std::vector<std::string> &p) {
    const int g = p.size() > 2 && p[2] == "cta_group::1"   ? 1
                  : p.size() > 2 && p[2] == "cta_group::2" ? 2
                                                           : 0;
    if (!g) bad("expected .cta_group::1 or .cta_group::2 after tcgen05." + p[1]);
    int &mine = cta_group_line_[g - 1];
    const int other = cta_group_line_[2 - g];
    if (other)
      bad(".cta_group::" + std::to_string(g) + " in an entry whose tcgen05 instructions use " +
          ".cta_group::" + std::to_string(3 - g) + " (PTX line " + std::to_string(other) +
          "): one entry uses one .cta_group (ptxas refuses the mix)");
    if (!mine) mine = line_;
    return g;
  }

  // A tensor memory address operand [taddr] (taddr a 32-bit register): its slot.
  uint32_t tmem_address(const Operand &addr, const char *what) {
    if (addr.kind != Operand::kAddr || !addr.addr_has_reg || addr.reg.bits != 32 || addr.ival)
      bad(std::string(what) + " must be [taddr], taddr a 32-bit register");
    return addr.reg.slot;
  }

  // tcgen05.mma / commit / cp (PTX ISA "tcgen05.mma", "tcgen05.commit",
  // "tcgen05.cp"; p[2] is .cta_group::1): per-thread ops of emu/sm100.h.
  void decode_tcgen05_async(const std::string &op, const std::vector<std::string> &p,
                            const std::string &text, const std::vector<Operand> &ops, Inst in) {
    if (op == "shift") bad("tcgen05.shift is not modelled");
    const bool pair = p[2] == "cta_group::2";
    if (op == "commit") {
      // PTX ISA "tcgen05.commit": .shared::cluster (the mbarrier address is
      // a shared::cluster one), .multicast::cluster with a 16-bit ctaMask
      // (ptxas takes a b16 register only).
      size_t i = 4;
      const bool cl = i < p.size() && p[i] == "shared::cluster";
      if (cl) ++i;
      const bool mc = i < p.size() && p[i] == "multicast::cluster";
      if (mc) ++i;
      if (p.size() != i + 1 || p[3] != "mbarrier::arrive::one" || p.back() != "b64")
        bad("expected tcgen05.commit.cta_group::N.mbarrier::arrive::one{.shared::cluster}"
            "{.multicast::cluster}.b64 [mbar]{, ctaMask}");
      want_count(ops, mc ? 2 : 1);
      shared_address(ops[0], &in);
      if (cl) in.flags |= kClusterSpace;
      if (mc) {
        if (ops[1].kind != Operand::kReg) bad("ctaMask must be a 16-bit register");
        in.b = src(ops[1], 16, false);
        in.flags |= kMulticast;
      }
      in.sub = pair ? 1 : 0;
      in.op = Op::kUmmaCommit;
      return emit(in, text);
    }
    if (op == "cp") {
      if (pair) bad("tcgen05.cp.cta_group::2 is not modelled");
      if (p.size() != 4 || (p[3] != "128x256b" && p[3] != "128x128b"))
        bad("only tcgen05.cp.cta_group::1.128x256b and .128x128b are supported (the 4x256b, "
            "64x128b, 32x128b shapes, multicast and decompression are not modelled)");
      want_count(ops, 2);
      in.a = tmem_address(ops[0], "the tensor memory address");
      if (ops[1].kind != Operand::kReg) bad("s-desc must be a 64-bit register");
      in.b = src(ops[1], 64, false);
      in.sub = p[3] == "128x128b" ? 1 : 0;
      in.op = Op::kUtcCp;
      return emit(in, text);
    }
    if (p.size() != 4 || (p[3] != "kind::f16" && p[3] != "kind::f8f6f4"))
      bad("only tcgen05.mma.cta_group::N.kind::f16 and .kind::f8f6f4 are supported (.ws, .sp, "
          "block scaling, kind::tf32 / i8 / mxf8f6f4 / mxf4 are not modelled)");
    if (ops.size() != 5)
      bad("expected [d-tmem], a-desc|[a-tmem], b-desc, idesc, enable-input-d "
          "(disable-output-lane and scale-input-d are not modelled)");
    in.a = tmem_address(ops[0], "d-tmem");
    if (ops[1].kind == Operand::kAddr) {
      in.b = tmem_address(ops[1], "a-tmem");
      in.sub |= kUmmaATmem;
    } else {
      if (ops[1].kind != Operand::kReg) bad("a-desc must be a 64-bit register");
      in.b = src(ops[1], 64, false);
    }
    if (ops[2].kind != Operand::kReg) bad("b-desc must be a 64-bit register");
    in.c = src(ops[2], 64, false);
    in.e = src(ops[3], 32, false);
    const Operand &en = ops[4];
    if (en.kind == Operand::kInt) {
      if (en.ival > 1) bad("enable-input-d must be 0, 1 or a predicate");
      in.v[0] = const_slot(en.ival);
    } else {
      in.v[0] = src(en, 1, false);
    }
    if (p[3] == "kind::f8f6f4") in.sub |= kUmmaF8F6F4;
    if (pair) in.sub |= kUmmaPair;
    in.op = Op::kUmma;
    emit(in, text);
  }

  // nCols of tcgen05.alloc / dealloc: a b32 register or an immediate power
  // of 2 in 32..512.
  uint32_t ncols_operand(const Operand &o) {
    if (o.kind == Operand::kInt && (o.ival < 32 || o.ival > 512 || (o.ival & (o.ival - 1))))
      bad("nCols must be a power of 2 in 32..512");
    return src(o, 32, false);
  }

  // setmaxnreg.{inc,dec}.sync.aligned.u32 n (PTX ISA "setmaxnreg"): n in
  // 24..256, a multiple of 8.
  void decode_setmaxnreg(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    if (p.size() != 5 || (p[1] != "inc" && p[1] != "dec") || p[2] != "sync" || p[3] != "aligned" ||
        p[4] != "u32")
      bad("only setmaxnreg.{inc,dec}.sync.aligned.u32 is supported");
    need_sm90(true, 80, true);  // PTX ISA "setmaxnreg": sm_90a, sm_100a, sm_103a
    want_count(ops, 1);
    if (ops[0].kind != Operand::kInt || ops[0].ival < 24 || ops[0].ival > 256 || ops[0].ival % 8)
      bad("the register count must be an integer constant in 24..256, a multiple of 8");
    in.op = Op::kSetmaxnreg;
    in.sub = p[1] == "inc" ? 1 : 0;
    in.imm = static_cast<int64_t>(ops[0].ival);
    emit(in, text);
  }

  // cp.async.bulk.tensor.Nd.shared::{cluster,cta}.global{.tile}
  //   .mbarrier::complete_tx::bytes{.L2::cache_hint} [dst], [tmap, {c..}], [mbar]{, policy}
  // (PTX ISA "cp.async.bulk.tensor"), tile mode, global -> shared.
  void decode_bulk_tensor(const std::vector<std::string> &p, const std::vector<Operand> &ops,
                          Inst in, const std::string &text) {
    need_sm90(false);
    int dims = 0;
    bool ok = p.size() >= 8 && p[3] == "tensor" && p[4].size() == 2 && p[4][1] == 'd' &&
              p[4][0] >= '1' && p[4][0] <= '5' &&
              (p[5] == "shared::cluster" || p[5] == "shared::cta") && p[6] == "global";
    if (ok) dims = p[4][0] - '0';
    bool hint = false, mbar = false, multicast = false;
    for (size_t i = 7; ok && i < p.size(); ++i) {
      if (p[i] == "tile")
        continue;
      else if (p[i] == "multicast::cluster")
        multicast = true;
      else if (p[i] == "mbarrier::complete_tx::bytes")
        mbar = true;
      else if (p[i] == "L2::cache_hint")
        hint = true;
      else
        ok = false;
    }
    if (!ok || !mbar)
      bad("only cp.async.bulk.tensor.{1d..5d}.shared::cluster.global{.tile}"
          ".mbarrier::complete_tx::bytes{.multicast::cluster}{.L2::cache_hint} is supported");
    const size_t nops = 3 + (multicast ? 1 : 0) + (hint ? 1 : 0);
    want_count(ops, nops);
    if (hint) src(ops[nops - 1], 64, false);  // cache policy: no effect
    shared_address(ops[0], &in);
    const Operand &tm = ops[1];
    if (tm.kind != Operand::kAddr || !tm.addr_has_reg || tm.reg.bits != 64 || tm.ival != 0)
      bad("the tensor map must be [%rd, {coordinates}] with a 64-bit generic address");
    if (tm.elems.size() != static_cast<size_t>(dims))
      bad("expected " + std::to_string(dims) + " coordinates");
    in.b = tm.reg.slot;
    std::vector<uint32_t> s;
    for (const Operand &c : tm.elems) s.push_back(src(c, 32, false));
    Inst mb;
    shared_address(ops[2], &mb);
    s.push_back(mb.a);
    s.push_back(const_slot(static_cast<uint64_t>(mb.imm)));
    if (multicast) {  // ctaMask (PTX ISA: a 16-bit operand)
      s.push_back(src(ops[3], 16, false));
      in.flags |= kMulticast;
    }
    in.sub = static_cast<uint8_t>(dims);
    in.c = static_cast<uint32_t>(e_->operand_slots.size());
    e_->operand_slots.insert(e_->operand_slots.end(), s.begin(), s.end());
    in.op = Op::kBulkTensor;
    emit(in, text);
  }

  // cp.async.bulk.commit_group; cp.async.bulk.wait_group{.read} N (PTX ISA
  // "cp.async.bulk.commit_group", "cp.async.bulk.wait_group"; sm_90, PTX
  // ISA 8.0).
  void decode_bulk_group(const std::vector<std::string> &p, const std::vector<Operand> &ops,
                         Inst in, const std::string &text) {
    need_sm90(false);
    if (p[3] == "commit_group") {
      if (p.size() != 4) bad("only cp.async.bulk.commit_group is supported");
      want_count(ops, 0);
      in.op = Op::kBulkCommit;
      return emit(in, text);
    }
    if (p.size() > 5 || (p.size() == 5 && p[4] != "read"))
      bad("only cp.async.bulk.wait_group{.read} N is supported");
    want_count(ops, 1);
    if (ops[0].kind != Operand::kInt || ops[0].ival > 1000000)
      bad("wait_group takes a non-negative integer constant");
    in.op = Op::kBulkWait;
    in.sub = p.size() == 5 ? 1 : 0;
    in.imm = static_cast<int64_t>(ops[0].ival);
    emit(in, text);
  }

  // cp.reduce.async.bulk.global.shared::cta.bulk_group{.L2::cache_hint}.add.T
  //   [dstMem], [srcMem], size{, policy}, T = .f32, .u32, .s32 (PTX ISA
  //   "cp.reduce.async.bulk"), and
  // cp.reduce.async.bulk.tensor.Nd.global.shared::cta.add{.tile}.bulk_group
  //   {.L2::cache_hint} [tensorMap, {c..}], [srcMem]{, policy} (PTX ISA
  //   "cp.reduce.async.bulk.tensor"; the element type is the map's).
  // sm_90, PTX ISA 8.0. The modifiers after the state spaces in any order.
  void decode_bulk_reduce(const std::vector<std::string> &p, const std::vector<Operand> &ops,
                          Inst in, const std::string &text) {
    need_sm90(false);
    const bool tensor = p.size() > 4 && p[4] == "tensor";
    const size_t sp = tensor ? 6 : 4;  // the destination state space
    int dims = 0;
    if (tensor && p.size() > 5 && p[5].size() == 2 && p[5][1] == 'd' && p[5][0] >= '1' &&
        p[5][0] <= '5')
      dims = p[5][0] - '0';
    const char *forms =
        tensor ? "only cp.reduce.async.bulk.tensor.{1d..5d}.global.shared::cta.add{.tile}"
                 ".bulk_group{.L2::cache_hint} is supported"
               : "only cp.reduce.async.bulk.global.shared::cta.bulk_group{.L2::cache_hint}"
                 ".add.{f32,u32,s32} is supported";
    if ((tensor && !dims) || p.size() < sp + 2 || p[sp] != "global" || p[sp + 1] != "shared::cta")
      bad(forms);
    bool group = false, add = false, hint = false;
    std::string ty;
    for (size_t i = sp + 2; i < p.size(); ++i) {
      const std::string &x = p[i];
      if (x == "bulk_group" && !group) {
        group = true;
      } else if (x == "add" && !add) {
        add = true;
      } else if (x == "L2::cache_hint" && !hint) {
        hint = true;
      } else if (tensor && x == "tile") {
        continue;  // the default load mode
      } else if (!tensor && ty.empty() && (x == "f32" || x == "u32" || x == "s32")) {
        ty = x;
      } else if (x == "min" || x == "max" || x == "inc" || x == "dec" || x == "and" || x == "or" ||
                 x == "xor") {
        bad("only the .add reduction is modelled");
      } else {
        bad(forms);
      }
    }
    if (!group || !add || (!tensor && ty.empty())) bad(forms);
    const size_t nops = (tensor ? 2 : 3) + (hint ? 1 : 0);
    want_count(ops, nops);
    if (hint) src(ops[nops - 1], 64, false);  // cache policy: no effect
    shared_address(ops[1], &in);
    if (tensor) {
      const Operand &tm = ops[0];
      if (tm.kind != Operand::kAddr || !tm.addr_has_reg || tm.reg.bits != 64 || tm.ival != 0)
        bad("the tensor map must be [%rd, {coordinates}] with a 64-bit generic address");
      if (tm.elems.size() != static_cast<size_t>(dims))
        bad("expected " + std::to_string(dims) + " coordinates");
      in.b = tm.reg.slot;
      in.c = static_cast<uint32_t>(e_->operand_slots.size());
      for (const Operand &c : tm.elems) e_->operand_slots.push_back(src(c, 32, false));
      in.sub = static_cast<uint8_t>(dims);
      in.op = Op::kBulkTensorReduce;
      return emit(in, text);
    }
    const Operand &d = ops[0];
    if (d.kind != Operand::kAddr || !d.addr_has_reg || d.reg.bits != 64)
      bad("dstMem must be [%rd] or [%rd+imm] with a 64-bit register");
    in.b = d.reg.slot;
    in.c = const_slot(d.ival);
    const Operand &size = ops[2];
    if (size.kind == Operand::kInt && size.ival % 16)
      bad("size must be a multiple of 16 (PTX ISA \"cp.reduce.async.bulk\")");
    in.e = src(size, 32, false);
    in.sub = ty == "f32" ? kBulkRedF32 : kBulkRedU32;
    in.op = Op::kBulkReduce;
    emit(in, text);
  }

  // ------------------------------------------------------------ clusters ----
  // docs/emulator.md, "Clusters"; PTX ISA 7.8, sm_90.

  // Removes .shared::cluster from m's modifiers (m->space becomes "shared"):
  // whether it was there.
  bool take_cluster_space(Mods *m) {
    for (size_t i = 0; i < m->other.size(); ++i) {
      if (m->other[i] != "shared::cluster") continue;
      need_sm90(false, 78);
      if (!m->space.empty()) bad("two state spaces");
      m->other.erase(m->other.begin() + static_cast<long>(i));
      m->space = "shared";
      return true;
    }
    return false;
  }

  // mapa.shared::cluster.{u32,u64} d, a, b (PTX ISA "mapa"): a a shared
  // address (register, or symbol{+imm}), b the target CTA's rank.
  void decode_mapa(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    if (p.size() != 3 || p[1] != "shared::cluster" || (p[2] != "u32" && p[2] != "u64"))
      bad("only mapa.shared::cluster.{u32,u64} is supported");
    need_sm90(false, 78);
    want_count(ops, 3);
    const int bits = p[2] == "u32" ? 32 : 64;
    in.d = dst(ops[0], bits);
    if (ops[1].kind == Operand::kReg) {
      in.a = src(ops[1], bits, false);
    } else if (ops[1].kind == Operand::kSym) {
      in.a = shared_sym_slot(ops[1].sym, ops[1].line);
    } else {
      bad("the address must be a register or a shared variable");
    }
    in.b = src(ops[2], 32, false);
    in.op = Op::kMapa;
    emit(in, text);
  }

  // barrier.cluster.arrive{.release,.relaxed}{.aligned} and
  // barrier.cluster.wait{.acquire}{.aligned} (PTX ISA "barrier.cluster").
  void decode_barrier_cluster(const std::string &text, const std::vector<Operand> &ops, Inst in) {
    std::vector<std::string> p = dot_parts(text);
    const bool arrive = p[2] == "arrive";
    bool ok = arrive || p[2] == "wait";
    bool relaxed = false;
    for (size_t i = 3; ok && i < p.size(); ++i) {
      if (p[i] == "aligned") continue;
      if (arrive && (p[i] == "release" || p[i] == "relaxed"))
        relaxed = p[i] == "relaxed";
      else if (!arrive && p[i] == "acquire")
        continue;
      else
        ok = false;
    }
    if (!ok)
      bad("only barrier.cluster.arrive{.release,.relaxed}{.aligned} and "
          "barrier.cluster.wait{.acquire}{.aligned} are supported");
    need_sm90(false, 78);
    want_count(ops, 0);
    in.op = arrive ? Op::kClusterArrive : Op::kClusterWait;
    in.sub = relaxed ? 1 : 0;
    emit(in, text);
  }

  // mbarrier.arrive{.expect_tx}.release.cluster.shared::cluster.b64 _, [a]{, n}
  // (PTX ISA "mbarrier.arrive": on shared::cluster only the sink `_`).
  void mbarrier_cluster_form(const std::string &op, const std::vector<Operand> &ops, Inst *in) {
    if (op != "arrive")
      bad("only mbarrier.arrive takes a .shared::cluster mbarrier in the emulator");
    need_sm90(false);
    if (ops.empty() || ops[0].kind != Operand::kSym || ops[0].sym != "_")
      bad("mbarrier.arrive on .shared::cluster returns no state: the destination must be _");
    in->flags |= kClusterSpace;
  }

  void decode_mov(const Mods &m, const std::vector<Operand> &ops, Inst in) {
    no_other(m);
    TypeInfo ti = one_type(m);
    want_count(ops, 2);
    if (ops[1].kind == Operand::kVec) {  // pack
      const auto &el = ops[1].elems;
      if (el.size() != 2 || (ti.bits != 32 && ti.bits != 64)) bad("unsupported vector mov");
      in.op = ti.bits == 32 ? Op::kPack32 : Op::kPack64;
      in.d = dst(ops[0], ti.bits);
      in.v[0] = src(el[0], ti.bits / 2, false);
      in.v[1] = src(el[1], ti.bits / 2, false);
      return emit(in, "mov");
    }
    if (ops[0].kind == Operand::kVec) {  // unpack
      const auto &el = ops[0].elems;
      if (el.size() != 2 || (ti.bits != 32 && ti.bits != 64)) bad("unsupported vector mov");
      in.op = ti.bits == 32 ? Op::kUnpack32 : Op::kUnpack64;
      in.v[0] = dst(el[0], ti.bits / 2);
      in.v[1] = dst(el[1], ti.bits / 2);
      in.a = src(ops[1], ti.bits, false);
      return emit(in, "mov");
    }
    in.op = Op::kMov;
    in.d = dst(ops[0], ti.bits);
    if (ops[1].kind == Operand::kSym && params_.count(ops[1].sym)) {
      // The kernel-parameter address of the parameter: its offset in the
      // parameter block (cvta.param makes it generic).
      if (ti.bits != 64) bad("a parameter address needs mov.u64 / mov.b64");
      in.a = const_slot(params_.at(ops[1].sym).offset);
    } else if (ops[1].kind == Operand::kSym) {
      if (ti.bits != 32 && ti.bits != 64) bad("a symbol address needs mov.u32 or mov.u64");
      in.a = shared_sym_slot(ops[1].sym, ops[1].line);
    } else {
      in.a = src(ops[1], ti.bits, ti.kind == 'f');
    }
    emit(in, "mov." + m.types[0]);
  }

  void decode_ldst(bool is_ld, Mods m, const std::vector<Operand> &ops, Inst in) {
    const bool cluster = take_cluster_space(&m);
    std::string text = std::string(is_ld ? "ld" : "st") + (m.space.empty() ? "" : "." + m.space) +
                       (cluster ? "::cluster" : "") +
                       (m.vec > 1 ? ".v" + std::to_string(m.vec) : "") +
                       (m.types.empty() ? "" : "." + m.types[0]);
    op_text_ = text;
    no_other(m, {"nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "volatile", "relaxed", "weak",
                 "cta", "gpu", "L1::no_allocate", "L1::evict_last", "L1::evict_first", "L2::64B",
                 "L2::128B", "L2::256B"});
    TypeInfo ti = one_type(m);
    if (ti.bits < 8 || ti.kind == 'p') bad("bad load/store type");
    want_count(ops, 2);
    const Operand &addr = is_ld ? ops[1] : ops[0];
    const Operand &val = is_ld ? ops[0] : ops[1];
    if (addr.kind != Operand::kAddr) bad("expected an address operand [..]");
    uint32_t bytes = static_cast<uint32_t>(ti.bits / 8);
    in.sub = static_cast<uint8_t>(bytes);
    in.vec = static_cast<uint8_t>(m.vec);
    if (ti.kind == 's') in.flags |= kSigned;
    in.imm = static_cast<int64_t>(addr.ival);
    int vbits = ti.bits < 16 ? 16 : ti.bits;
    if (m.space == "param") {
      if (!is_ld) bad("st.param is not supported in an entry");
      if (m.vec != 1) bad("vector ld.param is not supported");
      if (addr.addr_has_reg) bad("ld.param needs [NAME+offset]");
      auto it = params_.find(addr.sym);
      if (it == params_.end()) bad("undefined parameter '" + addr.sym + "'");
      int64_t off = static_cast<int64_t>(addr.ival);
      if (off < 0 || off + bytes > it->second.size)
        bad("offset " + std::to_string(off) + " + " + std::to_string(bytes) +
            " bytes is outside parameter '" + addr.sym + "' (" + std::to_string(it->second.size) +
            " bytes)");
      if ((it->second.offset + off) % bytes) bad("misaligned parameter access");
      in.op = Op::kLdParam;
      in.imm = it->second.offset + off;
      in.d = dst(val, vbits, true);
      return emit(in, text);
    }
    if (m.space == "global") {
      if (!addr.addr_has_reg) bad("global variables are not supported; use [%rd+imm]");
      if (addr.reg.bits != 64) bad("global address register must be 64-bit");
      in.a = addr.reg.slot;
      in.op = is_ld ? Op::kLdGlobal : Op::kStGlobal;
    } else if (m.space == "shared") {
      if (addr.addr_has_reg) {
        if (addr.reg.bits != 32 && addr.reg.bits != 64) bad("bad shared address register");
        in.a = addr.reg.slot;
      } else {
        in.a = shared_sym_slot(addr.sym, addr.line);
      }
      in.op = is_ld ? Op::kLdShared : Op::kStShared;
      if (cluster) in.op = is_ld ? Op::kLdCluster : Op::kStCluster;
    } else if (m.space.empty()) {
      // Generic addressing (PTX ISA "Generic Addressing"): the parameter
      // block (after cvta.param), the shared window (cvta.shared) or global.
      if (!addr.addr_has_reg || addr.reg.bits != 64) bad("a generic address needs [%rd+imm]");
      in.a = addr.reg.slot;
      in.op = is_ld ? Op::kLdGeneric : Op::kStGeneric;
    } else {
      bad("state space must be .global, .shared, .param or generic");
    }
    if (m.vec == 1) {
      if (is_ld) {
        in.d = dst(val, vbits, true);
      } else {
        in.b = src(val, vbits, ti.kind == 'f', true);
      }
    } else {
      if (val.kind != Operand::kVec || val.elems.size() != static_cast<size_t>(m.vec))
        bad("expected a vector of " + std::to_string(m.vec) + " registers");
      for (int k = 0; k < m.vec; ++k)
        in.v[k] =
            is_ld ? dst(val.elems[k], vbits, true) : src(val.elems[k], vbits, ti.kind == 'f', true);
    }
    emit(in, text);
  }

  // atom{.sem}{.scope}.{global,shared{::cta}}.OP.T d, [a], b{, c}: .add
  // .u32/.s32/.f32, .exch.b32, .cas.b32 (PTX ISA "atom"); red{.sem}{.scope}
  // .{global,shared{::cta}}.add.T [a], b and red{.sem}{.scope}.global.add
  // .v{2,4}.f32 [a], {b..} (PTX ISA "red"; vectors: sm_90, PTX ISA 8.1).
  // Every ordering runs as sequentially consistent.
  void decode_atom(const Mods &m0, const std::vector<Operand> &ops, Inst in,
                   const std::string &text, bool red) {
    const char *name = red ? "red" : "atom";
    Mods m = m0;
    for (size_t i = 0; i < m.other.size(); ++i) {
      if (m.other[i] == "shared::cluster")
        bad(std::string(name) + " on .shared::cluster is not modelled");
      if (m.other[i] != "shared::cta") continue;
      if (!m.space.empty()) bad("two state spaces");
      if (mod_->version < 78) bad(".shared::cta requires .version 7.8 or higher");
      m.other.erase(m.other.begin() + static_cast<long>(i));
      m.space = "shared";
      break;
    }
    if (m.space != "global" && m.space != "shared")
      bad(std::string(name) + " needs .global or .shared (generic addresses are not modelled)");
    const bool shared = m.space == "shared";
    std::string what;
    for (const std::string &o : m.other) {
      const bool op = o == "add" || (!red && (o == "exch" || o == "cas"));
      const bool sem =
          o == "relaxed" || o == "release" || (!red && (o == "acquire" || o == "acq_rel"));
      if (op) {
        if (!what.empty()) bad(std::string(name) + " takes one operation");
        what = o;
      } else if (o == "cluster") {
        need_sm90(false, 78);  // .cluster scope (ptxas: sm_90, PTX ISA 7.8)
      } else if (!sem && o != "gpu" && o != "cta" && o != "sys") {
        bad("unsupported " + std::string(name) + " modifier '." + o + "'");
      }
    }
    if (what.empty()) bad(red ? "red needs .add" : "atom needs .add, .exch or .cas");
    const std::string ty = m.types.size() == 1 ? m.types[0] : "";
    if (what == "add" ? ty != "u32" && ty != "s32" && ty != "f32" : ty != "b32")
      bad(std::string(name) + "." + what + " supports " +
          (what == "add" ? ".u32, .s32 and .f32" : ".b32") + " only");
    const bool is_f32 = ty == "f32";
    if (m.vec != 1) {
      if (!red) bad("vector atom is not supported");
      if (shared || !is_f32) bad("vector red is red.global.add.v2.f32 / .v4.f32 only");
      need_sm90(false, 81);  // PTX ISA "red": vector types need sm_90 and PTX ISA 8.1
    }
    const size_t nops = (red ? 2 : 3) + (what == "cas" ? 1 : 0);
    want_count(ops, nops);
    const Operand &addr = ops[red ? 0 : 1];
    if (shared) {
      shared_address(addr, &in);
    } else {
      if (addr.kind != Operand::kAddr || !addr.addr_has_reg || addr.reg.bits != 64)
        bad(std::string(name) + ".global needs an address [%rd+imm]");
      in.a = addr.reg.slot;
      in.imm = static_cast<int64_t>(addr.ival);
    }
    in.op = shared ? Op::kAtomShared : Op::kAtom;
    in.sub = what == "exch"  ? kAtomExch
             : what == "cas" ? kAtomCas
             : is_f32        ? kAtomAddF32
                             : kAtomAdd;
    if (!red) in.d = dst(ops[0], 32);
    const Operand &b = ops[red ? 1 : 2];
    if (m.vec == 1) {
      in.b = src(b, 32, is_f32);
    } else {
      if (b.kind != Operand::kVec || b.elems.size() != static_cast<size_t>(m.vec))
        bad("expected a vector of " + std::to_string(m.vec) + " values");
      for (int k = 0; k < m.vec; ++k) in.v[k] = src(b.elems[k], 32, true);
      in.vec = static_cast<uint8_t>(m.vec);
    }
    if (what == "cas") in.c = src(ops[3], 32, false);
    emit(in, text);
  }

  void decode_setp(const Mods &m, const std::vector<Operand> &ops, Inst in) {
    no_other(m);
    TypeInfo ti = one_type(m);
    std::string c = m.cmp;
    // ".lo"/".hi" were taken as mul modifiers by split_mods.
    if (m.lo) c = "lo";
    if (m.hi) c = "hi";
    if (c.empty()) bad("missing comparison");
    want_count(ops, 3);
    if (ops[0].kind == Operand::kReg && ops[0].pipe_slot != kNoSlot)
      bad("setp with two destinations is not supported");
    static const std::map<std::string, Cmp> cmap = {
        {"eq", kEq},   {"ne", kNe},   {"lt", kLt},   {"le", kLe},   {"gt", kGt},   {"ge", kGe},
        {"lo", kLt},   {"ls", kLe},   {"hi", kGt},   {"hs", kGe},   {"equ", kEqu}, {"neu", kNeu},
        {"ltu", kLtu}, {"leu", kLeu}, {"gtu", kGtu}, {"geu", kGeu}, {"num", kNum}, {"nan", kNan}};
    auto it = cmap.find(c);
    if (it == cmap.end()) bad("bad comparison");
    in.sub = it->second;
    if (ti.kind == 'f') {
      if (ti.bits != 32 || m.types[0] != "f32") bad("only setp.*.f32 is supported for floats");
      in.op = Op::kSetpF32;
      if (m.ftz) in.flags |= kFtz;
    } else {
      if (in.sub > kGe) bad("unordered comparisons need a float type");
      if (ti.bits == 32)
        in.op = ti.kind == 's' ? Op::kSetpS32 : Op::kSetpU32;
      else if (ti.bits == 64)
        in.op = ti.kind == 's' ? Op::kSetpS64 : Op::kSetpU64;
      else
        bad("unsupported setp type");
      if (ti.kind == 'b' && in.sub != kEq && in.sub != kNe) bad(".b types allow only eq/ne");
    }
    in.d = dst(ops[0], 1);
    in.a = src(ops[1], ti.bits, ti.kind == 'f');
    in.b = src(ops[2], ti.bits, ti.kind == 'f');
    emit(in, op_text_);
  }

  void decode_cvt(const Mods &mods, const std::vector<Operand> &ops, Inst in,
                  const std::string &text) {
    Mods m = mods;
    bool satfinite = false;
    for (size_t i = 0; i < m.other.size(); ++i)
      if (m.other[i] == "satfinite") {
        satfinite = true;
        m.other.erase(m.other.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    no_other(m);
    if (m.types.size() != 2) bad("cvt needs a destination and a source type");
    if (m.sat) bad(".sat is not supported");
    const std::string &dt = m.types[0], &st = m.types[1];
    // fp8 pairs (PTX ISA cvt: sm_89 with PTX 8.1, sm_90 with 7.8): cvt.rn.satfinite.{e4m3x2,
    // e5m2x2}.f32 d, a, b (d b16, a to the high byte) and cvt.rn.f16x2.
    // {e4m3x2,e5m2x2} d, a (a b16).
    const bool f8d = dt == "e4m3x2" || dt == "e5m2x2", f8s = st == "e4m3x2" || st == "e5m2x2";
    if (f8d || f8s) {
      if (mod_->target_sm < 89) bad("fp8 cvt requires .target sm_89 or higher");
      // ptxas: PTX 7.8 on sm_90, 8.1 on sm_89.
      const int min_version = mod_->target_sm >= 90 ? 78 : 81;
      if (mod_->version < min_version)
        bad(std::string("fp8 cvt requires .version ") + (min_version == 78 ? "7.8" : "8.1") +
            " or higher on this target");
      if (m.rnd != "rn" || m.ftz) bad("fp8 cvt needs .rn (and no .ftz)");
      want_count(ops, f8d ? 3 : 2);
      if (f8d) {
        if (st != "f32" || !satfinite)
          bad("only cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 is supported");
        in.op = Op::kCvtF8x2F32;
        in.sub = dt == "e5m2x2";
        in.d = dst(ops[0], 16);
        in.a = src(ops[1], 32, true);
        in.b = src(ops[2], 32, true);
      } else {
        if (dt != "f16x2" || satfinite) bad("only cvt.rn.f16x2.{e4m3x2,e5m2x2} is supported");
        in.op = Op::kCvtF16x2F8x2;
        in.sub = st == "e5m2x2";
        in.d = dst(ops[0], 32);
        in.a = src(ops[1], 16, false);
      }
      return emit(in, text);
    }
    if (satfinite) bad(".satfinite is supported only with fp8 destinations");
    TypeInfo dti, sti;
    type_info(dt, &dti);
    type_info(st, &sti);
    if (m.ftz) in.flags |= kFtz;
    bool is_x2 = dt == "f16x2" || dt == "bf16x2";
    if (is_x2) {
      if (st != "f32" || m.rnd != "rn") bad("only cvt.rn.f16x2.f32 / bf16x2 are supported");
      want_count(ops, 3);
      in.op = dt == "f16x2" ? Op::kCvtF16x2F32 : Op::kCvtBF16x2F32;
      in.d = dst(ops[0], 32);
      in.a = src(ops[1], 32, true);
      in.b = src(ops[2], 32, true);
      return emit(in, text);
    }
    want_count(ops, 2);
    auto need_rnd = [&](const char *r) {
      if (m.rnd != r) bad(std::string("needs .") + r);
    };
    int dbits = dti.bits, sbits = sti.bits;
    if (dt == "f32" && st == "f16") {
      in.op = Op::kCvtF32F16;
    } else if (dt == "f32" && st == "bf16") {
      in.op = Op::kCvtF32BF16;
    } else if (dt == "f16" && st == "f32") {
      need_rnd("rn");
      in.op = Op::kCvtF16F32;
    } else if (dt == "bf16" && st == "f32") {
      need_rnd("rn");
      in.op = Op::kCvtBF16F32;
    } else if (dt == "f32" && (st == "s32" || st == "u32")) {
      if (!m.rnd.empty() && m.rnd != "rn") bad("only .rn int -> f32 is supported");
      in.op = st == "s32" ? Op::kCvtF32S32 : Op::kCvtF32U32;
    } else if ((dt == "s32" || dt == "u32") && st == "f32") {
      if (m.rnd == "rzi")
        in.sub = kRzi;
      else if (m.rnd == "rni")
        in.sub = kRni;
      else if (m.rnd == "rmi")
        in.sub = kRmi;
      else if (m.rnd == "rpi")
        in.sub = kRpi;
      else
        bad("f32 -> int needs .rzi/.rni/.rmi/.rpi");
      in.op = dt == "s32" ? Op::kCvtS32F32 : Op::kCvtU32F32;
    } else if (dti.kind != 'f' && sti.kind != 'f' && dti.kind != 'p' && sti.kind != 'p') {
      if (!m.rnd.empty()) bad("integer cvt takes no rounding modifier");
      in.op = Op::kCvtInt;
      in.sub = static_cast<uint8_t>(sbits);
      in.imm = dbits;
      if (sti.kind == 's') in.flags |= kSigned;
      if (dti.kind == 's') in.flags |= 4;  // destination signed
    } else {
      bad("unsupported conversion ." + dt + "." + st);
    }
    int dreg = dbits < 16 ? 16 : dbits, sreg = sbits < 16 ? 16 : sbits;
    in.d = dst(ops[0], dreg, true);
    in.a = src(ops[1], sreg, sti.kind == 'f', true);
    emit(in, text);
  }

  void decode_arith(const std::string &b, const Mods &m, const std::vector<Operand> &ops, Inst in,
                    const std::string &text) {
    static const std::map<std::string, int> nsrc = {
        {"add", 2},  {"sub", 2},   {"mul", 2}, {"mad", 3}, {"fma", 3},  {"div", 2},
        {"rem", 2},  {"min", 2},   {"max", 2}, {"neg", 1}, {"abs", 1},  {"and", 2},
        {"or", 2},   {"xor", 2},   {"not", 1}, {"shl", 2}, {"shr", 2},  {"rcp", 1},
        {"sqrt", 1}, {"rsqrt", 1}, {"ex2", 1}, {"lg2", 1}, {"tanh", 1}, {"prmt", 3}};
    auto it = nsrc.find(b);
    if (it == nsrc.end()) error_at(line_, "unknown instruction '" + text + "'");
    no_other(m);
    TypeInfo ti = one_type(m);
    int n = it->second;
    // max.f32 d, a, b, c: three inputs (PTX ISA "max"; sm_100, PTX ISA 8.8).
    if (b == "max" && ops.size() == 4 && m.types.size() == 1 && m.types[0] == "f32") n = 3;
    want_count(ops, static_cast<size_t>(n + 1));
    if (m.sat) bad(".sat is not supported");
    const bool f = ti.kind == 'f';
    if (f && m.types[0] == "f32x2") {
      // add / sub / mul / fma on packed f32 pairs (PTX ISA 8.6, sm_100):
      // each half as the f32 instruction, round to nearest.
      if (!m.rnd.empty() && m.rnd != "rn") bad("only .rn rounding is supported");
      if (m.ftz) in.flags |= kFtz;
      if (b == "add")
        in.op = Op::kAddF2;
      else if (b == "sub")
        in.op = Op::kSubF2;
      else if (b == "mul")
        in.op = Op::kMulF2;
      else if (b == "fma" && m.rnd == "rn")
        in.op = Op::kFmaF2;
      else
        bad("only add, sub, mul and fma.rn take .f32x2");
      in.d = dst(ops[0], 64);
      in.a = src(ops[1], 64, false);
      in.b = src(ops[2], 64, false);
      if (n >= 3) in.c = src(ops[3], 64, false);
      return emit(in, text);
    }
    if (f) {
      if (m.types[0] != "f32") bad("only .f32 floating point is supported");
      if (!m.rnd.empty() && m.rnd != "rn") bad("only .rn rounding is supported");
      if (m.ftz) in.flags |= kFtz;
      if (b == "add")
        in.op = Op::kAddF;
      else if (b == "sub")
        in.op = Op::kSubF;
      else if (b == "mul")
        in.op = Op::kMulF;
      else if (b == "fma" || b == "mad") {
        if (m.rnd != "rn") bad("needs .rn");
        in.op = Op::kFmaF;
      } else if (b == "div") {
        if (m.rnd.empty() && !m.approx && !m.full) bad("needs .rn, .approx or .full");
        in.op = Op::kDivF;
      } else if (b == "rcp" || b == "sqrt") {
        if (m.rnd.empty() && !m.approx) bad("needs .rn or .approx");
        in.op = b == "rcp" ? Op::kRcpF : Op::kSqrtF;
      } else if (b == "rsqrt" || b == "ex2" || b == "lg2" || b == "tanh") {
        if (!m.approx) bad("needs .approx");
        in.op = b == "rsqrt" ? Op::kRsqrtF
                : b == "ex2" ? Op::kEx2F
                : b == "lg2" ? Op::kLg2F
                             : Op::kTanhF;
      } else if (b == "neg")
        in.op = Op::kNegF;
      else if (b == "abs")
        in.op = Op::kAbsF;
      else if (b == "min")
        in.op = Op::kMinF;
      else if (b == "max")
        in.op = n == 3 ? Op::kMax3F : Op::kMaxF;
      else
        bad("not a floating point instruction");
      in.d = dst(ops[0], 32);
      in.a = src(ops[1], 32, true);
      if (n >= 2) in.b = src(ops[2], 32, true);
      if (n >= 3) in.c = src(ops[3], 32, true);
      return emit(in, text);
    }
    if (!m.rnd.empty() || m.ftz || m.approx) bad("rounding/ftz/approx need a float type");
    const int w = ti.bits;
    const bool s = ti.kind == 's';
    if (ti.kind == 'p') {
      if (b == "and")
        in.op = Op::kAnd;
      else if (b == "or")
        in.op = Op::kOr;
      else if (b == "xor")
        in.op = Op::kXor;
      else if (b == "not")
        in.op = Op::kNotPred;
      else
        bad("not a predicate instruction");
      in.d = dst(ops[0], 1);
      in.a = src(ops[1], 1, false);
      if (n >= 2) in.b = src(ops[2], 1, false);
      return emit(in, text);
    }
    if (w != 32 && w != 64) bad("only 32- and 64-bit integer types are supported");
    const bool w32 = w == 32;
    if (b == "prmt") {  // the default mode only (a mode is an `other` modifier: refused above)
      if (!w32 || ti.kind != 'b') bad("prmt needs .b32");
      in.op = Op::kPrmt;
      in.d = dst(ops[0], 32);
      in.a = src(ops[1], 32, false);
      in.b = src(ops[2], 32, false);
      in.c = src(ops[3], 32, false);
      return emit(in, text);
    }
    int dbits = w, abits = w, bbits = w, cbits = w;
    if (b == "add")
      in.op = w32 ? (s ? Op::kAddS32 : Op::kAdd32) : Op::kAdd64;
    else if (b == "sub")
      in.op = w32 ? (s ? Op::kSubS32 : Op::kSub32) : Op::kSub64;
    else if (b == "mul" || b == "mad") {
      bool mad = b == "mad";
      if (m.wide) {
        if (!w32) bad(".wide needs a 32-bit type");
        in.op =
            mad ? (s ? Op::kMadWideS32 : Op::kMadWideU32) : (s ? Op::kMulWideS32 : Op::kMulWideU32);
        dbits = 64;
        cbits = 64;
      } else if (m.hi) {
        if (mad || !w32) bad("only mul.hi.{s32,u32} is supported");
        in.op = s ? Op::kMulHiS32 : Op::kMulHiU32;
      } else if (m.lo) {
        if (w32 && s)
          in.op = mad ? Op::kMadLoS32 : Op::kMulLoS32;
        else
          in.op = mad ? (w32 ? Op::kMadLo32 : Op::kMadLo64) : (w32 ? Op::kMulLo32 : Op::kMulLo64);
      } else {
        bad("integer mul/mad needs .lo, .hi or .wide");
      }
    } else if (b == "div") {
      in.op = w32 ? (s ? Op::kDivS32 : Op::kDivU32) : (s ? Op::kDivS64 : Op::kDivU64);
    } else if (b == "rem") {
      in.op = w32 ? (s ? Op::kRemS32 : Op::kRemU32) : (s ? Op::kRemS64 : Op::kRemU64);
    } else if (b == "min") {
      in.op = w32 ? (s ? Op::kMinS32 : Op::kMinU32) : (s ? Op::kMinS64 : Op::kMinU64);
    } else if (b == "max") {
      in.op = w32 ? (s ? Op::kMaxS32 : Op::kMaxU32) : (s ? Op::kMaxS64 : Op::kMaxU64);
    } else if (b == "neg" || b == "abs") {
      if (!s) bad("needs a signed type");
      in.op = b == "neg" ? (w32 ? Op::kNeg32 : Op::kNeg64) : (w32 ? Op::kAbs32 : Op::kAbs64);
    } else if (b == "and" || b == "or" || b == "xor" || b == "not") {
      in.op = b == "and" ? Op::kAnd : b == "or" ? Op::kOr : b == "xor" ? Op::kXor : Op::kNot;
    } else if (b == "shl") {
      in.op = w32 ? Op::kShl32 : Op::kShl64;
      bbits = 32;
    } else if (b == "shr") {
      in.op = w32 ? (s ? Op::kShrS32 : Op::kShrU32) : (s ? Op::kShrS64 : Op::kShrU64);
      bbits = 32;
    } else {
      bad("not an integer instruction");
    }
    in.d = dst(ops[0], dbits);
    in.a = src(ops[1], abits, false);
    if (n >= 2) in.b = src(ops[2], bbits, false);
    if (n >= 3) in.c = src(ops[3], cbits, false);
    emit(in, text);
  }

  struct Fixup {
    uint32_t pc;
    std::string name;
    int line;
  };
  struct ParamInfo {
    uint32_t offset;
    uint32_t size;
  };

  std::vector<Token> t_;
  size_t p_ = 0;
  Module *mod_ = nullptr;
  Entry *e_ = nullptr;
  std::vector<SharedSym> module_shared_;
  std::unordered_map<std::string, RegInfo> regs_;
  std::unordered_map<std::string, ParamInfo> params_;
  std::map<std::string, SharedInfo> shared_;
  std::unordered_map<std::string, uint32_t> labels_;
  std::vector<Fixup> fixups_;
  std::unordered_map<uint64_t, uint32_t> consts_;
  std::vector<uint32_t> extern_slots_;
  uint32_t shared_off_ = 0;
  int end_line_ = 0;
  int cta_group_line_[2] = {0, 0};  // the entry's first tcgen05 line with .cta_group::1 / ::2
  // Current instruction.
  int line_ = 0;
  std::string op_text_;
  uint32_t guard_ = kNoSlot;
};

}  // namespace

std::shared_ptr<const Module> parse_module(const std::string &text, std::string *error) {
  try {
    Parser p(lex(text));
    return p.run();
  } catch (const ParseError &e) {
    *error = "line " + std::to_string(e.line) + ": " + e.message;
  } catch (const std::bad_alloc &) {
    throw;  // out of memory is FA_ERROR_OUT_OF_MEMORY at the API, not a parse error
  } catch (const std::exception &e) {
    *error = std::string("PTX parser: ") + e.what();
  }
  return nullptr;
}

}  // namespace emu
}  // namespace fa
