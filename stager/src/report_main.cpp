// monarch-report: shows what Monarch did for a job.
// Its modes are the table modes() below.
// FILE is statistics (stats.json) or a report (monarch-<job>.json). JOBID is
// a Slurm job id (42 or job42): its monarch-job42.json, and the per-node
// monarch-job42-<host>.json of a job of several nodes, are looked for in the
// current directory, then in $MONARCH_REPORT_DIR. Bad input: one line naming
// the file and the problem, exit 1; bad usage: exit 2.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <regex>

#include "config.h"
#include "report.h"

namespace {

// What monarch-report accepts: each mode's flag ("" for the summary), its
// arguments and what it does. The usage text and the parser both read this
// table; monarch-report(1) documents each row (a test compares).
enum class Mode { kSummary, kJson, kSvg, kWrite, kWriteJob, kExplain, kHelp };
struct ModeRule {
  Mode mode;
  const char* flag;
  std::vector<const char*> args;
  const char* what;
};
const std::vector<ModeRule>& modes() {
  static const std::vector<ModeRule> rules = {
      {Mode::kSummary, "", {"FILE|JOBID"}, "the summary"},
      {Mode::kJson, "--json", {"FILE|JOBID"}, "the report JSON (schema monarch-report/1)"},
      {Mode::kSvg, "--svg", {"OUT", "FILE|JOBID"}, "the picture, written to OUT"},
      {Mode::kWrite, "--write", {"DIR", "STATS"}, "the .txt, .json and .svg into DIR"},
      {Mode::kWriteJob,
       "--write",
       {"DIR", "STATS", "--job", "KEY"},
       "the same; statistics that cannot be read leave DIR/monarch-KEY.txt saying why"},
      {Mode::kExplain, "--explain", {}, "every counter of the statistics and its meaning"},
      {Mode::kHelp, "--help", {}, "this text (also -h)"},
  };
  return rules;
}

std::string usage() {
  std::string u;
  for (const ModeRule& m : modes()) {
    std::string line = std::string(u.empty() ? "usage: " : "       ") + "monarch-report";
    if (*m.flag) line += std::string(" ") + m.flag;
    for (const char* a : m.args) line += std::string(" ") + a;
    line.resize(std::max<size_t>(line.size() + 2, 52), ' ');
    u += line + m.what + "\n";
  }
  return u +
         "FILE: a job's statistics or report JSON; JOBID: a Slurm job id (42 or job42),\n"
         "found as monarch-job42.json in the current directory, then in $MONARCH_REPORT_DIR.\n";
}

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Bad input: the file, and what is wrong with it.
struct Failure {
  std::string path, message;
};

// The whole of a statistics or report file, at most kMaxStatsBytes: a
// larger file (or a device that never ends) is refused, not read. At a job's
// end (`follow` false) the statistics file itself, never a link in its place.
std::string read_file(const std::string& path, bool follow = true) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0 && errno == ELOOP && !follow)
    throw Failure{path, "a symbolic link, not the statistics the stager wrote: not followed"};
  if (fd < 0) throw Failure{path, std::string("cannot read: ") + std::strerror(errno)};
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    throw Failure{path, "cannot read: Is a directory"};
  }
  auto too_large = [&path](double size) {
    return Failure{path, (size > 0 ? monarch::human_bytes(size) : std::string("more")) +
                             " of statistics, above the " +
                             monarch::human_bytes(double(monarch::kMaxStatsBytes)) +
                             " a job's statistics can take: not read (a stager never writes "
                             "that much; was the file replaced?)"};
  };
  if (S_ISREG(st.st_mode) && size_t(st.st_size) > monarch::kMaxStatsBytes) {
    close(fd);
    throw too_large(double(st.st_size));
  }
  std::string text;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, size_t(n));
    if (text.size() > monarch::kMaxStatsBytes) {
      close(fd);
      throw too_large(0);
    }
  }
  int err = errno;
  close(fd);
  if (n < 0) throw Failure{path, std::string("cannot read: ") + std::strerror(err)};
  return text;
}

// The reports of job `id` in `dir`: monarch-job<ID>.json first, then the
// per-node monarch-job<ID>-<host>.json, by name.
std::vector<std::string> reports_in(const std::string& dir, const std::string& id) {
  std::vector<std::string> found;
  std::string name = "monarch-job" + id;
  DIR* d = opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == name + ".json" || (n.rfind(name + "-", 0) == 0 && n.size() > name.size() + 6 &&
                                n.compare(n.size() - 5, 5, ".json") == 0))
      found.push_back(dir == "." ? n : dir + "/" + n);
  }
  closedir(d);
  std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return found;
}

