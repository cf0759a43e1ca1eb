// Slurm script generation and state handling against a fake Slurm (the JobRunner interface).
#include "launch/slurm.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "launch/local_launcher.h"
#include "launch/slurm_launcher.h"
#include "workflow/machine.h"

namespace msaflow::launch {
using namespace msaflow::workflow;
namespace {

Machine TestMachine() {
  return ParseMachine(R"({"name": "t", "launcher": "slurm",
    "modules": {"cm": {"partition": "cm", "max_ranks": 1, "time": "10"},
                "dam": {"partition": "dam", "max_ranks": 2, "gres": "fpga:1", "time": "20"},
                "esb": {"partition": "booster", "nodes": 2, "max_ranks": 4, "constraint": "gpu", "time": "5"}},
    "slurm": {"poll_s": 0.01}})",
                      "t.json", "");
}

std::vector<Task> TestTasks() {
  auto t = [](const std::string& step, const std::string& module, int64_t ranks) {
    Task x;
    x.id = "r1-" + step;
    x.step = workflow::ParseStep(step, "test");
    x.module = module;
    x.ranks = ranks;
    return x;
  };
  return {t("load", "cm", 1), t("prepare", "dam", 1), t("train", "dam", 2), t("store", "dam", 1),
          t("evaluate", "esb", 4), t("select", "dam", 1)};
}

std::map<std::string, std::string> Files() {
  std::map<std::string, std::string> f;
  for (const auto& t : TestTasks()) f[t.id] = "/r/tasks/" + t.id + ".json";
  return f;
}

TEST(Slurm, HetjobScriptIsExact) {
  SlurmScriptParams p{"run1", "/r", "/r/logs", "/r/slurm/round-1.0.progress", "/bin/msaflow", 1};
  std::string s = HetjobScript(TestTasks(), TestMachine(), Files(), p);
  const std::string expected = R"SH(#!/bin/bash
#SBATCH --job-name=msaflow-run1-r1
#SBATCH --output=/r/logs/slurm-r1-%j.out
#SBATCH --chdir=/r
#SBATCH --no-requeue
#SBATCH --partition=cm --nodes=1 --ntasks=1 --time=10
#SBATCH hetjob
#SBATCH --partition=dam --nodes=1 --ntasks=2 --time=20 --gres=fpga:1
#SBATCH hetjob
#SBATCH --partition=booster --nodes=2 --ntasks=4 --time=5 --constraint=gpu
# round 1 of run run1: one heterogeneous job, components 0=cm, 1=dam, 2=esb
set -u
PROGRESS=/r/slurm/round-1.0.progress
step() {
  local id=$1 log=$2; shift 2
  echo "start $id $(date +%s.%N)" >> "$PROGRESS"
  "$@" > "$log" 2>&1 &
  local pid=$!
  echo "srun $id $pid" >> "$PROGRESS"
  wait "$pid"
  local rc=$?
  echo "end $id $rc $(date +%s.%N)" >> "$PROGRESS"
  return "$rc"
}
step r1-load /r/logs/r1-load.log srun --het-group=0 --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module load --task /r/tasks/r1-load.json || exit 1
step r1-prepare /r/logs/r1-prepare.log srun --het-group=1 --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module prepare --task /r/tasks/r1-prepare.json || exit 1
step r1-train /r/logs/r1-train.log srun --het-group=1 --ntasks=2 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module train --task /r/tasks/r1-train.json || exit 1
step r1-store /r/logs/r1-store.log srun --het-group=1 --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module store --task /r/tasks/r1-store.json || exit 1
step r1-evaluate /r/logs/r1-evaluate.log srun --het-group=2 --ntasks=4 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module evaluate --task /r/tasks/r1-evaluate.json || exit 1
step r1-select /r/logs/r1-select.log srun --het-group=1 --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module select --task /r/tasks/r1-select.json || exit 1
)SH";
  EXPECT_EQ(s, expected);
}

