// The module steps of one round, run in-process on a mem:// NAM, with and without faults
// injected into the store (nam/fault_store.h through MSAFLOW_NAM_FAULTS, as a launcher's
// module process would see them).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/dataset.h"
#include "kernels/half.h"
#include "modules/features.h"
#include "modules/finetune_maps.h"
#include "modules/int8_calibration.h"
#include "modules/steps.h"
#include "nam/fault_store.h"
#include "nam/store.h"
#include "orchestrator/planner.h"
#include "parallel/comm.h"
#include "ranking/rank.h"
#include "tests/unit/tiny_images.h"
#include "workflow/backbones.h"
#include "workflow/candidates.h"
#include "workflow/datasets.h"
#include "workflow/machine.h"
#include "workflow/objects.h"
#include "workflow/pipeline.h"
#include "workflow/rung0_features.h"
#include "workflow/task.h"

namespace msaflow {
namespace {

using nlohmann::json;

class TinyRound : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/msaflow-modules-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    test_data::WriteTinyImages(dir_);  // three classes of 8x8 images
    doc_ = {{"format", "msaflow.pipeline/1"},
                {"name", "tiny"},
                {"datasets",
                 {{"train", {{"format", "idx"}, {"images", "train-images"}, {"labels", "train-labels"}}},
                  {"test", {{"format", "idx"}, {"images", "test-images"}, {"labels", "test-labels"}}},
                  {"validation", {{"from", "train"}, {"fraction", 0.25}, {"seed", 2}}}}},
                {"backbones", json::array({{{"name", "pixels"}, {"kind", "pixels"}}})},
                {"head", {{"type", {"softmax"}}, {"lr", {0.01}}, {"epochs", {5}}, {"batch", 16}}},
                {"rounds", {{"max", 1}, {"candidates", 2}, {"seed", 1}}}};
    machine_ = workflow::LoadMachine("local");
    Replan();
  }
  // Parses doc_ and plans its first round on a fresh mem:// NAM.
  void Replan() {
    static int n = 0;
    nam_ = "mem://modules-test-" + std::to_string(n++);
    pipeline_ = workflow::ParsePipeline(doc_.dump(), "tiny.json", dir_);
    plan_ = orchestrator::PlanRound(pipeline_, machine_, "run1", nam_, 1, workflow::FirstRound(pipeline_), {});
    store_ = nam::OpenStore(nam_);
  }
  void TearDown() override {
    ::unsetenv("MSAFLOW_NAM_FAULTS");
    std::filesystem::remove_all(dir_);
  }
  void Step(const std::string& step) {
    for (const auto& t : plan_.tasks)
      if (t.step == workflow::ParseStep(step, "test")) {
        std::FILE* sink = std::fopen("/dev/null", "w");
        try {
          parallel::SelfComm self;
          modules::RunStep(t.step, t.body, self, sink);
        } catch (...) {
          std::fclose(sink);
          throw;
        }
        std::fclose(sink);
        return;
      }
    FAIL() << "no task for " << step;
  }
  void Faults(const std::string& rules) { ::setenv("MSAFLOW_NAM_FAULTS", rules.c_str(), 1); }
  ErrorKind StepFails(const std::string& step, std::string* what) {
    try {
      Step(step);
    } catch (const Error& e) {
      *what = e.what();
      return e.kind();
    }
    return ErrorKind::kInternal;
  }

  std::string dir_, nam_;
  json doc_;
  workflow::Pipeline pipeline_;
  orchestrator::Machine machine_;
  orchestrator::RoundPlan plan_;
  std::unique_ptr<nam::Store> store_;
};

TEST_F(TinyRound, RunsAllSteps) {
  for (const char* s : {"load", "prepare", "train", "store", "evaluate", "select"}) Step(s);
  json best = json::parse(store_->Get(workflow::BestObject("run1", 1)).bytes);
  EXPECT_GT(best["champion"]["accuracy"].get<double>(), 0.9);  // an easy problem
}

