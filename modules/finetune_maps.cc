#include "modules/finetune_maps.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/half.h"
#include "kernels/onnx_graph.h"
#include "modules/features.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"

namespace msaflow::modules {
namespace {

// The backbone as the load step stored it: its model cut at feature_layer.
kernels::Graph BackboneGraph(StepContext& c, const workflow::BackboneSpec& bb, std::string* bytes) {
  nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
  *bytes = std::move(o.bytes);
  return kernels::ImportOnnx(*bytes, "NAM " + o.info.name, bb.feature_layer);
}

// The maps' layout, as a maps object's metadata gives it.
struct MapsLayout {
  std::vector<std::string> inputs;
  std::vector<kernels::TensorDims> dims;
  int64_t row = 0;  // floats per row: every input's values for one image
};

MapsLayout LayoutFromMeta(const std::string& object, const nlohmann::json& meta) {
  MapsLayout l;
  try {
    for (const auto& in : meta.at("inputs")) {
      l.inputs.push_back(in.at("name").get<std::string>());
      l.dims.push_back(in.at("dims").get<kernels::TensorDims>());
      if (l.dims.back().size() != 3) Throw(ErrorKind::kCorrupt, "an input's dims are not (C, H, W)");
      l.row += kernels::NumElements(l.dims.back());
    }
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kCorrupt, "NAM object '" + object + "': maps metadata: " + e.what());
  }
  if (l.inputs.empty() || l.row != meta.value("dim", int64_t{-1}))
    Throw(ErrorKind::kCorrupt, "NAM object '" + object + "': maps metadata: the inputs' sizes do not add up to dim");
  return l;
}

// This rank's parts [p0, p1) of the maps of `src`, computed by `trunk` and put in the NAM.
void ComputeMapsParts(StepContext& c, const workflow::BackboneSpec& bb, kernels::Executor& trunk,
                      const workflow::SplitSource& src, const FeaturesIndex& idx, int64_t p0, int64_t p1) {
  if (p0 >= p1) return;
  const int64_t lo = idx.PartLo(p0), hi = idx.PartHi(p1 - 1);
  const kernels::ImageSet ds = src.Read(lo, hi);
  const auto& in = bb.input;
  kernels::fpga::Device& fpga = c.Fpga();
  const int64_t per = in.channels * in.height * in.width;
  std::vector<float> batch(static_cast<size_t>(workflow::kMapsBatch * per));
  std::vector<float> part;
  std::vector<uint16_t> halves;  // a part narrowed to float16 (MapsInHalf)
  int64_t p = p0;
  for (int64_t s = 0; s < hi - lo; s += workflow::kMapsBatch) {
    const int64_t b = std::min(workflow::kMapsBatch, hi - lo - s);
    kernels::fpga::PrepareImages(fpga, ds, 0, s, b, in, batch.data());
    std::vector<std::vector<int64_t>> dims;
    const std::vector<std::vector<float>> m = trunk.Maps(batch.data(), b, in.channels, in.height, in.width, &dims);
    for (int64_t k = 0; k < b; ++k) {
      for (size_t i = 0; i < m.size(); ++i) {
        const int64_t size = kernels::NumElements(dims[i]) / b;
        part.insert(part.end(), m[i].begin() + k * size, m[i].begin() + (k + 1) * size);
      }
      const int64_t row = lo + s + k + 1;  // rows below this one are done
      if (row == idx.PartHi(p)) {
        std::string_view data(reinterpret_cast<const char*>(part.data()), part.size() * sizeof(float));
        if (idx.half) {
          NarrowFeatures(bb.name, part.data(), part.size(), halves);
          data = std::string_view(reinterpret_cast<const char*>(halves.data()), halves.size() * sizeof(uint16_t));
        }
        c.store->Put(workflow::FeaturesPartObject(idx.object, p), data, {{"kind", "maps-part"}});
        part.clear();
        ++p;
      }
    }
  }
}

// One backbone's maps of one split, computed into the NAM object `key` (each rank its parts).
nlohmann::json ComputeMaps(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                           const std::string& key, const kernels::Tail& tail, kernels::Executor& trunk,
                           int64_t classes) {
  const auto t0 = SteadyClock::now();
  nlohmann::json entry = {{"backbone", bb.name}, {"split", src.name()}, {"object", key}};
  const auto& in = bb.input;
  std::vector<float> one(static_cast<size_t>(in.channels * in.height * in.width), 0.f);
  std::vector<std::vector<int64_t>> dims;
  trunk.Maps(one.data(), 1, in.channels, in.height, in.width, &dims);
  nlohmann::json inputs = nlohmann::json::array();
  int64_t row = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    const kernels::TensorDims d(dims[i].begin() + 1, dims[i].end());
    inputs.push_back({{"name", tail.inputs()[i]}, {"dims", d}});
    row += kernels::NumElements(d);
  }
  FeaturesIndex idx;
  idx.object = key;
  idx.n = src.count();
  idx.dim = row;
  idx.part_rows = workflow::FeaturesPartRows(row, workflow::kMapsBatch, workflow::FeaturesPartBytes());
  idx.parts = (idx.n + idx.part_rows - 1) / idx.part_rows;
  idx.half = workflow::MapsInHalf(bb, src.name());
  const int rank = c.comm->rank(), size = c.comm->size();
  ComputeMapsParts(c, bb, trunk, src, idx, idx.parts * rank / size, idx.parts * (rank + 1) / size);
  c.comm->Barrier();  // every rank's parts are in before the object that says they are
  const double bytes = PutMapsObject(c, bb, src, idx, classes, inputs, fmt::format(" in {:.1f} s", SecondsSince(t0)));
  entry.update({{"computed", true}, {"rows", idx.n}, {"bytes", bytes}, {"seconds", SecondsSince(t0)}, {"ranks", size}});
  return entry;
}

}  // namespace