TEST(Slurm, ChainedScriptIsExactAndQuotesPaths) {
  SlurmScriptParams p{"run1", "/r", "/r/logs", "/r/my progress", "/opt/ms aflow", 2};
  Task t = TestTasks()[2];
  auto files = Files();
  files[t.id] = "/r/tasks/it's.json";
  std::string s = ChainedScript(t, TestMachine(), files, p);
  EXPECT_NE(s.find("#SBATCH --job-name=msaflow-run1-r2-train\n"), std::string::npos) << s;
  EXPECT_NE(s.find("#SBATCH --partition=dam --nodes=1 --ntasks=2 --time=20 --gres=fpga:1\n"), std::string::npos);
  EXPECT_NE(s.find("PROGRESS='/r/my progress'\n"), std::string::npos);
  EXPECT_NE(s.find("step r1-train /r/logs/r1-train.log srun --ntasks=2 --mpi=pmix --kill-on-bad-exit=1 "
                   "'/opt/ms aflow' module train --task '/r/tasks/it'\\''s.json' || exit 1\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("hetjob"), std::string::npos);
}

Machine SingleMachine(bool features) {
  auto mod = [&](const std::string& body, const std::string& feature) {
    return "{" + body + (features ? R"(, "feature": ")" + feature + "\"" : "") + "}";
  };
  return ParseMachine(R"({"name": "t", "launcher": "slurm", "modules": {"cm": )" +
                          mod(R"("partition": "cm", "max_ranks": 1, "time": "10")", "cmnode") + R"(, "dam": )" +
                          mod(R"("partition": "dam", "max_ranks": 2, "gres": "fpga:1", "time": "20")", "dam") +
                          R"(, "esb": )" +
                          mod(R"("partition": "booster", "nodes": 2, "max_ranks": 4, "constraint": "gpu", "time": "1:30:00")",
                              "esb") +
                          R"(}, "slurm": {"mode": "single", "partition": "all", "poll_s": 0.01}})",
                      "t.json", "");
}

TEST(Slurm, SingleScriptIsExact) {
  SlurmScriptParams p{"run1", "/r", "/r/logs", "/r/slurm/round-1.0.progress", "/bin/msaflow", 1};
  std::vector<Task> tasks = TestTasks();
  tasks[4].ranks = 1;  // evaluate on one of the two esb nodes
  std::string s = SingleScript(tasks, SingleMachine(true), Files(), p);
  const std::string expected = R"SH(#!/bin/bash
#SBATCH --job-name=msaflow-run1-r1
#SBATCH --output=/r/logs/slurm-r1-%j.out
#SBATCH --chdir=/r
#SBATCH --no-requeue
#SBATCH --partition=all --nodes=4 --ntasks-per-node=2 --time=1:30:00 --constraint=[cmnode*1&dam*1&esb*2]
# round 1 of run run1: one allocation, modules as node subsets by node feature: cm 1 node, dam 1 node, esb 2 nodes
# left out (a job's --gres and --constraint apply to all its nodes): dam --gres=fpga:1; esb --constraint=gpu;
set -u
PROGRESS=/r/slurm/round-1.0.progress
step() {
  local id=$1 log=$2; shift 2
  echo "start $id $(date +%s.%N)" >> "$PROGRESS"
  "$@" > "$log" 2>&1 &
  local pid=$!
  echo "srun $id $pid" >> "$PROGRESS"
  wait "$pid"
  local rc=$?
  echo "end $id $rc $(date +%s.%N)" >> "$PROGRESS"
  return "$rc"
}
POOL=" $(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\n' ' ')"
take_nodes() {
  local module=$1 feature=$2 n=$3 h
  TAKEN=""
  for h in $POOL; do
    [ "$n" -gt 0 ] || break
    if [ -n "$feature" ]; then
      sinfo -h -N -n "$h" -o %b | tr ',' '\n' | grep -qx -- "$feature" || continue
    fi
    TAKEN+=${TAKEN:+,}$h
    POOL=${POOL/ $h / }
    n=$((n - 1))
  done
  if [ "$n" -gt 0 ]; then
    echo "msaflow: allocation $SLURM_JOB_NODELIST has too few nodes${feature:+ with feature $feature} left for module $module" >&2
    exit 1
  fi
  echo "nodes $module $TAKEN" >> "$PROGRESS"
}
take_nodes cm cmnode 1
NODES_cm=$TAKEN
take_nodes dam dam 1
NODES_dam=$TAKEN
take_nodes esb esb 2
NODES_esb=$TAKEN
step r1-load /r/logs/r1-load.log srun --nodes=1 --nodelist=$NODES_cm --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module load --task /r/tasks/r1-load.json || exit 1
step r1-prepare /r/logs/r1-prepare.log srun --nodes=1 --nodelist=$NODES_dam --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module prepare --task /r/tasks/r1-prepare.json || exit 1
step r1-train /r/logs/r1-train.log srun --nodes=1 --nodelist=$NODES_dam --ntasks=2 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module train --task /r/tasks/r1-train.json || exit 1
step r1-store /r/logs/r1-store.log srun --nodes=1 --nodelist=$NODES_dam --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module store --task /r/tasks/r1-store.json || exit 1
step r1-evaluate /r/logs/r1-evaluate.log srun --nodes=1 --nodelist=$(echo "$NODES_esb" | cut -d, -f1-1) --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module evaluate --task /r/tasks/r1-evaluate.json || exit 1
step r1-select /r/logs/r1-select.log srun --nodes=1 --nodelist=$NODES_dam --ntasks=1 --mpi=pmix --kill-on-bad-exit=1 /bin/msaflow module select --task /r/tasks/r1-select.json || exit 1
)SH";
  EXPECT_EQ(s, expected);
  // Without node features the modules take the allocation's nodes in order; with 4 esb ranks
  // on 2 nodes, 2 per node.
  s = SingleScript(TestTasks(), SingleMachine(false), Files(), p);
  EXPECT_NE(s.find("#SBATCH --partition=all --nodes=4 --ntasks-per-node=2 --time=1:30:00\n"), std::string::npos) << s;
  EXPECT_NE(s.find("modules as node subsets in node order"), std::string::npos) << s;
  EXPECT_NE(s.find("take_nodes esb '' 2\n"), std::string::npos) << s;
  EXPECT_NE(s.find("srun --nodes=2 --nodelist=$NODES_esb --ntasks=4 "), std::string::npos) << s;
}