// The files an argument names: itself, or the reports of a job id.
std::vector<std::string> inputs(const std::string& arg) {
  static const std::regex job_id("(job)?([0-9]+)");
  std::smatch m;
  struct stat st;
  if (lstat(arg.c_str(), &st) == 0 || !std::regex_match(arg, m, job_id)) return {arg};
  std::string id = m[2], where = "the current directory";
  std::vector<std::string> found = reports_in(".", id);
  if (found.empty()) {
    if (const char* dir = std::getenv("MONARCH_REPORT_DIR"); dir && *dir) {
      found = reports_in(dir, id);
      where += " or " + std::string(dir) + " ($MONARCH_REPORT_DIR)";
    } else {
      where += " ($MONARCH_REPORT_DIR is not set)";
    }
  }
  if (found.empty())
    throw Failure{"job " + id, "no report: no monarch-job" + id + ".json in " + where};
  return found;
}

// The mode `args` ask for. Throws Usage.
const ModeRule& mode_of(const std::vector<std::string>& args) {
  if (args.empty()) throw Usage("no arguments");
  std::string flag = args[0] == "-h" ? "--help" : args[0].starts_with("-") ? args[0] : "";
  size_t given = args.size() - (flag.empty() ? 0 : 1);
  const ModeRule* known = nullptr;
  for (const ModeRule& m : modes()) {
    if (flag != m.flag) continue;
    known = &m;
    bool fits = given == m.args.size();
    for (size_t i = 0; fits && i < m.args.size(); ++i)  // literal words: "--job"
      fits = !std::string_view(m.args[i]).starts_with("--") || args[i + 1] == m.args[i];
    if (fits) return m;
  }
  if (!known) throw Usage("unknown option " + flag);
  throw Usage((flag.empty() ? std::string("the summary") : flag) + " takes " +
              std::to_string(known->args.size()) + " argument(s), " + std::to_string(given) +
              " given");
}

int run(const std::vector<std::string>& args) {
  const ModeRule& m = mode_of(args);
  switch (m.mode) {
    case Mode::kHelp:
      std::cout << usage();
      return 0;
    case Mode::kExplain:
      std::cout << monarch::explain_text();
      return 0;
    case Mode::kWrite:
    case Mode::kWriteJob:
      try {
        std::string text = read_file(args[2], /*follow=*/false);
        try {
          for (const std::string& p : monarch::write_reports(text, args[1])) std::cout << p << "\n";
        } catch (const monarch::ReportError& e) {
          throw Failure{args[2], e.what()};
        }
      } catch (const Failure& f) {
        // At a job's end: the user finds why in place of the report.
        if (m.mode == Mode::kWriteJob)
          std::cout << monarch::write_note(args[4],
                                           "monarch-report: " + f.path + ": " + f.message +
                                               "; no report for this job",
                                           args[1])
                    << "\n";
        throw;
      }
      return 0;
    case Mode::kSummary:
    case Mode::kJson:
    case Mode::kSvg:
      break;
  }
  std::vector<std::string> files = inputs(args.back());
  if (m.mode == Mode::kSvg && files.size() > 1)
    throw Failure{args.back(), "reports from " + std::to_string(files.size()) +
                                   " nodes: name one of " + files[0] + "..."};
  if (m.mode == Mode::kSummary && files.size() > 1) {  // a job of several nodes: the job first
    std::vector<std::string> texts;
    for (const std::string& f : files) texts.push_back(read_file(f));
    try {
      std::cout << monarch::job_summary_text(texts) << "\n";
    } catch (const monarch::ReportError& e) {
      throw Failure{args.back(), e.what()};
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::string text = read_file(files[i]);
    try {
      if (m.mode == Mode::kJson)
        std::cout << monarch::report_json(text);
      else if (m.mode == Mode::kSvg)
        monarch::write_atomically(args[1], monarch::report_svg(text));
      else
        std::cout << (i ? "\n" : "") << monarch::summary_text(text);
    } catch (const monarch::ReportError& e) {
      throw Failure{files[i], e.what()};
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return run(args);
  } catch (const Usage& e) {
    std::cerr << "monarch-report: " << e.what() << "\n" << usage();
    return 2;
  } catch (const Failure& f) {
    std::cerr << "monarch-report: " << f.path << ": " << f.message << "\n";
    return 1;
  } catch (const std::exception& e) {  // cannot write: the message names the file
    std::cerr << "monarch-report: " << e.what() << "\n";
    return 1;
  }
}
