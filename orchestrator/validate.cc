#include "orchestrator/validate.h"

#include <fmt/core.h>

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/files.h"
#include "nam/pool.h"
#include "orchestrator/fpga_preflight.h"
#include "orchestrator/planner.h"
#include "orchestrator/run.h"
#include "workflow/backbones.h"
#include "workflow/candidates.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::orchestrator {

namespace {

// A round's part of the training split, as the schedule says it: "all the data", "33.3 % of the data".
std::string DataShare(double g) { return g >= 1 ? "all the data" : workflow::DataShareText(g) + " of the data"; }

}  // namespace

std::vector<std::string> CheckPipeline(const workflow::Pipeline& p, const workflow::Machine& m,
                                       const std::string& origin, const std::string& runs_dir) {
  for (const auto& [step, s] : p.steps) m.Module(s.module, origin + ": /steps/" + workflow::StepName(step) + "/module");
  for (size_t i = 0; i < p.backbones.size(); ++i)
    if (p.backbones[i].kind == workflow::BackboneKind::kOnnx && !PathExists(p.backbones[i].onnx))
      Throw(ErrorKind::kNotFound, fmt::format("{}: {}/onnx: {}: no such file", origin, p.backbones[i].pointer, p.backbones[i].onnx));
  workflow::CheckDatasetFiles(p, origin);  // regular files and folders, before any is opened
  workflow::CheckDatasetLabels(p);         // headers, labels and classes; no pixel read
  workflow::CheckBackbones(p);             // the models' operators, feature layers and inputs
  NamFor(p, m, runs_dir);                  // the NAM URI as a run would use it
  CheckNotInProcessNam(p);
  CheckRanks(p, m);
  FpgaPreflight(p, m);                     // fpga "opencl" needs an OpenCL device here (launcher local)
  // The train layout against the machine (ranks + servers within the module's max_ranks).
  const auto& train = p.steps.at(workflow::Step::kTrain);
  const auto layout = ResolveTrainLayout(p, train, m.Module(train.module, "/steps/train/module"),
                                         static_cast<size_t>(p.rounds.candidates));
  std::vector<std::string> lines;
  lines.push_back(fmt::format("train: mode {} on {} rank{}{}", workflow::TrainModeName(layout.mode), layout.ranks,
                              layout.ranks > 1 ? "s" : "",
                              layout.servers ? fmt::format(" + {} parameter server(s)", layout.servers) : ""));
  if (p.rounds.strategy ==
      workflow::Strategy::kHalving) {  // what the strategy will do, round by round (docs/search.md)
    const size_t b = p.backbones.size(), eta = static_cast<size_t>(p.rounds.eta);
    std::string heads, whole;
    // The models in the race: at most rung 0's survivors in round 1, then the heads continued.
    size_t race = std::min(workflow::ModelsOf(p), (b + eta - 1) / eta);
    for (int64_t r = 1, n = p.rounds.candidates; r <= p.rounds.max; ++r, n = (n + p.rounds.eta - 1) / p.rounds.eta) {
      const int ri = static_cast<int>(r);
      race = std::min(race, static_cast<size_t>(n));
      heads += fmt::format("{}{} x {} epochs on {}", r == 1 ? "" : ", then ", n, workflow::HalvingRoundEpochs(p, ri, race),
                           DataShare(workflow::HalvingDataFraction(p, ri, race)));
      whole += fmt::format("{}{}", r == 1 ? "" : ", ", workflow::HalvingEpochs(p, ri));
    }
    lines.push_back(fmt::format("rounds: halving: rung 0 ranks {} backbone{} by {} on {:g}% of each class and keeps {}; "
                                "heads {} (continued: as many steps as {} epochs of all the data by each round's end)", b, b == 1 ? "" : "s",
                                p.rounds.rank_by, 100 * p.rounds.rank_fraction, (b + eta - 1) / eta, heads, whole));
    if (p.rounds.grow_data && p.rounds.max > 1)
      lines.emplace_back("rounds: halving: a round whose heads all run one model (its cuts, or raw pixels) trains on all "
                      "the data (the schedule above assumes the race keeps as many models as it can)");
    if (p.rounds.max > 1 && p.select_on != "test")
      lines.push_back(fmt::format(
          "rounds: halving: while the race runs two models or more, the test split waits for the last round ({}{}): "
          "no backbone that leaves the race before it runs a test image",
          p.rounds.max,
          p.rounds.patience < p.rounds.max - 1 ? ", or an earlier one after which the stop rule could end the run"
                                               : ""));
    if (!p.rounds.grow_data)
      lines.emplace_back("rounds: halving: every round trains on all the training data (grow_data false)");
    else if (workflow::HalvingDataFraction(p, 1, 2) >= 1 && p.rounds.max > 1)
      lines.emplace_back("rounds: halving: every round trains on all the training data (an int8 backbone's ranges are "
                      "measured on the training images)");
  }
  for (const auto& [step, s] : p.steps) {
    if (!workflow::UsesFpga(step)) continue;
    const auto& mod = m.Module(s.module, "");
    lines.push_back(fmt::format("{}: fpga \"{}\" on module {}", workflow::StepName(step),
                                kernels::fpga::BackendName(FpgaFor(p, mod).backend), mod.name));
  }
  for (auto& line : FinetuneLines(p, m)) lines.push_back(std::move(line));
  return lines;
}