double PutMapsObject(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                     const FeaturesIndex& idx, int64_t classes, const nlohmann::json& inputs, const std::string& how) {
  const double bytes = static_cast<double>(idx.n * idx.dim * (idx.half ? 2 : 4));  // float16 or float32 values
  if (!c.root()) return bytes;
  nlohmann::json meta = FeaturesMeta(idx.n, idx.dim, classes, idx.part_rows, idx.half);
  meta.update(
      {{"kind", "maps"}, {"inputs", inputs}, {"backbone", bb.name}, {"train_from", bb.train_from}, {"split", src.name()}});
  if (!src.class_names().empty()) meta["class_names"] = src.class_names();
  const auto& labels = src.labels();
  c.store->Put(idx.object, std::string_view(reinterpret_cast<const char*>(labels.data()), labels.size()), meta);
  const int size = c.comm->size();
  c.Say(fmt::format("maps {}/{} at {}: {} images x {} values ({:.1f} MB) in {} part{} on {} rank{}{} -> {}", bb.name,
                    src.name(), bb.train_from, idx.n, idx.dim, bytes / 1e6, idx.parts, idx.parts == 1 ? "" : "s", size,
                    size == 1 ? "" : "s", how, idx.object));
  return bytes;
}

std::string MapsKey(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split) {
  // Float16 maps of every split under a key of their own: the selection and test maps of an f16
  // backbone were float32 before they came in float16 too, and a NAM may still hold those.
  return workflow::MapsObject(BackboneDigest(*c.store, bb), c.DatasetDigest(split),
                              bb.train_from + (workflow::MapsInHalf(bb, split) ? "/f16" : ""));
}

std::unique_ptr<kernels::Tail> BackboneTails::Make(const workflow::BackboneSpec& bb) {
  auto it = graphs_.find(bb.name);
  if (it == graphs_.end()) {
    std::string bytes;
    it = graphs_.emplace(bb.name, BackboneGraph(c_, bb, &bytes)).first;
  }
  try {
    return std::make_unique<kernels::Tail>(it->second, bb.train_from);
  } catch (const Error& e) {
    Throw(e.kind(), "backbone '" + bb.name + "': " + e.what());
  }
}

