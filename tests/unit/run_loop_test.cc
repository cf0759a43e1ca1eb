// The round loop, resume and re-attach (orchestrator/run.h) driven through a fake launcher and
// a ManualClock: no process is started. The fake runs each task's step in this process (the
// module code a launcher's process would run, on a mem:// NAM), or fails it where the test says,
// and advances the clock by the seconds the test gives the step; so every duration the run
// records is exact, and a run of two rounds takes well under a second.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/dataset.h"
#include "launch/launcher.h"
#include "modules/steps.h"
#include "nam/store.h"
#include "orchestrator/run.h"
#include "orchestrator/runs.h"
#include "parallel/comm.h"
#include "record/journal.h"
#include "record/run_dir.h"
#include "tests/unit/tiny_images.h"
#include "workflow/kinds.h"
#include "workflow/machine.h"
#include "workflow/pipeline.h"

namespace msaflow {
namespace {

using nlohmann::json;
using workflow::Step;

// What the test asks of the fake, and what the fake saw.
struct Script {
  ManualClock* clock = nullptr;
  std::map<Step, double> seconds;  // each step's run time on the clock
  std::string fail_at;             // this task fails before its step runs ...
  std::string die_after;           // ... or its step runs and commits, and then the coordinator "dies"
  std::string announce_job;        // a Slurm job the fake says it submitted for the round
  std::vector<std::string> launched;
  std::vector<launch::Leftovers> reattached;
};

class FakeLauncher : public launch::Launcher {
 public:
  FakeLauncher(workflow::Pipeline p, workflow::Machine m, launch::LaunchContext ctx, Script* s)
      : Launcher(std::move(p), std::move(m), std::move(ctx)), s_(s) {}

  bool RunsStepsInCoordinator() const override { return false; }

  void RunRound(const workflow::RoundPlan& plan, const std::map<std::string, std::string>& task_files,
                const std::string&, const launch::LaunchObserver& obs) override {
    if (!s_->announce_job.empty()) obs.on_event("slurm-job", {{"job", s_->announce_job}, {"round", plan.round}});
    for (const workflow::Task& t : plan.tasks) {
      s_->launched.push_back(t.id);
      obs.on_start(t);
      if (t.id == s_->fail_at) Throw(ErrorKind::kTaskFailed, "task " + t.id + " failed (the fake launcher's doing)");
      const auto t0 = s_->clock->Now();
      // What `msaflow module <step> --task FILE` does, from the file the run wrote.
      const json body = json::parse(ReadFile(task_files.at(t.id)));
      std::FILE* sink = std::fopen("/dev/null", "w");
      parallel::SelfComm self;
      modules::RunStep(t.step, body, self, sink);
      std::fclose(sink);
      s_->clock->AdvanceSeconds(s_->seconds.at(t.step));
      if (t.id == s_->die_after) Throw(ErrorKind::kTaskFailed, "coordinator lost after " + t.id);
      obs.on_end(t, s_->clock->SecondsSince(t0));
    }
  }

  json Reattach(const launch::Leftovers& left, const std::function<void(const std::string&)>& say) override {
    s_->reattached.push_back(left);
    if (left.jobs.empty()) return nullptr;
    say("waiting for the jobs of the dead coordinator (fake)");
    return {{"jobs", left.jobs}, {"outcome", "ended"}};
  }

  std::string PlanNam(const std::string& nam, const std::string&) const override { return nam; }
  std::string PlanText(const workflow::RoundPlan&, const std::string&, const std::string&) const override { return ""; }

