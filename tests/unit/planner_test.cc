#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "common/files.h"
#include "workflow/candidates.h"
#include "workflow/machine.h"
#include "launch/node_seconds.h"
#include "orchestrator/placement.h"
#include "orchestrator/planner.h"

namespace msaflow::orchestrator {
using workflow::LoadMachine;
using launch::MeasureNodeSeconds;
using launch::NodeSecondsSummary;
namespace {

using workflow::ParsePipeline;

Pipeline TwoBackbones() {
  return ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": "x", "input": {"height": 32, "width": 32}},
                  {"name": "pixels", "kind": "pixels"}],
    "head": {"type": ["softmax", "mlp"], "lr": [0.001, 0.01], "hidden": [8, 16]},
    "steps": {"evaluate": {"ranks": 64}},
    "rounds": {"max": 3, "candidates": 5, "top_k": 2, "seed": 9}})",
                       "p.json", "/b");
}

TEST(Candidates, LbfgsConfigurationsDoNotRepeatPerLearningRate) {
  Pipeline p = ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "pixels", "kind": "pixels"}],
    "head": {"optimizer": ["lbfgs", "adam"], "lr": [0.001, 0.01], "l2": [0.001, 0.01]},
    "rounds": {"max": 1, "candidates": 6, "seed": 9}})",
                             "p.json", "/b");
  // lbfgs: 2 configurations (l2); adam: 4 (lr x l2); 6 candidates cover each exactly once.
  std::vector<std::string> labels;
  for (const auto& c : FirstRound(p)) labels.push_back(workflow::HeadLabel(c.head));
  std::sort(labels.begin(), labels.end());
  EXPECT_EQ(std::unique(labels.begin(), labels.end()), labels.end());
  EXPECT_EQ(std::count_if(labels.begin(), labels.end(), [](const std::string& l) { return l.find("lbfgs") != std::string::npos; }), 2);
}

TEST(Planner, RoundBindsStepsToModules) {
  Pipeline p = TwoBackbones();
  Machine m = LoadMachine("local");
  auto cands = FirstRound(p);
  RoundPlan plan = PlanRound(p, m, "run1", "mem://x", 1, cands, {});
  std::vector<std::string> got;
  for (const auto& t : plan.tasks) got.push_back(t.id + "@" + t.module);
  EXPECT_EQ(got, (std::vector<std::string>{"r1-load@cm", "r1-prepare@dam", "r1-train@dam", "r1-store@dam",
                                           "r1-evaluate@esb", "r1-select@dam"}));
  const Task& ev = plan.tasks[4];
  EXPECT_LE(ev.ranks, m.modules.at("esb").max_ranks);  // capped by the machine
  EXPECT_EQ(ev.after, std::vector<std::string>{"r1-store"});
  EXPECT_EQ(ev.body["shards"], 2 * ev.ranks);
  EXPECT_EQ(ev.body["candidates"].size(), 5u);
  EXPECT_EQ(plan.tasks[0].body["format"], kTaskFormat);
}

// A pipeline of one backbone that fine-tunes from layer "w", with `rest` (its head, steps and
// rounds, as JSON members).
Pipeline FineTuning(const std::string& rest) {
  return ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": "x", "train_from": "w",
                   "input": {"height": 32, "width": 32}}],
    )" + rest + "}",
                       "p.json", "/b");
}

Pipeline WithTrain(const std::string& train, int64_t candidates) {
  return ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "pixels", "kind": "pixels"}],
    "steps": {"train": )" + train + R"(}, "rounds": {"candidates": )" + std::to_string(candidates) + "}}",
                       "p.json", "/b");
}

ModuleSpec Dam(int64_t max_ranks) {
  ModuleSpec m;
  m.name = "dam";
  m.max_ranks = max_ranks;
  return m;
}