TEST(Slurm, ParsesComponentsAndClassifiesEndStates) {
  const std::string text =
      "JobId=41 JobName=msaflow-x-r1 HetJobId=41 HetJobOffset=0 JobState=COMPLETED Reason=None ExitCode=0:0 "
      "Partition=cm NodeList=cm01\n"
      "JobId=42 JobName=msaflow-x-r1 HetJobId=41 HetJobOffset=1 JobState=FAILED Reason=NonZeroExitCode "
      "ExitCode=1:0 Partition=dam NodeList=dam01\n"
      "JobId=43 JobName=msaflow-x-r1 HetJobId=41 HetJobOffset=2 JobState=CANCELLED Reason=None ExitCode=0:15 "
      "Partition=esb NodeList=esb01\n";
  auto c = ParseShowJob(text);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[1].id, "41+1");
  EXPECT_EQ(c[1].job_id, "42");
  EXPECT_EQ(c[1].exit_code, 1);
  EXPECT_EQ(c[2].signal, 15);
  EXPECT_EQ(c[2].nodes, "esb01");
  EXPECT_EQ(EndState(c), "FAILED");  // the failure, not the cancellation it caused
  c[1].state = "TIMEOUT";
  EXPECT_EQ(EndState(c), "TIMEOUT");
  c[2].state = "RUNNING";
  EXPECT_EQ(EndState(c), "");  // not over while a component runs
  c = ParseShowJob("JobId=7 JobName=a JobState=NODE_FAIL Reason=None ExitCode=0:0 Partition=cm NodeList=cm02\n");
  EXPECT_EQ(c.at(0).id, "7");
  EXPECT_EQ(EndState(c), "NODE_FAIL");
  for (const char* s : {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"})
    EXPECT_TRUE(IsTerminal(s)) << s;
  for (const char* s : {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED"})
    EXPECT_FALSE(IsTerminal(s)) << s;
  EXPECT_NE(DescribeState("TIMEOUT").find("time limit"), std::string::npos);
}

// The nodes a NODE_FAIL lost, from `scontrol show node -o` (22.05's lines, Reason last).
TEST(Slurm, LostNodesAreNamedWithTheirStateAndReason) {
  const std::string text =
      "NodeName=dam01 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.99.0.14 NodeHostName=dam01 "
      "State=IDLE ThreadsPerCore=1 Partitions=dam,all\n"
      "NodeName=dam02 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.99.0.15 NodeHostName=dam02 "
      "State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Partitions=dam,all ExtSensorsTemp=n/s "
      "Reason=Not responding [root@2026-11-26T02:26:21]\n"
      "NodeName=dam03 State=IDLE+NOT_RESPONDING Partitions=dam\n";
  EXPECT_EQ(LostNodes(text), (std::vector<std::string>{"dam02 (DOWN+NOT_RESPONDING: Not responding)",
                                                       "dam03 (IDLE+NOT_RESPONDING)"}));
  EXPECT_TRUE(LostNodes("").empty());
  EXPECT_TRUE(LostNodes("NodeName=cm01 State=MIXED Reason=x\n").empty());
}

// A step srun could not start (the node's slurmd killed): its log's line, as srun 22.05 writes it.
TEST(Slurm, ALaunchFailureNamesTheNode) {
  const std::string log =
      "srun: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1\n"
      "srun: error: Task launch for StepId=122.3 failed on node dam01: Communication connection failure\n"
      "srun: error: Application launch failed: Communication connection failure\n";
  EXPECT_EQ(LaunchFailure(log), "srun could not start it on node dam01: Communication connection failure");
  EXPECT_EQ(LaunchFailure("srun: error: dam01: task 1: Killed\n"), "");
  EXPECT_EQ(LaunchFailure(""), "");
  // The rank's own error says more than srun's closing words.
  const std::string failed =
      "rank 0/2 on node dam01 (host dam01, Slurm job 9, step 2), 2 threads\n"
      "msaflow: error: [rank 1] NAM fabric://nam01:4000: no answer to put within 30 s (is the server running at "
      "nam01:4000?)\nsrun: error: dam02: task 1: Exited with exit code 8\nmsaflow: error: [rank 0] later\n";
  EXPECT_EQ(FirstError(failed), "msaflow: error: [rank 1] NAM fabric://nam01:4000: no answer to put within 30 s (is "
                                "the server running at nam01:4000?)");
  EXPECT_EQ(FirstError("srun: error: dam02: task 1: Exited with exit code 8\n"), "");
}

// A fake Slurm: runs nothing, but plays each job's part in the progress file and reports
// states from a script of outcomes.
class FakeSlurm : public JobRunner {
 public:
  struct Outcome {
    std::string fail_task;        // this task ends with status 1 ...
    std::string state = "FAILED";  // ... and the job with this state
  };
  std::vector<Outcome> outcomes;  // one per submission (missing: success)
  bool refuse_hetjobs = false;
  bool refuse_chained = false;
  std::vector<std::string> scripts;
  std::vector<std::vector<std::string>> extras;
  std::vector<std::string> cancelled;
  std::map<std::string, std::string> states;

  std::string Submit(const std::string& script, const std::vector<std::string>& extra) override {
    std::string text = ReadFile(script);
    if (refuse_hetjobs && text.find("#SBATCH hetjob") != std::string::npos)
      Throw(ErrorKind::kTaskFailed, "sbatch: error: Heterogeneous jobs are not supported here");
    if (refuse_chained && text.find("(chained mode)") != std::string::npos && scripts.size() >= 2)
      Throw(ErrorKind::kTaskFailed, "sbatch: error: QOSMaxSubmitJobPerUserLimit");
    scripts.push_back(text);
    extras.push_back(extra);
    std::string id = std::to_string(100 + scripts.size());
    Outcome o = scripts.size() <= outcomes.size() ? outcomes[scripts.size() - 1] : Outcome{"", "COMPLETED"};
    // Play the steps: the progress file path is in the script.
    size_t p = text.find("PROGRESS=");
    std::string progress = text.substr(p + 9, text.find('\n', p) - p - 9);
    std::ofstream out(progress, std::ios::app);
    std::string state = "COMPLETED";
    size_t pos = 0;
    while ((pos = text.find("\nstep ", pos)) != std::string::npos) {
      pos += 6;
      std::string task = text.substr(pos, text.find(' ', pos) - pos);
      out << "start " << task << " 1.0\n";
      bool fail = task == o.fail_task;
      out << "end " << task << " " << (fail ? 1 : 0) << " 2.0\n";
      if (fail) {
        state = o.state;
        break;
      }
    }
    states[id] = state;
    return id;
  }
  std::string Show(const std::string& id) override {
    return "JobId=" + id + " JobState=" + states.at(id) + " Reason=None ExitCode=" +
           (states.at(id) == "COMPLETED" ? "0:0" : "1:0") + " Partition=dam NodeList=dam01\n";
  }
  void Cancel(const std::string& id) override { cancelled.push_back(id); }
  void Signal(const std::string& id, const std::string&) override { signalled.push_back(id); }
  std::string QueueState(const std::string&) override { return ""; }
  std::vector<std::string> signalled;
};

class SlurmRound : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/msaflow-slurm-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    MakeDirs(dir_ + "/logs");
    plan_.round = 1;
    plan_.tasks = TestTasks();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::vector<std::pair<std::string, nlohmann::json>> Run(FakeSlurm* fake, int retries, bool* threw,
                                                          std::string* what, const std::string& mode = "hetjob",
                                                          std::vector<std::string> fallback = {"chained"}) {
    Machine m = TestMachine();
    m.slurm.mode = *workflow::SlurmModeFromName(mode);
    m.slurm.fallback.clear();
    for (const std::string& f : fallback) m.slurm.fallback.push_back(*workflow::SlurmModeFromName(f));
    m.slurm.partition = "all";
    workflow::Pipeline p;
    p.retries.max = retries;
    p.retries.on = {"TIMEOUT", "NODE_FAIL"};
    SlurmLauncher l(p, m, LaunchContext{"run1", dir_, "/bin/msaflow", &clock_, fake});  // polls without waiting
    std::vector<std::pair<std::string, nlohmann::json>> events;
    LaunchObserver obs;
    obs.on_event = [&](const std::string& e, nlohmann::json f) { events.push_back({e, f}); };
    *threw = false;
    try {
      l.RunRound(plan_, Files(), dir_ + "/logs", obs);
    } catch (const Error& e) {
      *threw = true;
      *what = e.what();
    }
    return events;
  }
  std::string dir_;
  ManualClock clock_;
  RoundPlan plan_;
};

TEST_F(SlurmRound, OneHetjobPerRound) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  bool threw;
  std::string what;
  auto events = Run(fake, 0, &threw, &what);
  EXPECT_FALSE(threw) << what;
  ASSERT_EQ(fake->scripts.size(), 1u);
  EXPECT_EQ(events.front().first, "slurm-job");
  EXPECT_EQ(events.front().second["components"].size(), 3u);
  EXPECT_EQ(events.back().first, "slurm-end");
  EXPECT_EQ(events.back().second["state"], "COMPLETED");
}

TEST_F(SlurmRound, ARetryableEndResubmitsOnlyUnfinishedSteps) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  fake->outcomes = {{"r1-train", "TIMEOUT"}};
  bool threw;
  std::string what;
  auto events = Run(fake, 1, &threw, &what);
  EXPECT_FALSE(threw) << what;
  ASSERT_EQ(fake->scripts.size(), 2u);
  EXPECT_EQ(fake->scripts[1].find("step r1-load "), std::string::npos);     // finished before the timeout
  EXPECT_EQ(fake->scripts[1].find("step r1-prepare "), std::string::npos);
  EXPECT_NE(fake->scripts[1].find("step r1-train "), std::string::npos);
  EXPECT_EQ(fake->scripts[1].find("--partition=cm"), std::string::npos);  // no cm component needed any more
  bool retried = false;
  for (const auto& [e, f] : events) retried |= e == "slurm-retry" && f["state"] == "TIMEOUT";
  EXPECT_TRUE(retried);
}

