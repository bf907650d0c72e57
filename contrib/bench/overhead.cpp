// monarch-bench-overhead: the cost of the interposition library on the calls
// that matter, as Google Benchmarks. contrib/bench/overhead runs it twice,
// without the library and with it (the dataset file cached on a tier), and
// prints the ratios.
//   MONARCH_BENCH_FILE    file read with 4 KiB preads (a dataset file, or a
//                         plain local copy of it for the baseline)
//   MONARCH_BENCH_OTHER   a file outside the dataset, opened and closed
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <vector>

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) {
    std::fprintf(stderr, "monarch-bench-overhead: set %s\n", name);
    std::exit(2);
  }
  return v;
}

void pread_4k(benchmark::State& state) {
  int fd = open(env("MONARCH_BENCH_FILE"), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (1 << 20)) {
    state.SkipWithError("cannot open a file of at least 1 MiB");
    return;
  }
  std::vector<off_t> offsets(4096);
  std::mt19937_64 rng(1);
  for (off_t& o : offsets) o = off_t(rng() % (st.st_size / 4096)) * 4096;
  char buf[4096];
  size_t i = 0;
  for (auto _ : state) {
    if (pread(fd, buf, sizeof buf, offsets[i++ & 4095]) != sizeof buf) {
      state.SkipWithError("short read");
      break;
    }
  }
  close(fd);
}
BENCHMARK(pread_4k)->MinTime(1.0);

void open_close_outside(benchmark::State& state) {
  const char* path = env("MONARCH_BENCH_OTHER");
  for (auto _ : state) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
      state.SkipWithError("cannot open MONARCH_BENCH_OTHER");
      break;
    }
    close(fd);
  }
}
BENCHMARK(open_close_outside)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
