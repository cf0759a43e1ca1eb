#include "modules/steps.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fmt/core.h>
#include <set>

#include "common/checksum.h"
#include "common/error.h"
#include "common/files.h"
#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/head.h"
#include "kernels/metrics.h"
#include "kernels/onnx_graph.h"
#include "nam/store.h"
#include "orchestrator/candidates.h"
#include "orchestrator/pipeline.h"
#include "orchestrator/planner.h"

namespace msaflow::modules {
namespace {

using nlohmann::json;
using orchestrator::Candidate;
using orchestrator::Pipeline;

constexpr int64_t kBatch = 64;

struct Ctx {
  json task;
  Pipeline p;
  std::unique_ptr<nam::Store> store;
  std::string run;
  int round = 0;
  int rank = 0, size = 1;
  std::FILE* out;
  void Say(const std::string& s) const {
    std::fprintf(out, "%s\n", s.c_str());
    std::fflush(out);
  }
};

// ---- features objects: labels (n bytes, padded to 4) then n x dim float32 ----------------

std::string EncodeFeatures(const std::vector<uint8_t>& labels, const std::vector<float>& x) {
  std::string b(reinterpret_cast<const char*>(labels.data()), labels.size());
  b.resize((b.size() + 3) / 4 * 4, '\0');
  b.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  return b;
}

struct Features {
  int64_t n = 0, dim = 0, classes = 0;
  std::vector<uint8_t> labels;
  std::vector<float> x;
};

Features DecodeFeatures(const nam::Object& o) {
  Features f;
  try {
    f.n = o.info.meta.at("rows");
    f.dim = o.info.meta.at("dim");
    f.classes = o.info.meta.at("classes");
  } catch (const json::exception&) {
    Throw(ErrorKind::kCorrupt, "NAM object '" + o.info.name + "': features metadata lacks rows/dim/classes");
  }
  size_t lab = static_cast<size_t>((f.n + 3) / 4 * 4);
  if (o.bytes.size() != lab + static_cast<size_t>(f.n * f.dim) * sizeof(float))
    Throw(ErrorKind::kCorrupt, "NAM object '" + o.info.name + "': size does not match rows x dim");
  f.labels.assign(o.bytes.begin(), o.bytes.begin() + f.n);
  f.x.resize(static_cast<size_t>(f.n * f.dim));
  std::memcpy(f.x.data(), o.bytes.data() + lab, f.x.size() * sizeof(float));
  return f;
}

std::string BackboneObject(const std::string& name) { return "backbone/" + name; }

// The content key of a backbone's features on a dataset split (docs/nam.md): reused by every
// later round, candidate and run that asks for the same backbone digest and data.
std::string FeaturesKey(const std::string& bb_digest, const std::string& ds_digest) {
  return "features/" + bb_digest + "-" + ds_digest;
}

std::string BackboneDigest(Ctx& c, const orchestrator::BackboneSpec& bb) {
  auto info = c.store->Stat(BackboneObject(bb.name));
  if (!info) Throw(ErrorKind::kNotFound, "NAM: backbone '" + bb.name + "' is not loaded (run the load step first)");
  return info->meta.at("digest");
}

const orchestrator::SplitSpec& Split(const Pipeline& p, const std::string& s) { return s == "train" ? p.train : p.test; }

// ---- steps ---------------------------------------------------------------------------------

void Load(Ctx& c) {
  for (const auto& bb : c.p.backbones) {
    std::string obj = BackboneObject(bb.name);
    json meta = {{"kind", bb.kind}, {"name", bb.name}};
    std::string bytes;
    if (bb.kind == "pixels") {
      meta["digest"] = ChecksumHex("pixels/v1");
      auto have = c.store->Stat(obj);
      if (have && have->meta.value("digest", "") == meta["digest"]) {
        c.Say(fmt::format("backbone {}: already in NAM ({})", bb.name, obj));
        continue;
      }
    } else {
      std::string model = ReadFile(bb.onnx);
      std::string digest = ChecksumHex(model + "\n" + bb.feature_layer + "\n" +
                                       fmt::format("{}x{}x{} {} {} {} {} {} {}", bb.input.channels, bb.input.height,
                                                   bb.input.width, bb.input.mean[0], bb.input.mean[1], bb.input.mean[2],
                                                   bb.input.std[0], bb.input.std[1], bb.input.std[2]));
      auto have = c.store->Stat(obj);
      if (have && have->meta.value("digest", "") == digest) {
        c.Say(fmt::format("backbone {}: already in NAM ({}, digest {})", bb.name, obj, digest));
        continue;
      }
      // Import, check every operator, cut at the feature layer, and dry-run one image.
      kernels::Graph g = kernels::ImportOnnx(model, bb.onnx, bb.feature_layer);
      kernels::Executor ex(g);
      int64_t dim = ex.FeatureDim(bb.input.channels, bb.input.height, bb.input.width);
      bytes = kernels::CutOnnx(model, bb.onnx, bb.feature_layer);
      meta["digest"] = digest;
      meta["source"] = bb.onnx;
      meta["feature_layer"] = bb.feature_layer;
      meta["feature_dim"] = dim;
      meta["input"] = {{"channels", bb.input.channels}, {"height", bb.input.height}, {"width", bb.input.width},
                       {"mean", bb.input.mean}, {"std", bb.input.std}};
      c.Say(fmt::format("backbone {}: imported {} ({} nodes up to '{}', {} fused ops), {} features", bb.name, bb.onnx,
                        g.nodes.size(), bb.feature_layer, ex.FusedOpCount(), dim));
    }
    auto info = c.store->Put(obj, bytes, meta);
    c.Say(fmt::format("backbone {}: stored as {} (version {})", bb.name, obj, info.version));
  }
}

void Prepare(Ctx& c) {
  json summary = {{"computed", json::array()}, {"reused", json::array()}};
  std::map<std::string, kernels::ImageSet> data;
  for (const std::string split : {"train", "test"}) {
    const auto& s = Split(c.p, split);
    data[split] = kernels::ReadIdx(s.images, s.labels, s.limit);
  }
  for (const auto& bb : c.p.backbones) {
    std::string bb_digest = BackboneDigest(c, bb);
    std::unique_ptr<kernels::Executor> ex;
    for (const std::string split : {"train", "test"}) {
      const kernels::ImageSet& ds = data[split];
      std::string key = FeaturesKey(bb_digest, ds.Digest());
      json entry = {{"backbone", bb.name}, {"split", split}, {"object", key}, {"rows", ds.count}};
      if (c.store->Stat(key)) {
        c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", bb.name, split, key));
        summary["reused"].push_back(entry);
        continue;
      }
      auto t0 = std::chrono::steady_clock::now();
      std::vector<float> feats;
      int64_t dim = 0;
      if (bb.kind == "pixels") {
        dim = ds.rows * ds.cols;
        feats.resize(ds.pixels.size());
        for (size_t i = 0; i < feats.size(); ++i) feats[i] = ds.pixels[i] / 255.f;
      } else {
        if (!ex) {
          nam::Object o = c.store->Get(BackboneObject(bb.name));
          ex = std::make_unique<kernels::Executor>(kernels::ImportOnnx(o.bytes, "NAM " + o.info.name, bb.feature_layer));
        }
        const auto& in = bb.input;
        dim = ex->FeatureDim(in.channels, in.height, in.width);
        feats.resize(static_cast<size_t>(ds.count * dim));
        std::vector<float> batch(static_cast<size_t>(kBatch * in.channels * in.height * in.width));
        int64_t next_report = ds.count / 4;
        for (int64_t s = 0; s < ds.count; s += kBatch) {
          int64_t b = std::min(kBatch, ds.count - s);
          kernels::PrepareBatch(ds.pixels.data() + s * ds.rows * ds.cols, b, ds.rows, ds.cols, in, batch.data());
          auto f = ex->Features(batch.data(), b, in.channels, in.height, in.width);
          std::copy(f.begin(), f.end(), feats.begin() + s * dim);
          if (s + b >= next_report && s + b < ds.count) {
            c.Say(fmt::format("progress: features {}/{} {}/{} images", bb.name, split, s + b, ds.count));
            next_report += ds.count / 4;
          }
        }
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      json meta = {{"rows", ds.count}, {"dim", dim}, {"classes", ds.classes()}, {"backbone", bb.name},
                   {"backbone_digest", bb_digest}, {"dataset_digest", ds.Digest()}, {"split", split}};
      c.store->Put(key, EncodeFeatures(ds.labels, feats), meta);
      c.Say(fmt::format("features {}/{}: computed {} x {} in {:.1f} s ({:.2f} ms/image) -> {}", bb.name, split, ds.count,
                        dim, secs, 1e3 * secs / static_cast<double>(ds.count), key));
      entry["seconds"] = secs;
      summary["computed"].push_back(entry);
    }
  }
  c.store->Put(orchestrator::PreparedObject(c.run, c.round), summary.dump(), {{"kind", "prepare-summary"}});
}

std::string StagingObject(const Ctx& c, const std::string& cand) {
  return "staging/" + c.run + "/" + std::to_string(c.round) + "/" + cand;
}

Features LoadFeatures(Ctx& c, const std::string& backbone, const std::string& split) {
  const auto& bb = c.p.Backbone(backbone);
  const auto& s = Split(c.p, split);
  // The digest of the data subset is needed for the key; reading the IDX is cheap.
  kernels::ImageSet ds = kernels::ReadIdx(s.images, s.labels, s.limit);
  std::string key = FeaturesKey(BackboneDigest(c, bb), ds.Digest());
  return DecodeFeatures(c.store->Get(key));
}

void Train(Ctx& c) {
  std::map<std::string, Features> cache;
  const json& cands = c.task.at("candidates");
  for (size_t i = 0; i < cands.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(c.size)) != c.rank) continue;  // candidates spread over ranks
    Candidate cand = orchestrator::CandidateFromJson(cands[i]);
    if (!cache.count(cand.backbone)) cache[cand.backbone] = LoadFeatures(c, cand.backbone, "train");
    const Features& f = cache[cand.backbone];
    std::unique_ptr<kernels::Head> init;
    if (!cand.warm_start.empty()) {
      nam::Object m = c.store->Get(cand.warm_start);
      init = std::make_unique<kernels::Head>(kernels::Head::Deserialize(
          orchestrator::CandidateFromJson(m.info.meta.at("candidate")).head, m.info.meta.at("in_dim"),
          m.info.meta.at("classes"), m.bytes));
    }
    auto t0 = std::chrono::steady_clock::now();
    kernels::Head h = kernels::TrainHead(cand.head, f.x.data(), f.labels.data(), f.n, f.dim, f.classes, init.get());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    json meta = {{"candidate", orchestrator::ToJson(cand)}, {"in_dim", f.dim}, {"classes", f.classes},
                 {"backbone", cand.backbone}, {"backbone_digest", BackboneDigest(c, c.p.Backbone(cand.backbone))},
                 {"curve", {{"loss", h.curve_loss}, {"train_accuracy", h.curve_acc}}}, {"seconds", secs},
                 {"train_rows", f.n}};
    c.store->Put(StagingObject(c, cand.id), h.Serialize(), meta);
    c.Say(fmt::format("trained {} ({} on {}): final train loss {:.4f}, train acc {:.4f} in {:.1f} s{}", cand.id,
                      orchestrator::HeadLabel(cand.head), cand.backbone, h.curve_loss.back(), h.curve_acc.back(), secs,
                      cand.warm_start.empty() ? "" : " (warm start from " + cand.warm_start + ")"));
  }
}

// Idempotent, so a failed store can simply run again: every model is published before any
// staging object is removed, and a candidate whose staging is gone but whose model exists was
// stored by an earlier attempt.
void Store(Ctx& c) {
  std::vector<std::string> staged_names;
  for (const auto& cj : c.task.at("candidates")) {
    Candidate cand = orchestrator::CandidateFromJson(cj);
    std::string name = orchestrator::ModelObject(c.run, c.round, cand.id);
    if (!c.store->Stat(StagingObject(c, cand.id)) && c.store->Stat(name)) {
      c.Say(fmt::format("{} was stored by an earlier attempt", name));
      continue;
    }
    nam::Object staged = c.store->Get(StagingObject(c, cand.id));  // checksum verified
    // The stored model: head weights + backbone reference + hyper-parameters + curve.
    json meta = staged.info.meta;
    meta["run"] = c.run;
    meta["round"] = c.round;
    kernels::Head::Deserialize(cand.head, meta.at("in_dim"), meta.at("classes"), staged.bytes);  // shape check
    auto info = c.store->Put(name, staged.bytes, meta);
    staged_names.push_back(staged.info.name);
    c.Say(fmt::format("stored {} ({} bytes, checksum {})", name, info.size, info.checksum));
  }
  for (const auto& n : staged_names) c.store->Remove(n);
}

std::string EvalObject(const Ctx& c, const std::string& cand, int64_t shard) {
  return "eval/" + c.run + "/" + std::to_string(c.round) + "/" + cand + "/" + std::to_string(shard);
}

json MetricsJson(const kernels::Metrics& m) {
  return {{"count", m.count},         {"correct", m.correct},  {"loss_sum", m.loss_sum}, {"classes", m.classes},
          {"accuracy", m.accuracy()}, {"loss", m.loss()},      {"confusion", m.confusion}};
}

kernels::Metrics MetricsFromJson(const json& j) {
  kernels::Metrics m;
  m.count = j.at("count");
  m.correct = j.at("correct");
  m.loss_sum = j.at("loss_sum");
  m.classes = j.at("classes");
  m.confusion = j.at("confusion").get<std::vector<int64_t>>();
  return m;
}

void Evaluate(Ctx& c) {
  const json& cands = c.task.at("candidates");
  int64_t shards = c.task.at("shards");
  std::map<std::string, Features> cache;
  // The task farm: (model x shard) tasks dealt round-robin over ranks.
  int64_t n_tasks = static_cast<int64_t>(cands.size()) * shards;
  int done = 0;
  for (int64_t t = c.rank; t < n_tasks; t += c.size) {
    Candidate cand = orchestrator::CandidateFromJson(cands[static_cast<size_t>(t / shards)]);
    int64_t shard = t % shards;
    if (!cache.count(cand.backbone)) cache[cand.backbone] = LoadFeatures(c, cand.backbone, "test");
    const Features& f = cache[cand.backbone];
    nam::Object m = c.store->Get(orchestrator::ModelObject(c.run, c.round, cand.id));
    kernels::Head h = kernels::Head::Deserialize(cand.head, m.info.meta.at("in_dim"), m.info.meta.at("classes"), m.bytes);
    if (h.in_dim != f.dim)
      Throw(ErrorKind::kInvalidInput, "model " + m.info.name + " expects " + std::to_string(h.in_dim) +
                                          " features, test features have " + std::to_string(f.dim));
    int64_t lo = f.n * shard / shards, hi = f.n * (shard + 1) / shards;
    auto logits = h.Logits(f.x.data() + lo * f.dim, hi - lo);
    kernels::Metrics met = kernels::Evaluate(logits.data(), f.labels.data() + lo, hi - lo, std::max(h.classes, f.classes));
    c.store->Put(EvalObject(c, cand.id, shard), MetricsJson(met).dump(), {{"kind", "eval-shard"}});
    ++done;
  }
  c.Say(fmt::format("rank {}/{}: evaluated {} (model x shard) tasks of {}", c.rank, c.size, done, n_tasks));
}

void Select(Ctx& c) {
  std::vector<kernels::Scored> scores;
  std::map<std::string, json> info;
  int64_t shards = -1;
  for (const auto& cj : c.task.at("candidates")) {
    Candidate cand = orchestrator::CandidateFromJson(cj);
    kernels::Metrics total;
    auto parts = c.store->List("eval/" + c.run + "/" + std::to_string(c.round) + "/" + cand.id + "/");
    if (parts.empty()) Throw(ErrorKind::kNotFound, "select: no evaluation results for candidate " + cand.id);
    if (shards < 0) shards = static_cast<int64_t>(parts.size());
    for (const auto& part : parts) {
      nam::Object o = c.store->Get(part.name);
      total.Merge(MetricsFromJson(json::parse(o.bytes)));
    }
    std::string model = orchestrator::ModelObject(c.run, c.round, cand.id);
    json res = MetricsJson(total);
    res["candidate"] = orchestrator::ToJson(cand);
    res["model"] = model;
    res["round"] = c.round;
    res["shards"] = parts.size();
    std::string rname = orchestrator::ResultObject(c.run, c.round, cand.id);
    c.store->Put(rname, res.dump(), {{"kind", "result"}});
    for (const auto& part : parts) c.store->Remove(part.name);
    scores.push_back({cand.id, total.accuracy()});
    info[cand.id] = {{"candidate", orchestrator::ToJson(cand)}, {"model", model}, {"result", rname},
                     {"accuracy", total.accuracy()}, {"loss", total.loss()}, {"round", c.round}};
  }
  for (const auto& k : c.task.value("kept", json::array())) {
    json res = json::parse(c.store->Get(k.at("result")).bytes);
    std::string id = k.at("candidate").at("id");
    scores.push_back({id, res.at("accuracy")});
    info[id] = {{"candidate", k.at("candidate")}, {"model", k.at("model")}, {"result", k.at("result")},
                {"accuracy", res.at("accuracy")}, {"loss", res.at("loss")}, {"round", res.at("round")}};
  }
  // The reduction (argmax, ties by candidate id, top-k): CPU fallback of the FPGA kernel.
  auto top = kernels::SelectTopK(scores, static_cast<size_t>(c.task.value("top_k", 1)));
  json best = {{"metric", c.task.value("metric", "accuracy")}, {"device", "cpu (FPGA simulated)"},
               {"champion", info[top.at(0).candidate]}, {"top_k", json::array()}, {"all", json::array()}};
  for (const auto& t : top) best["top_k"].push_back(info[t.candidate]);
  for (const auto& s : kernels::SelectTopK(scores, scores.size())) best["all"].push_back(info[s.candidate]);
  c.store->Put(orchestrator::BestObject(c.run, c.round), best.dump(), {{"kind", "best"}});
  c.Say(fmt::format("champion of round {}: {} accuracy {:.4f} (of {} candidates)", c.round, top[0].candidate,
                    top[0].metric, scores.size()));
}

}  // namespace