std::string LayoutError(const Pipeline& p, int64_t max_ranks) {
  try {
    ResolveTrainLayout(p, p.steps.at(workflow::Step::kTrain), Dam(max_ranks), 4);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Planner, TrainLayoutResolvesAutoAndCountsServers) {
  // auto: candidates dealt out while there are enough of them, else data-parallel sync.
  Pipeline p = WithTrain(R"({"ranks": 4})", 4);
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at(workflow::Step::kTrain), Dam(8), 4).mode, workflow::TrainMode::kIndependent);
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at(workflow::Step::kTrain), Dam(8), 3).mode, workflow::TrainMode::kSync);
  // async and hybrid start their servers beside the gradient ranks.
  p = WithTrain(R"({"ranks": 4, "mode": "hybrid", "servers": 2, "max_staleness": 5})", 4);
  TrainLayout t = ResolveTrainLayout(p, p.steps.at(workflow::Step::kTrain), Dam(8), 4);
  EXPECT_EQ(t.mode, workflow::TrainMode::kHybrid);
  EXPECT_EQ(t.processes(), 6);
  EXPECT_EQ(t.groups, 2);
  EXPECT_EQ(t.max_staleness, 5);
  RoundPlan plan = PlanRound(p, LoadMachine("local"), "run1", "mem://x", 1, FirstRound(p), {});
  // The task carries the layout the module reads back.
  EXPECT_EQ(workflow::TrainLayoutFromJson(plan.tasks[2].body["train"], "t").ToJson(), t.ToJson());
  // A machine with fewer processes: sync and async shrink, hybrid's groups cannot.
  p = WithTrain(R"({"ranks": 4, "mode": "async"})", 4);
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at(workflow::Step::kTrain), Dam(3), 4).ranks, 2);
  EXPECT_EQ(LayoutError(p, 2), "t: /steps/train/ranks: 4 ranks + 1 server(s) need 5 processes, but module dam allows 2 "
                               "(max_ranks in the machine file); async needs 2 workers besides its servers");
  p = WithTrain(R"({"ranks": 4, "mode": "hybrid"})", 4);
  EXPECT_EQ(LayoutError(p, 4), "t: /steps/train/ranks: 4 ranks + 1 server(s) need 5 processes, but module dam allows 4 "
                               "(max_ranks in the machine file); hybrid groups need exactly the ranks asked for");
}

// A round as results.json records it: prepare computed 6,000 image passes over 2 ranks
// (8 rank-s), train 4 independent candidates (12 rank-s), evaluate 20 tasks (0.3 rank-s);
// load, store and select took 0.5 s or more.
nlohmann::json MeasuredRound() {
  return nlohmann::json::parse(R"({
    "round": 1,
    "step_seconds": {"load": 0.6, "prepare": 6.0, "train": 7.0, "store": 0.5, "evaluate": 1.0, "select": 0.7},
    "features": {"computed": [
      {"rows": 4000, "ranks": 2, "per_rank": [{"seconds": 2.5}, {"seconds": 2.5}]},
      {"rows": 2000, "ranks": 2, "per_rank": [{"seconds": 1.5}, {"seconds": 1.5}]}], "reused": []},
    "training": {"mode": "independent", "processes": 2, "candidates": [
      {"seconds": 3, "updates": 600}, {"seconds": 3, "updates": 600}, {"seconds": 3, "updates": 600},
      {"seconds": 3, "updates": 600}]},
    "evaluation": {"ranks": 2, "tasks": 20, "per_rank": [{"busy_s": 0.2, "works": true}, {"busy_s": 0.1, "works": true}]}
  })");
}

TEST(Placement, MeasuresSharedWorkPerItemAndWhatDoesNotDivide) {
  auto costs = MeasureRound(MeasuredRound(), TwoBackbones());
  const StepCost& prep = costs.at(workflow::Step::kPrepare);
  EXPECT_DOUBLE_EQ(prep.work_s, 8.0);
  EXPECT_EQ(prep.items, 6000);
  EXPECT_EQ(prep.ranks, 2);
  EXPECT_NEAR(prep.PerItem(), 8.0 / 6000, 1e-12);
  EXPECT_DOUBLE_EQ(prep.serial_s, 6.0 - 8.0 / 2);
  EXPECT_DOUBLE_EQ(costs.at(workflow::Step::kTrain).work_s, 12.0);  // independent: one rank per candidate
  EXPECT_EQ(costs.at(workflow::Step::kTrain).items, 2400);
  EXPECT_DOUBLE_EQ(costs.at(workflow::Step::kEvaluate).work_s, 0.3);
  EXPECT_DOUBLE_EQ(costs.at(workflow::Step::kLoad).work_s, 0.0);
  // Heads trained together report the group's seconds each: counted once. Two pairs of 3 s
  // on one rank each are 6 rank-seconds, not 12.
  nlohmann::json paired = MeasuredRound();
  for (auto& e : paired["training"]["candidates"]) e["together"] = 2;
  EXPECT_DOUBLE_EQ(MeasureRound(paired, TwoBackbones()).at(workflow::Step::kTrain).work_s, 6.0);
  // So do two cuts of one model prepared in one pass: each entry carries the pass's seconds.
  nlohmann::json one_pass = MeasuredRound();
  one_pass["features"]["computed"][1]["per_rank"] = one_pass["features"]["computed"][0]["per_rank"];
  one_pass["features"]["computed"][0]["one_pass_with"] = {"b"};
  one_pass["features"]["computed"][1]["one_pass_with"] = {"a"};
  EXPECT_DOUBLE_EQ(MeasureRound(one_pass, TwoBackbones()).at(workflow::Step::kPrepare).work_s, 5.0);
  // Fine-tuning's maps divide over the ranks too (the entry has the wall time of them all); maps
  // found in the NAM cost nothing.
  nlohmann::json maps = MeasuredRound();
  maps["features"]["maps"] = nlohmann::json::parse(R"([
    {"computed": true, "rows": 3000, "ranks": 2, "seconds": 1.5},
    {"computed": false, "object": "maps/x"}])");
  const StepCost with_maps = MeasureRound(maps, TwoBackbones()).at(workflow::Step::kPrepare);
  EXPECT_DOUBLE_EQ(with_maps.work_s, 8.0 + 3.0);
  EXPECT_EQ(with_maps.items, 9000);
  // Round-trips through results.json.
  StepCost back = StepCostFromJson(ToJson(prep), "costs/prepare");
  EXPECT_DOUBLE_EQ(back.work_s, prep.work_s);
  EXPECT_EQ(back.unit, "image pass");
}