TEST_F(SlurmRound, ANonRetryableEndFailsWithStateTaskAndLog) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  fake->outcomes = {{"r1-evaluate", "FAILED"}};
  bool threw;
  std::string what;
  Run(fake, 3, &threw, &what);  // FAILED is not in retry_on
  EXPECT_TRUE(threw);
  EXPECT_EQ(fake->scripts.size(), 1u);
  EXPECT_NE(what.find("FAILED"), std::string::npos) << what;
  EXPECT_NE(what.find("task r1-evaluate exited with status 1"), std::string::npos) << what;
  EXPECT_NE(what.find("/logs/r1-evaluate.log"), std::string::npos) << what;
}

TEST_F(SlurmRound, RetriesRunOut) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  fake->outcomes = {{"r1-load", "NODE_FAIL"}, {"r1-load", "NODE_FAIL"}};
  bool threw;
  std::string what;
  Run(fake, 1, &threw, &what);
  EXPECT_TRUE(threw);
  EXPECT_EQ(fake->scripts.size(), 2u);
  EXPECT_NE(what.find("attempt 2"), std::string::npos) << what;
  EXPECT_NE(what.find("NODE_FAIL"), std::string::npos) << what;
}

TEST_F(SlurmRound, ARefusedHetjobFallsBackToChainedJobs) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  fake->refuse_hetjobs = true;
  bool threw;
  std::string what;
  auto events = Run(fake, 0, &threw, &what);
  EXPECT_FALSE(threw) << what;
  ASSERT_EQ(fake->scripts.size(), 6u);  // one job per step
  EXPECT_TRUE(fake->extras[0].empty());
  for (size_t i = 1; i < 6; ++i) {
    ASSERT_EQ(fake->extras[i].size(), 2u);
    EXPECT_EQ(fake->extras[i][0], "--dependency=afterok:" + std::to_string(100 + i));
    EXPECT_EQ(fake->extras[i][1], "--kill-on-invalid-dep=yes");
  }
  EXPECT_EQ(events.front().first, "slurm-fallback");
}

