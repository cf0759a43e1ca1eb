#include "workflow/objects.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/checksum.h"
#include "common/error.h"

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
int64_t FeaturesPartRows(int64_t dim, int64_t batch, int64_t part_bytes) {
  const int64_t rows = part_bytes / std::max<int64_t>(1, dim * static_cast<int64_t>(sizeof(float)));
  return std::max<int64_t>(1, rows / batch) * batch;
}

int64_t FeaturesPartBytes() {
  const char* v = std::getenv("MSAFLOW_PART_BYTES");
  if (!v || !*v) return int64_t{1} << 20;
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(v, &end, 10);
  if (errno || end == v || *end || bytes < 1)
    Throw(ErrorKind::kInvalidInput, std::string("MSAFLOW_PART_BYTES='") + v + "': expected a positive number of bytes");
  return bytes;
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