// The simulator's model (simulate::FavouredRanks) gives each step's seconds at 1, 2, 4 ... ranks;
// the placement takes the next while it saves >= 5 %, within the module's and this machine's
// limits and, trained independently, the round's candidates.
TEST(Placement, RanksFromTheModelWithinTheLimits) {
  Pipeline p = TwoBackbones();
  Machine m = LoadMachine("local");
  auto step = [](nlohmann::json table, int64_t ranks) {
    return nlohmann::json{{"ranks", ranks}, {"seconds_by_ranks", std::move(table)}, {"work_s", 8.0},
                          {"serial_s", 0.5}, {"round", 1}};
  };
  const nlohmann::json favoured = {
      {"prepare", step({{"1", 10.0}, {"2", 5.5}, {"4", 3.0}, {"8", 2.0}, {"16", 1.95}}, 8)},
      {"train", step({{"1", 4.0}, {"2", 2.2}, {"4", 1.3}, {"8", 0.9}, {"16", 0.7}}, 16)},
      {"evaluate", step({{"1", 0.6}, {"2", 0.59}}, 1)}};
  Placement pl = PlaceFromModel(p, m, favoured, "run r", 16);
  EXPECT_EQ(pl.source, "run r");
  EXPECT_EQ(pl.ranks.at(workflow::Step::kPrepare), 8);  // 16 would save 2.5 %
  EXPECT_EQ(pl.ranks.at(workflow::Step::kTrain), 4);    // 5 independent candidates: 8 would pass them
  EXPECT_EQ(pl.ranks.at(workflow::Step::kEvaluate), 1);
  ASSERT_EQ(pl.why.size(), 3u);
  EXPECT_NE(pl.why[0].find("16 ranks would save under 5 % in the model"), std::string::npos) << pl.why[0];
  EXPECT_NE(pl.why[0].find("predicted 2.00 s (10.00 s on one rank)"), std::string::npos) << pl.why[0];
  EXPECT_NE(pl.why[1].find("capped by 5 candidates per round"), std::string::npos) << pl.why[1];
  EXPECT_NE(pl.why[2].find("2 ranks would save under 5 %"), std::string::npos) << pl.why[2];
  // 2 cores: the local launcher does not oversubscribe them.
  pl = PlaceFromModel(p, m, favoured, "run r", 2);
  EXPECT_EQ(pl.ranks.at(workflow::Step::kPrepare), 2);
  EXPECT_NE(pl.why[0].find("capped by the 2 cores of this machine"), std::string::npos) << pl.why[0];
  // A step the runs measured no shared work for gets one rank.
  pl = PlaceFromModel(p, m, {{"prepare", favoured["prepare"]}}, "run r", 16);
  EXPECT_EQ(pl.ranks.at(workflow::Step::kTrain), 1);
  EXPECT_NE(pl.why[1].find("measured no work to share"), std::string::npos) << pl.why[1];
  // The placement reaches the plan.
  pl = PlaceFromModel(p, m, favoured, "run r", 2);
  RoundPlan plan = PlanRound(ApplyPlacement(p, pl), m, "run1", "mem://x", 1, FirstRound(p), {});
  EXPECT_EQ(plan.tasks[1].ranks, 2);
  EXPECT_EQ(plan.tasks[4].ranks, 1);
}