void RunStep(const std::string& step, const nlohmann::json& task, int rank, int size, std::FILE* out) {
  Ctx c;
  c.task = task;
  c.out = out;
  c.rank = rank;
  c.size = size;
  try {
    if (task.value("format", "") != orchestrator::kTaskFormat)
      Throw(ErrorKind::kInvalidInput, std::string("task: format is not ") + orchestrator::kTaskFormat);
    if (task.at("step") != step)
      Throw(ErrorKind::kInvalidInput, "task is for step '" + task.at("step").get<std::string>() + "', not '" + step + "'");
    c.p = orchestrator::PipelineFromSource(task.at("pipeline"));
    c.store = nam::OpenStore(task.at("nam"));
    c.run = task.at("run");
    c.round = task.at("round");
  } catch (const json::exception& e) {
    Throw(ErrorKind::kInvalidInput, std::string("task: ") + e.what());
  }
  if (step == "load") return Load(c);
  if (step == "prepare") return Prepare(c);
  if (step == "train") return Train(c);
  if (step == "store") return Store(c);
  if (step == "evaluate") return Evaluate(c);
  if (step == "select") return Select(c);
  Throw(ErrorKind::kInvalidInput, "unknown step '" + step + "' (expected load, prepare, train, store, evaluate, select)");
}

}  // namespace msaflow::modules
