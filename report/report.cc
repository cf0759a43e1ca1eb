#include "report/report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "record/journal.h"
#include "record/provenance.h"
#include "record/run_dir.h"
#include "record/status.h"
#include "report/svg.h"
#include "workflow/candidates.h"

namespace msaflow::report {

using record::kProvenanceFormat;
using record::ParseJournalTime;
using record::StatusOf;

using nlohmann::json;
using svg::Escape;

namespace {

constexpr double kWidth = 760, kLeft = 70, kRight = 740, kTop = 20;

struct Mark {
  int round;
  std::string id, backbone, head, model;
  double accuracy;
  std::optional<double> test;
  json curve;
};

struct Bar {
  std::string task, step, module;
  int ranks;
  double start, seconds;
  std::string hosts, how;
  uint64_t put, got;
};

// What the report needs from provenance.json, read with every field checked.
struct Story {
  std::vector<Mark> marks;  // each candidate in the round that trained it
  std::vector<Bar> bars;    // tasks with a start time, start relative to the first
  size_t untimed = 0;       // tasks without one (done before a resume that did not record it)
  std::vector<double> best_so_far;  // per round
  std::string champion;
  json confusion;
};

Story ReadStory(const json& prov) {
  if (!prov.is_object() || prov.value("format", "") != kProvenanceFormat)
    Throw(ErrorKind::kCorrupt, std::string("provenance.json: expected format ") + kProvenanceFormat);
  Story s;
  try {
    double best = -1, t0 = INFINITY;
    for (const json& r : prov.at("rounds")) {
      const int round = r.at("round").get<int>();
      for (const json& c : r.at("candidates")) {
        if (c.at("round").get<int>() != round) {  // a kept candidate, marked where it was trained
          // ... whose test figure may come later: a halving round that held the test split back
          // (docs/search.md) leaves it to the select that ranks the model again.
          if (c.contains("test_accuracy"))
            for (Mark& m : s.marks)
              if (m.id == c.at("candidate").get<std::string>() && !m.test) m.test = c["test_accuracy"].get<double>();
          continue;
        }
        Mark m{round, c.at("candidate"), c.at("backbone"), c.at("head"), c.value("model", ""),
               c.at("accuracy").is_number() ? c["accuracy"].get<double>() : std::nan(""), std::nullopt,
               c.value("curve", json())};
        if (c.contains("test_accuracy")) m.test = c["test_accuracy"].get<double>();
        if (m.accuracy == m.accuracy) best = std::max(best, m.accuracy);
        s.marks.push_back(std::move(m));
      }
      s.best_so_far.push_back(best);
      for (const json& t : r.at("tasks")) {
        const double start = ParseJournalTime(t.value("started", ""));
        if (!(start == start) || !t.contains("seconds")) {
          ++s.untimed;
          continue;
        }
        std::string hosts;
        for (const json& h : t.value("hosts", json::array())) hosts += (hosts.empty() ? "" : ",") + h.get<std::string>();
        s.bars.push_back({t.at("task"), t.at("step"), t.at("module"), t.value("ranks", 1), start,
                          t.at("seconds").get<double>(), hosts, t.value("how", ""),
                          t.value("nam_bytes", json::object()).value("put", uint64_t{0}),
                          t.value("nam_bytes", json::object()).value("got", uint64_t{0})});
        t0 = std::min(t0, start);
      }
    }
    for (Bar& b : s.bars) b.start -= t0;
    s.champion = prov.at("champion").at("candidate");
    s.confusion = prov.at("champion").value("confusion", json());
  } catch (const json::exception& e) {
    Throw(ErrorKind::kCorrupt, std::string("provenance.json: ") + e.what());
  }
  return s;
}

std::string Bytes(uint64_t b) {
  if (b >= (1u << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= (1u << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1 << 10));
  return fmt::format("{} B", b);
}

std::map<std::string, size_t> BackboneColours(const Story& s) {
  std::map<std::string, size_t> c;
  for (const Mark& m : s.marks) c.emplace(m.backbone, c.size());
  return c;
}

std::string Legend(const std::map<std::string, size_t>& colours, double y) {
  std::string out = "<g class=\"legend\">";
  double x = kLeft;
  std::vector<std::pair<size_t, std::string>> order;
  order.reserve(colours.size());
  for (const auto& [name, i] : colours) order.emplace_back(i, name);
  std::sort(order.begin(), order.end());
  for (const auto& [i, name] : order) {
    out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="10" height="10" fill="{}"/>)"
                       R"(<text x="{:.1f}" y="{:.1f}">{}</text>)",
                       x, y - 9, svg::Colour(i), x + 14, y, Escape(name));
    x += 24 + 7.5 * static_cast<double>(name.size());
  }
  return out + "</g>";
}

// Every candidate's accuracy on the selection split, in the round that trained it, and the
// best so far.
std::string AccuracyPlot(const Story& s, const std::string& split) {
  const double h = 320, bottom = h - 50;
  const int rounds = static_cast<int>(s.best_so_far.size());
  double lo = 1, hi = 0;
  for (const Mark& m : s.marks)
    if (m.accuracy == m.accuracy) lo = std::min(lo, m.accuracy), hi = std::max(hi, m.accuracy);
  if (lo > hi) lo = 0, hi = 1;
  lo = std::max(0.0, lo - 0.02), hi = std::min(1.0, hi + 0.02);
  const svg::Scale sx{0.5, rounds + 0.5, kLeft, kRight}, sy{lo, hi, bottom, kTop};
  std::vector<double> xt;
  for (int r = 1; r <= rounds; ++r) xt.push_back(r);
  std::string out = fmt::format(R"(<svg id="accuracy-plot" width="{}" height="{}" viewBox="0 0 {} {}" role="img">)",
                                kWidth, h, kWidth, h);
  out += svg::Axes(sx, xt, "round", sy, svg::Ticks(lo, hi, 6), split + " accuracy");
  const auto colours = BackboneColours(s);
  std::map<int, std::vector<const Mark*>> by_round;
  for (const Mark& m : s.marks) by_round[m.round].push_back(&m);
  for (const auto& [round, ms] : by_round)
    for (size_t i = 0; i < ms.size(); ++i) {
      const Mark& m = *ms[i];
      const double spread = ms.size() > 1 ? -0.3 + 0.6 * static_cast<double>(i) / static_cast<double>(ms.size() - 1) : 0;
      const double y = m.accuracy == m.accuracy ? sy(m.accuracy) : bottom;
      const bool champ = m.id == s.champion;
      out += fmt::format(
          R"(<circle class="mark{}" data-round="{}" data-candidate="{}" cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}">)"
          R"(<title>{} (round {}): {} on {}; {} accuracy {:.4f}{}</title></circle>)",
          champ ? " champion" : "", round, Escape(m.id), sx(round + spread), y, champ ? 7 : 5,
          svg::Colour(colours.at(m.backbone)), Escape(m.id), round, Escape(m.head), Escape(m.backbone), Escape(split),
          m.accuracy, m.test ? fmt::format(", test {:.4f}", *m.test) : "");
    }
  std::vector<double> xs, ys;
  for (int r = 1; r <= rounds; ++r) {
    if (s.best_so_far[r - 1] < 0) continue;
    xs.insert(xs.end(), {r - 0.45, r + 0.45});
    ys.insert(ys.end(), 2, s.best_so_far[r - 1]);
  }
  out += fmt::format(R"(<polyline class="best-so-far" points="{}"><title>best so far</title></polyline>)",
                     svg::Points(xs, ys, sx, sy));
  out += Legend(colours, h - 6);
  return out + "</svg>";
}

