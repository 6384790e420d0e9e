// The second tier of the kernel store (cache/remote_store.h, fa_kernel_store)
// with an in-process fake store behind C callbacks: a remote hit is verified
// and copied into the local store; a row whose blob hash, key or key
// material does not verify is a miss (discarded and removed there, or a
// collision); failing callbacks are misses and skipped writes, counted,
// never errors; fa_runtime_create checks a caller's fa_kernel_store; and
// through the public API a second runtime with an empty local cache builds
// nothing. FLASHATTN_KERNEL_STORE cases run in forked children (the plugin
// is looked up once per process).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cache/remote_store.h"
#include "cache/store_internal.h"
#include "flashattn.h"
#include "support/cache_fixture.h"
#include "support/cmocka.hh"

using fa::cache::Key;
using fa::cache::Record;
using fa::cache::Stats;
using fa::cache::Store;
using fa::test::fork_child;
using fa::test::wait_exit;

namespace {

// ---- the fake store --------------------------------------------------------

// What a fake row holds: a record and the hashes it came with.
struct Row {
  std::string key;
  Record rec;
  fa::cache::Hash ptx_hash{}, cubin_hash{};
};

// A kernel store in a map, with switches for misbehaviour.
struct FakeStore {
  std::mutex mu;
  std::map<std::string, Row> rows;
  int get_result = -1;  // >= 0: get returns this without calling found
  int put_result = FA_STORE_OK;
  size_t found_struct_size = sizeof(fa_store_record);
  std::string answer_key;  // not "": get answers with this key's row
  int gets = 0, puts = 0, removes = 0, destroys = 0;
  std::vector<std::string> removed;

  fa_kernel_store api(const char *name = "fake store") {
    fa_kernel_store s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.user = this;
    s.name = name;
    s.get = get_cb;
    s.put = put_cb;
    s.remove = remove_cb;
    s.destroy = destroy_cb;
    return s;
  }

  static int get_cb(void *user, const char *key, const uint8_t *, size_t, fa_store_found_fn found,
                    void *ctx) {
    FakeStore *f = static_cast<FakeStore *>(user);
    std::lock_guard<std::mutex> lock(f->mu);
    f->gets++;
    if (f->get_result >= 0) return f->get_result;
    auto it = f->rows.find(f->answer_key.empty() ? std::string(key) : f->answer_key);
    if (it == f->rows.end()) return FA_STORE_NOT_FOUND;
    const Row &r = it->second;
    fa_store_record rec = fa::cache::record_view(r.key, r.rec);
    rec.struct_size = f->found_struct_size;
    std::memcpy(rec.ptx_hash, r.ptx_hash.b, 16);  // the hashes as stored, damaged or not
    std::memcpy(rec.cubin_hash, r.cubin_hash.b, 16);
    found(ctx, &rec);
    return FA_STORE_OK;
  }

  static int put_cb(void *user, const fa_store_record *rec) {
    FakeStore *f = static_cast<FakeStore *>(user);
    std::lock_guard<std::mutex> lock(f->mu);
    f->puts++;
    if (f->put_result != FA_STORE_OK) return f->put_result;
    Row r;
    if (!fa::cache::copy_record(rec, &r.key, &r.rec, &r.ptx_hash, &r.cubin_hash).empty())
      return FA_STORE_ERROR;
    f->rows[r.key] = r;
    return FA_STORE_OK;
  }

  static int remove_cb(void *user, const char *key) {
    FakeStore *f = static_cast<FakeStore *>(user);
    std::lock_guard<std::mutex> lock(f->mu);
    f->removes++;
    f->removed.push_back(key);
    return f->rows.erase(key) ? FA_STORE_OK : FA_STORE_NOT_FOUND;
  }

