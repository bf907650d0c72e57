// monarch-stager: one per job per node, running as the job's user. Indexes
// the dataset once, publishes the job map, copies files to the node-local
// tiers on request and ahead of the readers, and keeps the statistics.
// Started by monarch-run or the Slurm plugin; stopped with SIGTERM.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <boost/program_options.hpp>

#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "config.h"
#include "copier.h"
#include "hostlist.h"
#include "index.h"
#include "index_wire.h"
#include "jobwide_load.h"
#include "protocol.h"
#include "remove_tree.h"
#include "stats.h"

#ifndef MONARCH_DEFAULT_CONFIG
#define MONARCH_DEFAULT_CONFIG "/etc/monarch/monarch.conf"
#endif

namespace monarch {
namespace {
namespace po = boost::program_options;

struct Options {
  std::string config = MONARCH_DEFAULT_CONFIG;
  bool config_given = false;
  std::string dataset, job, log_level;
  std::vector<std::string> tiers;
  int ready_fd = -1;
  bool exit_with_parent = false;
  bool remove_if_orphaned = false;
  pid_t parent = 0;
  // Multi-node jobs (the Slurm plugin): the job's node list as Slurm writes
  // it, this node's name, the job's port. The job's key comes on a
  // descriptor (--key-fd), never on the command line, which any user sees,
  // nor in an environment, which every process of the job inherits.
  std::string nodes, node, peer_address;
  int key_fd = -1;
};

// The job's key: one line on `fd`, which is closed; "" without one.
std::string read_key(int fd) {
  if (fd < 0) return "";
  char buf[256];
  size_t have = 0;
  for (ssize_t n; have < sizeof buf && (n = read(fd, buf + have, sizeof buf - have)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    have += size_t(n);
  }
  close(fd);
  std::string key(buf, have);
  key = key.substr(0, key.find('\n'));
  explicit_bzero(buf, sizeof buf);
  return key;
}

// A start-up failure: printed, sent on the ready pipe, exit status 2. Bad
// input (configuration, dataset, job key, tiers) is the caller's to fix; a
// fault of the node (a full tier, a failing file system) only means the job
// runs without Monarch, which the ready line says with "unavailable: ".
struct StartError : std::runtime_error {
  enum Cause { kInput, kNode };
  Cause cause;
  explicit StartError(const std::string& what, Cause c = kInput)
      : std::runtime_error(what), cause(c) {}
};

void tell(int fd, const std::string& line) {
  if (fd < 0) return;
  std::string s = line + "\n";
  (void)!write(fd, s.data(), s.size());
}

std::string errno_text() {
  return std::strerror(errno);
}

// Opens (creating if needed) the job's directory on one tier and checks that
// it is private to us: a directory, not a link, owned by us, mode 0700.
int open_job_dir(const TierConfig& tier, const std::string& job) {
  int parent = open(tier.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0)
    throw StartError("tier " + tier.name + ": cannot open " + tier.path + ": " + errno_text() +
                     " (the admin creates each tier directory; see the README)");
  std::string name = "monarch-" + job;
  if (mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
    int e = errno;
    close(parent);
    errno = e;
    throw StartError("tier " + tier.name + ": cannot create " + job_dir(tier, job) + ": " +
                     errno_text());
  }
  int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  close(parent);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    throw StartError("tier " + tier.name + ": cannot open " + job_dir(tier, job) + ": " +
                     errno_text());
  if (st.st_uid != geteuid() || (st.st_mode & 077))
    throw StartError(job_dir(tier, job) + " is not private to this user (owner " +
                     std::to_string(st.st_uid) + ", mode " + std::to_string(st.st_mode & 0777) +
                     "); remove it or use another job key");
  for (const char* sub : {kDataDir, kTmpDir})
    if (mkdirat(fd, sub, 0700) != 0 && errno != EEXIST)
      throw StartError("cannot create " + job_dir(tier, job) + "/" + sub + ": " + errno_text(),
                       StartError::kNode);
  return fd;
}

// True when the directory `fd` has no entry but "." and ".." (false when it
// cannot be read: the caller looks).
bool empty_directory(int fd) {
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  DIR* d = dup_fd >= 0 ? fdopendir(dup_fd) : nullptr;
  if (!d) {
    if (dup_fd >= 0) close(dup_fd);
    return false;
  }
  bool empty = true;
  errno = 0;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  if (errno != 0) empty = false;
  closedir(d);
  return empty;
}

uint64_t random64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = uint64_t(getpid()) << 32 ^ monotonic_ns();
  return v | 1;
}

struct Stager {
  Options opt;
  Config config;
  std::string root;
  std::vector<int> tier_fds;
  std::vector<std::string> tier_dirs;
  std::unique_ptr<Placement> placement;
  // Free space copies leave on the first tier: room for the map of a stager
  // restarted during the job, written before the old map goes.
  std::atomic<uint64_t> keep_free_first{0};
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  MappedMap map;
  IndexStats index_stats;
  std::unique_ptr<JobWide> jobwide;  // null: this node caches on its own
  std::unique_ptr<Copier> copier;
  std::unique_ptr<Stats> stats;
  int sock = -1;
  std::atomic<bool> stop{false};
  // Wakes the receiver and the ticker at once when the stager stops: the end
  // of a job step waits for nothing but the statistics.
  int stop_fd = eventfd(0, EFD_CLOEXEC);
  std::mutex stop_mu;
  std::condition_variable stop_cv;

