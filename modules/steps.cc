#include "modules/steps.h"

#include "common/error.h"
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

const std::string& StepContext::DatasetDigest(const std::string& split) {
  auto it = digests_.find(split);
  if (it != digests_.end()) return it->second;
  return digests_[split] = workflow::OpenSplit(pipeline(), split).Digest();
}

kernels::fpga::Device& StepContext::Fpga() {
  if (fpga_) return *fpga_;
  fpga_ = kernels::fpga::Open(task.fpga, &fpga_notice_);
  if (root()) {
    if (!fpga_notice_.empty()) Say(fpga_notice_);
    Say("fpga: " + fpga_->Name() + " (fpga \"" + task.fpga.backend + "\")");
  }
  return *fpga_;
}

nlohmann::json StepContext::FpgaReport() const {
  nlohmann::json j = {{"requested", task.fpga.backend}};
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

void RunStep(const std::string& step, const nlohmann::json& task, parallel::Comm& comm, std::FILE* out) {
  if (task.is_object() && task.contains("step") && task["step"].is_string() && task["step"] != step)
    Throw(ErrorKind::kInvalidInput, "task is for step '" + task["step"].get<std::string>() + "', not '" + step + "'");
  StepContext c;
  c.task = workflow::ParseTask(task, "task");
  c.store = nam::OpenStore(c.task.nam);
  c.comm = &comm;
  c.out = out;
  c.overlap = OverlapEnabled();
  if (step == "load") return Load(c);
  if (step == "prepare") return Prepare(c);
  if (step == "train") return Train(c);
  if (step == "store") return Store(c);
  if (step == "evaluate") return Evaluate(c);
  if (step == "select") return Select(c);
  Throw(ErrorKind::kInvalidInput, "unknown step '" + step + "' (expected load, prepare, train, store, evaluate, select)");
}

}  // namespace msaflow::modules
