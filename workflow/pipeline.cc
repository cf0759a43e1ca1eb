#include "workflow/pipeline.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <utility>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "kernels/fpga/device.h"

namespace msaflow::workflow {
namespace {

using nlohmann::json;

// A value as it stands in the file, cut short so that no error line grows with the input.
std::string Quote(const json& v) {
  std::string d = v.dump();
  constexpr size_t kMax = 60;
  return d.size() <= kMax ? d : d.substr(0, kMax) + "… (" + std::to_string(d.size()) + " characters)";
}

// Tracks where the parser is, as a JSON pointer, to refuse a key that appears twice in one
// object (nlohmann::json would keep the last silently).
class DuplicateKeys {
 public:
  bool operator()(int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: frames_.push_back({true, {}, "", 0}); break;
      case json::parse_event_t::array_start: frames_.push_back({false, {}, "", 0}); break;
      case json::parse_event_t::key: {
        Frame& f = frames_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) {
          duplicate_ = Pointer();
          return false;
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
        break;
      case json::parse_event_t::value:
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
        break;
    }
    return true;
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;
    size_t index;
  };
  std::string Pointer() const {
    std::string p;
    for (const auto& f : frames_) p += "/" + (f.object ? f.key : std::to_string(f.index));
    return p;
  }
  std::vector<Frame> frames_;
  std::string duplicate_;
};

std::string TypeName(const json& v) {
  if (v.is_string()) return "string " + Quote(v);
  if (v.is_boolean()) return "boolean " + Quote(v);
  if (v.is_number()) return "number " + Quote(v);
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

// Walks the document with JSON pointers; every failure throws "<origin>: <pointer>: ...".
class Reader {
 public:
  Reader(std::string origin, std::string base) : origin_(std::move(origin)), base_(std::move(base)) {}

  [[noreturn]] void Fail(const std::string& ptr, const std::string& msg) const {
    Throw(ErrorKind::kInvalidInput, origin_ + ": " + (ptr.empty() ? "/" : ptr) + ": " + msg);
  }

  const json& Object(const json& v, const std::string& ptr, const std::vector<std::string>& keys,
                     const std::vector<std::string>& required) const {
    if (!v.is_object()) Fail(ptr, "expected an object, got " + TypeName(v));
    for (const auto& [k, _] : v.items()) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end())
        Fail(ptr + "/" + k, "unknown key" + Hint(k, keys, " (expected one of " + Join(keys, ", ") + ")"));
    }
    for (const auto& r : required)
      if (!v.contains(r)) Fail(ptr, "missing required key \"" + r + "\"");
    return v;
  }

  std::string String(const json& v, const std::string& ptr) const {
    if (!v.is_string()) Fail(ptr, "expected a string, got " + TypeName(v));
    if (v.get<std::string>().empty()) Fail(ptr, "expected a non-empty string");
    return v.get<std::string>();
  }

  std::string Enum(const json& v, const std::string& ptr, const std::vector<std::string>& allowed) const {
    std::string s = String(v, ptr);
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      Fail(ptr, Quote(v) + " is not one of " + Join(allowed, ", ") + Hint(s, allowed, ""));
    return s;
  }

