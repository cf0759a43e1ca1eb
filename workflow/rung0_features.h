// Rung 0's features in the NAM: a backbone's features on the rows of the training split that
// the halving strategy's first rung ranked it on (ranking/rank.h), handed to the prepare step so
// that it runs those images through the backbone only once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace msaflow::workflow {

// A backbone's features on rows of the training split, computed by rung 0 and put in the NAM
// (workflow::Rung0FeaturesObject) so that prepare runs those images through it only once.
// The object's body is the rows (int64, ascending) then the values (float32, [rows, dim]); its
// metadata names the backbone's digest (workflow::BackboneDigestOf) and the training split's
// stamp (workflow::SplitStamp), which prepare checks before using any of it.
struct SubsetFeatures {
  std::string backbone, backbone_digest, split_stamp;
  int64_t dim = 0;
  std::vector<int64_t> rows;
  std::vector<float> values;
};
inline constexpr char kSubsetFeaturesFormat[] = "msaflow.rung0-features/1";
// The object's body and metadata.
std::string SubsetFeaturesBody(const SubsetFeatures& s);
nlohmann::json SubsetFeaturesMeta(const SubsetFeatures& s);
// Reads them back; kCorrupt naming `where` for a body or metadata that is not what the writer
// makes (sizes, rows not ascending, below 0 or not below `split_rows`).
SubsetFeatures ParseSubsetFeatures(const std::string& body, const nlohmann::json& meta, int64_t split_rows,
                                   const std::string& where);

}  // namespace msaflow::workflow