// The coordinator's shortcut: a step runs in-process when it has nothing to compute (load and
// prepare, any ranks), is light (load, store, select of one rank) or small (train and evaluate
// of one rank whose heads take less work than a process start), and then writes what the step's
// process would (summary, outputs, done object); otherwise it writes nothing at all.
TEST_F(TinyRound, OnlySettledLightOrSmallStepsRunInTheCoordinator) {
  std::FILE* sink = std::fopen("/dev/null", "w");
  auto here = [&](const orchestrator::RoundPlan& plan, const std::string& step, int64_t ranks = 1) {
    for (const auto& t : plan.tasks)
      if (t.step == workflow::ParseStep(step, "test"))
        return modules::RunStepInCoordinator(t.step, ranks, t.body, *store_, sink);
    ADD_FAILURE() << "no task for " << step;
    return std::string();
  };
  auto done = [&](int round, const char* step) {
    return store_->Stat(workflow::TaskDoneObject("run1", round, workflow::ParseStep(step, "test"))).has_value();
  };
  EXPECT_EQ(here(plan_, "prepare"), "");  // nothing loaded: it cannot even start
  EXPECT_EQ(here(plan_, "load", 2), "");  // a fresh NAM, and two ranks asked for: a process
  EXPECT_TRUE(store_->List("").empty());
  EXPECT_EQ(here(plan_, "load"), modules::kLightStep);  // one rank: light, done here
  EXPECT_TRUE(store_->Stat(workflow::BackboneObject("pixels")));
  EXPECT_TRUE(done(1, "load"));
  const size_t after_load = store_->List("").size();
  EXPECT_EQ(here(plan_, "prepare"), "");  // no features yet, no cached dataset digest
  EXPECT_EQ(store_->List("").size(), after_load);
  Step("prepare");
  EXPECT_EQ(here(plan_, "train", 2), "");  // two ranks: a process
  {  // heads of far more work than a process start: a process, and nothing written here
    json big = doc_;
    big["head"] = {{"type", {"mlp"}}, {"hidden", {4096}}, {"lr", {0.01}}, {"epochs", {10000}}};
    const workflow::Pipeline p = workflow::ParsePipeline(big.dump(), "tiny.json", dir_);
    const auto plan = orchestrator::PlanRound(p, machine_, "run1", nam_, 1, workflow::FirstRound(p), {});
    const size_t objects = store_->List("").size();
    EXPECT_EQ(here(plan, "train"), "");
    EXPECT_EQ(here(plan, "evaluate"), "");  // no models yet: it fails, and a process says why
    EXPECT_EQ(store_->List("").size(), objects);
  }
  EXPECT_FALSE(done(1, "train"));
  EXPECT_EQ(here(plan_, "train"), modules::kSmallStep);  // 2 softmax heads, 68 rows, 5 epochs
  EXPECT_TRUE(done(1, "train"));
  EXPECT_EQ(here(plan_, "store"), modules::kLightStep);
  EXPECT_FALSE(store_->List("model/run1/1/").empty());
  EXPECT_EQ(here(plan_, "evaluate", 2), "");
  EXPECT_FALSE(done(1, "evaluate"));
  EXPECT_EQ(here(plan_, "evaluate"), modules::kSmallStep);
  EXPECT_TRUE(done(1, "evaluate"));
  EXPECT_EQ(here(plan_, "select", 2), "");
  EXPECT_FALSE(done(1, "select"));
  EXPECT_EQ(here(plan_, "select"), modules::kLightStep);
  EXPECT_TRUE(store_->Stat(workflow::BestObject("run1", 1)));
  EXPECT_TRUE(store_->List("eval/run1/1/").empty());  // the shards it consumed, removed once done
  const auto round2 = orchestrator::PlanRound(pipeline_, machine_, "run1", nam_, 2, workflow::FirstRound(pipeline_), {});
  EXPECT_EQ(here(round2, "load", 2), modules::kNothingToCompute);  // settled: whatever the ranks
  EXPECT_EQ(here(round2, "prepare", 2), modules::kNothingToCompute);
  for (const char* step : {"load", "prepare"}) {
    const auto d = store_->Stat(workflow::TaskDoneObject("run1", 2, workflow::ParseStep(step, "test")));
    ASSERT_TRUE(d) << step;
    EXPECT_EQ(d->meta.value("key", ""), workflow::TaskKey(round2.tasks[step == std::string("load") ? 0 : 1].body));
  }
  const json summary = json::parse(store_->Get(workflow::PreparedObject("run1", 2)).bytes);
  EXPECT_EQ(summary["computed"].size(), 0u);
  EXPECT_EQ(summary["reused"].size(), 3u);  // pixels x train, validation, test
  // A training file changed since its digest was cached: prepare must read it again.
  std::vector<uint8_t> px(90 * 64, 7);
  kernels::WriteIdxImages(dir_ + "/train-images", 90, 8, 8, px.data());
  const auto round3 = orchestrator::PlanRound(pipeline_, machine_, "run1", nam_, 3, workflow::FirstRound(pipeline_), {});
  const size_t before = store_->List("").size();
  EXPECT_EQ(here(round3, "load"), modules::kNothingToCompute);
  EXPECT_EQ(here(round3, "prepare"), "");
  EXPECT_FALSE(store_->Stat(workflow::PreparedObject("run1", 3)));
  EXPECT_FALSE(store_->Stat(workflow::TaskDoneObject("run1", 3, workflow::ParseStep("prepare", "test"))));
  EXPECT_EQ(store_->List("").size(), before + 1);  // round 3's load done object, nothing else
  std::fclose(sink);
}

// A long training keeps a curve of at most 100 points, spread evenly with the first and the last
// epoch in, so its model's metadata fits the NAM's 16 KiB (at 400 epochs the whole curve did
// not: a fabric NAM refused the model, and every store refuses it now).
TEST_F(TinyRound, ALongTrainingsCurveIsThinnedToFitTheModelsMetadata) {
  doc_["head"]["epochs"] = {3000};
  doc_["rounds"]["candidates"] = 1;
  Replan();
  for (const char* s : {"load", "prepare", "train", "store"}) Step(s);
  const auto models = store_->List("model/run1/1/");
  ASSERT_EQ(models.size(), 1u);
  const json& meta = models[0].meta;
  EXPECT_LE(meta.dump().size(), nam::kMaxMeta);
  const json& c = meta.at("curve");
  ASSERT_EQ(c.at("epoch").size(), 100u);
  for (const char* k : {"step", "seconds", "loss", "train_accuracy"}) EXPECT_EQ(c.at(k).size(), 100u) << k;
  EXPECT_EQ(c["epoch"][0], 1);
  EXPECT_EQ(c["epoch"][99], 3000);
  for (size_t i = 1; i < 100; ++i) {
    const int64_t gap = c["epoch"][i].get<int64_t>() - c["epoch"][i - 1].get<int64_t>();
    EXPECT_TRUE(gap == 30 || gap == 31) << i << ": " << gap;  // 2999 epochs between the ends, in 99 gaps
    EXPECT_GT(c["step"][i].get<int64_t>(), c["step"][i - 1].get<int64_t>());
  }
  EXPECT_EQ(c["step"][99].get<int64_t>() / 3000 * 3000, c["step"][99].get<int64_t>());  // whole epochs of steps
}

