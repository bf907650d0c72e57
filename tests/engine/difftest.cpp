// monarch-difftest: the differential tester of issue 13. It runs random,
// seeded sequences of file calls over a generated tree and prints one
// normalized line per call, so that a run under the interposition library and
// a direct run over another tree with the same content print the same lines
// exactly when Monarch showed the program what the kernel alone would have
// shown (bytes, return values, errno, offsets, descriptor numbers, identity
// and flags). test_difftest.py drives it and compares the outputs.
//
//   monarch-difftest setup TREE --sequences LIST   the tree (LIST: "0-99", "3,7-9")
//   monarch-difftest gen --seed S --sequence K     sequence K's op list, one op a line
//   monarch-difftest exec TREE --seed S --sequences LIST
//   monarch-difftest exec TREE --ops FILE --sequence K
//   monarch-difftest child-read LABEL N            (what a spawned child executes)
//
// The tree: TREE/ds is the dataset, TREE/out what lies outside it. Shared
// files of several sizes in ds (a few bytes to 8 MiB, nested directories),
// look-alikes with the same names and sizes but other bytes in out, symbolic
// links inside ds (out of it, to a file, to a subdirectory, back into it),
// and for each sequence K a private writable area ds/w/K and out/w/K (with
// other names of ds/w/K's files outside the dataset: out/w/K/wlink, a link
// to ds/w/K, and out/w/K/hard.txt, a hard link of ds/w/K/f1.txt): the
// only places a sequence writes, so sequences never change each other's
// files and the shared files stay the same for the whole run.
//
// An output line is "K.I OP => RESULT". RESULT never depends on the tree's
// location or on values that differ between two trees of equal content:
//   - the tree's path (given and real) is printed as <T>;
//   - an inode is printed as the tree-relative path it had at the sequence's
//     start (a map built with raw system calls, which Monarch never sees), or
//     "new:PATH" for a file the sequence created, "other" off the tree's device;
//     a directory above the tree (reached with one ".." too many) is only
//     "outside": other programs change it;
//   - st_dev is "tree" or "other"; mtime, ctime and btime are "=" or
//     "changed" against the raw values at the sequence's start, st_blocks
//     "=" or its value (ext4 may give one of two equal files an extent block);
//   - atime is never printed: reads served from copies do not update the PFS
//     file's atime, by design.
// kNotCompared: limits of Monarch the README documents ("What Monarch
// serves, and what it leaves"), which the generator does not produce, each
// because only a descriptor Monarch would have to hold (visible, counted in
// RLIMIT_NOFILE) or a read glibc makes internally could close it:
//   - locks (flock, fcntl, lockf) taken through a descriptor of a copy
//     exclude other such descriptors, not PFS descriptors of the same file;
//   - a stdio stream reads through glibc's internal read(): one opened on a
//     copy keeps the copy's bytes when the job writes the file elsewhere, so
//     read streams are opened only on files no sequence writes;
//   - after the job unlinks or renames a cached file, a descriptor of its copy
//     still reads the right bytes, but fstat and /proc/self/fd show the file
//     as it was: the sequence moves names only while none of its files is open;
//   - a stream whose descriptor was closed or replaced behind stdio's back
//     (closefrom, close_range, dup2 or dup3 onto its number) reads what that
//     number names through the same internal read(): it is not read again;
//   - O_DIRECT set with F_SETFL is followed for the descriptor and its
//     duplicates in the process, not for a stdio stream's own reads: DIRECT
//     is set only while no stream is open, and no stream is opened after it
//     (a dup onto a stream's descriptor would make the stream read that file).
// Offsets after a call are read with a raw lseek: the kernel's offset is what
// another holder of the open file (a dup, a forked child) sees.
// A sequence runs in its own forked child (fresh descriptor table, cwd TREE);
// its end is a line too: "K.end => exit 0", or the signal that killed it
// (SIGXFSZ, SIGBUS...), or SIGALRM after 30 s (a hang). "K.fds" lists every
// descriptor open at the sequence's end (found with raw calls, so that one
// the library keeps for itself shows), its flags and offset.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" int __open_2(const char* path, int flags);
extern char** environ;

namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;
constexpr int kSlots = 8;    // descriptor slots s0..s7 of a sequence
constexpr int kStreams = 3;  // FILE* slots f0..f2
constexpr size_t kBufSize = 9 * MiB;
constexpr int kProbeFds = 1024;  // the end-of-sequence dump looks at descriptors below this

[[noreturn]] void die(const std::string& msg) {
  fprintf(stderr, "monarch-difftest: %s\n", msg.c_str());
  exit(2);
}

// ---- hashing and deterministic content ----

uint64_t hash_bytes(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 32);
}

uint64_t hash_str(const std::string& s) {
  return hash_bytes(s.data(), s.size());
}

// n bytes that are a function of `seed` alone.
void fill(std::string& out, uint64_t seed, size_t n) {
  out.resize(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(&out[i], &z, std::min<size_t>(8, n - i));
  }
}

std::string hex(uint64_t v) {
  char b[20];
  snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

std::string errname(int e) {
  const char* s = strerrorname_np(e);
  return s ? s : "E" + std::to_string(e);
}

std::string signame(int s) {
  const char* n = sigabbrev_np(s);
  return n ? std::string("SIG") + n : "signal " + std::to_string(s);
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    size_t n = s.find(sep, at);
    out.push_back(s.substr(at, n - at));
    if (n == std::string::npos) return out;
    at = n + sep.size();
  }
}

// "0-99", "3,7-9": the sequence ids.
std::vector<int> parse_list(const std::string& text) {
  std::vector<int> ids;
  for (const std::string& part : split(text, ",")) {
    size_t dash = part.find('-');
    int a = std::stoi(part.substr(0, dash));
    int b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
    for (int k = a; k <= b; ++k) ids.push_back(k);
  }
  return ids;
}

// ---- the tree ----

struct FileSpec {
  const char* name;
  uint64_t size;
};
// In ds/ and, with other bytes, in out/. Sizes straddle the interesting
// thresholds: empty, a few bytes, around 64 KiB (small_file_max of one
// Monarch run), up to 300 KiB, and two large files of 2-8 MiB.
const FileSpec kShared[] = {
    {"empty.bin", 0},
    {"tiny.txt", 7},
    {"a.bin", 1000},
    {"b.bin", 70000},
    {"c.bin", 64 * KiB},
    {"d.bin", 300 * KiB},
    {"sub/c.bin", 20000},
    {"sub/d.bin", 4097},
    {"sub/deeper/e.bin", 128 * KiB},
    {"sub/deeper/most/f.bin", 12345},
    {"big1.bin", 2 * MiB + 12345},
    {"big2.bin", 8 * MiB - 1},
};
// out/dir, where ds/linkdir leads.
const FileSpec kOutDir[] = {{"a.bin", 1000}, {"b.bin", 70000}, {"c.bin", 64 * KiB}};
struct LinkSpec {
  const char* path;
  const char* target;
};
const LinkSpec kLinks[] = {
    {"ds/linkdir", "../out/dir"},      // out of the dataset: linkdir/.. is out/
    {"ds/alink.bin", "a.bin"},         // a file
    {"ds/sublink", "sub"},             // a dataset directory
    {"ds/uplink.bin", "../ds/b.bin"},  // out and back in
    {"ds/dangling", "nonexist.bin"},   // nowhere
    {"ds/sub/deeper/up", "../.."},     // the dataset root
    {"out/inlink", "../ds/sub"},       // from outside into the dataset
};

uint64_t w_f2_size(int k) {
  return k % 4 == 0 ? 70000 : 9000;
}

void write_file(const std::string& path, uint64_t seed, uint64_t size) {
  std::string data;
  fill(data, seed, size);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, data.data(), size) != ssize_t(size) || close(fd) != 0)
    die("cannot write " + path + ": " + strerror(errno));
}

void make_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    die("cannot make " + path + ": " + strerror(errno));
}

int cmd_setup(const std::string& tree, const std::vector<int>& ids) {
  umask(022);
  make_dir(tree);
  for (const char* d : {"ds", "ds/sub", "ds/sub/deeper", "ds/sub/deeper/most", "ds/w", "out",
                        "out/sub", "out/sub/deeper", "out/sub/deeper/most", "out/dir", "out/w"})
    make_dir(tree + "/" + d);
  for (const FileSpec& f : kShared) {
    write_file(tree + "/ds/" + f.name, hash_str(std::string("ds:") + f.name), f.size);
    write_file(tree + "/out/" + f.name, hash_str(std::string("out:") + f.name), f.size);
  }
  for (const FileSpec& f : kOutDir)
    write_file(tree + "/out/dir/" + f.name, hash_str(std::string("dir:") + f.name), f.size);
  for (const LinkSpec& l : kLinks)
    if (symlink(l.target, (tree + "/" + l.path).c_str()) != 0 && errno != EEXIST)
      die(std::string("cannot link ") + l.path + ": " + strerror(errno));
  for (int k : ids) {
    std::string w = tree + "/ds/w/" + std::to_string(k), o = tree + "/out/w/" + std::to_string(k);
    make_dir(w);
    make_dir(w + "/d");
    make_dir(o);
    write_file(w + "/f1.txt", hash_str("f1:" + std::to_string(k)), 1500);
    write_file(w + "/f2.bin", hash_str("f2:" + std::to_string(k)), w_f2_size(k));
    write_file(w + "/d/g.txt", hash_str("g:" + std::to_string(k)), 300);
    write_file(o + "/x.txt", hash_str("x:" + std::to_string(k)), 100);
    // Other names of the sequence's dataset files, outside the dataset.
    unlink((o + "/hard.txt").c_str());  // a tree set up again
    if ((symlink(("../../../ds/w/" + std::to_string(k)).c_str(), (o + "/wlink").c_str()) != 0 &&
         errno != EEXIST) ||
        link((w + "/f1.txt").c_str(), (o + "/hard.txt").c_str()) != 0)
      die("cannot link in " + o + ": " + strerror(errno));
  }
  return 0;
}

