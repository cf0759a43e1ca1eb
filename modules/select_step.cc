// Step 5 (DAM): the candidates' shard results merged into one result each, then the reduction
// over the round (argmax of the metric, ties by candidate id, top-k). The candidates are dealt
// over the ranks; the champion comes from an MPI_MAXLOC reduction over them (ranked by id, so
// ties go to the smallest id on any number of ranks) and rank 0 gathers the rest and orders
// them on the task's FPGA backend (kernels/fpga/select.h: select.cl, or the same order in C++);
// the two reductions must agree on the champion.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"
#include "kernels/fpga/select.h"
#include "kernels/metrics.h"
#include "modules/evaluate_step.h"
#include "modules/step_context.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

using nlohmann::json;

// How many shards evaluate wrote per candidate, from its summary (summaries written before
// they said so give it as tasks / candidates). Select merges exactly those: never the shards
// of an earlier evaluate that split the test set otherwise.
int64_t EvaluatedShards(StepContext& c) {
  const auto& t = c.task;
  const std::string name = workflow::EvaluatedObject(t.run, t.round);
  json s = json::parse(c.store->Get(name).bytes, nullptr, false);
  const std::string where = "NAM object '" + name + "'";
  if (s.is_object() && s.contains("shards")) {
    if (!s["shards"].is_number_integer() || s["shards"].get<int64_t>() < 1)
      Throw(ErrorKind::kCorrupt, where + ": 'shards' is not a count of at least 1");
    return s["shards"].get<int64_t>();
  }
  if (!s.is_object() || !s.contains("tasks") || !s["tasks"].is_number_integer() || t.candidates.empty() ||
      s["tasks"].get<int64_t>() % static_cast<int64_t>(t.candidates.size()) != 0)
    Throw(ErrorKind::kCorrupt, where + ": not an evaluate summary of these " + std::to_string(t.candidates.size()) +
                                   " candidates (expected 'shards', or 'tasks' a multiple of them)");
  return s["tasks"].get<int64_t>() / static_cast<int64_t>(t.candidates.size());
}

// One candidate's merged result, written to the NAM. Its shards are removed only once select's
// done object is committed, so a select killed half-way finds them all when it runs again.
json MergeCandidate(StepContext& c, const workflow::Candidate& cand, int64_t shards) {
  const auto& t = c.task;
  kernels::Metrics total, test;
  bool has_test = false;
  std::string split = "test";
  std::vector<std::string> parts, names, test_names;
  for (int64_t shard = 0; shard < shards; ++shard) {
    const std::string& part = parts.emplace_back(workflow::EvalObject(t.run, t.round, cand.id, shard));
    nam::Object o;
    try {
      o = c.store->Get(part);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kNotFound) throw;
      Throw(ErrorKind::kNotFound, "select: no evaluation result for candidate " + cand.id + " (NAM object '" + part +
                                      "', shard " + std::to_string(shard) + " of " + std::to_string(shards) + ")");
    }
    json j = json::parse(o.bytes, nullptr, false);
    const std::string where = "NAM object '" + part + "'";
    total.Merge(MetricsFromJson(j, where));
    if (j.is_object() && j.contains("split") && j["split"].is_string()) split = j["split"];
    names = ClassNamesOf(j);
    if (j.is_object() && j.contains("test")) {
      test.Merge(MetricsFromJson(j["test"], where + " /test"));
      test_names = ClassNamesOf(j["test"]);
      has_test = true;
    }
  }
  std::string model = workflow::ModelObject(t.run, t.round, cand.id);
  json res = MetricsJson(total, names);
  res["split"] = split;  // the metrics candidates are selected on
  if (has_test) res["test"] = MetricsJson(test, test_names);
  res["candidate"] = workflow::ToJson(cand);
  res["model"] = model;
  res["round"] = t.round;
  res["shards"] = parts.size();
  std::string rname = workflow::ResultObject(t.run, t.round, cand.id);
  c.store->Put(rname, res.dump(), {{"kind", "result"}});
  for (const auto& part : parts) c.RemoveOnceDone(part);
  json entry = {{"candidate", workflow::ToJson(cand)}, {"model", model}, {"result", rname},
                {"accuracy", total.accuracy()},        {"loss", total.loss()}, {"round", t.round}, {"split", split},
                {"per_class", res["per_class"]}};
  if (!names.empty()) entry["class_names"] = names;
  if (has_test)
    entry["test"] = {{"accuracy", test.accuracy()}, {"loss", test.loss()}, {"per_class", res["test"]["per_class"]}};
  return entry;
}

