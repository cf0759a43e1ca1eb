// What a user's folders hold that a pipeline can name (the dashboard's new-run form): image
// folders, IDX image files with their labels, ONNX models; and the layers a model can be cut
// at. Only what lies inside the user's folders once links are resolved is listed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "service/users.h"

namespace msaflow::service {

// Bounds of one listing: how deep below a folder, how many entries are read in all, and how
// many of each kind are returned (the answer says "truncated" when a bound was reached).
struct CatalogLimits {
  int depth = 4;
  int64_t entries = 20000;
  size_t per_kind = 200;
};

// GET /v1/catalog: {"image_folders": [{path, classes}], "idx": [{images, labels}],
// "models": [{path, bytes}], "truncated": bool}, each list sorted by path.
nlohmann::json Catalog(const User& user, const CatalogLimits& limits = {});

// GET /v1/catalog/layers?onnx=PATH: {"onnx", "input": {height, width, channels} (null where
// the model leaves it open), "layers": [{name, node, op}], "suggested"}. Throws ApiError 403 for a
// file outside the user's folders, 404 for none, 422 for a file that is not an ONNX model.
nlohmann::json CatalogLayers(const User& user, const std::string& onnx);

}  // namespace msaflow::service