TEST(Placement, WithoutAnEarlierRunTheModuleLimitIsUsed) {
  Placement pl = PlaceWithoutCosts(TwoBackbones(), LoadMachine("local"), 4);
  EXPECT_EQ(pl.ranks.at(workflow::Step::kPrepare), 4);
  EXPECT_EQ(pl.ranks.at(workflow::Step::kEvaluate), 4);
  EXPECT_EQ(pl.ranks.at(workflow::Step::kTrain), 4);
  EXPECT_EQ(pl.source, "no earlier run");
}

TEST(Placement, HetjobHoldsEveryModuleForTheRoundChainedOnlyPerStep) {
  Pipeline p = TwoBackbones();
  Machine m = LoadMachine("local");
  m.modules.at("esb").nodes = 2;
  std::map<std::string, double> secs = {{"load", 1}, {"prepare", 4}, {"train", 3},
                                        {"store", 1}, {"evaluate", 2}, {"select", 1}};
  auto ns = MeasureNodeSeconds(secs, p, m, workflow::SlurmMode::kHetjob, 20);
  ASSERT_EQ(ns.size(), 3u);  // cm, dam, esb
  EXPECT_EQ(ns[0].module, "cm");
  EXPECT_DOUBLE_EQ(ns[0].held_s, 20);
  EXPECT_DOUBLE_EQ(ns[0].used_s, 1);
  EXPECT_EQ(ns[1].module, "dam");
  EXPECT_DOUBLE_EQ(ns[1].used_s, 4 + 3 + 1 + 1);
  EXPECT_EQ(ns[2].module, "esb");
  EXPECT_DOUBLE_EQ(ns[2].held_s, 40);  // 2 nodes
  EXPECT_DOUBLE_EQ(ns[2].used_s, 4);
  std::string line = NodeSecondsSummary(ns, workflow::SlurmMode::kHetjob, 6, 1.5);
  EXPECT_NE(line.find("chained jobs would hold 14.0 node-s instead of 80.0 (cheaper"), std::string::npos) << line;
  auto chained = MeasureNodeSeconds(secs, p, m, workflow::SlurmMode::kChained, 20);
  EXPECT_DOUBLE_EQ(chained[2].held_s, chained[2].used_s);
  EXPECT_EQ(NodeSecondsSummary(chained, workflow::SlurmMode::kChained, 6, 1.5).find("would hold"), std::string::npos);
}

TEST(Candidates, FirstRoundCoversBackbonesDeterministically) {
  Pipeline p = TwoBackbones();
  auto a = FirstRound(p), b = FirstRound(p);
  ASSERT_EQ(a.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(ToJson(a[i]), ToJson(b[i]));
    EXPECT_EQ(a[i].backbone, i % 2 == 0 ? "m" : "pixels");
  }
  EXPECT_EQ(a[0].id, "r1-c00");
  EXPECT_NE(a[0].head.seed, a[1].head.seed);
  EXPECT_EQ(CandidateFromJson(ToJson(a[3])).head.lr, a[3].head.lr);
}

