// The report's picture: one self-contained SVG (no script, no fonts, no
// network) showing bytes per second served from each tier and from the PFS
// over time, the stager's copies, epoch boundaries, and the cached fraction.
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "config.h"
#include "report.h"
#include "stats.h"

namespace monarch {
namespace pt = boost::property_tree;

namespace {

constexpr double kW = 1100, kH = 540, kLeft = 110, kRight = 80, kTop = 70, kBottom = 80;
constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
const char* kTierColors[] = {"#2a9d8f", "#457b9d", "#8ab17d", "#6d597a"};
constexpr const char* kPfsColor = "#e76f51";
constexpr const char* kCopyColor = "#9b2226";
constexpr const char* kCachedColor = "#264653";

struct Series {
  std::string name, kind;
  std::vector<double> v;
};

std::vector<Series> read_series(const pt::ptree& t, const std::string& key, double interval) {
  std::vector<Series> out;
  if (auto list = t.get_child_optional(key))
    for (auto& kv : *list) {
      Series s{kv.second.get<std::string>("name", "?"), kv.second.get<std::string>("kind", ""), {}};
      if (auto b = kv.second.get_child_optional("bytes"))
        for (auto& x : *b) s.v.push_back(x.second.get_value<double>(0) / interval);
      out.push_back(std::move(s));
    }
  return out;
}

// A round step for about `n` ticks over [0, max].
double tick_step(double max, int n) {
  if (max <= 0) return 1;
  double raw = max / n, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string f1(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

}  // namespace

std::string report_svg(const std::string& json) {
  Figures fig = figures(json);  // validates the input
  pt::ptree t;
  std::istringstream in(stats_of(json));
  pt::read_json(in, t);
  double interval = std::max(1.0, t.get<double>("series.interval_s", 1));
  std::vector<Series> served = read_series(t, "series.served", interval);
  std::vector<Series> cached = read_series(t, "series.cached", 1);
  size_t n = 0;
  for (const Series& s : served) n = std::max(n, s.v.size());
  double duration = std::max(n * interval, fig.elapsed_s);
  if (duration <= 0) duration = 1;

  // Stacked: tiers, then the PFS; the stager's copies as a line.
  std::vector<double> top(n, 0);
  double ymax = 0;
  for (const Series& s : served)
    for (size_t i = 0; i < s.v.size(); ++i) {
      if (s.kind != "copy") top[i] += s.v[i];
      ymax = std::max(ymax, s.kind == "copy" ? s.v[i] : top[i]);
    }
  // Ticks at round numbers of the unit (B, KiB, MiB, GiB per second) that fits.
  double unit = 1;
  while (ymax / unit >= 1024 && unit < double(1ull << 40)) unit *= 1024;
  double ystep = unit * tick_step(ymax / unit, 5);
  double ytop = ystep * std::ceil(std::max(ymax, 1.0) / ystep);
  double xstep = tick_step(duration, 8);
  auto X = [&](double s) { return kLeft + kPlotW * s / duration; };
  auto Y = [&](double v) { return kTop + kPlotH * (1 - v / ytop); };
  auto Yf = [&](double f) { return kTop + kPlotH * (1 - f); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
    << "\" viewBox=\"0 0 " << kW << " " << kH << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kLeft << "\" y=\"28\" font-size=\"17\" font-weight=\"bold\">Monarch: job "
    << esc(fig.job) << (fig.complete ? "" : " (incomplete statistics)") << "</text>\n"
    << "<text x=\"" << kLeft << "\" y=\"48\" fill=\"#444\">dataset " << esc(fig.dataset) << " — "
    << human_bytes(fig.dataset_bytes) << " in " << uint64_t(fig.files) << " files; "
    << f1(100 * fig.total.hit())
    << "% read from node-local tiers; verdict: " << esc(fig.verdict.bound) << "</text>\n";

  // Grid and axes.
  for (double y = 0; y <= ytop + 1e-9; y += ystep)
    o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + kPlotW << "\" y1=\"" << Y(y) << "\" y2=\""
      << Y(y) << "\" stroke=\"#ddd\"/><text x=\"" << kLeft - 8 << "\" y=\"" << Y(y) + 4
      << "\" text-anchor=\"end\">" << esc(human_bytes(y)) << "/s</text>\n";
  for (double x = 0; x <= duration + 1e-9; x += xstep)
    o << "<text x=\"" << X(x) << "\" y=\"" << kTop + kPlotH + 18 << "\" text-anchor=\"middle\">"
      << f1(x) << "</text>\n";
  for (int p = 0; p <= 100; p += 25)
    o << "<text x=\"" << kLeft + kPlotW + 8 << "\" y=\"" << Yf(p / 100.0) + 4 << "\" fill=\""
      << kCachedColor << "\">" << p << "%</text>\n";
  o << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kH - 42
    << "\" text-anchor=\"middle\">time since the stager started (s)</text>\n"
    << "<text transform=\"translate(18," << kTop + kPlotH / 2
    << ") rotate(-90)\" text-anchor=\"middle\">bytes per second served</text>\n"
    << "<text transform=\"translate(" << kW - 14 << "," << kTop + kPlotH / 2
    << ") rotate(90)\" text-anchor=\"middle\" fill=\"" << kCachedColor
    << "\">dataset cached on node-local tiers</text>\n";

  // Stacked areas, one per source, from the bottom.
  std::vector<double> base(n, 0);
  int tier = 0;
  std::vector<std::pair<std::string, std::string>> legend;
  for (const Series& s : served) {
    if (s.kind == "copy") continue;
    std::string color = s.kind == "pfs" ? kPfsColor : kTierColors[tier++ % 4];
    std::ostringstream pts;
    for (size_t i = 0; i < n; ++i) {
      double v = i < s.v.size() ? s.v[i] : 0;
      pts << X(i * interval) << "," << Y(base[i] + v) << " " << X((i + 1) * interval) << ","
          << Y(base[i] + v) << " ";
    }
    for (size_t i = n; i-- > 0;)
      pts << X((i + 1) * interval) << "," << Y(base[i]) << " " << X(i * interval) << ","
          << Y(base[i]) << " ";
    for (size_t i = 0; i < n; ++i) base[i] += i < s.v.size() ? s.v[i] : 0;
    if (n)
      o << "<polygon points=\"" << pts.str() << "\" fill=\"" << color
        << "\" fill-opacity=\"0.85\"/>\n";
    legend.push_back({color, s.kind == "pfs" ? "from the PFS" : "from tier " + s.name});
  }
  for (const Series& s : served) {
    if (s.kind != "copy" || n == 0) continue;
    o << "<polyline fill=\"none\" stroke=\"" << kCopyColor
      << "\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\" points=\"";
    for (size_t i = 0; i < s.v.size(); ++i) o << X((i + 0.5) * interval) << "," << Y(s.v[i]) << " ";
    o << "\"/>\n";
    legend.push_back({kCopyColor, "copied by the stager from the PFS"});
  }
  // The cached fraction, on the right axis.
  if (!cached.empty() && fig.dataset_bytes > 0) {
    o << "<polyline fill=\"none\" stroke=\"" << kCachedColor << "\" stroke-width=\"2.5\" points=\"";
    size_t m = 0;
    for (const Series& s : cached) m = std::max(m, s.v.size());
    for (size_t i = 0; i < m; ++i) {
      double c = 0;
      for (const Series& s : cached) c += i < s.v.size() ? s.v[i] : 0;
      o << X((i + 1) * interval) << "," << Yf(std::min(1.0, c / fig.dataset_bytes)) << " ";
    }
    o << "\"/>\n";
    legend.push_back({kCachedColor, "cached fraction (right axis)"});
  }
  // Epoch boundaries.
  for (const EpochFigures& e : fig.epochs) {
    double end = e.start_s + e.seconds;
    if (!e.complete || end > duration) continue;
    o << "<line x1=\"" << X(end) << "\" x2=\"" << X(end) << "\" y1=\"" << kTop << "\" y2=\""
      << kTop + kPlotH << "\" stroke=\"#333\" stroke-dasharray=\"4,4\"/><text x=\"" << X(end) - 4
      << "\" y=\"" << kTop + 14 << "\" text-anchor=\"end\" fill=\"#333\">end of epoch " << e.number
      << " (" << f1(100 * e.traffic.hit()) << "% local)</text>\n";
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kPlotW << "\" height=\""
    << kPlotH << "\" fill=\"none\" stroke=\"#333\"/>\n";
  if (n == 0)
    o << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kTop + kPlotH / 2
      << "\" text-anchor=\"middle\" fill=\"#888\">no samples: the job ran less than " << interval
      << " s</text>\n";
  double lx = kLeft;
  for (const auto& [color, label] : legend) {
    o << "<rect x=\"" << lx << "\" y=\"" << kH - 24 << "\" width=\"14\" height=\"10\" fill=\""
      << color << "\"/><text x=\"" << lx + 18 << "\" y=\"" << kH - 15 << "\">" << esc(label)
      << "</text>\n";
    lx += 30 + 7.0 * label.size();
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace monarch
