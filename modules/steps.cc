#include "modules/steps.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/error.h"
#include "common/version.h"
#include "nam/fabric_store.h"
#include "nam/recording_store.h"
#include "workflow/objects.h"
#include "kernels/dataset.h"
#include "workflow/datasets.h"
#include "modules/features.h"
#include "modules/step_context.h"

namespace msaflow::modules {

void StepContext::Say(const std::string& line) const {
  if (comm->size() > 1) {
    std::fprintf(out, "[%d] %s\n", comm->rank(), line.c_str());
  } else {
    std::fprintf(out, "%s\n", line.c_str());
  }
  std::fflush(out);
}

namespace {

// MSAFLOW_DIGEST_CACHE=0 turns the dataset digest cache off.
bool DigestCacheOn() {
  const char* v = std::getenv("MSAFLOW_DIGEST_CACHE");
  return !(v && std::string(v) == "0");
}

}  // namespace

const std::string& StepContext::DatasetDigest(const std::string& split) {
  auto it = digests_.find(split);
  if (it != digests_.end()) return it->second;
  // The digest of the same files (path, size, inode, mtime) with the same spec is read from
  // the NAM instead of reading and hashing every image again.
  if (DigestCacheOn()) {
    const std::string stamp = workflow::SplitStamp(pipeline(), split);
    if (auto info = store->Stat(workflow::DatasetDigestObject(stamp));
        info && info->meta.contains("digest") && info->meta["digest"].is_string() &&
        info->meta.value("stamp_size", uint64_t{0}) == stamp.size()) {
      ++digest_cache_hits_;
      return digests_[split] = info->meta["digest"].get<std::string>();
    }
  }
  WorkAhead();
  RememberDatasetDigest(split, workflow::OpenSplit(pipeline(), split).Digest());
  return digests_[split];
}

void StepContext::RememberDatasetDigest(const std::string& split, const std::string& digest) {
  digests_[split] = digest;
  if (!DigestCacheOn() || !root()) return;
  const std::string stamp = workflow::SplitStamp(pipeline(), split);
  store->Put(workflow::DatasetDigestObject(stamp), stamp,
             {{"kind", "dataset-digest"}, {"split", split}, {"digest", digest}, {"stamp_size", stamp.size()}});
}

OverlapChoice& StepContext::Overlapping(const std::string& stream) {
  return overlapping_.try_emplace(stream, overlap).first->second;
}

nlohmann::json StepContext::OverlapReport() {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [stream, choice] : overlapping_) {
    j[stream] = choice.Json();
    if (choice.items() > 0 && !overlap_said_[stream]) {
      overlap_said_[stream] = true;
      Say("data manager, " + stream + ": " + choice.Describe());
    }
  }
  return j;
}

void StepContext::WorkAhead() const {
  if (settled_only) throw Unsettled{};
}

void StepContext::CheckSmall(double macs) const {
  if (small_macs >= 0 && macs > small_macs) throw Unsettled{};
}

kernels::fpga::Device& StepContext::Fpga() {
  if (fpga_) return *fpga_;
  fpga_ = kernels::fpga::Open(task.fpga, &fpga_notice_);
  if (root()) {
    if (!fpga_notice_.empty()) Say(fpga_notice_);
    Say("fpga: " + fpga_->Name() + " (fpga \"" + kernels::fpga::BackendName(task.fpga.backend) + "\")");
  }
  return *fpga_;
}

nlohmann::json StepContext::FpgaReport() const {
  nlohmann::json j = {{"requested", kernels::fpga::BackendName(task.fpga.backend)}};
  if (fpga_) {
    j["backend"] = fpga_->Backend();
    j["device"] = fpga_->Name();
  } else {
    j["device"] = nullptr;  // nothing needed it (every feature reused)
  }
  if (!fpga_notice_.empty()) j["notice"] = fpga_notice_;
  if (task.fpga.target.given()) j["target"] = task.fpga.target.name.empty() ? "(unnamed)" : task.fpga.target.name;
  if (const char* job = std::getenv("SLURM_JOB_ID")) {
    const char* node = std::getenv("SLURMD_NODENAME");
    j["slurm"] = {{"job", job}, {"node", node ? node : ""}, {"gres", task.gres}};
  }
  return j;
}

