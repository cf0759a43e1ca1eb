// Step 4 (ESB): every (model x shard) evaluated by a dynamic task farm over the ranks
// (parallel/task_farm.h): each rank pulls the next task when it finishes one, keeps the models
// and features it has read, and commits each result to the NAM; the farm's figures (tasks and
// busy time per rank, utilisation, overhead per task) go to evaluated/<run>/<round>. The
// metrics' JSON form is shared with select. A shard is evaluated on the split the pipeline
// selects on (validation) and, kept apart for the run's reported result, on the test split.
#include "modules/evaluate_step.h"

#include <fmt/core.h>

#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "common/error.h"
#include "kernels/head.h"
#include "kernels/metrics.h"
#include "modules/features.h"
#include "modules/finetune_maps.h"
#include "modules/model_object.h"
#include "modules/straggler.h"
#include "parallel/task_farm.h"
#include "parallel/train_util.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::modules {

nlohmann::json MetricsJson(const kernels::Metrics& m, const std::vector<std::string>& names) {
  nlohmann::json j = {{"count", m.count},         {"correct", m.correct}, {"loss_sum", m.loss_sum}, {"classes", m.classes},
                      {"accuracy", m.accuracy()}, {"loss", m.loss()},     {"confusion", m.confusion}};
  if (!names.empty()) j["class_names"] = names;
  nlohmann::json per_class = nlohmann::json::array();
  const auto k = static_cast<size_t>(m.classes);
  for (size_t t = 0; t < k && m.confusion.size() == k * k; ++t) {
    int64_t images = 0;
    for (size_t p = 0; p < k; ++p) images += m.confusion[t * k + p];
    const int64_t correct = m.confusion[t * k + t];
    per_class.push_back({{"class_index", t},
                         {"class", t < names.size() ? names[t] : std::to_string(t)},
                         {"images", images},
                         {"correct", correct},
                         {"accuracy", images ? static_cast<double>(correct) / static_cast<double>(images) : 0.0}});
  }
  j["per_class"] = std::move(per_class);
  return j;
}