  int64_t Int(const json& v, const std::string& ptr, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer())
      Fail(ptr, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + TypeName(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      Fail(ptr, Quote(v) + " is out of range; expected " + std::to_string(lo) + ".." + std::to_string(hi));
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      Fail(ptr, std::to_string(x) + " is out of range; expected " + std::to_string(lo) + ".." + std::to_string(hi));
    return x;
  }

  bool Bool(const json& v, const std::string& ptr) const {
    if (!v.is_boolean()) Fail(ptr, "expected true or false, got " + TypeName(v));
    return v.get<bool>();
  }

  double Number(const json& v, const std::string& ptr, double lo, double hi) const {
    if (!v.is_number()) Fail(ptr, "expected a number, got " + TypeName(v));
    double x = v.get<double>();
    if (!(x >= lo && x <= hi)) Fail(ptr, Quote(v) + " is out of range; expected " + Num(lo) + ".." + Num(hi));
    return x;
  }

  // A value or a non-empty array of values (a search-space dimension).
  template <typename F>
  auto List(const json& v, const std::string& ptr, F one) const {
    using T = decltype(one(v, ptr));
    std::vector<T> out;
    if (v.is_array()) {
      if (v.empty()) Fail(ptr, "expected a non-empty array");
      for (size_t i = 0; i < v.size(); ++i) out.push_back(one(v[i], ptr + "/" + std::to_string(i)));
    } else {
      out.push_back(one(v, ptr));
    }
    return out;
  }

  std::string Path(const json& v, const std::string& ptr) const {
    std::string p = String(v, ptr);
    std::filesystem::path fp(p);
    if (fp.is_relative()) fp = std::filesystem::path(base_) / fp;
    return fp.lexically_normal().string();
  }

 private:
  static std::string Num(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d);
    return buf;
  }
  static std::string Hint(const std::string& got, const std::vector<std::string>& allowed, const std::string& otherwise) {
    std::string h = DidYouMean(got, allowed);
    return h.empty() ? otherwise : h;
  }
  std::string origin_, base_;
};

// A split's file or folder; `subset` (a stratified part) is allowed on the training split only.
SplitSpec ReadSplit(const Reader& r, const json& v, const std::string& ptr, bool subset_allowed = false) {
  SplitSpec s;
  if (v.is_object() && v.contains("format")) s.format = r.Enum(v["format"], ptr + "/format", {"idx", "npy", "folder"});
  if (v.is_object() && v.contains("subset") && !subset_allowed)
    r.Fail(ptr + "/subset", "only the training split (/datasets/train) can be a subset");
  if (s.format == "folder") {
    r.Object(v, ptr, {"format", "root", "limit", "subset"}, {"root"});
    s.root = r.Path(v["root"], ptr + "/root");
  } else {
    r.Object(v, ptr, {"format", "images", "labels", "limit", "subset"}, {"images", "labels"});
    s.images = r.Path(v["images"], ptr + "/images");
    s.labels = r.Path(v["labels"], ptr + "/labels");
  }
  if (v.contains("limit")) s.limit = r.Int(v["limit"], ptr + "/limit", 1, 100000000);
  if (v.contains("subset")) {
    const json& sub = v["subset"];
    const std::string sp = ptr + "/subset";
    r.Object(sub, sp, {"fraction", "seed"}, {"fraction"});
    s.subset_fraction = r.Number(sub["fraction"], sp + "/fraction", 0.001, 1);
    if (sub.contains("seed")) s.subset_seed = static_cast<uint64_t>(r.Int(sub["seed"], sp + "/seed", 0, INT64_MAX));
  }
  return s;
}

// datasets.validation: a split of its own, or {"from": "train", "fraction", "seed"}.
SplitSpec ReadValidation(const Reader& r, const json& v, const std::string& ptr) {
  if (!v.is_object() || !v.contains("from")) return ReadSplit(r, v, ptr);
  r.Object(v, ptr, {"from", "fraction", "seed"}, {"from", "fraction"});
  r.Enum(v["from"], ptr + "/from", {"train"});
  SplitSpec s;
  s.fraction = r.Number(v["fraction"], ptr + "/fraction", 0.001, 0.9);
  if (v.contains("seed")) s.seed = static_cast<uint64_t>(r.Int(v["seed"], ptr + "/seed", 0, INT64_MAX));
  return s;
}

BackboneSpec ReadBackbone(const Reader& r, const json& v, const std::string& ptr) {
  BackboneSpec b;
  r.Object(v, ptr, {"name", "kind", "onnx", "feature_layer", "input", "precision", "feature_dtype", "train_from"},
           {"name"});
  b.name = r.String(v["name"], ptr + "/name");
  for (char c : b.name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
      r.Fail(ptr + "/name", Quote(v["name"]) + " must use only [a-z0-9._-] (it names NAM objects)");
  // A NAM object name's segment: not empty, "." or "..", and short enough for the names built on it.
  if (b.name.empty() || b.name == "." || b.name == "..")
    r.Fail(ptr + "/name", Quote(v["name"]) + " cannot name NAM objects; expected a name such as \"mobilenetv2\"");
  if (b.name.size() > 64)
    r.Fail(ptr + "/name", Quote(v["name"]) + " is " + std::to_string(b.name.size()) + " characters long; at most 64");
  if (v.contains("kind")) b.kind = *BackboneKindFromName(r.Enum(v["kind"], ptr + "/kind", {"onnx", "pixels"}));
  if (v.contains("feature_dtype")) b.feature_dtype = r.Enum(v["feature_dtype"], ptr + "/feature_dtype", {"f32", "f16"});
  if (b.kind == BackboneKind::kPixels) {
    for (const char* k : {"onnx", "feature_layer", "precision", "train_from"})
      if (v.contains(k)) r.Fail(ptr + "/" + k, "not allowed for kind \"pixels\" (raw pixels are the features)");
    if (v.contains("input")) {  // every image resized to this size first (folders of mixed sizes)
      const json& in = v["input"];
      const std::string ip = ptr + "/input";
      r.Object(in, ip, {"height", "width", "channels"}, {"height", "width"});
      b.input.height = r.Int(in["height"], ip + "/height", 1, 1024);
      b.input.width = r.Int(in["width"], ip + "/width", 1, 1024);
      if (in.contains("channels")) b.input.channels = r.Int(in["channels"], ip + "/channels", 1, 3);
      const int64_t dim = b.input.height * b.input.width * b.input.channels;
      if (dim > kMaxPixelFeatures)
        r.Fail(ip, std::to_string(b.input.height) + " x " + std::to_string(b.input.width) + " x " +
                       std::to_string(b.input.channels) + " = " + std::to_string(dim) +
                       " features per image; raw pixels may have at most " + std::to_string(kMaxPixelFeatures));
    }
    return b;
  }
  for (const char* k : {"onnx", "feature_layer", "input"})
    if (!v.contains(k)) r.Fail(ptr, std::string("missing required key \"") + k + "\"");
  b.onnx = r.Path(v["onnx"], ptr + "/onnx");
  // A list of layers is read by ReadBackbones (one backbone per layer); here its first.
  if (v["feature_layer"].is_array() && (v["feature_layer"].empty() || v["feature_layer"].size() > 16))
    r.Fail(ptr + "/feature_layer", "expected a layer name or a list of 1 to 16 of them");
  b.feature_layer = v["feature_layer"].is_array()
                        ? r.String(v["feature_layer"][0], ptr + "/feature_layer/0")
                        : r.String(v["feature_layer"], ptr + "/feature_layer");
  if (v.contains("precision"))
    b.precision = kernels::ParsePrecision(r.Enum(v["precision"], ptr + "/precision", {"f32", "bf16", "int8"}));
  if (v.contains("train_from")) {
    b.train_from = r.String(v["train_from"], ptr + "/train_from");
    if (b.train_from.empty()) r.Fail(ptr + "/train_from", "expected the name of a layer of the cut model");
    if (b.precision !=
        kernels::Precision::kF32)  // the tail trains in f32 on maps the trunk computed: one arithmetic for both
      r.Fail(ptr + "/train_from", "fine-tuning needs \"precision\": \"f32\" (the backbone is \"" +
                                      std::string(kernels::PrecisionName(b.precision)) +
                                      "\"; the trained layers compute in f32)");
  }
  const json& in = v["input"];
  std::string ip = ptr + "/input";
  r.Object(in, ip, {"height", "width", "channels", "mean", "std", "batch"}, {"height", "width"});
  if (in.contains("batch")) b.input.batch = r.Int(in["batch"], ip + "/batch", 1, 1024);
  b.input.height = r.Int(in["height"], ip + "/height", 8, 1024);
  b.input.width = r.Int(in["width"], ip + "/width", 8, 1024);
  if (in.contains("channels")) b.input.channels = r.Int(in["channels"], ip + "/channels", 1, 3);
  for (const char* k : {"mean", "std"}) {
    if (!in.contains(k)) continue;
    std::string kp = ip + "/" + k;
    if (!in[k].is_array() || in[k].size() != static_cast<size_t>(b.input.channels))
      r.Fail(kp, "expected an array of " + std::to_string(b.input.channels) + " numbers (one per channel)");
    for (size_t c = 0; c < in[k].size(); ++c) {
      double x = r.Number(in[k][c], kp + "/" + std::to_string(c), std::string(k) == "std" ? 1e-6 : -1e3, 1e3);
      (std::string(k) == "mean" ? b.input.mean : b.input.std)[c] = static_cast<float>(x);
    }
  }
  return b;
}

// The train step's parallel options, checked against its ranks so that `validate` refuses a
// mode the step cannot run and says what would work.
void ReadTrainParallel(const Reader& r, const json& v, const std::string& ptr, StepSpec* s) {
  TrainParallelSpec& t = s->parallel;
  if (v.contains("mode"))
    t.mode = *TrainModeFromName(r.Enum(v["mode"], ptr + "/mode", {"auto", "independent", "sync", "async", "hybrid"}));
  const bool ps = UsesParameterServers(t.mode);
  const std::string mode = TrainModeName(t.mode);
  for (const char* k : {"servers", "max_staleness"})
    if (v.contains(k) && !ps)
      r.Fail(ptr + "/" + k, std::string("only for mode async or hybrid (a parameter server); mode is \"") + mode + "\"");
  if (v.contains("groups") && !HasGroups(t.mode))
    r.Fail(ptr + "/groups", "only for mode hybrid; mode is \"" + mode + "\"");
  if (v.contains("servers")) t.servers = r.Int(v["servers"], ptr + "/servers", 1, 64);
  if (v.contains("max_staleness")) t.max_staleness = r.Int(v["max_staleness"], ptr + "/max_staleness", 0, 1000000);
  if (v.contains("groups")) t.groups = r.Int(v["groups"], ptr + "/groups", 2, 4096);
  if (v.contains("straggler")) {
    const json& st = v["straggler"];
    r.Object(st, ptr + "/straggler", {"rank", "factor"}, {"rank", "factor"});
    t.straggler_rank = r.Int(st["rank"], ptr + "/straggler/rank", 0, s->ranks - 1);
    t.straggler_factor = r.Number(st["factor"], ptr + "/straggler/factor", 1, 1000);
  }
  const int64_t n = s->ranks;
  switch (t.mode) {
    case TrainMode::kAsync:
      if (n < MinRanks(t.mode))
        r.Fail(ptr + "/mode",
               "async needs at least 2 ranks (workers that update the parameter server without "
               "waiting for each other); with 1 rank use \"sync\", or set \"ranks\": 2 or more");
      if (t.servers > n)
        r.Fail(ptr + "/servers", std::to_string(t.servers) + " servers for " + std::to_string(n) +
                                     " workers; use at most as many servers as ranks");
      break;
    case TrainMode::kHybrid:
      if (n < 2 * t.groups || n % t.groups != 0) {
        std::string fits;
        for (int64_t g = 2; g <= n / 2; ++g)
          if (n % g == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(g);
        r.Fail(ptr + "/groups",
               std::to_string(t.groups) + " groups do not divide " + std::to_string(n) +
                   " ranks into groups of at least 2; " +
                   (fits.empty() ? "hybrid needs at least 4 ranks (2 groups of 2)"
                                 : "groups that would work with " + std::to_string(n) + " ranks: " + fits));
      }
      break;
    case TrainMode::kAuto:
    case TrainMode::kIndependent:
    case TrainMode::kSync:
      break;  // any number of ranks
  }
}

// Fine-tuning's limits, where a backbone has "train_from": the tail trains with minibatch
// gradients (in every train mode).
void CheckFinetuning(const Reader& r, const json& doc, const Pipeline& p) {
  const auto bb =
      std::find_if(p.backbones.begin(), p.backbones.end(), [](const BackboneSpec& b) { return b.finetunes(); });
  if (bb == p.backbones.end()) {
    if (doc.contains("rounds") && doc["rounds"].contains("finetune_from_round"))
      r.Fail("/rounds/finetune_from_round", "no backbone has \"train_from\": there is nothing to fine-tune");
    return;
  }
  const std::string where = bb->pointer + "/train_from";
  if (std::find(p.head.optimizers.begin(), p.head.optimizers.end(), "lbfgs") != p.head.optimizers.end())
    r.Fail("/head/optimizer", "\"lbfgs\" is full-batch and a fine-tuned backbone (" + where +
                                  ") trains on minibatches: use \"adam\" or \"sgd\"");
}

// The document as JSON, refusing a syntax error and a key given twice.
json ParseDocument(const std::string& text, const std::string& origin) {
  json doc;
  DuplicateKeys dups;
  try {
    doc = json::parse(text, std::ref(dups));
  } catch (const json::exception& e) {  // a syntax error, or a number too large for a double
    std::string msg = e.what();
    auto pos = msg.find("] ");
    msg = pos == std::string::npos ? msg : msg.substr(pos + 2);
    if (msg.size() > 200) msg = msg.substr(0, 200) + "…";
    Throw(ErrorKind::kInvalidInput, origin + ": not valid JSON (" + msg + ")");
  }
  if (!dups.duplicate().empty())
    Throw(ErrorKind::kInvalidInput, origin + ": " + dups.duplicate() + ": duplicate key (each key may appear once)");
  return doc;
}

// format, name, machine, nam.
void ReadHeader(const Reader& r, const json& doc, const std::string& base_dir, Pipeline& p) {
  if (doc.contains("format") && r.String(doc["format"], "/format") != kPipelineFormat)
    r.Fail("/format", Quote(doc["format"]) + " is not a supported format; expected \"" + kPipelineFormat + "\"");
  p.name = r.String(doc["name"], "/name");
  // It starts every run id: no control character (a NUL, a newline) and no '/'.
  for (char c : p.name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '/')
      r.Fail("/name", Quote(doc["name"]) + " has a control character or '/'; a run's id starts with the name");
  // Run ids start with the name and name NAM objects (at most 255 bytes with what follows).
  if (p.name.size() > 64)
    r.Fail("/name", Quote(doc["name"]) + " is " + std::to_string(p.name.size()) + " characters long; at most 64");
  if (doc.contains("machine")) p.machine = r.String(doc["machine"], "/machine");
  if (doc.contains("nam")) {
    p.nam = r.String(doc["nam"], "/nam");
    if (p.nam.rfind("file://", 0) == 0 && p.nam.size() > 7 && p.nam[7] != '/')
      p.nam = "file://" + (std::filesystem::path(base_dir) / p.nam.substr(7)).lexically_normal().string();
    else if (p.nam.rfind("file://", 0) != 0 && p.nam.rfind("mem://", 0) != 0 && p.nam.rfind("fabric://", 0) != 0)
      r.Fail("/nam", Quote(doc["nam"]) + " is not a NAM URI; expected file://DIR, mem://NAME or fabric://HOST:PORT");
  }
}

// datasets and select_on.
void ReadDatasets(const Reader& r, const json& doc, Pipeline& p) {
  r.Object(doc["datasets"], "/datasets", {"train", "validation", "test", "classes"}, {"train", "test"});
  p.train = ReadSplit(r, doc["datasets"]["train"], "/datasets/train", true);
  p.test = ReadSplit(r, doc["datasets"]["test"], "/datasets/test");
  if (doc["datasets"].contains("validation"))
    p.validation = ReadValidation(r, doc["datasets"]["validation"], "/datasets/validation");
  if (doc["datasets"].contains("classes")) p.classes = r.Int(doc["datasets"]["classes"], "/datasets/classes", 2, 256);
  if (doc.contains("select_on")) p.select_on = r.Enum(doc["select_on"], "/select_on", {"validation", "test"});
  if (p.select_on == "validation" && !p.validation)
    r.Fail("/datasets", "no validation split to select models on; add \"validation\": {\"from\": \"train\", "
                        "\"fraction\": 0.1} (or a split of its own), or say \"select_on\": \"test\" to select on the "
                        "test split (the reported accuracy is then optimistic)");
}

// The name of the backbone a model cut at `layer` becomes: "<name>.<layer>", the layer's
// characters outside [a-z0-9._-] as '-', cut to 64 characters.
std::string LayerBackboneName(const std::string& name, const std::string& layer) {
  std::string tail;
  for (char c : layer) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    tail += (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '.' || l == '_' || l == '-' ? l : '-';
  }
  const size_t first = tail.find_first_not_of("-.");
  tail = first == std::string::npos ? "" : tail.substr(first);
  std::string out = name + "." + tail;
  return out.size() > 64 ? out.substr(0, 64) : out;
}

// A backbone whose "feature_layer" is a list is one backbone per layer (a model zoo's "cut
// where?"), named by LayerBackboneName.
std::vector<BackboneSpec> ExpandLayers(const Reader& r, const json& v, const std::string& ptr, const BackboneSpec& b) {
  if (!v.contains("feature_layer") || !v["feature_layer"].is_array()) return {b};
  const json& layers = v["feature_layer"];  // 1 to 16 of them: ReadBackbone checked
  const std::string lp = ptr + "/feature_layer";
  std::vector<BackboneSpec> out;
  std::set<std::string> seen;
  for (size_t k = 0; k < layers.size(); ++k) {
    BackboneSpec one = b;
    one.feature_layer = r.String(layers[k], lp + "/" + std::to_string(k));
    if (!seen.insert(one.feature_layer).second) r.Fail(lp + "/" + std::to_string(k), Quote(layers[k]) + " is listed twice");
    one.name = LayerBackboneName(b.name, one.feature_layer);
    out.push_back(std::move(one));
  }
  return out;
}

void ReadBackbones(const Reader& r, const json& bbs, Pipeline& p) {
  if (!bbs.is_array() || bbs.empty()) r.Fail("/backbones", "expected a non-empty array of backbones, got " + TypeName(bbs));
  std::set<std::string> names;
  for (size_t i = 0; i < bbs.size(); ++i) {
    std::string ptr = "/backbones/" + std::to_string(i);
    BackboneSpec b = ReadBackbone(r, bbs[i], ptr);
    b.pointer = ptr;
    for (auto& one : ExpandLayers(r, bbs[i], ptr, b)) {
      if (!names.insert(one.name).second)
        r.Fail(ptr + "/name", Quote(json(one.name)) + " is used by an earlier backbone; names must be unique");
      p.backbones.push_back(std::move(one));
    }
  }
}

void ReadHead(const Reader& r, const json& h, HeadSpace& head) {
  r.Object(h, "/head",
           {"type", "hidden", "optimizer", "lr", "l2", "epochs", "batch", "backbone_lr_scale", "finetune_epochs"}, {});
  auto str = [&](const std::vector<std::string>& allowed) {
    return [&r, allowed](const json& v, const std::string& ptr) { return r.Enum(v, ptr, allowed); };
  };
  if (h.contains("type")) head.types = r.List(h["type"], "/head/type", str({"softmax", "mlp"}));
  if (h.contains("optimizer")) head.optimizers = r.List(h["optimizer"], "/head/optimizer", str({"adam", "sgd", "lbfgs"}));
  auto integer = [&](int64_t lo, int64_t hi) {
    return [&r, lo, hi](const json& v, const std::string& ptr) { return r.Int(v, ptr, lo, hi); };
  };
  auto number = [&](double lo, double hi) {
    return [&r, lo, hi](const json& v, const std::string& ptr) { return r.Number(v, ptr, lo, hi); };
  };
  if (h.contains("hidden")) head.hidden = r.List(h["hidden"], "/head/hidden", integer(1, 4096));
  if (h.contains("epochs")) head.epochs = r.List(h["epochs"], "/head/epochs", integer(1, 10000));
  if (h.contains("lr")) head.lr = r.List(h["lr"], "/head/lr", number(1e-8, 10));
  if (h.contains("l2")) head.l2 = r.List(h["l2"], "/head/l2", number(0, 10));
  if (h.contains("batch")) head.batch = r.Int(h["batch"], "/head/batch", 1, 65536);
  if (h.contains("backbone_lr_scale"))
    head.backbone_lr_scale = r.List(h["backbone_lr_scale"], "/head/backbone_lr_scale", number(1e-6, 10));
  if (h.contains("finetune_epochs"))
    head.finetune_epochs = r.List(h["finetune_epochs"], "/head/finetune_epochs", integer(1, 10000));
}

// Every step gets its default module (docs/pipeline.md); "steps" overrides them.
void ReadSteps(const Reader& r, const json& doc, Pipeline& p) {
  for (Step s : kSteps) {
    switch (s) {
      case Step::kLoad: p.steps[s].module = "cm"; break;
      case Step::kEvaluate: p.steps[s].module = "esb", p.steps[s].ranks = 2; break;
      case Step::kPrepare:
      case Step::kTrain:
      case Step::kStore:
      case Step::kSelect: p.steps[s].module = "dam"; break;
    }
  }
  if (doc.contains("steps")) {
    const json& st = doc["steps"];
    std::vector<std::string> names;
    names.reserve(kSteps.size());
    for (Step s : kSteps) names.emplace_back(StepName(s));
    r.Object(st, "/steps", names, {});
    for (const auto& [k, v] : st.items()) {
      const Step step = *StepFromName(k);
      const std::string ptr = "/steps/" + k;
      std::vector<std::string> keys = {"module", "ranks"};
      if (step == Step::kTrain) keys.insert(keys.end(), {"mode", "servers", "groups", "max_staleness", "straggler"});
      if (step == Step::kEvaluate) keys.insert(keys.end(), {"shards", "farm"});
      r.Object(v, ptr, keys, {});
      StepSpec& s = p.steps[step];
      if (v.contains("module")) s.module = r.Enum(v["module"], ptr + "/module", {"cm", "esb", "dam"});
      if (v.contains("ranks")) {
        s.ranks = r.Int(v["ranks"], ptr + "/ranks", 1, 4096);
        s.ranks_given = true;
      }
      if (v.contains("shards")) s.shards = r.Int(v["shards"], ptr + "/shards", 1, 65536);
      if (v.contains("farm")) s.farm = *FarmKindFromName(r.Enum(v["farm"], ptr + "/farm", {"counter", "dispatcher"}));
      if (step == Step::kTrain) ReadTrainParallel(r, v, ptr, &s);
    }
  }
  const TrainMode train_mode = p.steps[Step::kTrain].parallel.mode;
  if (UsesParameterServers(train_mode) &&
      std::find(p.head.optimizers.begin(), p.head.optimizers.end(), "lbfgs") != p.head.optimizers.end())
    r.Fail("/steps/train/mode", std::string("\"") + TrainModeName(train_mode) +
                                    "\" takes minibatch gradients; the \"lbfgs\" optimizer " +
                                    "(/head/optimizer) is full-batch: use mode sync, independent or auto");
}

void ReadRounds(const Reader& r, const json& ro, RoundsSpec& rounds) {
  r.Object(ro, "/rounds",
           {"max", "candidates", "top_k", "strategy", "min_delta", "patience", "seed", "backbone_margin", "eta",
            "rank_fraction", "rank_by", "grow_data", "finetune_from_round"},
           {});
  if (ro.contains("backbone_margin")) rounds.backbone_margin = r.Number(ro["backbone_margin"], "/rounds/backbone_margin", 0, 1);
  if (ro.contains("max")) rounds.max = r.Int(ro["max"], "/rounds/max", 1, 1000);
  if (ro.contains("candidates")) rounds.candidates = r.Int(ro["candidates"], "/rounds/candidates", 1, 10000);
  if (ro.contains("top_k")) rounds.top_k = r.Int(ro["top_k"], "/rounds/top_k", 1, 10000);
  if (ro.contains("strategy"))
    rounds.strategy =
        *StrategyFromName(r.Enum(ro["strategy"], "/rounds/strategy", {"perturb", "restart", "random", "halving"}));
  for (const char* k : {"eta", "rank_fraction", "rank_by", "grow_data"})
    if (ro.contains(k) && rounds.strategy != Strategy::kHalving)
      r.Fail(std::string("/rounds/") + k, std::string("only for \"strategy\": \"halving\" (the strategy is \"") +
                                              StrategyName(rounds.strategy) + "\")");
  if (ro.contains("eta")) rounds.eta = r.Int(ro["eta"], "/rounds/eta", 2, 16);
  if (ro.contains("rank_fraction")) rounds.rank_fraction = r.Number(ro["rank_fraction"], "/rounds/rank_fraction", 0.001, 1);
  if (ro.contains("grow_data")) rounds.grow_data = r.Bool(ro["grow_data"], "/rounds/grow_data");
  if (ro.contains("rank_by")) rounds.rank_by = r.Enum(ro["rank_by"], "/rounds/rank_by", {"knn", "logme"});
  if (ro.contains("min_delta")) rounds.min_delta = r.Number(ro["min_delta"], "/rounds/min_delta", 0, 1);
  if (ro.contains("patience")) rounds.patience = r.Int(ro["patience"], "/rounds/patience", 1, 1000);
  if (ro.contains("seed")) rounds.seed = static_cast<uint64_t>(r.Int(ro["seed"], "/rounds/seed", 0, INT64_MAX));
  if (ro.contains("finetune_from_round")) {
    rounds.finetune_from_round = r.Int(ro["finetune_from_round"], "/rounds/finetune_from_round", 1, 1000);
    if (rounds.finetune_from_round > rounds.max)
      r.Fail("/rounds/finetune_from_round", std::to_string(rounds.finetune_from_round) + " is after the last round (" +
                                                std::to_string(rounds.max) + "): no round would fine-tune");
  }
  if (!ro.contains("top_k")) rounds.top_k = std::min(rounds.top_k, rounds.candidates);
  if (rounds.top_k > rounds.candidates)
    r.Fail("/rounds/top_k", std::to_string(rounds.top_k) + " is more than the " + std::to_string(rounds.candidates) +
                                " candidates of a round; at most that many models can be kept");
}

void ReadRetries(const Reader& r, const json& rt, RetrySpec& retries) {
  r.Object(rt, "/retries", {"max", "on"}, {});
  if (rt.contains("max")) retries.max = r.Int(rt["max"], "/retries/max", 0, 100);
  if (rt.contains("on")) {
    if (!rt["on"].is_array()) r.Fail("/retries/on", "expected an array of failure reasons (Slurm end states, or SIGNALED)");
    retries.on.clear();
    for (size_t i = 0; i < rt["on"].size(); ++i)
      retries.on.push_back(r.Enum(rt["on"][i], "/retries/on/" + std::to_string(i),
                                  {"FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "SIGNALED"}));
  }
}

// The document as submitted with every path made absolute, so tasks and resumed runs need no
// base directory.
json AbsoluteSource(json doc, const Pipeline& p) {
  doc["format"] = kPipelineFormat;
  auto absolute = [&](const char* split, const SplitSpec& s) {
    if (s.from_train()) return;
    if (s.format == "folder") {
      doc["datasets"][split]["root"] = s.root;
    } else {
      doc["datasets"][split]["images"] = s.images;
      doc["datasets"][split]["labels"] = s.labels;
    }
  };
  absolute("train", p.train);
  absolute("test", p.test);
  if (p.validation) absolute("validation", *p.validation);
  // By the entry each backbone came from: a "feature_layer" list makes several of one entry.
  for (const auto& bb : p.backbones)
    if (bb.kind == BackboneKind::kOnnx) doc[json::json_pointer(bb.pointer + "/onnx")] = bb.onnx;
  if (!p.nam.empty()) doc["nam"] = p.nam;
  return doc;
}

}  // namespace

const BackboneSpec& Pipeline::Backbone(const std::string& n) const {
  for (const auto& b : backbones)
    if (b.name == n) return b;
  Throw(ErrorKind::kNotFound, "pipeline " + name + ": no backbone named '" + n + "'");
}

const StepSpec* Pipeline::FindStep(std::string_view n) const {
  const auto kind = StepFromName(n);
  return kind ? FindStep(*kind) : nullptr;
}

StepSpec* Pipeline::FindStep(std::string_view n) {
  return const_cast<StepSpec*>(std::as_const(*this).FindStep(n));
}

Pipeline ParsePipeline(const std::string& text, const std::string& origin, const std::string& base_dir) {
  const json doc = ParseDocument(text, origin);
  Reader r(origin, base_dir);
  r.Object(doc, "", {"format", "name", "machine", "nam", "datasets", "backbones", "head", "steps", "rounds", "metric", "retries", "fpga", "select_on"},
           {"name", "datasets", "backbones"});
  Pipeline p;
  ReadHeader(r, doc, base_dir, p);
  ReadDatasets(r, doc, p);
  ReadBackbones(r, doc["backbones"], p);
  if (doc.contains("head")) ReadHead(r, doc["head"], p.head);
  ReadSteps(r, doc, p);
  if (doc.contains("rounds")) ReadRounds(r, doc["rounds"], p.rounds);
  if (doc.contains("metric")) p.metric = r.Enum(doc["metric"], "/metric", {"accuracy"});
  if (doc.contains("fpga"))
    p.fpga = *kernels::fpga::BackendFromName(r.Enum(doc["fpga"], "/fpga", {"cpu", "opencl", "auto"}));
  if (doc.contains("retries")) ReadRetries(r, doc["retries"], p.retries);
  CheckFinetuning(r, doc, p);
  p.source = AbsoluteSource(doc, p);
  return p;
}

Pipeline LoadPipeline(const std::string& path) {
  std::string text = ReadInputFile(path, "a pipeline file (JSON)", 16 << 20);
  std::string base = std::filesystem::absolute(path).parent_path().string();
  return ParsePipeline(text, path, base);
}

Pipeline PipelineFromSource(const nlohmann::json& source) {
  return ParsePipeline(source.dump(), "<task pipeline>", "/");
}

Pipeline KeepBackbones(const Pipeline& p, const std::set<std::string>& keep) {
  json source = p.source;
  json kept = json::array();
  for (size_t i = 0; i < p.source["backbones"].size(); ++i) {
    json entry = p.source["backbones"][i];
    const std::string ptr = "/backbones/" + std::to_string(i);
    json layers = json::array();  // of a feature_layer list, the layers kept
    bool any = false;
    for (const auto& bb : p.backbones) {
      if (bb.pointer != ptr || !keep.count(bb.name)) continue;
      any = true;
      layers.push_back(bb.feature_layer);
    }
    if (!any) continue;
    if (entry.contains("feature_layer") && entry["feature_layer"].is_array()) entry["feature_layer"] = layers;
    kept.push_back(std::move(entry));
  }
  if (kept.empty()) Throw(ErrorKind::kInternal, "KeepBackbones: pipeline " + p.name + " would keep no backbone");
  source["backbones"] = std::move(kept);
  return PipelineFromSource(source);
}

}  // namespace msaflow::workflow