// The tasks as bars in time, a lane per module.
std::string Gantt(const Story& s) {
  std::vector<std::string> lanes;
  double end = 0;
  for (const Bar& b : s.bars) {
    if (std::find(lanes.begin(), lanes.end(), b.module) == lanes.end()) lanes.push_back(b.module);
    end = std::max(end, b.start + b.seconds);
  }
  const double lane_h = 34, h = kTop + lane_h * static_cast<double>(lanes.size()) + 70, bottom = h - 70;
  const double left = 90;
  const svg::Scale sx{0, std::max(end, 1e-3), left, kRight};
  std::string out = fmt::format(R"(<svg id="gantt" width="{}" height="{}" viewBox="0 0 {} {}" role="img">)", kWidth, h,
                                kWidth, h);
  const auto xt = svg::Ticks(0, end, 8);
  out += fmt::format(R"(<g class="axes"><line x1="{0}" y1="{1}" x2="{2}" y2="{1}"/>)", left, bottom, kRight);
  const double step = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double v : xt)
    out += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}"/><text x="{0:.1f}" y="{3}" )"
                       R"(text-anchor="middle">{4}</text>)",
                       sx(v), kTop, bottom, bottom + 16, Escape(svg::TickLabel(v, step)));
  out += fmt::format(R"(<text class="label" x="{}" y="{}" text-anchor="middle">seconds since the first task</text></g>)",
                     (left + kRight) / 2, bottom + 34);
  std::map<std::string, size_t> step_colour;
  for (const Bar& b : s.bars) step_colour.emplace(b.step, step_colour.size());
  for (size_t i = 0; i < lanes.size(); ++i)
    out += fmt::format(R"(<text class="lane" x="{}" y="{:.1f}" text-anchor="end">{}</text>)", left - 8,
                       kTop + lane_h * (static_cast<double>(i) + 0.5) + 4, Escape(lanes[i]));
  for (const Bar& b : s.bars) {
    const size_t lane = static_cast<size_t>(std::find(lanes.begin(), lanes.end(), b.module) - lanes.begin());
    const double x = sx(b.start), w = std::max(1.0, sx(b.start + b.seconds) - x);
    out += fmt::format(
        R"(<rect class="task" data-task="{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}">)"
        R"(<title>{}: {} on {} ({} rank{}{}), {:.2f} s from {:.2f} s; NAM put {}, got {}{}</title></rect>)",
        Escape(b.task), x, kTop + lane_h * static_cast<double>(lane) + 5, w, lane_h - 10,
        svg::Colour(step_colour.at(b.step)), Escape(b.task), Escape(b.step), Escape(b.module), b.ranks,
        b.ranks == 1 ? "" : "s", b.hosts.empty() ? "" : " on " + Escape(b.hosts), b.seconds, b.start, Bytes(b.put),
        Bytes(b.got), b.how == "ran" ? "" : "; " + Escape(b.how));
  }
  out += Legend(step_colour, h - 6);
  return out + "</svg>";
}