nlohmann::json PrepareMaps(StepContext& c) {
  nlohmann::json entries = nlohmann::json::array();
  const workflow::Pipeline& p = c.pipeline();
  std::vector<workflow::SplitSource> splits;  // opened on first need
  int64_t classes = 0;
  for (const auto& bb : p.backbones) {
    if (!p.FinetunesIn(bb, c.task.round)) continue;
    std::unique_ptr<kernels::Tail> tail;       // the model imported, and the datasets read, only
    std::unique_ptr<kernels::Executor> trunk;  // where some split's maps are not in the NAM yet
    for (const std::string& split : workflow::SplitNames(p, c.task.test)) {
      const std::string key = MapsKey(c, bb, split);
      int have = c.root() && c.store->Stat(key) ? 1 : 0;  // rank 0 decides for all
      c.comm->Bcast(&have, sizeof have, 0);
      if (have) {
        entries.push_back({{"backbone", bb.name}, {"split", split}, {"object", key}, {"computed", false}});
        continue;
      }
      c.WorkAhead();  // not in the coordinator: a backbone's trunk over every image
      if (splits.empty()) {
        splits = workflow::OpenSplits(p, c.task.test);
        classes = workflow::CheckSplits(p, splits);
      }
      if (!tail) {
        std::string bytes;
        tail = std::make_unique<kernels::Tail>(BackboneGraph(c, bb, &bytes), bb.train_from);
        trunk = std::make_unique<kernels::Executor>(
            kernels::ImportOnnxCuts(bytes, "NAM backbone/" + bb.name, tail->inputs()));
      }
      const auto src = std::find_if(splits.begin(), splits.end(), [&](const auto& s) { return s.name() == split; });
      entries.push_back(ComputeMaps(c, bb, *src, key, *tail, *trunk, classes));
    }
  }
  return entries;
}

int64_t PutMapsArrays(nam::Store& store, const std::string& key, const parallel::FinetuneArrays& a,
                      const std::vector<std::string>& inputs, int64_t classes, int64_t part_rows) {
  int64_t row = 0;
  nlohmann::json meta_inputs = nlohmann::json::array();
  for (size_t i = 0; i < a.dims.size(); ++i) {
    row += kernels::NumElements(a.dims[i]);
    meta_inputs.push_back({{"name", inputs.at(i)}, {"dims", a.dims[i]}});
  }
  int64_t bytes = 0;
  std::vector<float> v;
  for (int64_t p = 0; p * part_rows < a.n; ++p) {
    v.clear();
    for (int64_t r = p * part_rows; r < std::min(a.n, (p + 1) * part_rows); ++r)
      for (size_t i = 0; i < a.maps.size(); ++i) {
        const int64_t size = kernels::NumElements(a.dims[i]);
        v.insert(v.end(), a.maps[i] + r * size, a.maps[i] + (r + 1) * size);
      }
    store.Put(workflow::FeaturesPartObject(key, p),
              std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)),
              {{"kind", "maps-part"}});
    bytes += static_cast<int64_t>(v.size() * sizeof(float));
  }
  nlohmann::json meta = FeaturesMeta(a.n, row, classes, part_rows, false);
  meta.update({{"kind", "maps"}, {"inputs", meta_inputs}});
  store.Put(key, std::string_view(reinterpret_cast<const char*>(a.y), static_cast<size_t>(a.n)), meta);
  return bytes;
}

std::unique_ptr<MapsSource> OpenMaps(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split,
                                     int64_t limit) {
  const std::string key = MapsKey(c, bb, split);
  if (!c.store->Stat(key))
    Throw(ErrorKind::kNotFound, "NAM: no maps object '" + key + "' for backbone '" + bb.name + "' on " + split +
                                    " (the prepare step of a round that fine-tunes makes it)");
  return std::make_unique<MapsSource>(*c.store, key, limit);
}

MapsSource::MapsSource(nam::Store& store, const std::string& key, int64_t limit)
    : store_(store),
      idx_(OpenFeaturesObject(store, key)),
      keep_(workflow::MapsKeepBytes(idx_.n * idx_.dim * (idx_.half ? 2 : 4), limit)) {
  const auto info = store.Stat(key);
  if (!info) Throw(ErrorKind::kNotFound, "NAM: no maps object '" + key + "'");
  const MapsLayout layout = LayoutFromMeta(key, info->meta);
  inputs = layout.inputs;
  dims = layout.dims;
  for (const auto& d : dims) sizes_.push_back(kernels::NumElements(d));
  labels = idx_.labels;
  class_names = idx_.class_names;
  classes = idx_.classes;
  y = labels.data();
  n = idx_.n;
  held_.resize(static_cast<size_t>(idx_.parts));
  state_.assign(static_cast<size_t>(idx_.parts), 0);
  pending_.assign(static_cast<size_t>(idx_.parts), 0);
  thread_ = std::thread([this] { Fetch(); });
}

