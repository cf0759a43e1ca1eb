// Step 5 (DAM): the candidates' shard results merged into one result each, then the reduction
// over the round (argmax of the metric, ties by candidate id, top-k). The candidates are dealt
// over the ranks; the champion comes from an MPI_MAXLOC reduction over them (ranked by id, so
// ties go to the smallest id on any number of ranks) and rank 0 gathers the rest for top-k.
// The FPGA backend of a later issue implements the same reduction as an OpenCL kernel.
#include <fmt/core.h>

#include <algorithm>

#include "common/error.h"
#include "kernels/metrics.h"
#include "modules/evaluate.h"
#include "modules/step_context.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

using nlohmann::json;

// One candidate's merged result, written to the NAM.
json MergeCandidate(StepContext& c, const workflow::Candidate& cand) {
  const auto& t = c.task;
  kernels::Metrics total;
  auto parts = c.store->List(workflow::EvalPrefix(t.run, t.round, cand.id));
  if (parts.empty()) Throw(ErrorKind::kNotFound, "select: no evaluation results for candidate " + cand.id);
  for (const auto& part : parts) {
    nam::Object o = c.store->Get(part.name);
    json j = json::parse(o.bytes, nullptr, false);
    total.Merge(MetricsFromJson(j, "NAM object '" + part.name + "'"));
  }
  std::string model = workflow::ModelObject(t.run, t.round, cand.id);
  json res = MetricsJson(total);
  res["candidate"] = workflow::ToJson(cand);
  res["model"] = model;
  res["round"] = t.round;
  res["shards"] = parts.size();
  std::string rname = workflow::ResultObject(t.run, t.round, cand.id);
  c.store->Put(rname, res.dump(), {{"kind", "result"}});
  for (const auto& part : parts) c.store->Remove(part.name);
  return {{"candidate", workflow::ToJson(cand)}, {"model", model}, {"result", rname},
          {"accuracy", total.accuracy()},        {"loss", total.loss()}, {"round", t.round}};
}

json KeptEntry(StepContext& c, const workflow::KeptModel& k) {
  json res = json::parse(c.store->Get(k.result).bytes, nullptr, false);
  if (!res.is_object() || !res.contains("accuracy") || !res.contains("loss") || !res.contains("round"))
    Throw(ErrorKind::kCorrupt, "NAM object '" + k.result + "': not a candidate result");
  return {{"candidate", k.candidate}, {"model", k.model},      {"result", k.result},
          {"accuracy", res["accuracy"]}, {"loss", res["loss"]}, {"round", res["round"]}};
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
  for (size_t i = 0; i < t.candidates.size(); ++i)
    if (static_cast<int>(i % static_cast<size_t>(comm.size())) == comm.rank())
      mine.push_back(MergeCandidate(c, t.candidates[i]));
  if (c.root())
    for (const auto& k : t.kept) mine.push_back(KeptEntry(c, k));
  parallel::ArgMax best_here;
  for (const auto& e : mine) {
    parallel::ArgMax a{e["accuracy"].get<double>(), index_of(e["candidate"]["id"])};
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
  std::vector<kernels::Scored> scores;
  std::map<std::string, json> info;
  for (const auto& p : parts)
    for (const auto& e : json::parse(p)) {
      std::string id = e["candidate"]["id"];
      scores.push_back({id, e["accuracy"]});
      info[id] = e;
    }
  if (scores.empty()) Throw(ErrorKind::kNotFound, "select: no candidates to select from");
  auto top = kernels::SelectTopK(scores, static_cast<size_t>(t.top_k));
  if (champ.index < 0 || sorted[static_cast<size_t>(champ.index)] != top.at(0).candidate)
    Throw(ErrorKind::kInternal, "select: the MPI reduction chose " +
                                    (champ.index < 0 ? std::string("nothing") : sorted[static_cast<size_t>(champ.index)]) +
                                    ", the top-k " + top.at(0).candidate);
  json best = {{"metric", t.metric},
               {"device", "cpu (FPGA simulated)"},
               {"reduction", fmt::format("MPI_MAXLOC over {} rank{}", comm.size(), comm.size() > 1 ? "s" : "")},
               {"champion", info[top.at(0).candidate]},
               {"top_k", json::array()},
               {"all", json::array()}};
  for (const auto& s : top) best["top_k"].push_back(info[s.candidate]);
  for (const auto& s : kernels::SelectTopK(scores, scores.size())) best["all"].push_back(info[s.candidate]);
  c.store->Put(workflow::BestObject(t.run, t.round), best.dump(), {{"kind", "best"}});
  c.Say(fmt::format("champion of round {}: {} accuracy {:.4f} (of {} candidates)", t.round, top[0].candidate,
                    top[0].metric, scores.size()));
  comm.Barrier();
}

}  // namespace msaflow::modules