// The epoch of each point of a curve with a "loss" list: its "epoch" list when it has a valid one
// (a long training's curve keeps every k-th epoch), else 1, 2, ... (older msaflow).
std::vector<size_t> CurveEpochs(const json& curve) {
  const size_t n = curve["loss"].size();
  std::vector<size_t> at;
  if (const json e = curve.value("epoch", json()); e.is_array() && e.size() == n) {
    for (const json& v : e) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1000000 ||
          static_cast<size_t>(v.get<int64_t>()) <= (at.empty() ? 0 : at.back()))
        break;
      at.push_back(static_cast<size_t>(v.get<int64_t>()));
    }
  }
  if (at.size() != n || n == 0) {  // none, or not ascending epochs: by position
    at.resize(std::max<size_t>(n, 1));
    for (size_t i = 0; i < at.size(); ++i) at[i] = i + 1;
  }
  return at;
}

// Each candidate's training loss per epoch (the champion drawn thick).
std::string Curves(const Story& s) {
  const double h = 300, bottom = h - 50;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  size_t epochs = 1;
  for (const Mark& m : s.marks) {
    if (!m.curve.is_object() || !m.curve.contains("loss") || !m.curve["loss"].is_array()) continue;
    epochs = std::max(epochs, CurveEpochs(m.curve).back());
    for (const json& v : m.curve["loss"])
      if (v.is_number()) lo = std::min(lo, v.get<double>()), hi = std::max(hi, v.get<double>());
  }
  if (!(lo <= hi)) return "<p>No training curves were recorded.</p>";
  lo = std::max(0.0, lo - 0.05 * (hi - lo)), hi += 0.05 * (hi - lo);
  const svg::Scale sx{1, static_cast<double>(epochs), kLeft, kRight}, sy{lo, hi, bottom, kTop};
  std::string out = fmt::format(R"(<svg id="curves" width="{}" height="{}" viewBox="0 0 {} {}" role="img">)", kWidth, h,
                                kWidth, h);
  out += svg::Axes(sx, svg::Ticks(1, static_cast<double>(epochs), std::min<int>(10, static_cast<int>(epochs))), "epoch",
                   sy, svg::Ticks(lo, hi, 6), "training loss");
  const auto colours = BackboneColours(s);
  for (const Mark& m : s.marks) {
    if (!m.curve.is_object() || !m.curve.contains("loss") || !m.curve["loss"].is_array()) continue;
    std::vector<double> xs, ys;
    const std::vector<size_t> at = CurveEpochs(m.curve);
    for (size_t i = 0; i < m.curve["loss"].size(); ++i)
      if (const json& v = m.curve["loss"][i]; v.is_number())
        xs.push_back(static_cast<double>(at[i])), ys.push_back(v.get<double>());
    out += fmt::format(R"(<polyline class="curve{}" data-candidate="{}" stroke="{}" points="{}"><title>{} (round {}): )"
                       R"({} on {}; final loss {:.4f}</title></polyline>)",
                       m.id == s.champion ? " champion" : "", Escape(m.id), svg::Colour(colours.at(m.backbone)),
                       svg::Points(xs, ys, sx, sy), Escape(m.id), m.round, Escape(m.head), Escape(m.backbone),
                       ys.empty() ? 0.0 : ys.back());
  }
  out += Legend(colours, h - 6);
  return out + "</svg>";
}