json KeptEntry(StepContext& c, const workflow::KeptModel& k) {
  json res = json::parse(c.store->Get(k.result).bytes, nullptr, false);
  if (!res.is_object() || !res.contains("accuracy") || !res.contains("loss") || !res.contains("round"))
    Throw(ErrorKind::kCorrupt, "NAM object '" + k.result + "': not a candidate result");
  json entry = {{"candidate", k.candidate}, {"model", k.model},      {"result", k.result},
                {"accuracy", res["accuracy"]}, {"loss", res["loss"]}, {"round", res["round"]},
                {"split", res.value("split", "test")}};
  if (res.contains("per_class")) entry["per_class"] = res["per_class"];
  if (res.contains("class_names")) entry["class_names"] = res["class_names"];
  json test = res.contains("test") && res["test"].is_object() ? res["test"] : json();
  if (test.is_null() && c.task.test && workflow::SelectionSplit(c.pipeline()) != "test") {
    // Its round held the test split back (a halving round before the last): this one has the
    // test features of its backbone (a model kept in a halving run is on a backbone still in the
    // race), and the model is scored on them here. Nothing is written: a resumed select scores
    // it again, to the same figures.
    const workflow::Candidate cand = workflow::CandidateFromJson(k.candidate);
    test = EvaluateWhole(c, cand, k.model, "test");
    c.Say(fmt::format("kept model {} of round {}: scored on the test split its round held back, accuracy {:.4f}",
                      cand.id, res["round"].dump(), test.value("accuracy", 0.0)));
  }
  if (test.is_object()) {
    entry["test"] = {{"accuracy", test.value("accuracy", 0.0)}, {"loss", test.value("loss", 0.0)}};
    if (test.contains("per_class")) entry["test"]["per_class"] = test["per_class"];
  }
  return entry;
}

}  // namespace

void Select(StepContext& c) {
  const auto& t = c.task;
  parallel::Comm& comm = *c.comm;
  // Every candidate's position in id order: the reduction's index, so ties go to the smallest id.
  std::vector<std::string> ids;
  for (const auto& cand : t.candidates) ids.push_back(cand.id);
  for (const auto& k : t.kept) ids.push_back(k.candidate.value("id", ""));
  std::vector<std::string> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  auto index_of = [&](const std::string& id) {
    return static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), id) - sorted.begin());
  };
  json mine = json::array();
  const int64_t shards = t.candidates.empty() ? 0 : EvaluatedShards(c);
  for (size_t i = 0; i < t.candidates.size(); ++i)
    if (static_cast<int>(i % static_cast<size_t>(comm.size())) == comm.rank())
      mine.push_back(MergeCandidate(c, t.candidates[i], shards));
  if (c.root())
    for (const auto& k : t.kept) mine.push_back(KeptEntry(c, k));
  parallel::ArgMax best_here;
  // A metric that is not a number (NaN is stored as null) stays NaN: the device refuses it.
  auto metric_of = [](const json& e) { return e["accuracy"].is_number() ? e["accuracy"].get<double>() : std::nan(""); };
  for (const auto& e : mine) {
    parallel::ArgMax a{metric_of(e), index_of(e["candidate"]["id"])};
    bool better = best_here.index < 0 || (a.metric > best_here.metric) ||
                  (a.metric == best_here.metric && a.index < best_here.index) ||
                  (best_here.metric != best_here.metric && a.metric == a.metric);
    if (better) best_here = a;
  }
  parallel::ArgMax champ = comm.AllreduceArgMax(best_here);
  auto parts = comm.Gather(mine.dump(), 0);
  if (!c.root()) {
    comm.Barrier();
    return;
  }
  std::vector<kernels::fpga::Scored> scores;
  std::map<std::string, json> info;
  for (const auto& p : parts)
    for (const auto& e : json::parse(p)) {
      std::string id = e["candidate"]["id"];
      scores.push_back({id, metric_of(e)});
      info[id] = e;
    }
  if (scores.empty()) Throw(ErrorKind::kNotFound, "select: no candidates to select from");
  kernels::fpga::Device& fpga = c.Fpga();
  auto t0 = std::chrono::steady_clock::now();
  auto all = kernels::fpga::SelectOrder(fpga, scores);
  const double measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<kernels::fpga::Scored> top(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(
                                                                        std::min<size_t>(all.size(), static_cast<size_t>(t.top_k))));
  if (champ.index < 0 || sorted[static_cast<size_t>(champ.index)] != top.at(0).candidate)
    Throw(ErrorKind::kInternal, "select: the MPI reduction chose " +
                                    (champ.index < 0 ? std::string("nothing") : sorted[static_cast<size_t>(champ.index)]) +
                                    ", the device (" + fpga.Name() + ") " + top.at(0).candidate);
  json report = c.FpgaReport();
  report["candidates"] = all.size();
  report["measured_s"] = measured;
  if (t.fpga.target.given()) {
    auto m = kernels::fpga::ModelSelect(t.fpga.target, static_cast<int64_t>(all.size()));
    report["modelled"] = {{"seconds", m.seconds()}, {"bound", m.bound()}, {"target", t.fpga.target.name},
                          {"note", "modelled from the machine file's target figures, not measured"}};
  }
  json best = {{"metric", t.metric},
               {"device", fpga.Name()},
               {"fpga", report},
               {"reduction", fmt::format("MPI_MAXLOC over {} rank{}", comm.size(), comm.size() > 1 ? "s" : "")},
               {"champion", info[top.at(0).candidate]},
               {"top_k", json::array()},
               {"all", json::array()}};
  for (const auto& s : top) best["top_k"].push_back(info[s.candidate]);
  for (const auto& s : all) best["all"].push_back(info[s.candidate]);
  c.store->Put(workflow::BestObject(t.run, t.round), best.dump(), {{"kind", "best"}});
  c.Say(fmt::format("champion of round {}: {} accuracy {:.4f} (of {} candidates)", t.round, top[0].candidate,
                    top[0].metric, scores.size()));
  comm.Barrier();
}

}  // namespace msaflow::modules
