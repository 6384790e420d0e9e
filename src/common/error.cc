#include "common/error.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace fa {
namespace {
// A plain array, not a std::string: thread_local objects with destructors
// die before static destructors and atexit handlers run, and an fa_ call made
// from one of those must not touch freed memory. Messages are truncated to fit.
thread_local char t_last_error[1280];
}  // namespace

fa_status fail(fa_status code, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(t_last_error, sizeof t_last_error, format, ap);
  va_end(ap);
  return code;
}

void prefix_error(const char *context) {
  const size_t cap = sizeof t_last_error;
  const size_t n = std::min(std::strlen(context), cap - 3);
  const size_t msg = std::min(std::strlen(t_last_error), cap - 1 - (n + 2));
  std::memmove(t_last_error + n + 2, t_last_error, msg);
  t_last_error[n + 2 + msg] = '\0';
  std::memcpy(t_last_error, context, n);
  t_last_error[n] = ':';
  t_last_error[n + 1] = ' ';
}

void clear_error() { t_last_error[0] = '\0'; }

const char *last_error() { return t_last_error; }

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