// ---- the generator: sequence K's op list, a pure function of (seed, K) ----
//
// Ops name descriptor slots (s0..s7) and stream slots (f0..f2), never
// descriptor numbers, so that any sub-list of a sequence is still a valid
// sequence (the minimizer removes ops). Paths are tree-relative targets,
// written absolute ("<T>/...") or relative to the current directory the
// generator believes in, sometimes decorated with "//", "./", a trailing "/".
// Writes (and everything that changes a file) only ever name ds/w/K and
// out/w/K, and the shared files are only ever opened read-only.

// Paths a sequence reads; "K" stands for the sequence's id. The first
// kPlain are plain dataset files, picked more often.
const char* const kReadTargets[] = {
    "ds/a.bin", "ds/b.bin", "ds/c.bin", "ds/d.bin", "ds/tiny.txt", "ds/empty.bin", "ds/big1.bin",
    "ds/big2.bin", "ds/sub/c.bin", "ds/sub/d.bin", "ds/sub/deeper/e.bin",
    "ds/sub/deeper/most/f.bin",
    // through links, odd spellings, look-alikes
    "ds/alink.bin", "ds/uplink.bin", "ds/sublink/c.bin", "ds/linkdir/a.bin", "ds/linkdir/b.bin",
    "ds/dangling", "ds/linkdir/../a.bin", "ds/linkdir/../sub/c.bin", "ds/sublink/../a.bin",
    "ds/sub/deeper/up/a.bin", "ds/sub/deeper/up/../b.bin", "ds/a.bin/.", "ds/a.bin/",
    "ds/nonexist/../a.bin", "ds/a.bin/../b.bin", "ds/sub/../a.bin", "ds/sub/deeper/../../b.bin",
    "ds//sub///c.bin", "ds/./sub/./c.bin", "ds/../ds/a.bin", "ds/missing.bin", "ds/sub/c.bin/..",
    "out/a.bin", "out/b.bin", "out/sub/c.bin", "out/dir/a.bin", "out/inlink/c.bin",
    "out/inlink/../a.bin", "out/big1.bin",
    // the sequence's own files
    "ds/w/K/f1.txt", "ds/w/K/f2.bin", "ds/w/K/d/g.txt", "ds/w/K/new.txt", "ds/w/K/d/../f1.txt",
    "out/w/K/x.txt", "ds/w/K/n2.bin", "out/w/K/wlink/f2.bin", "out/w/K/hard.txt"};
constexpr int kPlain = 12;
const char* const kDirTargets[] = {
    "",         "ds",           "ds/sub",     "ds/sub/deeper", "ds/sub/deeper/most",
    "out",      "out/dir",      "ds/linkdir", "ds/sublink",    "ds/sub/deeper/up",
    "ds/w/K",   "ds/w/K/d",     "out/w/K",    "ds/w",          "ds/missing",
    "ds/a.bin", "out/w/K/wlink"};
const char* const kWriteTargets[] = {
    "ds/w/K/f1.txt", "ds/w/K/f2.bin",        "ds/w/K/d/g.txt",   "ds/w/K/new.txt",
    "ds/w/K/n2.bin", "ds/w/K/d/../f1.txt",   "ds/w/K/d/h.txt",   "out/w/K/x.txt",
    "out/w/K/y.bin", "out/w/K/wlink/f2.bin", "out/w/K/hard.txt", "out/w/K/wlink/d/g.txt"};
// Directories that are links: where they physically are (for ".." in relative paths).
const LinkSpec kPhysical[] = {{"ds/linkdir", "out/dir"},
                              {"ds/sublink", "ds/sub"},
                              {"ds/sub/deeper/up", "ds"},
                              {"out/w/K/wlink", "ds/w/K"}};

template <size_t N>
const char* any(std::mt19937_64& r, const char* const (&a)[N]) {
  return a[r() % N];
}

class Gen {
 public:
  Gen(uint64_t seed, int k) : k_(k) {
    std::seed_seq s{uint32_t(seed), uint32_t(seed >> 32), uint32_t(k), 0x6d6f6e61u};
    r_.seed(s);
  }

  std::vector<std::string> run() {
    int n = 40 + int(r_() % 41);
    std::vector<std::string> ops;
    for (int i = 0; i < n; ++i) ops.push_back(op());
    return ops;
  }

 private:
  struct Slot {
    std::string target;  // what the generator believes the slot holds ("" when nothing)
    bool dir = false;
    bool writable = false;
  };

  uint64_t pick(uint64_t n) { return n ? r_() % n : 0; }
  bool chance(int percent) { return int(r_() % 100) < percent; }
  std::string num(int64_t v) { return std::to_string(v); }

  std::string with_k(std::string t) {
    size_t at = t.find("/K");
    if (at != std::string::npos && (at + 2 == t.size() || t[at + 2] == '/'))
      t.replace(at + 1, 1, std::to_string(k_));
    return t;
  }

  std::string physical(const std::string& dir) {
    for (const LinkSpec& l : kPhysical)
      if (dir == with_k(l.path)) return with_k(l.target);
    return dir;
  }

  // `target` (tree-relative) written absolute or relative to `base` (a
  // tree-relative directory the generator believes is the current one).
  // The belief can be wrong (a chdir that failed, a renamed directory):
  // with `area`, a path that changes something keeps its "w/K" component, so
  // that wherever it resolves it is in this sequence's own area or nowhere,
  // never a shared directory.
  std::string spell(const std::string& target, const std::string& base, bool decorate = true,
                    bool area = false) {
    std::string p;
    if (chance(45)) {
      p = target.empty() ? "<T>" : "<T>/" + target;
    } else if (base.empty()) {
      p = target.empty() ? "." : target;
    } else if (target == base) {
      p = ".";
    } else if (target.rfind(base + "/", 0) == 0) {
      p = target.substr(base.size() + 1);
    } else {
      std::string phys = physical(base);
      int depth = 1 + int(std::count(phys.begin(), phys.end(), '/'));
      for (int i = 0; i < depth; ++i) p += "../";
      p += target;
      if (target.empty()) p.pop_back();
    }
    if (area && p[0] != '<' && p.find("w/" + std::to_string(k_)) == std::string::npos)
      p = "<T>/" + target;
    if (decorate && chance(10)) {
      switch (pick(5)) {
        case 0: {
          size_t s = p.find('/');
          if (s != std::string::npos) p.insert(s, "/");
          break;
        }
        case 1:
          if (p[0] != '<' && p[0] != '/') p = "./" + p;
          break;
        case 2:
          p += "/";
          break;
        case 3:
          p += "/.";
          break;
        default: {
          size_t s = p.rfind('/');
          if (s != std::string::npos) p.insert(s, "/.");
        }
      }
    }
    return p;
  }

  std::string read_target() {
    if (chance(55)) return kReadTargets[pick(kPlain)];
    return with_k(any(r_, kReadTargets));
  }
  std::string dir_target() { return with_k(any(r_, kDirTargets)); }
  std::string write_target() { return with_k(any(r_, kWriteTargets)); }
  std::string path(const std::string& t) { return spell(t, cwd_); }
  std::string wpath(const std::string& t) { return spell(t, cwd_, true, true); }

  // A slot, most often one that holds a file, sometimes any.
  int used_slot() {
    std::vector<int> files, dirs;
    for (int i = 0; i < kSlots; ++i)
      if (!slot_[i].target.empty()) (slot_[i].dir ? dirs : files).push_back(i);
    if (!files.empty() && chance(80)) return files[pick(files.size())];
    if (!dirs.empty() && chance(30)) return dirs[pick(dirs.size())];
    return int(pick(kSlots));
  }
  // A slot of a kind (directory, writable) most often, if there is one.
  int slot_where(bool Slot::*what) {
    std::vector<int> found;
    for (int i = 0; i < kSlots; ++i)
      if (!slot_[i].target.empty() && slot_[i].*what) found.push_back(i);
    return !found.empty() && chance(80) ? found[pick(found.size())] : used_slot();
  }
  // A stream slot, most often an open one (or, for fopen, a free one).
  int stream_slot(bool open) {
    std::vector<int> found;
    for (int i = 0; i < kStreams; ++i)
      if (stream_[i] == open) found.push_back(i);
    return !found.empty() && chance(85) ? found[pick(found.size())] : int(pick(kStreams));
  }
  int free_slot() {
    for (int tries = 0; tries < 4; ++tries) {
      int s = int(pick(kSlots));
      if (slot_[s].target.empty()) return s;
    }
    return int(pick(kSlots));
  }
  std::string s(int i) { return "s" + num(i); }

  uint64_t size_hint(const std::string& t) {
    std::string base = t.substr(t.rfind('/') + 1);
    if (base == "f2.bin") return w_f2_size(k_);
    if (base == "f1.txt") return 1500;
    for (const FileSpec& f : kShared) {
      std::string n = f.name;
      if (n == base || n.substr(n.rfind('/') + 1) == base) return f.size;
    }
    return 100000;
  }
  uint64_t slot_size(int i) {
    return slot_[i].target.empty() ? 100000 : size_hint(slot_[i].target);
  }

