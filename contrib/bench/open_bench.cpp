// monarch-bench-open LIST [ROUNDS]: reads every file named in LIST (one path a
// line) whole, the way Python's open(path, "rb").read() does it (open, fstat,
// ioctl TCGETS, two lseeks, fstat, read of size+1, read at EOF, close), ROUNDS
// times (default 5), and prints one JSON line with the median round's time per
// file. contrib/bench/run runs it on the tier's copies without Monarch and on
// the dataset's paths through the interposition library, to price the per-file
// calls of an ImageFolder-like reader (the overhead benchmark prices one pread
// and an open outside the dataset).
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: monarch-bench-open LIST [ROUNDS]\n");
    return 2;
  }
  std::vector<std::string> paths;
  std::ifstream list(argv[1]);
  for (std::string line; std::getline(list, line);)
    if (!line.empty()) paths.push_back(line);
  int rounds = argc == 3 ? std::atoi(argv[2]) : 5;
  if (paths.empty() || rounds < 1) {
    std::fprintf(stderr, "monarch-bench-open: no paths in %s, or ROUNDS < 1\n", argv[1]);
    return 2;
  }
  std::vector<char> buf;
  std::vector<double> per_file;
  unsigned long long bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (const std::string& p : paths) {
      int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        std::perror(p.c_str());
        return 1;
      }
      struct stat st;
      termios t;
      fstat(fd, &st);
      ioctl(fd, TCGETS, &t);
      lseek(fd, 0, SEEK_CUR);
      lseek(fd, 0, SEEK_CUR);
      fstat(fd, &st);
      buf.resize(size_t(st.st_size) + 1);
      ssize_t n = read(fd, buf.data(), buf.size());
      char c;
      if (n < 0 || read(fd, &c, 1) != 0) {
        std::fprintf(stderr, "monarch-bench-open: short or failed read of %s\n", p.c_str());
        return 1;
      }
      bytes += size_t(n);
      close(fd);
    }
    std::chrono::duration<double, std::nano> d = std::chrono::steady_clock::now() - t0;
    per_file.push_back(d.count() / double(paths.size()));
  }
  std::sort(per_file.begin(), per_file.end());
  std::printf("{\"files\":%zu,\"rounds\":%d,\"ns_per_file\":%.1f,\"bytes\":%llu}\n", paths.size(),
              rounds, per_file[per_file.size() / 2], bytes);
  return 0;
}