TEST_F(SlurmRound, FallbacksAreTriedInOrderAndCancelWhatWasSubmitted) {
  FakeSlurm fake;
  fake.refuse_hetjobs = true;
  fake.refuse_chained = true;  // the third chained job is refused (a submit limit)
  bool threw;
  std::string what;
  auto events = Run(&fake, 0, &threw, &what, "hetjob", {"chained", "single"});
  EXPECT_FALSE(threw) << what;
  ASSERT_EQ(fake.scripts.size(), 3u);  // two chained jobs, then the single allocation
  EXPECT_EQ(fake.cancelled, (std::vector<std::string>{"101", "102"}));
  EXPECT_NE(fake.scripts[2].find("one allocation, modules as node subsets"), std::string::npos) << fake.scripts[2];
  std::vector<std::string> hops;
  for (const auto& [e, f] : events)
    if (e == "slurm-fallback") hops.push_back(f["from"].get<std::string>() + ">" + f["to"].get<std::string>());
  EXPECT_EQ(hops, (std::vector<std::string>{"hetjob>chained", "chained>single"}));
  EXPECT_EQ(events.back().first, "slurm-end");
  EXPECT_EQ(events.back().second["state"], "COMPLETED");
  // Without a further fallback the refusal is the error.
  FakeSlurm strict;
  strict.refuse_hetjobs = true;
  Run(&strict, 0, &threw, &what, "hetjob", {});
  EXPECT_TRUE(threw);
  EXPECT_NE(what.find("Heterogeneous jobs are not supported here"), std::string::npos) << what;
}