// The champion's confusion matrix: a cell per (true, predicted) class, shaded by the row's share.
std::string Confusion(const json& c) {
  if (!c.is_object() || !c.contains("matrix")) return "<p>The champion's result holds no confusion matrix.</p>";
  const json& m = c["matrix"];
  const size_t k = m.size();
  const double cell = std::clamp(480.0 / static_cast<double>(std::max<size_t>(k, 1)), 6.0, 48.0);
  const double left = 80, top = 40, size = cell * static_cast<double>(k);
  std::string out = fmt::format(R"(<svg id="confusion" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}" )"
                                R"(role="img">)",
                                left + size + 20, top + size + 20, left + size + 20, top + size + 20);
  out += fmt::format(R"(<text class="label" x="{:.1f}" y="14" text-anchor="middle">predicted class</text>)",
                     left + size / 2);
  out += fmt::format(R"~(<text class="label" x="14" y="{0:.1f}" text-anchor="middle" transform="rotate(-90 14 {0:.1f})">)~"
                     R"(true class</text>)",
                     top + size / 2);
  const bool labels = cell >= 14;
  // The classes' names (index when a result has none), cut to fit the margin; the full name is
  // in each cell's title.
  std::vector<std::string> names;
  for (size_t t = 0; t < k; ++t) {
    const json& n = c.contains("class_names") && c["class_names"].is_array() && t < c["class_names"].size()
                        ? c["class_names"][t]
                        : json();
    names.push_back(n.is_string() ? n.get<std::string>() : std::to_string(t));
  }
  auto shortName = [](const std::string& n) { return n.size() <= 10 ? n : Printable(n, 9, true); };
  for (size_t t = 0; t < k; ++t) {
    double row = 0;
    for (const json& v : m[t]) row += v.get<double>();
    if (labels)
      out += fmt::format(R"(<text class="class" x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text><text class="class" )"
                         R"(x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)",
                         left - 6, top + cell * (static_cast<double>(t) + 0.5) + 4, Escape(shortName(names[t])),
                         left + cell * (static_cast<double>(t) + 0.5), top - 6, Escape(shortName(names[t])));
    for (size_t p = 0; p < m[t].size() && p < k; ++p) {
      const double n = m[t][p].get<double>(), share = row > 0 ? n / row : 0;
      out += fmt::format(R"(<rect class="cell" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" )"
                         R"~(fill="rgba(78,121,167,{:.3f})"><title>true {}, predicted {}: {:.0f} ({:.1f} % of class {})</title></rect>)~",
                         left + cell * static_cast<double>(p), top + cell * static_cast<double>(t), cell, cell,
                         0.05 + 0.95 * share, Escape(names[t]), Escape(names[p]), n, 100 * share, Escape(names[t]));
      if (labels && n > 0)
        out += fmt::format(R"(<text class="count{}" x="{:.1f}" y="{:.1f}" text-anchor="middle">{:.0f}</text>)",
                           share > 0.5 ? " dark" : "", left + cell * (static_cast<double>(p) + 0.5),
                           top + cell * (static_cast<double>(t) + 0.5) + 4, n);
    }
  }
  return out + "</svg>";
}