std::vector<std::string> ClassNamesOf(const nlohmann::json& result) {
  std::vector<std::string> names;
  if (!result.is_object() || !result.contains("class_names") || !result["class_names"].is_array()) return names;
  for (const auto& n : result["class_names"])
    if (n.is_string()) names.push_back(n);
  return names;
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

namespace {

// Rank 0: the farm's figures from every rank's, in the NAM (evaluated/) and said.
void WriteFarmSummary(StepContext& c, const std::vector<std::string>& parts, int64_t n_tasks, int64_t shards) {
  const auto& t = c.task;
  parallel::Comm& comm = *c.comm;
  nlohmann::json per_rank = nlohmann::json::array();
  double busy_sum = 0, wall_max = 0;
  int workers = 0;
  for (const auto& p : parts) {
    nlohmann::json r = nlohmann::json::parse(p);
    wall_max = std::max(wall_max, r["wall_s"].get<double>());
    if (r["works"].get<bool>()) {
      busy_sum += r["busy_s"].get<double>();
      ++workers;
    }
    per_rank.push_back(std::move(r));
  }
  const double held = wall_max * workers;
  nlohmann::json summary = {{"farm", t.farm},
                            {"overlap", OverlapModeName(c.overlap)},
                            {"ranks", comm.size()},
                            {"workers", workers},
                            {"tasks", n_tasks},
                            {"shards", shards},  // per candidate: what select merges
                            {"wall_s", wall_max},
                            {"utilisation", held > 0 ? busy_sum / held : 0.0},
                            {"overhead_per_task_ms", n_tasks ? 1e3 * (held - busy_sum) / static_cast<double>(n_tasks) : 0.0},
                            {"per_rank", per_rank}};
  c.store->Put(workflow::EvaluatedObject(t.run, t.round), summary.dump(), {{"kind", "evaluate-summary"}});
  c.Say(
      fmt::format("task farm ({}): {} tasks on {} working rank{} in {:.3f} s, utilisation {:.0f} %, overhead "
                  "{:.3f} ms per task",
                  workflow::FarmKindName(t.farm), n_tasks, workers, workers > 1 ? "s" : "", wall_max,
                  100 * summary["utilisation"].get<double>(), summary["overhead_per_task_ms"].get<double>()));
}

// The farm's figures, for the round's results: who did what, and how busy the ranks were.
// Every rank's figures (`mine`) gathered, and on rank 0 the farm's summary; then a barrier.
void GatherFarmSummary(StepContext& c, const nlohmann::json& mine, int64_t n_tasks, int64_t shards) {
  auto parts = c.comm->Gather(mine.dump(), 0);
  if (c.root()) WriteFarmSummary(c, parts, n_tasks, shards);
  c.comm->Barrier();
}

}  // namespace

namespace {

// Whether the step scores its models on the test split besides the selection split: unless it
// selects on test, or the round holds the test split back (workflow::TaskSpec::test).
bool AlsoOnTest(const StepContext& c, const std::string& selection) { return selection != "test" && c.task.test; }

// The multiply-adds of every model over the selection split and the test split.
double EvaluateMacs(StepContext& c, const std::string& selection) {
  std::vector<std::string> splits = {selection};
  if (AlsoOnTest(c, selection)) splits.emplace_back("test");
  double macs = 0;
  for (const auto& cand : c.task.candidates)
    for (const std::string& split : splits) {
      if (cand.finetune) return std::numeric_limits<double>::infinity();  // a backbone's layers per image: never small
      const FeaturesIndex f = FeaturesShape(c, cand.backbone, split);
      macs += static_cast<double>(f.n) * HeadMacsPerRow(cand.head, f.dim, f.classes);
    }
  return macs;
}

}  // namespace

nlohmann::json EvaluateWhole(StepContext& c, const workflow::Candidate& cand, const std::string& model,
                             const std::string& split) {
  const FeaturesIndex f = OpenFeatures(c, cand.backbone, split);
  const kernels::Head h = HeadFromModel(c.store->Get(model), cand.head);
  if (h.in_dim != f.dim)
    Throw(ErrorKind::kInvalidInput, "model " + cand.id + " expects " + std::to_string(h.in_dim) + " features, " +
                                        split + " features have " + std::to_string(f.dim));
  const int64_t classes = std::max(h.classes, f.classes);
  kernels::Metrics met = kernels::Metrics::Empty(classes);
  std::string bytes;
  for (int64_t p = 0; p < f.parts; ++p) {
    ReadFeaturesPart(*c.store, f, p, bytes);
    const int64_t a = f.PartLo(p), n = f.PartHi(p) - a;
    auto logits = h.Logits(reinterpret_cast<const float*>(bytes.data()), n);
    met.Merge(kernels::Evaluate(logits.data(), f.labels.data() + a, n, classes));
  }
  return MetricsJson(met, f.class_names);
}

namespace {

// A split's features as a rank of the farm reads them.
struct Cached {
  FeaturesIndex index;
  std::vector<std::string> parts;  // empty string: not read yet
};

// A fine-tuned candidate's model: its head and its trained tail.
struct FinetunedModel {
  kernels::Head head;
  std::unique_ptr<kernels::Tail> tail;
};

// The maps sources a rank may open: each fine-tuning backbone's, on each split evaluated.
int64_t MapsSources(const StepContext& c, int64_t splits) {
  std::set<std::string> backbones;
  for (const auto& cand : c.task.candidates)
    if (cand.finetune) backbones.insert(cand.backbone);
  return std::max<int64_t>(1, static_cast<int64_t>(backbones.size()) * splits);
}

// What a rank of the farm keeps of the fine-tuned candidates it evaluates.
struct Finetuned {
  Finetuned(StepContext& c, int64_t splits) : backbones(c), sources(MapsSources(c, splits)) {}
  std::map<std::string, FinetunedModel> models;  // by candidate id
  // By backbone + "/" + split: held whole where they fit, else streamed (MapsForEvaluation).
  std::map<std::string, std::unique_ptr<MapsSource>> maps;
  BackboneTails backbones;
  int64_t sources;  // the (backbone, split) maps the rank may open, which share its memory
};

// The maps of `bb` on `split` for evaluation: held whole (each part the rank's shards use kept
// once read) where the split's maps fit the rank's memory (TaskSpec::rank_memory) less the
// tail's activations for a batch, shared by the maps sources the rank may open; else streamed
// within that share, a shard's parts read again for each candidate.
std::unique_ptr<MapsSource> MapsForEvaluation(StepContext& c, const workflow::BackboneSpec& bb,
                                              const std::string& split, kernels::Tail& tail, const Finetuned& ft) {
  std::unique_ptr<MapsSource> whole = OpenMaps(c, bb, split, 0);
  if (c.task.rank_memory == 0) return whole;
  const int64_t activations =
      tail.KeptValuesPerImage(whole->dims) * workflow::kEvaluateBatch * static_cast<int64_t>(sizeof(float));
  const int64_t limit = std::max<int64_t>(1, (c.task.rank_memory - activations) / ft.sources);
  if (workflow::MapsKeepBytes(whole->bytes(), limit) == 0) return whole;
  whole.reset();
  std::unique_ptr<MapsSource> s = OpenMaps(c, bb, split, limit);
  if (c.root())
    c.Say(
        fmt::format("fine-tuning {}: the {} maps ({:.1f} MB) streamed from the NAM for evaluation, at most {:.1f} MB "
                    "a rank (the rank's memory {:.1f} MB less {:.1f} MB of activations, shared by {} maps)",
                    bb.name, split, static_cast<double>(s->bytes()) / 1e6, static_cast<double>(limit) / 1e6,
                    static_cast<double>(c.task.rank_memory) / 1e6, static_cast<double>(activations) / 1e6, ft.sources));
  return s;
}

// One shard of `split` for a fine-tuned candidate: its rows' maps through the candidate's tail
// (the model read once per rank, and each part of the maps that its shards use), pooled, then
// through its head.
nlohmann::json FinetunedShard(StepContext& c, const workflow::Candidate& cand, int64_t shard, const std::string& split,
                              Finetuned& ft) {
  const workflow::BackboneSpec& bb = c.pipeline().Backbone(cand.backbone);
  if (!ft.models.count(cand.id)) {
    const nam::Object m = c.store->Get(workflow::ModelObject(c.task.run, c.task.round, cand.id));
    FinetunedModel f{HeadFromModel(m, cand.head), ft.backbones.Make(bb)};
    const TailWeights w = TailOfModel(m);
    if (w.empty())
      Throw(ErrorKind::kCorrupt, "NAM object '" + m.info.name + "': a fine-tuned candidate's model holds no tail");
    ApplyTail(w, f.tail.get(), "NAM object '" + m.info.name + "'");
    ft.models.emplace(cand.id, std::move(f));
  }
  FinetunedModel& model = ft.models.at(cand.id);
  const std::string key = bb.name + "/" + split;
  if (!ft.maps.count(key)) ft.maps.emplace(key, MapsForEvaluation(c, bb, split, *model.tail, ft));
  MapsSource& m = *ft.maps.at(key);
  const int64_t shards = c.task.shards, lo = m.n * shard / shards, hi = m.n * (shard + 1) / shards;
  const int64_t classes = std::max(model.head.classes, m.classes);
  kernels::Metrics met = kernels::Metrics::Empty(classes);
  if (hi > lo) {
    const std::vector<float> feats = parallel::TailFeatures(model.tail.get(), m, workflow::kEvaluateBatch, lo, hi);
    const std::vector<float> logits = model.head.Logits(feats.data(), hi - lo);
    met.Merge(kernels::Evaluate(logits.data(), m.labels.data() + lo, hi - lo, classes));
  }
  return MetricsJson(met, m.class_names);
}

// What this rank read of the fine-tuned candidates' maps (every source's reads; the most held is
// the sources' peaks added, an upper bound), put in its summary `mine` as maps_parts_read and
// maps_peak_bytes, and said after its tasks (empty where it read none).
std::string MapsReport(const Finetuned& ft, nlohmann::json* mine) {
  if (ft.maps.empty()) return {};
  MapsSource::Stats all;
  for (const auto& [_, m] : ft.maps) {
    const MapsSource::Stats s = m->stats();
    all.parts_read += s.parts_read;
    all.bytes_read += s.bytes_read;
    all.peak_bytes += s.peak_bytes;
    all.wait_seconds += s.wait_seconds;
  }
  (*mine)["maps_parts_read"] = all.parts_read;
  (*mine)["maps_peak_bytes"] = all.peak_bytes;
  return fmt::format("; {} maps parts read ({:.1f} MB), held at most {:.1f} MB, waited {:.2f} s", all.parts_read,
                     static_cast<double>(all.bytes_read) / 1e6, static_cast<double>(all.peak_bytes) / 1e6,
                     all.wait_seconds);
}

}  // namespace

void Evaluate(StepContext& c) {
  const auto& t = c.task;
  parallel::Comm& comm = *c.comm;
  const int64_t shards = t.shards;
  const int64_t n_tasks = static_cast<int64_t>(t.candidates.size()) * shards;
  const parallel::Straggler slow = StragglerFor(workflow::Step::kEvaluate, {});
  const std::string& selection = workflow::SelectionSplit(c.pipeline());
  if (c.small_macs >= 0) c.CheckSmall(EvaluateMacs(c, selection));  // in the coordinator, if it is little work
  // Task k is shard k % shards of candidate k / shards: a rank drawing neighbouring tasks
  // finds the model in its cache. A rank reads only the features parts its shards need, once.
  std::map<std::string, Cached> features;  // by backbone + "/" + split
  std::map<std::string, kernels::Head> models;
  Finetuned finetuned(c, AlsoOnTest(c, selection) ? 2 : 1);  // the fine-tuned candidates' models and maps
  std::vector<int64_t> done;
  double busy = 0;
  OverlapStats io;
  int64_t parts_read = 0;
  const auto start = std::chrono::steady_clock::now();
  auto farm = parallel::MakeTaskFarm(comm, n_tasks, t.farm);
  for (int64_t k; (k = farm->Next()) >= 0;) {
    const auto t0 = std::chrono::steady_clock::now();
    const workflow::Candidate& cand = t.candidates[static_cast<size_t>(k / shards)];
    const int64_t shard = k % shards;
    const kernels::Head* head = nullptr;
    // The shard of one split: its parts in order, part j + 1 read while the model runs on part j.
    auto evaluate = [&](const std::string& split) {
      const std::string fkey = cand.backbone + "/" + split;
      if (!features.count(fkey)) {
        Cached fresh{OpenFeatures(c, cand.backbone, split), {}};
        fresh.parts.resize(static_cast<size_t>(fresh.index.parts));
        features.emplace(fkey, std::move(fresh));
      }
      Cached& fc = features.at(fkey);
      const FeaturesIndex& f = fc.index;
      if (!head) {
        if (!models.count(cand.id))
          models.emplace(cand.id,
                         HeadFromModel(c.store->Get(workflow::ModelObject(t.run, t.round, cand.id)), cand.head));
        head = &models.at(cand.id);
      }
      const kernels::Head& h = *head;
      if (h.in_dim != f.dim)
        Throw(ErrorKind::kInvalidInput, "model " + cand.id + " expects " + std::to_string(h.in_dim) + " features, " + split +
                                            " features have " + std::to_string(f.dim));
      const int64_t lo = f.n * shard / shards, hi = f.n * (shard + 1) / shards;
      const int64_t pa = hi > lo ? lo / f.part_rows : 0, pb = hi > lo ? (hi - 1) / f.part_rows + 1 : 0;
      const int64_t classes = std::max(h.classes, f.classes);
      kernels::Metrics met = kernels::Metrics::Empty(classes);
      io.Add(Overlap(
          pb - pa,
          [&](int64_t j) {
            std::string& bytes = fc.parts[static_cast<size_t>(pa + j)];
            if (!bytes.empty()) return;
            ReadFeaturesPart(*c.store, f, pa + j, bytes);
            ++parts_read;
          },
          [&](int64_t j) {
            const int64_t p = pa + j, a = std::max(lo, f.PartLo(p)), b = std::min(hi, f.PartHi(p));
            const auto* x = reinterpret_cast<const float*>(fc.parts[static_cast<size_t>(p)].data());
            auto logits = h.Logits(x + (a - f.PartLo(p)) * f.dim, b - a);
            met.Merge(kernels::Evaluate(logits.data(), f.labels.data() + a, b - a, classes));
          },
          c.Overlapping("features " + split)));
      return met;
    };
    // A fine-tuned candidate: the maps through its trained tail (FinetunedShard); else its features.
    auto metrics = [&](const std::string& split) {
      if (cand.finetune) return FinetunedShard(c, cand, shard, split, finetuned);
      const kernels::Metrics met = evaluate(split);  // opens the split's features, and so its names
      return MetricsJson(met, features.at(cand.backbone + "/" + split).index.class_names);
    };
    nlohmann::json result = metrics(selection);
    result["split"] = selection;
    if (AlsoOnTest(c, selection)) result["test"] = metrics("test");
    c.store->Put(workflow::EvalObject(t.run, t.round, cand.id, shard), result.dump(), {{"kind", "eval-shard"}});
    if (slow.rank == comm.rank()) parallel::Straggle(t0, slow.factor);
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done.push_back(k);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool works = farm->works();
  farm.reset();  // collective
  nlohmann::json mine = {{"rank", comm.rank()},
                         {"tasks", done.size()},
                         {"task_ids", done},
                         {"models_read", models.size() + finetuned.models.size()},
                         {"busy_s", busy},
                         {"wall_s", wall},
                         {"works", works},
                         {"parts_read", parts_read},
                         {"read_s", io.fetch_s},
                         {"read_wait_s", io.wait_s},
                         {"overlap", c.OverlapReport()}};
  const std::string maps = MapsReport(finetuned, &mine);
  if (works)
    c.Say(fmt::format(
        "rank {}/{}: evaluated {} (model x shard) tasks of {}, {} model(s) read, busy {:.3f} of {:.3f} s{}",
        comm.rank(), comm.size(), done.size(), n_tasks, models.size() + finetuned.models.size(), busy, wall, maps));
  GatherFarmSummary(c, mine, n_tasks, shards);
}

}  // namespace msaflow::modules
