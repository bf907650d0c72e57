#include "text_width.h"

#include <array>

namespace monarch {
namespace {

// Advance widths of the printable ASCII characters (32 to 126) in font units
// (2048 an em), read from DejaVuSans.ttf and DejaVuSans-Bold.ttf (hmtx).
constexpr double kUnitsPerEm = 2048;
constexpr std::array<unsigned short, 95> kRegular = {
    651,  821,  942,  1716, 1303, 1946, 1597, 563,  799,  799,  1024, 1716, 651,  739,  651,  690,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690,  690,  1716, 1716, 1716, 1087,
    2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604,  604,  1343, 1141, 1767, 1532, 1612,
    1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799,  690,  799,  1716, 1024,
    1024, 1255, 1300, 1126, 1300, 1260, 721,  1300, 1298, 569,  569,  1186, 569,  1995, 1298, 1253,
    1300, 1300, 842,  1067, 803,  1298, 1212, 1675, 1212, 1212, 1075, 1303, 690,  1303, 1716,
};
constexpr std::array<unsigned short, 95> kBold = {
    713,  934,  1067, 1716, 1425, 2052, 1786, 627,  936,  936,  1071, 1716, 778,  850,  778,  748,
    1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 819,  819,  1716, 1716, 1716, 1188,
    2048, 1585, 1561, 1503, 1700, 1399, 1399, 1681, 1714, 762,  762,  1587, 1305, 2038, 1714, 1741,
    1501, 1741, 1577, 1475, 1397, 1663, 1585, 2259, 1579, 1483, 1485, 936,  748,  936,  1716, 1024,
    1024, 1382, 1466, 1214, 1466, 1389, 891,  1466, 1458, 702,  702,  1362, 702,  2134, 1458, 1407,
    1466, 1466, 1010, 1219, 979,  1458, 1335, 1892, 1321, 1335, 1192, 1458, 748,  1458, 1716,
};
constexpr unsigned short kOther = 1303;  // anything else: as wide as a digit
constexpr double kMargin = 1.02;         // rounding, kerning, hinting

}  // namespace

double text_width(std::string_view text, double size, bool bold) {
  const auto& widths = bold ? kBold : kRegular;
  double units = 0;
  for (unsigned char c : text) {
    if ((c & 0xC0) == 0x80) continue;  // a UTF-8 continuation byte: counted with its lead
    units += c >= 32 && c < 127 ? widths[c - 32] : kOther;
  }
  return units / kUnitsPerEm * size * kMargin;
}

std::vector<std::string> wrap(const std::vector<std::string>& pieces, std::string_view joiner,
                              double width, double size, bool bold) {
  std::vector<std::string> lines;
  for (std::string piece : pieces) {
    if (text_width(piece, size, bold) > width) {  // keep its start and end, drop the middle
      auto lead = [&](size_t i) {                 // never split a UTF-8 character
        while (i > 0 && i < piece.size() && (piece[i] & 0xC0) == 0x80) --i;
        return i;
      };
      size_t keep = piece.size();
      std::string shortened;
      do {
        --keep;
        size_t head = lead(keep / 2), tail = lead(piece.size() - keep / 2);
        shortened = piece.substr(0, head) + "..." + piece.substr(tail);
      } while (keep > 1 && text_width(shortened, size, bold) > width);
      piece = shortened;
    }
    std::string joined = lines.empty() ? "" : lines.back() + std::string(joiner) + piece;
    if (!lines.empty() && text_width(joined, size, bold) <= width)
      lines.back() = joined;
    else
      lines.push_back(piece);
  }
  return lines;
}

}  // namespace monarch
