#include "orchestrator/halving.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"
#include "common/signals.h"
#include "kernels/onnx_graph.h"
#include "launch/launcher.h"
#include "ranking/rank.h"
#include "record/run_dir.h"
#include "workflow/backbones.h"
#include "workflow/candidates.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::orchestrator {

using nlohmann::json;

namespace {

double Estimate(const json& b, const std::string& by) { return b.at(by).get<double>(); }

const char* EstimateName(const std::string& by) { return by == "knn" ? "kNN" : "LogME"; }

// Ranks, decides and explains: the rung0.json document; the kept backbones' subset features
// (those that are what prepare computes) go to `handed`.
json Decide(const workflow::Pipeline& p, std::vector<workflow::SubsetFeatures>* handed) {
  const auto t0 = std::chrono::steady_clock::now();
  ranking::RankOptions o;
  o.fraction = p.rounds.rank_fraction;
  o.seed = p.rounds.seed;
  o.keep_features = true;
  // A signal (a cancel, Ctrl-C) is looked for as each backbone is ranked: rung 0 is the
  // coordinator's own work, which no launcher waits on. It is held back from the computing threads
  // meanwhile (InterruptsHeld says why).
  const InterruptsHeld held;
  ranking::Ranking r = ranking::RankBackbones(
      p, o, [&](const std::string&) { held.ThrowIfInterrupted("during rung 0 (ranking the backbones)"); });
  const std::string by = p.rounds.rank_by;
  json list = json::array();
  for (const auto& b : r.backbones)
    list.push_back({{"backbone", b.backbone}, {"knn", b.knn}, {"logme", b.logme}, {"dim", b.dim},
                    {"seconds", b.features_s + b.estimate_s}});
  const std::string other = by == "knn" ? "logme" : "knn";  // breaks ties (kNN's accuracies often tie)
  std::stable_sort(list.begin(), list.end(), [&](const json& a, const json& b) {
    return Estimate(a, by) != Estimate(b, by) ? Estimate(a, by) > Estimate(b, by) : Estimate(a, other) > Estimate(b, other);
  });
  const size_t eta = static_cast<size_t>(p.rounds.eta);
  const size_t keep = (list.size() + eta - 1) / eta;
  json kept = json::array(), dropped = json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    json& b = list[i];
    b["kept"] = i < keep;
    if (i < keep) {
      kept.push_back(b["backbone"]);
      b["why"] = fmt::format("kept at rung 0: {} {:.3f}, {} of {} (the best {} are kept, eta {})", EstimateName(by),
                             Estimate(b, by), i + 1, list.size(), keep, eta);
    } else {
      dropped.push_back(b["backbone"]);
      b["why"] = fmt::format("dropped at rung 0: {} {:.3f} vs {:.3f} of {} (the best {} of {} are kept, eta {})",
                             EstimateName(by), Estimate(b, by), Estimate(list[keep - 1], by),
                             list[keep - 1]["backbone"].get<std::string>(), keep, list.size(), eta);
    }
  }
  const std::string stamp = ChecksumHex(workflow::SplitStamp(p, "train"));
  for (auto& b : r.backbones) {
    const bool was_kept = std::any_of(kept.begin(), kept.end(), [&](const json& k) { return k == b.backbone; });
    if (!was_kept || b.features.empty() || !b.as_prepared) continue;
    const workflow::BackboneSpec& bb = p.Backbone(b.backbone);
    workflow::SubsetFeatures s;
    s.backbone = b.backbone;
    s.backbone_digest = workflow::BackboneDigestOf(bb, ReadInputFile(bb.onnx, "an ONNX model", kernels::kMaxOnnxBytes), "");
    s.split_stamp = stamp;
    s.dim = b.dim;
    s.rows = r.rows;
    s.values = std::move(b.features);
    handed->push_back(std::move(s));
  }
  return {{"format", kRung0Format}, {"rank_by", by}, {"eta", p.rounds.eta}, {"fraction", o.fraction},
          {"seed", o.seed}, {"train_images", r.train_images}, {"subset_images", r.subset_images},
          {"images_through_backbones", r.subset_images * static_cast<int64_t>(list.size())},
          {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
          {"backbones", list}, {"kept", kept}, {"dropped", dropped}};
}

}  // namespace

json ReadRung0(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kRung0File;
  if (!PathExists(path)) return json();
  json d = json::parse(ReadFile(path), nullptr, false);
  if (!d.is_object() || d.value("format", "") != kRung0Format || !d.contains("kept") || !d["kept"].is_array())
    Throw(ErrorKind::kCorrupt, path + ": not a rung-0 decision (" + kRung0Format + ")");
  return d;
}