// Features stored as float16: half the NAM bytes, the same values to half precision, and a
// round on them picks a champion as good as on float32.
TEST_F(TinyRound, HalfFeaturesTakeHalfTheNamAndTrainAsWell) {
  auto features = [&](std::map<std::string, std::string>* parts) {
    uint64_t bytes = 0;  // of the parts; the features objects themselves hold the labels
    for (const auto& o : store_->List("features/")) {
      if (o.name.find(".p") == std::string::npos) continue;
      bytes += o.size;
      (*parts)[o.name.substr(o.name.find('-') + 1)] = store_->Get(o.name).bytes;  // dataset digest and part
    }
    return bytes;
  };
  auto round = [&] {
    for (const char* s : {"load", "prepare", "train", "store", "evaluate", "select"}) Step(s);
    return json::parse(store_->Get(workflow::BestObject("run1", 1)).bytes)["champion"];
  };
  const json f32 = round();
  std::map<std::string, std::string> f32_parts, f16_parts;
  const uint64_t f32_bytes = features(&f32_parts);
  doc_["backbones"][0]["feature_dtype"] = "f16";
  Replan();
  const json f16 = round();
  const uint64_t f16_bytes = features(&f16_parts);
  EXPECT_EQ(f16_bytes * 2, f32_bytes);  // two bytes a value instead of four
  ASSERT_EQ(f16_parts.size(), f32_parts.size());
  ASSERT_FALSE(f16_parts.empty());
  for (const auto& [part, wide] : f32_parts) {
    const std::string& narrow = f16_parts.at(part);
    ASSERT_EQ(narrow.size() * 2, wide.size());
    for (size_t i = 0; i < narrow.size() / 2; ++i) {
      float a, b;
      uint16_t h;
      std::memcpy(&a, wide.data() + 4 * i, 4);
      std::memcpy(&h, narrow.data() + 2 * i, 2);
      b = kernels::HalfToFloatScalar(h);
      ASSERT_LE(std::fabs(a - b), std::fabs(a) * 0x1p-11f + 0x1p-24f) << part << " " << i;
    }
  }
  EXPECT_GT(f16["test"]["accuracy"].get<double>(), 0.9);
  EXPECT_NEAR(f16["test"]["accuracy"].get<double>(), f32["test"]["accuracy"].get<double>(), 2.0 / 45);
}

TEST_F(TinyRound, FeaturesPastFloat16sRangeAreRefusedNamingTheBackbone) {
  std::vector<uint16_t> out;
  const float ok[] = {1.f, -65504.f}, big[] = {1.f, 70000.f}, nan[] = {std::nanf("")};
  modules::NarrowFeatures("m", ok, 2, out);
  EXPECT_EQ(out.size(), 2u);
  for (const auto& [x, n, value] : {std::tuple<const float*, size_t, std::string>{big, 2, "70000"}, {nan, 1, "NaN"}}) {
    try {
      modules::NarrowFeatures("mobilenet", x, n, out);
      FAIL() << "narrowed " << value;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_EQ(std::string(e.what()), "backbone 'mobilenet': a feature value of " + value +
                                           " is beyond float16's range (65504): set its \"feature_dtype\" to \"f32\"");
    }
  }
}

TEST_F(TinyRound, DatasetDigestsAreCachedByTheFilesStampNotReadAgain) {
  Step("load");
  Step("prepare");
  EXPECT_EQ(store_->List("digest/").size(), 3u);  // train, validation, test
  // Damage the training images in place, keeping size, inode and modification time.
  const std::string images = dir_ + "/train-images";
  struct stat before {};
  ASSERT_EQ(::stat(images.c_str(), &before), 0);
  {
    std::fstream f(images, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);  // every pixel, after the IDX header
    const std::string bright(90 * 64, '\xff');
    f.write(bright.data(), static_cast<std::streamsize>(bright.size()));
  }
  timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, images.c_str(), times, 0), 0);
  Step("train");  // its features key from the cached digest: the images are not read
  // A new modification time: the images are read and hashed again; the damage gives a new
  // digest, under which there are no features.
  times[1].tv_sec += 10;
  ASSERT_EQ(::utimensat(AT_FDCWD, images.c_str(), times, 0), 0);
  std::string what;
  EXPECT_EQ(StepFails("train", &what), ErrorKind::kNotFound) << what;
  EXPECT_NE(what.find("no object 'features/"), std::string::npos) << what;
  // With the cache off, the same.
  times[1].tv_sec -= 10;
  ASSERT_EQ(::utimensat(AT_FDCWD, images.c_str(), times, 0), 0);
  ::setenv("MSAFLOW_DIGEST_CACHE", "0", 1);
  EXPECT_EQ(StepFails("train", &what), ErrorKind::kNotFound) << what;
  ::unsetenv("MSAFLOW_DIGEST_CACHE");
}

TEST_F(TinyRound, CorruptFeaturesStopTrainingWithNothingWritten) {
  for (const char* s : {"load", "prepare"}) Step(s);
  Faults(R"([{"op": "get", "prefix": "features/", "action": "corrupt", "count": 0}])");
  std::string what;
  EXPECT_EQ(StepFails("train", &what), ErrorKind::kCorrupt);
  EXPECT_NE(what.find("features/"), std::string::npos) << what;
  ::unsetenv("MSAFLOW_NAM_FAULTS");
  EXPECT_TRUE(store_->List("staging/").empty());  // no head was staged from bad features
  Step("train");                                  // and the step succeeds once the NAM is sound
  EXPECT_EQ(store_->List("staging/").size(), 2u);
}

