#include <gtest/gtest.h>

#include "common/error.h"
#include "common/files.h"
#include "orchestrator/candidates.h"
#include "orchestrator/machine.h"
#include "orchestrator/planner.h"

namespace msaflow::orchestrator {
namespace {

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
