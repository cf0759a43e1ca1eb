#include "workflow/pipeline.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/files.h"
#include "workflow/task.h"

namespace msaflow::workflow {
namespace {

const char* kGood = R"({
  "name": "t",
  "datasets": {"train": {"images": "a", "labels": "b", "limit": 10}, "test": {"images": "/abs/c", "labels": "d"},
               "validation": {"from": "train", "fraction": 0.2}},
  "backbones": [{"name": "m", "onnx": "m.onnx", "feature_layer": "x", "input": {"height": 32, "width": 32}},
                {"name": "pixels", "kind": "pixels"}],
  "steps": {"train": {"mode": "async", "ranks": 2}},
  "rounds": {"max": 3, "candidates": 4}
})";

std::string ErrorOf(const std::string& text) {
  try {
    ParsePipeline(text, "p.json", "/base");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    return e.what();
  }
  return "(no error)";
}

// Replaces the first occurrence of `from` in the good pipeline.
std::string With(const std::string& from, const std::string& to) {
  std::string s = kGood;
  auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return s.replace(pos, from.size(), to);
}

TEST(Pipeline, ParsesAndResolvesPaths) {
  Pipeline p = ParsePipeline(kGood, "p.json", "/base");
  EXPECT_EQ(p.name, "t");
  EXPECT_EQ(p.train.images, "/base/a");
  EXPECT_EQ(p.test.images, "/abs/c");
  EXPECT_EQ(p.train.limit, 10);
  ASSERT_EQ(p.backbones.size(), 2u);
  EXPECT_EQ(p.backbones[0].onnx, "/base/m.onnx");
  EXPECT_EQ(p.backbones[1].kind, BackboneKind::kPixels);
  EXPECT_EQ(p.steps.at(workflow::Step::kTrain).parallel.mode, workflow::TrainMode::kAsync);
  EXPECT_EQ(p.steps.at(workflow::Step::kTrain).parallel.servers, 1);
  EXPECT_EQ(p.steps.at(workflow::Step::kEvaluate).module, "esb");
  EXPECT_EQ(p.rounds.max, 3);
  // The source round-trips with absolute paths.
  Pipeline q = PipelineFromSource(p.source);
  EXPECT_EQ(q.train.images, "/base/a");
  EXPECT_EQ(q.backbones[0].onnx, "/base/m.onnx");
}

TEST(Pipeline, LbfgsIsFullBatchAndRefusedWithAParameterServer) {
  const std::string lbfgs = With("\"rounds\"", "\"head\": {\"optimizer\": [\"adam\", \"lbfgs\"]}, \"rounds\"");
  EXPECT_EQ(ErrorOf(lbfgs),
            "p.json: /steps/train/mode: \"async\" takes minibatch gradients; the \"lbfgs\" optimizer (/head/optimizer) "
            "is full-batch: use mode sync, independent or auto");
  std::string sync = lbfgs;
  sync.replace(sync.find("\"async\""), 7, "\"sync\"");
  EXPECT_EQ(ParsePipeline(sync, "p.json", "/base").head.optimizers, (std::vector<std::string>{"adam", "lbfgs"}));
}

