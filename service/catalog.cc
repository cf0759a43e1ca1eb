#include "service/catalog.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "kernels/npy.h"
#include "kernels/onnx_graph.h"
#include "service/admission.h"
#include "service/api_error.h"

namespace msaflow::service {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The largest model whose layers the service reads for a form: the models msaflow is used with
// are 5-100 MB; a 2 GiB file (what the executor accepts) is not parsed on a web request.
constexpr uint64_t kMaxLayersModelBytes = uint64_t{512} << 20;

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The names a labels array beside the images array `name` is given in the namings people use:
// train_images / train_labels, images / labels, x_train / y_train, X_test / y_test, data_x / data_y.
std::vector<std::string> LabelNamesFor(const std::string& name) {
  std::vector<std::string> out;
  const std::string stem = name.substr(0, name.size() - 4);  // without ".npy"
  for (const auto& [from, to] :
       {std::pair{"images", "labels"}, {"Images", "Labels"}, {"image", "label"}, {"imgs", "labels"}})
    if (const size_t at = stem.rfind(from); at != std::string::npos)
      out.push_back(std::string(stem).replace(at, std::string_view(from).size(), to) + ".npy");
  for (const char* y : {"y", "Y"}) {
    if (stem == "x" || stem == "X") out.push_back(std::string(y) + ".npy");
    if (stem.size() > 2 && (stem[0] == 'x' || stem[0] == 'X') && (stem[1] == '_' || stem[1] == '-'))
      out.push_back(y + stem.substr(1) + ".npy");
    if (stem.size() > 2 && (stem.back() == 'x' || stem.back() == 'X') &&
        (stem[stem.size() - 2] == '_' || stem[stem.size() - 2] == '-'))
      out.push_back(stem.substr(0, stem.size() - 1) + y + ".npy");
  }
  return out;
}

bool IsImageFile(const std::string& name) {
  const std::string l = Lower(name);
  return EndsWith(l, ".png") || EndsWith(l, ".jpg") || EndsWith(l, ".jpeg");
}

// Reads folders breadth-first within the limits; symbolic links are not followed (what they
// point at may lie outside the user's folders) and hidden entries are skipped.
class Walk {
 public:
  explicit Walk(const CatalogLimits& l) : limits_(l) {}

  void Folder(const std::string& root) {
    std::vector<std::pair<std::string, int>> queue{{root, 0}};
    for (size_t at = 0; at < queue.size(); ++at) {
      const auto [dir, depth] = queue[at];
      std::vector<std::string> dirs, files;
      if (!Entries(dir, dirs, files)) return;
      for (const std::string& f : files) File(dir, f);
      NpyPairs(dir, files);
      const int64_t classes = ClassFolders(dir, dirs);
      if (classes > 0) {
        Add(folders_, {{"path", dir}, {"classes", classes}});
        continue;  // its class folders hold images, nothing else to list
      }
      if (depth < limits_.depth)
        for (const std::string& d : dirs) queue.emplace_back(dir + "/" + d, depth + 1);
    }
  }

  json Answer() {
    auto by_path = [](const char* key) {
      return [key](const json& a, const json& b) { return a[key].get<std::string>() < b[key].get<std::string>(); };
    };
    std::sort(folders_.begin(), folders_.end(), by_path("path"));
    std::sort(idx_.begin(), idx_.end(), by_path("images"));
    std::sort(npy_.begin(), npy_.end(), by_path("images"));
    std::sort(models_.begin(), models_.end(), by_path("path"));
    return {{"image_folders", folders_}, {"idx", idx_}, {"npy", npy_}, {"models", models_}, {"truncated", truncated_}};
  }

 private:
  // The names of a folder's sub-folders and regular files, each sorted; false once the budget
  // of entries is spent.
  bool Entries(const std::string& dir, std::vector<std::string>& dirs, std::vector<std::string>& files,
               int64_t at_most = -1) {
    std::error_code ec;
    fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    for (int64_t n = 0; !ec && it != fs::directory_iterator(); it.increment(ec), ++n) {
      if (at_most >= 0 && n >= at_most) break;
      if (--budget_ < 0) {
        truncated_ = true;
        return false;
      }
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      const fs::file_status st = it->symlink_status(ec);
      if (ec) break;
      if (fs::is_directory(st)) dirs.push_back(name);
      if (fs::is_regular_file(st)) files.push_back(name);
    }
    std::sort(dirs.begin(), dirs.end());
    std::sort(files.begin(), files.end());
    return true;
  }

  // How many class folders `dir` has when it is laid out as an image folder (at least two
  // sub-folders, and the first three each with an image among their first entries), else 0.
  int64_t ClassFolders(const std::string& dir, const std::vector<std::string>& dirs) {
    if (dirs.size() < 2) return 0;
    for (size_t k = 0; k < std::min<size_t>(3, dirs.size()); ++k) {
      std::vector<std::string> sub, files;
      if (!Entries(dir + "/" + dirs[k], sub, files, 64)) return 0;
      if (std::none_of(files.begin(), files.end(), IsImageFile)) return 0;
    }
    return static_cast<int64_t>(dirs.size());
  }

