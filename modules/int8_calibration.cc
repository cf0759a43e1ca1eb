#include "modules/int8_calibration.h"

#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/fpga/device.h"
#include "workflow/datasets.h"

namespace msaflow::modules {

void CalibrateOnTrainingImages(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor& ex) {
  const workflow::SplitSource train = workflow::OpenSplit(c.pipeline(), "train");
  const int64_t n = std::min(kCalibrationImages, train.count());
  if (n == 0) Throw(ErrorKind::kInvalidInput, "backbone '" + bb.name + "': precision int8: the training split is empty");
  const kernels::ImageSet images = train.Read(0, n);
  const auto& in = bb.input;
  const int64_t per = in.channels * in.height * in.width, batch = in.batch > 0 ? in.batch : 64;
  std::vector<float> x(static_cast<size_t>(batch * per));
  for (int64_t s = 0; s < n; s += batch) {
    const int64_t b = std::min(batch, n - s);
    kernels::fpga::PrepareImages(c.Fpga(), images, 0, s, b, in, x.data());
    if (in.batch > 0) {  // a fixed-batch model: the last batch is filled up with its first image
      for (int64_t k = b; k < batch; ++k) std::copy(x.begin(), x.begin() + per, x.begin() + k * per);
    }
    ex.Calibrate(x.data(), in.batch > 0 ? batch : b, in.channels, in.height, in.width);
  }
}

nlohmann::json RangesToJson(const kernels::Executor::Ranges& ranges) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, r] : ranges) j[name] = r;
  return j;
}

kernels::Executor::Ranges RangesFromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || j.empty())
    Throw(ErrorKind::kCorrupt, where + ": int8 ranges: expected an object of tensor ranges (load the backbone again)");
  kernels::Executor::Ranges ranges;
  for (const auto& [name, v] : j.items()) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      Throw(ErrorKind::kCorrupt, where + ": int8 range of tensor '" + name + "': expected a finite non-negative number");
    ranges[name] = v.get<float>();
  }
  return ranges;
}

}  // namespace msaflow::modules
