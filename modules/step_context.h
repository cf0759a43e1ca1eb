// What every step gets: its task, the NAM, its ranks and where its output goes (internal to
// modules/).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/overlap.h"
#include "kernels/fpga/cost_model.h"
#include "kernels/fpga/device.h"
#include "nam/store.h"
#include "parallel/comm.h"
#include "workflow/task.h"

namespace msaflow::modules {

// Thrown by StepContext::WorkAhead in a settled-only run; RunStepInCoordinator catches it.
struct Unsettled {};

struct StepContext {
  workflow::TaskSpec task;
  std::unique_ptr<nam::Store> store;
  parallel::Comm* comm = nullptr;
  std::FILE* out = nullptr;
  // Whether the data manager fetches the next chunk while computing on this one: decided per
  // stream from what it measures (auto), or forced by MSAFLOW_OVERLAP (common/overlap.h).
  OverlapMode overlap = OverlapMode::kAuto;
  // The content keys of what the step read (rank 0's: {"backbones": {name: digest},
  // "datasets": {split: digest}}); its done object records them, and `msaflow why` compares them.
  nlohmann::json inputs = nlohmann::json::object();
  // Set by RunStepInCoordinator: the step may only finish what needs no computing (WorkAhead).
  bool settled_only = false;
  // Set by RunStepInCoordinator for train and evaluate of one rank: the step goes on in the
  // coordinator only if its estimated multiply-adds are at most this (CheckSmall). Negative: no
  // bound (a module process).
  double small_macs = -1;

  const workflow::Pipeline& pipeline() const { return task.pipeline; }
  bool root() const { return comm->rank() == 0; }
  // One line of progress, "[rank] " first when the step has several ranks.
  void Say(const std::string& line) const;
  // The digest of a dataset split (train | validation | test) as the features keys use it:
  // from the NAM's digest cache when the split's files are unchanged (workflow::SplitStamp),
  // else its images are read (once per step) and the digest cached.
  const std::string& DatasetDigest(const std::string& split);
  // A digest computed from a split the step opened itself, kept for DatasetDigest and cached.
  void RememberDatasetDigest(const std::string& split, const std::string& digest);
  // The split's digest if this step has it already (computed or from the cache), else null.
  const std::string* KnownDatasetDigest(const std::string& split) const {
    auto it = digests_.find(split);
    return it == digests_.end() ? nullptr : &it->second;
  }
  int digest_cache_hits() const { return digest_cache_hits_; }
  // Called where the step is about to compute something (read images, import or run a
  // backbone) or to write what it computed. In a settled-only run it throws Unsettled, before the step has
  // written anything; otherwise it does nothing.
  void WorkAhead() const;
  // Called before a train or evaluate step computes, with its estimated multiply-adds: throws
  // Unsettled, before anything is written, where they are over small_macs.
  void CheckSmall(double macs) const;
  // This step's FPGA backend (task.fpga), opened on first use; rank 0 says which device it is
  // (and, for "auto" without OpenCL, why it is the CPU).
  kernels::fpga::Device& Fpga();
  bool FpgaOpen() const { return fpga_ != nullptr; }
  // What the results say about the FPGA: backend asked for, device used, the fallback notice,
  // the Slurm job and node it ran on.
  nlohmann::json FpgaReport() const;
  // Removes `name` from the NAM once the step's done object is committed, not before: a step
  // that consumes its inputs (select merging the evaluation shards) can then be killed at any
  // moment and simply run again. A kill between the commit and the removal leaves the object
  // behind, unread.
  void RemoveOnceDone(std::string name) { remove_once_done_.push_back(std::move(name)); }
  const std::vector<std::string>& remove_once_done() const { return remove_once_done_; }
  // The data manager's choice for one stream of this step's reads ("features <split>",
  // "image batches"), made on its first items and kept for the rest of the step.
  OverlapChoice& Overlapping(const std::string& stream);
  // Every stream's choice, {stream: OverlapChoice::Json()}, for the step's results; each
  // decided stream is said in the log once.
  nlohmann::json OverlapReport();

 private:
  std::map<std::string, OverlapChoice> overlapping_;
  std::map<std::string, bool> overlap_said_;
  std::map<std::string, std::string> digests_;
  int digest_cache_hits_ = 0;
  std::unique_ptr<kernels::fpga::Device> fpga_;
  std::string fpga_notice_;
  std::vector<std::string> remove_once_done_;
};

void Load(StepContext& c);
void Prepare(StepContext& c);
void Train(StepContext& c);
void Store(StepContext& c);
void Evaluate(StepContext& c);
void Select(StepContext& c);

}  // namespace msaflow::modules
