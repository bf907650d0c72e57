#include "request_size.h"

#include <gtest/gtest.h>

#include <vector>

namespace monarch {
namespace {

constexpr uint64_t KiB = 1 << 10, MiB = 1 << 20;

// The requests a copy makes of a `size`-byte file, as Copier::copy_blocks
// makes them (the last one cut at the file's end).
std::vector<uint64_t> requests(uint64_t size, uint64_t block) {
  std::vector<uint64_t> out;
  for (uint64_t done = 0; done < size;) {
    uint64_t n = std::min(request_size(done, size, block), size - done);
    out.push_back(n);
    done += n;
  }
  return out;
}

TEST(RequestSize, AFileOfABlockOrLessIsOneRequest) {
  EXPECT_EQ(requests(100 * KiB, 4 * MiB), std::vector<uint64_t>{100 * KiB});
  EXPECT_EQ(requests(4 * MiB, 4 * MiB), std::vector<uint64_t>{4 * MiB});
}

TEST(RequestSize, ALargerFileStartsSmallAndDoublesToTheBlock) {
  EXPECT_EQ(requests(16 * MiB, 4 * MiB),
            (std::vector<uint64_t>{256 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB,
                                   4 * MiB, 4 * MiB}));
  // Four requests more than blocks alone would make, whatever the file's size.
  EXPECT_EQ(requests(48 * MiB, 4 * MiB).size(), 48 / 4 + 4u);
  EXPECT_EQ(requests(5 * MiB, 4 * MiB),
            (std::vector<uint64_t>{256 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 1 * MiB}));
}

TEST(RequestSize, ABlockSmallerThanTheFirstRequestIsKept) {
  EXPECT_EQ(requests(1 * MiB, 64 * KiB).size(), 16u);
  EXPECT_EQ(request_size(0, 1 * MiB, 64 * KiB), 64 * KiB);
}

}  // namespace
}  // namespace monarch