  void setup_logging() {
    auto level = spdlog::level::from_str(opt.log_level.empty() ? config.log_level : opt.log_level);
    std::vector<spdlog::sink_ptr> sinks;
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    sinks[0]->set_level(std::max(level, spdlog::level::warn));
    try {
      // Only a regular file: not a FIFO or a link left in the job directory.
      struct stat st;
      if (fstatat(tier_fds[0], kLogName, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        unlinkat(tier_fds[0], kLogName, 0);
      sinks.push_back(
          std::make_shared<spdlog::sinks::basic_file_sink_mt>(tier_dirs[0] + "/" + kLogName));
      sinks[1]->set_level(level);
    } catch (const spdlog::spdlog_ex&) {
    }
    auto logger = std::make_shared<spdlog::logger>("monarch-stager", sinks.begin(), sinks.end());
    logger->set_level(level);
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e monarch-stager[%P] %l: %v");
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }

  // Keeps copies an earlier stager of this job made, if they still match.
  // An empty data directory (every job's first stager) holds nothing to
  // keep: skipped, as the scan costs a lookup per file of the dataset and
  // tier (3.4 s for 1.3 M files and 2 tiers here) before the map is published.
  void adopt(JobMap& m) {
    for (int t = 0; t < int(tier_fds.size()); ++t) {
      int data = openat(tier_fds[t], kDataDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (data < 0) continue;
      if (empty_directory(data)) {
        close(data);
        continue;
      }
      for (uint64_t i = 0; i < m.size(); ++i) {
        Entry& e = m.entry(i);
        if (state_of(e.state.load()) == kCached) continue;
        std::string rel(m.path(i));
        struct stat st;
        if (fstatat(data, rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        int64_t mt = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
        if (S_ISREG(st.st_mode) && uint64_t(st.st_size) == e.size && mt == e.mtime_ns) {
          e.state.store(make_state(kCached, t));
          placement->adopt(t, e.size);
          counters[s_adopted]++;
          counters[s_adopted_bytes] += e.size;
        } else {
          unlinkat(data, rel.c_str(), 0);  // made from another version of the file
          counters[s_discarded]++;
        }
      }
      close(data);
    }
  }

  // The lock is held by a stager that has exited (killed: its threads may
  // still be exiting, holding the lock, after its main thread is a zombie):
  // waits for the lock, at most kExitedStagerWaitMs. False when the holder
  // runs, or cannot be told (still indexing), or keeps the lock.
  bool exited_holder_gone(int lock) {
    if (!map_stager_exited(tier_fds[0])) return false;
    for (int waited = 0; waited < kExitedStagerWaitMs; waited += 20) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (flock(lock, LOCK_EX | LOCK_NB) == 0) {
        spdlog::info("the job's previous stager is gone: this one takes over");
        return true;
      }
    }
    return false;
  }

  void start() {
    if (config.tiers.empty())
      throw StartError("no node-local tier: give --tier DIR or a configuration with [tier.NAME]");
    for (const TierConfig& t : config.tiers) {
      tier_fds.push_back(open_job_dir(t, opt.job));
      tier_dirs.push_back(job_dir(t, opt.job));
    }
    setup_logging();

    int lock = openat(tier_fds[0], kLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock < 0)
      throw StartError("cannot open " + tier_dirs[0] + "/" + kLockName + ": " + errno_text(),
                       StartError::kNode);
    if (flock(lock, LOCK_EX | LOCK_NB) != 0 && !exited_holder_gone(lock)) {
      // One stager per job and node: it must serve the same dataset.
      std::string other;
      try {
        other = open_index(tier_dirs[0] + "/" + kIndexName).map().root();
      } catch (const std::runtime_error&) {  // still indexing: cannot tell yet
      }
      if (!other.empty() && other != root)
        throw StartError("job " + opt.job + " already stages " + other +
                         " on this node; a job stages one dataset");
      spdlog::info("a stager already runs for job {}", opt.job);
      tell(opt.ready_fd, "running");
      std::exit(0);
    }
    // The lock is held until exit: the descriptor is never closed.
    int reserve =
        openat(tier_fds[0], kReserveName, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (reserve >= 0) posix_fallocate(reserve, 0, kReserveBytes), close(reserve);

    std::vector<Placement::Tier> tiers;
    for (size_t t = 0; t < config.tiers.size(); ++t) {
      const TierConfig& tc = config.tiers[t];
      struct statvfs vfs;
      if (fstatvfs(tier_fds[t], &vfs) != 0)
        throw StartError("cannot statvfs tier " + tc.path + ": " + errno_text(), StartError::kNode);
      uint64_t quota = tc.quota_bytes
                           ? tc.quota_bytes
                           : uint64_t(double(vfs.f_blocks) * vfs.f_frsize * tc.quota_percent / 100);
      // A job directory on a file system other than its tier's is the job's
      // image, made by the Slurm plugin to the quota's size: all of it is
      // the quota. (A mount point alone is not: in job_space = directory
      // the plugin binds the directory on itself.)
      struct stat dir, parent;
      bool has_dir = fstat(tier_fds[t], &dir) == 0;
      if (has_dir && fstatat(tier_fds[t], "..", &parent, 0) == 0 && dir.st_dev != parent.st_dev)
        quota = uint64_t(vfs.f_blocks) * vfs.f_frsize;
      uint64_t fs = has_dir ? uint64_t(dir.st_dev) + 1 : 0;
      tiers.push_back({quota, vfs.f_frsize, fs});
      // Temporary files of an earlier stager of this job are incomplete copies.
      remove_tree_at(tier_fds[t], kTmpDir);
      mkdirat(tier_fds[t], kTmpDir, 0700);
    }
    placement = std::make_unique<Placement>(
        tiers,
        [this](int t) {
          struct statvfs vfs;
          uint64_t free =
              fstatvfs(tier_fds[t], &vfs) == 0 ? uint64_t(vfs.f_bavail) * vfs.f_frsize : 0;
          uint64_t keep = t == 0 ? keep_free_first.load() : 0;
          return free > keep ? free - keep : 0;
        },
        /*reserve=*/0);

    start_jobwide();

    // The socket first: requests that come while the dataset is indexed wait in it.
    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int rcvbuf = 8 << 20;
    setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    unlinkat(tier_fds[0], kSocketName, 0);
    // Bind by a short name relative to the job directory: tier paths may be
    // longer than sun_path allows.
    int cwd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    sockaddr_un addr{.sun_family = AF_UNIX};
    std::strcpy(addr.sun_path, kSocketName);
    if (fchdir(tier_fds[0]) != 0 || bind(sock, (sockaddr*)&addr, sizeof addr) != 0)
      throw StartError("cannot create " + tier_dirs[0] + "/" + kSocketName + ": " + errno_text(),
                       StartError::kNode);
    if (cwd >= 0) (void)!fchdir(cwd), close(cwd);
  }

  // A multi-node job's nodes as one cache, unless the configuration or
  // something missing says otherwise (one log line why, and the statistics'
  // `alone` unless the configuration said so).
  void start_jobwide() {
    std::string secret = read_key(opt.key_fd);
    if (opt.nodes.empty()) return;
    std::vector<std::string> nodes;
    try {
      nodes = expand_hostlist(opt.nodes);
    } catch (const std::invalid_argument& e) {
      spdlog::warn("caching on this node alone: {}", e.what());
      counters[s_alone] = 1;
      return;
    }
    if (nodes.size() < 2 || !config.job_wide) return;
    if (opt.node.empty()) {  // Slurm's node name is the short host name on most clusters
      char host[256] = "";
      gethostname(host, sizeof host - 1);
      opt.node = std::string(host).substr(0, std::string(host).find('.'));
    }
    auto self = std::find(nodes.begin(), nodes.end(), opt.node);
    std::string why;
    if (secret.size() < 16)
      why = "the job has no key (--key-fd)";
    else if (self == nodes.end())
      why = "this node, '" + opt.node + "', is not in the job's nodes " + opt.nodes;
    if (why.empty()) {
      JobWideOptions o{.nodes = nodes,
                       .self = int(self - nodes.begin()),
                       .port_low = uint16_t(config.peer_port_low),
                       .port_high = uint16_t(config.peer_port_high),
                       .address = opt.peer_address,
                       .key = secret,
                       .timeout_ms = config.peer_timeout_ms,
                       .index_wait_ms = std::max(1u, config.start_timeout_s) * 1000,
                       .stall_ns = uint64_t(config.stall_timeout_ms) * 1'000'000,
                       .wire_dir = tier_fds[0]};
      jobwide = load_jobwide(std::move(o), counters, why);
    }
    if (!jobwide) {
      spdlog::warn("caching on this node alone: {}", why);
      counters[s_alone] = 1;
      return;
    }
    spdlog::info("one cache with the job's {} nodes, on a port of {}-{} the key gives",
                 nodes.size(), config.peer_port_low, config.peer_port_high);
  }

  // The index: in a multi-node job from a node before this one (jobwide.h),
  // or walked here for the job when every node before this one is out;
  // walked here otherwise, or when no node sends it in time.
  MappedMap make_index(const IndexOptions& io, const std::function<void(JobMap&)>& publish) {
    if (jobwide && !jobwide->walks()) {
      std::string why = early_why;
      bool final = early_final;
      std::optional<IndexFile> wire = early_index;
      if (!wire && !final) {
        uint64_t left = std::max(1u, config.start_timeout_s) * 1000ull - kEarlyIndexMs;
        wire = jobwide->fetch_index(left, why, final, &stop);
      }
      if (wire) {
        try {
          return build_index_from(io, wire->fd, wire->size, index_stats, publish);
        } catch (const std::runtime_error& e) {
          why = e.what();
        }
      }
      if (jobwide->walks()) {
        spdlog::warn("walking the dataset for the job: {}", why);
      } else {
        // Files are named by their place in the one index: a node with an
        // index of its own (the dataset may have changed since) leaves the
        // job's cache and caches alone.
        counters[s_index_received] = 0;
        counters[s_alone] = 1;
        spdlog::warn("walking the dataset here, caching on this node alone: {}", why);
        jobwide->stop();
        jobwide.reset();
      }
    }
    return build_index(io, index_stats, publish);
  }

  // A multi-node job's index, asked for before the stager says "ready" (the
  // tasks start then): usually there in milliseconds, it spares the PFS the
  // reads the tasks would make before this node's map exists. Bounded: past
  // kEarlyIndexMs the job starts, and the index is awaited meanwhile.
  static constexpr uint64_t kEarlyIndexMs = 1000;
  std::optional<IndexFile> early_index;
  std::string early_why;
  bool early_final = false;
  void fetch_early_index() {
    if (jobwide && !jobwide->walks())
      early_index = jobwide->fetch_index(kEarlyIndexMs, early_why, early_final, &stop);
  }

  // The index, then the copier and the statistics: after start() has said
  // "ready", while the job already runs (its reads go to the PFS until the map
  // is published). A failure here leaves the job on the PFS.
  void build() {
    IndexOptions io{.root = root,
                    .out_path = tier_dirs[0] + "/" + kIndexName,
                    .tier_dirs = tier_dirs,
                    .consistency = uint32_t(config.consistency == Consistency::kOpen),
                    // A multi-node job's readers never read a file whole
                    // from the PFS to hand it over: another node may be
                    // copying it for the job (its home).
                    .small_file_max = jobwide ? 0 : config.small_file_max,
                    .stall_ns = uint64_t(config.stall_timeout_ms) * 1'000'000,
                    .generation = random64(),
                    .index_rate = config.index_rate,
                    .stop = &stop};
    try {
      map = make_index(io, [this](JobMap& m) {
        adopt(m);
        // Alive from the moment readers can see the map: a reader that opens
        // a file then may wait for its copy.
        m.header().stager_pid = getpid();
        m.header().peer_reads = jobwide ? 1 : 0;
        m.header().heartbeat_ns = monotonic_ns();
      });
    } catch (const std::runtime_error& e) {
      throw StartError(e.what(), StartError::kNode);
    }
    // The stager's own files on the first tier count against its quota (in a
    // job's image of the quota's size they take its room), and copies leave
    // room for a restarted stager's map.
    // In a multi-node job the index's wire form, served to the other nodes, is
    // one of them (jobwide.h).
    uint64_t map_bytes =
        map.map().header().file_size + (jobwide ? map.map().header().slots_off : 0);
    placement->adopt(0, map_bytes + kReserveBytes);
    keep_free_first = map_bytes + (256 << 10);  // and the file system's own blocks for it
    spdlog::info(
        "indexed {} files, {} in {} directories in {:.3f} s ({} skipped, {} metadata calls); kept "
        "{} copies",
        index_stats.files, human_bytes(double(index_stats.bytes)), index_stats.dirs,
        index_stats.seconds, index_stats.skipped, index_stats.metadata_calls,
        counters[s_adopted].load());

    CopierOptions co{
        .root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC),
        .tier_fds = tier_fds,
        .threads = config.copy_threads,
        .stage_ahead = config.stage_ahead,
        .ahead_window =
            config.stage_ahead_window
                ? config.stage_ahead_window
                : std::max(kMinAheadWindow, uint64_t(double(map.map().header().dataset_bytes) *
                                                     config.stage_ahead_window_percent / 100)),
        .fast_fs_check = !config.copy_fast_dataset,
        .peers = jobwide.get()};
    for (const TierConfig& t : config.tiers) co.block_sizes.push_back(t.block_size);
    copier = std::make_unique<Copier>(map.map(), *placement, co, counters);

    JobInfo info{.job = opt.job,
                 .dataset = root,
                 .consistency = config.consistency == Consistency::kOpen ? "open" : "job",
                 .config_file = config.source,
                 .tier_dirs = tier_dirs,
                 .copy_threads = config.copy_threads,
                 .stage_ahead = config.stage_ahead,
                 .small_file_max = config.small_file_max,
                 .started_unix = time(nullptr)};
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    info.host = host;
    if (passwd* pw = getpwuid(geteuid())) info.user = pw->pw_name;
    for (const TierConfig& t : config.tiers) info.tier_names.push_back(t.name);
    stats = std::make_unique<Stats>(map.map(), counters, *placement, info, index_stats);
  }

  void receive() {
    while (!stop) {
      pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
      if (poll(p, 2, 200) <= 0 || !(p[0].revents & POLLIN)) continue;
      char buf[sizeof(Message)];
      iovec iov{buf, sizeof buf};
      // Room for more descriptors than a request carries: every one that
      // arrives is accounted for (used or closed), whatever a sender put in.
      alignas(cmsghdr) char cbuf[CMSG_SPACE(kMaxReceivedFds * sizeof(int))];
      msghdr mh{
          .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
      ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (n < 0) continue;
      std::vector<int> fds;
      for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          fds.push_back(fd);
        }
      }
      counters[s_requests]++;
      Message m;
      bool ok = decode_message(buf, size_t(n), mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC), fds.size(),
                               map.map().generation(), map.map().size(), bool(jobwide), m);
      if (ok && m.type == Request::kData) {
        copier->data(m.file, fds[0], fds[1]);  // takes both
        continue;
      }
      if (ok && m.type == Request::kPeerRead) {
        jobwide->pass_on(m.file, m.off, m.len, fds[0]);  // takes it
        continue;
      }
      for (int fd : fds) close(fd);
      if (!ok) {
        counters[s_ignored]++;
        continue;
      }
      switch (m.type) {
        case Request::kPlace:
          copier->place(m.file);
          break;
        case Request::kStale:
          copier->stale(m.file);
          break;
        default:  // kRelease
          copier->rescan();
      }
    }
  }

  static constexpr int kMaxReceivedFds = 16;

  // Space kept so that the statistics can still be written once a tier's
  // file system is full (another job may fill it): freed on the first ENOSPC.
  static constexpr const char* kReserveName = "stats.reserve";
  static constexpr off_t kReserveBytes = 1 << 20;

  // Writes the statistics atomically; returns 0 or the errno of the step that failed.
  int try_write_stats(const std::string& text) {
    std::string tmp = std::string(kStatsName) + ".tmp";
    int fd = openat(tier_fds[0], tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                    0600);
    if (fd < 0) return errno;
    int err = 0;
    ssize_t w = write(fd, text.data(), text.size());
    if (w != ssize_t(text.size())) err = w < 0 ? errno : ENOSPC;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && renameat(tier_fds[0], tmp.c_str(), tier_fds[0], kStatsName) != 0) err = errno;
    if (err) unlinkat(tier_fds[0], tmp.c_str(), 0);
    return err;
  }

  void write_stats(bool complete) {
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) == 0) counters[s_peak_memory] = uint64_t(ru.ru_maxrss) << 10;
    std::string text = stats->json(complete, copier->idle() ? copier->fill_seconds() : 0);
    int err = try_write_stats(text);
    if (err && (err == ENOSPC || err == EDQUOT) && unlinkat(tier_fds[0], kReserveName, 0) == 0)
      err = try_write_stats(text);
    if (err) spdlog::warn("cannot write {}/{}: {}", tier_dirs[0], kStatsName, std::strerror(err));
  }