// What each training mode does with its ranks (workflow/kinds.h): the table the code that must
// choose reads instead of comparing modes.
TEST(TrainModes, CapabilitiesAndAutoResolution) {
  struct Row {
    TrainMode mode;
    bool servers, share, lockstep, groups;
    int64_t min_ranks;
  };
  const Row rows[] = {{TrainMode::kAuto, false, false, false, false, 1},
                      {TrainMode::kIndependent, false, false, false, false, 1},
                      {TrainMode::kSync, false, true, true, false, 1},
                      {TrainMode::kAsync, true, true, false, false, 2},
                      {TrainMode::kHybrid, true, true, false, true, 4}};
  for (const Row& r : rows) {
    SCOPED_TRACE(TrainModeName(r.mode));
    EXPECT_EQ(UsesParameterServers(r.mode), r.servers);
    EXPECT_EQ(RanksShareModels(r.mode), r.share);
    EXPECT_EQ(RanksInLockstep(r.mode), r.lockstep);
    EXPECT_EQ(HasGroups(r.mode), r.groups);
    EXPECT_EQ(MinRanks(r.mode), r.min_ranks);
    if (r.mode != TrainMode::kAuto) {
      EXPECT_EQ(ResolveAuto(r.mode, 1, 8), r.mode);
    }
  }
  EXPECT_EQ(ResolveAuto(TrainMode::kAuto, 6, 4), TrainMode::kIndependent);  // a model or more per rank
  EXPECT_EQ(ResolveAuto(TrainMode::kAuto, 4, 4), TrainMode::kIndependent);
  EXPECT_EQ(ResolveAuto(TrainMode::kAuto, 3, 4), TrainMode::kSync);  // ranks to spare: they share the models
}

TEST(Pipeline, ExactErrors) {
  EXPECT_EQ(ErrorOf(With("\"async\"", "\"asnyc\"")),
            "p.json: /steps/train/mode: \"asnyc\" is not one of auto, independent, sync, async, hybrid — did you mean "
            "\"async\"?");
  EXPECT_EQ(ErrorOf(With("\"max\": 3", "\"max\": 0")), "p.json: /rounds/max: 0 is out of range; expected 1..1000");
  EXPECT_EQ(ErrorOf(With("\"max\": 3", "\"maxx\": 3")),
            "p.json: /rounds/maxx: unknown key — did you mean \"max\"?");
  EXPECT_EQ(ErrorOf(With("\"max\": 3", "\"max\": \"three\"")),
            "p.json: /rounds/max: expected an integer in 1..1000, got string \"three\"");
  EXPECT_EQ(ErrorOf(With("\"labels\": \"b\", ", "")), "p.json: /datasets/train: missing required key \"labels\"");
  EXPECT_EQ(ErrorOf(With("\"height\": 32", "\"height\": 2")),
            "p.json: /backbones/0/input/height: 2 is out of range; expected 8..1024");
  EXPECT_EQ(ErrorOf(With("{\"name\": \"pixels\", \"kind\": \"pixels\"}", "{\"name\": \"m\", \"kind\": \"pixels\"}")),
            "p.json: /backbones/1/name: \"m\" is used by an earlier backbone; names must be unique");
  EXPECT_EQ(ErrorOf(With("\"kind\": \"pixels\"", "\"kind\": \"pixel\"")),
            "p.json: /backbones/1/kind: \"pixel\" is not one of onnx, pixels — did you mean \"pixels\"?");
  EXPECT_EQ(ErrorOf(With("\"feature_layer\": \"x\", ", "")),
            "p.json: /backbones/0: missing required key \"feature_layer\"");
  EXPECT_EQ(ErrorOf(With("\"name\": \"t\",", "\"name\": \"t\", \"colour\": 1,")),
            "p.json: /colour: unknown key (expected one of format, name, machine, nam, datasets, backbones, head, "
            "steps, rounds, metric, retries, fpga, select_on)");
  EXPECT_EQ(ErrorOf("{\"name\": "), "p.json: not valid JSON (parse error at line 1, column 10: syntax error while "
                                    "parsing value - unexpected end of input; expected '[', '{', or a literal)");
  EXPECT_EQ(ErrorOf("[]"), "p.json: /: expected an object, got an array");
  // Names that would fail only when the run writes NAM objects or makes its id (issue 31).
  EXPECT_EQ(ErrorOf(With("{\"name\": \"m\",", "{\"name\": \"..\",")),
            "p.json: /backbones/0/name: \"..\" cannot name NAM objects; expected a name such as \"mobilenetv2\"");
  const std::string long_name = ErrorOf(With("{\"name\": \"m\",", "{\"name\": \"" + std::string(65, 'm') + "\","));
  EXPECT_EQ(long_name.rfind("p.json: /backbones/0/name: \"mmm", 0), 0u) << long_name;
  EXPECT_NE(long_name.find("is 65 characters long; at most 64"), std::string::npos) << long_name;
  EXPECT_EQ(ErrorOf(With("\"name\": \"t\"", "\"name\": \"a/b\"")),
            "p.json: /name: \"a/b\" has a control character or '/'; a run's id starts with the name");
  EXPECT_EQ(ErrorOf(With("\"name\": \"t\"", "\"name\": \"a\\nb\"")),
            "p.json: /name: \"a\\nb\" has a control character or '/'; a run's id starts with the name");
}