// The champion per class, from the confusion matrix's rows: images, accuracy, and the class it
// is most often taken for.
std::string PerClassTable(const json& c) {
  if (!c.is_object() || !c.contains("matrix") || !c.contains("class_names")) return "";
  const json& m = c["matrix"];
  const json& names = c["class_names"];
  std::string out = "<table id=\"per-class\"><tr><th>class</th><th>name</th><th>images</th><th>accuracy</th>"
                    "<th>most often taken for</th></tr>";
  for (size_t t = 0; t < m.size() && t < names.size(); ++t) {
    double row = 0, worst = 0;
    size_t worst_p = t;
    for (size_t p = 0; p < m[t].size(); ++p) {
      const double n = m[t][p].get<double>();
      row += n;
      if (p != t && n > worst) worst = n, worst_p = p;
    }
    const double acc = row > 0 ? m[t][t].get<double>() / row : 0;
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.0f}</td><td>{:.4f}</td><td>{}</td></tr>", t,
                       Escape(names[t].get<std::string>()), row, acc,
                       worst_p == t ? std::string("—")
                                    : fmt::format("{} ({:.0f})", Escape(names[worst_p].get<std::string>()), worst));
  }
  return out + "</table>";
}

std::string CandidateTable(const Story& s, const std::string& split) {
  std::string out = fmt::format("<table><tr><th>round</th><th>candidate</th><th>backbone</th><th>head</th>"
                                "<th>{} acc.</th><th>test acc.</th></tr>",
                                Escape(split));
  for (const Mark& m : s.marks)
    out += fmt::format("<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4f}</td><td>{}</td></tr>",
                       m.id == s.champion ? " class=\"champion\"" : "", m.round, Escape(m.id), Escape(m.backbone),
                       Escape(m.head), m.accuracy, m.test ? fmt::format("{:.4f}", *m.test) : "");
  return out + "</table>";
}

std::string TaskTable(const Story& s) {
  std::string out = "<table><tr><th>task</th><th>module</th><th>ranks</th><th>hosts</th><th>start (s)</th>"
                    "<th>seconds</th><th>NAM put</th><th>NAM got</th><th>how</th></tr>";
  for (const Bar& b : s.bars)
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2f}</td><td>{:.2f}</td><td>{}</td>"
                       "<td>{}</td><td>{}</td></tr>",
                       Escape(b.task), Escape(b.module), b.ranks, Escape(b.hosts), b.start, b.seconds, Bytes(b.put),
                       Bytes(b.got), Escape(b.how));
  return out + "</table>";
}

// The halving strategy's rung 0 (the run's results, "halving"): every backbone's estimates and what
// became of it.
std::string Rung0Table(const json& results) {
  if (!results.is_object() || !results.contains("halving")) return "";
  const json& r0 = results["halving"].value("rung0", json::object());
  std::string out = fmt::format(
      "<h2>Rung 0: backbones ranked before training</h2>\n<p>{} of {} training images, ranked by {}; the best "
      "1/{} kept ({:.1f} s).</p>\n<table><tr><th>backbone</th><th>kNN</th><th>LogME</th><th>features</th>"
      "<th>decision</th></tr>",
      r0.value("subset_images", 0), r0.value("train_images", 0), Escape(r0.value("rank_by", "")), r0.value("eta", 0),
      r0.value("seconds", 0.0));
  for (const json& b : r0.value("backbones", json::array()))
    out += fmt::format("<tr><td>{}</td><td>{:.3f}</td><td>{:.4f}</td><td>{}</td><td>{}</td></tr>",
                       Escape(b.value("backbone", "")), b.value("knn", 0.0), b.value("logme", 0.0), b.value("dim", 0),
                       Escape(b.value("why", "")));
  out += "</table>\n";
  // The rounds after it: the backbones still in the race, on how much of the training data.
  std::string rows;
  for (const json& r : results.value("rounds", json::array())) {
    if (!r.contains("halving")) continue;
    const json& h = r["halving"];
    std::vector<std::string> names;
    for (const json& b : h.value("backbones", json::array()))
      if (b.is_string()) names.push_back(Escape(b.get<std::string>()));
    const double g = h.value("train_fraction", 1.0);
    rows += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", r.value("round", 0), Join(names, ", "),
                        workflow::DataShareText(g));
  }
  if (!rows.empty())
    out += "<h3>The race, round by round</h3>\n<table><tr><th>round</th><th>backbones in the race</th>"
           "<th>training data</th></tr>" + rows + "</table>\n";
  return out;
}