  // The job's first process to use Monarch, once, in the log: a late one
  // explains reads the statistics did not see.
  bool attach_logged = false;
  void log_first_attached() {
    Stats::Attached a = stats->attached();
    if (a.first_pid == 0) return;
    attach_logged = true;
    spdlog::info("the first process of the job to use Monarch: pid {} ({}), {:.1f} s after the map",
                 a.first_pid, a.first_command, a.first_s);
  }

  // Heartbeat and time series every 100 ms, statistics on disk and dead
  // claims every 5 s; epochs as often as Stats::tick asks.
  void tick() {
    constexpr uint64_t kBeat = 100'000'000;
    uint64_t n = 0, beat = monotonic_ns(), wait = kBeat;
    while (!stop) {
      {
        std::unique_lock lock(stop_mu);
        stop_cv.wait_for(lock, std::chrono::nanoseconds(wait), [this] { return stop.load(); });
      }
      uint64_t now = monotonic_ns();
      wait = stats->tick(now);
      if (now - beat < kBeat) {
        wait = std::min(wait, kBeat - (now - beat));
        continue;
      }
      beat = now;
      map.map().header().heartbeat_ns.store(now);
      stats->sample(now);
      if (!attach_logged) log_first_attached();
      if (++n % 50 == 0) {
        write_stats(false);
        copier->reap();
      }
    }
  }

