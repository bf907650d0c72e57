// The plugin's plugstack.conf arguments (spank/args.h), as Slurm hands them:
// words. Whatever they are: config is an absolute path, a word that is not
// accepted is reported (one report per word at most) and a bad value turns
// the plugin off; the arguments a parse yields, written out again as words,
// parse to the same arguments without a report.
#include "args.h"
#include "fuzz.h"

using namespace monarch;
using namespace monarch::spank;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  std::vector<std::string_view> words;
  while (in.left() && words.size() < 64) words.push_back(in.until('\0'));
  Args args;
  size_t errors = 0;
  parse_plugstack_args(words, args, [&](const std::string& m) {
    FUZZ_CHECK(!m.empty());
    ++errors;
  });
  FUZZ_CHECK(errors <= words.size());
  FUZZ_CHECK(!args.config.empty() && args.config[0] == '/');
  if (errors == 0) {  // every word was accepted: the last config= holds
    std::string_view last = MONARCH_SPANK_CONFIG;
    for (std::string_view w : words)
      if (w.starts_with("config=")) last = w.substr(7);
    FUZZ_CHECK(args.config == last);
  }
  Args again;
  std::string config = "config=" + args.config,
              enabled = args.enabled ? "enabled=yes" : "enabled=no";
  parse_plugstack_args({config, enabled}, again, [](const std::string&) { FUZZ_CHECK(false); });
  FUZZ_CHECK(again.config == args.config && again.enabled == args.enabled);
  return 0;
}