  int64_t offset(uint64_t size) {
    switch (pick(10)) {
      case 0:
        return 0;
      case 1:
        return int64_t(pick(size + 1));
      case 2:
        return int64_t(size);
      case 3:
        return size ? int64_t(size) - 1 : 0;
      case 4:
        return int64_t(size + pick(10000));
      case 5:
        return -1;
      case 6:
        return -int64_t(pick(1 << 20)) - 2;
      case 7:
        return int64_t(1) << 40;
      case 8:
        return int64_t(4096 * pick(size / 4096 + 2));
      default:
        return int64_t(pick(std::min<uint64_t>(size + 1, 70000)));
    }
  }
  uint64_t length(uint64_t size) {
    switch (pick(9)) {
      case 0:
        return 0;
      case 1:
        return 1;
      case 2:
        return pick(100);
      case 3:
        return 4096;
      case 4:
        return pick(70000);
      case 5:
        return 1 << 20;
      case 6:
        return std::min<uint64_t>(size, 8 * MiB);
      case 7:
        return std::min<uint64_t>(size + 100, 8 * MiB);
      default:
        return pick(9000);
    }
  }
  std::string lens(uint64_t size) {
    int n = 1 + int(pick(4));
    std::string out;
    for (int i = 0; i < n; ++i) out += (i ? "," : "") + num(int64_t(length(size) / 2));
    return out;
  }
  std::string dirarg(std::string& base) {
    if (chance(50)) return "@cwd";
    int d = int(pick(kSlots));
    if (slot_[d].dir) base = slot_[d].target;
    return s(d);
  }

  std::string open_op() {
    static const char* kinds[] = {"open", "open64", "openat", "open2"};
    std::string kind = any(r_, kinds);
    int sl = free_slot();
    std::string base = cwd_, dir;
    if (kind == "openat") dir = dirarg(base) + " ";
    bool w = chance(15);
    std::string flags, target;
    bool isdir = false;
    if (w) {
      target = write_target();
      flags = chance(50) ? "WRONLY" : "RDWR";
      if (chance(30)) flags += "|TRUNC";
      if (chance(30)) flags += "|APPEND";
      if (kind != "open2" && chance(40)) flags += "|CREAT";
    } else {
      isdir = chance(15);
      target = isdir ? dir_target() : read_target();
      flags = "RDONLY";
      if (chance(25)) flags += "|CLOEXEC";
      if (chance(20)) flags += "|NONBLOCK";
      if (chance(10)) flags += "|NOFOLLOW";
      if (chance(isdir ? 50 : 5)) flags += "|DIRECTORY";
      if (chance(5)) flags += "|APPEND";
    }
    slot_[sl] = {target, isdir, w};
    std::string op =
        kind + " " + s(sl) + " " + dir + spell(target, base, !w || chance(50), w) + " " + flags;
    if (flags.find("CREAT") != std::string::npos) op += " 0644";
    return op;
  }

  std::string fork_op() {
    std::string op = "fork";
    int n = 1 + int(pick(4));
    for (int i = 0; i < n; ++i) op += (i ? " ; " : " ") + simple_op();
    return op;
  }

  // Ops a forked child runs on its inherited descriptors.
  std::string simple_op() {
    int d = used_slot();
    uint64_t size = slot_size(d);
    switch (pick(11)) {
      case 0:
        return "read " + s(d) + " " + num(int64_t(length(size)));
      case 1:
        return "pread " + s(d) + " " + num(int64_t(length(size))) + " " + num(offset(size));
      case 2:
        return "lseek " + s(d) + " " + num(offset(size)) + " " + whence();
      case 3:
        return "fstat " + s(d);
      case 4:
        return "getfl " + s(d);
      case 5:
        return "close " + s(d);
      case 6:  // (no locks: see kNotCompared)
        return "fstat " + s(d);
      case 7:
        return "getfl " + s(d);
      case 8:
        return "fdlink " + s(d);
      case 9:
        return "readv " + s(d) + " " + lens(size);
      default:
        return "dup " + s(d) + " " + s(free_slot());
    }
  }

  std::string whence() {
    static const char* w[] = {"SET", "CUR", "END", "DATA", "HOLE", "SET", "CUR", "BAD"};
    return any(r_, w);
  }

  std::string spawn_op() {
    static const char* closes[] = {"close_range", "closefrom", "none"};
    std::string cwd = chance(70) ? path(dir_target()) : "-";
    int d = used_slot();
    int target = chance(60) ? 0 : 1;
    std::string prog = target == 0 && chance(50) ? "reader " + num(int64_t(length(slot_size(d))))
                       : chance(70)              ? "true"
                                                 : "exit";
    return "spawn " + cwd + " " + any(r_, closes) + " " + s(d) + " " + num(target) + " " + prog;
  }