  static void destroy_cb(void *user) { static_cast<FakeStore *>(user)->destroys++; }
};

// ---- helpers ----------------------------------------------------------------

std::unique_ptr<Store> memory_store() {
  fa::cache::Options o;
  o.memory_only = true;
  return fa::cache::open_store(o);
}

// A fixture record with key material; *key is its key.
Record keyed_record(uint64_t seed, Key *key) {
  Record r = fa::test::record_for(seed);
  r.key_material = "kernel material " + std::to_string(seed);
  *key = fa::cache::key_of_bytes(r.key_material);
  return r;
}

// A tiered store over a fresh memory store, `fake` behind it.
std::unique_ptr<Store> tiered(FakeStore *fake) {
  return fa::cache::make_tiered_store(memory_store(), fake->api());
}

// fake holds the row `seed` (written through a tiered store of its own).
Key plant(FakeStore *fake, uint64_t seed, Record *rec = nullptr) {
  Key key;
  Record r = keyed_record(seed, &key);
  tiered(fake)->put(key, r);
  if (rec) *rec = r;
  return key;
}

// ---- the tiered store ------------------------------------------------------

void test_remote_hit_copied_local(void **) {
  FakeStore fake;
  Record want;
  const Key key = plant(&fake, 11, &want);
  assert_int_equal(fake.puts, 1);
  assert_int_equal(fake.destroys, 1);  // the writer's store is gone
  assert_true(fake.rows.count(key.hex()) == 1);

  auto local = memory_store();
  Store *local_view = local.get();
  auto store = fa::cache::make_tiered_store(std::move(local), fake.api());
  Record got;
  assert_false(local_view->get(key, want.key_material, &got));  // not local yet
  assert_true(store->get(key, want.key_material, &got));
  assert_true(fa::test::same_record(got, want));
  assert_true(got.key_material == want.key_material);
  assert_int_equal(fake.gets, 1);
  // Copied into the local store: the next get does not ask the fake.
  Record again;
  assert_true(local_view->get(key, want.key_material, &again));
  assert_true(fa::test::same_record(again, want));
  assert_true(store->get(key, want.key_material, &again));
  assert_int_equal(fake.gets, 1);
  const Stats s = store->stats();
  assert_int_equal(s.remote_hits, 1);
  assert_int_equal(s.remote_misses, 0);
  assert_int_equal(s.remote_errors, 0);
  assert_int_equal(s.entries, 1);  // local rows
  assert_string_equal(s.kernel_store.c_str(), "fake store");
  // A key the fake lacks: a remote miss.
  Key other;
  keyed_record(12, &other);
  assert_false(store->get(other, "kernel material 12", &got));
  assert_int_equal(store->stats().remote_misses, 1);
  store.reset();
  assert_int_equal(fake.destroys, 2);
}

// Damages the fake's row `key` with fn, then checks that a fresh tiered
// store's get is a miss that discards and removes it.
template <typename F>
void expect_discarded(uint64_t seed, F damage) {
  FakeStore fake;
  Record want;
  const Key key = plant(&fake, seed, &want);
  damage(&fake.rows[key.hex()]);
  auto store = tiered(&fake);
  Record got;
  assert_false(store->get(key, want.key_material, &got));
  const Stats s = store->stats();
  assert_int_equal(s.remote_discarded, 1);
  assert_int_equal(s.discarded, 1);
  assert_int_equal(s.remote_hits, 0);
  assert_int_equal(s.entries, 0);  // nothing copied locally
  assert_int_equal(fake.removes, 1);
  assert_string_equal(fake.removed.at(0).c_str(), key.hex().c_str());
  assert_true(fake.rows.empty());
}

void test_bad_hash_discarded_and_removed(void **) {
  expect_discarded(21, [](Row *r) { r->rec.ptx[r->rec.ptx.size() / 2] ^= 0x20; });
  expect_discarded(22, [](Row *r) { r->rec.cubin.back() ^= 1; });
  expect_discarded(23, [](Row *r) { r->ptx_hash.b[0] ^= 1; });
  expect_discarded(24, [](Row *r) { r->cubin_hash.b[15] ^= 0x80; });
  expect_discarded(25, [](Row *r) { r->rec.cubin.clear(); });  // hash of a non-empty cubin
  // A row whose key is not the hash of its key material (forged or damaged).
  expect_discarded(26, [](Row *r) { r->rec.key_material += "x"; });
}

void test_key_material_checks(void **) {
  // A genuine row for the key, but the caller asks for other key material
  // under it (a 128-bit collision): a miss counted in collisions, the row
  // stays.
  FakeStore fake;
  Record want;
  const Key key = plant(&fake, 31, &want);
  auto store = tiered(&fake);
  Record got;
  assert_false(store->get(key, "another kernel", &got));
  Stats s = store->stats();
  assert_int_equal(s.collisions, 1);
  assert_int_equal(s.remote_discarded, 0);
  assert_int_equal(s.remote_hits, 0);
  assert_int_equal(fake.removes, 0);
  assert_true(store->get(key, want.key_material, &got));  // the right material hits

  // The store answers with another key's row: an error, nothing removed.
  FakeStore other;
  const Key k1 = plant(&other, 32);
  Key k2;
  keyed_record(33, &k2);
  other.answer_key = k1.hex();
  auto store2 = tiered(&other);
  assert_false(store2->get(k2, "kernel material 33", &got));
  s = store2->stats();
  assert_int_equal(s.remote_errors, 1);
  assert_int_equal(s.remote_hits, 0);
  assert_int_equal(other.removes, 0);
  assert_non_null(std::strstr(s.kernel_store_note.c_str(), "returned the row of key"));
}

void test_callback_errors(void **) {
  FakeStore fake;
  Record want;
  const Key key = plant(&fake, 41, &want);
  auto store = tiered(&fake);
  Record got;
  uint64_t errors = 0;
  // get returning an error, an unknown code, OK without calling found.
  for (int rc : {int(FA_STORE_ERROR), 42, int(FA_STORE_OK)}) {
    fake.get_result = rc;
    assert_false(store->get(key, want.key_material, &got));
    assert_int_equal(store->stats().remote_errors, ++errors);
  }
  // found with a short record.
  fake.get_result = -1;
  fake.found_struct_size = sizeof(fa_store_record) - 8;
  assert_false(store->get(key, want.key_material, &got));
  assert_int_equal(store->stats().remote_errors, ++errors);
  fake.found_struct_size = sizeof(fa_store_record);
  const Stats s = store->stats();
  assert_int_equal(s.remote_hits, 0);
  assert_int_equal(s.remote_discarded, 0);
  assert_int_equal(fake.removes, 0);
  assert_non_null(std::strstr(s.kernel_store_note.c_str(), "FA_STORE_ERROR"));  // the first
  // The store answers again: a hit.
  assert_true(store->get(key, want.key_material, &got));
  assert_true(fa::test::same_record(got, want));

  // DAMAGED: discarded and removed.
  FakeStore damaged;
  const Key dk = plant(&damaged, 42);
  damaged.get_result = FA_STORE_DAMAGED;
  auto store2 = tiered(&damaged);
  assert_false(store2->get(dk, "kernel material 42", &got));
  assert_int_equal(store2->stats().remote_discarded, 1);
  assert_int_equal(damaged.removes, 1);

  // put failing: the local row is written, the error counted.
  FakeStore failing;
  failing.put_result = FA_STORE_ERROR;
  auto store3 = tiered(&failing);
  Key pk;
  const Record pr = keyed_record(43, &pk);
  store3->put(pk, pr);
  assert_true(store3->get(pk, pr.key_material, &got));  // from the local store
  const Stats s3 = store3->stats();
  assert_int_equal(s3.remote_errors, 1);
  assert_int_equal(s3.remote_puts, 0);
  assert_int_equal(failing.gets, 0);
}

// ---- through the public API --------------------------------------------------

fa_status create_with(const fa_kernel_store *ks, const std::string &dir, fa_runtime **rt,
                      size_t options_size = sizeof(fa_runtime_options)) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.struct_size = options_size;
  o.backend = FA_BACKEND_EMULATOR;
  o.cache_dir = dir.c_str();
  o.kernel_store = ks;
  *rt = nullptr;
  return fa_runtime_create(&o, rt);
}