TEST_F(TinyRound, AFailedPutLeavesNoModelAndTheStepCanBeRetried) {
  for (const char* s : {"load", "prepare", "train"}) Step(s);
  Faults(R"([{"op": "put", "prefix": "model/", "action": "fail", "nth": 2}])");
  std::string what;
  EXPECT_EQ(StepFails("store", &what), ErrorKind::kUnavailable);
  EXPECT_NE(what.find("injected fault"), std::string::npos) << what;
  // The first put went through (nth 2 fails the second): that model is there, whole; the
  // second is not there at all; and no staged head was removed before all were published.
  ASSERT_EQ(store_->List("model/").size(), 1u);
  for (const auto& o : store_->List("model/")) EXPECT_NO_THROW(store_->Get(o.name));
  EXPECT_EQ(store_->List("staging/").size(), 2u);
  ::unsetenv("MSAFLOW_NAM_FAULTS");
  Step("store");
  EXPECT_EQ(store_->List("model/").size(), 2u);
}

// Select consumes the evaluation shards; a select that fails (or is killed) after merging them
// must find them all when it runs again, and they go only once it is done.
TEST_F(TinyRound, ASelectFailedAfterMergingRunsAgainToTheSameChampion) {
  for (const char* s : {"load", "prepare", "train", "store", "evaluate"}) Step(s);
  const size_t shards = store_->List("eval/").size();
  ASSERT_GE(shards, 2u);
  Faults(R"([{"op": "put", "prefix": "best/", "action": "fail", "nth": 1}])");
  std::string what;
  EXPECT_EQ(StepFails("select", &what), ErrorKind::kUnavailable) << what;
  EXPECT_FALSE(store_->Stat(workflow::TaskDoneObject("run1", 1, workflow::ParseStep("select", "test"))));
  EXPECT_EQ(store_->List("result/").size(), 2u);     // it got as far as the merged results
  EXPECT_EQ(store_->List("eval/").size(), shards);   // and consumed none of the shards
  ::unsetenv("MSAFLOW_NAM_FAULTS");
  Step("select");
  json best = json::parse(store_->Get(workflow::BestObject("run1", 1)).bytes);
  EXPECT_GT(best["champion"]["accuracy"].get<double>(), 0.9);
  EXPECT_EQ(best["champion"]["round"], 1);
  EXPECT_TRUE(store_->List("eval/").empty());  // consumed once select was done
  EXPECT_TRUE(store_->Stat(workflow::TaskDoneObject("run1", 1, workflow::ParseStep("select", "test"))));
}

// Shards left by an earlier evaluate that split the test set more finely are not merged.
TEST_F(TinyRound, SelectMergesOnlyTheShardsEvaluateWrote) {
  for (const char* s : {"load", "prepare", "train", "store", "evaluate"}) Step(s);
  json summary = json::parse(store_->Get(workflow::EvaluatedObject("run1", 1)).bytes);
  const int64_t shards = summary["shards"].get<int64_t>();
  const std::string cand = plan_.tasks.back().body["candidates"][0]["id"];
  int64_t count = 0;  // the images evaluate's shards hold between them
  for (int64_t s = 0; s < shards; ++s)
    count += json::parse(store_->Get(workflow::EvalObject("run1", 1, cand, s)).bytes)["count"].get<int64_t>();
  ASSERT_GT(count, 0);
  std::string stale = store_->Get(workflow::EvalObject("run1", 1, cand, 0)).bytes;
  store_->Put(workflow::EvalObject("run1", 1, cand, shards), stale, {{"kind", "eval-shard"}});
  Step("select");
  json result = json::parse(store_->Get(workflow::ResultObject("run1", 1, cand)).bytes);
  EXPECT_EQ(result["shards"].get<int64_t>(), shards);
  EXPECT_EQ(result["count"].get<int64_t>(), count) << result.dump();
}

TEST_F(TinyRound, AnUnreachableNamFailsTheStepWithItsName) {
  Faults(R"([{"op": "any", "action": "fail", "kind": "unavailable", "count": 0}])");
  std::string what;
  EXPECT_EQ(StepFails("load", &what), ErrorKind::kUnavailable);
  EXPECT_NE(what.find(nam_), std::string::npos) << what;
}

TEST_F(TinyRound, ASlowNamChangesNothingButTime) {
  for (const char* s : {"load", "prepare", "train", "store", "evaluate", "select"}) Step(s);
  json fast = json::parse(store_->Get(workflow::BestObject("run1", 1)).bytes);
  // Every NAM call of the four steps waits 3 ms, on a clock that counts the waits exactly.
  ManualClock clock;
  nam::SetFaultDelayClock(&clock);
  Faults(R"([{"op": "any", "action": "delay", "delay_ms": 3, "count": 0}])");
  for (const char* s : {"train", "store", "evaluate", "select"}) Step(s);
  nam::SetFaultDelayClock(nullptr);
  json slow = json::parse(store_->Get(workflow::BestObject("run1", 1)).bytes);
  EXPECT_EQ(slow["champion"], fast["champion"]);
  // The delay was applied, call by call: a whole number of 3 ms waits, at least two per step
  // (its inputs, its done object).
  const auto slept_us = std::chrono::duration_cast<std::chrono::microseconds>(clock.slept()).count();
  EXPECT_GE(slept_us, 4 * 2 * 3000);
  EXPECT_EQ(slept_us % 3000, 0) << slept_us;
}