  std::string op() {
    w_open();  // notes a file of the sequence's area opened since the last op
    int d = used_slot();
    uint64_t size = slot_size(d);
    int f = stream_slot(true);
    std::string fs = "f" + num(f);
    // Weights: the common path (open, read, stat) most, every edge some.
    static const int kWeights[] = {14, 3, 4, 1, 2, 1, 8, 7, 3, 3, 1, 6, 2, 3, 2, 2, 5, 1,
                                   1,  2, 2, 1, 3, 1, 1, 4, 2, 4, 3, 3, 3, 2, 1, 2, 1, 1,
                                   1,  2, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3};
    int total = 0;
    for (int w : kWeights) total += w;
    int x = int(pick(total)), which = 0;
    while (x >= kWeights[which]) x -= kWeights[which++];
    switch (which) {
      case 0:
        return open_op();
      case 1: {
        // No stream once DIRECT was set: a dup onto its descriptor would make
        // it read that open file (kNotCompared).
        if (direct_) return open_op();
        static const char* rmodes[] = {"r", "rb", "re", "r"};
        static const char* wmodes[] = {"r+", "a", "w", "a+", "r+e"};
        bool w = chance(20);
        // Read streams only on files the sequence never writes (kNotCompared).
        std::string t = w ? write_target() : kReadTargets[pick(kPlain)];
        f = stream_slot(false);
        stream_[f] = true;
        detached_[f] = false;
        stream_w_[f] = w;
        return "fopen f" + num(f) + " " + spell(t, cwd_, !w, w) + " " +
               (w ? any(r_, wmodes) : any(r_, rmodes));
      }
      case 2:
        if (detached_[f]) return open_op();
        return "fread " + fs + " " + num(int64_t(length(100000)));
      case 3:
        if (detached_[f]) return open_op();
        return "fseek " + fs + " " + num(offset(100000)) + " " + (chance(50) ? "SET" : "CUR");
      case 4:
        stream_[f] = detached_[f] = false;
        return "fclose " + fs;
      case 5: {
        if (detached_[f]) return open_op();
        bool w = chance(20);
        stream_w_[f] = w;
        return "freopen " + fs + " " +
               (w ? wpath(write_target()) : path(kReadTargets[pick(kPlain)])) + " " +
               (w ? "a" : "r");
      }
      case 6:
        return "read " + s(d) + " " + num(int64_t(length(size)));
      case 7:
        return std::string(chance(50) ? "pread " : "pread64 ") + s(d) + " " +
               num(int64_t(length(size))) + " " + num(offset(size));
      case 8:
        return "readv " + s(d) + " " + lens(size);
      case 9:
        return std::string(chance(70) ? "preadv " : "preadv2 ") + s(d) + " " + lens(size) + " " +
               num(offset(size));
      case 10:
        return "pread " + s(d) + " " + num(int64_t(length(size))) + " -1";
      case 11:
        return std::string(chance(80) ? "lseek " : "lseek64 ") + s(d) + " " + num(offset(size)) +
               " " + whence();
      case 12:
        return "dup " + s(d) + " " + s(free_slot());
      case 13: {
        std::string to = chance(25)   ? "=" + s(d)
                         : chance(50) ? "=" + s(int(pick(kSlots)))
                         : chance(10) ? "-1"
                                      : num(3 + int64_t(pick(38)));
        if (to[0] != '=') detach_streams();
        return "dup2 " + s(chance(10) ? int(pick(kSlots)) : d) + " " + to + " " + s(free_slot());
      }
      case 14: {
        std::string to = chance(30) ? "=" + s(int(pick(kSlots))) : num(3 + int64_t(pick(38)));
        if (to[0] != '=') detach_streams();
        return "dup3 " + s(d) + " " + to + " " + (chance(50) ? "CLOEXEC" : "0") + " " +
               s(free_slot());
      }
      case 15:
        return std::string(chance(50) ? "dupfd " : "dupfd_cloexec ") + s(d) + " " +
               num(int64_t(pick(40))) + " " + s(free_slot());
      case 16: {
        int c = chance(80) ? used_slot() : int(pick(kSlots));
        slot_[c] = {};
        return "close " + s(c);
      }
      case 17:
        detach_streams();
        return "closefrom " + num(3 + int64_t(pick(20)));
      case 18: {
        static const char* fl[] = {"0", "CLOEXEC", "0", "UNSHARE"};
        int64_t a = 3 + int64_t(pick(20));
        int64_t b = chance(30) ? int64_t(UINT_MAX) : a + int64_t(pick(10));
        std::string how = any(r_, fl);
        if (how != "CLOEXEC") detach_streams();
        return "close_range " + num(a) + " " + num(b) + " " + how;
      }
      case 19:
        return fork_op();
      case 20:
        return spawn_op();
      case 21: {
        static const char* closes[] = {"closefrom", "none"};
        return "pspawn " + (chance(70) ? path(dir_target()) : std::string("-")) + " " +
               any(r_, closes) + " " + s(d) + " " + (chance(50) ? "0" : "1") + " true";
      }
      case 22: {
        std::string t = dir_target();
        std::string op = "chdir " + path(t);
        bool exists = t != "ds/missing" && t != "ds/a.bin";
        if (exists) cwd_ = t;
        return op;
      }
      case 23: {
        int c = slot_where(&Slot::dir);
        if (slot_[c].dir) cwd_ = slot_[c].target;
        return "fchdir " + s(c);
      }
      case 24:
        return "getcwd";
      case 25: {
        static const char* k[] = {"stat", "stat64"};
        return std::string(any(r_, k)) + " " + path(chance(20) ? dir_target() : read_target());
      }
      case 26: {
        static const char* k[] = {"lstat", "lstat64"};
        return std::string(any(r_, k)) + " " + path(chance(20) ? dir_target() : read_target());
      }
      case 27:
        return std::string(chance(70) ? "fstat " : "fstat64 ") + s(d);
      case 28: {
        static const char* fl[] = {"0", "NOFOLLOW", "EMPTY", "0"};
        std::string base = cwd_, dir = dirarg(base), flags = any(r_, fl);
        std::string p = flags == "EMPTY" && chance(70) ? "''" : spell(read_target(), base);
        return "fstatat " + dir + " " + p + " " + flags;
      }
      case 29: {
        static const char* fl[] = {"0", "NOFOLLOW", "EMPTY", "0", "SYNC"};
        static const char* masks[] = {"basic", "btime", "all", "basic"};
        std::string base = cwd_, dir = chance(50) ? s(d) : dirarg(base), flags = any(r_, fl);
        std::string p = flags == "EMPTY" && chance(70) ? "''" : spell(read_target(), base);
        return "statx " + dir + " " + p + " " + flags + " " + any(r_, masks);
      }
      case 30: {
        uint64_t len = chance(50) ? std::min<uint64_t>(size + 100, 4 * MiB) : length(size);
        int64_t off = chance(70) ? int64_t(4096 * pick(size / 4096 + 2)) : offset(size);
        return "mmap " + s(d) + " " + num(int64_t(len)) + " " + num(off) + " " +
               (chance(80) ? "PRIVATE" : "SHARED");
      }
      case 31:  // (no locks: see kNotCompared)
        return "getfd " + s(d);
      case 32:
        return "fdlink " + s(d);
      case 33:
        return "getfl " + s(d);
      case 34:
        return "getfd " + s(d);
      case 35: {
        // DIRECT only while no stream is open: it might be the stream's (kNotCompared).
        static const char* fl[] = {"NONBLOCK", "APPEND", "0", "DIRECT", "NOATIME", "NONBLOCK"};
        std::string f = any(r_, fl);
        bool streams = false;
        for (bool open : stream_) streams |= open;
        if (streams && f == "DIRECT") f = "NONBLOCK";
        direct_ |= f == "DIRECT";
        return "setfl " + s(d) + " " + f;
      }
      case 36:
        return "setfd " + s(d) + " " + (chance(50) ? "CLOEXEC" : "0");
      case 37:
        return "fdlink " + s(d);
      case 38: {
        static const char* links[] = {"ds/linkdir",       "ds/alink.bin", "ds/sublink",
                                      "ds/uplink.bin",    "ds/dangling",  "ds/a.bin",
                                      "ds/sub/deeper/up", "out/inlink"};
        return "readlink " + path(any(r_, links));
      }
      case 39:
        return "listdir " + path(dir_target());
      case 40:
      case 41: {
        std::string out = "<T>/out/w/" + num(k_) + "/c" + num(int64_t(pick(3)));
        std::string off = chance(50) ? "-" : num(offset(size));
        return std::string(which == 40 ? "sendfile " : "cfr ") + s(d) + " " + out + " " +
               num(int64_t(length(size))) + " " + off;
      }
      case 42:
        return "write " + s(slot_where(&Slot::writable)) + " " + num(int64_t(pick(20000)));
      case 43:
        return "pwrite " + s(slot_where(&Slot::writable)) + " " + num(int64_t(pick(20000))) + " " +
               num(offset(20000));
      case 44:
        return "ftruncate " + s(slot_where(&Slot::writable)) + " " + num(int64_t(pick(100000)));
      case 45:
        return "truncate " + wpath(write_target()) + " " + num(int64_t(pick(100000)));
      case 46:  // names moved under an open descriptor: see kNotCompared
        if (w_open()) return "truncate " + wpath(write_target()) + " " + num(int64_t(pick(100000)));
        return "unlink " + wpath(write_target());
      case 47:
        if (w_open()) return "stat " + wpath(write_target());
        return "rename " + wpath(write_target()) + " " + wpath(write_target());
      case 48:
        return "mkdir " + wpath(with_k("ds/w/K/m" + num(int64_t(pick(2)))));
      case 49:
        return "nofile " + num(1 + int64_t(pick(3))) + " " + path(read_target());
      case 51: {
        // Opened for reading and writing as SQLite and LMDB open (closed on
        // exec): served until it writes; later ops read, write and read back.
        int sl = free_slot();
        std::string target = write_target();
        std::string flags = std::string("RDWR|CLOEXEC") + (chance(30) ? "|APPEND" : "");
        bool creat = chance(40);
        slot_[sl] = {target, false, true};
        return "open " + s(sl) + " " + wpath(target) + " " + flags + (creat ? "|CREAT 0644" : "");
      }
      case 52: {
        // A shared file opened for reading and writing, read and closed in
        // one op: never written (shared files stay as they are).
        std::string t = kReadTargets[pick(kPlain)];
        uint64_t size = size_hint(t);
        return "rwread " + path(t) + " " + num(int64_t(length(size))) + " " + num(offset(size)) +
               (chance(50) ? " CREAT" : " -");
      }
      default:
        return "fsize " + num(1 + int64_t(pick(5000))) + " " + path(read_target());
    }
  }

  // Has a file of the sequence's own area (ds/w/K, out/w/K) been opened in a
  // slot or a stream? Its names then stay put for the rest of the sequence:
  // sticky, because the generator's belief of what a slot holds can be wrong
  // (a dup3 onto it, a failed close) and a minimized list drops ops.
  bool w_open() {
    for (const Slot& sl : slot_) w_opened_ |= sl.target.find("/w/") != std::string::npos;
    for (int i = 0; i < kStreams; ++i) w_opened_ |= stream_[i] && stream_w_[i];
    return w_opened_;
  }

  int k_;
  std::mt19937_64 r_;
  std::string cwd_;
  Slot slot_[kSlots];
  bool stream_[kStreams] = {};    // the generator believes the stream is open
  bool direct_ = false;           // DIRECT was set on some descriptor
  bool detached_[kStreams] = {};  // its descriptor may have been closed or replaced
  // Raw descriptor numbers were closed or replaced: an open stream's may be
  // among them, and stdio would read whatever that number names now with
  // glibc's internal read(), which no LD_PRELOAD library sees (kNotCompared).
  void detach_streams() {
    for (int i = 0; i < kStreams; ++i) detached_[i] |= stream_[i];
  }
  bool stream_w_[kStreams] = {};  // on a file of the sequence's own area
  bool w_opened_ = false;
};

std::vector<std::string> generate(uint64_t seed, int k) {
  return Gen(seed, k).run();
}

// ---- raw system calls: what the kernel says, unseen by Monarch ----

long raw_fstat(int fd, struct stat* st) {
  return syscall(SYS_fstat, fd, st);
}
long raw_statx(int dirfd, const char* p, int flags, struct statx* sx) {
  return syscall(SYS_statx, dirfd, p, flags, STATX_BASIC_STATS | STATX_BTIME, sx);
}
int64_t raw_tell(int fd) {
  return syscall(SYS_lseek, fd, 0, SEEK_CUR);
}
long raw_close(int fd) {
  return syscall(SYS_close, fd);
}

void emit(const std::string& line) {
  const char* p = line.data();
  size_t n = line.size();
  while (n) {
    ssize_t w = syscall(SYS_write, 1, p, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      _exit(3);
    }
    p += w;
    n -= size_t(w);
  }
}

// ---- the executor ----

// What a file was at the sequence's start (or at its creation).
struct Start {
  timespec mtime, ctime, btime;
  bool has_btime;
  uint64_t blocks;  // ext4 gives equal files unequal counts (an extent block): printed as a change
};
struct Rec {
  std::string name;
  Start t;
};

std::string g_tree;                         // absolute, as given
std::string g_tree_real;                    // realpath
dev_t g_dev;                                // the tree's device
std::unordered_map<uint64_t, Rec> g_names;  // inode -> what it was at the sequence's start
char* g_buf;

Start start_of(const struct statx& sx) {
  Start t{};
  t.blocks = sx.stx_blocks;
  t.mtime = {sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec};
  t.ctime = {sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec};
  t.btime = {sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec};
  t.has_btime = sx.stx_mask & STATX_BTIME;
  return t;
}