  void File(const std::string& dir, const std::string& name) {
    const std::string path = dir + "/" + name;
    if (EndsWith(Lower(name), ".onnx")) {
      std::error_code ec;
      const auto bytes = fs::file_size(path, ec);
      if (!ec) Add(models_, {{"path", path}, {"bytes", bytes}});
      return;
    }
    // MNIST's naming: <split>-images-idx3-ubyte[.gz] beside <split>-labels-idx1-ubyte[.gz].
    const size_t at = name.find("images-idx3-ubyte");
    if (at == std::string::npos) return;
    std::string labels = name;
    labels.replace(at, 17, "labels-idx1-ubyte");
    if (PathExists(dir + "/" + labels)) Add(idx_, {{"images", path}, {"labels", dir + "/" + labels}});
  }

  // A folder's .npy image arrays, each with the labels array named for it (LabelNamesFor) or,
  // failing that, the folder's one labels array of as many rows. Only headers are read, of at
  // most kMaxNpyPeeks files a folder.
  void NpyPairs(const std::string& dir, const std::vector<std::string>& files) {
    constexpr int kMaxNpyPeeks = 64;
    std::vector<std::pair<std::string, int64_t>> images, labels;
    int peeks = 0;
    for (const std::string& f : files) {
      if (!EndsWith(Lower(f), ".npy")) continue;
      if (++peeks > kMaxNpyPeeks) {
        truncated_ = true;
        break;
      }
      const kernels::NpyRole r = kernels::PeekNpy(dir + "/" + f);
      if (r.kind == kernels::NpyRole::kImages) images.emplace_back(f, r.count);
      if (r.kind == kernels::NpyRole::kLabels) labels.emplace_back(f, r.count);
    }
    for (const auto& [name, count] : images) {
      auto rows = [count = count](const auto& l) { return l.second == count; };
      std::string found;
      for (const std::string& want : LabelNamesFor(name))
        for (const auto& l : labels)
          if (found.empty() && l.first == want && rows(l)) found = l.first;
      if (found.empty() && std::count_if(labels.begin(), labels.end(), rows) == 1)
        found = std::find_if(labels.begin(), labels.end(), rows)->first;
      if (!found.empty()) Add(npy_, {{"images", dir + "/" + name}, {"labels", dir + "/" + found}, {"count", count}});
    }
  }

  void Add(std::vector<json>& list, json item) {
    if (list.size() >= limits_.per_kind) {
      truncated_ = true;
      return;
    }
    list.push_back(std::move(item));
  }

  CatalogLimits limits_;
  int64_t budget_ = limits_.entries;
  bool truncated_ = false;
  std::vector<json> folders_, idx_, npy_, models_;
};

}  // namespace

json Catalog(const User& user, const CatalogLimits& limits) {
  Walk walk(limits);
  for (const std::string& f : user.allow) {
    std::error_code ec;
    const fs::path real = fs::canonical(f, ec);  // a folder gone since it was allowed lists nothing
    if (!ec) walk.Folder(real.string());
  }
  return walk.Answer();
}

json CatalogLayers(const User& user, const std::string& onnx) {
  if (onnx.empty() || onnx[0] != '/')
    throw ApiError(400, "bad_request", "?onnx: expected the absolute path of an ONNX model in your folders");
  // Whether a path outside the folders exists is not the caller's to learn: 404 only for a
  // missing file in a folder of theirs.
  const std::string real = InsideFolders(onnx, user.allow);
  if (real.empty() && !PathExists(onnx) && !InsideFolders(fs::path(onnx).parent_path().string(), user.allow).empty())
    throw ApiError(404, "not_found", onnx + ": no such file");
  if (real.empty()) throw ApiError(403, "outside_your_folders", onnx + " is not a file in your folders");
  kernels::ModelLayers m;
  try {
    m = kernels::ListCutLayers(ReadInputFile(real, "an ONNX model", kMaxLayersModelBytes), onnx);
  } catch (const Error& e) {
    throw ApiError(422, "invalid_model", e.what());
  }
  auto dim = [&](size_t k) {
    return m.input_dims.size() == 4 && m.input_dims[k] > 0 ? json(m.input_dims[k]) : json(nullptr);
  };
  json layers = json::array();
  for (const auto& l : m.layers) layers.push_back({{"name", l.name}, {"node", l.node}, {"op", l.op}});
  return {{"onnx", onnx},
          {"input", {{"channels", dim(1)}, {"height", dim(2)}, {"width", dim(3)}}},
          {"layers", layers},
          {"suggested", m.suggested}};
}

}  // namespace msaflow::service
