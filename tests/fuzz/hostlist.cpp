// A Slurm node list (SLURM_JOB_NODELIST, hostlist.h): expanded or refused
// with std::invalid_argument, within kMaxJobNodes names, each one a name (no
// separator or bracket left, not empty); node_name() agrees with the
// expansion, and is "" past its end or for a list that is not one.
#include <stdexcept>

#include "fuzz.h"
#include "hostlist.h"

using namespace monarch;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view list(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> names;
  try {
    names = expand_hostlist(list);
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("node list '"));
    FUZZ_CHECK(node_name(list, 0).empty());
    return 0;
  }
  FUZZ_CHECK(names.size() <= kMaxJobNodes);
  for (const std::string& n : names) {
    FUZZ_CHECK(!n.empty());
    FUZZ_CHECK(n.find_first_of(",[]") == std::string::npos);
  }
  // node_name expands the list again each time: a few ids, not every one.
  size_t n = names.size();
  for (size_t id : {size_t(0), n / 2, n ? n - 1 : 0, n})
    FUZZ_CHECK(node_name(list, uint32_t(id)) == (id < n ? names[id] : ""));
  return 0;
}
