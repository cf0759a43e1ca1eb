// The run's journal (writer, reader, summary), the round loop (stop rule, ranking, results) and
// the coordinator lock: no module processes, no NAM server.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "nam/mem_store.h"
#include "record/coordinator_lock.h"
#include "record/journal.h"
#include "orchestrator/rounds.h"
#include "record/why.h"
#include "workflow/objects.h"
#include "workflow/task.h"

namespace msaflow::record {
using namespace msaflow::orchestrator;  // the round loop's tests (orchestrator/rounds.h)
using namespace msaflow::workflow;
namespace {

using nlohmann::json;

std::string TempDir(const std::string& name) {
  std::string d = std::filesystem::temp_directory_path().string() + "/msaflow-journal-test-" + name + "-" +
                  std::to_string(::getpid());
  std::filesystem::remove_all(d);
  MakeDirs(d);
  return d;
}

TEST(Journal, WriterAndReaderAgree) {
  const std::string dir = TempDir("agree");
  const std::string path = dir + "/journal.jsonl";
  JournalWriter w = JournalWriter::Create(path);
  w.Event("run-start", {{"run", "r"}, {"pipeline", "p"}, {"machine_source", "local"},
                        {"coordinator", ThisCoordinator().ToJson()}});
  w.Event("task-start", {{"task", "r1-load"}});
  w.Event("task-end", {{"task", "r1-load"}, {"seconds", 1.5}});
  w.Event("task-start", {{"task", "r1-prepare"}});
  EXPECT_THROW(JournalWriter::Create(path), Error);  // never over an existing run's journal
  Journal j = ReadJournal(path);
  ASSERT_EQ(j.events.size(), 4u);
  EXPECT_EQ(j.events[0].line, 2u);
  EXPECT_FALSE(j.torn_tail);
  RunSummary s = Summarize(j, path);
  EXPECT_EQ(s.run, "r");
  EXPECT_EQ(s.machine_source, "local");
  EXPECT_EQ(s.coordinator.pid, ::getpid());
  EXPECT_EQ(s.tasks_done, (std::set<std::string>{"r1-load"}));
  EXPECT_EQ(s.last_started, "r1-prepare");
  EXPECT_DOUBLE_EQ(s.seconds.at("r1-load"), 1.5);
  EXPECT_FALSE(s.finished);
  std::filesystem::remove_all(dir);
}

TEST(Journal, ATornLastLineIsLeftOutAndCutOffBeforeTheNextEvent) {
  const std::string dir = TempDir("torn");
  const std::string path = dir + "/journal.jsonl";
  JournalWriter::Create(path).Event("run-start", {{"run", "r"}});
  {
    std::string text = ReadFile(path) + R"({"event":"task-sta)";  // a crash mid-write
    WriteFileAtomic(path, text);
  }
  Journal j = ReadJournal(path);
  EXPECT_TRUE(j.torn_tail);
  EXPECT_EQ(j.events.size(), 1u);
  JournalWriter::Append(path).Event("resume", {{"coordinator", ThisCoordinator().ToJson()}});
  j = ReadJournal(path);  // the torn bytes are gone: the journal reads whole, the resume after the start
  EXPECT_FALSE(j.torn_tail);
  ASSERT_EQ(j.events.size(), 2u);
  EXPECT_EQ(j.events[0].event, "run-start");
  EXPECT_EQ(j.events[1].event, "resume");
  std::filesystem::remove_all(dir);
}

TEST(Journal, DamageNamesTheLine) {
  const std::string head = std::string(R"({"format":")") + kJournalFormat + "\"}\n";
  try {
    ParseJournal(head + "{\"event\":\"x\"}\n[1]\n{\"event\":\"y\"}\n", "j");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_STREQ(e.what(), "j:3: not a JSON object");
  }
  try {
    ParseJournal(R"({"format":"other/1"})" "\n", "j");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), std::string("j:1: expected format ") + kJournalFormat);
  }
  try {
    Summarize(ParseJournal(head + R"({"event":"task-start","task":7})" "\n", "j"), "j");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("j:2: a malformed 'task-start' event"), std::string::npos) << e.what();
  }
}