void expect_refused(const fa_kernel_store &ks, const char *field) {
  const std::string dir = fa::test::temp_dir("kernel_store", "refused");
  fa_runtime *rt = nullptr;
  assert_int_equal(create_with(&ks, dir, &rt), FA_ERROR_INVALID_ARGUMENT);
  assert_null(rt);
  if (!std::strstr(fa_last_error(), field)) {
    std::printf("message \"%s\" does not name %s\n", fa_last_error(), field);
    fail();
  }
  fa::test::rm_rf(dir);
}

void test_runtime_checks_kernel_store(void **) {
  FakeStore fake;
  fa_kernel_store ks = fake.api();
  ks.struct_size = sizeof ks - 8;
  expect_refused(ks, "kernel_store.struct_size");
  ks = fake.api();
  ks.struct_size = 0;
  expect_refused(ks, "kernel_store.struct_size");
  ks = fake.api();
  ks.get = nullptr;
  expect_refused(ks, "kernel_store.get");
  ks = fake.api();
  ks.put = nullptr;
  expect_refused(ks, "kernel_store.put");
  assert_int_equal(fake.destroys, 0);  // a failed create leaves the store to the caller
  // remove and destroy may be NULL; name may be NULL.
  ks = fake.api(nullptr);
  ks.remove = nullptr;
  ks.destroy = nullptr;
  const std::string dir = fa::test::temp_dir("kernel_store", "optional");
  fa_runtime *rt = nullptr;
  assert_int_equal(create_with(&ks, dir, &rt), FA_SUCCESS);
  const fa_cache_stats s = fa::test::cache_stats_of(rt);
  assert_string_equal(s.kernel_store, "caller's kernel store");
  fa_runtime_destroy(rt);
  assert_int_equal(fake.destroys, 0);
  // A 0.6 caller's options end before kernel_store: whatever follows is not read.
  struct {
    fa_runtime_options o;
    char tail[16];
  } old;
  std::memset(&old, 0xA5, sizeof old);
  fa_runtime_options init = FA_RUNTIME_OPTIONS_INIT;
  std::memcpy(&old.o, &init, FA_RUNTIME_OPTIONS_SIZE_0_6);
  old.o.struct_size = FA_RUNTIME_OPTIONS_SIZE_0_6;
  old.o.backend = FA_BACKEND_EMULATOR;
  old.o.cache_dir = dir.c_str();
  assert_int_equal(fa_runtime_create(&old.o, &rt), FA_SUCCESS);
  fa_runtime_destroy(rt);
  fa::test::rm_rf(dir);
}