  // Stops the stager's threads (and a walk under way): from the signal thread.
  void request_stop() {
    {
      std::lock_guard lock(stop_mu);
      stop = true;
    }
    stop_cv.notify_all();
    uint64_t one = 1;
    (void)!write(stop_fd, &one, sizeof one);
  }

  int run() {
    sigset_t set = stager_signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // threads inherit the mask
    signal(SIGXFSZ, SIG_IGN);  // a copy above the job's file size limit fails with EFBIG
    // Signals are taken by a thread of their own from the start: a job that
    // ends while its index is still being walked (a dataset of millions of
    // files) stops the walk, instead of waiting for it to end.
    std::atomic<int> sig{0};
    std::thread signals([&] {
      int s = 0;
      sigwait(&set, &s);
      sig = s;
      request_stop();
    });
    struct Joiner {  // every return joins it (one more signal ends a wait still going)
      std::thread& t;
      ~Joiner() {
        if (t.joinable()) pthread_kill(t.native_handle(), SIGTERM), t.join();
      }
    } joiner{signals};

    fetch_early_index();
    tell(opt.ready_fd, "ready");
    try {
      build();
    } catch (const StartError& e) {
      spdlog::error("{}; the job reads from the PFS", e.what());
      tell(opt.ready_fd, std::string("error: unavailable: ") + e.what());
      return 1;
    }
    if (opt.ready_fd >= 0) close(opt.ready_fd);
    if (index_stats.stopped)
      spdlog::info("stopped while walking the dataset: the map holds the {} files found",
                   index_stats.files);
    // Homes need the map; a walk cut short is no index for the job's other
    // nodes (the stop below ends jobwide's service).
    if (jobwide && !index_stats.stopped) jobwide->serving(map.map(), *copier, tier_fds);
    if (!stop) copier->start();
    std::thread receiver([this] { receive(); });
    std::thread ticker([this] { tick(); });
    write_stats(false);
    // From now on the log file says everything: the caller's terminal or pipe
    // is not held (a stager stuck in a hung PFS must not keep a pipe open).
    if (int null = open("/dev/null", O_RDWR | O_CLOEXEC); null >= 0) {
      dup2(null, STDIN_FILENO), dup2(null, STDOUT_FILENO), dup2(null, STDERR_FILENO);
      close(null);
    }

    signals.join();
    spdlog::info("stopping on signal {}", sig.load());
    map.map().header().stopping = 1;
    receiver.join();
    ticker.join();
    if (jobwide) jobwide->stop();  // the job's other nodes read the PFS from now on
    bool joined = copier->stop(uint64_t(config.stop_timeout_s) * 500'000'000);
    stats->tick(monotonic_ns());  // the last epoch's end, if the job ended right on it
    if (!attach_logged) log_first_attached();
    if (!attach_logged)
      spdlog::warn("no process of the job used Monarch on this node: none loaded the job map ({})",
                   kUnusedCauses);
    write_stats(true);
    unlinkat(tier_fds[0], kSocketName, 0);
    spdlog::info("stopped: {} copies, {} handed over by readers", counters[s_copies].load(),
                 counters[s_handoffs].load());
    if (opt.remove_if_orphaned && getppid() != opt.parent) {
      spdlog::info("the parent is gone: removing the job's directories");
      for (const std::string& d : tier_dirs) remove_tree(d);
    }
    if (!joined) {  // threads stuck in the PFS: end without the destructors they would race
      spdlog::default_logger()->flush();
      _exit(0);
    }
    return 0;
  }
};

Options parse_args(int argc, char** argv) {
  Options o;
  po::options_description desc(
      "monarch-stager: stages a dataset to node-local tiers for one job on one node.\n"
      "Usually started by monarch-run or the Slurm plugin. Options");
  desc.add_options()("help,h", "this text")(
      "config", po::value(&o.config), "configuration file (default " MONARCH_DEFAULT_CONFIG ")")(
      "dataset", po::value(&o.dataset)->required(), "the dataset's directory on the PFS")(
      "job", po::value(&o.job)->required(), "job key naming the job's directories")(
      "tier", po::value(&o.tiers)->composing(), "DIR[:QUOTA], replaces the configured tiers")(
      "log-level", po::value(&o.log_level), "trace, debug, info, warn, error, off")(
      "ready-fd", po::value(&o.ready_fd), "descriptor that gets 'ready' or 'error: ...'")(
      "exit-with-parent", po::bool_switch(&o.exit_with_parent), "stop when the parent exits")(
      "remove-if-orphaned", po::bool_switch(&o.remove_if_orphaned),
      "remove the job's directories at exit if the parent is gone (monarch-run killed)")(
      "nodes", po::value(&o.nodes), "a multi-node job's nodes, as SLURM_JOB_NODELIST")(
      "node", po::value(&o.node), "this node's name in --nodes (default: the short host name)")(
      "key-fd", po::value(&o.key_fd), "descriptor to read the job's key from (one line)")(
      "peer-address", po::value(&o.peer_address),
      "the address this stager listens on for the others (default: this node's name "
      "resolved, or all of the node's addresses when it does not resolve)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    std::exit(0);
  }
  po::notify(vm);
  o.config_given = vm.count("config") && !vm["config"].defaulted();
  return o;
}

}  // namespace
}  // namespace monarch