MapsSource::~MapsSource() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  fetch_cv_.notify_all();
  thread_.join();
}

int64_t MapsSource::part_bytes() const {
  return idx_.part_rows * idx_.dim * static_cast<int64_t>(idx_.half ? sizeof(uint16_t) : sizeof(float));
}

int64_t MapsSource::window_parts() const {
  return streamed() ? std::max<int64_t>(1, keep_ / (2 * std::max<int64_t>(1, part_bytes()))) : idx_.parts;
}

MapsSource::Stats MapsSource::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void MapsSource::Shuffle(std::vector<int64_t>& rows, std::mt19937_64& rng) const {
  if (!streamed()) {
    std::shuffle(rows.begin(), rows.end(), rng);
    return;
  }
  // The rows by part, the parts in a shuffled order, then each window's rows shuffled.
  std::map<int64_t, std::vector<int64_t>> by_part;
  for (int64_t r : rows) by_part[PartOf(r)].push_back(r);
  std::vector<int64_t> parts;
  parts.reserve(by_part.size());
  for (const auto& [p, _] : by_part) parts.push_back(p);
  std::shuffle(parts.begin(), parts.end(), rng);
  const auto w = static_cast<size_t>(window_parts());
  auto out = rows.begin();
  for (size_t lo = 0; lo < parts.size(); lo += w) {
    const auto first = out;
    for (size_t k = lo; k < std::min(parts.size(), lo + w); ++k) {
      const std::vector<int64_t>& mine = by_part[parts[k]];
      out = std::copy(mine.begin(), mine.end(), out);
    }
    std::shuffle(first, out, rng);
  }
}

void MapsSource::Expect(const int64_t* rows, int64_t count) {
  {
    for (int64_t k = 0; k < count; ++k)  // all checked before any is counted
      if (rows[k] < 0 || rows[k] >= n)
        Throw(ErrorKind::kInternal, fmt::format("maps {}: row {} expected of {}", idx_.object, rows[k], n));
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t k = 0; k < count; ++k) ++pending_[static_cast<size_t>(PartOf(rows[k]))];
    queue_.insert(queue_.end(), rows, rows + count);
  }
  fetch_cv_.notify_all();
}

void MapsSource::Drop(int64_t p) {
  const auto i = static_cast<size_t>(p);
  held_bytes_ -= static_cast<int64_t>(held_[i].size());
  std::string().swap(held_[i]);
  state_[i] = 0;
}

