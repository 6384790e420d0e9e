/*
 * libflashattn_store_redis.so: a fa_kernel_store over Redis (README.md).
 *
 * One connection per store, guarded by a mutex; every command has a
 * timeout, and after an error the store answers FA_STORE_ERROR at once
 * until a reconnect is due (backoff 100 ms doubling to 5 s), so a server
 * that is gone costs a launch at most one connect timeout per backoff
 * period. One Redis string per kernel row, under "flashattn:v1:<key>", in
 * the format described in README.md ("Value format").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "fa_store_redis.h"

#define FA_EXPORT __attribute__((visibility("default")))

enum {
  kConnectTimeoutMs = 200,
  kCommandTimeoutMs = 500,
  kFirstBackoffMs = 100,
  kMaxBackoffMs = 5000,
  kKeyHexDigits = 32,
};

static const char kPrefix[] = "flashattn:v1:";
static const char kMagic[8] = {'F', 'A', 'K', 'R', 'O', 'W', '0', '1'};

typedef struct redis_store {
  pthread_mutex_t mu; /* guards everything below */
  redisContext *c;    /* NULL: not connected */
  pid_t pid;          /* the process that connected c */
  int64_t retry_at_ms;
  int backoff_ms;
  /* where */
  char *host;     /* TCP host, or NULL */
  int port;       /* TCP port */
  char *socket;   /* unix socket path, or NULL */
  char *user;     /* AUTH user, or NULL */
  char *password; /* AUTH password, or NULL */
  int db;         /* SELECT db when not 0 */
  char name[300]; /* the URL without the password */
} redis_store;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval ms_tv(int ms) {
  struct timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

/* ---- SIGPIPE --------------------------------------------------------------
 * Writing to a connection the server closed raises SIGPIPE, whose default
 * action ends the process. It is blocked on the calling thread around each
 * command, and one raised meanwhile is consumed, so a server going away
 * never kills the caller (the write fails with EPIPE instead). */
typedef struct pipe_guard {
  sigset_t old;
  int was_pending;
} pipe_guard;

static void pipe_block(pipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  g->was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_unblock(pipe_guard *g) {
  if (!g->was_pending) {
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) == 1) {
      const struct timespec zero = {0, 0};
      while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
      }
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- connection ---------------------------------------------------------- */

static void drop_connection(redis_store *s) {
  if (s->c) redisFree(s->c);
  s->c = NULL;
  s->retry_at_ms = now_ms() + s->backoff_ms;
  s->backoff_ms = s->backoff_ms * 2 > kMaxBackoffMs ? kMaxBackoffMs : s->backoff_ms * 2;
}

/* A status reply "OK"; frees it. */
static int reply_ok(redisReply *r) {
  const int ok = r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0;
  if (r) freeReplyObject(r);
  return ok;
}

/* Connects (AUTH, SELECT) unless connected; 0 when connected. Called with
 * s->mu held and SIGPIPE blocked. */
static int ensure_connected(redis_store *s) {
  if (s->c && s->pid != getpid()) {
    /* A forked child: the parent's socket is not ours to use. */
    redisFree(s->c);
    s->c = NULL;
    s->retry_at_ms = 0;
  }
  if (s->c) return 0;
  if (now_ms() < s->retry_at_ms) return -1;
  redisContext *c = s->socket ? redisConnectUnixWithTimeout(s->socket, ms_tv(kConnectTimeoutMs))
                              : redisConnectWithTimeout(s->host, s->port, ms_tv(kConnectTimeoutMs));
  if (c == NULL || c->err) {
    if (c) redisFree(c);
    drop_connection(s);
    return -1;
  }
  s->c = c;
  s->pid = getpid();
  if (redisSetTimeout(c, ms_tv(kCommandTimeoutMs)) != REDIS_OK) {
    drop_connection(s);
    return -1;
  }
  if (s->password) {
    redisReply *r = s->user ? redisCommand(c, "AUTH %s %s", s->user, s->password)
                            : redisCommand(c, "AUTH %s", s->password);
    if (!reply_ok(r)) {
      drop_connection(s);
      return -1;
    }
  }
  if (s->db != 0 && !reply_ok(redisCommand(c, "SELECT %d", s->db))) {
    drop_connection(s);
    return -1;
  }
  s->backoff_ms = kFirstBackoffMs;
  return 0;
}

/* Runs one command (argv form); the reply, or NULL after an error (the
 * connection is then dropped when the error was on the connection). */
static redisReply *command(redis_store *s, int argc, const char **argv, const size_t *lens) {
  pipe_guard g;
  redisReply *r = NULL;
  pipe_block(&g);
  pthread_mutex_lock(&s->mu);
  if (ensure_connected(s) == 0) {
    r = redisCommandArgv(s->c, argc, argv, lens);
    if (r == NULL) drop_connection(s); /* I/O error, timeout, protocol error */
  }
  pthread_mutex_unlock(&s->mu);
  pipe_unblock(&g);
  return r;
}

static int valid_key(const char *key) {
  if (key == NULL) return 0;
  for (int i = 0; i < kKeyHexDigits; ++i) {
    const char ch = key[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return 0;
  }
  return key[kKeyHexDigits] == '\0';
}

static void redis_key(const char *key, char out[sizeof kPrefix + kKeyHexDigits]) {
  memcpy(out, kPrefix, sizeof kPrefix - 1);
  memcpy(out + sizeof kPrefix - 1, key, kKeyHexDigits + 1);
}

/* `verb` (GET, DEL) of the row key for `key`; NULL for a key that is not 32
 * lowercase hex digits, or after an error (see command). */
static redisReply *key_command(redis_store *s, const char *verb, const char *key) {
  if (!valid_key(key)) return NULL;
  char rk[sizeof kPrefix + kKeyHexDigits];
  redis_key(key, rk);
  const char *argv[2] = {verb, rk};
  const size_t lens[2] = {strlen(verb), strlen(rk)};
  return command(s, 2, argv, lens);
}

/* ---- the value format (README.md, "Value format") ------------------------ */

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

enum { kFields = 6, kFixedBytes = 8 + 3 * 4 + 2 * 16 };

/* A field: bytes and length (strings without their NUL). */
typedef struct field {
  const void *p;
  size_t n;
} field;

static uint8_t *encode(const fa_store_record *r, size_t *size) {
  const char *spec = r->spec ? r->spec : "";
  const char *compiler = r->compiler ? r->compiler : "";
  const field f[kFields] = {{r->key, kKeyHexDigits}, {r->key_material, r->key_material_size},
                            {spec, strlen(spec)},    {compiler, strlen(compiler)},
                            {r->ptx, r->ptx_size},   {r->cubin, r->cubin_size}};
  size_t n = kFixedBytes;
  for (int i = 0; i < kFields; ++i) {
    if (f[i].n > SIZE_MAX / 2 - n) return NULL;
    n += 8 + f[i].n;
  }
  uint8_t *out = malloc(n);
  if (out == NULL) return NULL;
  uint8_t *p = out;
  memcpy(p, kMagic, 8);
  put_u32(p + 8, (uint32_t)r->sm);
  put_u32(p + 12, r->generator_version);
  put_u32(p + 16, (uint32_t)r->driver_version);
  memcpy(p + 20, r->ptx_hash, 16);
  memcpy(p + 36, r->cubin_hash, 16);
  p += kFixedBytes;
  for (int i = 0; i < kFields; ++i) {
    put_u64(p, f[i].n);
    if (f[i].n) memcpy(p + 8, f[i].p, f[i].n);
    p += 8 + f[i].n;
  }
  *size = n;
  return out;
}

/* Decodes a value into *r (pointers into v, spec and compiler into the
 * malloc'ed *strings); 0 on success, -1 for a value that is not a row. */
static int decode(const uint8_t *v, size_t n, fa_store_record *r, char **strings) {
  field f[kFields];
  if (n < kFixedBytes || memcmp(v, kMagic, 8) != 0) return -1;
  size_t at = kFixedBytes;
  for (int i = 0; i < kFields; ++i) {
    if (n - at < 8) return -1;
    const uint64_t len = get_u64(v + at);
    at += 8;
    if (len > n - at) return -1;
    f[i].p = v + at;
    f[i].n = (size_t)len;
    at += (size_t)len;
  }
  if (at != n || f[0].n != kKeyHexDigits) return -1;
  char *str = malloc(f[2].n + f[3].n + 2);
  if (str == NULL) return -1;
  memcpy(str, f[2].p, f[2].n);
  str[f[2].n] = '\0';
  memcpy(str + f[2].n + 1, f[3].p, f[3].n);
  str[f[2].n + 1 + f[3].n] = '\0';
  *strings = str;
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  memcpy(r->key, f[0].p, kKeyHexDigits);
  r->key[kKeyHexDigits] = '\0';
  r->key_material = f[1].p;
  r->key_material_size = f[1].n;
  r->spec = str;
  r->compiler = str + f[2].n + 1;
  r->ptx = f[4].p;
  r->ptx_size = f[4].n;
  r->cubin = f[5].p;
  r->cubin_size = f[5].n;
  r->sm = (int32_t)get_u32(v + 8);
  r->generator_version = get_u32(v + 12);
  r->driver_version = (int32_t)get_u32(v + 16);
  memcpy(r->ptx_hash, v + 20, 16);
  memcpy(r->cubin_hash, v + 36, 16);
  return 0;
}

/* ---- the callbacks --------------------------------------------------------- */

static int store_get(void *user, const char *key, const uint8_t *key_material,
                     size_t key_material_size, fa_store_found_fn found, void *found_ctx) {
  (void)key_material;
  (void)key_material_size; /* the library compares them */
  redisReply *r = found ? key_command(user, "GET", key) : NULL;
  if (r == NULL) return FA_STORE_ERROR;
  int rc = FA_STORE_ERROR;
  if (r->type == REDIS_REPLY_NIL) {
    rc = FA_STORE_NOT_FOUND;
  } else if (r->type == REDIS_REPLY_STRING) {
    fa_store_record rec;
    char *strings = NULL;
    if (decode((const uint8_t *)r->str, (size_t)r->len, &rec, &strings) == 0) {
      found(found_ctx, &rec);
      rc = FA_STORE_OK;
    } else {
      rc = FA_STORE_DAMAGED;
    }
    free(strings);
  } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "WRONGTYPE", 9) == 0) {
    rc = FA_STORE_DAMAGED; /* something else under our key: not a row */
  }
  freeReplyObject(r);
  return rc;
}

static int store_put(void *user, const fa_store_record *record) {
  redis_store *s = user;
  if (record == NULL || record->struct_size < sizeof *record || !valid_key(record->key))
    return FA_STORE_ERROR;
  size_t n = 0;
  uint8_t *value = encode(record, &n);
  if (value == NULL) return FA_STORE_ERROR;
  char rk[sizeof kPrefix + kKeyHexDigits];
  redis_key(record->key, rk);
  const char *argv[3] = {"SET", rk, (const char *)value};
  const size_t lens[3] = {3, strlen(rk), n};
  redisReply *r = command(s, 3, argv, lens);
  free(value);
  return reply_ok(r) ? FA_STORE_OK : FA_STORE_ERROR;
}

static int store_remove(void *user, const char *key) {
  redisReply *r = key_command(user, "DEL", key);
  if (r == NULL) return FA_STORE_ERROR;
  const int rc = r->type != REDIS_REPLY_INTEGER ? FA_STORE_ERROR
                 : r->integer > 0               ? FA_STORE_OK
                                                : FA_STORE_NOT_FOUND;
  freeReplyObject(r);
  return rc;
}

static void store_destroy(void *user) {
  redis_store *s = user;
  if (s == NULL) return;
  if (s->c) redisFree(s->c);
  pthread_mutex_destroy(&s->mu);
  free(s->host);
  free(s->socket);
  free(s->user);
  if (s->password) {
    memset(s->password, 0, strlen(s->password));
    free(s->password);
  }
  free(s);
}

/* ---- URL parsing ------------------------------------------------------------ */

static char *dup_n(const char *p, size_t n) {
  char *out = malloc(n + 1);
  if (out) {
    memcpy(out, p, n);
    out[n] = '\0';
  }
  return out;
}

/* A decimal number in [lo, hi] filling p[0..n); -1 otherwise. */
static long number(const char *p, size_t n, long lo, long hi) {
  if (n == 0 || n > 9) return -1;
  long v = 0;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] < '0' || p[i] > '9') return -1;
    v = v * 10 + (p[i] - '0');
  }
  return v < lo || v > hi ? -1 : v;
}