// halving (issue 30): round r trains on 1/eta^(max - r) of the training split, at least rung 0's
// share, the last on all of it; a round's tasks see only the backbones still in the race.
TEST(Candidates, HalvingGrowsTheDataAndNarrowsTheBackbonesRoundByRound) {
  auto halving = [](const std::string& rounds, const std::string& precision = "f32") {
    return ParsePipeline(R"({"name": "t",
      "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                   "validation": {"from": "train", "fraction": 0.1}},
      "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": ["x", "y"], "input": {"height": 32, "width": 32},
                     "precision": ")" + precision + R"("},
                    {"name": "n", "onnx": "n.onnx", "feature_layer": "z", "input": {"height": 32, "width": 32}},
                    {"name": "pixels", "kind": "pixels"}],
      "rounds": )" + rounds + "}",
                         "p.json", "/b");
  };
  const Pipeline p = halving(R"({"max": 3, "candidates": 6, "seed": 4, "strategy": "halving", "eta": 3})");
  EXPECT_DOUBLE_EQ(workflow::HalvingDataFraction(p, 1, 2), 1.0 / 9);
  EXPECT_DOUBLE_EQ(workflow::HalvingDataFraction(p, 2, 2), 1.0 / 3);
  EXPECT_EQ(workflow::HalvingDataFraction(p, 3, 2), 1);
  // The steps of 2, then 7, then 20 epochs of all the data (head.epochs 20) by each round's end.
  EXPECT_EQ(workflow::HalvingEpochs(p, 1), 2);
  EXPECT_EQ(workflow::HalvingEpochs(p, 2), 7);
  EXPECT_EQ(workflow::HalvingRoundEpochs(p, 1, 3), 18);  // 2 epochs' steps on a ninth of the data
  EXPECT_EQ(workflow::HalvingRoundEpochs(p, 2, 2), 15);  // 5 more on a third
  EXPECT_EQ(workflow::HalvingRoundEpochs(p, 3, 1), 13);
  // A race of one backbone: all the data at once (a subset would spare it nothing), and so the epochs.
  EXPECT_EQ(workflow::HalvingDataFraction(p, 1, 1), 1);
  EXPECT_EQ(workflow::HalvingRoundEpochs(p, 1, 1), 2);
  EXPECT_EQ(workflow::HalvingRoundEpochs(p, 2, 1), 5);
  const Pipeline wide = halving(R"({"max": 3, "candidates": 6, "strategy": "halving", "eta": 4, "rank_fraction": 0.2})");
  EXPECT_DOUBLE_EQ(workflow::HalvingDataFraction(wide, 1, 2), 0.2);  // 1/16, but rung 0 has a fifth already
  EXPECT_DOUBLE_EQ(workflow::HalvingDataFraction(wide, 2, 2), 0.25);
  EXPECT_EQ(workflow::HalvingDataFraction(halving(R"({"max": 3, "strategy": "halving", "grow_data": false})"), 1, 2), 1);
  EXPECT_EQ(workflow::HalvingDataFraction(halving(R"({"max": 3, "strategy": "halving"})", "int8"), 1, 2), 1);
  EXPECT_EQ(workflow::HalvingDataFraction(TwoBackbones(), 1, 2), 1);
  // Round 1: every backbone; its tasks' pipeline takes a ninth of the training split.
  const auto first = FirstRound(p);
  EXPECT_EQ(first[0].head.epochs, 18);
  const Pipeline r1 = workflow::RoundPipeline(p, 1, first);
  EXPECT_EQ(r1.backbones.size(), 4u);
  EXPECT_DOUBLE_EQ(r1.train.subset_fraction, 1.0 / 9);
  EXPECT_EQ(r1.train.subset_seed, 4u);
  EXPECT_EQ(r1.source["datasets"]["train"]["subset"]["fraction"], 1.0 / 9);
  EXPECT_FALSE(r1.test.subset());
  EXPECT_FALSE(p.train.subset());  // the run's own pipeline is left as it was
  RoundPlan plan = PlanRound(r1, LoadMachine("local"), "run1", "mem://x", 1, first, {});
  EXPECT_EQ(plan.tasks[1].body["pipeline"]["datasets"]["train"]["subset"]["fraction"], 1.0 / 9);
  // Round 2: heads on both cuts of m: one model, whose pass a smaller part would spare nothing,
  // so all the data (and the epochs of all of it); on m and n, a third.
  std::vector<workflow::Candidate> cuts, models;
  for (const auto& c : first) {
    if (c.backbone.rfind("m.", 0) == 0 && cuts.size() < 2 && (cuts.empty() || cuts[0].backbone != c.backbone))
      cuts.push_back(c);
    if ((c.backbone == "n" || c.backbone == "m.x") && (models.empty() || models[0].backbone != c.backbone)) models.push_back(c);
  }
  ASSERT_EQ(cuts.size(), 2u);
  ASSERT_EQ(models.size(), 2u);
  const Pipeline one_model = workflow::RoundPipeline(p, 2, cuts);
  EXPECT_EQ(one_model.backbones.size(), 2u);
  EXPECT_FALSE(one_model.train.subset());
  const Pipeline two_models = workflow::RoundPipeline(p, 2, models);
  EXPECT_DOUBLE_EQ(two_models.train.subset_fraction, 1.0 / 3);
  // Round 3: two heads on one cut of m: only that cut, on the whole split.
  std::vector<workflow::Candidate> last;
  for (const auto& c : first)
    if (c.backbone == "m.y" && last.size() < 2) last.push_back(c);
  ASSERT_EQ(last.size(), 2u);
  const Pipeline r3 = workflow::RoundPipeline(p, 3, last);
  ASSERT_EQ(r3.backbones.size(), 1u);
  EXPECT_EQ(r3.backbones[0].name, "m.y");
  EXPECT_FALSE(r3.train.subset());
  EXPECT_FALSE(r3.source["datasets"]["train"].contains("subset"));
  // Every other strategy: the pipeline itself.
  EXPECT_EQ(workflow::RoundPipeline(TwoBackbones(), 1, FirstRound(TwoBackbones())).source, TwoBackbones().source);
  // grow_data is halving's.
  try {
    halving(R"({"max": 3, "grow_data": true})");
    ADD_FAILURE() << "grow_data without halving was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "p.json: /rounds/grow_data: only for \"strategy\": \"halving\" (the strategy is \"perturb\")");
  }
  try {
    halving(R"({"max": 3, "strategy": "halving", "grow_data": 1})");
    ADD_FAILURE() << "grow_data 1 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "p.json: /rounds/grow_data: expected true or false, got number 1");
  }
}

