#include <gtest/gtest.h>

#include "common/error.h"
#include "common/files.h"
#include "workflow/candidates.h"
#include "orchestrator/machine.h"
#include "orchestrator/planner.h"

namespace msaflow::orchestrator {
namespace {

using workflow::ParsePipeline;

Pipeline TwoBackbones() {
  return ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"}},
    "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": "x", "input": {"height": 32, "width": 32}},
                  {"name": "pixels", "kind": "pixels"}],
    "head": {"type": ["softmax", "mlp"], "lr": [0.001, 0.01], "hidden": [8, 16]},
    "steps": {"evaluate": {"ranks": 64}},
    "rounds": {"max": 3, "candidates": 5, "top_k": 2, "seed": 9}})",
                       "p.json", "/b");
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

Pipeline WithTrain(const std::string& train, int64_t candidates) {
  return ParsePipeline(R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"}},
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
    ResolveTrainLayout(p, p.steps.at("train"), Dam(max_ranks), 4);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Planner, TrainLayoutResolvesAutoAndCountsServers) {
  // auto: candidates dealt out while there are enough of them, else data-parallel sync.
  Pipeline p = WithTrain(R"({"ranks": 4})", 4);
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at("train"), Dam(8), 4).mode, "independent");
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at("train"), Dam(8), 3).mode, "sync");
  // async and hybrid start their servers beside the gradient ranks.
  p = WithTrain(R"({"ranks": 4, "mode": "hybrid", "servers": 2, "max_staleness": 5})", 4);
  TrainLayout t = ResolveTrainLayout(p, p.steps.at("train"), Dam(8), 4);
  EXPECT_EQ(t.mode, "hybrid");
  EXPECT_EQ(t.processes(), 6);
  EXPECT_EQ(t.groups, 2);
  EXPECT_EQ(t.max_staleness, 5);
  RoundPlan plan = PlanRound(p, LoadMachine("local"), "run1", "mem://x", 1, FirstRound(p), {});
  // The task carries the layout the module reads back.
  EXPECT_EQ(workflow::TrainLayoutFromJson(plan.tasks[2].body["train"], "t").ToJson(), t.ToJson());
  // A machine with fewer processes: sync and async shrink, hybrid's groups cannot.
  p = WithTrain(R"({"ranks": 4, "mode": "async"})", 4);
  EXPECT_EQ(ResolveTrainLayout(p, p.steps.at("train"), Dam(3), 4).ranks, 2);
  EXPECT_EQ(LayoutError(p, 2), "t: /steps/train/ranks: 4 ranks + 1 server(s) need 5 processes, but module dam allows 2 "
                               "(max_ranks in the machine file); async needs 2 workers besides its servers");
  p = WithTrain(R"({"ranks": 4, "mode": "hybrid"})", 4);
  EXPECT_EQ(LayoutError(p, 4), "t: /steps/train/ranks: 4 ranks + 1 server(s) need 5 processes, but module dam allows 4 "
                               "(max_ranks in the machine file); hybrid groups need exactly the ranks asked for");
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

TEST(Candidates, PerturbDerivesFromTheBest) {
  Pipeline p = TwoBackbones();
  auto first = FirstRound(p);
  std::vector<Ranked> ranking = {{first[3], 0.9, "model/r/1/r1-c03"}, {first[0], 0.8, "model/r/1/r1-c00"}};
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