 private:
  Script* s_;
};

// What the run showed its observer.
struct Seen : orchestrator::RunObserver {
  std::vector<std::string> reused, ended;
  std::map<std::string, double> seconds;
  void TaskReused(const workflow::Task& t, size_t) override { reused.push_back(t.id); }
  void TaskEnd(const workflow::Task& t, double s) override {
    ended.push_back(t.id);
    seconds[t.id] = s;
  }
};

std::vector<std::string> Ids(int round, std::vector<Step> steps) {
  std::vector<std::string> out;
  for (Step s : steps) out.push_back("r" + std::to_string(round) + "-" + workflow::StepName(s));
  return out;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<Step> kAll(workflow::kSteps.begin(), workflow::kSteps.end());

class RunLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/msaflow-runloop-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    test_data::WriteTinyImages(dir_);  // three classes of 8x8 images
    machine_ = workflow::LoadMachine("local");
    script_.clock = &clock_;
    double s = 1.0;
    for (Step step : workflow::kSteps) script_.seconds[step] = (s += 0.25);  // 1.25, 1.5, ... 2.5
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Two rounds of two candidates on raw pixels, on a NAM of this process alone, which the
  // fixture holds open so that it outlives a coordinator, as a NAM server does.
  workflow::Pipeline Pipeline(const std::string& nam) {
    nams_.push_back(nam::OpenStore("mem://" + nam));
    const json doc = {{"format", "msaflow.pipeline/1"},
                      {"name", "loop"},
                      {"nam", "mem://" + nam},
                      {"datasets",
                       {{"train", {{"format", "idx"}, {"images", "train-images"}, {"labels", "train-labels"}}},
                        {"test", {{"format", "idx"}, {"images", "test-images"}, {"labels", "test-labels"}}},
                        {"validation", {{"from", "train"}, {"fraction", 0.25}, {"seed", 2}}}}},
                      {"backbones", json::array({{{"name", "pixels"}, {"kind", "pixels"}}})},
                      {"head", {{"type", {"softmax"}}, {"lr", {0.01, 0.03}}, {"epochs", {4}}, {"batch", 16}}},
                      {"rounds", {{"max", 2}, {"candidates", 2}, {"top_k", 1}, {"seed", 1}, {"min_delta", 0}}}};
    return workflow::ParsePipeline(doc.dump(), "loop.json", dir_);
  }

  orchestrator::RunOptions Options(const std::string& run_id) {
    orchestrator::RunOptions o;
    o.runs_dir = dir_ + "/runs";
    o.run_id = run_id;
    o.clock = &clock_;
    o.make_launcher = [this](const workflow::Pipeline& p, const workflow::Machine& m, launch::LaunchContext ctx) {
      EXPECT_EQ(ctx.clock, &clock_);  // the launcher gets the run's clock
      return std::make_unique<FakeLauncher>(p, m, std::move(ctx), &script_);
    };
    return o;
  }

  json Results(const std::string& run_id) { return json::parse(ReadFile(dir_ + "/runs/" + run_id + "/results.json")); }
  record::RunSummary Journal(const std::string& run_id) {
    const std::string path = dir_ + "/runs/" + run_id + "/journal.jsonl";
    return record::Summarize(record::ReadJournal(path), path);
  }
  std::vector<std::string> Events(const std::string& run_id) {
    std::vector<std::string> out;
    for (const auto& e : record::ReadJournal(dir_ + "/runs/" + run_id + "/journal.jsonl").events) out.push_back(e.event);
    return out;
  }

  std::string dir_;
  std::vector<std::unique_ptr<nam::Store>> nams_;
  workflow::Machine machine_;
  ManualClock clock_;
  Script script_;
};

TEST_F(RunLoop, TwoRoundsRunEveryTaskOnceInOrderAndRecordExactSeconds) {
  Seen seen;
  orchestrator::RunPipeline(Pipeline("two-rounds"), machine_, Options("a"), seen);
  const auto all = Concat(Ids(1, kAll), Ids(2, kAll));
  EXPECT_EQ(script_.launched, all);
  EXPECT_EQ(seen.ended, all);
  EXPECT_TRUE(seen.reused.empty());
  const json res = Results("a");
  ASSERT_EQ(res["rounds"].size(), 2u);
  double total = 0;
  for (const json& round : res["rounds"])
    for (Step s : workflow::kSteps) {
      EXPECT_EQ(round["step_seconds"][workflow::StepName(s)].get<double>(), script_.seconds.at(s)) << round.dump();
      total += script_.seconds.at(s);
    }
  EXPECT_EQ(res["seconds"].get<double>(), total);  // the run's clock moved only with its tasks
  for (const auto& [id, secs] : seen.seconds) EXPECT_EQ(secs, script_.seconds.at(*workflow::StepFromName(id.substr(3))));
  const record::RunSummary j = Journal("a");
  EXPECT_TRUE(j.finished);
  EXPECT_EQ(j.rounds_ended, 2);
  EXPECT_EQ(j.seconds.at("r2-train"), script_.seconds.at(Step::kTrain));
  ASSERT_EQ(script_.reattached.size(), 1u);  // asked once, with nothing left by anyone
  EXPECT_TRUE(script_.reattached[0].jobs.empty());
  EXPECT_EQ(clock_.slept().count(), 0);  // nothing waited on the clock
}

TEST_F(RunLoop, AFailedTaskFailsTheRunAndResumeRunsOnlyWhatWasNotDone) {
  Seen whole;
  orchestrator::RunPipeline(Pipeline("whole"), machine_, Options("whole"), whole);
  json expected = Results("whole")["champion"];
  expected.erase("model");  // its object name holds the run's id

  script_.launched.clear();
  script_.fail_at = "r2-train";
  Seen first;
  try {
    orchestrator::RunPipeline(Pipeline("broken"), machine_, Options("b"), first);
    FAIL() << "the run went on past a failed task";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTaskFailed);
    EXPECT_NE(std::string(e.what()).find("r2-train failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(script_.launched, Concat(Ids(1, kAll), Ids(2, {Step::kLoad, Step::kPrepare, Step::kTrain})));
  const record::RunSummary failed = Journal("b");
  EXPECT_TRUE(failed.failed);
  EXPECT_FALSE(failed.finished);
  EXPECT_EQ(Events("b").back(), "run-failed");

  script_.launched.clear();
  script_.fail_at.clear();
  Seen resumed;
  ASSERT_TRUE(orchestrator::ResumeRun(dir_ + "/runs/b", Options(""), resumed));
  // Round 1 is replayed from the NAM and round 2's first two steps are reused: only the failed
  // task and those after it run again.
  EXPECT_EQ(script_.launched, Ids(2, {Step::kTrain, Step::kStore, Step::kEvaluate, Step::kSelect}));
  EXPECT_EQ(resumed.reused, Ids(2, {Step::kLoad, Step::kPrepare}));
  const json res = Results("b");
  json champion = res["champion"];
  EXPECT_EQ(champion["model"], "model/b/1/" + expected["candidate"]["id"].get<std::string>());
  champion.erase("model");
  EXPECT_EQ(champion, expected);  // as if nothing had failed
  // Round 2's record keeps the seconds its reused steps took under the first coordinator.
  EXPECT_EQ(res["rounds"][1]["step_seconds"]["prepare"].get<double>(), script_.seconds.at(Step::kPrepare));
  const record::RunSummary j = Journal("b");
  EXPECT_TRUE(j.finished);
  EXPECT_EQ(j.resumes, 1);

  // A finished run is left as it is: no launcher, nothing run.
  script_.launched.clear();
  script_.reattached.clear();
  EXPECT_FALSE(orchestrator::ResumeRun(dir_ + "/runs/b", Options(""), resumed));
  EXPECT_TRUE(script_.launched.empty());
  EXPECT_TRUE(script_.reattached.empty());
}

TEST_F(RunLoop, AStepThatCommittedBeforeItsCoordinatorDiedIsReusedAndJournaledSo) {
  script_.die_after = "r1-train";
  Seen first;
  EXPECT_THROW(orchestrator::RunPipeline(Pipeline("died"), machine_, Options("c"), first), Error);
  EXPECT_EQ(Journal("c").tasks_done.count("r1-train"), 0u);  // its end was never recorded

  script_.die_after.clear();
  script_.launched.clear();
  Seen resumed;
  ASSERT_TRUE(orchestrator::ResumeRun(dir_ + "/runs/c", Options(""), resumed));
  EXPECT_EQ(script_.launched, Concat(Ids(1, {Step::kStore, Step::kEvaluate, Step::kSelect}), Ids(2, kAll)));
  EXPECT_EQ(resumed.reused, Ids(1, {Step::kLoad, Step::kPrepare, Step::kTrain}));
  // The journal says the task was reused: its done object was in the NAM, its end in no journal.
  const auto events = record::ReadJournal(dir_ + "/runs/c/journal.jsonl").events;
  int reused = 0;
  for (const auto& e : events)
    if (e.event == "task-reused") {
      ++reused;
      EXPECT_EQ(e.fields.at("task"), "r1-train");
    }
  EXPECT_EQ(reused, 1);
  EXPECT_TRUE(Journal("c").finished);
}

TEST_F(RunLoop, ResumeHandsTheDeadCoordinatorsJobsToTheLauncherToReattach) {
  script_.announce_job = "4242";
  script_.fail_at = "r1-prepare";
  Seen first;
  EXPECT_THROW(orchestrator::RunPipeline(Pipeline("jobs"), machine_, Options("d"), first), Error);
  EXPECT_EQ(Journal("d").slurm_jobs, std::vector<std::string>{"4242"});

  script_.announce_job.clear();
  script_.fail_at.clear();
  script_.reattached.clear();
  Seen resumed;
  ASSERT_TRUE(orchestrator::ResumeRun(dir_ + "/runs/d", Options(""), resumed));
  ASSERT_EQ(script_.reattached.size(), 1u);
  EXPECT_EQ(script_.reattached[0].jobs, std::vector<std::string>{"4242"});
  const auto events = Events("d");
  const auto at = std::find(events.begin(), events.end(), "slurm-reattached");
  ASSERT_NE(at, events.end());
  // Re-attached before anything of the resumed run started; and the jobs are settled then.
  EXPECT_LT(at - events.begin(), std::find(events.begin() + (at - events.begin()), events.end(), "task-start") - events.begin());
  EXPECT_TRUE(Journal("d").slurm_jobs.empty());
  EXPECT_TRUE(Journal("d").finished);
}

void AppendFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app | std::ios::binary) << text;
}

// The run library as a front end uses it: Runs::Start through the same fake launcher, then
// Runs::Observe follows its journal: each Next() the events written since, a line read once it ends.
TEST_F(RunLoop, RunsStartsARunAndObserveStreamsItsJournal) {
  orchestrator::RunsConfig config;
  config.runs_dir = dir_ + "/runs";
  config.clock = &clock_;
  config.make_launcher = Options("").make_launcher;
  const orchestrator::Runs runs(config);
  Seen seen;
  const std::string run_dir = runs.Start(Pipeline("observed"), machine_, "e", seen);
  EXPECT_EQ(run_dir, dir_ + "/runs/e");
  EXPECT_EQ(record::StatusOf(run_dir).state, record::RunState::kFinished);
  EXPECT_EQ(record::StatusOf(run_dir).holder, 0);  // the coordinator let go of the run
  record::JournalFollower follow = runs.Observe(run_dir);
  const std::vector<record::JournalEvent> all = follow.Next();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().kind, record::EventKind::kRunStart);
  EXPECT_EQ(all.back().kind, record::EventKind::kRunEnd);
  EXPECT_EQ(all.front().line, 2u);  // after the format line
  std::vector<std::string> ends;
  for (const auto& e : all)
    if (e.kind == record::EventKind::kTaskEnd) ends.push_back(e.fields.at("task").get<std::string>());
  EXPECT_EQ(ends, seen.ended);  // the journal tells what the observer was told
  // Nothing new: nothing; what is appended next: only that, once its line has ended.
  EXPECT_TRUE(follow.Next().empty());
  record::JournalWriter::Append(record::JournalPath(run_dir)).Event(record::EventKind::kResume, {{"reason", "r"}});
  const std::string half = R"({"event": "run-end", "time": "2026-11-28T00:00:00.000Z")";
  AppendFile(record::JournalPath(run_dir), half);
  const std::vector<record::JournalEvent> more = follow.Next();
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].kind, record::EventKind::kResume);
  EXPECT_EQ(more[0].line, all.back().line + 1);
  EXPECT_TRUE(follow.Next().empty());  // the half-written line waits for its end
  AppendFile(record::JournalPath(run_dir), "}\n");
  const std::vector<record::JournalEvent> last = follow.Next();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].kind, record::EventKind::kRunEnd);
  // A line that is not an event is named, not skipped.
  AppendFile(record::JournalPath(run_dir), "[1]\n");
  try {
    follow.Next();
    ADD_FAILURE() << "a JSON array read as an event";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(record::JournalPath(run_dir) + ":" + std::to_string(last[0].line + 1) +
                                         ": not a JSON object"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace msaflow
