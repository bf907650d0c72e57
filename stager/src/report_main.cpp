// monarch-report: shows what Monarch did for a job.
//   monarch-report FILE|JOBID              the summary
//   monarch-report --json FILE|JOBID       the report JSON (schema monarch-report/1)
//   monarch-report --svg OUT FILE|JOBID    the picture
//   monarch-report --write DIR STATS       monarch-<job>.txt, .json, .svg into DIR
// FILE is statistics (stats.json) or a report (monarch-<job>.json); JOBID a
// Slurm job id, whose monarch-job<ID>.json is looked for in the current
// directory, then in $MONARCH_REPORT_DIR. Bad input: one line, exit 1;
// bad usage: exit 2.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "report.h"

namespace {

constexpr const char* kUsage =
    "usage: monarch-report [--json | --svg OUT] FILE|JOBID\n"
    "       monarch-report --write DIR STATS_JSON\n"
    "FILE: a job's statistics or report JSON; JOBID: a Slurm job id, looked up as\n"
    "monarch-job<ID>.json in the current directory, then in $MONARCH_REPORT_DIR.\n";

struct Failure {
  std::string message;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Failure{path + ": cannot read: " + std::strerror(errno)};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A file, or the report of a job id.
std::string find_input(const std::string& arg, std::string& path) {
  bool id = !arg.empty() && arg.find_first_not_of("0123456789") == std::string::npos;
  if (!id) return read_file(path = arg);
  std::string name = "monarch-job" + arg + ".json";
  std::string where = "the current directory";
  if (access(name.c_str(), F_OK) == 0) return read_file(path = name);
  if (const char* dir = std::getenv("MONARCH_REPORT_DIR"); dir && *dir) {
    path = std::string(dir) + "/" + name;
    if (access(path.c_str(), F_OK) == 0) return read_file(path);
    where += " and " + std::string(dir);
  } else {
    where += " ($MONARCH_REPORT_DIR is not set)";
  }
  throw Failure{"no report for job " + arg + ": no " + name + " in " + where};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) throw Failure{path + ": cannot write: " + std::strerror(errno)};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? 2 : 0;
  }
  std::string path = args.back();
  try {
    if (args[0] == "--write") {
      if (args.size() != 3) throw std::invalid_argument("--write takes DIR and STATS_JSON");
      for (const std::string& p : monarch::write_reports(read_file(path = args[2]), args[1]))
        std::cout << p << "\n";
    } else if (args[0] == "--json" && args.size() == 2) {
      std::cout << monarch::report_json(find_input(args[1], path));
    } else if (args[0] == "--svg" && args.size() == 3) {
      write_file(args[1], monarch::report_svg(find_input(args[2], path)));
    } else if (args.size() == 1 && args[0][0] != '-') {
      std::cout << monarch::summary_text(find_input(args[0], path));
    } else {
      throw std::invalid_argument("unknown arguments");
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "monarch-report: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const Failure& f) {
    std::cerr << "monarch-report: " << f.message << "\n";
    return 1;
  } catch (const monarch::ReportError& e) {
    std::cerr << "monarch-report: " << path << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "monarch-report: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
