// How wide a line of SVG text is drawn, so that the report's picture can lay
// out its labels without overlaps and wrap its header lines instead of
// cutting them. Measured with DejaVu Sans, the font browsers on Linux pick
// for "sans-serif" and one of the widest (Helvetica and Arial are narrower),
// so the widths err towards more room. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace monarch {

// The advance width in pixels of `text` (UTF-8) at font size `size` px.
double text_width(std::string_view text, double size, bool bold = false);

// Joins `pieces` with `joiner` into as few lines as fit in `width` px; a
// piece wider than a line gets a line of its own, shortened in its middle
// ("/very/long/...ath/name") to fit.
std::vector<std::string> wrap(const std::vector<std::string>& pieces, std::string_view joiner,
                              double width, double size, bool bold = false);

}  // namespace monarch
