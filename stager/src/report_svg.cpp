// The report's picture: one self-contained SVG (no script, no fonts, no
// network) of bytes per second served from each tier and from the PFS over
// time (stacked), the stager's copies from the PFS (dashed line), epoch
// boundaries, and the cached fraction of the dataset on a second axis.
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "config.h"
#include "counters.h"
#include "report.h"
#include "report_internal.h"

namespace monarch {
namespace pt = boost::property_tree;
using namespace report_internal;

namespace {

constexpr double kW = 1100, kH = 560, kLeft = 110, kRight = 80, kTop = 84, kBottom = 86;
constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
const char* kTierColors[] = {"#2a9d8f", "#457b9d", "#8ab17d", "#6d597a"};
constexpr const char* kPfsColor = "#e76f51";
constexpr const char* kCopyColor = "#9b2226";
constexpr const char* kCachedColor = "#264653";

struct Source {
  std::string name, kind;  // kind: "tier", "pfs" or "copy", as in series.served
  std::vector<double> bytes;
  double total = 0;  // the same counter in "totals": what the series has not sampled yet
};

// Time bins [t0, t1) with bytes per source.
struct Bin {
  double t0, t1;
  std::vector<double> bytes;
};

// The series sample whole intervals; the job's last partial interval is only
// in the totals. Since both come from the same cumulative counters, the
// difference is exactly what happened after the last sample: a last bin.
std::vector<Bin> bins(const std::vector<Source>& src, double interval, double elapsed) {
  size_t n = 0;
  for (const Source& s : src) n = std::max(n, s.bytes.size());
  std::vector<Bin> out;
  for (size_t i = 0; i < n; ++i) {
    Bin b{i * interval, (i + 1) * interval, {}};
    for (const Source& s : src) b.bytes.push_back(i < s.bytes.size() ? s.bytes[i] : 0);
    out.push_back(std::move(b));
  }
  Bin rest{n * interval, std::max(elapsed, n * interval), {}};
  bool any = false;
  for (const Source& s : src) {
    double sampled = 0;
    for (double v : s.bytes) sampled += v;
    rest.bytes.push_back(std::max(0.0, s.total - sampled));
    any |= rest.bytes.back() > 0;
  }
  if (!any) return out;
  // A sliver after the last sample would draw a spike: fold it into that sample.
  if (!out.empty() && rest.t1 - rest.t0 < interval / 4) {
    out.back().t1 = rest.t1;
    for (size_t k = 0; k < src.size(); ++k) out.back().bytes[k] += rest.bytes[k];
  } else if (rest.t1 > rest.t0) {
    out.push_back(std::move(rest));
  }
  return out;
}

std::vector<Source> sources(const pt::ptree& t) {
  std::vector<Source> out;
  std::vector<double> tier_totals;
  if (auto c = t.get_child_optional("totals." + pkey(c_tier_bytes)))
    for (auto& kv : *c) tier_totals.push_back(kv.second.get_value<double>(0));
  size_t tier = 0;
  if (auto list = t.get_child_optional("series.served"))
    for (auto& kv : *list) {
      Source s{kv.second.get<std::string>("name", "?"), kv.second.get<std::string>("kind", ""), {}};
      if (auto b = kv.second.get_child_optional("bytes"))
        for (auto& x : *b) s.bytes.push_back(x.second.get_value<double>(0));
      if (s.kind == "tier")
        s.total = tier < tier_totals.size() ? tier_totals[tier++] : 0;
      else if (s.kind == "pfs")
        s.total = t.get<double>("totals." + pkey(c_pfs_served_bytes), 0) +
                  t.get<double>("totals." + pkey(c_mem_bytes), 0);
      else
        s.total = t.get<double>("totals." + skey(s_pfs_bytes), 0);
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

// "compute-bound (C 468.0 MiB/s, B2 91.8 MiB/s, 100.0% cached, 80.4% needed)"
std::string verdict_words(const Verdict& v) {
  std::string s = v.bound == "undecided" ? v.bound : v.bound + "-bound";
  std::string f;
  if (v.C > 0) f += "C " + rate(v.C);
  if (v.B2 > 0) f += (f.empty() ? "" : ", ") + std::string("B2 ") + rate(v.B2);
  f += (f.empty() ? "" : ", ") + pct(v.h, 1) + " cached";
  if (v.h_needed >= 0) f += ", " + pct(v.h_needed, 1) + " needed";
  return s + " (" + f + ")";
}

std::string num(double v) {
  return fmt("%.1f", v);
}

}  // namespace

std::string report_svg(const std::string& json) {
  Parsed p = parse(json);
  Figures fig = figures(json);
  const pt::ptree& t = p.stats;
  double interval = std::max(1.0, t.get<double>("series.interval_s", 1));
  std::vector<Source> src = sources(t);
  std::vector<Bin> bin = bins(src, interval, fig.elapsed_s);
  double duration = std::max(bin.empty() ? 0.0 : bin.back().t1, fig.elapsed_s);
  if (duration <= 0) duration = 1;

  // Stacked: tiers, then the PFS; the stager's copies as a line of their own.
  double ymax = 0;
  for (const Bin& b : bin) {
    double top = 0, w = b.t1 - b.t0;
    for (size_t k = 0; k < src.size(); ++k) {
      if (src[k].kind != "copy") top += b.bytes[k] / w;
      ymax = std::max(ymax, src[k].kind == "copy" ? b.bytes[k] / w : top);
    }
  }
  // Ticks at round numbers of the unit (B, KiB, MiB, GiB per second) that fits.
  double unit = 1;
  while (ymax / unit >= 1024 && unit < double(1ull << 40)) unit *= 1024;
  double ystep = unit * tick_step(ymax / unit, 5);
  double ytop = ystep * std::ceil(std::max(ymax, 1.0) / ystep);
  double xstep = tick_step(duration, 8);
  auto X = [&](double s) { return num(kLeft + kPlotW * std::min(s, duration) / duration); };
  auto Y = [&](double v) { return num(kTop + kPlotH * (1 - v / ytop)); };
  auto Yf = [&](double f) { return num(kTop + kPlotH * (1 - std::clamp(f, 0.0, 1.0))); };

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
    << "\" viewBox=\"0 0 " << kW << " " << kH << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<title>Monarch report: job " << esc(fig.job) << "</title>\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kLeft << "\" y=\"26\" font-size=\"17\" font-weight=\"bold\">Monarch: job "
    << esc(fig.job) << (fig.host.empty() ? "" : " on " + esc(fig.host))
    << (fig.complete ? "" : " (incomplete statistics: the stager was killed)") << "</text>\n"
    << "<text x=\"" << kLeft << "\" y=\"46\" fill=\"#444\">dataset " << esc(fig.dataset) << ": "
    << human_bytes(fig.dataset_bytes) << " in " << count(fig.files) << " files; "
    << pct(fig.total.local_bytes, fig.total.bytes) << " of the bytes read came from node-local "
    << "tiers; PFS traffic avoided: " << pct(fig.total.bytes - fig.total.pfs_bytes, fig.total.bytes)
    << " of bytes, " << pct(fig.total.opens - fig.total.pfs_opens, fig.total.opens)
    << " of opens</text>\n"
    << "<text x=\"" << kLeft
    << "\" y=\"64\" fill=\"#444\">verdict: " << esc(verdict_words(fig.verdict)) << "</text>\n";

  // Grid and axes.
  for (double y = 0; y <= ytop * (1 + 1e-9); y += ystep)
    o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + kPlotW << "\" y1=\"" << Y(y) << "\" y2=\""
      << Y(y) << "\" stroke=\"#ddd\"/><text x=\"" << kLeft - 8 << "\" y=\"" << Y(y)
      << "\" dy=\"4\" text-anchor=\"end\">" << esc(human_bytes(y)) << "/s</text>\n";
  for (double x = 0; x <= duration * (1 + 1e-9); x += xstep)
    o << "<text x=\"" << X(x) << "\" y=\"" << kTop + kPlotH + 18 << "\" text-anchor=\"middle\">"
      << fmt(xstep < 1 ? "%.1f" : "%.0f", x) << "</text>\n";
  for (int pc = 0; pc <= 100; pc += 25)
    o << "<text x=\"" << kLeft + kPlotW + 8 << "\" y=\"" << Yf(pc / 100.0) << "\" dy=\"4\" fill=\""
      << kCachedColor << "\">" << pc << "%</text>\n";
  o << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kH - 46
    << "\" text-anchor=\"middle\">time since the stager started (s)</text>\n"
    << "<text transform=\"translate(18," << kTop + kPlotH / 2
    << ") rotate(-90)\" text-anchor=\"middle\">bytes per second (areas: read by the job)</text>\n"
    << "<text transform=\"translate(" << kW - 14 << "," << kTop + kPlotH / 2
    << ") rotate(90)\" text-anchor=\"middle\" fill=\"" << kCachedColor
    << "\">dataset cached on node-local tiers</text>\n";

  // Stacked areas, one per source, from the bottom.
  std::vector<double> base(bin.size(), 0);
  int tier = 0;
  struct Key {
    std::string color, label;
    const char* line;  // nullptr: an area; else the line's dash pattern
  };
  std::vector<Key> legend;
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k].kind == "copy") continue;
    std::string color = src[k].kind == "pfs" ? kPfsColor : kTierColors[tier++ % 4];
    std::ostringstream pts;
    for (size_t i = 0; i < bin.size(); ++i) {
      double top = base[i] + bin[i].bytes[k] / (bin[i].t1 - bin[i].t0);
      pts << X(bin[i].t0) << "," << Y(top) << " " << X(bin[i].t1) << "," << Y(top) << " ";
    }
    for (size_t i = bin.size(); i-- > 0;)
      pts << X(bin[i].t1) << "," << Y(base[i]) << " " << X(bin[i].t0) << "," << Y(base[i]) << " ";
    for (size_t i = 0; i < bin.size(); ++i) base[i] += bin[i].bytes[k] / (bin[i].t1 - bin[i].t0);
    if (!bin.empty())
      o << "<polygon points=\"" << pts.str() << "\" fill=\"" << color
        << "\" fill-opacity=\"0.85\"/>\n";
    legend.push_back(
        {color, src[k].kind == "pfs" ? "from the PFS" : "from tier " + src[k].name, nullptr});
  }
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k].kind != "copy" || bin.empty()) continue;
    o << "<polyline fill=\"none\" stroke=\"" << kCopyColor
      << "\" stroke-width=\"2\" stroke-dasharray=\"6,3\" points=\"";
    for (const Bin& b : bin)
      o << X(b.t0) << "," << Y(b.bytes[k] / (b.t1 - b.t0)) << " " << X(b.t1) << ","
        << Y(b.bytes[k] / (b.t1 - b.t0)) << " ";
    o << "\"/>\n";
    legend.push_back({kCopyColor, "read from the PFS by the stager (copies)", "6,3"});
  }
  // The cached fraction: from what an earlier stager left, through the
  // samples (bytes of complete copies), to the cached bytes at the end.
  if (fig.dataset_bytes > 0) {
    double S = fig.dataset_bytes;
    std::vector<double> used;
    if (auto list = t.get_child_optional("series.cached"))
      for (auto& kv : *list)
        if (auto b = kv.second.get_child_optional("bytes")) {
          size_t i = 0;
          for (auto& x : *b) {
            if (used.size() <= i) used.push_back(0);
            used[i++] += x.second.get_value<double>(0);
          }
        }
    o << "<polyline fill=\"none\" stroke=\"" << kCachedColor << "\" stroke-width=\"2.5\" points=\""
      << X(0) << "," << Yf(t.get<double>("totals." + skey(s_adopted_bytes), 0) / S) << " ";
    for (size_t i = 0; i < used.size(); ++i)
      o << X((i + 1) * interval) << "," << Yf(used[i] / S) << " ";
    o << X(duration) << "," << Yf(fig.cached_bytes / S) << "\"/>\n";
    legend.push_back({kCachedColor, "cached fraction (right axis)", "none"});
  }
  // Epoch boundaries, and each epoch's label over its span, in the first
  // of three rows where it does not overlap an earlier label.
  double row_end[3] = {-1e9, -1e9, -1e9};
  for (const EpochFigures& e : fig.epochs) {
    double end = e.start_s + e.seconds;
    if (e.complete)
      o << "<line x1=\"" << X(end) << "\" x2=\"" << X(end) << "\" y1=\"" << kTop << "\" y2=\""
        << kTop + kPlotH << "\" stroke=\"#333\" stroke-dasharray=\"4,4\"><title>end of epoch "
        << e.number << "</title></line>\n";
    std::string label = "epoch " + std::to_string(e.number) + (e.complete ? "" : " (partial)") +
                        ": " + pct(e.traffic.local_bytes, e.traffic.bytes) + " local";
    double mid = kLeft + kPlotW * (e.start_s + e.seconds / 2) / duration, half = 3.3 * label.size();
    mid = std::clamp(mid, kLeft + half, kLeft + kPlotW - half);
    int row = 0;
    while (row < 2 && row_end[row] > mid - half) ++row;
    row_end[row] = mid + half + 6;
    o << "<text x=\"" << num(mid) << "\" y=\"" << kTop + 14 + 14 * row
      << "\" text-anchor=\"middle\" fill=\"#333\">" << esc(label) << "</text>\n";
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kPlotW << "\" height=\""
    << kPlotH << "\" fill=\"none\" stroke=\"#333\"/>\n";
  if (bin.empty())
    o << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kTop + kPlotH / 2
      << "\" text-anchor=\"middle\" fill=\"#888\">nothing was read</text>\n";
  double lx = kLeft;
  for (const Key& k : legend) {
    if (k.line)
      o << "<line x1=\"" << lx << "\" x2=\"" << lx + 16 << "\" y1=\"" << kH - 20 << "\" y2=\""
        << kH - 20 << "\" stroke=\"" << k.color << "\" stroke-width=\"3\" stroke-dasharray=\""
        << k.line << "\"/>";
    else
      o << "<rect x=\"" << lx << "\" y=\"" << kH - 25 << "\" width=\"16\" height=\"10\" fill=\""
        << k.color << "\"/>";
    o << "<text x=\"" << lx + 20 << "\" y=\"" << kH - 16 << "\">" << esc(k.label) << "</text>\n";
    lx += 34 + 6.6 * k.label.size();
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace monarch