/* "[user]:password" in [p, p + n); 0 or -1 with *why. */
static int parse_userinfo(redis_store *s, const char *p, size_t n, const char **why) {
  const char *colon = memchr(p, ':', n);
  if (colon == NULL) {
    *why = "the user information must be [user]:password@";
    return -1;
  }
  const size_t un = (size_t)(colon - p);
  if (un > 0 && (s->user = dup_n(p, un)) == NULL) return -1;
  if ((s->password = dup_n(colon + 1, n - un - 1)) == NULL) return -1;
  if (s->password[0] == '\0') {
    *why = "empty password";
    return -1;
  }
  return 0;
}

static int parse_url(redis_store *s, const char *url, const char **why) {
  *why = "malformed URL";
  const int is_unix = strncmp(url, "unix://", 7) == 0;
  if (!is_unix && strncmp(url, "redis://", 8) != 0) {
    *why = "the URL must start with redis:// or unix://";
    return -1;
  }
  const char *p = url + (is_unix ? 7 : 8);
  const char *slash = strchr(p, '/');
  const char *end_auth = slash ? slash : p + strlen(p);
  const char *at = NULL;
  for (const char *q = p; q < end_auth; ++q)
    if (*q == '@') at = q;
  if (at) {
    if (parse_userinfo(s, p, (size_t)(at - p), why) != 0) return -1;
    p = at + 1;
  }
  s->db = 0;
  if (is_unix) {
    if (p != end_auth || slash == NULL) {
      *why = "unix:// needs an absolute socket path (unix:///path/to/socket)";
      return -1;
    }
    const char *q = strchr(p, '?');
    const size_t n = q ? (size_t)(q - p) : strlen(p);
    if (n < 2) {
      *why = "empty socket path";
      return -1;
    }
    if ((s->socket = dup_n(p, n)) == NULL) return -1;
    if (q) {
      if (strncmp(q, "?db=", 4) != 0 ||
          (s->db = (int)number(q + 4, strlen(q + 4), 0, 1 << 20)) < 0) {
        *why = "the only query unix:// takes is ?db=N";
        return -1;
      }
    }
    snprintf(s->name, sizeof s->name, "unix://%s%s%s", s->socket, q ? "?" : "", q ? q + 1 : "");
    return 0;
  }
  /* host[:port] in [p, end_auth) */
  const char *host = p, *host_end;
  if (*p == '[') {
    host = p + 1;
    host_end = memchr(host, ']', (size_t)(end_auth - host));
    if (host_end == NULL) {
      *why = "unterminated [IPv6 address]";
      return -1;
    }
    p = host_end + 1;
  } else {
    host_end = memchr(p, ':', (size_t)(end_auth - p));
    if (host_end == NULL) host_end = end_auth;
    p = host_end;
  }
  if (host_end == host) {
    *why = "no host";
    return -1;
  }
  s->port = 6379;
  if (p < end_auth) {
    if (*p != ':' || (s->port = (int)number(p + 1, (size_t)(end_auth - p - 1), 1, 65535)) < 0) {
      *why = "the port must be a number from 1 to 65535";
      return -1;
    }
  }
  if (slash && slash[1] != '\0' &&
      (s->db = (int)number(slash + 1, strlen(slash + 1), 0, 1 << 20)) < 0) {
    *why = "the path must be a database number (redis://host:port/N)";
    return -1;
  }
  if ((s->host = dup_n(host, (size_t)(host_end - host))) == NULL) return -1;
  const int v6 = strchr(s->host, ':') != NULL;
  snprintf(s->name, sizeof s->name, "redis://%s%s%s:%d/%d", v6 ? "[" : "", s->host, v6 ? "]" : "",
           s->port, s->db);
  return 0;
}

FA_EXPORT int fa_store_redis_create(const char *url, fa_kernel_store *out, char *error,
                                    size_t error_size) {
  const char *why = "out of memory";
  redis_store *s = NULL;
  if (url == NULL || out == NULL) {
    why = url == NULL ? "url is NULL" : "out is NULL";
    goto fail;
  }
  s = calloc(1, sizeof *s);
  if (s == NULL) goto fail;
  s->backoff_ms = kFirstBackoffMs;
  if (parse_url(s, url, &why) != 0) goto fail;
  if (pthread_mutex_init(&s->mu, NULL) != 0) goto fail;
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->user = s;
  out->name = s->name;
  out->get = store_get;
  out->put = store_put;
  out->remove = store_remove;
  out->destroy = store_destroy;
  return 0;
fail:
  if (s) {
    free(s->host);
    free(s->socket);
    free(s->user);
    free(s->password);
    free(s);
  }
  if (error && error_size) snprintf(error, error_size, "%s", why);
  return 1;
}
