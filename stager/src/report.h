// Rendering a job's statistics (stats.json, schema monarch-stats/1) for
// people: the terminal summary, and the files written at job end.
#pragma once

#include <stdexcept>
#include <string>

namespace monarch {

// Bad input, phrased for the user: which file, what is wrong.
struct ReportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The short text summary. Throws ReportError when `json` is not statistics.
std::string summary_text(const std::string& json);

}  // namespace monarch