// Rung 0 of the halving strategy hands prepare a backbone's features on a subset of the training
// rows (orchestrator/halving.h): prepare runs only the other rows through the backbone, checks
// one of the subset's bit for bit, and writes the very bytes a prepare of every row writes, in
// parts that a batch of computed rows spans several of. A subset whose checked row differs, or
// that was made for another backbone or other files, is not used.
TEST_F(TinyRound, Rung0sFeaturesAreNotComputedAgainAndChangeNoBit) {
  ::setenv("MSAFLOW_PART_BYTES", "16384", 1);  // parts of one 64-row batch: the train split's 68 rows in 2
  doc_["backbones"] = json::array({{{"name", "mnv2"},
                                    {"onnx", std::string(MSAFLOW_SOURCE_DIR) + "/models/mobilenet_v2.onnx"},
                                    {"feature_layer", "block_3_expand_relu"},
                                    {"input", {{"height", 16}, {"width", 16}}}}});
  doc_["rounds"] = {{"max", 1}, {"candidates", 2}, {"seed", 1}, {"strategy", "halving"}, {"eta", 2}};
  auto parts = [&] {  // the train split's features parts, by part
    std::map<std::string, std::string> out;
    for (const auto& o : store_->List("features/"))
      if (o.name.find(".p") != std::string::npos) out[o.name] = store_->Get(o.name).bytes;
    return out;
  };
  auto train_entry = [&] {
    const json summary = json::parse(store_->Get(workflow::PreparedObject("run1", 1)).bytes);
    for (const json& e : summary["computed"])
      if (e["split"] == "train") return e;
    ADD_FAILURE() << "no train entry: " << summary.dump();
    return json();
  };
  // Every row through the backbone.
  Replan();
  Step("load");
  Step("prepare");
  const auto plain = parts();
  EXPECT_EQ(train_entry().count("reused_rows"), 0u);
  ASSERT_EQ(plain.size(), 2u + 1 + 1);  // train in 2 parts, validation and test in 1

  // Rung 0's subset, computed as `msaflow rank` does.
  ranking::RankOptions o;
  o.fraction = 0.3;
  o.keep_features = true;
  ranking::Ranking r = ranking::RankBackbones(pipeline_, o);
  ASSERT_EQ(r.backbones.size(), 1u);
  ASSERT_TRUE(r.backbones[0].as_prepared);
  workflow::SubsetFeatures s;
  s.backbone = "mnv2";
  s.backbone_digest = workflow::BackboneDigestOf(pipeline_.backbones[0], ReadFile(pipeline_.backbones[0].onnx), "");
  s.split_stamp = ChecksumHex(workflow::SplitStamp(pipeline_, "train"));
  s.dim = r.backbones[0].dim;
  s.rows = r.rows;
  s.values = r.backbones[0].features;
  ASSERT_GE(s.rows.size(), 30u);
  auto prepare_with = [&](const workflow::SubsetFeatures& given) {
    Replan();
    Step("load");
    // The digest rung 0 computes is the one load gives the backbone.
    EXPECT_EQ(store_->Stat(workflow::BackboneObject("mnv2"))->meta["digest"], s.backbone_digest);
    store_->Put(workflow::Rung0FeaturesObject("run1", "mnv2"), workflow::SubsetFeaturesBody(given),
                workflow::SubsetFeaturesMeta(given));
    Step("prepare");
    // Served: removed once the step's done object is in.
    EXPECT_FALSE(store_->Stat(workflow::Rung0FeaturesObject("run1", "mnv2")));
    return train_entry();
  };

  json e = prepare_with(s);
  EXPECT_EQ(e["reused_rows"], static_cast<int64_t>(s.rows.size()) - 1);  // the checked row ran again
  EXPECT_NE(e["per_rank"][0].value("spot_check", "").find("identical"), std::string::npos) << e.dump();
  EXPECT_EQ(parts(), plain);

  // The checked row (the subset's first) differs: nothing of the subset is used, every row is computed.
  workflow::SubsetFeatures bent = s;
  bent.values[3] = std::nextafter(bent.values[3], 1e9f);
  e = prepare_with(bent);
  EXPECT_EQ(e["reused_rows"], 0);
  EXPECT_EQ(e["per_rank"][0].value("spot_check", "").rfind("differed: mnv2, row ", 0), 0u) << e.dump();
  EXPECT_EQ(parts(), plain);

  // Made for other files, or for another backbone: not read.
  workflow::SubsetFeatures other = s;
  other.split_stamp = "0123456789abcdef";
  EXPECT_EQ(prepare_with(other).count("reused_rows"), 0u);
  EXPECT_EQ(parts(), plain);
  other = s;
  other.backbone_digest = "0123456789abcdef";
  EXPECT_EQ(prepare_with(other).count("reused_rows"), 0u);
  EXPECT_EQ(parts(), plain);
  ::unsetenv("MSAFLOW_PART_BYTES");
}