namespace {

// The step's last commit: every rank's outputs, gathered to rank 0, which puts the done object.
// Until it exists the task counts as not done, so a step killed at any moment runs again on
// resume, and one that got this far never does. What the ranks consumed (RemoveOnceDone) is
// removed after it, so a step run again still finds its inputs.
void CommitDone(StepContext& c, workflow::Step step_kind, const std::string& key, const nam::RecordingStore& rec) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  // What the rank cost its node so far: peak resident memory, page faults, CPU time.
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const double cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  nlohmann::json mine = {{"rank", c.comm->rank()},       {"host", host},
                         {"put_bytes", rec.put_bytes()}, {"got_bytes", rec.got_bytes()},
                         {"max_rss_kib", ru.ru_maxrss},  {"minor_faults", ru.ru_minflt},
                         {"cpu_s", cpu_s},               {"threads", omp_get_max_threads()},
                         {"puts", nlohmann::json::array()},
                         {"remove", c.remove_once_done()}};
  for (const auto& i : rec.Puts()) mine["puts"].push_back({{"name", i.name}, {"size", i.size}, {"checksum", i.checksum}});
  std::vector<std::string> all = c.comm->Gather(mine.dump(), 0);
  if (!c.root()) return;
  nlohmann::json outputs = nlohmann::json::array(), ranks = nlohmann::json::array();
  std::vector<std::string> consumed;
  for (const auto& text : all) {
    nlohmann::json r = nlohmann::json::parse(text);
    for (auto& o : r["puts"]) outputs.push_back(std::move(o));
    for (const auto& n : r["remove"]) consumed.push_back(n.get<std::string>());
    r.erase("puts");
    r.erase("remove");
    ranks.push_back(std::move(r));
  }
  const std::string step = workflow::StepName(step_kind);
  const std::string id = "r" + std::to_string(c.task.round) + "-" + step;
  c.store->Put(workflow::TaskDoneObject(c.task.run, c.task.round, step_kind),
               nlohmann::json{{"task", id}, {"step", step}, {"key", key}, {"msaflow", kVersion}, {"inputs", c.inputs},
                              {"ranks", ranks}, {"outputs", outputs}}
                   .dump(),
               {{"task", id}, {"step", step}, {"key", key}, {"outputs", outputs.size()}});
  for (const auto& n : consumed) c.store->Remove(n);
}

}  // namespace

namespace {

void Dispatch(workflow::Step step, StepContext& c) {
  switch (step) {
    case workflow::Step::kLoad: return Load(c);
    case workflow::Step::kPrepare: return Prepare(c);
    case workflow::Step::kTrain: return Train(c);
    case workflow::Step::kStore: return Store(c);
    case workflow::Step::kEvaluate: return Evaluate(c);
    case workflow::Step::kSelect: return Select(c);
  }
}

void CheckTaskStep(workflow::Step step, const nlohmann::json& task) {
  if (task.is_object() && task.contains("step") && task["step"].is_string() && task["step"] != workflow::StepName(step))
    Throw(ErrorKind::kInvalidInput, "task is for step '" + task["step"].get<std::string>() + "', not '" +
                                        workflow::StepName(step) + "'");
}

// Runs the step as this rank of `comm`, over `store` when given (else the task's NAM), and
// commits its done object; settled_only and small_macs as in StepContext.
void Execute(workflow::Step step, const nlohmann::json& task, parallel::Comm& comm, std::FILE* out,
             nam::Store* store, bool settled_only, double small_macs = -1) {
  CheckTaskStep(step, task);
  std::unique_ptr<nam::Store> opened;  // outlives the context, whose store wraps it
  StepContext c;
  c.task = workflow::ParseTask(task, "task");
  if (!store) opened = nam::OpenStore(c.task.nam);
  nam::Store& base = store ? *store : *opened;
  auto recording = std::make_unique<nam::RecordingStore>(base);
  nam::RecordingStore* recorded = recording.get();
  c.store = std::move(recording);
  c.comm = &comm;
  c.out = out;
  c.overlap = OverlapModeFromEnv();
  c.settled_only = settled_only;
  c.small_macs = small_macs;
  Dispatch(step, c);
  CommitDone(c, step, workflow::TaskKey(task), *recorded);
  // How this rank's bytes reached the NAM server: through its pool mapped here (one host), or
  // by RMA over the fabric (the server on another host): the multi-host tests read it.
  if (auto* fabric = dynamic_cast<nam::FabricStore*>(&base); fabric && out && !settled_only)
    std::fprintf(out, "rank %d: NAM bytes by %s\n", comm.rank(),
                 fabric->Transport() == "map" ? "the server's pool mapped on this host" : "RMA over the fabric");
}

}  // namespace

void RunStep(workflow::Step step, const nlohmann::json& task, parallel::Comm& comm, std::FILE* out) {
  Execute(step, task, comm, out, nullptr, false);
}

namespace {

bool IsLight(workflow::Step step) {
  switch (step) {
    case workflow::Step::kLoad:
    case workflow::Step::kStore:
    case workflow::Step::kSelect:
      return true;
    case workflow::Step::kPrepare:
    case workflow::Step::kTrain:
    case workflow::Step::kEvaluate:
      return false;
  }
  return false;
}

}  // namespace

std::string RunStepInCoordinator(workflow::Step step, int64_t ranks, const nlohmann::json& task, nam::Store& store,
                                 std::FILE* out) {
  parallel::SelfComm self;
  if (step == workflow::Step::kLoad || step == workflow::Step::kPrepare) {
    try {
      Execute(step, task, self, out, &store, true);
      return kNothingToCompute;
    } catch (const Unsettled&) {  // it has work to do: perhaps light work, below
    } catch (const std::exception&) {
      return "";
    }
  }
  if (ranks != 1) return "";
  if (step == workflow::Step::kTrain || step == workflow::Step::kEvaluate) {
    try {
      Execute(step, task, self, out, &store, false, kSmallStepMacs);
      return kSmallStep;
    } catch (const Unsettled&) {  // more work than a process start: a process
      return "";
    } catch (const std::exception&) {
      return "";
    }
  }
  if (!IsLight(step)) return "";
  try {
    Execute(step, task, self, out, &store, false);
    return kLightStep;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace msaflow::modules