TEST_F(SlurmRound, AFailedChainedJobCancelsTheRest) {
  FakeSlurm real_fake;
  FakeSlurm* fake = &real_fake;
  // Job 2 (prepare) fails; later ones stay PENDING in this fake until cancelled.
  fake->outcomes = {{"", "COMPLETED"}, {"r1-prepare", "FAILED"}};
  struct Pending : FakeSlurm {
    std::string Show(const std::string& id) override {
      if (std::stoi(id) > 102 && std::find(cancelled.begin(), cancelled.end(), id) == cancelled.end())
        return "JobId=" + id + " JobState=PENDING Reason=Dependency ExitCode=0:0 Partition=dam NodeList=\n";
      if (std::stoi(id) > 102) return "JobId=" + id + " JobState=CANCELLED Reason=None ExitCode=0:0 Partition=dam\n";
      return FakeSlurm::Show(id);
    }
  };
  Pending pending;
  Pending* p = &pending;
  p->outcomes = fake->outcomes;
  bool threw;
  std::string what;
  Run(p, 0, &threw, &what, "chained");
  EXPECT_TRUE(threw);
  EXPECT_NE(what.find("task r1-prepare exited with status 1"), std::string::npos) << what;
}

// A rank a signal ended inside an mpirun step: mpirun exits 128 + N and names the rank; the
// step's failure is SIGNALED (retried under retries.on SIGNALED), as for a one-rank step.
TEST(LocalLauncher, ARankEndedByASignalIsSignaled) {
  int rank = -1, sig = 0;
  // Open MPI 4.1's line, as mpirun printed it for a rank killed with SIGKILL.
  EXPECT_TRUE(launch::LocalLauncher::RankSignal(
      "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).", &rank, &sig));
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(sig, 9);
  for (const char* other : {"Primary job  terminated normally, but 1 process returned",
                            "process rank x exited on signal 9", "rank 1 exited on signal 9",
                            "mpirun noticed that process rank 0 with PID 0 on node vm exited on signal 0 (none)."}) {
    rank = -1, sig = 0;
    EXPECT_FALSE(launch::LocalLauncher::RankSignal(other, &rank, &sig)) << other;
    EXPECT_EQ(sig, 0) << other;
  }
  ExitStatus mpirun{137, 0};
  EXPECT_EQ(launch::LocalLauncher::FailureReason(mpirun, 9), "SIGNALED");
  EXPECT_EQ(launch::LocalLauncher::FailureReason(mpirun), "FAILED");  // exit 137 without the line: a rank's own exit
  EXPECT_EQ(launch::LocalLauncher::FailureReason(ExitStatus{-1, 9}), "SIGNALED");
}

