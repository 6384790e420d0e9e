// CMocka for C++ tests: its header declares C functions without extern "C".
#pragma once

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {
#include <cmocka.h>
}
// clang-format on