Rung0 HalvingRung0(const workflow::Pipeline& p, const std::string& run_dir, const record::JournalWriter& journal,
                   RunObserver& obs) {
  if (p.rounds.strategy != workflow::Strategy::kHalving) return {p, {}};
  std::vector<workflow::SubsetFeatures> handed;
  json d = ReadRung0(run_dir);
  const bool decided = !d.is_null();
  if (!decided) {
    obs.Line(fmt::format("rung 0: ranking {} backbones by {} on {:g}% of each class of the training split",
                         p.backbones.size(), EstimateName(p.rounds.rank_by), 100 * p.rounds.rank_fraction));
    d = Decide(p, &handed);
    WriteFileAtomic(run_dir + "/" + kRung0File, d.dump(2) + "\n");
    journal.Event(record::EventKind::kRung0, {{"kept", d["kept"]},
                                              {"dropped", d["dropped"]},
                                              {"rank_by", d["rank_by"]},
                                              {"subset_images", d["subset_images"]},
                                              {"seconds", d["seconds"]}});
  } else {
    obs.Line("rung 0: decided before the run was resumed (" + run_dir + "/" + kRung0File + ")");
  }
  for (const auto& b : d["backbones"])
    obs.Line(fmt::format("  {:<34} kNN {:.3f}  LogME {:8.4f}  {}", b.value("backbone", ""), b.value("knn", 0.0),
                         b.value("logme", 0.0), b.value("kept", false) ? "kept" : b.value("why", "")));
  std::set<std::string> keep;
  for (const auto& k : d["kept"]) keep.insert(k.get<std::string>());
  for (const auto& k : keep) {
    bool known = false;
    for (const auto& bb : p.backbones) known = known || bb.name == k;
    if (!known)
      Throw(ErrorKind::kCorrupt, run_dir + "/" + kRung0File + ": keeps backbone '" + k + "', which the pipeline lacks");
  }
  return {workflow::KeepBackbones(p, keep), std::move(handed)};
}

std::vector<std::string> HalvingRaceStory(const std::string& run_dir, const std::string& backbone) {
  std::vector<int> in;  // the rounds it was in the race
  std::vector<double> fractions;
  int last_round = 0;
  for (const auto& e : record::ReadJournal(record::JournalPath(run_dir)).events) {
    if (e.kind != record::EventKind::kRoundStart || !e.fields.contains("halving")) continue;
    const int round = e.fields.value("round", 0);
    last_round = std::max(last_round, round);
    const json& h = e.fields["halving"];
    const json names = h.value("backbones", json::array());
    if (std::find(names.begin(), names.end(), backbone) == names.end() || std::count(in.begin(), in.end(), round)) continue;
    in.push_back(round);
    fractions.push_back(h.value("train_fraction", 1.0));
  }
  if (in.empty()) return {};
  std::string data;
  for (size_t i = 0; i < fractions.size(); ++i) data += (i ? ", " : "") + workflow::DataShareText(fractions[i]);
  std::vector<std::string> out;
  out.push_back(fmt::format("in the race in round{} {} (on {} of the training data)", in.size() > 1 ? "s" : "",
                            in.size() > 1 ? fmt::format("{}-{}", in.front(), in.back()) : std::to_string(in.front()),
                            data));
  const int left = in.back();
  if (left == last_round) {
    out.push_back(fmt::format("still in the race in round {}, the last one run", left));
    return out;
  }
  // Why it left: its best head of round `left` against the worst of those the next round continued.
  const json res =
      record::HasResults(run_dir) ? json::parse(ReadFile(record::ResultsPath(run_dir)), nullptr, false) : json();
  if (!res.is_object() || !res.contains("rounds")) {
    out.push_back(fmt::format("left the race after round {}: none of its heads was continued", left));
    return out;
  }
  std::set<std::string> continued;
  std::map<std::string, std::pair<std::string, double>> heads;  // id -> backbone, accuracy
  for (const json& r : res["rounds"]) {
    const std::string prefix = "r" + std::to_string(r.value("round", 0)) + "-";
    for (const json& c : r.value("candidates", json::array())) {
      const json& cand = c.at("candidate");
      const std::string id = cand.value("id", "");
      if (id.rfind(prefix, 0) != 0) continue;  // a kept model of an earlier round, listed again
      heads[id] = {cand.value("backbone", ""), c.value("accuracy", 0.0)};
      if (r.value("round", 0) == left + 1) continued.insert(cand.value("parent", ""));
    }
  }
  const std::string mine_prefix = "r" + std::to_string(left) + "-";
  std::string best;
  double best_acc = -1, cut = 2;
  size_t of = 0;
  for (const auto& [id, h] : heads) {
    if (id.rfind(mine_prefix, 0) != 0) continue;
    ++of;
    if (h.first == backbone && h.second > best_acc) best = id, best_acc = h.second;
    if (continued.count(id)) cut = std::min(cut, h.second);
  }
  if (best.empty() || continued.empty()) {
    out.push_back(fmt::format("left the race after round {}: none of its heads was continued", left));
  } else {
    out.push_back(fmt::format("left the race after round {}: its best head {} had {:.4f}, the best {} of {} heads "
                              "continued had at least {:.4f}", left, best, best_acc, continued.size(), of, cut));
  }
  return out;
}

void PutRung0Features(nam::Store& store, const std::string& run, const std::vector<workflow::SubsetFeatures>& features,
                      RunObserver& obs) {
  for (const auto& s : features) {
    const std::string obj = workflow::Rung0FeaturesObject(run, s.backbone);
    try {
      store.Put(obj, workflow::SubsetFeaturesBody(s), workflow::SubsetFeaturesMeta(s));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kCapacity) throw;
      obs.Line(fmt::format("rung 0: {}'s features of the subset not kept in the NAM ({}): prepare runs those {} images "
                           "through it again", s.backbone, e.what(), s.rows.size()));
    }
  }
}

}  // namespace msaflow::orchestrator