// Records every entry under the tree-relative directory `rel` (links not
// followed); `skip` names directories whose contents are left out.
void walk(const std::string& rel, const std::set<std::string>& skip) {
  std::string abs = rel.empty() ? g_tree : g_tree + "/" + rel;
  int fd = int(
      syscall(SYS_openat, AT_FDCWD, abs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (fd < 0) return;
  std::vector<std::string> dirs;
  char buf[16384];
  while (true) {
    long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      auto* d = reinterpret_cast<struct dirent64*>(buf + at);
      at += d->d_reclen;
      std::string name = d->d_name;
      if (name == "." || name == "..") continue;
      struct statx sx;
      if (raw_statx(fd, name.c_str(), AT_SYMLINK_NOFOLLOW, &sx) != 0) continue;
      std::string r = rel.empty() ? name : rel + "/" + name;
      g_names[sx.stx_ino] = {r, start_of(sx)};
      if (S_ISDIR(sx.stx_mode) && !skip.count(r)) dirs.push_back(r);
    }
  }
  raw_close(fd);
  for (const std::string& d : dirs) walk(d, skip);
}

std::string norm(std::string s) {
  for (const std::string* t : {&g_tree_real, &g_tree}) {
    if (t->empty()) continue;
    for (size_t at; (at = s.find(*t)) != std::string::npos;) s.replace(at, t->size(), "<T>");
  }
  // Kernel object numbers ("pipe:[1234]") differ between runs.
  size_t b = s.find(":[");
  if (b != std::string::npos && s.back() == ']') s = s.substr(0, b) + ":[]";
  return s;
}

// An inode on the tree's device that the tree never held is above the tree
// (a relative path with more ".." than the believed current directory has):
// a directory other programs change (the work directory, /tmp).
bool outside_tree(dev_t dev, uint64_t ino) {
  return dev == g_dev && !g_names.count(ino);
}

std::string ino_name(dev_t dev, uint64_t ino) {
  if (dev != g_dev) return "other";
  auto it = g_names.find(ino);
  return it == g_names.end() ? "outside" : it->second.name;
}

const Start* start_times(dev_t dev, uint64_t ino) {
  if (dev != g_dev) return nullptr;
  auto it = g_names.find(ino);
  return it == g_names.end() ? nullptr : &it->second.t;
}

std::string rel_blocks(const Start* t, uint64_t now) {
  return t && t->blocks == now ? "=" : std::to_string(now);
}

std::string rel_time(const Start* t, const timespec& now, const timespec Start::*which) {
  if (!t) return "-";
  const timespec& was = t->*which;
  return was.tv_sec == now.tv_sec && was.tv_nsec == now.tv_nsec ? "=" : "changed";
}

std::string fmt_stat(const struct stat& st) {
  if (outside_tree(st.st_dev, st.st_ino))
    return "type=" + std::to_string(st.st_mode >> 12) + " outside";
  char b[256];
  snprintf(b, sizeof b, "mode=%o nlink=%lu uid=%u gid=%u size=%lld blksize=%ld rdev=%lu",
           st.st_mode, (unsigned long)st.st_nlink, st.st_uid, st.st_gid, (long long)st.st_size,
           (long)st.st_blksize, (unsigned long)st.st_rdev);
  const Start* t = start_times(st.st_dev, st.st_ino);
  return std::string(b) + " blocks=" + rel_blocks(t, uint64_t(st.st_blocks)) +
         " ino=" + ino_name(st.st_dev, st.st_ino) +
         " dev=" + (st.st_dev == g_dev ? "tree" : "other") +
         " mtime=" + rel_time(t, st.st_mtim, &Start::mtime) +
         " ctime=" + rel_time(t, st.st_ctim, &Start::ctime);
}

std::string fmt_stat64(const struct stat64& s) {
  struct stat st {};
  st.st_mode = s.st_mode;
  st.st_nlink = s.st_nlink;
  st.st_uid = s.st_uid;
  st.st_gid = s.st_gid;
  st.st_size = s.st_size;
  st.st_blocks = s.st_blocks;
  st.st_blksize = s.st_blksize;
  st.st_rdev = s.st_rdev;
  st.st_dev = s.st_dev;
  st.st_ino = s.st_ino;
  st.st_mtim = s.st_mtim;
  st.st_ctim = s.st_ctim;
  return fmt_stat(st);
}

std::string fmt_statx(const struct statx& sx) {
  dev_t dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  if (outside_tree(dev, sx.stx_ino))
    return "type=" + std::to_string(sx.stx_mode >> 12) + " outside";
  char b[320];
  snprintf(b, sizeof b,
           "mask=%x mode=%o nlink=%u uid=%u gid=%u size=%llu blksize=%u attr=%llx/%llx",
           sx.stx_mask, sx.stx_mode, sx.stx_nlink, sx.stx_uid, sx.stx_gid,
           (unsigned long long)sx.stx_size, sx.stx_blksize, (unsigned long long)sx.stx_attributes,
           (unsigned long long)sx.stx_attributes_mask);
  const Start* t = start_times(dev, sx.stx_ino);
  std::string out = std::string(b) + " blocks=" + rel_blocks(t, sx.stx_blocks) +
                    " ino=" + ino_name(dev, sx.stx_ino) +
                    " dev=" + (dev == g_dev ? "tree" : "other");
  if (sx.stx_mask & STATX_MTIME)
    out += " mtime=" + rel_time(t, {sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec}, &Start::mtime);
  if (sx.stx_mask & STATX_CTIME)
    out += " ctime=" + rel_time(t, {sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec}, &Start::ctime);
  if (sx.stx_mask & STATX_BTIME)
    out += " btime=" + (t && t->has_btime ? rel_time(t, {sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec},
                                                     &Start::btime)
                                          : std::string("-"));
  return out;
}

int parse_flags(const std::string& text) {
  static const std::pair<const char*, int> kNames[] = {{"RDONLY", O_RDONLY},
                                                       {"WRONLY", O_WRONLY},
                                                       {"RDWR", O_RDWR},
                                                       {"CREAT", O_CREAT},
                                                       {"TRUNC", O_TRUNC},
                                                       {"APPEND", O_APPEND},
                                                       {"CLOEXEC", O_CLOEXEC},
                                                       {"NONBLOCK", O_NONBLOCK},
                                                       {"NOFOLLOW", O_NOFOLLOW},
                                                       {"DIRECTORY", O_DIRECTORY},
                                                       {"DIRECT", O_DIRECT},
                                                       {"NOATIME", O_NOATIME},
                                                       {"0", 0}};
  int flags = 0;
  for (const std::string& f : split(text, "|")) {
    bool found = false;
    for (auto& [name, bit] : kNames)
      if (f == name) flags |= bit, found = true;
    if (!found) die("unknown flag " + f);
  }
  return flags;
}

// The state of one sequence's process.
class Seq {
 public:
  explicit Seq(int k) : k_(k) {
    std::fill(fd_, fd_ + kSlots, -1);
    std::fill(f_, f_ + kStreams, nullptr);
  }

  void run_op(const std::string& label, const std::string& text) {
    std::vector<std::string> t = split(text, " ");
    std::string res = dispatch(t, text, label);
    emit(label + " " + text + " => " + res + "\n");
  }

  // Every descriptor open now (found with raw calls, so that one Monarch
  // keeps for itself shows), its flags and offset as the kernel has them,
  // and what it is as the program sees it (fstat through libc: a descriptor
  // of a local copy is by design the copy for the kernel).
  std::string dump() {
    std::string out;
    for (int fd = 0; fd < kProbeFds; ++fd) {
      long fdfl = syscall(SYS_fcntl, fd, F_GETFD);
      if (fdfl < 0) continue;
      struct stat st;
      bool ok = fstat(fd, &st) == 0;
      if (fd <= 2 && !(ok && st.st_dev == g_dev && g_names.count(st.st_ino))) {  // our stdio
        out += " " + std::to_string(fd) + ":std";
        continue;
      }
      long fl = syscall(SYS_fcntl, fd, F_GETFL);
      int64_t off = raw_tell(fd);
      char b[96];
      snprintf(b, sizeof b, ",fd=%ld,fl=%lx,off=%lld", fdfl, fl, (long long)off);
      out += " " + std::to_string(fd) + ":" + (ok ? ino_name(st.st_dev, st.st_ino) : "?") + b;
    }
    return out;
  }

 private:
  int slot(const std::string& t) {
    if (t.size() < 2 || t[0] != 's') die("bad slot " + t);
    int i = std::stoi(t.substr(1));
    if (i < 0 || i >= kSlots) die("bad slot " + t);
    return i;
  }
  int stream(const std::string& t) {
    int i = t.size() >= 2 && t[0] == 'f' ? std::stoi(t.substr(1)) : -1;
    if (i < 0 || i >= kStreams) die("bad stream " + t);
    return i;
  }
  int fd(const std::string& t) { return fd_[slot(t)]; }
  // "@cwd", "sN" or a number.
  int dirfd(const std::string& t) {
    if (t == "@cwd") return AT_FDCWD;
    if (t[0] == 's') return fd(t);
    return std::stoi(t);
  }
  std::string path(const std::string& t) {
    if (t == "''") return "";
    if (t.rfind("<T>", 0) == 0) return g_tree + t.substr(3);
    return t;
  }
  int64_t num(const std::string& t) { return std::stoll(t); }

  // The result of a call and its errno. Callers read errno in a statement
  // after the call: the order in which arguments are evaluated is unspecified.
  static std::string ret(long r, int e) {
    return r < 0 ? std::to_string(r) + " " + errname(e) : std::to_string(r);
  }
  std::string off(int fd) {
    int64_t o = raw_tell(fd);
    return " off=" + (o < 0 ? errname(errno) : std::to_string(o));
  }
  std::string data(const char* p, long n) {
    return n > 0 ? " hash=" + hex(hash_bytes(p, size_t(n))) : "";
  }

  void opened(int fd) {
    if (fd >= 0) known_.insert(fd);
  }
  // A file the call may create at `p`: if it did, its inode is named by the
  // op's own spelling of the path from now on (two trees run the same ops).
  struct Creation {
    int dirfd;
    std::string path, token;
    bool existed;
  };
  Creation before_create(const std::string& p, const std::string& token, int dirfd = AT_FDCWD) {
    struct stat st;
    long r = syscall(SYS_newfstatat, dirfd, p.c_str(), &st, AT_SYMLINK_NOFOLLOW);
    return {dirfd, p, token, r == 0};
  }
  void after_create(const Creation& c) {
    struct statx sx;
    if (c.existed || raw_statx(c.dirfd, c.path.c_str(), AT_SYMLINK_NOFOLLOW, &sx) != 0) return;
    g_names[sx.stx_ino] = {"new:" + c.token, start_of(sx)};
  }

  std::string do_open(const std::vector<std::string>& t) {
    const std::string& kind = t[0];
    int s = slot(t[1]);
    size_t at = 2;
    int dir = kind == "openat" ? dirfd(t[at++]) : AT_FDCWD;
    std::string p = path(t[at]);
    int flags = parse_flags(t[at + 1]);
    mode_t mode = t.size() > at + 2 ? mode_t(std::stoul(t[at + 2], nullptr, 8)) : 0;
    Creation c = before_create(p, t[at], dir);
    int r;
    if (kind == "open")
      r = open(p.c_str(), flags, mode);
    else if (kind == "open64")
      r = open64(p.c_str(), flags, mode);
    else if (kind == "open2")
      r = __open_2(p.c_str(), flags);
    else
      r = openat(dir, p.c_str(), flags, mode);
    int e = errno;
    if (flags & O_CREAT) after_create(c);
    fd_[s] = r;
    opened(r);
    return ret(r, e);
  }

  std::string do_fopen(const std::vector<std::string>& t, bool re) {
    int s = stream(t[1]);
    std::string p = path(t[2]);
    Creation c = before_create(p, t[2]);
    FILE* f;
    if (re) {
      if (!f_[s]) return "skip";
      int old = fileno(f_[s]);
      f = freopen(p.c_str(), t[3].c_str(), f_[s]);
      known_.erase(old);
    } else {
      f = fopen(p.c_str(), t[3].c_str());
    }
    int e = errno;
    after_create(c);
    f_[s] = f;
    if (!f) return "NULL " + errname(e);
    opened(fileno(f));
    return "fd=" + std::to_string(fileno(f));
  }

  std::string do_fread(const std::vector<std::string>& t) {
    FILE* f = f_[stream(t[1])];
    if (!f) return "skip";
    size_t n = size_t(num(t[2]));
    size_t r = fread(g_buf, 1, n, f);
    int e = errno;
    std::string out = std::to_string(r) + data(g_buf, long(r)) +
                      " eof=" + std::to_string(feof(f) != 0) +
                      " err=" + std::to_string(ferror(f) != 0);
    if (ferror(f)) out += " " + errname(e);
    return out + " tell=" + std::to_string(ftell(f)) + off(fileno(f));
  }

  std::string do_read(const std::vector<std::string>& t) {
    const std::string& kind = t[0];
    int d = fd(t[1]);
    long r;
    if (kind == "read" || kind == "pread" || kind == "pread64") {
      size_t n = size_t(num(t[2]));
      if (kind == "read")
        r = read(d, g_buf, n);
      else if (kind == "pread")
        r = pread(d, g_buf, n, off_t(num(t[3])));
      else
        r = pread64(d, g_buf, n, off64_t(num(t[3])));
    } else {
      std::vector<iovec> iov;
      size_t at = 0;
      for (const std::string& l : split(t[2], ",")) {
        size_t n = size_t(std::stoll(l));
        iov.push_back({g_buf + at, n});
        at += n;
      }
      if (kind == "readv")
        r = readv(d, iov.data(), int(iov.size()));
      else if (kind == "preadv")
        r = preadv(d, iov.data(), int(iov.size()), off_t(num(t[3])));
      else
        r = preadv2(d, iov.data(), int(iov.size()), off_t(num(t[3])), 0);
    }
    int e = errno;
    return ret(r, e) + data(g_buf, r) + off(d);
  }

  std::string do_lseek(const std::vector<std::string>& t) {
    int d = fd(t[1]);
    static const std::pair<const char*, int> kWhence[] = {{"SET", SEEK_SET},   {"CUR", SEEK_CUR},
                                                          {"END", SEEK_END},   {"DATA", SEEK_DATA},
                                                          {"HOLE", SEEK_HOLE}, {"BAD", 7}};
    int w = -1;
    for (auto& [n, v] : kWhence)
      if (t[3] == n) w = v;
    long r = t[0] == "lseek" ? lseek(d, off_t(num(t[2])), w) : lseek64(d, num(t[2]), w);
    int e = errno;
    return ret(r, e) + off(d);
  }

  std::string do_dup(const std::vector<std::string>& t) {
    const std::string& kind = t[0];
    int d = fd(t[1]);
    int r;
    std::string to_slot;
    if (kind == "dup") {
      r = dup(d);
      to_slot = t[2];
    } else if (kind == "dupfd" || kind == "dupfd_cloexec") {
      r = fcntl(d, kind == "dupfd" ? F_DUPFD : F_DUPFD_CLOEXEC, int(num(t[2])));
      to_slot = t[3];
    } else {
      int target = t[2][0] == '=' ? fd(t[2].substr(1)) : int(num(t[2]));
      if (kind == "dup2") {
        r = dup2(d, target);
        to_slot = t[3];
      } else {
        r = dup3(d, target, t[3] == "CLOEXEC" ? O_CLOEXEC : 0);
        to_slot = t[4];
      }
    }
    int e = errno;
    if (r >= 0) fd_[slot(to_slot)] = r;
    opened(r);
    return ret(r, e);
  }

  std::string do_close(const std::vector<std::string>& t) {
    const std::string& kind = t[0];
    long r = 0;
    if (kind == "close") {
      int d = fd(t[1]);
      r = close(d);
      known_.erase(d);
    } else if (kind == "closefrom") {
      int low = int(num(t[1]));
      closefrom(low);
      known_.erase(known_.lower_bound(low), known_.end());
      return "void";
    } else {
      unsigned a = unsigned(num(t[1])), b = unsigned(num(t[2]));
      int flags = t[3] == "CLOEXEC"   ? CLOSE_RANGE_CLOEXEC
                  : t[3] == "UNSHARE" ? CLOSE_RANGE_UNSHARE
                                      : 0;
      r = close_range(a, b, flags);
      if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC))
        known_.erase(known_.lower_bound(int(a)),
                     b >= INT_MAX ? known_.end() : known_.upper_bound(int(b)));
    }
    return ret(r, errno);
  }

  std::string do_fclose(const std::vector<std::string>& t) {
    int s = stream(t[1]);
    if (!f_[s]) return "skip";
    known_.erase(fileno(f_[s]));
    int r = fclose(f_[s]);
    f_[s] = nullptr;
    return ret(r, errno);
  }

  std::string do_fseek(const std::vector<std::string>& t) {
    FILE* f = f_[stream(t[1])];
    if (!f) return "skip";
    int r = fseek(f, long(num(t[2])), t[3] == "SET" ? SEEK_SET : SEEK_CUR);
    int e = errno;
    return ret(r, e) + " tell=" + std::to_string(ftell(f)) + off(fileno(f));
  }

  static std::string status(int st) {
    if (WIFSIGNALED(st)) return "signal " + signame(WTERMSIG(st));
    return "exit " + std::to_string(WEXITSTATUS(st));
  }

  std::string do_fork(const std::string& text, const std::string& label) {
    std::vector<std::string> subs = split(text.substr(5), " ; ");
    pid_t pid = fork();
    if (pid == 0) {
      alarm(30);
      for (size_t j = 0; j < subs.size(); ++j) run_op(label + "/" + std::to_string(j), subs[j]);
      _exit(0);
    }
    if (pid < 0) return ret(-1, errno);
    int st;
    waitpid(pid, &st, 0);
    return "child " + status(st);
  }

  // Spawns as CPython's _posixsubprocess does (3.10 and later): vfork(); in
  // the child, dup2 onto stdin or stdout, chdir, close every descriptor from
  // 3 (close_range, or closefrom), then execve, all through libc, so that
  // the library's wrappers run in the child while it shares our memory.
  __attribute__((noinline)) static pid_t spawn_like_python(int fd, int target, const char* cwd,
                                                           int close_mode, const char* prog,
                                                           char* const* argv) {
    pid_t pid = vfork();
    if (pid != 0) return pid;
    if (fd != target && dup2(fd, target) < 0) _exit(125);
    if (cwd && chdir(cwd) != 0) _exit(126);
    if (close_mode == 1) close_range(3, ~0U, 0);
    if (close_mode == 2) closefrom(3);
    if (prog) execve(prog, argv, environ);
    _exit(prog ? 127 : 0);
  }

  std::string do_spawn(const std::vector<std::string>& t, const std::string& label) {
    std::string cwd = t[1] == "-" ? "" : path(t[1]);
    int close_mode = t[2] == "close_range" ? 1 : t[2] == "closefrom" ? 2 : 0;
    int d = fd(t[3]), target = int(num(t[4]));
    std::string prog = t[5] == "true"     ? "/bin/true"
                       : t[5] == "reader" ? "/proc/self/exe"
                                          : "";  // even if rebuilt meanwhile
    std::string n = t.size() > 6 ? t[6] : "0", what = "child-read", lab = label + "/spawn";
    char* argv[] = {prog.data(), what.data(), lab.data(), n.data(), nullptr};
    char* targv[] = {prog.data(), nullptr};
    pid_t pid =
        spawn_like_python(d, target, cwd.empty() ? nullptr : cwd.c_str(), close_mode,
                          prog.empty() ? nullptr : prog.c_str(), t[5] == "reader" ? argv : targv);
    if (pid < 0) return ret(-1, errno);
    int st;
    waitpid(pid, &st, 0);
    return "child " + status(st);
  }

  // posix_spawn with file actions: glibc runs them with its internal calls.
  std::string do_pspawn(const std::vector<std::string>& t) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    int d = fd(t[3]), target = int(num(t[4]));
    if (d >= 0) posix_spawn_file_actions_adddup2(&fa, d, target);
    std::string cwd = t[1] == "-" ? "" : path(t[1]);
    if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
    if (t[2] == "closefrom") posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    char prog[] = "/bin/true";
    char* argv[] = {prog, nullptr};
    pid_t pid;
    int r = posix_spawn(&pid, prog, &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0) return "error " + errname(r);
    int st;
    waitpid(pid, &st, 0);
    return "child " + status(st);
  }

  std::string do_stat(const std::vector<std::string>& t) {
    const std::string& kind = t[0];
    long r;
    if (kind == "stat64" || kind == "lstat64" || kind == "fstat64") {
      struct stat64 st;
      if (kind == "fstat64")
        r = fstat64(fd(t[1]), &st);
      else
        r = kind == "stat64" ? stat64(path(t[1]).c_str(), &st) : lstat64(path(t[1]).c_str(), &st);
      int e = errno;
      return r == 0 ? "0 " + fmt_stat64(st) : ret(r, e);
    }
    struct stat st;
    if (kind == "stat") {
      r = stat(path(t[1]).c_str(), &st);
    } else if (kind == "lstat") {
      r = lstat(path(t[1]).c_str(), &st);
    } else if (kind == "fstat") {
      r = fstat(fd(t[1]), &st);
    } else {
      int flags = t[3] == "NOFOLLOW" ? AT_SYMLINK_NOFOLLOW : t[3] == "EMPTY" ? AT_EMPTY_PATH : 0;
      r = fstatat(dirfd(t[1]), path(t[2]).c_str(), &st, flags);
    }
    int e = errno;
    return r == 0 ? "0 " + fmt_stat(st) : ret(r, e);
  }

  std::string do_statx(const std::vector<std::string>& t) {
    int flags = t[3] == "NOFOLLOW" ? AT_SYMLINK_NOFOLLOW
                : t[3] == "EMPTY"  ? AT_EMPTY_PATH
                : t[3] == "SYNC"   ? AT_STATX_FORCE_SYNC
                                   : 0;
    unsigned mask = t[4] == "basic"   ? STATX_BASIC_STATS
                    : t[4] == "btime" ? STATX_BASIC_STATS | STATX_BTIME
                                      : STATX_ALL;
    struct statx sx;
    memset(&sx, 0, sizeof sx);
    int r = statx(dirfd(t[1]), path(t[2]).c_str(), flags, mask, &sx);
    int e = errno;
    return r == 0 ? "0 " + fmt_statx(sx) : ret(r, e);
  }

  // Maps, hashes the mapped bytes up to the end of the page holding EOF
  // (never further: a SIGBUS is Monarch's making), unmaps.
  std::string do_mmap(const std::vector<std::string>& t) {
    int d = fd(t[1]);
    size_t len = size_t(num(t[2]));
    off_t at = off_t(num(t[3]));
    void* p = mmap(nullptr, len, PROT_READ, t[4] == "SHARED" ? MAP_SHARED : MAP_PRIVATE, d, at);
    if (p == MAP_FAILED) return ret(-1, errno);
    struct stat st;  // the size the program sees, as a program would ask
    long page = sysconf(_SC_PAGESIZE);
    int64_t size = fstat(d, &st) == 0 ? st.st_size : 0;
    int64_t valid = std::max<int64_t>(0, (size - at + page - 1) / page * page);
    size_t n = size_t(std::min<int64_t>(int64_t(len), valid));
    std::string out = "ok n=" + std::to_string(n) + " hash=" + hex(hash_bytes(p, n));
    int r = munmap(p, len);
    return out + " munmap=" + ret(r, errno);
  }

  std::string do_lock(const std::vector<std::string>& t) {
    int d = fd(t[1]);
    if (t[0] == "flock") {
      int op = t[2] == "EX" ? LOCK_EX | LOCK_NB : t[2] == "SH" ? LOCK_SH | LOCK_NB : LOCK_UN;
      int r = flock(d, op);
      return ret(r, errno);
    }
    struct flock l {};
    l.l_type = short(t[2] == "RD" ? F_RDLCK : t[2] == "WR" ? F_WRLCK : F_UNLCK);
    l.l_whence = SEEK_SET;
    if (t[0] == "setlk") {
      l.l_start = num(t[3]);
      l.l_len = num(t[4]);
      int r = fcntl(d, F_SETLK, &l);
      return ret(r, errno);
    }
    int r = fcntl(d, F_GETLK, &l);  // getlk: who holds a conflicting lock
    if (r < 0) return ret(r, errno);
    std::string who = l.l_type == F_UNLCK ? "" : l.l_pid == getppid() ? " by=parent" : " by=other";
    return "0 type=" + std::to_string(l.l_type) + who;
  }

  std::string do_fcntl(const std::vector<std::string>& t) {
    int d = fd(t[1]);
    long r;
    if (t[0] == "getfl") {
      r = fcntl(d, F_GETFL);
      if (r >= 0) {
        char b[32];
        snprintf(b, sizeof b, "0x%lx", r);
        return b;
      }
    } else if (t[0] == "getfd") {
      r = fcntl(d, F_GETFD);
    } else if (t[0] == "setfl") {
      r = fcntl(d, F_SETFL, parse_flags(t[2]));
    } else {
      r = fcntl(d, F_SETFD, t[2] == "CLOEXEC" ? FD_CLOEXEC : 0);
    }
    return ret(r, errno);
  }

  std::string do_readlink(const std::vector<std::string>& t) {
    std::string p = t[0] == "fdlink" ? "/proc/self/fd/" + std::to_string(fd(t[1])) : path(t[1]);
    char b[4096];
    ssize_t r = readlink(p.c_str(), b, sizeof b);
    if (r < 0) return ret(r, errno);
    return norm(std::string(b, size_t(r)));  // not r: the length depends on the tree's path
  }

  std::string do_listdir(const std::vector<std::string>& t) {
    DIR* d = opendir(path(t[1]).c_str());
    if (!d) return "NULL " + errname(errno);
    struct stat st;
    if (raw_fstat(::dirfd(d), &st) == 0 && outside_tree(st.st_dev, st.st_ino)) {
      closedir(d);
      return "outside";
    }
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    std::string all;
    for (const std::string& n : names) all += n + "/";
    return std::to_string(names.size()) + " hash=" + hex(hash_str(all));
  }

  // copy_file_range or sendfile from a slot into a fresh file outside the dataset.
  std::string do_transfer(const std::vector<std::string>& t) {
    int d = fd(t[1]);
    std::string out = path(t[2]);
    Creation c = before_create(out, t[2]);
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0) return "cannot open the target " + errname(errno);
    after_create(c);
    size_t len = size_t(num(t[3]));
    bool has_off = t[4] != "-";
    off64_t at = has_off ? num(t[4]) : 0;
    ssize_t r = t[0] == "cfr" ? copy_file_range(d, has_off ? &at : nullptr, o, nullptr, len, 0)
                              : sendfile(o, d, has_off ? &at : nullptr, len);
    int e = errno;
    std::string res = ret(r, e) + (has_off ? " at=" + std::to_string(at) : "") + off(d);
    struct stat st;
    raw_fstat(o, &st);
    std::string copy(size_t(st.st_size), '\0');
    long got = syscall(SYS_pread64, o, copy.data(), copy.size(), 0);
    close(o);
    if (got >= 0) copy.resize(size_t(got));
    return res + " target=" + std::to_string(copy.size()) + data(copy.data(), long(copy.size()));
  }

  std::string do_write(const std::vector<std::string>& t, const std::string& label) {
    int d = fd(t[1]);
    long r;
    if (t[0] == "ftruncate") {
      r = ftruncate(d, off_t(num(t[2])));
    } else {
      std::string bytes;
      fill(bytes, hash_str(label), size_t(num(t[2])));
      r = t[0] == "write" ? write(d, bytes.data(), bytes.size())
                          : pwrite(d, bytes.data(), bytes.size(), off_t(num(t[3])));
    }
    int e = errno;
    return ret(r, e) + off(d);
  }

  std::string do_change(const std::vector<std::string>& t) {
    long r;
    std::string p = path(t[1]);
    if (t[0] == "truncate") {
      r = truncate(p.c_str(), off_t(num(t[2])));
    } else if (t[0] == "unlink") {
      r = unlink(p.c_str());
    } else if (t[0] == "rename") {
      r = rename(p.c_str(), path(t[2]).c_str());
    } else {
      Creation c = before_create(p, t[1]);
      r = mkdir(p.c_str(), 0755);
      after_create(c);
    }
    return ret(r, errno);
  }

  // Lowers RLIMIT_NOFILE to just above the highest descriptor the program
  // holds, opens `path` until EMFILE, closes what it opened, restores.
  std::string do_nofile(const std::vector<std::string>& t) {
    int extra = int(num(t[1]));
    std::string p = path(t[2]);
    int highest = 2;
    for (int fd : known_) highest = std::max(highest, fd);
    struct rlimit old;
    getrlimit(RLIMIT_NOFILE, &old);
    struct rlimit lim = {rlim_t(highest + 1 + extra), old.rlim_max};
    setrlimit(RLIMIT_NOFILE, &lim);
    std::string out;
    std::vector<int> got;
    for (int i = 0; i < extra + 2; ++i) {
      int r = open(p.c_str(), O_RDONLY);
      out += (i ? "," : "") + (r < 0 ? errname(errno) : std::to_string(r));
      if (r >= 0) got.push_back(r);
    }
    for (int fd : got) close(fd);
    setrlimit(RLIMIT_NOFILE, &old);
    return out;
  }

  // Lowers RLIMIT_FSIZE, then opens and reads `path` whole (reading never
  // exceeds a file size limit; only a write could).
  std::string do_fsize(const std::vector<std::string>& t) {
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    struct rlimit lim = {rlim_t(num(t[1])), old.rlim_max};
    setrlimit(RLIMIT_FSIZE, &lim);
    int d = open(path(t[2]).c_str(), O_RDONLY);
    std::string out;
    if (d < 0) {
      out = "open " + errname(errno);
    } else {
      long total = 0, r;
      uint64_t h = 0;
      while ((r = read(d, g_buf, 1 << 20)) > 0) {
        total += r;
        h = h * 31 + hash_bytes(g_buf, size_t(r));
      }
      out = std::to_string(total) + (r < 0 ? " " + errname(errno) : "") + " hash=" + hex(h);
      close(d);
    }
    setrlimit(RLIMIT_FSIZE, &old);
    return out;
  }

  // Opens a file O_RDWR|O_CLOEXEC (|O_CREAT), reads it (pread, then read from
  // the start), shows its size and flags, closes it: what SQLite does with a
  // database it only queries.
  std::string do_rwread(const std::vector<std::string>& t) {
    int flags = O_RDWR | O_CLOEXEC | (t[4] == "CREAT" ? O_CREAT : 0);
    int d = open(path(t[1]).c_str(), flags, 0644);
    if (d < 0) return ret(d, errno);
    long r = pread(d, g_buf, size_t(num(t[2])), off_t(num(t[3])));
    int e = errno;
    std::string out = "pread=" + ret(r, e) + data(g_buf, r);
    r = read(d, g_buf, 5000);
    e = errno;
    out += " read=" + ret(r, e) + data(g_buf, r) + off(d);
    struct stat st;
    r = fstat(d, &st);
    out += " size=" + (r == 0 ? std::to_string(st.st_size) : errname(errno));
    out += " fl=" + std::to_string(fcntl(d, F_GETFL) & ~O_LARGEFILE);
    r = close(d);
    return out + " close=" + ret(r, errno);
  }

  std::string dispatch(const std::vector<std::string>& t, const std::string& text,
                       const std::string& label) {
    const std::string& k = t[0];
    if (k == "open" || k == "open64" || k == "openat" || k == "open2") return do_open(t);
    if (k == "fopen") return do_fopen(t, false);
    if (k == "freopen") return do_fopen(t, true);
    if (k == "fread") return do_fread(t);
    if (k == "fseek") return do_fseek(t);
    if (k == "fclose") return do_fclose(t);
    if (k == "read" || k == "pread" || k == "pread64" || k == "readv" || k == "preadv" ||
        k == "preadv2")
      return do_read(t);
    if (k == "lseek" || k == "lseek64") return do_lseek(t);
    if (k == "dup" || k == "dup2" || k == "dup3" || k == "dupfd" || k == "dupfd_cloexec")
      return do_dup(t);
    if (k == "close" || k == "closefrom" || k == "close_range") return do_close(t);
    if (k == "fork") return do_fork(text, label);
    if (k == "spawn") return do_spawn(t, label);
    if (k == "pspawn") return do_pspawn(t);
    if (k == "chdir") {
      int r = chdir(path(t[1]).c_str());
      return ret(r, errno);
    }
    if (k == "fchdir") {
      int r = fchdir(fd(t[1]));
      return ret(r, errno);
    }
    if (k == "getcwd") {
      char b[PATH_MAX];
      return getcwd(b, sizeof b) ? norm(b) : "NULL " + errname(errno);
    }
    if (k == "stat" || k == "lstat" || k == "fstat" || k == "fstatat" || k == "stat64" ||
        k == "lstat64" || k == "fstat64")
      return do_stat(t);
    if (k == "statx") return do_statx(t);
    if (k == "mmap") return do_mmap(t);
    if (k == "flock" || k == "setlk" || k == "getlk") return do_lock(t);
    if (k == "getfl" || k == "getfd" || k == "setfl" || k == "setfd") return do_fcntl(t);
    if (k == "fdlink" || k == "readlink") return do_readlink(t);
    if (k == "listdir") return do_listdir(t);
    if (k == "cfr" || k == "sendfile") return do_transfer(t);
    if (k == "write" || k == "pwrite" || k == "ftruncate") return do_write(t, label);
    if (k == "truncate" || k == "unlink" || k == "rename" || k == "mkdir") return do_change(t);
    if (k == "nofile") return do_nofile(t);
    if (k == "fsize") return do_fsize(t);
    if (k == "rwread") return do_rwread(t);
    die("unknown op: " + text);
  }

  int k_;
  int fd_[kSlots];
  FILE* f_[kStreams];
  std::set<int> known_;  // descriptors the program believes it holds (for nofile)
};