TEST(Slurm, MachineFilesAreValidated) {
  std::string what;
  try {
    ParseMachine(R"({"name": "x", "launcher": "pbs", "modules": {}})", "m.json", "");
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_EQ(what, "m.json: /launcher: 'pbs' is not a launcher (expected local or slurm)");
  try {
    ParseMachine(R"({"name": "x", "launcher": "slurm", "modules": {"cm": {"partition": "cm; rm -rf /"}}})", "m.json", "");
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("/modules/cm"), std::string::npos) << what;
  auto error = [](const std::string& text) {
    try {
      ParseMachine(text, "m.json", "");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"mode": "sinlge"}})"),
            "m.json: /slurm/mode: expected \"hetjob\", \"chained\" or \"single\"");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"mode": "single"}})"),
            "m.json: /slurm/partition: the single mode needs the one partition that holds every module's nodes");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"fallback": ["chained", 3]}})"),
            "m.json: /slurm/fallback/1: expected \"hetjob\", \"chained\" or \"single\"");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"nodes_share_cores": "yes"}})"),
            "m.json: /slurm/nodes_share_cores: expected true or false");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"nodes_share_core": true}})"),
            "m.json: /slurm: unknown field 'nodes_share_core' (expected mode, fallback, partition, conf, poll_s, "
            "nodes_share_cores)");
  EXPECT_TRUE(ParseMachine(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"nodes_share_cores": true}})",
                           "m.json", "")
                  .slurm.nodes_share_cores);
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {"cm": {"feature": "cm"}, "dam": {}},
                      "slurm": {"fallback": ["single"], "partition": "all"}})"),
            "m.json: /modules: in single mode either every module names its node feature or none does");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {"cm": {"time": "1:2:3:4"}}})"),
            "m.json: /modules/cm/time: '1:2:3:4' is not a Slurm time (expected minutes, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM, D-HH:MM:SS or UNLIMITED)");
  EXPECT_EQ(error(R"({"name": "x", "modules": {"cm": {"nodse": 2}}})"),
            "m.json: /modules/cm/nodse: unknown field (expected description, max_ranks, memory, fpga, partition, "
            "constraint, gres, feature, nodes, time)");
  EXPECT_EQ(error(R"({"name": "x", "modules": {"cm": {"memory": 64}}})"),
            "m.json: /modules/cm/memory: expected a size such as \"64GiB\"");
  EXPECT_EQ(
      ParseMachine(R"({"name": "x", "launcher": "slurm", "modules": {"dam": {"memory": "384GiB"}}})", "m.json", "")
          .modules.at("dam")
          .memory,
      uint64_t{384} << 30);
  EXPECT_EQ(ParseMachine(R"({"name": "x", "launcher": "slurm", "modules": {"dam": {}}})", "m.json", "")
                .modules.at("dam")
                .memory,
            0u);  // Slurm: not known unless the file says
  EXPECT_GT(ParseMachine(R"({"name": "x", "modules": {"dam": {}}})", "m.json", "").modules.at("dam").memory,
            uint64_t{1} << 20);  // local: this host's
  EXPECT_EQ(error(R"({"name": "x", "modules": {"c-m": {}}})"),
            "m.json: /modules/c-m: a module name is 1 to 32 lower-case letters, digits or '_'");
  EXPECT_EQ(error(R"({"name": "x", "modules": {}, "nam": {"serve": true, "uri": "fabric://h:1"}})"),
            "m.json: /nam: give either uri (a running NAM server) or serve: true, not both");
  EXPECT_EQ(error(R"({"name": "x", "modules": {}, "nam": {"uri": "redis://h:1"}})"),
            "m.json: /nam/uri: 'redis://h:1': expected fabric://host:port or file:///dir");
  EXPECT_EQ(error(R"({"name": "x", "modules": {"cm": {}}, "nam": {"serve": true, "module": "cm"}})"),
            "m.json: /nam/module: a NAM server on a module needs launcher slurm");
  EXPECT_EQ(error(R"({"name": "x", "launcher": "slurm", "modules": {"cm": {}}, "nam": {"serve": true, "module": "nam"}})"),
            "m.json: /nam/module: module 'nam' is not in machine 'x' (has cm)");
  EXPECT_EQ(ParseSlurmTime("30", "t"), 1800);
  EXPECT_EQ(ParseSlurmTime("1:30", "t"), 90);
  EXPECT_EQ(ParseSlurmTime("01:00:05", "t"), 3605);
  EXPECT_EQ(ParseSlurmTime("2-3", "t"), 2 * 86400 + 3 * 3600);
  EXPECT_EQ(ParseSlurmTime("1-0:10:01", "t"), 86400 + 601);
  EXPECT_EQ(ParseSlurmTime("UNLIMITED", "t"), -1);
  Machine fb = ParseMachine(R"({"name": "x", "launcher": "slurm", "modules": {}, "slurm": {"fallback": false}})", "m", "");
  EXPECT_TRUE(fb.slurm.fallback.empty());
  for (const char* f : {"slurm-local.json", "deep-est.json"}) {
    Machine m = LoadMachine(std::string(MSAFLOW_SOURCE_DIR) + "/configs/machines/" + f);
    EXPECT_EQ(m.launcher, LauncherKind::kSlurm) << f;
    for (const char* mod : {"cm", "dam", "esb"}) EXPECT_TRUE(m.modules.count(mod)) << f << " " << mod;
  }
}

}  // namespace
}  // namespace msaflow::launch