// Found by the journal fuzzer (CI, a 3-second smoke run): a round-end whose "round" was
// 1.33e128 reached nlohmann's get<int>(), a float-to-int conversion out of range (undefined
// behaviour, a UBSan report). Such numbers are refused when the journal is read, naming the
// line and the field; integers out of a field's range are refused by the summary.
TEST(Journal, AFloatTooLargeForAnIntIsRefusedNotConverted) {
  const std::string head = std::string(R"({"format":")") + kJournalFormat + "\"}\n";
  auto error = [&](const std::string& events) {
    try {
      Summarize(ParseJournal(head + events, "j"), "j");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(R"({"event":"round-end","round":1.3333e128})" "\n"),
            "j:2: a number out of range at /round (1.3333e+128): a journal's numbers are integers or below 2^31");
  EXPECT_EQ(error(R"({"event":"task-end","task":"t","ranks":[{"cpu_s":-3e9}]})" "\n"),
            "j:2: a number out of range at /ranks/0/cpu_s (-3000000000.0): a journal's numbers are integers or below 2^31");
  EXPECT_EQ(error(R"({"event":"round-end","round":99999999999})" "\n"),
            "j:2: a malformed 'round-end' event (\"round\": expected an integer from 0 to 2147483647, got 99999999999)");
  EXPECT_EQ(error(R"({"event":"task-start","task":"t","ranks":0})" "\n"),
            "j:2: a malformed 'task-start' event (\"ranks\": expected an integer from 1 to 16777216, got 0)");
  EXPECT_EQ(error(R"({"event":"round-end","round":2.5})" "\n"),
            "j:2: a malformed 'round-end' event (\"round\": expected an integer from 0 to 2147483647, got 2.5)");
  // Seconds and accuracies are floats, and pass.
  EXPECT_EQ(error(R"({"event":"task-end","task":"t","seconds":12.5})" "\n"), "no error");
}

TEST(Journal, AResumeClearsTheFailureItContinues) {
  const std::string head = std::string(R"({"format":")") + kJournalFormat + "\"}\n";
  RunSummary s = Summarize(ParseJournal(head +
                                            R"({"event":"run-start","run":"r","coordinator":{"pid":10,"host":"a"}})"
                                            "\n"
                                            R"({"event":"task-end","task":"r1-load"})"
                                            "\n"
                                            R"({"event":"run-failed","error":"boom"})"
                                            "\n"
                                            R"({"event":"resume","coordinator":{"pid":11,"host":"b"}})"
                                            "\n"
                                            R"({"event":"task-reused","task":"r1-prepare"})"
                                            "\n",
                                        "j"),
                           "j");
  EXPECT_FALSE(s.failed);
  EXPECT_EQ(s.resumes, 1);
  EXPECT_EQ(s.coordinator.pid, 11);
  EXPECT_EQ(s.coordinator.host, "b");
  EXPECT_EQ(s.tasks_done, (std::set<std::string>{"r1-load", "r1-prepare"}));
}

TEST(CoordinatorLock, HeldWhileTheHolderLivesAndFreedWhenItDies) {
  const std::string dir = TempDir("lock");
  EXPECT_EQ(CoordinatorHolding(dir), 0);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    CoordinatorLock lock(dir);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();  // until killed
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(CoordinatorHolding(dir), child);
  try {
    CoordinatorLock second(dir);
    FAIL() << "a second coordinator took the lock";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is still running (coordinator pid " + std::to_string(child) + ")"),
              std::string::npos)
        << e.what();
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(CoordinatorHolding(dir), 0);
  { CoordinatorLock mine(dir); }
  std::filesystem::remove_all(dir);
}

Pipeline TwoRounds(double min_delta, int patience) {
  return workflow::ParsePipeline(
      R"({"name": "t",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "pixels", "kind": "pixels"}],
    "head": {"type": ["softmax"], "lr": [0.001, 0.01]},
    "rounds": {"max": 4, "candidates": 2, "top_k": 1, "seed": 9, "min_delta": )" +
          std::to_string(min_delta) + R"(, "patience": )" + std::to_string(patience) + "}}",
      "p.json", "/b");
}

// The select step's best object for `cands` with these validation (and test) accuracies.
RoundOutcome Outcome(int round, const std::vector<Candidate>& cands, const std::vector<double>& acc) {
  json all = json::array();
  for (size_t i = 0; i < cands.size(); ++i)
    all.push_back({{"candidate", workflow::ToJson(cands[i])}, {"accuracy", acc[i]}, {"loss", 1.0}, {"round", round},
                   {"model", "model/" + cands[i].id}, {"result", "result/" + cands[i].id},
                   {"test", {{"accuracy", acc[i] - 0.01}}}});
  std::sort(all.begin(), all.end(), [](const json& a, const json& b) { return a["accuracy"] > b["accuracy"]; });
  RoundOutcome o;
  o.best = {{"all", all}, {"champion", all[0]}, {"top_k", json::array({all[0]})}};
  o.prepared = {{"computed", json::array()}, {"reused", json::array()}};
  return o;
}

TEST(RoundLoop, StopRuleRankingAndResults) {
  Pipeline p = TwoRounds(0.01, 1);
  RoundLoop loop(p);
  auto r1 = loop.Candidates(1);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_FALSE(loop.Absorb(1, Outcome(1, r1, {0.70, 0.80}), {{"round", 1}}));
  EXPECT_EQ(loop.KeptFor(loop.Candidates(2)).size(), 1u);
  EXPECT_EQ(loop.champion().candidate.id, r1[1].id);
  auto r2 = loop.Candidates(2);
  // A gain below min_delta, patience 1: the run stops after round 2.
  EXPECT_TRUE(loop.Absorb(2, Outcome(2, r2, {0.805, 0.60}), {{"round", 2}}));
  EXPECT_EQ(loop.stop_reason(), "no gain >= 0.01 for 1 round(s)");
  json results = loop.Results("run", "mem://x", 3.0);
  EXPECT_EQ(results["rounds"].size(), 2u);
  EXPECT_EQ(results["champion"]["candidate"]["id"], r2[0].id);
  EXPECT_DOUBLE_EQ(results["result"]["accuracy"].get<double>(), 0.795);  // its test accuracy, held out
  EXPECT_FALSE(results["result"]["optimistic"].get<bool>());
  EXPECT_EQ(results["best_per_backbone"]["pixels"], 0.805);
}

TEST(RoundLoop, AReplayedRunReachesTheSameCandidates) {
  // Resume replays finished rounds through a fresh loop: it must plan what the first one did.
  Pipeline p = TwoRounds(0.0, 5);
  RoundLoop a(p), b(p);
  auto r1 = a.Candidates(1);
  a.Absorb(1, Outcome(1, r1, {0.5, 0.6}), {});
  b.Absorb(1, Outcome(1, b.Candidates(1), {0.5, 0.6}), {});
  auto ca = a.Candidates(2), cb = b.Candidates(2);
  ASSERT_EQ(ca.size(), cb.size());
  for (size_t i = 0; i < ca.size(); ++i) EXPECT_EQ(workflow::ToJson(ca[i]), workflow::ToJson(cb[i]));
}

Pipeline Halving(double min_delta) {
  return workflow::ParsePipeline(
      R"({"name": "h",
    "datasets": {"train": {"images": "a", "labels": "b"}, "test": {"images": "c", "labels": "d"},
                 "validation": {"from": "train", "fraction": 0.1}},
    "backbones": [{"name": "a", "onnx": "a.onnx", "feature_layer": "x", "input": {"height": 8, "width": 8}},
                  {"name": "b", "onnx": "b.onnx", "feature_layer": "x", "input": {"height": 8, "width": 8}},
                  {"name": "c", "onnx": "c.onnx", "feature_layer": "x", "input": {"height": 8, "width": 8}}],
    "head": {"type": ["softmax"], "lr": [0.001, 0.01]},
    "rounds": {"max": 4, "candidates": 6, "top_k": 1, "seed": 9, "strategy": "halving", "eta": 2, "min_delta": )" +
          std::to_string(min_delta) + "}}",
      "p.json", "/b");
}

std::vector<Candidate> With(std::vector<Candidate> fresh, const Candidate& kept) {
  fresh.push_back(kept);
  return fresh;
}

std::vector<std::string> Backbones(const std::vector<Candidate>& cands) {
  std::vector<std::string> out;
  out.reserve(cands.size());
  for (const auto& c : cands) out.push_back(c.backbone);
  return out;
}

TEST(RoundLoop, HalvingHoldsTheTestSplitBackUntilARoundThatMayBeTheLast) {
  const Pipeline perturb_p = TwoRounds(0.0, 1), halving_p = Halving(0),
                 strict_p = Halving(0.01);  // a loop holds its pipeline
  // Every other strategy runs it every round.
  RoundLoop perturb(perturb_p);
  EXPECT_TRUE(perturb.TestsInRound(1, perturb.Candidates(1)));
  // Round 1 of halving, three models: the stop rule looks back, so round 1 cannot end the run.
  RoundLoop loop(halving_p), strict(strict_p), best_goes_on(halving_p);
  const auto r1 = loop.Candidates(1);
  ASSERT_EQ(Backbones(r1), (std::vector<std::string>{"a", "b", "c", "a", "b", "c"}));
  EXPECT_FALSE(loop.TestsInRound(1, r1));
  const RoundOutcome o1 = Outcome(1, r1, {0.9, 0.5, 0.6, 0.4, 0.7, 0.65});
  for (RoundLoop* l : {&loop, &strict, &best_goes_on}) l->Absorb(1, o1, {});
  const auto r2 = loop.Candidates(2);  // r1-c00 (a), r1-c04 (b), r1-c05 (c) continued
  ASSERT_EQ(Backbones(r2), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(loop.KeptFor(r2).size(), 1u);
  EXPECT_EQ(loop.KeptFor(r2)[0].candidate.id, r1[0].id);
  // Patience 1, min_delta 0: round 2's select ranks the best so far again, so round 2 cannot come
  // out worse and end the run. With a min_delta any round may fall short of it and be the last.
  EXPECT_FALSE(loop.TestsInRound(2, r2));
  EXPECT_TRUE(strict.TestsInRound(2, strict.Candidates(2)));
  // Round 2: the heads on b and c come first of the new ones, so round 3 continues those two.
  // The best so far (r1-c00, on a) leaves the race with its backbone: round 3 keeps b's best
  // (0.85), which may come out worse than 0.9 and end the run, so round 3 runs the test split.
  loop.Absorb(2, Outcome(2, With(r2, r1[0]), {0.5, 0.85, 0.8, 0.9}), {});
  const auto r3 = loop.Candidates(3);
  ASSERT_EQ(Backbones(r3), (std::vector<std::string>{"b", "c"}));
  ASSERT_EQ(loop.KeptFor(r3).size(), 1u);
  EXPECT_EQ(loop.KeptFor(r3)[0].candidate.id, r2[1].id);
  EXPECT_TRUE(loop.TestsInRound(3, r3));
  // Had b's head beaten 0.9, round 3 would rank it again and could not end the run.
  best_goes_on.Absorb(2, Outcome(2, With(r2, r1[0]), {0.5, 0.95, 0.8, 0.9}), {});
  EXPECT_FALSE(best_goes_on.TestsInRound(3, best_goes_on.Candidates(3)));
  // A race of one model would spare no pass by waiting: it runs the test split at once.
  loop.Absorb(3, Outcome(3, With(r3, r2[1]), {0.95, 0.7, 0.85}), {});
  const auto r4 = loop.Candidates(4);
  ASSERT_EQ(Backbones(r4), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(loop.TestsInRound(4, r4));
  EXPECT_TRUE(best_goes_on.TestsInRound(3, {r3[0]}));  // b alone, not the last round
}

TEST(TaskKey, IgnoresTheNamAddressOnly) {
  json t = {{"step", "train"}, {"nam", "fabric://127.0.0.1:4000"}, {"round", 1}, {"pipeline", {{"lr", 0.1}}}};
  json moved = t;
  moved["nam"] = "fabric://127.0.0.1:5000";
  EXPECT_EQ(workflow::TaskKey(t), workflow::TaskKey(moved));
  json changed = t;
  changed["pipeline"]["lr"] = 0.2;
  EXPECT_NE(workflow::TaskKey(t), workflow::TaskKey(changed));
}

TEST(ReadRoundOutcome, DropsTheFarmsTaskLists) {
  nam::MemStore store("round-outcome");
  Pipeline p = TwoRounds(0, 1);
  auto r1 = FirstRound(p);
  RoundOutcome o = Outcome(1, r1, {0.5, 0.6});
  store.Put(BestObject("run", 1), o.best.dump(), json::object());
  store.Put(PreparedObject("run", 1), o.prepared.dump(), json::object());
  store.Put(workflow::TrainedObject("run", 1), json{{"mode", "sync"}}.dump(), json::object());
  store.Put(workflow::EvaluatedObject("run", 1),
            json{{"per_rank", json::array({{{"rank", 0}, {"task_ids", {1, 2}}}})}}.dump(), json::object());
  RoundOutcome got = ReadRoundOutcome(store, "run", 1);
  EXPECT_EQ(got.best, o.best);
  EXPECT_FALSE(got.evaluation["per_rank"][0].contains("task_ids"));
  EXPECT_THROW(ReadRoundOutcome(store, "run", 2), Error);
}

TEST(Why, JsonChangesNamesEveryDifferingLeaf) {
  json a = {{"head", {{"lr", {0.001, 0.003}}, {"type", "softmax"}}}, {"seed", 1}, {"gone", true}};
  json b = {{"head", {{"lr", {0.002, 0.003}}, {"type", "softmax"}}}, {"seed", 1}, {"new", "x"}};
  EXPECT_EQ(JsonChanges(a, b), (std::vector<std::string>{"/gone: true -> (none)", "/head/lr/0: 0.001 -> 0.002",
                                                         "/new: (none) -> \"x\""}));
  EXPECT_TRUE(JsonChanges(a, a).empty());
  EXPECT_EQ(JsonChanges(json::array({1, 2}), json::array({1})), (std::vector<std::string>{"/: [1,2] -> [1]"}));
}

}  // namespace
}  // namespace msaflow::record
