#include "workflow/rung0_features.h"

#include <fmt/core.h>

#include <cstring>

#include "common/error.h"

namespace msaflow::workflow {

std::string SubsetFeaturesBody(const SubsetFeatures& s) {
  std::string body(s.rows.size() * sizeof(int64_t) + s.values.size() * sizeof(float), '\0');
  std::memcpy(body.data(), s.rows.data(), s.rows.size() * sizeof(int64_t));
  std::memcpy(body.data() + s.rows.size() * sizeof(int64_t), s.values.data(), s.values.size() * sizeof(float));
  return body;
}

nlohmann::json SubsetFeaturesMeta(const SubsetFeatures& s) {
  return {{"kind", "rung0-features"},
          {"format", kSubsetFeaturesFormat},
          {"backbone", s.backbone},
          {"backbone_digest", s.backbone_digest},
          {"split", "train"},
          {"split_stamp", s.split_stamp},
          {"rows", static_cast<int64_t>(s.rows.size())},
          {"dim", s.dim}};
}

SubsetFeatures ParseSubsetFeatures(const std::string& body, const nlohmann::json& meta, int64_t split_rows,
                                   const std::string& where) {
  auto bad = [&](const std::string& what) { Throw(ErrorKind::kCorrupt, where + ": " + what); };
  if (!meta.is_object() || meta.value("format", "") != kSubsetFeaturesFormat)
    bad(std::string("metadata is not ") + kSubsetFeaturesFormat);
  SubsetFeatures s;
  try {
    s.backbone = meta.at("backbone").get<std::string>();
    s.backbone_digest = meta.at("backbone_digest").get<std::string>();
    s.split_stamp = meta.at("split_stamp").get<std::string>();
    s.dim = meta.at("dim").get<int64_t>();
    const int64_t n = meta.at("rows").get<int64_t>();
    if (n < 0 || s.dim <= 0 || n > split_rows)
      bad(fmt::format("{} rows of {} values (a split of {} rows)", n, s.dim, split_rows));
    s.rows.resize(static_cast<size_t>(n));
    s.values.resize(static_cast<size_t>(n * s.dim));
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("metadata: ") + e.what());
  }
  const size_t want = s.rows.size() * sizeof(int64_t) + s.values.size() * sizeof(float);
  if (body.size() != want)
    bad(fmt::format("{} bytes; {} rows of {} values take {}", body.size(), s.rows.size(), s.dim, want));
  std::memcpy(s.rows.data(), body.data(), s.rows.size() * sizeof(int64_t));
  std::memcpy(s.values.data(), body.data() + s.rows.size() * sizeof(int64_t), s.values.size() * sizeof(float));
  for (size_t i = 0; i < s.rows.size(); ++i)
    if (s.rows[i] < 0 || s.rows[i] >= split_rows || (i > 0 && s.rows[i] <= s.rows[i - 1]))
      bad(fmt::format("row {} of the list is {}: rows must ascend within [0, {})", i, s.rows[i], split_rows));
  return s;
}

}  // namespace msaflow::workflow
