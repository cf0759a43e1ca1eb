// Step 4 (ESB): every (model x test shard) evaluated; the tasks are dealt over the ranks and
// each result goes to the NAM. The metrics' JSON form is shared with select.
#include <fmt/core.h>

#include <map>

#include "common/error.h"
#include "kernels/head.h"
#include "kernels/metrics.h"
#include "modules/evaluate.h"
#include "modules/features.h"
#include "workflow/objects.h"

namespace msaflow::modules {

nlohmann::json MetricsJson(const kernels::Metrics& m) {
  return {{"count", m.count},         {"correct", m.correct}, {"loss_sum", m.loss_sum}, {"classes", m.classes},
          {"accuracy", m.accuracy()}, {"loss", m.loss()},     {"confusion", m.confusion}};
}

kernels::Metrics MetricsFromJson(const nlohmann::json& j, const std::string& where) {
  kernels::Metrics m;
  try {
    m.count = j.at("count");
    m.correct = j.at("correct");
    m.loss_sum = j.at("loss_sum");
    m.classes = j.at("classes");
    m.confusion = j.at("confusion").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kCorrupt, where + ": not an evaluation result (" + e.what() + ")");
  }
  return m;
}

void Evaluate(StepContext& c) {
  const auto& t = c.task;
  const int64_t shards = t.shards;
  std::map<std::string, Features> cache;
  const int64_t n_tasks = static_cast<int64_t>(t.candidates.size()) * shards;
  int done = 0;
  for (int64_t k = c.comm->rank(); k < n_tasks; k += c.comm->size()) {
    const workflow::Candidate& cand = t.candidates[static_cast<size_t>(k / shards)];
    int64_t shard = k % shards;
    if (!cache.count(cand.backbone)) cache[cand.backbone] = LoadFeatures(c, cand.backbone, "test");
    const Features& f = cache[cand.backbone];
    nam::Object m = c.store->Get(workflow::ModelObject(t.run, t.round, cand.id));
    if (!m.info.meta.contains("in_dim") || !m.info.meta.contains("classes"))
      Throw(ErrorKind::kCorrupt, "NAM object '" + m.info.name + "': model metadata lacks in_dim/classes");
    kernels::Head h = kernels::Head::Deserialize(cand.head, m.info.meta["in_dim"], m.info.meta["classes"], m.bytes);
    if (h.in_dim != f.dim)
      Throw(ErrorKind::kInvalidInput, "model " + m.info.name + " expects " + std::to_string(h.in_dim) +
                                          " features, test features have " + std::to_string(f.dim));
    int64_t lo = f.n * shard / shards, hi = f.n * (shard + 1) / shards;
    auto logits = h.Logits(f.x.data() + lo * f.dim, hi - lo);
    kernels::Metrics met =
        kernels::Evaluate(logits.data(), f.labels.data() + lo, hi - lo, std::max(h.classes, f.classes));
    c.store->Put(workflow::EvalObject(t.run, t.round, cand.id, shard), MetricsJson(met).dump(), {{"kind", "eval-shard"}});
    ++done;
  }
  c.Say(fmt::format("rank {}/{}: evaluated {} (model x shard) tasks of {}", c.comm->rank(), c.comm->size(), done,
                    n_tasks));
  c.comm->Barrier();
}

}  // namespace msaflow::modules
