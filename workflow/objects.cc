#include "workflow/objects.h"

#include "common/checksum.h"

namespace msaflow::workflow {
namespace {

std::string RunRound(const char* kind, const std::string& run, int round) {
  return std::string(kind) + "/" + run + "/" + std::to_string(round);
}

}  // namespace

std::string BackboneObject(const std::string& backbone) { return "backbone/" + backbone; }
std::string FeaturesObject(const std::string& bb_digest, const std::string& ds_digest) {
  return "features/" + bb_digest + "-" + ds_digest;
}
std::string MapsObject(const std::string& bb_digest, const std::string& ds_digest, const std::string& train_from) {
  return "maps/" + bb_digest + "-" + ds_digest + "-" + ChecksumHex(train_from).substr(0, 16);
}
std::string FeaturesPartObject(const std::string& features_object, int64_t part) {
  std::string digits = std::to_string(part);
  if (digits.size() < 5) digits.insert(0, 5 - digits.size(), '0');
  return features_object + ".p" + digits;
}
std::string PreparedObject(const std::string& run, int round) { return RunRound("prepared", run, round); }
std::string StagingPrefix(const std::string& run, int round) { return RunRound("staging", run, round) + "/"; }
std::string StagingObject(const std::string& run, int round, const std::string& cand) {
  return StagingPrefix(run, round) + cand;
}
std::string ModelObject(const std::string& run, int round, const std::string& cand) {
  return RunRound("model", run, round) + "/" + cand;
}
std::string EvalPrefix(const std::string& run, int round, const std::string& cand) {
  return RunRound("eval", run, round) + "/" + cand + "/";
}
std::string EvalObject(const std::string& run, int round, const std::string& cand, int64_t shard) {
  return EvalPrefix(run, round, cand) + std::to_string(shard);
}
std::string TrainedObject(const std::string& run, int round) { return RunRound("trained", run, round); }
std::string EvaluatedObject(const std::string& run, int round) { return RunRound("evaluated", run, round); }
std::string ResultObject(const std::string& run, int round, const std::string& cand) {
  return RunRound("result", run, round) + "/" + cand;
}
std::string BestObject(const std::string& run, int round) { return RunRound("best", run, round); }
std::string TaskDoneObject(const std::string& run, int round, Step step) {
  return RunRound("done", run, round) + "/" + StepName(step);
}

std::string Rung0FeaturesObject(const std::string& run, const std::string& backbone) {
  return "rung0/" + run + "/" + backbone;
}

std::string DatasetDigestObject(const std::string& split_stamp) { return "digest/" + ChecksumHex(split_stamp); }

}  // namespace msaflow::workflow