namespace {

// What one training rank of a fine-tuning step holds: the training maps (whole, or streamed
// from the NAM within what its memory leaves them: modules::MapsSource) and what the tail keeps
// for its share of a batch.
struct RankMemory {
  double maps = 0, activations = 0;  // maps: whole, or at most this much when streamed
  double whole = 0;                  // every training image's maps, as stored
  double part = 0;                   // a part of them, as prepare writes them in their own pass
  int64_t rows = 0;                  // a rank's share of a batch
  bool streamed = false;
  double total() const { return maps + activations; }
};

RankMemory FinetuneRankMemory(const workflow::BackboneSpec& bb, const workflow::TailShape& t, int64_t train_images,
                              int64_t batch, const workflow::TrainLayout& layout) {
  RankMemory r;
  const int64_t value = workflow::MapsInHalf(bb, "train") ? 2 : 4;  // bytes, as stored
  r.whole = static_cast<double>(t.values * train_images * value);
  r.part = static_cast<double>(
      workflow::FeaturesPartRows(t.values, workflow::kMapsBatch, workflow::FeaturesPartBytes()) * t.values * value);
  r.rows = layout.BatchShare(batch);
  const int64_t activations = t.kept_values * r.rows * static_cast<int64_t>(sizeof(float));
  r.activations = static_cast<double>(activations);
  const int64_t keep = workflow::MapsKeepBytes(static_cast<int64_t>(r.whole), layout.MapsLimit(activations));
  r.streamed = keep > 0;
  r.maps = r.streamed ? static_cast<double>(keep) : r.whole;
  return r;
}

// Refuses a layout whose training ranks cannot fit a node of the module: the tail's activations
// with at least two parts of streamed maps (one being read, the next fetched).
void CheckRankMemory(const workflow::Machine& m, const workflow::StepSpec& train, const workflow::TrainLayout& layout,
                     const std::string& backbone, const RankMemory& r) {
  if (layout.rank_memory == 0) return;
  const double need = r.activations + std::min(r.whole, 2 * r.part);
  if (need <= static_cast<double>(layout.rank_memory)) return;
  const workflow::ModuleSpec& mod = m.Module(train.module, "/steps/train/module");
  const int64_t per_node = PerNode(m, mod, layout.processes());
  Throw(ErrorKind::kInvalidInput,
        fmt::format("fine-tuning {}: each training rank needs {:.1f} MB: the tail's activations for {} images ({:.1f} "
                    "MB) and at least two parts of the training maps streamed from the NAM ({:.1f} MB; all of them "
                    "take {:.1f} MB); a node of module {} has {:.1f} MB for {} rank{}, {:.1f} MB each (machine '{}', "
                    "modules.{}.memory): train from a later layer, use a smaller batch or more nodes",
                    backbone, need / 1e6, r.rows, r.activations / 1e6, std::min(r.whole, 2 * r.part) / 1e6,
                    r.whole / 1e6, mod.name, static_cast<double>(mod.memory) / 1e6, per_node, per_node == 1 ? "" : "s",
                    static_cast<double>(layout.rank_memory) / 1e6, m.name, mod.name));
}

// What one evaluation rank of a fine-tuning round holds: the tail's activations for a batch
// and the maps of each split it evaluates, whole where they fit its share of the rank's memory,
// else streamed within it (modules/evaluate_step.cc, MapsForEvaluation).
struct EvalMemory {
  int64_t rank_memory = 0, activations = 0, sources = 0, splits = 0;
  double maps = 0;    // held at most: each split's, whole or its share
  double needed = 0;  // the least that works: the activations and two parts of each split
  bool streamed = false;
};

EvalMemory EvaluationMemory(const workflow::Pipeline& p, const workflow::Machine& m, const workflow::BackboneSpec& bb,
                            const workflow::TailShape& t, const std::map<std::string, int64_t>& splits) {
  EvalMemory e;
  const workflow::StepSpec& s = p.steps.at(workflow::Step::kEvaluate);
  const workflow::ModuleSpec& mod = m.Module(s.module, "/steps/evaluate/module");
  e.rank_memory = RankMemoryOf(m, mod, StepRanks(workflow::Step::kEvaluate, s, mod));
  if (e.rank_memory == 0) return e;
  std::vector<std::string> evaluated = {workflow::SelectionSplit(p)};
  if (evaluated[0] != "test") evaluated.emplace_back("test");
  e.splits = static_cast<int64_t>(evaluated.size());
  e.activations = t.kept_values * workflow::kEvaluateBatch * static_cast<int64_t>(sizeof(float));
  // Every fine-tuning backbone's maps on each split share the rank (the step shares it among
  // those of its round's candidates: at least as much each).
  e.sources = static_cast<int64_t>(evaluated.size()) *
              std::count_if(p.backbones.begin(), p.backbones.end(), [](const auto& b) { return b.finetunes(); });
  e.needed = static_cast<double>(e.activations);
  const int64_t share = std::max<int64_t>(1, (e.rank_memory - e.activations) / e.sources);
  for (const std::string& split : evaluated) {
    const int64_t value = workflow::MapsInHalf(bb, split) ? 2 : 4;
    const int64_t n = splits.count(split) ? splits.at(split) : 0, whole = t.values * n * value;
    const int64_t part =
        workflow::FeaturesPartRows(t.values, workflow::kMapsBatch, workflow::FeaturesPartBytes()) * t.values * value;
    const bool streams = workflow::MapsKeepBytes(whole, share) > 0;
    e.streamed = e.streamed || streams;
    e.maps += static_cast<double>(streams ? share : whole);
    e.needed += static_cast<double>(std::min(whole, 2 * part));
  }
  return e;
}

}  // namespace