TEST(Pipeline, BackbonePrecisionAndFeatureDtype) {
  Pipeline p = ParsePipeline(With("\"feature_layer\": \"x\",", "\"feature_layer\": \"x\", \"precision\": \"bf16\", "
                                  "\"feature_dtype\": \"f16\","), "p.json", "/base");
  EXPECT_EQ(p.backbones[0].precision, kernels::Precision::kBF16);
  EXPECT_EQ(p.backbones[0].feature_dtype, "f16");
  EXPECT_EQ(p.backbones[1].precision, kernels::Precision::kF32);  // the defaults
  EXPECT_EQ(p.backbones[1].feature_dtype, "f32");
  EXPECT_EQ(ErrorOf(With("\"feature_layer\": \"x\",", "\"feature_layer\": \"x\", \"precision\": \"int4\",")),
            "p.json: /backbones/0/precision: \"int4\" is not one of f32, bf16, int8 — did you mean \"int8\"?");
  EXPECT_EQ(ErrorOf(With("\"kind\": \"pixels\"", "\"kind\": \"pixels\", \"feature_dtype\": \"f8\"")),
            "p.json: /backbones/1/feature_dtype: \"f8\" is not one of f32, f16 — did you mean \"f32\"?");
  EXPECT_EQ(ErrorOf(With("\"kind\": \"pixels\"", "\"kind\": \"pixels\", \"precision\": \"bf16\"")),
            "p.json: /backbones/1/precision: not allowed for kind \"pixels\" (raw pixels are the features)");
}

// A model zoo's "cut where?": one ONNX file at several layers is one backbone per layer.
TEST(Pipeline, AListOfLayersIsOneBackbonePerLayer) {
  Pipeline p = ParsePipeline(With("\"feature_layer\": \"x\"", "\"feature_layer\": [\"x\", \"/Stage2/Mul_output_0\"]"),
                             "p.json", "/base");
  ASSERT_EQ(p.backbones.size(), 3u);
  EXPECT_EQ(p.backbones[0].name, "m.x");
  EXPECT_EQ(p.backbones[0].feature_layer, "x");
  EXPECT_EQ(p.backbones[1].name, "m.stage2-mul_output_0");
  EXPECT_EQ(p.backbones[1].feature_layer, "/Stage2/Mul_output_0");
  EXPECT_EQ(p.backbones[1].onnx, p.backbones[0].onnx);
  EXPECT_EQ(p.backbones[1].pointer, "/backbones/0");
  EXPECT_EQ(p.backbones[2].name, "pixels");
  // The source tasks carry round-trips: the list stays one entry, the pixels entry after it
  // gains no "onnx" (a run of such a pipeline once failed in load on exactly that).
  Pipeline q = PipelineFromSource(p.source);
  ASSERT_EQ(q.backbones.size(), 3u);
  EXPECT_EQ(q.backbones[1].onnx, "/base/m.onnx");
  EXPECT_EQ(q.backbones[2].kind, BackboneKind::kPixels);
  EXPECT_FALSE(p.source["backbones"][1].contains("onnx"));
  EXPECT_EQ(ErrorOf(With("\"feature_layer\": \"x\"", "\"feature_layer\": [\"x\", \"x\"]")),
            "p.json: /backbones/0/feature_layer/1: \"x\" is listed twice");
  EXPECT_EQ(ErrorOf(With("\"feature_layer\": \"x\"", "\"feature_layer\": []")),
            "p.json: /backbones/0/feature_layer: expected a layer name or a list of 1 to 16 of them");
}

