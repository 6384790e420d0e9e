// Replays a fuzz corpus without libFuzzer: calls LLVMFuzzerTestOneInput once
// per regular file of each directory (or file) named on the command line, in
// name order. Built per target with the normal compiler, so the sanitizer
// build runs the corpus under ASan and UBSan.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

bool read_file(const std::string &path, std::vector<uint8_t> *out) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  out->clear();
  uint8_t buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + n);
  std::fclose(f);
  return true;
}

// Regular files under path (path itself when it is a file), sorted.
std::vector<std::string> list_inputs(const std::string &path) {
  std::vector<std::string> files;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return files;
  if (S_ISREG(st.st_mode)) return {path};
  DIR *d = opendir(path.c_str());
  if (!d) return files;
  while (dirent *e = readdir(d)) {
    const std::string p = path + "/" + e->d_name;
    if (e->d_name[0] != '.' && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(p);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  size_t count = 0;
  for (int a = 1; a < argc; ++a) {
    for (const std::string &p : list_inputs(argv[a])) {
      std::vector<uint8_t> data;
      if (!read_file(p, &data)) {
        std::fprintf(stderr, "cannot read %s\n", p.c_str());
        return 1;
      }
      std::printf("replay %s (%zu bytes)\n", p.c_str(), data.size());
      std::fflush(stdout);
      LLVMFuzzerTestOneInput(data.data(), data.size());
      ++count;
    }
  }
  std::printf("replayed %zu inputs\n", count);
  // An empty corpus is a configuration error: the test would prove nothing.
  return count > 0 ? 0 : 1;
}