// halving with fine-tuning: the continued candidates fine-tune from finetune_from_round on, each
// from its parent's model (its head, and its tail if it fine-tuned), at the head space's
// backbone_lr_scale.
TEST(Candidates, HalvingContinuesIntoFineTuning) {
  const Pipeline p = FineTuning(R"("head": {"lr": [0.001, 0.01], "backbone_lr_scale": [0.2]},
    "rounds": {"max": 3, "candidates": 4, "seed": 4, "strategy": "halving", "eta": 2, "finetune_from_round": 2})");
  const auto first = FirstRound(p);
  for (const auto& c : first) EXPECT_FALSE(c.finetune) << c.id;
  std::vector<Ranked> ranking;
  for (size_t i = 0; i < first.size(); ++i)
    ranking.push_back({first[i], 0.9 - 0.1 * static_cast<double>(i), "model/r/1/" + first[i].id, {}, {}});
  const auto second = NextRound(p, 2, ranking);
  ASSERT_EQ(second.size(), 2u);  // the best half, continued
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_TRUE(second[i].finetune) << second[i].id;
    EXPECT_DOUBLE_EQ(second[i].backbone_lr_scale, 0.2);
    EXPECT_EQ(second[i].warm_start, "model/r/1/" + first[i].id);
  }
  std::vector<Ranked> ranking2;
  for (const auto& c : second) ranking2.push_back({c, 0.95, "model/r/2/" + c.id, {}, {}});
  const auto third = NextRound(p, 3, ranking2);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_TRUE(third[0].finetune);
  EXPECT_EQ(third[0].warm_start, "model/r/2/r2-c00");  // the fine-tuned parent: its head and tail
}

// finetune_epochs: the fine-tuning round's candidates train for its values in turn, the frozen
// round's for `epochs`; a value outside 1..10000 is refused where it is.
TEST(Candidates, FineTuningCandidatesTrainForFinetuneEpochs) {
  const std::string doc = R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": "x", "train_from": "w",
                   "input": {"height": 32, "width": 32}}],
    "head": {"epochs": 12, "finetune_epochs": FT},
    "rounds": {"max": 2, "candidates": 4, "top_k": 2, "finetune_from_round": 2}})";
  auto with = [&](const std::string& ft) {
    std::string s = doc;
    return s.replace(s.find("FT"), 2, ft);
  };
  const Pipeline p = ParsePipeline(with("[3, 5]"), "p.json", "/b");
  const auto first = FirstRound(p);
  for (const auto& c : first) EXPECT_EQ(c.head.epochs, 12) << c.id;
  std::vector<Ranked> ranking;
  for (size_t i = 0; i < first.size(); ++i)
    ranking.push_back({first[i], 0.9 - 0.1 * static_cast<double>(i), "model/r/1/" + first[i].id, {}, {}});
  const auto second = NextRound(p, 2, ranking);
  ASSERT_EQ(second.size(), 4u);
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_TRUE(second[i].finetune) << second[i].id;
    EXPECT_EQ(second[i].head.epochs, i % 2 == 0 ? 3 : 5) << second[i].id;
  }
  // Without it, as the heads' epochs.
  std::string plain = with("1");
  plain.erase(plain.find(", \"finetune_epochs\": 1"), std::string(", \"finetune_epochs\": 1").size());
  for (const auto& c : NextRound(ParsePipeline(plain, "p.json", "/b"), 2, ranking)) EXPECT_EQ(c.head.epochs, 12);
  try {
    ParsePipeline(with("[4, 0]"), "p.json", "/b");
    ADD_FAILURE() << "finetune_epochs 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/head/finetune_epochs/1"), std::string::npos) << e.what();
  }
}

