#include "common/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace fa {
namespace {
thread_local std::string t_last_error;
}  // namespace

fa_status fail(fa_status code, const char *format, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  t_last_error = buf;
  return code;
}

void prefix_error(const char *context) {
  t_last_error = std::string(context) + ": " + t_last_error;
}

void clear_error() { t_last_error.clear(); }

const char *last_error() { return t_last_error.c_str(); }

void warn(const std::string &message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  const char *quiet = std::getenv("FLASHATTN_QUIET");
  if (quiet && quiet[0] == '1') return;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(message).second) return;
  std::fprintf(stderr, "flashattn: warning: %s\n", message.c_str());
}

}  // namespace fa
