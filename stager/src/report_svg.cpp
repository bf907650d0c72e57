// The report's picture: one self-contained SVG (no script, no fonts, no
// network) of bytes per second served from each tier and from the PFS over
// time (stacked), the stager's copies from the PFS (dashed line), epoch
// boundaries, and the cached fraction of the dataset on a second axis.
// Laid out for any job length: the time bins and the axis' unit follow the
// job's length, every label is measured (text_width.h) and placed where it
// overlaps no other, and header lines wrap instead of being cut.
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "config.h"
#include "counters.h"
#include "report.h"
#include "report_internal.h"
#include "text_width.h"

namespace monarch {
namespace pt = boost::property_tree;
using namespace report_internal;

namespace {

// Layout, in px. The plot's top follows the header's lines.
constexpr double kW = 1100, kLeft = 110, kRight = 80, kPlotW = kW - kLeft - kRight;
constexpr double kPlotH = 390, kTextW = kW - kLeft - 10;  // header lines: up to 10 px from the edge
constexpr double kTitleSize = 17, kSize = 12, kTitlePitch = 22, kPitch = 17, kRowPitch = 14;
constexpr int kEpochRows = 3;  // rows of epoch labels at the plot's top
constexpr int kMaxBins = 300;  // time bins across the plot: about 3 px each
const char* kTierColors[] = {"#2a9d8f", "#457b9d", "#8ab17d", "#6d597a"};
constexpr const char* kPfsColor = "#e76f51";
constexpr const char* kCopyColor = "#9b2226";
constexpr const char* kCachedColor = "#264653";

struct Source {
  std::string name, kind;  // kind: "tier", "pfs" or "copy", as in series.served
  std::vector<double> bytes;
  double total = 0;  // the same counter in "totals": what the series has not sampled yet
};

// A time bin [t0, t1) with bytes per source.
struct Bin {
  double t0, t1;
  std::vector<double> bytes;
};

// The samples as bins, and the job's last partial interval: the series
// sample whole intervals, the totals come from the same cumulative counters,
// so their difference is exactly what happened after the last sample.
std::vector<Bin> sample_bins(const std::vector<Source>& src, double interval, double elapsed) {
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

// The width of the picture's bins: the sampling interval times 1, 2, 5, 10,
// 20, 50... the least that makes at most kMaxBins over the job. A 5-second
// job keeps its 0.1-s samples; a 10-hour one gets bins of minutes.
double bin_width(double interval, double duration) {
  for (double m = 1;; m *= 10)
    for (double f : {1.0, 2.0, 5.0})
      if (duration / (interval * m * f) <= kMaxBins) return interval * m * f;
}

// The sample bins merged into bins `width` wide (each bin spans what its
// samples span: the last one ends with the job).
std::vector<Bin> merge(const std::vector<Bin>& samples, double width) {
  std::vector<Bin> out;
  long current = -1;
  for (const Bin& s : samples) {
    long j = long(std::floor(s.t0 / width + 1e-9));
    if (j != current) {
      out.push_back({s.t0, s.t1, s.bytes});
      current = j;
      continue;
    }
    out.back().t1 = s.t1;
    for (size_t k = 0; k < s.bytes.size(); ++k) out.back().bytes[k] += s.bytes[k];
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

// "0.5", "2", "2.5": a tick value with the decimals its step needs.
std::string tick_label(double v, double step) {
  int decimals = 0;
  while (decimals < 3 && std::fabs(step * std::pow(10, decimals) -
                                   std::round(step * std::pow(10, decimals))) > 1e-6)
    ++decimals;
  return fmt(("%." + std::to_string(decimals) + "f").c_str(), v);
}

// The time axis' unit for a job this long: seconds, minutes or hours.
struct TimeUnit {
  double seconds;
  const char* name;
};
TimeUnit time_unit(double duration) {
  if (duration >= 3 * 3600) return {3600, "h"};
  if (duration >= 180) return {60, "min"};
  return {1, "s"};
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

// The verdict's pieces: "compute-bound", "C 468.0 MiB/s", "B2 91.8 MiB/s",
// "100.0% cached", "80.4% needed".
std::vector<std::string> verdict_pieces(const Verdict& v) {
  std::vector<std::string> p = {"verdict: " +
                                (v.bound == "undecided" ? v.bound : v.bound + "-bound")};
  if (v.C > 0) p.push_back("C " + rate(v.C));
  if (v.B2 > 0) p.push_back("B2 " + rate(v.B2));
  p.push_back(pct(v.h, 1) + " cached");
  if (v.h_needed >= 0) p.push_back(pct(v.h_needed, 1) + " needed");
  return p;
}

// The words of a sentence, for wrap() (which shortens a piece too long for a line).
std::vector<std::string> words(const std::string& sentence) {
  std::vector<std::string> out;
  std::istringstream in(sentence);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string num(double v) {
  return fmt("%.1f", v);
}

// One line of text at (x, y), escaped.
std::string text(double x, double y, const std::string& s, const std::string& attrs = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + (attrs.empty() ? "" : " " + attrs) +
         ">" + esc(s) + "</text>\n";
}

// Epoch labels, over their epochs, never overlapping. A few epochs get
// "epoch N: X% local" in the first of three rows where it fits, else their
// number; many get one row: epoch 1's label, then the number of every k-th
// epoch, k (1, 2, 5, 10...) leaving room between them; the boundary lines
// all show, with a tooltip.
constexpr size_t kFewEpochs = 12;
struct EpochLabels {
  int rows;
  long every = 1;
  double row_end[kEpochRows] = {-1e9, -1e9, -1e9};

  // `epoch_px`: the plot's width of a typical epoch.
  EpochLabels(size_t epochs, double epoch_px) : rows(epochs <= kFewEpochs ? kEpochRows : 1) {
    if (epochs <= kFewEpochs) return;
    double need = text_width(std::to_string(epochs), kSize) + 12;
    for (long m = 1; every * epoch_px < need; m *= 10)
      for (long f : {1, 2, 5})
        if ((every = m * f) * epoch_px >= need) break;
  }

  // The labels epoch `number` may get, the preferred first.
  std::vector<std::string> choices(const EpochFigures& e) const {
    std::string full = "epoch " + std::to_string(e.number) + (e.complete ? "" : " (partial)") +
                       ": " + pct(e.traffic.local_bytes, e.traffic.bytes) + " local";
    if (rows > 1 || e.number == 1) return {full, std::to_string(e.number)};
    if (e.number % every == 0) return {std::to_string(e.number)};
    return {};
  }

  // The x of a label `w` wide centred near `mid`, and its row; false if none fits.
  bool place(double mid, double w, double& x, int& row) {
    x = std::clamp(mid, kLeft + w / 2 + 2, kLeft + kPlotW - w / 2 - 2);
    for (row = 0; row < rows; ++row)
      if (row_end[row] < x - w / 2) {
        row_end[row] = x + w / 2 + 8;
        return true;
      }
    return false;
  }
};

}  // namespace

std::string report_svg(const std::string& json) {
  Parsed p = parse(json);
  Figures fig = figures(json);
  const pt::ptree& t = p.stats;
  double interval = t.get<double>("series.interval_s", 1);
  if (!(interval > 0)) interval = 1;
  std::vector<Source> src = sources(t);
  std::vector<Bin> samples = sample_bins(src, interval, fig.elapsed_s);
  double duration = std::max(samples.empty() ? 0.0 : samples.back().t1, fig.elapsed_s);
  if (duration <= 0) duration = 1;
  std::vector<Bin> bin = merge(samples, bin_width(interval, duration));

  // The header: the title, what a user wants first, the verdict; wrapped.
  std::vector<std::string> title_pieces = {"Monarch: " + fig.title +
                                           (fig.host.empty() ? "" : " on " + fig.host)};
  if (!fig.complete) title_pieces.push_back("(incomplete statistics: the stager was killed)");
  std::vector<std::string> title = wrap(title_pieces, " ", kTextW, kTitleSize, true);
  std::string dataset = "dataset " + fig.dataset + ": " + human_bytes(fig.dataset_bytes) + " in " +
                        count(fig.files) + " files";
  std::vector<std::string> subtitle =
      fig.used_monarch
          ? wrap({dataset,
                  pct(fig.total.local_bytes, fig.total.bytes) +
                      " of the bytes read came from node-local tiers",
                  "PFS traffic avoided: " +
                      pct(fig.total.bytes - fig.total.pfs_bytes, fig.total.bytes) + " of bytes, " +
                      pct(fig.total.opens - fig.total.pfs_opens, fig.total.opens) + " of opens"},
                 "; ", kTextW, kSize)
          : wrap({dataset}, "; ", kTextW, kSize);
  // A job that did not use Monarch has no verdict: the note, which says why, instead.
  std::vector<std::string> verdict = fig.used_monarch
                                         ? wrap(verdict_pieces(fig.verdict), ", ", kTextW, kSize)
                                         : wrap(words(fig.fallbacks[0].text), " ", kTextW, kSize);
  double y = 26;
  std::ostringstream head;
  for (size_t i = 0; i < title.size(); ++i, y += kTitlePitch)
    head << text(kLeft, y, title[i], "font-size=\"17\" font-weight=\"bold\"");
  y += kPitch - kTitlePitch;
  for (const std::string& line : subtitle)
    head << text(kLeft, y, line, "fill=\"#444\""), y += kPitch;
  for (const std::string& line : verdict)
    head << text(kLeft, y, line, "fill=\"#444\""), y += kPitch;
  const double top = y + 4, bottom = top + kPlotH;

  // Stacked: tiers, then the PFS; the stager's copies as a line of their own.
  double ymax = 0;
  for (const Bin& b : bin) {
    double stack = 0, w = b.t1 - b.t0;
    for (size_t k = 0; k < src.size(); ++k) {
      if (src[k].kind != "copy") stack += b.bytes[k] / w;
      ymax = std::max(ymax, src[k].kind == "copy" ? b.bytes[k] / w : stack);
    }
  }
  // Ticks at round numbers of the unit (B, KiB, MiB, GiB per second) that fits.
  double unit = 1;
  while (ymax / unit >= 1024 && unit < double(1ull << 40)) unit *= 1024;
  double ystep = tick_step(ymax / unit, 5),
         ytop = ystep * std::ceil(std::max(ymax / unit, 1.0) / ystep);
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const char* unit_name = kUnits[int(std::round(std::log2(unit) / 10))];
  TimeUnit tu = time_unit(duration);
  double xstep = tick_step(duration / tu.seconds, 8);
  // Positions of a time (s), a rate (bytes/s) and a fraction; as text for SVG.
  auto xat = [&](double s) { return kLeft + kPlotW * std::min(s, duration) / duration; };
  auto yat = [&](double v) { return bottom - kPlotH * v / (ytop * unit); };
  auto yfrac = [&](double f) { return bottom - kPlotH * std::clamp(f, 0.0, 1.0); };
  auto X = [&](double s) { return num(xat(s)); };
  auto Y = [&](double v) { return num(yat(v)); };
  auto Yf = [&](double f) { return num(yfrac(f)); };
  double height = bottom + 64;  // grows with the legend's rows below

  std::ostringstream o;
  // Grid and axes.
  for (double v = 0; v <= ytop * (1 + 1e-9); v += ystep)
    o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + kPlotW << "\" y1=\"" << Y(v * unit)
      << "\" y2=\"" << Y(v * unit) << "\" stroke=\"#ddd\"/>"
      << text(kLeft - 8, yat(v * unit) + 4, tick_label(v, ystep) + " " + unit_name + "/s",
              "text-anchor=\"end\"");
  for (double x = 0; x <= duration / tu.seconds * (1 + 1e-9); x += xstep)
    o << text(xat(x * tu.seconds), bottom + 22, tick_label(x, xstep), "text-anchor=\"middle\"");
  for (int pc = 0; pc <= 100; pc += 25)
    o << text(kLeft + kPlotW + 8, yfrac(pc / 100.0) + 4, std::to_string(pc) + "%",
              "fill=\"" + std::string(kCachedColor) + "\"");
  o << text(kLeft + kPlotW / 2, bottom + 44,
            std::string("time since the stager started (") + tu.name + ")",
            "text-anchor=\"middle\"")
    << "<text transform=\"translate(16," << num(top + kPlotH / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">bytes per second (areas: read by the job)</text>\n"
    << "<text transform=\"translate(" << kW - 14 << "," << num(top + kPlotH / 2)
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
      double top_i = base[i] + bin[i].bytes[k] / (bin[i].t1 - bin[i].t0);
      pts << X(bin[i].t0) << "," << Y(top_i) << " " << X(bin[i].t1) << "," << Y(top_i) << " ";
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
  // samples (bytes of complete copies) at each bin's end, to the end.
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
    for (const Bin& b : bin) {
      long i = long(std::floor(b.t1 / interval + 1e-9)) - 1;  // the sample ending with the bin
      if (i >= 0 && size_t(i) < used.size()) o << X(b.t1) << "," << Yf(used[i] / S) << " ";
    }
    o << X(duration) << "," << Yf(fig.cached_bytes / S) << "\"/>\n";
    legend.push_back({kCachedColor, "cached fraction (right axis)", "none"});
  }
  // Epoch boundaries, and the labels that fit.
  std::vector<double> lengths;
  for (const EpochFigures& e : fig.epochs) lengths.push_back(e.seconds);
  std::sort(lengths.begin(), lengths.end());
  double typical = lengths.empty() ? duration : lengths[lengths.size() / 2];
  EpochLabels labels(fig.epochs.size(), kPlotW * typical / duration);
  std::string opacity = fig.epochs.size() > kFewEpochs ? "0.45" : "1";
  for (const EpochFigures& e : fig.epochs) {
    double end = e.start_s + e.seconds;
    if (e.complete)
      o << "<line x1=\"" << X(end) << "\" x2=\"" << X(end) << "\" y1=\"" << num(top) << "\" y2=\""
        << num(bottom) << "\" stroke=\"#333\" stroke-opacity=\"" << opacity
        << "\" stroke-dasharray=\"4,4\"><title>end of epoch " << e.number << "</title></line>\n";
    double mid = kLeft + kPlotW * (e.start_s + e.seconds / 2) / duration, x;
    int row;
    for (const std::string& label : labels.choices(e))
      if (labels.place(mid, text_width(label, kSize), x, row)) {
        o << text(x, top + 14 + kRowPitch * row, label,
                  "text-anchor=\"middle\" fill=\"#333\" stroke=\"white\" stroke-width=\"3\" "
                  "paint-order=\"stroke\"");
        break;
      }
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << num(top) << "\" width=\"" << kPlotW << "\" height=\""
    << kPlotH << "\" fill=\"none\" stroke=\"#333\"/>\n";
  if (bin.empty())
    o << text(kLeft + kPlotW / 2, top + kPlotH / 2, "nothing was read",
              "text-anchor=\"middle\" fill=\"#888\"");
  // The legend, in as many rows as it needs.
  double lx = kLeft, ly = bottom + 64;
  for (const Key& k : legend) {
    double w = 20 + text_width(k.label, kSize);
    if (lx > kLeft && lx + w > kW - 10) lx = kLeft, ly += 20;
    if (k.line)
      o << "<line x1=\"" << num(lx) << "\" x2=\"" << num(lx + 16) << "\" y1=\"" << num(ly - 4)
        << "\" y2=\"" << num(ly - 4) << "\" stroke=\"" << k.color
        << "\" stroke-width=\"3\" stroke-dasharray=\"" << k.line << "\"/>";
    else
      o << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly - 9) << "\" width=\"16\" height=\"10\" "
        << "fill=\"" << k.color << "\"/>";
    o << text(lx + 20, ly, k.label);
    lx += w + 18;
    height = ly + 16;
  }

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << num(height)
      << "\" viewBox=\"0 0 " << kW << " " << num(height)
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<title>Monarch report: " << esc(fig.title) << "</title>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << head.str() << o.str() << "</svg>\n";
  return svg.str();
}

}  // namespace monarch