// Runs sequence k in a forked child; prints its lines and its end.
void run_sequence(int k, const std::vector<std::string>& ops) {
  pid_t pid = fork();
  if (pid < 0) die(std::string("fork: ") + strerror(errno));
  if (pid == 0) {
    alarm(30);
    std::string ks = std::to_string(k);
    walk("ds/w/" + ks, {});
    walk("out/w/" + ks, {});
    for (const char* w : {"ds/w/", "out/w/"}) {  // the area itself
      struct statx sx;
      std::string p = g_tree + "/" + w + ks;
      if (raw_statx(AT_FDCWD, p.c_str(), AT_SYMLINK_NOFOLLOW, &sx) == 0)
        g_names[sx.stx_ino] = {w + ks, start_of(sx)};
    }
    Seq s(k);
    for (size_t i = 0; i < ops.size(); ++i) s.run_op(ks + "." + std::to_string(i), ops[i]);
    emit(ks + ".fds =>" + s.dump() + "\n");
    _exit(0);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  std::string end = WIFSIGNALED(st) ? "signal " + signame(WTERMSIG(st))
                                    : "exit " + std::to_string(WEXITSTATUS(st));
  emit(std::to_string(k) + ".end => " + end + "\n");
}

int cmd_exec(const std::string& tree, uint64_t seed, const std::vector<int>& ids,
             const std::string& ops_file) {
  char real[PATH_MAX];
  if (!realpath(tree.c_str(), real)) die("no tree " + tree);
  g_tree_real = real;
  if (tree[0] == '/') {
    g_tree = tree;
    while (g_tree.size() > 1 && g_tree.back() == '/') g_tree.pop_back();
  } else {
    g_tree = g_tree_real;
  }
  if (g_tree == g_tree_real) g_tree_real.clear();  // one replacement is enough
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);  // SIGXFSZ and SIGBUS would dump core
  g_buf = static_cast<char*>(aligned_alloc(4096, kBufSize));
  memset(g_buf, 0, kBufSize);
  std::vector<std::string> ops;
  if (!ops_file.empty()) {
    std::ifstream in(ops_file);  // closed before any sequence runs
    if (!in) die("cannot read " + ops_file);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) ops.push_back(line);
  }
  if (chdir(g_tree.c_str()) != 0) die("cannot enter " + g_tree);
  struct statx sx;
  if (raw_statx(AT_FDCWD, g_tree.c_str(), 0, &sx) != 0) die("cannot stat " + g_tree);
  g_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  g_names[sx.stx_ino] = {".", start_of(sx)};
  walk("", {"ds/w", "out/w"});
  if (!ops_file.empty()) {
    run_sequence(ids.at(0), ops);
    return 0;
  }
  for (int k : ids) run_sequence(k, generate(seed, k));
  return 0;
}