int main(int argc, char** argv) {
  using namespace monarch;
  // First of all: no other process of the user may ptrace the stager (and
  // through it start processes the job's end would not see), nor read its
  // memory; /proc/PID files become root's.
  prctl(PR_SET_DUMPABLE, 0);
  // A write to a connection a peer closed fails with EPIPE, never ends the
  // stager: from here on, so that nothing started before run() (the job-wide
  // cache's threads, UCX's) can write in a window where it still would.
  signal(SIGPIPE, SIG_IGN);
  // Its stop signals wait until run() takes them (a launcher that did not
  // keep them blocked leaves a window only up to here).
  sigset_t stop_signals = stager_signals();
  sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  Options opt;
  try {
    opt = parse_args(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "monarch-stager: " << e.what() << " (see --help)\n";
    return 2;
  }
  opt.parent = getppid();
  if (opt.exit_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != opt.parent) return 0;  // it died before the request took effect
  }
  auto s = std::make_unique<Stager>();
  s->opt = opt;
  try {
    if (!valid_job_key(opt.job))
      throw StartError("--job '" + opt.job + "': use letters, digits, '.', '_' and '-' only");
    // Without an explicit --config, command-line tiers need no configuration file.
    if (!opt.config_given && !opt.tiers.empty() && access(opt.config.c_str(), F_OK) != 0)
      s->config = Config{.source = "(defaults)"};
    else
      s->config = load_config(opt.config);
    override_tiers(s->config, opt.tiers);
    try {
      s->root = check_dataset(opt.dataset, s->config);
    } catch (const ConfigError& e) {
      throw StartError(e.what());
    }
    s->start();
  } catch (const StartError& e) {
    std::cerr << "monarch-stager: " << e.what() << "\n";
    tell(opt.ready_fd,
         std::string(e.cause == StartError::kNode ? "error: unavailable: " : "error: ") + e.what());
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "monarch-stager: " << e.what() << "\n";
    tell(opt.ready_fd, std::string("error: ") + e.what());
    return 2;
  }
  int rc;
  try {
    rc = s->run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    rc = 1;
  }
  // The stager's own state goes (its threads, the map, the job's descriptors);
  // the libraries' exit handlers (UCX's, TBB's) are not run: they only free
  // memory, and on a node whose page cache no longer holds their code they
  // read it from disk while monarch-run waits (5 ms of a job's end, measured).
  s.reset();
  spdlog::default_logger()->flush();
  _exit(rc);
}
