// Fuzz target: arbitrary bytes as PTX text for the emulator backend's
// compile(), which parses the module (src/emu/parser.cc). Any status is
// fine; a crash, a sanitizer report or a hang is a bug.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A fresh backend per input: its parse cache must not hide a second parse.
  std::unique_ptr<fa::Backend> be;
  if (fa::create_emulator_backend(80, &be) != FA_SUCCESS) __builtin_trap();
  const std::string text(reinterpret_cast<const char *>(data), size);
  std::vector<uint8_t> bin;
  std::string log;
  const fa_status st = be->compile(text, &bin, &log);
  if (st == FA_SUCCESS) {
    // The emulator produces no binary; a parsed module's first entry (if the
    // text names one as `.entry NAME`) must also load or fail cleanly.
    if (!bin.empty()) __builtin_trap();
    const size_t at = text.find(".entry ");
    if (at != std::string::npos) {
      size_t b = at + 7, e = b;
      while (e < text.size() && (isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_'))
        ++e;
      std::unique_ptr<fa::Kernel> k;
      (void)be->load(text, bin, text.substr(b, e - b), 0, &k);
    }
  } else if (st != FA_ERROR_COMPILE) {
    __builtin_trap();  // compile() promises FA_ERROR_COMPILE for bad text
  }
  return 0;
}