// What a spawned reader runs: one read of its stdin (the dataset descriptor
// the spawn put there), reported on stdout.
int cmd_child_read(const std::string& label, size_t n) {
  char* buf = static_cast<char*>(malloc(n + 1));
  ssize_t r = read(0, buf, n);
  int e = errno;
  int64_t o = raw_tell(0);
  std::string line = label + " read0 " + std::to_string(n) + " => " +
                     (r < 0 ? std::to_string(r) + " " + errname(e) : std::to_string(r)) +
                     (r > 0 ? " hash=" + hex(hash_bytes(buf, size_t(r))) : "") +
                     " off=" + (o < 0 ? errname(errno) : std::to_string(o)) + "\n";
  emit(line);
  return 0;
}

int usage() {
  fprintf(stderr,
          "usage: monarch-difftest setup TREE --sequences LIST\n"
          "       monarch-difftest gen --seed S --sequence K\n"
          "       monarch-difftest exec TREE (--seed S --sequences LIST | --ops FILE --sequence "
          "K)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string cmd = argv[1], tree, ops_file, list;
  uint64_t seed = 1;
  int sequence = -1;
  std::vector<std::string> rest;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--sequence")
      sequence = std::stoi(value());
    else if (a == "--sequences")
      list = value();
    else if (a == "--ops")
      ops_file = value();
    else
      rest.push_back(a);
  }
  if (cmd == "child-read" && rest.size() == 2) return cmd_child_read(rest[0], std::stoul(rest[1]));
  if (cmd == "gen" && sequence >= 0) {
    for (const std::string& op : generate(seed, sequence)) printf("%s\n", op.c_str());
    return 0;
  }
  if (rest.size() != 1) return usage();
  tree = rest[0];
  if (cmd == "setup" && !list.empty()) return cmd_setup(tree, parse_list(list));
  if (cmd == "exec" && !list.empty() && ops_file.empty())
    return cmd_exec(tree, seed, parse_list(list), "");
  if (cmd == "exec" && !ops_file.empty() && sequence >= 0)
    return cmd_exec(tree, seed, {sequence}, ops_file);
  return usage();
}
