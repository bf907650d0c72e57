#include "task_env.h"

#include <algorithm>
#include <stdexcept>

#include "jobmap.h"

namespace monarch {
namespace {

// Apptainer passes APPTAINERENV_X as X into the container, with or without
// --cleanenv; Apptainer reads SINGULARITYENV_X too, SingularityCE only that.
constexpr const char* kEnvPrefixes[] = {"APPTAINERENV_", "SINGULARITYENV_"};
// Binds (src[:dest[:opts]], comma-separated) added to the command line's.
constexpr const char* kBindLists[] = {"APPTAINER_BINDPATH", "SINGULARITY_BINDPATH"};
constexpr const char* kPreload = "LD_PRELOAD";

// The MONARCH_ variables a task gets (MONARCH_LOG only when asked for).
constexpr const char* kMonarchNames[] = {kEnvDataset, kEnvJobDir, kEnvJobDirs, kEnvLibrary,
                                         kEnvLog};

// A list's entries: LD_PRELOAD separates by spaces or colons (as ld.so
// accepts them), the bind lists by commas.
std::vector<std::string> entries(const std::string& value, const char* separators) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= value.size()) {
    size_t end = value.find_first_of(separators, at);
    if (end == std::string::npos) end = value.size();
    if (end > at) out.push_back(value.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// A list variable and how its entries are separated.
struct List {
  std::string name;
  const char* separators;  // any of these ends an entry
  char join;               // what this code puts between two
};

// LD_PRELOAD and its Apptainer forms: separated by spaces or colons, as ld.so
// accepts them. The bind lists: by commas.
std::vector<List> preload_lists() {
  std::vector<List> out = {{kPreload, " :", ':'}};
  for (const char* p : kEnvPrefixes) out.push_back({p + std::string(kPreload), " :", ':'});
  return out;
}
std::vector<List> bind_lists() {
  std::vector<List> out;
  for (const char* name : kBindLists) out.push_back({name, ",", ','});
  return out;
}

// `list` with the entries of `add` appended where missing.
std::optional<EnvChange> append(const List& list, const std::vector<std::string>& add,
                                const EnvLookup& env) {
  std::string value = env(list.name).value_or("");
  std::vector<std::string> have = entries(value, list.separators);
  bool changed = false;
  for (const std::string& a : add) {
    if (std::find(have.begin(), have.end(), a) != have.end()) continue;
    if (!value.empty()) value += list.join;
    value += a;
    have.push_back(a);
    changed = true;
  }
  if (!changed) return std::nullopt;
  return EnvChange{list.name, value};
}

// `list` without the entries of `drop`; unset when nothing is left.
std::optional<EnvChange> remove(const List& list, const std::vector<std::string>& drop,
                                const EnvLookup& env) {
  std::optional<std::string> value = env(list.name);
  if (!value) return std::nullopt;
  std::string kept;
  bool changed = false;
  for (const std::string& e : entries(*value, list.separators)) {
    if (std::find(drop.begin(), drop.end(), e) != drop.end()) {
      changed = true;
      continue;
    }
    if (!kept.empty()) kept += list.join;
    kept += e;
  }
  if (!changed) return std::nullopt;
  return EnvChange{list.name, kept.empty() ? std::nullopt : std::optional<std::string>(kept)};
}

void check_path(const std::string& what, const std::string& path) {
  if (path.empty() || path[0] != '/')
    throw std::invalid_argument(what + " '" + path + "' is not an absolute path");
  for (unsigned char ch : path)
    if (ch <= ' ' || ch == 0x7f || ch == ':' || ch == ',')
      throw std::invalid_argument(what + " '" + path +
                                  "' has a colon, a comma, white space or a control character: "
                                  "the job's environment and containers' bind lists cannot "
                                  "carry it");
}

}  // namespace

std::vector<EnvChange> monarch_task_env(const TaskEnv& task, const EnvLookup& env) {
  check_path("the library", task.library);
  if (task.job_dirs.empty()) throw std::invalid_argument("no job directory");
  std::string dirs;
  for (const std::string& d : task.job_dirs) {
    check_path("the job directory", d);
    dirs += (dirs.empty() ? "" : ":") + d;
  }
  std::vector<EnvChange> out;
  for (const List& list : preload_lists())
    if (auto c = append(list, {task.library}, env)) out.push_back(*c);
  std::vector<std::pair<const char*, std::string>> values = {{kEnvDataset, task.dataset},
                                                             {kEnvJobDir, task.job_dirs[0]},
                                                             {kEnvJobDirs, dirs},
                                                             {kEnvLibrary, task.library}};
  if (task.log) values.push_back({kEnvLog, "1"});
  for (const auto& [name, value] : values) {
    out.push_back({name, value});
    for (const char* p : kEnvPrefixes) out.push_back({p + std::string(name), value});
  }
  std::vector<std::string> binds = {task.library};
  binds.insert(binds.end(), task.job_dirs.begin(), task.job_dirs.end());
  for (const List& list : bind_lists())
    if (auto c = append(list, binds, env)) out.push_back(*c);
  return out;
}

std::vector<EnvChange> monarch_clear_env(const std::string& library, const EnvLookup& env) {
  std::vector<EnvChange> out;
  for (const List& list : preload_lists())
    if (auto c = remove(list, {library}, env)) out.push_back(*c);
  // The job directories are those the inherited environment names.
  std::vector<std::string> binds = entries(env(kEnvJobDirs).value_or(""), ":");
  binds.insert(binds.begin(), library);
  for (const List& list : bind_lists())
    if (auto c = remove(list, binds, env)) out.push_back(*c);
  for (const char* name : kMonarchNames) {
    std::vector<std::string> names = {name};
    for (const char* p : kEnvPrefixes) names.push_back(p + std::string(name));
    for (const std::string& n : names)
      if (env(n)) out.push_back({n, std::nullopt});
  }
  return out;
}

}  // namespace monarch
