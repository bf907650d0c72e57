// The environment Monarch gives a job's tasks (task_env.h): what it sets,
// for Apptainer too, and that taking it back restores the user's exactly.
#include "task_env.h"

#include <gtest/gtest.h>

#include <map>

namespace monarch {
namespace {

using Env = std::map<std::string, std::string>;

const char* kLib = "/usr/lib/monarch/libmonarch_interpose.so";

Env applied(Env env, const std::vector<EnvChange>& changes) {
  for (const EnvChange& c : changes) {
    if (c.value)
      env[c.name] = *c.value;
    else
      env.erase(c.name);
  }
  return env;
}

EnvLookup lookup(const Env& env) {
  return [&env](const std::string& n) -> std::optional<std::string> {
    auto it = env.find(n);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TaskEnv task() {
  return {.library = kLib,
          .dataset = "/scratch/ds",
          .job_dirs = {"/mnt/ssd/monarch-job7", "/dev/shm/monarch-job7"},
          .log = true};
}

Env with_monarch(const Env& user) {
  return applied(user, monarch_task_env(task(), lookup(user)));
}

TEST(TaskEnv, SetsTheTaskAndApptainerVariables) {
  Env env = with_monarch({{"HOME", "/home/u"}});
  std::string dirs = "/mnt/ssd/monarch-job7:/dev/shm/monarch-job7";
  std::string binds = std::string(kLib) + ",/mnt/ssd/monarch-job7,/dev/shm/monarch-job7";
  Env want = {{"HOME", "/home/u"},
              {"LD_PRELOAD", kLib},
              {"MONARCH_DATASET", "/scratch/ds"},
              {"MONARCH_JOB_DIR", "/mnt/ssd/monarch-job7"},
              {"MONARCH_JOB_DIRS", dirs},
              {"MONARCH_INTERPOSE_LIB", kLib},
              {"MONARCH_LOG", "1"},
              {"APPTAINER_BINDPATH", binds},
              {"SINGULARITY_BINDPATH", binds}};
  for (const char* prefix : {"APPTAINERENV_", "SINGULARITYENV_"})
    for (const char* name : {"LD_PRELOAD", "MONARCH_DATASET", "MONARCH_JOB_DIR", "MONARCH_JOB_DIRS",
                             "MONARCH_INTERPOSE_LIB", "MONARCH_LOG"})
      want[prefix + std::string(name)] = want.at(name);
  EXPECT_EQ(env, want);
}

TEST(TaskEnv, AppendsToTheUsersListsOnce) {
  Env user = {{"LD_PRELOAD", "/opt/a.so /opt/b.so"},
              {"APPTAINERENV_LD_PRELOAD", "/opt/c.so"},
              {"APPTAINER_BINDPATH", "/scratch:/data:ro,/opt"}};
  Env env = with_monarch(user);
  EXPECT_EQ(env["LD_PRELOAD"], "/opt/a.so /opt/b.so:" + std::string(kLib));
  EXPECT_EQ(env["APPTAINERENV_LD_PRELOAD"], "/opt/c.so:" + std::string(kLib));
  EXPECT_EQ(env["SINGULARITYENV_LD_PRELOAD"], kLib);
  EXPECT_EQ(env["APPTAINER_BINDPATH"], "/scratch:/data:ro,/opt," + std::string(kLib) +
                                           ",/mnt/ssd/monarch-job7,/dev/shm/monarch-job7");
  EXPECT_EQ(with_monarch(env), env);  // a nested step with Monarch: nothing twice
}

TEST(TaskEnv, ClearTakesBackExactlyWhatWasAdded) {
  for (Env user : {Env{}, Env{{"LD_PRELOAD", "/opt/a.so:/opt/b.so"},
                              {"SINGULARITYENV_LD_PRELOAD", "/opt/c.so"},
                              {"APPTAINER_BINDPATH", "/scratch:/data:ro"},
                              {"SINGULARITY_BINDPATH", "/opt,/srv"},
                              {"PATH", "/usr/bin"}}}) {
    Env env = with_monarch(user);
    EXPECT_EQ(applied(env, monarch_clear_env(kLib, lookup(env))), user);
  }
}

TEST(TaskEnv, RefusesPathsTheListsCannotCarry) {
  for (std::string bad : {"/mnt/a:b", "/mnt/a,b", "/mnt/a b", "/mnt/a\nb", "relative"}) {
    TaskEnv t = task();
    t.job_dirs[1] = bad;
    EXPECT_THROW(monarch_task_env(t, lookup({})), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace monarch