void MapsSource::Fetch() {
  std::unique_lock<std::mutex> lock(mu_);
  std::string bytes;
  for (;;) {
    scan_ = std::max(scan_, head_);  // a row read already needs nothing fetched
    while (scan_ < queue_.size() && state_[static_cast<size_t>(PartOf(queue_[scan_]))] != 0) ++scan_;
    if (stop_) return;
    const bool work = scan_ < queue_.size() && !error_;
    const int64_t p = work ? PartOf(queue_[scan_]) : 0;
    const int64_t want = work ? (idx_.PartHi(p) - idx_.PartLo(p)) * idx_.dim * (idx_.half ? 2 : 4) : 0;
    // Ahead only within keep_bytes; what the batch being read needs, and a first part, always.
    if (!work || (streamed() && held_bytes_ > 0 && held_bytes_ + want > keep_ && scan_ >= need_end_)) {
      fetch_cv_.wait(lock);
      continue;
    }
    state_[static_cast<size_t>(p)] = 1;
    held_bytes_ += want;
    stats_.peak_bytes = std::max(stats_.peak_bytes, held_bytes_);
    lock.unlock();
    std::exception_ptr failed;
    const std::string name = workflow::FeaturesPartObject(idx_.object, p);
    try {
      store_.GetInto(name, bytes);
      if (static_cast<int64_t>(bytes.size()) != want)
        Throw(ErrorKind::kCorrupt,
              fmt::format("NAM object '{}': {} bytes, expected {} ({} rows x {} {})", name, bytes.size(), want,
                          idx_.PartHi(p) - idx_.PartLo(p), idx_.dim, idx_.half ? "float16" : "float32"));
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    held_bytes_ -= want;
    if (failed) {
      state_[static_cast<size_t>(p)] = 0;
      error_ = failed;
    } else {
      held_[static_cast<size_t>(p)].swap(bytes);
      held_bytes_ += static_cast<int64_t>(held_[static_cast<size_t>(p)].size());
      state_[static_cast<size_t>(p)] = 2;
      ++stats_.parts_read;
      stats_.bytes_read += want;
      if (streamed() && pending_[static_cast<size_t>(p)] == 0) Drop(p);  // its rows' expectations dropped meanwhile
    }
    ready_cv_.notify_all();
  }
}

void MapsSource::Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
                       std::vector<kernels::TensorDims>* batch_dims) {
  std::unique_lock<std::mutex> lock(mu_);
  // Rows read out of the expected order: the expectations are dropped and these rows expected.
  if (queue_.size() - head_ < static_cast<size_t>(count) ||
      !std::equal(rows, rows + count, queue_.begin() + static_cast<ptrdiff_t>(head_))) {
    for (size_t k = head_; k < queue_.size(); ++k) --pending_[static_cast<size_t>(PartOf(queue_[k]))];
    queue_.clear();
    head_ = scan_ = 0;
    for (int64_t p = 0; p < idx_.parts; ++p)
      if (streamed() && state_[static_cast<size_t>(p)] == 2 && pending_[static_cast<size_t>(p)] == 0) Drop(p);
    lock.unlock();
    Expect(rows, count);
    lock.lock();
  }
  need_end_ = head_ + static_cast<size_t>(count);
  fetch_cv_.notify_all();
  auto held = [&] {
    for (int64_t k = 0; k < count; ++k)
      if (state_[static_cast<size_t>(PartOf(rows[k]))] != 2) return false;
    return true;
  };
  if (!held() && !error_) {
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lock, [&] { return error_ || held(); });
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (error_) std::rethrow_exception(error_);
  out->resize(dims.size());
  batch_dims->resize(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    (*out)[i].resize(static_cast<size_t>(count * sizes_[i]));
    (*batch_dims)[i] = dims[i];
    (*batch_dims)[i].insert((*batch_dims)[i].begin(), count);
  }
  for (int64_t k = 0; k < count; ++k) {
    const int64_t p = PartOf(rows[k]);
    const int64_t at = (rows[k] - idx_.PartLo(p)) * idx_.dim;  // the row's first value in its part
    const std::string& part = held_[static_cast<size_t>(p)];
    int64_t off = 0;
    for (size_t i = 0; i < dims.size(); ++i) {
      float* o = (*out)[i].data() + k * sizes_[i];
      const auto m = static_cast<size_t>(sizes_[i]);
      if (idx_.half)
        kernels::HalfToFloat(reinterpret_cast<const uint16_t*>(part.data()) + at + off, o, m);
      else
        std::memcpy(o, reinterpret_cast<const float*>(part.data()) + at + off, m * sizeof(float));
      off += sizes_[i];
    }
    --pending_[static_cast<size_t>(p)];
  }
  head_ += static_cast<size_t>(count);
  need_end_ = head_;
  if (streamed())
    for (int64_t k = 0; k < count; ++k) {
      const int64_t p = PartOf(rows[k]);
      if (state_[static_cast<size_t>(p)] == 2 && pending_[static_cast<size_t>(p)] == 0) Drop(p);
    }
  if (head_ == queue_.size() || head_ > (size_t{1} << 16)) {  // the rows read go
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(head_));
    scan_ -= std::min(scan_, head_);
    head_ = 0;
    need_end_ = 0;
  }
  lock.unlock();
  fetch_cv_.notify_all();
}

}  // namespace msaflow::modules
