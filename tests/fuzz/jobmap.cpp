// The job map as every process of a job opens it (jobmap.h): a file the user
// owns, so any bytes. The input is a map in map_form.h's form, mapped as the
// library maps it (64-byte aligned, followed by the counters' slots) and
// checked by JobMap's constructor: refused with a reason, or valid, and then
// every lookup stays within the map and agrees with the entries
// (check_map).
#include <cstdlib>

#include "map_form.h"

using namespace monarch;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  size_t bytes = fuzz::expanded_size(size) + fuzz::kSlotsBytes;
  void* base = nullptr;
  FUZZ_CHECK(posix_memalign(&base, 64, bytes) == 0);
  auto* p = static_cast<char*>(base);
  fuzz::expand(input, p);
  // The counters' slots are left as they are: nothing here reads them, and
  // touching 2 MiB a run would cost more than the checks.
  JobMap m(base, bytes);
  if (m.valid())
    fuzz::check_map(m);
  else
    FUZZ_CHECK(!m.why().empty());
  // The library never maps less than a header; a shorter file is refused too.
  FUZZ_CHECK(!JobMap(base, sizeof(Header) - 1).valid());
  free(base);
  return 0;
}