// Regression tests for inputs that crashed or misled (issue 14), named after what they found.
TEST(Pipeline, NumberOverflowIsInvalidJsonNotAnInternalError) {
  EXPECT_EQ(ErrorOf(With("\"max\": 3", "\"max\": 1e999")),
            "p.json: not valid JSON (number overflow parsing '1e999')");
  std::string digits(100000, '7');
  std::string e = ErrorOf(With("\"max\": 3", "\"max\": " + digits));
  EXPECT_EQ(e.rfind("p.json: not valid JSON (number overflow parsing '777", 0), 0u) << e.substr(0, 100);
  EXPECT_LT(e.size(), 300u);
}

TEST(Pipeline, DuplicateKeysAreRefusedWithTheirPointer) {
  EXPECT_EQ(ErrorOf(With("\"max\": 3", "\"max\": 3, \"max\": 4")), "p.json: /rounds/max: duplicate key (each key may appear once)");
  EXPECT_EQ(ErrorOf(With("{\"name\": \"pixels\", \"kind\": \"pixels\"}",
                         "{\"name\": \"pixels\", \"kind\": \"pixels\", \"name\": \"q\"}")),
            "p.json: /backbones/1/name: duplicate key (each key may appear once)");
}

TEST(Pipeline, HugeIntegersAreOutOfRangeNotNegative) {
  EXPECT_EQ(ErrorOf(With("\"ranks\": 2", "\"ranks\": 9223372036854775808")),
            "p.json: /steps/train/ranks: 9223372036854775808 is out of range; expected 1..4096");
}

TEST(Pipeline, LongValuesAreCutShortInErrors) {
  std::string name(300, 'x');
  std::string e = ErrorOf(With("\"name\": \"t\"", "\"name\": \"" + name + "\""));
  EXPECT_EQ(e, "p.json: /name: \"" + std::string(59, 'x') + "… (302 characters) is 300 characters long; at most 64");
  e = ErrorOf(With("\"max\": 3", "\"max\": \"" + std::string(100000, 'y') + "\""));
  EXPECT_LT(e.size(), 200u);
}

TEST(Pipeline, TopKBeyondTheCandidatesIsRefused) {
  EXPECT_EQ(ErrorOf(With("\"candidates\": 4", "\"candidates\": 4, \"top_k\": 5")),
            "p.json: /rounds/top_k: 5 is more than the 4 candidates of a round; at most that many models can be kept");
  // Left out, top_k (2) follows a smaller number of candidates.
  EXPECT_EQ(ParsePipeline(With("\"candidates\": 4", "\"candidates\": 1"), "p.json", "/base").rounds.top_k, 1);
}