// The task of `step` in a round's plan (an empty one where it has none).
Task TaskOf(const RoundPlan& plan, workflow::Step step) {
  for (const auto& t : plan.tasks)
    if (t.step == step) return t;
  return Task{};
}

// A round that fine-tunes tells its train task what each process may take (its share of a dam
// node's memory: all the processes on the local launcher share one), so that a rank streams its
// maps where they would not fit; a round of heads alone keeps its task as it always was.
TEST(Planner, AFineTuningRoundsTrainTaskCarriesEachRanksMemory) {
  const Pipeline p = FineTuning(R"("steps": {"train": {"module": "dam", "ranks": 2, "mode": "async"}},
    "rounds": {"max": 2, "candidates": 2, "top_k": 1, "finetune_from_round": 2})");
  Machine m = LoadMachine("local");
  m.modules.at("dam").memory = 48 << 20;
  const auto first = FirstRound(p);
  const auto train_of = [](const RoundPlan& plan) { return TaskOf(plan, workflow::Step::kTrain); };
  const Task heads = train_of(PlanRound(p, m, "run1", "mem://x", 1, first, {}));
  EXPECT_FALSE(heads.body["train"].contains("rank_memory")) << heads.body["train"];
  std::vector<Ranked> ranking = {{first[0], 0.9, "model/run1/1/" + first[0].id, {}, {}}};
  const auto second = NextRound(p, 2, ranking);
  ASSERT_TRUE(second[0].finetune);
  const Task tunes = train_of(PlanRound(p, m, "run1", "mem://x", 2, second, {}));
  EXPECT_EQ(tunes.ranks, 3);  // 2 workers and a server
  EXPECT_EQ(tunes.body["train"]["rank_memory"], (48 << 20) / 3);
  const workflow::TrainLayout back = workflow::TrainLayoutFromJson(tunes.body["train"], "task");
  EXPECT_EQ(back.rank_memory, (48 << 20) / 3);
  EXPECT_EQ(back.BatchShare(32), 32);  // async: a worker computes whole batches
  EXPECT_EQ(back.MapsLimit(int64_t{14} << 20), (48 << 20) / 3 - (int64_t{14} << 20));
  EXPECT_EQ(back.MapsLimit(int64_t{20} << 20), 1);  // never 0 (no limit) when memory is short
  m.modules.at("dam").memory = 0;                   // not said: no limit
  EXPECT_FALSE(train_of(PlanRound(p, m, "run1", "mem://x", 2, second, {})).body["train"].contains("rank_memory"));
  nlohmann::json bad = tunes.body["train"];
  bad["rank_memory"] = -1;
  EXPECT_THROW(workflow::TrainLayoutFromJson(bad, "task"), Error);
}

// A fine-tuning round's evaluate task carries its ranks' share of an esb node's memory (the
// maps they hold stay within it); a round of heads alone keeps its task as it was.
TEST(Planner, AFineTuningRoundsEvaluateTaskCarriesEachRanksMemory) {
  const Pipeline p = FineTuning(R"("steps": {"evaluate": {"module": "esb", "ranks": 4}},
    "rounds": {"max": 2, "candidates": 2, "top_k": 1, "finetune_from_round": 2})");
  Machine m = LoadMachine("local");
  m.modules.at("esb").memory = 64 << 20;
  const auto first = FirstRound(p);
  const auto evaluate_of = [](const RoundPlan& plan) { return TaskOf(plan, workflow::Step::kEvaluate); };
  EXPECT_FALSE(evaluate_of(PlanRound(p, m, "run1", "mem://x", 1, first, {})).body.contains("rank_memory"));
  std::vector<Ranked> ranking = {{first[0], 0.9, "model/run1/1/" + first[0].id, {}, {}}};
  const Task tunes = evaluate_of(PlanRound(p, m, "run1", "mem://x", 2, NextRound(p, 2, ranking), {}));
  EXPECT_EQ(tunes.ranks, 4);
  EXPECT_EQ(tunes.body["rank_memory"], (64 << 20) / 4);  // the 4 ranks on one local node
  EXPECT_EQ(workflow::ParseTask(tunes.body, "task").rank_memory, (64 << 20) / 4);
  nlohmann::json bad = tunes.body;
  for (const nlohmann::json& v :
       {nlohmann::json(0), nlohmann::json(-5), nlohmann::json(1.5), nlohmann::json("16MiB")}) {
    bad["rank_memory"] = v;
    try {
      workflow::ParseTask(bad, "task.json");
      ADD_FAILURE() << "rank_memory " << v << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("task.json: rank_memory"), std::string::npos) << e.what();
    }
  }
}