constexpr char kStyle[] = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:820px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
svg text{font:12px system-ui,sans-serif;fill:#333}svg .label{font-size:12px;fill:#555}
.axes line{stroke:#888;stroke-width:1}.axes line.grid{stroke:#e4e4e4}
.mark{stroke:#fff;stroke-width:1}.mark.champion{stroke:#222;stroke-width:2}
.best-so-far{fill:none;stroke:#222;stroke-width:1.5;stroke-dasharray:5 3}
.curve{fill:none;stroke-width:1.2;opacity:.75}.curve.champion{stroke-width:3;opacity:1}
.cell{stroke:#fff}.count{font-size:11px}.count.dark{fill:#fff}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
tr.champion td{font-weight:600}.state{padding:6px 10px;background:#f4f4f4;border-radius:4px}
)";

}  // namespace

namespace {

std::string RenderBody(const ReportInput& in) {
  const Story s = ReadStory(in.provenance);
  const json& p = in.provenance;
  std::string split = "selection";
  if (in.results.is_object() && in.results.contains("result"))
    split = in.results["result"].value("selected_on", split);
  const json& champ = p.at("champion");
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  out += fmt::format("<title>msaflow report: {}</title><style>{}</style></head><body>\n", Escape(p.value("run", "")),
                     kStyle);
  out += fmt::format("<h1>Run {}</h1>\n<p>Pipeline <b>{}</b> on machine <b>{}</b> ({} launcher), NAM {}; {} round(s)"
                     "{}.</p>\n<p class=\"state\">{}</p>\n",
                     Escape(p.value("run", "")), Escape(p.value("pipeline", "")), Escape(p.value("machine", "")),
                     Escape(p.value("launcher", "")), Escape(p.value("nam", "")), s.best_so_far.size(),
                     p.value("resumes", 0) ? fmt::format(", resumed {} time(s)", p.value("resumes", 0)) : "",
                     Escape(in.state));
  out += fmt::format("<p>Champion <b>{}</b>: {} accuracy {:.4f}", Escape(s.champion), Escape(split),
                     champ.value("accuracy", 0.0));
  if (champ.contains("test") && champ["test"].is_object())
    out += fmt::format(", test accuracy {:.4f}", champ["test"].value("accuracy", 0.0));
  if (in.results.is_object()) out += fmt::format(" (stopped: {})", Escape(in.results.value("stop_reason", "")));
  out += ".</p>\n";
  out += Rung0Table(in.results);
  out += "<h2>Accuracy of every candidate per round</h2>\n" + AccuracyPlot(s, split) + "\n";
  out += "<h2>Task times per module</h2>\n" + Gantt(s) + "\n";
  if (s.untimed) out += fmt::format("<p>{} task(s) have no recorded start time and are not drawn.</p>\n", s.untimed);
  out += "<h2>Training curves</h2>\n" + Curves(s) + "\n";
  out += fmt::format("<h2>The champion's confusion matrix{}</h2>\n",
                     s.confusion.is_object() ? " (" + Escape(s.confusion.value("split", "")) + " split)" : "");
  out += Confusion(s.confusion) + "\n" + PerClassTable(s.confusion) + "\n";
  out += "<h2>Candidates</h2>\n" + CandidateTable(s, split) + "\n";
  out += "<h2>Tasks</h2>\n" + TaskTable(s) + "\n";
  out += "</body></html>\n";
  return out;
}

}  // namespace

std::string RenderReport(const ReportInput& in) {
  try {
    return RenderBody(in);
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kCorrupt, std::string("provenance.json or ") + record::kResultsFile + ": " + e.what());
  }
}

std::string WriteReport(const std::string& run_dir, const std::string& out) {
  const std::string prov_path = run_dir + "/provenance.json";
  if (!PathExists(prov_path))
    Throw(ErrorKind::kNotFound, prov_path + ": no such file (no round of the run has ended yet)");
  ReportInput in;
  in.provenance = json::parse(ReadFile(prov_path), nullptr, false);
  if (in.provenance.is_discarded()) Throw(ErrorKind::kCorrupt, prov_path + ": not JSON");
  if (record::HasResults(run_dir)) {
    in.results = json::parse(ReadFile(record::ResultsPath(run_dir)), nullptr, false);
    if (in.results.is_discarded()) Throw(ErrorKind::kCorrupt, record::ResultsPath(run_dir) + ": not JSON");
  }
  in.state = StatusOf(run_dir).line;
  std::string path = out.empty() ? run_dir + "/report.html" : out;
  WriteFileAtomic(path, RenderReport(in));
  return path;
}

}  // namespace msaflow::report
