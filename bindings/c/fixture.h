/*
 * Helpers shared by the two C consumer examples: a reader for the float32
 * C-order .npy files of tests/data/minilm_l6, fp16 <-> float conversion and
 * the PASS check. Header-only and independent of flashattn's internals: a
 * consumer sees only the installed prefix.
 */
#ifndef FA_EXAMPLE_FIXTURE_H
#define FA_EXAMPLE_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints the failed call's status and detailed message, then exits 1.
 * status_string and last_error are the library's fa_status_string and
 * fa_last_error, linked or resolved with dlsym. */
#define FIXTURE_CHECK(call, status_string, last_error)                                    \
  do {                                                                                    \
    fa_status st_ = (call);                                                               \
    if (st_ != FA_SUCCESS) {                                                              \
      fprintf(stderr, "%s failed: %s: %s\n", #call, status_string(st_), last_error());   \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* Reads a little-endian float32, C-order .npy file of at most 4 dimensions
 * into *data (malloc'd; the caller frees). shape[] receives the dimensions,
 * *ndim their count. Returns 0, or -1 after printing why. */
static inline int npy_load_f32(const char *path, int64_t shape[4], int *ndim, float **data) {
  FILE *f = fopen(path, "rb");
  unsigned char pre[10];
  char *header = NULL;
  size_t hlen, count = 1;
  int rc = -1;
  *data = NULL;
  *ndim = 0;
  if (!f) {
    fprintf(stderr, "%s: cannot open\n", path);
    return -1;
  }
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    fprintf(stderr, "%s: not a .npy file\n", path);
    goto done;
  }
  if (pre[6] == 1) { /* version 1: 2-byte header length, else 4 */
    if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else {
    unsigned char l[4];
    if (fread(l, 1, 4, f) != 4) goto truncated;
    hlen = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
  }
  header = (char *)calloc(hlen + 1, 1);
  if (!header || fread(header, 1, hlen, f) != hlen) goto truncated;
  if (!strstr(header, "'descr': '<f4'") || !strstr(header, "'fortran_order': False")) {
    fprintf(stderr, "%s: needs float32 ('<f4') in C order: %s\n", path, header);
    goto done;
  }
  {
    const char *p = strstr(header, "'shape': (");
    if (!p) goto truncated;
    p += strlen("'shape': (");
    while (*p && *p != ')') {
      char *end;
      long long n = strtoll(p, &end, 10);
      if (end == p) break;
      if (*ndim == 4 || n < 0) {
        fprintf(stderr, "%s: unsupported shape\n", path);
        goto done;
      }
      shape[(*ndim)++] = n;
      count *= (size_t)n;
      p = end;
      while (*p == ',' || *p == ' ') p++;
    }
  }
  *data = (float *)malloc(count * sizeof(float) + 1);
  if (!*data || fread(*data, sizeof(float), count, f) != count) goto truncated;
  rc = 0;
  goto done;
truncated:
  fprintf(stderr, "%s: truncated or unreadable\n", path);
done:
  if (rc != 0) {
    free(*data);
    *data = NULL;
  }
  free(header);
  fclose(f);
  return rc;
}

/* float -> IEEE binary16 bits, round to nearest even (as the hardware). */
static inline uint16_t f32_to_f16(float value) {
  uint32_t x, sign, exp, man, h, rem;
  int e;
  memcpy(&x, &value, 4);
  sign = (x >> 16) & 0x8000u;
  exp = (x >> 23) & 0xffu;
  man = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0)); /* inf, NaN */
  e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow */
  if (e <= 0) {                                   /* subnormal half (or zero) */
    uint32_t shift = (uint32_t)(14 - e), mid;
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000u;
    h = man >> shift;
    rem = man & ((1u << shift) - 1);
    mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  h = ((uint32_t)e << 10) | (man >> 13);
  rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry may give inf: right */
  return (uint16_t)(sign | h);
}

/* IEEE binary16 bits -> float (exact). */
static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  float f;
  if (exp == 0) {
    f = (float)man * (1.0f / 16777216.0f); /* man * 2^-24 */
    return sign ? -f : f;
  }
  x = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  memcpy(&f, &x, 4);
  return f;
}

/* Prints the max abs error of got (fp16) against ref and returns 1 for PASS:
 * max_abs <= 1e-2 * max(1, max |ref|) and every value finite. */
static inline int fixture_check(const char *who, const uint16_t *got, const float *ref, size_t n) {
  double max_abs = 0, max_ref = 0, limit;
  int finite = 1;
  size_t i;
  for (i = 0; i < n; i++) {
    double g = f16_to_f32(got[i]), r = ref[i], d = g > r ? g - r : r - g;
    if (!(g == g) || g > 65504.0 || g < -65504.0) finite = 0; /* NaN or inf */
    if (d > max_abs) max_abs = d;
    if ((r < 0 ? -r : r) > max_ref) max_ref = r < 0 ? -r : r;
  }
  limit = 1e-2 * (max_ref > 1 ? max_ref : 1);
  printf("%s: minilm_l6 forward fp16 on the emulator: max_abs_err %.3g (limit %.3g) %s\n", who,
         max_abs, limit, finite && max_abs <= limit ? "PASS" : "FAIL");
  return finite && max_abs <= limit;
}

#endif /* FA_EXAMPLE_FIXTURE_H */