void test_runtime_second_cache_builds_nothing(void **) {
  FakeStore fake;
  const fa_kernel_store ks = fake.api("fleet store");
  const std::string d1 = fa::test::temp_dir("kernel_store", "warm");
  const std::string d2 = fa::test::temp_dir("kernel_store", "cold");
  fa_runtime *a = nullptr;
  assert_int_equal(create_with(&ks, d1, &a), FA_SUCCESS);
  assert_true(fa::test::launch_small_forward(a, 32, 101));
  assert_true(fa::test::launch_small_forward(a, 64, 102));
  const fa_cache_stats sa = fa::test::cache_stats_of(a);
  assert_true(sa.compiles >= 2);
  assert_int_equal(sa.remote_puts, sa.misses);
  assert_int_equal(sa.remote_misses, sa.misses);
  assert_int_equal(sa.remote_hits, 0);
  assert_int_equal(sa.remote_errors, 0);
  assert_string_equal(sa.kernel_store, "fleet store");
  assert_int_equal(fake.rows.size(), sa.misses);
  fa_runtime_destroy(a);
  assert_int_equal(fake.destroys, 1);

  // A second runtime with an empty local cache: everything from the fake.
  fa_runtime *b = nullptr;
  assert_int_equal(create_with(&ks, d2, &b), FA_SUCCESS);
  assert_true(fa::test::launch_small_forward(b, 32, 103));
  assert_true(fa::test::launch_small_forward(b, 64, 104));
  fa_cache_stats sb = fa::test::cache_stats_of(b);
  assert_int_equal(sb.compiles, 0);
  assert_int_equal(sb.misses, 0);
  assert_int_equal(sb.remote_hits, sa.misses);
  assert_int_equal(sb.disk_hits, sa.misses);
  assert_int_equal(sb.remote_puts, 0);
  assert_int_equal(sb.entries, sa.misses);  // copied into the local cache
  assert_true(sb.persistent == 1);
  // A 0.6 caller's stats struct: the 0.7 fields are not written.
  struct {
    fa_cache_stats s;
    char tail[8];
  } old;
  std::memset(&old, 0xA5, sizeof old);
  old.s.struct_size = FA_CACHE_STATS_SIZE_0_6;
  assert_int_equal(fa_cache_stats_get(b, &old.s), FA_SUCCESS);
  const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&old.s);
  for (size_t i = FA_CACHE_STATS_SIZE_0_6; i < sizeof old; ++i) assert_int_equal(bytes[i], 0xA5);
  fa_runtime_destroy(b);
  assert_int_equal(fake.destroys, 2);
  fa::test::rm_rf(d1);
  fa::test::rm_rf(d2);
}