// A mode the train step cannot use is refused with the pointer and what would work.
TEST(Pipeline, TrainModesThatCannotRunAreRefused) {
  EXPECT_EQ(ErrorOf(With("\"ranks\": 2", "\"ranks\": 1")),
            "p.json: /steps/train/mode: async needs at least 2 ranks (workers that update the parameter server "
            "without waiting for each other); with 1 rank use \"sync\", or set \"ranks\": 2 or more");
  EXPECT_EQ(ErrorOf(With("\"ranks\": 2", "\"ranks\": 2, \"servers\": 3")),
            "p.json: /steps/train/servers: 3 servers for 2 workers; use at most as many servers as ranks");
  EXPECT_EQ(ErrorOf(With("\"mode\": \"async\", \"ranks\": 2", "\"mode\": \"hybrid\", \"ranks\": 6, \"groups\": 4")),
            "p.json: /steps/train/groups: 4 groups do not divide 6 ranks into groups of at least 2; groups that would "
            "work with 6 ranks: 2, 3");
  EXPECT_EQ(ErrorOf(With("\"mode\": \"async\", \"ranks\": 2", "\"mode\": \"hybrid\", \"ranks\": 3")),
            "p.json: /steps/train/groups: 2 groups do not divide 3 ranks into groups of at least 2; hybrid needs at "
            "least 4 ranks (2 groups of 2)");
  EXPECT_EQ(ErrorOf(With("\"mode\": \"async\"", "\"mode\": \"sync\", \"groups\": 2")),
            "p.json: /steps/train/groups: only for mode hybrid; mode is \"sync\"");
  EXPECT_EQ(ErrorOf(With("\"mode\": \"async\"", "\"mode\": \"sync\", \"servers\": 2")),
            "p.json: /steps/train/servers: only for mode async or hybrid (a parameter server); mode is \"sync\"");
  EXPECT_EQ(ErrorOf(With("\"ranks\": 2", "\"ranks\": 2, \"straggler\": {\"rank\": 2, \"factor\": 4}")),
            "p.json: /steps/train/straggler/rank: 2 is out of range; expected 0..1");
  Pipeline p = ParsePipeline(With("\"mode\": \"async\", \"ranks\": 2",
                                   "\"mode\": \"hybrid\", \"ranks\": 4, \"max_staleness\": 3, \"servers\": 2"),
                             "p.json", "/base");
  EXPECT_EQ(p.steps.at(workflow::Step::kTrain).parallel.groups, 2);
  EXPECT_EQ(p.steps.at(workflow::Step::kTrain).parallel.servers, 2);
  EXPECT_EQ(p.steps.at(workflow::Step::kTrain).parallel.max_staleness, 3);
}

// Found by fuzz/task_fuzz.cc: a task whose "module" was not a string escaped as
// "internal error: [json.exception.type_error.302]". Every top-level field of a real task
// file, given a value of another type, is refused as invalid input naming the field.
TEST(Task, EveryFieldOfTheWrongTypeIsRefusedByName) {
  for (const char* file : {"r1-load.json", "r1-train.json", "r1-evaluate.json", "r1-select.json"}) {
    const nlohmann::json real =
        nlohmann::json::parse(ReadFile(std::string(MSAFLOW_SOURCE_DIR) + "/fuzz/corpus/task/" + file));
    EXPECT_NO_THROW(ParseTask(real, file));
    for (const auto& item : real.items()) {
      for (const nlohmann::json& other : {nlohmann::json::object({{"x", 1}}), nlohmann::json(7.5), nlohmann::json()}) {
        if (other.type() == item.value().type()) continue;
        nlohmann::json bad = real;
        bad[item.key()] = other;
        try {
          ParseTask(bad, file);
          // Some fields may be absent or null (optional); none may crash the parser.
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << file << ": field '" << item.key() << "' = " << other.dump() << " escaped as " << e.what();
        }
      }
    }
  }
}

// Found by fuzz/task_fuzz.cc: a candidate's "epochs" of 1e24 (a float: past int64) reached
// nlohmann's float-to-integer cast, undefined behaviour. A candidate's every integer that is a
// float, negative where it cannot be, or past int64 is refused, naming the candidate and field.
TEST(Task, ACandidatesIntegersMustBeIntegersThatFit) {
  const nlohmann::json real =
      nlohmann::json::parse(ReadFile(std::string(MSAFLOW_SOURCE_DIR) + "/fuzz/corpus/task/r1-train.json"));
  ASSERT_NO_THROW(ParseTask(real, "t.json"));
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"epochs", 1e24}, {"epochs", 2.5}, {"batch", nlohmann::json(uint64_t{1} << 63)},
      {"hidden", "8"},  {"seed", -1},    {"data_seed", 0.5}};
  for (const auto& [key, value] : bad) {
    nlohmann::json t = real;
    t["candidates"][0]["head"][key] = value;
    try {
      ParseTask(t, "t.json");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      EXPECT_NE(std::string(e.what()).find("candidates/0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("head/" + key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace msaflow::workflow