// halving with growing data (issue 30): round 1's prepare computes a third of the training split,
// each row the very values a prepare of the whole split gives it; round 2's prepare of the whole
// split takes those rows from round 1's features object (one computed again as a check) and writes
// the same bytes as a prepare of every row. Made for other files, the object is not read.
TEST_F(TinyRound, AHalvingRoundsDataGrowsFromTheRoundBefore) {
  ::setenv("MSAFLOW_PART_BYTES", "16384", 1);  // parts of one 64-row batch: the train split's 68 rows in 2
  // Two models in the race (the data grows only where a smaller part could spare one a pass): a
  // copy of MobileNetV2 is another file.
  const std::string model = std::string(MSAFLOW_SOURCE_DIR) + "/models/mobilenet_v2.onnx";
  std::filesystem::copy_file(model, dir_ + "/other.onnx");
  doc_["backbones"] = json::array({{{"name", "mnv2"}, {"onnx", model}, {"feature_layer", "block_3_expand_relu"},
                                    {"input", {{"height", 16}, {"width", 16}}}},
                                   {{"name", "other"}, {"onnx", "other.onnx"}, {"feature_layer", "block_1_expand_relu"},
                                    {"input", {{"height", 16}, {"width", 16}}}}});
  doc_["rounds"] = {{"max", 2}, {"candidates", 2}, {"seed", 1}, {"strategy", "halving"}, {"eta", 3}};
  auto train_entry = [&](int round) {
    const json summary = json::parse(store_->Get(workflow::PreparedObject("run1", round)).bytes);
    for (const json& e : summary["computed"])
      if (e["split"] == "train" && e["backbone"] == "mnv2") return e;
    ADD_FAILURE() << "no train entry computed in round " << round << ": " << summary.dump();
    return json();
  };
  auto parts_of = [&](const std::string& object) {  // the parts of a features object, by name
    std::map<std::string, std::string> out;
    for (const auto& o : store_->List(object + ".p")) out[o.name] = store_->Get(o.name).bytes;
    return out;
  };
  // Every row of the whole split through the backbone.
  Replan();
  Step("load");
  Step("prepare");
  const std::string whole_object = train_entry(1)["object"];
  const auto plain = parts_of(whole_object);
  ASSERT_EQ(plain.size(), 2u);
  OverlapChoice in_turn(OverlapMode::kOff);
  const modules::Features all = modules::LoadFeaturesObject(*store_, whole_object, in_turn);

  // Round 1 of the run: a third of the split (at least 10 of each class). Every round here takes
  // the first round's two heads, one on each model (the race a round 2 that continued both would
  // have): only their backbones matter to what prepare computes.
  auto round = [&](int r) {
    const auto fresh = workflow::FirstRound(pipeline_);
    EXPECT_EQ(fresh.size(), 2u);
    EXPECT_NE(fresh[0].backbone, fresh[1].backbone);
    workflow::Pipeline rp = workflow::RoundPipeline(pipeline_, r, fresh);
    plan_ = orchestrator::PlanRound(rp, machine_, "run1", nam_, r, fresh, {});
    Step("load");
    Step("prepare");
    return rp;
  };
  auto run_from_scratch = [&] {
    Replan();  // a fresh NAM
    workflow::Pipeline r1 = round(1);
    EXPECT_DOUBLE_EQ(r1.train.subset_fraction, 1.0 / 3);
    return r1;
  };
  const workflow::Pipeline r1 = run_from_scratch();
  const json e1 = train_entry(1);
  const std::vector<int64_t> positions = workflow::OpenSplit(r1, "train").Positions();
  ASSERT_EQ(e1["rows"], static_cast<int64_t>(positions.size()));
  ASSERT_EQ(positions.size(), 30u);  // 10 of each of the 3 classes (a third would be fewer)
  EXPECT_EQ(e1.count("reused_rows"), 0u);
  const modules::Features sub = modules::LoadFeaturesObject(*store_, e1["object"], in_turn);
  ASSERT_EQ(sub.dim, all.dim);
  for (size_t i = 0; i < positions.size(); ++i)
    ASSERT_EQ(std::memcmp(sub.x.data() + i * sub.dim, all.x.data() + positions[i] * all.dim, sizeof(float) * sub.dim), 0)
        << "row " << i;
  EXPECT_TRUE(store_->Stat(e1["object"])->meta.contains("subset"));

  // Round 2: the whole split, growing from round 1's rows.
  const workflow::Pipeline r2 = round(2);
  EXPECT_FALSE(r2.train.subset());
  const json e2 = train_entry(2);
  EXPECT_EQ(e2["object"], whole_object);
  EXPECT_EQ(e2["reused_rows"], 29);  // the checked row ran again
  EXPECT_NE(e2["per_rank"][0].value("spot_check", "").find("identical"), std::string::npos) << e2.dump();
  EXPECT_EQ(parts_of(whole_object), plain);

  // Round 1's object made from other files (its stamp of the whole split differs): not read.
  run_from_scratch();
  nam::Object o = store_->Get(train_entry(1)["object"]);
  o.info.meta["subset"]["whole_stamp"] = "0123456789abcdef";
  store_->Put(o.info.name, o.bytes, o.info.meta);
  round(2);
  EXPECT_EQ(train_entry(2).count("reused_rows"), 0u);
  EXPECT_EQ(parts_of(whole_object), plain);
  ::unsetenv("MSAFLOW_PART_BYTES");
}

