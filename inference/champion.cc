#include "inference/champion.h"

#include <fmt/core.h>

#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "kernels/onnx_graph.h"
#include "kernels/tail.h"
#include "modules/int8_calibration.h"
#include "modules/model_object.h"
#include "nam/store.h"
#include "record/run_dir.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/kinds.h"
#include "workflow/objects.h"

namespace msaflow::inference {

using nlohmann::json;

namespace {

// The run's NAM: the runs directory's persisted objects (a local run's NAM server keeps them
// there, and is gone once the run ends), else the URI the run used.
std::unique_ptr<nam::Store> OpenRunNam(const std::string& run_dir, const std::string& uri, const std::string& probe) {
  const std::string persisted = record::PersistedNamPath(std::filesystem::path(run_dir).parent_path().string());
  if (uri.rfind("file://", 0) != 0 && std::filesystem::is_directory(persisted)) {
    auto store = nam::OpenStore("file://" + persisted);
    if (store->Stat(probe)) return store;
  }
  if (uri.empty())
    Throw(ErrorKind::kNotFound, record::ResultsPath(run_dir) + " names no NAM, and " + persisted + " has no " + probe);
  try {
    return nam::OpenStore(uri);
  } catch (const Error& e) {
    Throw(e.kind(), fmt::format("{}: the run's NAM ({}) cannot be reached, and {} does not hold its objects: {}",
                                run_dir, uri, persisted, e.what()));
  }
}

int RoundOf(const std::string& candidate_id) {
  // "r<round>-c<index>"
  if (candidate_id.size() < 4 || candidate_id[0] != 'r') return 0;
  return std::atoi(candidate_id.c_str() + 1);
}

// The backbone the run loaded (checked to be the one the NAM still holds under its name), with a
// fine-tuned model's trained weights in it; an int8 backbone's ranges.
void LoadBackbone(nam::Store& store, const modules::TailWeights& tail, TrainedModel* mp) {
  TrainedModel& m = *mp;
  const nam::Object bb = store.Get(workflow::BackboneObject(m.backbone.name));
  // The NAM keeps one backbone of a name: a later run may have loaded another under it.
  const std::string loaded = bb.info.meta.value("digest", "");
  for (int round = RoundOf(m.candidate.id); round >= 1; --round) {
    auto done = store.Stat(workflow::TaskDoneObject(m.run, round, workflow::Step::kLoad));
    if (!done) continue;
    const json body = json::parse(store.Get(done->name).bytes, nullptr, false);
    const std::string used =
        body.is_object()
            ? body.value("inputs", json::object()).value("backbones", json::object()).value(m.backbone.name, "")
            : "";
    if (!used.empty() && used != loaded)
      Throw(ErrorKind::kCorrupt,
            fmt::format("backbone '{}': the NAM now holds another model under that name (digest {}, the run "
                        "loaded {}); resume or re-run the pipeline to load it again",
                        m.backbone.name, loaded, used));
    break;
  }
  m.backbone_onnx = bb.bytes;
  if (!tail.empty()) {  // fine-tuned: the backbone with its trained layers; its features never stored
    std::map<std::string, std::vector<float>> trained;
    for (size_t i = 0; i < tail.names.size(); ++i) trained[tail.names[i]] = tail.values[i];
    m.backbone_onnx = kernels::ReplaceInitializers(bb.bytes, "NAM " + bb.info.name, trained);
    if (workflow::MapsInHalf(m.backbone, "test")) {  // the tail read maps stored as float16: so does this model
      const kernels::Tail t(kernels::ImportOnnx(bb.bytes, "NAM " + bb.info.name, m.backbone.feature_layer),
                            tail.train_from);
      m.backbone_onnx = kernels::RoundThroughHalfAt(m.backbone_onnx, "NAM " + bb.info.name, t.inputs());
    }
    m.backbone.feature_dtype = "f32";  // its pooled features were never stored
    m.finetuned_from = tail.train_from;
  }
  if (m.backbone.precision == kernels::Precision::kInt8)
    m.int8_ranges =
        modules::RangesFromJson(bb.info.meta.value("int8_ranges", json()), "NAM object '" + bb.info.name + "'");
}

}  // namespace

TrainedModel OpenTrainedModel(const std::string& run_dir_in, const std::string& candidate_id) {
  TrainedModel m;
  m.run_dir = std::filesystem::absolute(run_dir_in).lexically_normal().string();
  if (!m.run_dir.empty() && m.run_dir.back() == '/') m.run_dir.pop_back();
  const std::string results_path = record::ResultsPath(m.run_dir);
  if (!std::filesystem::is_directory(m.run_dir)) Throw(ErrorKind::kNotFound, run_dir_in + ": no such run directory");
  if (!PathExists(results_path))
    Throw(ErrorKind::kNotFound, run_dir_in + ": the run has not finished (no " + std::string(record::kResultsFile) +
                                    "); `msaflow status " + run_dir_in + "` says where it is");
  const json results = record::ReadResults(m.run_dir);
  if (!results.contains("champion") || !results["champion"].is_object())
    Throw(ErrorKind::kCorrupt, results_path + ": not a run's results (no champion)");
  m.pipeline = workflow::PipelineFromSource(record::ReadRunPipeline(m.run_dir));
  m.run = results.value("run", std::filesystem::path(m.run_dir).filename().string());
  m.metric = m.pipeline.metric;

  // The entry: the champion, or the candidate of that id in the rounds' rankings.
  json entry;
  const std::string champion_id = results["champion"].value("candidate", json::object()).value("id", "");
  if (candidate_id.empty() || candidate_id == champion_id) {
    entry = results["champion"];
    m.champion = true;
  } else {
    std::vector<std::string> ids;
    for (const auto& r : results.value("rounds", json::array()))
      for (const auto& c : r.value("candidates", json::array())) {
        const std::string id = c.value("candidate", json::object()).value("id", "");
        ids.push_back(id);
        if (id == candidate_id) entry = c;
      }
    if (entry.is_null())
      Throw(ErrorKind::kNotFound, fmt::format("--candidate {}: the run trained no such candidate (it has {})",
                                              candidate_id, Join(ids, ", ")));
  }
  m.candidate = workflow::CandidateFromJson(entry.at("candidate"));
  m.model_object = entry.value("model", "");
  m.metric_value = entry.value(m.metric, entry.value("accuracy", 0.0));
  m.selected_on = entry.value("selected_on", results.value("result", json::object()).value("selected_on", ""));
  if (entry.contains("test")) m.test = entry["test"];
  if (m.model_object.empty())
    m.model_object = workflow::ModelObject(m.run, RoundOf(m.candidate.id), m.candidate.id);

  for (const auto& bb : m.pipeline.backbones)
    if (bb.name == m.candidate.backbone) m.backbone = bb;
  if (m.backbone.name.empty())
    Throw(ErrorKind::kCorrupt, fmt::format("{}: candidate {} names backbone '{}', which the run's pipeline lacks",
                                           results_path, m.candidate.id, m.candidate.backbone));

  auto store = OpenRunNam(m.run_dir, results.value("nam", ""), m.model_object);
  const nam::Object model = store->Get(m.model_object);
  m.head = modules::HeadFromModel(model, m.candidate.head);
  const modules::TailWeights tail = modules::TailOfModel(model);
  if (m.backbone.kind != workflow::BackboneKind::kPixels) LoadBackbone(*store, tail, &m);

  // Class names: the test figures' per-class names, by class index.
  m.class_names.assign(static_cast<size_t>(m.head.classes), "");
  for (size_t i = 0; i < m.class_names.size(); ++i) m.class_names[i] = std::to_string(i);
  if (m.test.is_object())
    for (const auto& pc : m.test.value("per_class", json::array())) {
      const int64_t k = pc.value("class_index", int64_t{-1});
      if (k >= 0 && k < m.head.classes) m.class_names[static_cast<size_t>(k)] = pc.value("class", std::to_string(k));
    }

  // The images' size, from the test split's first image (raw pixels and preprocessing need it).
  const workflow::SplitSource test = workflow::OpenSplit(m.pipeline, "test");
  if (test.count() > 0) {
    const kernels::ImageSet first = test.Read(0, 1);
    m.image_rows = first.Rows(0);
    m.image_cols = first.Cols(0);
    m.image_channels = first.Channels(0);
  }
  return m;
}

kernels::ClassifierExport ExportSpec(const TrainedModel& m, bool with_preprocessing) {
  kernels::ClassifierExport e;
  e.backbone_onnx = m.backbone_onnx;
  e.cut_tensor = m.backbone.feature_layer;
  e.origin = "backbone '" + m.backbone.name + "'";
  e.input = m.backbone.input;
  e.image_rows = m.image_rows;
  e.image_cols = m.image_cols;
  e.image_channels = m.image_channels;
  e.uniform_images = m.pipeline.test.format != "folder";
  e.half_features = m.backbone.feature_dtype == "f16";
  e.with_preprocessing = with_preprocessing;
  e.head = m.head;
  const auto& in = m.backbone.input;
  json input = {{"preprocessing", with_preprocessing ? "in the graph: uint8 [N, rows, cols, channels] images"
                                                     : "by the caller: float32 [N, C, H, W], (pixel / 255 - mean) / std"},
                {"image", {{"rows", m.image_rows}, {"cols", m.image_cols}, {"channels", m.image_channels}}}};
  if (m.backbone.kind == workflow::BackboneKind::kPixels && !m.backbone.prepared()) {
    input["model"] = {{"kind", "pixels"}, {"layout", "[N, rows, cols, channels], pixel / 255"}};
  } else if (m.backbone.kind ==
             workflow::BackboneKind::kPixels) {  // resized raw pixels: prepared images are the features
    input["model"] = {{"kind", "pixels"}, {"channels", in.channels}, {"height", in.height}, {"width", in.width},
                      {"mean", {0, 0, 0}}, {"std", {1, 1, 1}}, {"resize", "bilinear, half-pixel centres"},
                      {"layout", "[N, C, H, W], pixel / 255"}};
  } else {
    input["model"] = {{"channels", in.channels}, {"height", in.height}, {"width", in.width},
                      {"mean", {in.mean[0], in.mean[1], in.mean[2]}}, {"std", {in.std[0], in.std[1], in.std[2]}},
                      {"resize", "bilinear, half-pixel centres"}};
  }
  e.metadata = {
      {"msaflow.format", "msaflow.classifier/1"},
      {"msaflow.run", m.run},
      {"msaflow.pipeline", m.pipeline.name},
      {"msaflow.candidate", m.candidate.id},
      {"msaflow.champion", m.champion ? "true" : "false"},
      {"msaflow.backbone", json{{"name", m.backbone.name},
                                {"kind", m.backbone.kind},
                                {"feature_layer", m.backbone.feature_layer},
                                {"precision", kernels::PrecisionName(m.backbone.precision)},
                                {"feature_dtype", m.backbone.feature_dtype},
                                {"trained_from", m.finetuned_from}}
                               .dump()},
      {"msaflow.head", workflow::ToJson(m.candidate)["head"].dump()},
      {"msaflow.metric", json{{"name", m.metric}, {"value", m.metric_value}, {"split", m.selected_on}}.dump()},
      {"msaflow.test", m.test.is_object() ? json{{"accuracy", m.test.value("accuracy", 0.0)}}.dump() : "null"},
      {"msaflow.classes", json(m.class_names).dump()},
      {"msaflow.input", input.dump()},
      {"msaflow.output", "probabilities: float32 [N, classes], softmax"},
  };
  return e;
}

}  // namespace msaflow::inference
