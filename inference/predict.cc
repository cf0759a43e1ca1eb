#include "inference/predict.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "kernels/half.h"
#include "kernels/image_folder.h"
#include "kernels/npy.h"
#include "kernels/onnx_export.h"
#include "kernels/prepare.h"

namespace msaflow::inference {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool IsImageFile(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

void AddSet(const kernels::ImageSet& s, const std::string& path, Images* out) {
  const int64_t px = s.rows * s.cols * s.channels;
  for (int64_t i = 0; i < s.count; ++i) {
    kernels::DecodedImage d;
    d.rows = s.rows;
    d.cols = s.cols;
    d.channels = s.channels;
    d.pixels.assign(s.pixels.begin() + i * px, s.pixels.begin() + (i + 1) * px);
    out->images.push_back(std::move(d));
    out->names.push_back(path + ", image " + std::to_string(i));
    out->labels.push_back(i < static_cast<int64_t>(s.labels.size()) ? s.labels[static_cast<size_t>(i)] : -1);
  }
}

void AddFile(const std::string& path, int label, Images* out) {
  out->images.push_back(kernels::DecodeImage(ReadInputFile(path, "a PNG or JPEG file", uint64_t{1} << 30), path));
  out->names.push_back(path);
  out->labels.push_back(label);
}

// The head's weights by the names the export gives them.
const onnx::TensorProto* Initializer(const onnx::GraphProto& g, const std::string& name) {
  for (const auto& t : g.initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

std::vector<float> FloatsOf(const onnx::TensorProto* t, size_t n, const std::string& where) {
  if (!t || t->data_type() != onnx::TensorProto::FLOAT || t->raw_data().size() != n * sizeof(float))
    Throw(ErrorKind::kInvalidInput, where + ": expected " + std::to_string(n) + " float32 values");
  std::vector<float> v(n);
  std::memcpy(v.data(), t->raw_data().data(), n * sizeof(float));
  return v;
}

// The head's weights, by the names the export gives them (kernels/onnx_export.cc).
void ReadHead(const onnx::GraphProto& g, const std::string& path, int64_t classes, kernels::Head* out) {
  const auto* mean = Initializer(g, "msaflow/head/mean");
  if (!mean || mean->dims_size() != 3) Throw(ErrorKind::kInvalidInput, path + ": no msaflow/head/mean initializer of [C, 1, 1]");
  const int64_t in = mean->dims(0);
  kernels::Head& h = *out;
  h.in_dim = in;
  h.classes = classes;
  h.mean = FloatsOf(mean, static_cast<size_t>(in), path + ": msaflow/head/mean");
  h.inv_std = FloatsOf(Initializer(g, "msaflow/head/inv_std"), static_cast<size_t>(in), path + ": msaflow/head/inv_std");
  const auto layout = kernels::ParamLayout(h.config, in, classes);
  const std::vector<std::string> blocks = h.config.type == "mlp"
                                              ? std::vector<std::string>{"w1t", "b1", "w2t", "b2"}
                                              : std::vector<std::string>{"wt", "b"};
  if (layout.size() != blocks.size()) Throw(ErrorKind::kInvalidInput, path + ": the head's layout is not one msaflow knows");
  h.params.resize(layout.back().offset + layout.back().size);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string name = "msaflow/head/" + blocks[i];
    auto v = FloatsOf(Initializer(g, name), layout[i].size, path + ": " + name);
    if (blocks[i] == "w2t") {  // stored [classes, hidden] for Gemm's transB; the head holds [hidden, classes]
      const int64_t hid = h.config.hidden;
      std::vector<float> w(v.size());
      for (int64_t r = 0; r < hid; ++r)
        for (int64_t k = 0; k < classes; ++k) w[static_cast<size_t>(r * classes + k)] = v[static_cast<size_t>(k * hid + r)];
      v.swap(w);
    }
    std::copy(v.begin(), v.end(), h.params.begin() + static_cast<std::ptrdiff_t>(layout[i].offset));
  }
}

// The backbone alone, as ONNX bytes ImportOnnx takes: the export's own nodes (preprocessing,
// pooling, head) taken out, and the tensor the backbone reads made the input again.
std::string BackboneOnly(const onnx::ModelProto& m, const std::string& path, const kernels::InputSpec& input) {
  onnx::ModelProto cut = m;
  auto* cg = cut.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  bool prepared = false;
  // The export wrote each Clip(x, lo, hi) of the backbone as HardSigmoid "<tag>/unit", a Mul
  // by "<tag>/range" and, where lo != 0, an Add of "<tag>/lo" (kernels/onnx_export.cc): put
  // the Clip back, so that this executor computes what the run's did, bit for bit.
  std::map<std::string, std::string> clip_input;  // "<tag>/unit" -> x
  auto scalar = [&](const std::string& name) {
    const auto* t = Initializer(*cg, name);
    return t ? FloatsOf(t, 1, path + ": " + name)[0] : 0.f;
  };
  auto clip = [&](const std::string& x, const std::string& tag, float lo, float hi, const std::string& y) {
    onnx::NodeProto c;
    c.set_op_type("Clip");
    c.set_name(tag + "/clip");
    c.add_input(x);
    for (const auto& [suffix, v] : {std::pair<std::string, float>{"/clip_lo", lo}, {"/clip_hi", hi}}) {
      onnx::TensorProto* t = cg->add_initializer();
      t->set_name(tag + suffix);
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->set_raw_data(std::string(reinterpret_cast<const char*>(&v), sizeof v));
      c.add_input(tag + suffix);
    }
    c.add_output(y);
    return c;
  };
  const auto nodes = cg->node();  // a copy: clip() adds initializers to the graph
  for (const auto& n : nodes) {
    if (n.name().rfind("msaflow/", 0) == 0) continue;
    const std::string& nm = n.name();
    if (n.op_type() == "HardSigmoid" && nm.rfind("msaflow.backbone/", 0) == 0 && nm.size() > 5 &&
        nm.compare(nm.size() - 5, 5, "/unit") == 0) {
      clip_input[n.output(0)] = n.input(0);
      continue;
    }
    if (n.op_type() == "Mul" && n.input_size() == 2 && clip_input.count(n.input(0))) {
      const std::string tag = n.input(0).substr(0, n.input(0).size() - 5);
      const float range = scalar(tag + "/range");
      if (Initializer(*cg, tag + "/lo")) {  // the Add follows
        clip_input[n.output(0)] = clip_input[n.input(0)];
        continue;
      }
      *kept.Add() = clip(clip_input[n.input(0)], tag, 0.f, range, n.output(0));
      continue;
    }
    if (n.op_type() == "Add" && n.input_size() == 2 && clip_input.count(n.input(0))) {
      const std::string tag = n.input(1).substr(0, n.input(1).size() - 3);
      const float lo = scalar(tag + "/lo");
      *kept.Add() = clip(clip_input[n.input(0)], tag, lo, lo + scalar(tag + "/range"), n.output(0));
      continue;
    }
    for (const auto& i : n.input()) prepared |= i == "msaflow/prepared";
    *kept.Add() = n;
  }
  cg->mutable_node()->Swap(&kept);
  cg->clear_input();
  auto* vi = cg->add_input();
  vi->set_name(prepared ? "msaflow/prepared" : kernels::kExportInput);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {int64_t{-1}, input.channels, input.height, input.width}) {
    auto* dim = tt->mutable_shape()->add_dim();
    if (d < 0) {
      dim->set_dim_param("N");
    } else {
      dim->set_dim_value(d);
    }
  }
  std::string cut_bytes;
  cut.SerializeToString(&cut_bytes);
  return cut_bytes;
}

}  // namespace

Images ReadImages(const std::vector<std::string>& paths, const std::string& labels, int64_t limit) {
  Images out;
  if (paths.empty()) Throw(ErrorKind::kInvalidInput, "predict: no images given; expected image files, folders, or an IDX/.npy file");
  if (!labels.empty() && paths.size() != 1)
    Throw(ErrorKind::kInvalidInput, "--labels: labels one IDX or .npy file; " + std::to_string(paths.size()) + " inputs given");
  for (const std::string& p : paths) {
    if (!fs::exists(p)) Throw(ErrorKind::kNotFound, p + ": no such file or folder");
    const std::string name = fs::path(p).filename().string();
    auto ends = [&](const char* suffix) {
      const std::string s(suffix);
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (fs::is_directory(p)) {
      bool classes = false;
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_directory() && e.path().filename().string()[0] != '.') classes = true;
      if (classes) {
        const kernels::FolderListing l = kernels::ListImageFolder(p, limit);
        out.class_names = l.class_names;
        for (size_t i = 0; i < l.files.size(); ++i) AddFile(l.files[i], l.labels[i], &out);
      } else {
        std::vector<std::string> files;
        for (const auto& e : fs::directory_iterator(p))
          if (e.is_regular_file() && IsImageFile(e.path()) && e.path().filename().string()[0] != '.')
            files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
        if (files.empty()) Throw(ErrorKind::kInvalidInput, p + ": a folder with no PNG or JPEG file and no class folders");
        for (const auto& f : files) AddFile(f, -1, &out);
      }
    } else if (ends(".npy") || ends("ubyte") || ends("ubyte.gz") || ends(".idx") || ends(".idx.gz")) {
      AddSet(ends(".npy") ? kernels::ReadNpy(p, labels, limit) : kernels::ReadIdx(p, labels, limit), p, &out);
    } else {
      AddFile(p, -1, &out);
    }
    if (limit > 0 && static_cast<int64_t>(out.images.size()) >= limit) break;
  }
  if (limit > 0 && static_cast<int64_t>(out.images.size()) > limit) {
    out.images.resize(static_cast<size_t>(limit));
    out.names.resize(static_cast<size_t>(limit));
    out.labels.resize(static_cast<size_t>(limit));
  }
  return out;
}

Classifier::Classifier(const TrainedModel& m) {
  kind_ = m.backbone.kind;
  input_ = m.backbone.input;
  half_ = m.backbone.feature_dtype == "f16";
  head_ = m.head;
  class_names_ = m.class_names;
  pixels_dim_ = m.image_rows * m.image_cols * m.image_channels;
  if (kind_ != workflow::BackboneKind::kPixels) {
    graph_ = kernels::ImportOnnx(m.backbone_onnx, "backbone '" + m.backbone.name + "'", m.backbone.feature_layer);
    // In the run's own arithmetic (and an int8 backbone with the run's ranges): the run's test
    // images then classify as the run evaluated them. A CPU that cannot computes in f32, and
    // says so (note()).
    kernels::Precision precision = m.backbone.precision;
    std::string why;
    if (!kernels::PrecisionAvailable(precision, &why)) {
      note_ = fmt::format(
          "backbone '{}' computed in f32, not {} as the run computed it: {}; its features, and so "
          "perhaps a prediction, differ slightly from the run's",
          m.backbone.name, kernels::PrecisionName(m.backbone.precision), why);
      precision = kernels::Precision::kF32;
    }
    executor_ = std::make_unique<kernels::Executor>(graph_, precision);
    if (precision == kernels::Precision::kInt8) executor_->SetRanges(m.int8_ranges);
  }
  CheckResizedPixels("model " + m.model_object);
}

// Resized raw pixels are the head's input as prepared: the sizes must agree.
void Classifier::CheckResizedPixels(const std::string& where) const {
  if (kind_ == workflow::BackboneKind::kPixels && !raw_pixels() && PreparedSize() != head_.in_dim)
    Throw(ErrorKind::kInvalidInput,
          fmt::format("{}: raw pixels resized to {} x {} x {} are {} features, but the head takes {}", where,
                      input_.channels, input_.height, input_.width, PreparedSize(), head_.in_dim));
}

std::unique_ptr<Classifier> Classifier::FromOnnx(const std::string& path) {
  const std::string bytes = ReadInputFile(path, "an ONNX model", kernels::kMaxOnnxBytes);
  onnx::ModelProto m;
  if (bytes.empty() || !m.ParseFromString(bytes) || !m.has_graph())
    Throw(ErrorKind::kInvalidInput, path + ": not an ONNX model");
  std::map<std::string, std::string> meta;
  for (const auto& p : m.metadata_props()) meta[p.key()] = p.value();
  if (meta["msaflow.format"] != "msaflow.classifier/1")
    Throw(ErrorKind::kInvalidInput, path + ": not a model `msaflow export` wrote (no msaflow.format "
                                           "\"msaflow.classifier/1\" in its metadata_props)");
  auto c = std::unique_ptr<Classifier>(new Classifier());
  const json bb = json::parse(meta["msaflow.backbone"], nullptr, false);
  const json input = json::parse(meta["msaflow.input"], nullptr, false);
  const json names = json::parse(meta["msaflow.classes"], nullptr, false);
  const json head = json::parse(meta["msaflow.head"], nullptr, false);
  if (!bb.is_object() || !input.is_object() || !names.is_array() || !head.is_object())
    Throw(ErrorKind::kInvalidInput, path + ": its msaflow metadata_props are damaged");
  try {
    const auto kind = workflow::BackboneKindFromName(bb.at("kind").get<std::string>());
    if (!kind) Throw(ErrorKind::kInvalidInput, path + ": msaflow.backbone's kind is not onnx or pixels");
    c->kind_ = *kind;
    c->half_ = bb.value("feature_dtype", "f32") == "f16";
    c->class_names_ = names.get<std::vector<std::string>>();
    const json& img = input.at("image");
    c->pixels_dim_ = img.at("rows").get<int64_t>() * img.at("cols").get<int64_t>() * img.at("channels").get<int64_t>();
    if (c->kind_ != workflow::BackboneKind::kPixels ||
        input.at("model").contains("height")) {  // resized raw pixels too
      const json& mi = input.at("model");
      c->input_.channels = mi.at("channels");
      c->input_.height = mi.at("height");
      c->input_.width = mi.at("width");
      for (size_t i = 0; i < 3; ++i) {
        c->input_.mean[i] = mi.at("mean").at(i);
        c->input_.std[i] = mi.at("std").at(i);
      }
    }
    c->head_.config = workflow::CandidateFromJson({{"id", "x"}, {"backbone", "x"}, {"head", head}}).head;
  } catch (const json::exception& e) {
    Throw(ErrorKind::kInvalidInput, path + ": its msaflow metadata_props are damaged (" + e.what() + ")");
  }
  ReadHead(m.graph(), path, static_cast<int64_t>(c->class_names_.size()), &c->head_);
  const json precision = bb.value("precision", json("f32"));  // bb is an object: its kind was read above
  const std::optional<kernels::Precision> run_precision =
      precision.is_string() ? kernels::PrecisionFromName(precision.get<std::string>()) : std::nullopt;
  if (!run_precision) Throw(ErrorKind::kInvalidInput, path + ": msaflow.backbone's precision is not f32, bf16 or int8");
  if (*run_precision != kernels::Precision::kF32)
    c->note_ = fmt::format(
        "{}: the exported model computes in float32, as every ONNX runtime does; the run computed "
        "its backbone in {} (predict on the run directory computes as the run did)",
        path, kernels::PrecisionName(*run_precision));
  c->CheckResizedPixels(path);
  if (c->kind_ != workflow::BackboneKind::kPixels) {
    c->graph_ = kernels::ImportOnnx(BackboneOnly(m, path, c->input_), path, bb.value("feature_layer", ""));
    c->executor_ = std::make_unique<kernels::Executor>(c->graph_, kernels::Precision::kF32);
  }
  return c;
}

int64_t Classifier::PreparedSize() const {
  return raw_pixels() ? head_.in_dim : input_.channels * input_.height * input_.width;
}

std::vector<float> Classifier::Prepare(const std::vector<kernels::DecodedImage>& images) const {
  const int64_t n = static_cast<int64_t>(images.size()), per = PreparedSize();
  std::vector<float> out(static_cast<size_t>(n * per));
  for (int64_t i = 0; i < n; ++i) {
    const auto& im = images[static_cast<size_t>(i)];
    float* o = out.data() + i * per;
    if (raw_pixels()) {
      if (static_cast<int64_t>(im.pixels.size()) != per)
        Throw(ErrorKind::kInvalidInput,
              "image " + std::to_string(i) + ": " + std::to_string(im.rows) + " x " + std::to_string(im.cols) + " x " +
                  std::to_string(im.channels) + " pixels; this model (raw pixels) takes images of " +
                  std::to_string(per) + " values, the size it was trained on");
      for (int64_t j = 0; j < per; ++j) o[j] = static_cast<float>(im.pixels[static_cast<size_t>(j)]) / 255.f;
    } else {
      kernels::PrepareBatch(kernels::ImageBatch{im.pixels.data(), 1, im.rows, im.cols, im.channels}, input_, o);
    }
  }
  return out;
}

std::vector<float> Classifier::Classify(const std::vector<kernels::DecodedImage>& images) {
  const std::vector<float> x = Prepare(images);
  return ClassifyPrepared(x.data(), static_cast<int64_t>(images.size()));
}

std::vector<float> Classifier::ClassifyPrepared(const float* x, int64_t n) {
  const int64_t dim = head_.in_dim, k = head_.classes;
  std::vector<float> features(static_cast<size_t>(n * dim));
  if (kind_ == workflow::BackboneKind::kPixels) {
    std::copy(x, x + n * dim, features.begin());
  } else {
    const int64_t per = PreparedSize();
    const int64_t fixed = input_.batch;  // a model of fixed batch gets whole batches
    const int64_t step = fixed > 0 ? fixed : batch_;
    std::vector<float> padded;
    for (int64_t s = 0, took = 0; s < n; s += took) {
      const int64_t b = std::min(step, n - s);
      // The batch the executor runs: the model's fixed one; else, when serving, the largest power
      // of two that fits (the executor keeps a compiled plan per batch size: 7 sizes, not 64;
      // 40 images run as 32 and 8, none padded).
      int64_t run = b;
      if (fixed > 0) {
        run = fixed;
      } else if (pow2_batches_) {
        run = 1;
        while (run * 2 <= b) run *= 2;
      }
      const int64_t take = std::min(run, b);
      took = take;
      const float* batch = x + s * per;
      if (run > take) {
        padded.assign(static_cast<size_t>(run * per), 0.f);
        std::copy(batch, batch + take * per, padded.begin());
        batch = padded.data();
      }
      auto f = executor_->Features(batch, run, input_.channels, input_.height, input_.width);
      if (static_cast<int64_t>(f.size()) < take * dim)
        Throw(ErrorKind::kInvalidInput, "the backbone gives " + std::to_string(f.size() / static_cast<size_t>(run)) +
                                            " features an image; the head takes " + std::to_string(dim));
      std::copy(f.begin(), f.begin() + take * dim, features.begin() + s * dim);
    }
  }
  if (half_) {  // as the NAM stored them
    std::vector<uint16_t> h(features.size());
    kernels::FloatToHalf(features.data(), h.data(), h.size());
    kernels::HalfToFloat(h.data(), features.data(), h.size());
  }
  std::vector<float> p = head_.Logits(features.data(), n);
  for (int64_t i = 0; i < n; ++i) {  // softmax, in double
    float* row = p.data() + i * k;
    const float top = *std::max_element(row, row + k);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[j]) - top);
    for (int64_t j = 0; j < k; ++j) row[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - top) / sum);
  }
  return p;
}

}  // namespace msaflow::inference
