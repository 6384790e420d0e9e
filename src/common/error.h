// Thread-local error capture shared by every layer below the C ABI.
//
// Internal functions return fa_status; on failure they record a message with
// fa::fail(), which the C entry points expose through fa_last_error().
#pragma once

#include <string>

#include "flashattn.h"

namespace fa {

// Records `message` (printf format) as the calling thread's last error and
// returns `code`, so callers can write `return fail(FA_ERROR_..., "...", x);`.
fa_status fail(fa_status code, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// Prefixes the current message with `context + ": "` (e.g. the API name).
void prefix_error(const char *context);

// Clears the thread's last error (start of every C entry point).
void clear_error();

// The thread's last error message ("" if none).
const char *last_error();

// Writes a warning to stderr once per distinct text (prefixed "flashattn: "),
// unless FLASHATTN_QUIET=1.
void warn(const std::string &message);

}  // namespace fa