std::vector<std::string> FinetuneLines(const workflow::Pipeline& p, const workflow::Machine& m) {
  std::vector<std::string> lines;
  if (std::none_of(p.backbones.begin(), p.backbones.end(), [](const auto& b) { return b.finetunes(); })) return lines;
  const std::map<std::string, int64_t> splits = workflow::CountImagesPerSplit(p);
  int64_t images = 0;
  for (const auto& [_, n] : splits) images += n;
  const int64_t train_images = splits.count("train") ? splits.at("train") : 0;
  const auto& train = p.steps.at(workflow::Step::kTrain);
  const workflow::ModuleSpec& mod = m.Module(train.module, "/steps/train/module");
  workflow::TrainLayout layout = ResolveTrainLayout(p, train, mod, static_cast<size_t>(p.rounds.candidates));
  layout.rank_memory = RankMemoryOf(m, mod, layout.processes());
  double total = 0;
  for (const auto& bb : p.backbones) {
    if (!bb.finetunes()) continue;
    const workflow::TailShape t = workflow::DescribeTail(bb);
    std::string maps;
    for (size_t i = 0; i < t.inputs.size(); ++i)
      maps += fmt::format("{}{} ({} x {} x {})", i ? ", " : "", t.inputs[i], t.dims[i][0], t.dims[i][1], t.dims[i][2]);
    // Each split's maps in float16 where feature_dtype says so (workflow::MapsInHalf).
    double bytes = 0;
    for (const auto& [split, n] : splits)
      bytes += static_cast<double>(t.values * n) * (workflow::MapsInHalf(bb, split) ? 2 : 4);
    total += bytes;
    const RankMemory mem = FinetuneRankMemory(bb, t, train_images, p.head.batch, layout);
    std::string scales;
    for (double s : p.head.backbone_lr_scale) scales += fmt::format("{}{:g}", scales.empty() ? "" : ", ", s);
    std::string epochs;
    for (int64_t e : p.head.finetune_epochs.empty() ? p.head.epochs : p.head.finetune_epochs)
      epochs += fmt::format("{}{}", epochs.empty() ? "" : ", ", e);
    lines.push_back(fmt::format(
        "fine-tuning {}: from round {}, its {} layers from {} to {} ({} weights) train with the heads on module {}, {} "
        "rank{} ({}), at the head's learning rate x {}, for {} epochs; the trunk's maps at {} cached in the NAM: {} "
        "values an "
        "image, {:.1f} MB for the {} images of the splits; each training rank holds {:.1f} MB ({}, {:.1f} MB of "
        "activations for {} images)",
        bb.name, p.rounds.finetune_from_round, t.layers.size(), t.layers.front(), t.layers.back(), t.weights,
        train.module, layout.ranks, layout.ranks == 1 ? "" : "s", workflow::TrainModeName(layout.mode), scales, epochs,
        maps, t.values, bytes / 1e6, images, mem.total() / 1e6,
        mem.streamed ? fmt::format("at most {:.1f} MB of maps streamed from the NAM, of {:.1f} MB, as its memory of "
                                   "{:.1f} MB allows",
                                   mem.maps / 1e6, mem.whole / 1e6, static_cast<double>(layout.rank_memory) / 1e6)
                     : fmt::format("{:.1f} MB of maps", mem.maps / 1e6),
        mem.activations / 1e6, mem.rows));
    CheckRankMemory(m, train, layout, bb.name, mem);
    const EvalMemory ev = EvaluationMemory(p, m, bb, t, splits);
    if (ev.rank_memory == 0) continue;
    const std::string& emod = p.steps.at(workflow::Step::kEvaluate).module;
    if (ev.needed > static_cast<double>(ev.rank_memory))
      Throw(ErrorKind::kInvalidInput,
            fmt::format("fine-tuning {}: each evaluation rank needs {:.1f} MB: the tail's activations for {} images "
                        "({:.1f} MB) and at least two parts of the maps of each split it evaluates; a rank of module "
                        "{} has {:.1f} MB (machine '{}', modules.{}.memory): train from a later layer, or give the "
                        "evaluation more nodes",
                        bb.name, ev.needed / 1e6, workflow::kEvaluateBatch, static_cast<double>(ev.activations) / 1e6,
                        emod, static_cast<double>(ev.rank_memory) / 1e6, m.name, emod));
    lines.push_back(fmt::format(
        "fine-tuning {}: each evaluation rank on module {} holds {:.1f} MB ({:.1f} MB of maps "
        "of its {} evaluated split{}{}, {:.1f} MB of activations for {} images)",
        bb.name, emod, (ev.maps + static_cast<double>(ev.activations)) / 1e6, ev.maps / 1e6, ev.splits,
        ev.splits == 1 ? "" : "s", ev.streamed ? ", streamed from the NAM where they do not fit" : ", held whole",
        static_cast<double>(ev.activations) / 1e6, workflow::kEvaluateBatch));
  }
  if (p.nam.empty() && m.nam.serve) {
    const double capacity = static_cast<double>(nam::ParseSize(m.nam.capacity, "the machine's nam.capacity"));
    if (total > capacity)
      Throw(ErrorKind::kInvalidInput,
            fmt::format("fine-tuning: the maps of every split take {:.1f} MB, more than the NAM's capacity of {} "
                        "(machine '{}', nam.capacity): train from a later layer, use fewer images, or give the "
                        "NAM more",
                        total / 1e6, m.nam.capacity, m.name));
  }
  return lines;
}

}  // namespace msaflow::orchestrator