// Two cuts of one model are prepared in one pass over the images: each features object holds
// the very values a prepare of that cut alone writes (its parts may cut the rows elsewhere: the
// pass gives all its cuts the parts of the widest), and the summary says which ran together.
TEST_F(TinyRound, CutsOfOneModelArePreparedInOnePassWithTheirOwnValues) {
  const std::string model = std::string(MSAFLOW_SOURCE_DIR) + "/models/mobilenet_v2.onnx";
  auto prepare = [&](const json& cuts) {
    doc_["backbones"] = json::array({{{"name", "mnv2"}, {"onnx", model}, {"feature_layer", cuts},
                                      {"input", {{"height", 16}, {"width", 16}}}}});
    Replan();
    Step("load");
    Step("prepare");
    std::map<std::string, std::string> values;  // each features object's rows, whatever its parts
    for (const auto& o : store_->List("features/")) {
      if (o.name.find(".p") != std::string::npos) continue;
      for (int64_t p = 0; p < o.meta.at("parts").get<int64_t>(); ++p)
        values[o.name] += store_->Get(workflow::FeaturesPartObject(o.name, p)).bytes;
    }
    return std::make_pair(values, json::parse(store_->Get(workflow::PreparedObject("run1", 1)).bytes));
  };
  const auto [both, summary] = prepare({"block_3_expand_relu", "block_13_expand_relu"});
  ASSERT_EQ(both.size(), 6u);  // two cuts x train, validation, test
  ASSERT_EQ(summary["computed"].size(), 6u);
  for (const json& e : summary["computed"]) {
    const std::string other = e["backbone"] == "mnv2.block_3_expand_relu" ? "mnv2.block_13_expand_relu"
                                                                         : "mnv2.block_3_expand_relu";
    EXPECT_EQ(e["one_pass_with"], json::array({other})) << e.dump();
  }
  std::map<std::string, std::string> alone;
  for (const char* cut : {"block_3_expand_relu", "block_13_expand_relu"}) {
    const auto [values, s] = prepare(cut);
    EXPECT_EQ(s["computed"][0].count("one_pass_with"), 0u);
    alone.insert(values.begin(), values.end());
  }
  EXPECT_EQ(both, alone);
}

// A maps object as prepare writes it (modules/finetune_maps.h): two tail inputs of 2x3x3 and
// 4x1x1 values an image, `n` rows in parts of `part_rows`, float32 or float16. Row r's value j
// is Value(r, j), narrowed through float16 where the parts are.
constexpr int64_t kMapsDim = 2 * 3 * 3 + 4;
float MapValue(int64_t r, int64_t j) { return static_cast<float>(r % 97) + static_cast<float>(j) / 32.f; }
float StoredValue(int64_t r, int64_t j, bool half) {
  const float v = MapValue(r, j);
  return half ? kernels::HalfToFloatScalar(kernels::FloatToHalfScalar(v)) : v;
}
void PutMaps(nam::Store& store, const std::string& key, int64_t n, int64_t part_rows, bool half) {
  json meta = modules::FeaturesMeta(n, kMapsDim, 5, part_rows, half);
  meta["kind"] = "maps";
  meta["inputs"] = {{{"name", "a"}, {"dims", {2, 3, 3}}}, {{"name", "b"}, {"dims", {4, 1, 1}}}};
  std::string labels;
  for (int64_t r = 0; r < n; ++r) labels.push_back(static_cast<char>(r % 5));
  store.Put(key, labels, meta);
  for (int64_t p = 0; p * part_rows < n; ++p) {
    std::vector<float> v;
    for (int64_t r = p * part_rows; r < std::min(n, (p + 1) * part_rows); ++r)
      for (int64_t j = 0; j < kMapsDim; ++j) v.push_back(MapValue(r, j));
    std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    if (half) {
      std::vector<uint16_t> h(v.size());
      kernels::FloatToHalf(v.data(), h.data(), v.size());
      bytes.assign(reinterpret_cast<const char*>(h.data()), h.size() * sizeof(uint16_t));
    }
    store.Put(workflow::FeaturesPartObject(key, p), bytes, {{"kind", "maps-part"}});
  }
}
// The batch of `rows` read from `src` is every row's values, input a then input b.
void ExpectRows(modules::MapsSource& src, const std::vector<int64_t>& rows, bool half) {
  std::vector<std::vector<float>> out;
  std::vector<kernels::TensorDims> dims;
  src.Batch(rows.data(), static_cast<int64_t>(rows.size()), &out, &dims);
  const auto k = static_cast<int64_t>(rows.size());
  ASSERT_EQ(dims, (std::vector<kernels::TensorDims>{{k, 2, 3, 3}, {k, 4, 1, 1}}));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < kMapsDim; ++j) {
      const float got = j < 18 ? out[0][static_cast<size_t>(i * 18 + j)] : out[1][static_cast<size_t>(i * 4 + j - 18)];
      ASSERT_EQ(got, StoredValue(rows[static_cast<size_t>(i)], j, half))
          << "row " << rows[static_cast<size_t>(i)] << " value " << j;
    }
}