// In a child: a runtime under FLASHATTN_KERNEL_STORE=value (and the plugin
// path variable when plugin is not null), with kernel_store ks; checks its
// stats' kernel_store and that its note contains `note` ("" = empty).
int env_child(const char *value, const char *plugin, const fa_kernel_store *ks, const char *store,
              const char *note) {
  setenv("FLASHATTN_KERNEL_STORE", value, 1);
  if (plugin) setenv("FLASHATTN_KERNEL_STORE_PLUGIN", plugin, 1);
  const std::string dir = fa::test::temp_dir("kernel_store", "env");
  fa_runtime *rt = nullptr;
  if (create_with(ks, dir, &rt) != FA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", value, fa_last_error());
    return 1;
  }
  const bool launched = fa::test::launch_small_forward(rt, 32, 7);
  const fa_cache_stats s = fa::test::cache_stats_of(rt);
  fa_runtime_destroy(rt);
  fa::test::rm_rf(dir);
  const bool note_ok =
      note[0] ? std::strstr(s.kernel_store_note, note) != nullptr : s.kernel_store_note[0] == '\0';
  if (!launched || std::strcmp(s.kernel_store, store) != 0 || !note_ok ||
      std::strstr(s.kernel_store_note, "secret")) {
    std::fprintf(stderr, "%s: launched %d, kernel_store \"%s\", note \"%s\"\n", value, launched,
                 s.kernel_store, s.kernel_store_note);
    return 1;
  }
  return 0;
}

void test_env_variable(void **) {
  auto child = [](const char *value, const char *plugin, const fa_kernel_store *ks,
                  const char *store, const char *note) {
    return wait_exit(
        fork_child([&] { return env_child(value, plugin, ks, store, note); }, false, 120));
  };
  assert_int_equal(child("off", nullptr, nullptr, "", ""), 0);
  assert_int_equal(child("memcached://x", nullptr, nullptr, "", "not a redis:// or unix:// URL"),
                   0);
  assert_int_equal(child("redis://:secret@127.0.0.1:1", "/nonexistent/libflashattn_store_redis.so",
                         nullptr, "", "Redis kernel store plugin not used"),
                   0);
  assert_int_equal(
      child("redis://127.0.0.1:1", "relative/plugin.so", nullptr, "", "is not an absolute path"),
      0);
  // An explicit kernel_store wins over the variable.
  FakeStore fake;
  const fa_kernel_store ks = fake.api("mine");
  assert_int_equal(child("redis://127.0.0.1:1", "/nonexistent/x.so", &ks, "mine", ""), 0);
}

}  // namespace

int main(void) {
  setenv("FLASHATTN_QUIET", "1", 1);  // expected warnings would only clutter the log
  unsetenv("FLASHATTN_KERNEL_STORE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_remote_hit_copied_local),
      cmocka_unit_test(test_bad_hash_discarded_and_removed),
      cmocka_unit_test(test_key_material_checks),
      cmocka_unit_test(test_callback_errors),
      cmocka_unit_test(test_runtime_checks_kernel_store),
      cmocka_unit_test(test_runtime_second_cache_builds_nothing),
      cmocka_unit_test(test_env_variable),
  };
  return cmocka_run_group_tests_name("kernel_store", tests, nullptr, nullptr);
}
