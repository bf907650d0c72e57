// monarch-run: the life cycle of a Monarch job without Slurm. Starts a
// stager, runs the command with the interposition library, stops the stager,
// prints the summary, removes the node-local copies.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
// glibc 2.36 declares these without C linkage for C++.
extern "C" {
#include <sys/pidfd.h>
}

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "config.h"
#include "fd.h"
#include "jobmap.h"
#include "programs.h"
#include "protocol.h"
#include "remove_tree.h"
#include "report.h"
#include "task_env.h"
#include "trash.h"

#ifndef MONARCH_BINDIR
#define MONARCH_BINDIR "/usr/local/bin"
#endif
#ifndef MONARCH_INTERPOSE_PATH
#define MONARCH_INTERPOSE_PATH "/usr/local/lib/monarch/libmonarch_interpose.so"
#endif

namespace monarch {
namespace {
namespace po = boost::program_options;

struct Options {
  std::string dataset, config, report;
  bool config_given = false, keep = false, quiet = false;
  std::vector<std::string> tiers, command;
};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "monarch-run: " << message << "\n";
  std::exit(2);
}

// The run's directory on a tier, held by a descriptor from the moment the
// stager is ready: its deletion goes through it, never by path again, so
// whoever can rename entries in a shared tier cannot point it elsewhere.
struct RunDir {
  Fd parent, dir;
  std::string name;
};

std::vector<RunDir> open_run_dirs(const std::vector<TierConfig>& tiers, const std::string& job) {
  std::vector<RunDir> dirs;
  for (const TierConfig& t : tiers) {
    std::string path = job_dir(t, job), name = path.substr(path.rfind('/') + 1);
    Fd parent(open(t.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    Fd dir(parent
               ? openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
               : -1);
    struct stat st;
    if (dir && fstat(dir.get(), &st) == 0 && st.st_uid == geteuid())
      dirs.push_back({std::move(parent), std::move(dir), name});
  }
  return dirs;
}

// Whether `name` in `parent` is still the directory `dir`.
bool still_named(const RunDir& d, const std::string& name) {
  struct stat a, b;
  return fstat(d.dir.get(), &a) == 0 &&
         fstatat(d.parent.get(), name.c_str(), &b, AT_SYMLINK_NOFOLLOW) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Deletes what is in each directory (bounded whatever the tree: trash.h), then
// the directory, if its name is still its own.
void delete_run_dirs(const std::vector<RunDir>& dirs) {
  for (const RunDir& d : dirs) {
    purge_trash(d.dir.get());
    if (still_named(d, d.name)) unlinkat(d.parent.get(), d.name.c_str(), AT_REMOVEDIR);
  }
}

// Deletes the run's directories off the run's path: each leaves its name in
// one rename (the tier no longer holds it under the run's name), then a child
// of its own session, at the lowest priority, deletes it through its
// descriptor while monarch-run ends: the run's end never waits on how many
// files it copied.
void remove_copies(std::vector<RunDir> dirs) {
  for (RunDir& d : dirs) {
    std::string hidden = "." + d.name + ".deleting";
    if (still_named(d, d.name) && renameat2(d.parent.get(), d.name.c_str(), d.parent.get(),
                                            hidden.c_str(), RENAME_NOREPLACE) == 0)
      d.name = hidden;
  }
  if (dirs.empty()) return;
  pid_t child = fork();
  if (child == 0) {
    // Whoever reads the run's output sees its end now, not the deletion's:
    // no descriptor but the directories' is kept (a caller's pipe would
    // otherwise see its end only when the deletion ends).
    std::vector<int> keep;
    for (const RunDir& d : dirs) keep.insert(keep.end(), {d.parent.get(), d.dir.get()});
    std::sort(keep.begin(), keep.end());
    unsigned from = 3;
    for (int fd : keep) {
      if (fd > int(from)) close_range(from, unsigned(fd) - 1, 0);
      from = std::max(from, unsigned(fd) + 1);
    }
    close_range(from, ~0U, 0);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) dup2(null, fd);
    if (null > 2) close(null);
    (void)!chdir("/");
    setsid();
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    lowest_priority();
    delete_run_dirs(dirs);
    _exit(0);
  }
  if (child < 0) delete_run_dirs(dirs);  // no child: here, then
}

Options parse(int argc, char** argv) {
  Options o;
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  po::options_description desc(
      "monarch-run --dataset DIR [options] -- CMD [ARGS...]\n"
      "Runs CMD with its reads of DIR served from node-local tiers. Options");
  desc.add_options()("help,h", "this text")("dataset", po::value(&o.dataset),
                                            "the dataset's directory (read-only for the run)")(
      "config", po::value(&o.config), "configuration file (default the installed monarch.conf)")(
      "tier", po::value(&o.tiers)->composing(),
      "DIR[:QUOTA] node-local tier, fastest first; replaces the configured tiers; QUOTA is a "
      "size (500G) or a share of the file system (80%), default 100%")(
      "report", po::value(&o.report), "also write the statistics as JSON to this file")(
      "keep", po::bool_switch(&o.keep), "keep the node-local copies (for debugging)")(
      "quiet,q", po::bool_switch(&o.quiet), "do not print the summary");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(split, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    std::exit(0);
  }
  if (o.dataset.empty()) fail("--dataset DIR is required (see --help)");
  for (int i = split + 1; i < argc; ++i) o.command.push_back(argv[i]);
  if (o.command.empty())
    fail("no command: give it after '--', e.g. monarch-run --dataset D -- cat D/x");
  o.config_given = vm.count("config") > 0;
  if (!o.config_given) o.config = MONARCH_DEFAULT_CONFIG;
  return o;
}

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>* env, int keep_fd,
            const sigset_t& mask) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  signal(SIGPIPE, SIG_DFL);  // monarch-run ignores it; the command must not
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
  if (env) {
    for (const auto& e : *env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    execvpe(argv[0], argv.data(), envp.data());
  } else {
    execvp(argv[0], argv.data());
  }
  std::cerr << "monarch-run: cannot run " << args[0] << ": " << std::strerror(errno) << "\n";
  _exit(127);
}

// Stops the stager: SIGTERM, then SIGKILL after `bound_s`. A stager stuck in
// a PFS call that never returns cannot even be killed: after 5 s more it is
// left behind, and the command's own result still comes back.
// Its exit is seen the moment it happens (a pidfd), not at the next tick of
// a polling loop: the run ends as soon as the stager has.
void stop(pid_t pid, unsigned bound_s) {
  Fd exited(pidfd_open(pid, 0));
  kill(pid, SIGTERM);
  auto gone = [&](unsigned tenths) {
    for (unsigned i = 0; i < tenths * 2; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return true;
      pollfd p{.fd = exited.get(), .events = POLLIN};
      if (!exited || poll(&p, 1, 50) < 0) usleep(50'000);
    }
    return false;
  };
  if (gone(bound_s * 10)) return;
  std::cerr << "monarch-run: the stager did not stop in " << bound_s << " s; killed\n";
  kill(pid, SIGKILL);
  if (!gone(50))
    std::cerr << "monarch-run: the stager (pid " << pid
              << ") is stuck in the file system and cannot be killed; left behind\n";
}

// The signals monarch-run forwards to the command: it then waits for the
// command to end, stops the stager and removes the copies, whatever ended it.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Writes to stderr, which may be a closed pipe: a failure is ignored.
void say(const std::string& line) {
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

// Waits for `child`, forwarding the signals above, and reads the stager's
// answer on `ready` meanwhile (the command does not wait for it: its reads go
// to the PFS until the stager has published the index). Returns the child's
// status; `forwarded` is the last signal forwarded (0 if none), `monarch`
// false once the stager said it cannot serve.
int wait_forwarding(pid_t child, const sigset_t& set, int ready, int& forwarded, bool& monarch,
                    const std::function<void()>& on_ready) {
  forwarded = 0;
  std::string line;
  // The command's end wakes the wait at once (its pidfd; SIGCHLD could be
  // the stager's); forwarded signals are looked for every 20 ms.
  Fd ended(pidfd_open(child, 0));
  for (;;) {
    int st = 0;
    pid_t r = waitpid(child, &st, WNOHANG);
    if (r == child) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return 127;
    pollfd p[2] = {{.fd = ready, .events = POLLIN}, {.fd = ended.get(), .events = POLLIN}};
    if (poll(p, 2, 20) > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[512];
      ssize_t n = read(ready, buf, sizeof buf);
      if (n > 0) line.append(buf, size_t(n));
      // "ready" first, then "error: ..." if the index cannot be made.
      for (size_t nl; (nl = line.find('\n')) != std::string::npos; line.erase(0, nl + 1)) {
        if (line.starts_with("ready\n")) on_ready();
        if (!line.starts_with("error: ")) continue;
        size_t at = line.starts_with("error: unavailable: ") ? 20 : 7;
        say("monarch-run: Monarch is off for this run: " + line.substr(at, nl - at) +
            "; reading from the PFS\n");
        monarch = false;
      }
      if (n <= 0) close(ready), ready = -1;
    }
    timespec now{0, 0};
    int sig = sigtimedwait(&set, nullptr, &now);
    if (sig > 0 && sig != SIGCHLD) {
      kill(child, sig);
      forwarded = sig;
    }
  }
}

}  // namespace
}  // namespace monarch

int main(int argc, char** argv) {
  using namespace monarch;
  Options opt = parse(argc, argv);
  Config config;
  try {
    if (!opt.config_given && !opt.tiers.empty() && access(opt.config.c_str(), F_OK) != 0)
      config = Config{.source = "(defaults)"};
    else
      config = load_config(opt.config);
    override_tiers(config, opt.tiers);
  } catch (const ConfigError& e) {
    fail(e.what());
  }
  if (config.tiers.empty()) fail("no node-local tier: give --tier DIR or a configuration file");
  try {  // bad input stops monarch-run before anything starts
    check_dataset(opt.dataset, config);
  } catch (const ConfigError& e) {
    fail(e.what());
  }
  // From here on monarch-run ends only through its own clean-up: the signals
  // that would end it are forwarded to the command, a closed stderr is
  // ignored (EPIPE), and the stager removes the copies itself if monarch-run
  // is killed outright.
  sigset_t set;
  sigemptyset(&set);
  for (int s : kForwarded) sigaddset(&set, s);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::string job = "run-" + std::to_string(getpid());
  std::string dir = exe_dir();

  bool monarch = true;

  // The command's environment (task_env.h): the library appended to
  // LD_PRELOAD, the dataset and the job directories, for Apptainer too.
  std::string lib =
      find_file({dir + "/../interpose/libmonarch_interpose.so", MONARCH_INTERPOSE_PATH});
  char cwd[PATH_MAX] = "";
  if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
  char root[kPathMax];
  normalize_path(cwd, opt.dataset, root, sizeof root);
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string v = *e;
    size_t eq = v.find('=');
    if (eq != std::string::npos) vars.emplace(v.substr(0, eq), v.substr(eq + 1));
  }
  TaskEnv task{.library = lib, .dataset = root};
  for (const TierConfig& t : config.tiers) task.job_dirs.push_back(job_dir(t, job));
  auto lookup = [&vars](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  std::vector<EnvChange> changes;
  try {
    changes = monarch_task_env(task, lookup);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  for (const EnvChange& c : changes) vars[c.name] = *c.value;
  std::vector<std::string> env;
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);

  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) fail(std::string("pipe: ") + std::strerror(errno));
  // The command first, the stager beside it: the job's start (a cold start
  // reads the program and its libraries from disk) never queues behind the
  // stager's. Its reads go to the PFS until the stager publishes the map.
  sigset_t none;
  sigemptyset(&none);
  pid_t child = spawn(opt.command, &env, -1, none);
  if (child < 0) fail(std::string("cannot start the command: fork: ") + std::strerror(errno));
  std::vector<std::string> sargs = {
      find_file({dir + "/monarch-stager", MONARCH_BINDIR "/monarch-stager"}),
      "--dataset",
      opt.dataset,
      "--job",
      job,
      "--ready-fd",
      std::to_string(pipefd[1]),
      "--exit-with-parent"};
  if (!opt.keep) sargs.push_back("--remove-if-orphaned");
  if (opt.config_given) sargs.insert(sargs.end(), {"--config", opt.config});
  for (const std::string& t : opt.tiers) sargs.insert(sargs.end(), {"--tier", t});
  // Its stop signals stay blocked across exec: one sent while it starts
  // waits for it (it takes them with sigwait), never ends it unprepared.
  pid_t stager = spawn(sargs, nullptr, pipefd[1], stager_signals());
  close(pipefd[1]);
  if (stager < 0) {  // the command runs on, without Monarch's copies
    say(std::string("monarch-run: Monarch is off for this run: cannot start the stager: fork: ") +
        std::strerror(errno) + "; reading from the PFS\n");
    close(pipefd[0]);
    pipefd[0] = -1;
    monarch = false;
  }
  int forwarded = 0;
  std::vector<RunDir> dirs;
  int status = wait_forwarding(child, set, pipefd[0], forwarded, monarch,
                               [&] { dirs = open_run_dirs(config.tiers, job); });
  if (forwarded)
    say(std::string("monarch-run: forwarded ") + strsignal(forwarded) +
        " to the command; stopping the stager and removing the copies\n");

  if (stager > 0) stop(stager, config.stop_timeout_s);
  std::stringstream stats;
  {
    std::ifstream in(task.job_dirs[0] + "/" + kStatsName);  // closed before the deleter forks
    stats << in.rdbuf();
  }
  if (!opt.report.empty()) {
    std::ofstream out(opt.report);
    out << stats.str();
    if (!out) say("monarch-run: cannot write " + opt.report + "\n");
  }
  if (!opt.quiet && monarch) {
    std::string summary;
    try {
      summary = summary_text(stats.str());
    } catch (const std::exception& e) {
      summary = std::string("no statistics: ") + e.what() + "\n";
    }
    say(summary);
  }
  if (!opt.keep) remove_copies(dirs.empty() ? open_run_dirs(config.tiers, job) : std::move(dirs));
  return status;
}