// Held whole, a source reads each part once, the first time a row of it is read, whatever the
// order of the rows and whether they were expected; float16 parts stay float16 until read.
TEST(MapsSource, HeldWholeReadsEachPartOnceInAnyOrder) {
  for (bool half : {false, true}) {
    auto store = nam::OpenStore("mem://maps-whole-" + std::to_string(half));
    PutMaps(*store, "maps/x", 103, 10, half);
    modules::MapsSource src(*store, "maps/x", 0);
    EXPECT_FALSE(src.streamed());
    EXPECT_EQ(src.n, 103);
    EXPECT_EQ(src.bytes(), 103 * kMapsDim * (half ? 2 : 4));
    EXPECT_EQ(src.inputs, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(src.y[102], 102 % 5);
    ExpectRows(src, {5, 102, 5, 0}, half);  // not expected: read all the same
    std::vector<int64_t> all(103);
    std::iota(all.begin(), all.end(), 0);
    std::mt19937_64 rng(7);
    src.Shuffle(all, rng);
    src.Expect(all.data(), 103);
    for (size_t lo = 0; lo < all.size(); lo += 16)
      ExpectRows(src,
                 std::vector<int64_t>(all.begin() + static_cast<ptrdiff_t>(lo),
                                      all.begin() + static_cast<ptrdiff_t>(std::min(all.size(), lo + 16))),
                 half);
    const auto st = src.stats();
    EXPECT_EQ(st.parts_read, 11);
    EXPECT_EQ(st.peak_bytes, src.bytes());
  }
}

// Streamed within a limit of four parts: windows of two parts, an epoch's order a permutation
// that keeps each window's rows together, each part read once an epoch, never more than the
// limit held, every row's values as stored.
TEST(MapsSource, StreamedReadsEachPartOnceAnEpochWithinItsLimit) {
  for (bool half : {false, true}) {
    auto store = nam::OpenStore("mem://maps-streamed-" + std::to_string(half));
    PutMaps(*store, "maps/x", 200, 10, half);
    const int64_t part = 10 * kMapsDim * (half ? 2 : 4);
    modules::MapsSource src(*store, "maps/x", 4 * part);
    ASSERT_TRUE(src.streamed());
    EXPECT_EQ(src.part_bytes(), part);
    EXPECT_EQ(src.window_parts(), 2);
    modules::MapsSource twin(*store, "maps/x", 4 * part);  // another rank: the same order from the same seed
    std::vector<int64_t> order(200), other(200);
    std::iota(order.begin(), order.end(), 0);
    std::iota(other.begin(), other.end(), 0);
    std::mt19937_64 rng(3), rng2(3);
    for (int epoch = 0; epoch < 3; ++epoch) {
      src.Shuffle(order, rng);
      twin.Shuffle(other, rng2);
      EXPECT_EQ(order, other);
      std::vector<int64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t r = 0; r < 200; ++r) ASSERT_EQ(sorted[static_cast<size_t>(r)], r);
      for (size_t w = 0; w < 200; w += 20) {  // a window: the 20 rows of two parts
        std::set<int64_t> parts;
        for (size_t k = w; k < w + 20; ++k) parts.insert(order[k] / 10);
        EXPECT_EQ(parts.size(), 2u) << "epoch " << epoch << ", window at " << w;
      }
      src.Expect(order.data(), 200);
      for (size_t lo = 0; lo < 200; lo += 7)
        ExpectRows(src,
                   std::vector<int64_t>(order.begin() + static_cast<ptrdiff_t>(lo),
                                        order.begin() + static_cast<ptrdiff_t>(std::min<size_t>(200, lo + 7))),
                   half);
      const auto st = src.stats();
      EXPECT_EQ(st.parts_read, 20 * (epoch + 1));
      EXPECT_LE(st.peak_bytes, 4 * part);
    }
  }
}

// A part missing or of the wrong size is named by the read that needs it, never a crash or a
// wrong value, and rows of the parts read before it were read as they are.
TEST(MapsSource, AMissingOrDamagedPartIsNamedByTheReadThatNeedsIt) {
  auto store = nam::OpenStore("mem://maps-damaged");
  PutMaps(*store, "maps/x", 40, 10, false);
  store->Remove(workflow::FeaturesPartObject("maps/x", 2));
  store->Put(workflow::FeaturesPartObject("maps/x", 3), "short", {});
  for (int64_t limit : {int64_t{0}, int64_t{1}}) {
    modules::MapsSource src(*store, "maps/x", limit);
    ExpectRows(src, {0, 15}, false);
    std::vector<std::vector<float>> out;
    std::vector<kernels::TensorDims> dims;
    const int64_t missing[] = {25}, damaged[] = {35};
    try {
      src.Batch(missing, 1, &out, &dims);
      ADD_FAILURE() << "a missing part was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
      EXPECT_NE(std::string(e.what()).find(workflow::FeaturesPartObject("maps/x", 2)), std::string::npos) << e.what();
    }
    modules::MapsSource again(*store, "maps/x", limit);
    try {
      again.Batch(damaged, 1, &out, &dims);
      ADD_FAILURE() << "a damaged part was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      EXPECT_NE(std::string(e.what()).find("5 bytes, expected 880 (10 rows x 22 float32)"), std::string::npos)
          << e.what();
    }
  }
  try {
    modules::MapsSource absent(*store, "maps/none", 0);
    ADD_FAILURE() << "an absent maps object was opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

// int8 ranges travel in the backbone object's metadata: they come back as they went, and a
// damaged or missing entry is named (prepare then stops instead of quantizing blindly).
TEST(Calibration, RangesRoundTripAndDamagedOnesAreNamed) {
  const kernels::Executor::Ranges ranges{{"input", 1.f}, {"block_1_add", 39.75f}};
  EXPECT_EQ(modules::RangesFromJson(modules::RangesToJson(ranges), "o"), ranges);
  auto error = [](const json& j) {
    try {
      modules::RangesFromJson(j, "NAM object 'backbone/m'");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(json()), "NAM object 'backbone/m': int8 ranges: expected an object of tensor ranges (load the backbone again)");
  EXPECT_EQ(error(json::object()), error(json()));
  EXPECT_EQ(error({{"input", "big"}}),
            "NAM object 'backbone/m': int8 range of tensor 'input': expected a finite non-negative number");
  EXPECT_EQ(error({{"input", -1.0}}), error({{"input", "big"}}));
}

}  // namespace
}  // namespace msaflow