TEST(Candidates, PerturbDerivesFromTheBest) {
  Pipeline p = TwoBackbones();
  auto first = FirstRound(p);
  std::vector<Ranked> ranking = {{first[3], 0.9, "model/r/1/r1-c03", {}, {}}, {first[0], 0.8, "model/r/1/r1-c00", {}, {}}};
  auto next = NextRound(p, 2, ranking);
  ASSERT_EQ(next.size(), 5u);
  EXPECT_EQ(next[0].id, "r2-c00");
  EXPECT_EQ(next[0].parent, "r1-c03");
  EXPECT_EQ(next[0].warm_start, "model/r/1/r1-c03");  // the champion's first child continues it
  EXPECT_DOUBLE_EQ(next[0].head.lr, first[3].head.lr * 0.5);
  EXPECT_EQ(next[1].parent, "r1-c00");
  EXPECT_EQ(next[1].backbone, first[0].backbone);
  for (const auto& c : next) EXPECT_NE(c.head.seed, first[3].head.seed);
}

// Issue 10: with perturb, a backbone that missed round 1's top-k never got another candidate.
// A backbone within rounds.backbone_margin of the champion keeps a parent; one further behind
// does not.
TEST(Candidates, ABackboneCloseBehindKeepsAParent) {
  Pipeline p = TwoBackbones();
  auto first = FirstRound(p);  // even ids on "m", odd on "pixels"
  ASSERT_EQ(first[2].backbone, "m");
  ASSERT_EQ(first[1].backbone, "pixels");
  std::vector<Ranked> ranking = {{first[0], 0.90, "model/r/1/r1-c00", {}, {}}, {first[2], 0.89, "model/r/1/r1-c02", {}, {}}};
  auto count_pixels = [](const std::vector<Candidate>& c) {
    return std::count_if(c.begin(), c.end(), [](const Candidate& x) { return x.backbone == "pixels"; });
  };
  // Top-2 both on "m"; "pixels" best at 0.885, within the default margin of 0.02: it keeps a parent.
  std::vector<Ranked> close = {ranking[0], {first[1], 0.885, "model/r/1/r1-c01", {}, {}}};
  auto next = NextRound(p, 2, ranking, close);
  EXPECT_GE(count_pixels(next), 1);
  EXPECT_EQ(next[2].parent, "r1-c01");  // after the top-k, before their second children
  EXPECT_EQ(next[0].parent, "r1-c00");  // the champion still comes first
  // 0.85 is further behind than 0.02: no candidate for it.
  std::vector<Ranked> far = {ranking[0], {first[1], 0.85, "model/r/1/r1-c01", {}, {}}};
  EXPECT_EQ(count_pixels(NextRound(p, 2, ranking, far)), 0);
  // The margin is the pipeline's.
  p.rounds.backbone_margin = 0.1;
  EXPECT_GE(count_pixels(NextRound(p, 2, ranking, far)), 1);
}

TEST(Machine, BuiltInLocalMatchesConfigFile) {
  Machine built = LoadMachine("local");
  Machine file = LoadMachine(std::string(MSAFLOW_SOURCE_DIR) + "/configs/machines/local.json");
  ASSERT_EQ(built.modules.size(), file.modules.size());
  for (const auto& [k, v] : built.modules) {
    EXPECT_EQ(v.max_ranks, file.modules.at(k).max_ranks);
    EXPECT_EQ(v.description, file.modules.at(k).description);
  }
  EXPECT_TRUE(built.nam.serve);
  EXPECT_EQ(built.nam.serve, file.nam.serve);
  EXPECT_EQ(built.nam.listen, file.nam.listen);
  EXPECT_EQ(built.nam.provider, file.nam.provider);
  EXPECT_EQ(built.nam.capacity, file.nam.capacity);
  try {
    built.Module("gpu", "p.json: /steps/train/module");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "p.json: /steps/train/module: module 'gpu' is not in machine 'local' (has cm, dam, esb)");
  }
}

}  // namespace
}  // namespace msaflow::orchestrator
