// Step 2a (DAM): images prepared for each backbone and run through it once per dataset split
// (a halving round's training subset grows from the rows the round before and rung 0 computed);
// the features go to the NAM under a content key (modules/features.h). Sharded by parts: the
// rows are cut into parts of whole 64-image batches, each rank computes a contiguous run of
// parts and writes them itself, and rank 0 writes the features object last, once every part
// is in; the objects are byte-identical for any number of ranks. The data manager overlaps
// the work: batch i + 1 is prepared (the FPGA's job on the DAM) while the backbone runs on
// batch i, and a finished part is written to the NAM while the next one is computed. Batches
// are prepared on the task's FPGA backend (kernels/fpga/device.h); the results give the time
// measured here and, when the machine file describes the target board, the modelled time there.
#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/error.h"
#include "kernels/dataset.h"
#include "kernels/executor.h"
#include "kernels/fpga/device.h"
#include "kernels/half.h"
#include "kernels/onnx_graph.h"
#include "modules/features.h"
#include "modules/finetune_maps.h"
#include "modules/int8_calibration.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "workflow/objects.h"
#include "workflow/rung0_features.h"

namespace msaflow::modules {
namespace {

constexpr int64_t kBatch = 64;

// The images a backbone runs on at once: 64, or the fixed batch its model was exported with
// (input.batch; the last batch is then padded to it).
int64_t BatchOf(const workflow::BackboneSpec& bb) { return bb.input.batch > 0 ? bb.input.batch : kBatch; }

// What one rank did for one (backbone, split).
struct PartWork {
  int64_t rows = 0, parts = 0;
  int64_t reused_rows = 0;  // rows whose features were known (rung 0's, the last round's), not run through the backbone here
  std::string spot_check;   // with reused rows: how the one of them computed again compared
  OverlapStats batches;     // fetch: preparing a batch; consume: the backbone on it
  double put_s = 0;         // writing parts to the NAM
  double put_wait_s = 0;    // ... the part of it the computation waited for
};

// Rung 0's features of one row differ from what this rank computes for it: none of them is used.
struct SpotCheckFailed {
  std::string why;
};

// One backbone's features of a split, computed in a pass over its images (alone, or with the
// other cuts of its model).
struct Member {
  const workflow::BackboneSpec* bb = nullptr;
  FeaturesIndex idx;                            // all members of a pass share n, part_rows and parts
  const workflow::SubsetFeatures* known = nullptr;  // known features of some rows (KnownTrainRows), or null
  // A fine-tuning backbone's maps (modules/finetune_maps.h) computed in its features' pass: its
  // rows are every tail input's values for one image (idx.dim of them), its object a maps object.
  bool maps = false;
  nlohmann::json map_inputs;  // [{name, dims}], as the maps object's metadata lists them
};

// Whether two runs of floats hold the same bits; the first index that differs goes to `first`.
bool SameBits(const float* a, const float* b, int64_t n, int64_t* first) {
  for (int64_t i = 0; i < n; ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      *first = i;
      return false;
    }
  return true;
}

// Whether a computed row and a known one hold what the member stores the same: the same float32
// bits, or for float16 features the same bits once narrowed (a known float16 row was widened).
bool SameValues(const Member& m, const float* a, const float* b, int64_t n, int64_t* first) {
  if (!m.idx.half) return SameBits(a, b, n, first);
  for (int64_t i = 0; i < n; ++i)
    if (kernels::FloatToHalfScalar(a[i]) != kernels::FloatToHalfScalar(b[i])) {
      *first = i;
      return false;
    }
  return true;
}

// Which of a rank's rows [lo, hi) a pass computes, given known features (the same rows for
// every member, else none is used): all of them, or the first known row (to be checked) and the
// rows not known, ascending, with their images gathered.
struct RowsToCompute {
  const workflow::SubsetFeatures* known = nullptr;  // members[0]'s, standing for the rows of all
  size_t k0 = 0, k1 = 0;                            // known->rows[k0, k1) lie in [lo, hi)
  std::vector<int64_t> list;                        // reusing: the rows computed, in order
  kernels::ImageSet gathered;                       // ... and their images
  bool reuse() const { return k1 > k0; }
};

RowsToCompute PlanRows(const std::vector<Member>& members, const kernels::ImageSet& ds, int64_t lo, int64_t hi) {
  RowsToCompute r;
  r.known = members[0].known;
  for (const Member& m : members)
    if (!m.known || !m.bb->prepared() || m.known->rows != r.known->rows) r.known = nullptr;
  if (!r.known) return r;
  const auto& rows = r.known->rows;
  r.k0 = static_cast<size_t>(std::lower_bound(rows.begin(), rows.end(), lo) - rows.begin());
  r.k1 = static_cast<size_t>(std::lower_bound(rows.begin(), rows.end(), hi) - rows.begin());
  if (!r.reuse()) return r;
  r.list.reserve(static_cast<size_t>(hi - lo) - (r.k1 - r.k0) + 1);
  r.list.push_back(rows[r.k0]);
  for (int64_t row = lo, k = static_cast<int64_t>(r.k0); row < hi; ++row) {
    if (k < static_cast<int64_t>(r.k1) && rows[static_cast<size_t>(k)] == row) {
      ++k;
      continue;
    }
    r.list.push_back(row);
  }
  std::vector<int64_t> local(r.list.size());
  for (size_t i = 0; i < r.list.size(); ++i) local[i] = r.list[i] - lo;
  r.gathered = kernels::Subset(ds, local);
  return r;
}

// The parts of a pass's members for parts [p0, p1): filled in any order, written to the NAM in
// order, each (every member's) once every row below its end is final, while the next is
// computed; the known rows are copied in as a part is written.
class PartWriter {
 public:
  PartWriter(StepContext& c, const std::vector<Member>& members, const RowsToCompute& rows, int64_t p0, int64_t p1,
             PartWork& w)
      : c_(c), members_(members), rows_(rows), at_(members[0].idx), next_(p0), p1_(p1), w_(w),
        in_flight_(members.size()), halves_(members.size()) {}
  PartWriter(const PartWriter&) = delete;
  PartWriter& operator=(const PartWriter&) = delete;

  // Member j's buffer for part p (rows from PartLo(p)).
  float* Buffer(int64_t p, size_t j) {
    auto it = open_.find(p);
    if (it == open_.end()) {
      std::vector<std::vector<float>> bufs(members_.size());
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (!spare_.empty()) {
          bufs[i] = std::move(spare_.back());
          spare_.pop_back();
        }
        bufs[i].resize(static_cast<size_t>(at_.part_rows * members_[i].idx.dim));
      }
      it = open_.emplace(p, std::move(bufs)).first;
    }
    return it->second[j].data();
  }
  // Every row below `below` is final: the parts it completes are written.
  void WriteFinished(int64_t below) {
    while (next_ < p1_ && at_.PartHi(next_) <= below) Write(next_++);
  }
  // The last parts (of known rows only, if any), and the wait for the last write.
  void Finish() {
    WriteFinished(std::numeric_limits<int64_t>::max());
    WaitForWrite();
  }

 private:
  void WaitForWrite() {
    auto t0 = SteadyClock::now();
    writer_.Wait();  // rethrows a failed write
    w_.put_wait_s += SecondsSince(t0);
  }
  void Write(int64_t p) {
    for (size_t j = 0; j < members_.size(); ++j) {  // the known rows of this part
      float* o = Buffer(p, j);
      const int64_t dim = members_[j].idx.dim;
      for (size_t k = rows_.k0; k < rows_.k1; ++k) {
        const int64_t r = rows_.known->rows[k];
        if (r < at_.PartLo(p) || r >= at_.PartHi(p)) continue;
        std::copy_n(members_[j].known->values.begin() + static_cast<int64_t>(k) * dim, dim, o + (r - at_.PartLo(p)) * dim);
      }
    }
    WaitForWrite();  // the part written before is in: its buffers are free
    for (auto& b : in_flight_)
      if (!b.empty()) spare_.push_back(std::move(b));
    in_flight_ = std::move(open_.at(p));
    open_.erase(p);
    std::vector<std::string_view> data(members_.size());
    for (size_t j = 0; j < members_.size(); ++j) {
      const size_t values = static_cast<size_t>((at_.PartHi(p) - at_.PartLo(p)) * members_[j].idx.dim);
      data[j] = std::string_view(reinterpret_cast<const char*>(in_flight_[j].data()), values * sizeof(float));
      if (members_[j].idx.half) {
        NarrowFeatures(members_[j].bb->name, in_flight_[j].data(), values, halves_[j]);
        data[j] = std::string_view(reinterpret_cast<const char*>(halves_[j].data()), values * sizeof(uint16_t));
      }
    }
    auto put = [this, p, data] {
      auto t0 = SteadyClock::now();
      for (size_t j = 0; j < data.size(); ++j) {
        const FeaturesIndex& idx = members_[j].idx;
        // Maps come in parts of their own size, a whole number of them to the features' part.
        const int64_t per = at_.part_rows / idx.part_rows, value = idx.half ? 2 : 4;
        for (int64_t q = p * per; q < (p + 1) * per && idx.PartLo(q) < idx.n; ++q) {
          const std::string_view bytes =
              data[j].substr(static_cast<size_t>((idx.PartLo(q) - at_.PartLo(p)) * idx.dim * value),
                             static_cast<size_t>((idx.PartHi(q) - idx.PartLo(q)) * idx.dim * value));
          c_.store->Put(workflow::FeaturesPartObject(idx.object, q), bytes,
                        {{"kind", members_[j].maps ? "maps-part" : "features-part"},
                         {"part", q},
                         {"rows", idx.PartHi(q) - idx.PartLo(q)},
                         {"dim", idx.dim}});
        }
      }
      w_.put_s += SecondsSince(t0);
    };
    if (c_.overlap != OverlapMode::kOff) {  // a write needs no result back: always behind the computing
      writer_.Submit(put);
    } else {
      auto t0 = SteadyClock::now();
      put();
      w_.put_wait_s += SecondsSince(t0);
    }
  }

  StepContext& c_;
  const std::vector<Member>& members_;
  const RowsToCompute& rows_;
  const FeaturesIndex& at_;  // the rows and parts of every member
  int64_t next_, p1_;        // the next part to write; the end
  PartWork& w_;
  std::map<int64_t, std::vector<std::vector<float>>> open_;  // parts being filled, a buffer per member
  std::vector<std::vector<float>> spare_;                    // buffers of parts written, for the next ones
  std::vector<std::vector<float>> in_flight_;                // the part being written, per member
  std::vector<std::vector<uint16_t>> halves_;                // ... narrowed to float16
  Worker writer_;  // last: it finishes (its destructor waits) before the buffers go
};

// Computes parts [p0, p1) of every member's features from `ds` (the images of those parts' rows,
// the first being row PartLo(p0)) in one pass of `ex` (a cut of each member, in order; null for
// pixels) and writes each part to the NAM as it is finished. The rows whose features are known
// (rung 0's, or a halving round's before: the same rows for every member, else none is used)
// are not run through the backbone: the first of them is, in the first batch, and must come out
// as it was known, bit for bit, for every member (SpotCheckFailed otherwise, before any part is
// written).
PartWork ComputeParts(StepContext& c, const std::vector<Member>& members, kernels::Executor* ex,
                      const kernels::ImageSet& ds, int64_t p0, int64_t p1, const std::string& label) {
  PartWork w;
  if (p0 >= p1) return w;
  const workflow::BackboneSpec& bb = *members[0].bb;  // the members' input and batch are one (SharePass)
  const FeaturesIndex& at = members[0].idx;           // ... and so are their rows and parts
  const int64_t lo = at.PartLo(p0), hi = at.PartHi(p1 - 1);
  w.rows = hi - lo;
  w.parts = p1 - p0;
  const RowsToCompute rows = PlanRows(members, ds, lo, hi);
  const bool reuse = rows.reuse();
  if (reuse) w.reused_rows = static_cast<int64_t>(rows.k1 - rows.k0) - 1;  // the spot-checked one runs again
  const kernels::ImageSet& images = reuse ? rows.gathered : ds;
  const int64_t m = reuse ? static_cast<int64_t>(rows.list.size()) : hi - lo;
  auto row_of = [&](int64_t k) { return reuse ? rows.list[static_cast<size_t>(k)] : lo + k; };
  // Once items [0, k) are placed, every row below this one has its features (computed or known).
  auto final_below = [&](int64_t k) -> int64_t {
    if (reuse && k == 0) return m > 1 ? rows.list[1] : hi;  // item 0 is a known row
    return k < m ? row_of(k) : hi;
  };
  PartWriter parts(c, members, rows, p0, p1, w);
  if (!bb.prepared()) {  // raw pixels as read: the bytes / 255 (a pass of one)
    const int64_t dim = at.dim;
    for (int64_t p = p0; p < p1; ++p) {
      auto t0 = SteadyClock::now();
      float* o = parts.Buffer(p, 0);
      const uint8_t* src = ds.Image(at.PartLo(p) - lo);
      for (int64_t i = 0, n = (at.PartHi(p) - at.PartLo(p)) * dim; i < n; ++i) o[i] = static_cast<float>(src[i]) / 255.f;
      w.batches.consume_s += SecondsSince(t0);
      parts.WriteFinished(at.PartHi(p));
    }
    parts.Finish();
    return w;
  }
  const auto& in = bb.input;
  kernels::fpga::Device* fpga = &c.Fpga();  // opened here, before the data manager's thread uses it
  const int64_t B = BatchOf(bb), per = in.channels * in.height * in.width;
  const int64_t batches = (m + B - 1) / B;
  std::vector<float> batch[2];
  for (auto& b : batch) b.resize(static_cast<size_t>(B * per));
  int64_t next_report = batches / 4;
  w.batches = Overlap(
      batches,
      [&](int64_t i) {
        const int64_t s = i * B, b = std::min(B, m - s);
        kernels::fpga::PrepareImages(*fpga, images, 0, s, b, in, batch[i % 2].data());
        if (in.batch > 0 && b < B)  // a model with a fixed batch gets whole batches: zeros after the last image
          std::fill(batch[i % 2].begin() + b * per, batch[i % 2].end(), 0.f);
      },
      [&](int64_t i) {
        const int64_t s = i * B, b = std::min(B, m - s);
        std::vector<std::vector<float>> f, maps;
        std::vector<std::vector<int64_t>> map_dims;
        const int64_t n = in.batch > 0 ? B : b;
        if (ex && members.back().maps)  // one backbone and its maps: the trunk once for both
          f = {ex->FeaturesAndMaps(batch[i % 2].data(), n, in.channels, in.height, in.width, &maps, &map_dims)};
        else if (ex)
          f = ex->FeaturesOfCuts(batch[i % 2].data(), n, in.channels, in.height, in.width);
        for (size_t j = 0; j < members.size(); ++j) {
          const int64_t dim = members[j].idx.dim;
          if (members[j].maps) {  // a row: each input's values for the image, one input after another
            for (int64_t k = s; k < s + b; ++k) {
              const int64_t r = row_of(k), p = r / at.part_rows;
              float* o = parts.Buffer(p, j) + (r - at.PartLo(p)) * dim;
              for (size_t t = 0; t < maps.size(); ++t) {
                const int64_t size = kernels::NumElements(map_dims[t]) / n;
                o = std::copy_n(maps[t].begin() + (k - s) * size, size, o);
              }
            }
            continue;
          }
          const float* v = ex ? f[j].data() : batch[i % 2].data();  // resized raw pixels: the prepared images are the features
          for (int64_t k = s; k < s + b; ++k, v += dim) {
            if (reuse && k == 0) {  // the spot check
              const float* had = members[j].known->values.data() + static_cast<int64_t>(rows.k0) * dim;
              if (int64_t d = 0; !SameValues(members[j], v, had, dim, &d))
                throw SpotCheckFailed{fmt::format("{}, row {}, value {}: {:.9g} here, {:.9g} known",
                                                  members[j].bb->name, rows.list[0], d, v[d], had[d])};
              continue;
            }
            const int64_t r = row_of(k), p = r / at.part_rows;
            std::copy_n(v, dim, parts.Buffer(p, j) + (r - at.PartLo(p)) * dim);
          }
        }
        if (reuse && s == 0) w.spot_check = fmt::format("row {} computed again: identical", rows.list[0]);
        parts.WriteFinished(final_below(s + b));
        if (i + 1 == next_report && i + 1 < batches) {
          c.Say(fmt::format("progress: features {} {}/{} images", label, s + b, m));
          next_report += batches / 4;
        }
      },
      c.Overlapping("image batches " + bb.name));
  parts.Finish();
  return w;
}

// The preparation time measured on every rank, and what the target board would take
// (kernels/fpga/cost_model.h), for one (backbone, split).
nlohmann::json PrepareFpgaTimes(const StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                                const kernels::ImageSet& mine, const std::vector<std::string>& per_rank) {
  double measured = 0;
  for (const auto& s : per_rank) measured += nlohmann::json::parse(s).value("prepare_s", 0.0);
  const int64_t n = src.count();
  nlohmann::json j = {{"images", n}, {"measured_s", measured},
                      {"images_per_s", measured > 0 ? static_cast<double>(n) / measured : 0.0}};
  const auto& t = c.task.fpga.target;
  if (t.given()) {
    const auto& in = bb.input;
    // Rank 0's images stand for the size of them all (an image folder's sizes vary).
    const int64_t r = mine.count ? mine.Rows(0) : in.height, k = mine.count ? mine.Cols(0) : in.width;
    auto m = kernels::fpga::ModelPrepare(t, n, r, k, mine.channels, in.height, in.width, in.channels, 4);
    j["modelled"] = {{"seconds", m.seconds()}, {"bound", m.bound()}, {"target", t.name},
                     {"note", "modelled from the machine file's target figures, not measured"}};
  }
  return j;
}

}  // namespace

namespace {

// When every backbone's features of every split are in the NAM already (their keys from the
// cached dataset digests), prepare reads no image at all: the reused entries go to `summary`
// and true is returned on every rank. Rank 0 decides.
bool EverythingReused(StepContext& c, nlohmann::json* summary) {
  int all = 0;
  nlohmann::json reused = nlohmann::json::array();
  if (c.root()) {
    all = 1;
    for (const auto& bb : c.pipeline().backbones) {
      const std::string bb_digest = BackboneDigest(*c.store, bb);
      for (const std::string& split : workflow::SplitNames(c.pipeline(), c.task.test)) {
        const std::string key = workflow::FeaturesObject(bb_digest, c.DatasetDigest(split));
        const auto info = c.store->Stat(key);
        if (!info || !info->meta.contains("part_rows")) {
          all = 0;
          break;
        }
        reused.push_back({{"backbone", bb.name}, {"split", split}, {"object", key},
                          {"rows", info->meta.value("rows", int64_t{0})}});
      }
      if (!all) break;
    }
  }
  c.comm->Bcast(&all, sizeof all, 0);
  if (!all || !c.root()) return all == 1;
  for (const auto& bb : c.pipeline().backbones) c.inputs["backbones"][bb.name] = BackboneDigest(*c.store, bb);
  for (const std::string& split : workflow::SplitNames(c.pipeline(), c.task.test))
    c.inputs["datasets"][split] = c.DatasetDigest(split);
  for (const auto& e : reused)
    c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", e["backbone"].get<std::string>(),
                      e["split"].get<std::string>(), e["object"].get<std::string>()));
  c.Say(fmt::format("every features object was there: no image read ({} of {} dataset digest(s) from the cache)",
                    c.digest_cache_hits(), workflow::SplitNames(c.pipeline(), c.task.test).size()));
  (*summary)["reused"] = std::move(reused);
  return true;
}

// A split's dataset digest, recorded among the step's inputs. Looking for reusable features
// may have hashed the split already (not twice).
std::string DatasetDigest(StepContext& c, const workflow::SplitSource& src) {
  const std::string& split = src.name();
  std::string digest;
  if (const std::string* known = c.KnownDatasetDigest(split)) {
    digest = *known;
  } else {
    digest = src.Digest();
    c.RememberDatasetDigest(split, digest);
  }
  c.inputs["datasets"][split] = digest;
  return digest;
}

// The width of backbone `bb`'s features: raw pixels' row size, or the cut tensor's channels of
// the backbone's executor (built from the NAM's copy on first use, int8 with the load step's
// ranges, the same for every rank).
int64_t FeatureDim(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                   std::unique_ptr<kernels::Executor>& ex) {
  if (bb.kind == workflow::BackboneKind::kPixels) {
    if (bb.prepared()) return bb.input.channels * bb.input.height * bb.input.width;
    kernels::ImageSet first = src.Read(0, 1);
    if (!first.uniform())
      Throw(ErrorKind::kInvalidInput, "backbone '" + bb.name + "' (raw pixels) needs images of one size; " +
                                          src.Where(-1) + " is an image folder, whose sizes may vary: give the backbone "
                                          "an \"input\": {\"height\", \"width\"} to resize them to");
    return first.rows * first.cols * first.channels;
  }
  if (!ex) {
    nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
    ex = std::make_unique<kernels::Executor>(kernels::ImportOnnx(o.bytes, "NAM " + o.info.name, bb.feature_layer),
                                             bb.precision);
    if (bb.precision == kernels::Precision::kInt8)
      ex->SetRanges(RangesFromJson(o.info.meta.value("int8_ranges", nlohmann::json()), "NAM object '" + o.info.name + "'"));
  }
  return ex->FeatureDim(bb.input.channels, bb.input.height, bb.input.width);
}

// The checksum of the training split's stamp as a whole (a subset's rows are part of it).
std::string WholeTrainStamp(const workflow::Pipeline& p) {
  workflow::Pipeline whole = p;
  whole.train.subset_fraction = 1;
  return ChecksumHex(workflow::SplitStamp(whole, "train"));
}

// The features rung 0 of the halving strategy computed for `bb` on rows of the training split
// (orchestrator/halving.h), when they are of this very backbone (digest) and split (stamp);
// anything else is said and left: every row is then computed here.
std::optional<workflow::SubsetFeatures> Rung0Features(StepContext& c, const workflow::BackboneSpec& bb,
                                                      const std::string& bb_digest, const std::string& whole_stamp,
                                                      int64_t rows, int64_t dim) {
  if (c.pipeline().rounds.strategy != workflow::Strategy::kHalving || bb.kind == workflow::BackboneKind::kPixels)
    return std::nullopt;
  const std::string obj = workflow::Rung0FeaturesObject(c.task.run, bb.name);
  const auto info = c.store->Stat(obj);
  if (!info) return std::nullopt;
  auto unused = [&](const std::string& why) -> std::optional<workflow::SubsetFeatures> {
    if (c.root()) c.Say(fmt::format("features {}/train: rung 0's {} not used: {}", bb.name, obj, why));
    return std::nullopt;
  };
  if (info->meta.value("backbone_digest", "") != bb_digest)
    return unused("computed for backbone digest " + info->meta.value("backbone_digest", std::string("(none)")) +
                  ", the NAM's is " + bb_digest);
  if (info->meta.value("split_stamp", "") != whole_stamp)
    return unused("the training split's files changed since rung 0");
  try {
    workflow::SubsetFeatures s =
        workflow::ParseSubsetFeatures(c.store->Get(obj).bytes, info->meta, rows, "NAM object '" + obj + "'");
    if (s.dim != dim) return unused(fmt::format("{} features a row, the backbone gives {}", s.dim, dim));
    return s;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kCorrupt && e.kind() != ErrorKind::kNotFound) throw;
    return unused(e.what());
  }
}

// halving: the features the previous round's prepare wrote for `bb` on its (smaller) subset of
// the training split, with their rows as positions in the whole split; nothing when that round
// trained on the whole split too, or when they are not of this backbone, these files or this
// split's order (said, and left: those rows are then computed here).
std::optional<workflow::SubsetFeatures> PreviousRoundFeatures(StepContext& c, const workflow::BackboneSpec& bb,
                                                              const std::string& bb_digest, const std::string& whole_stamp,
                                                              const workflow::SplitSource& src, int64_t dim) {
  if (c.pipeline().rounds.strategy != workflow::Strategy::kHalving || c.task.round < 2 ||
      bb.kind == workflow::BackboneKind::kPixels)
    return std::nullopt;
  const auto summary_info = c.store->Stat(workflow::PreparedObject(c.task.run, c.task.round - 1));
  if (!summary_info) return std::nullopt;
  const nlohmann::json summary = nlohmann::json::parse(c.store->Get(summary_info->name).bytes, nullptr, false);
  std::string obj;
  for (const char* kind : {"computed", "reused"})
    if (summary.is_object() && summary.contains(kind) && summary[kind].is_array())
      for (const auto& e : summary[kind])
        if (e.is_object() && e.value("backbone", "") == bb.name && e.value("split", "") == "train")
          obj = e.value("object", "");
  if (obj.empty()) return std::nullopt;
  const auto info = c.store->Stat(obj);
  if (!info || !info->meta.contains("subset") || !info->meta["subset"].is_object()) return std::nullopt;
  const std::string label = fmt::format("round {}'s {}", c.task.round - 1, obj);
  auto unused = [&](const std::string& why) -> std::optional<workflow::SubsetFeatures> {
    if (c.root()) c.Say(fmt::format("features {}/train: {} not used: {}", bb.name, label, why));
    return std::nullopt;
  };
  const nlohmann::json& sub = info->meta["subset"];
  if (info->meta.value("backbone_digest", "") != bb_digest) return unused("another backbone digest");
  if (sub.value("whole_stamp", "") != whole_stamp ||
      sub.value("whole_rows", int64_t{-1}) != src.whole_count())
    return unused("the training split's files changed since");
  try {
    const std::vector<int64_t> positions =
        src.SubsetPositions(sub.at("fraction").get<double>(), sub.at("seed").get<uint64_t>());
    Features f = LoadFeaturesObject(*c.store, obj, c.Overlapping("features of round " + std::to_string(c.task.round - 1)));
    if (f.n != static_cast<int64_t>(positions.size()) || f.dim != dim)
      return unused(fmt::format("{} rows of {} features, expected {} of {}", f.n, f.dim, positions.size(), dim));
    const std::vector<int64_t> mine = src.Positions();  // the labels must be the whole split's at those positions
    const std::vector<uint8_t>& labels = src.labels();
    for (size_t i = 0, k = 0; i < positions.size(); ++i) {
      while (k < mine.size() && mine[k] < positions[i]) ++k;
      if (k < mine.size() && mine[k] == positions[i] && labels[k] != f.labels[i])
        return unused(fmt::format("row {} has label {}, the split's is {}", i, f.labels[i], labels[k]));
    }
    workflow::SubsetFeatures s;
    s.backbone = bb.name;
    s.backbone_digest = bb_digest;
    s.dim = dim;
    s.rows = positions;
    s.values = std::move(f.x);
    return s;
  } catch (const nlohmann::json::exception& e) {
    return unused(std::string("its subset metadata: ") + e.what());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kCorrupt && e.kind() != ErrorKind::kNotFound) throw;
    return unused(e.what());
  }
}

// The features of `bb` on the training split `src` that are known already: rung 0's and the
// previous round's (positions in the whole split), those of `src`'s rows, with the rows
// renumbered as `src` numbers them (ascending). `from` says where they came from.
std::optional<workflow::SubsetFeatures> KnownTrainRows(StepContext& c, const workflow::BackboneSpec& bb,
                                                       const std::string& bb_digest, const std::string& whole_stamp,
                                                       const workflow::SplitSource& src, int64_t dim, std::string* from) {
  std::optional<workflow::SubsetFeatures> sources[2] = {
      PreviousRoundFeatures(c, bb, bb_digest, whole_stamp, src, dim),
      Rung0Features(c, bb, bb_digest, whole_stamp, src.whole_count(), dim)};
  const char* names[2] = {"the previous round", "rung 0"};
  const std::vector<int64_t> mine = src.Positions();
  workflow::SubsetFeatures out;
  out.backbone = bb.name;
  out.backbone_digest = bb_digest;
  out.dim = dim;
  std::vector<size_t> at(2, 0);
  int64_t counts[2] = {0, 0};
  for (size_t i = 0; i < mine.size(); ++i) {
    for (int k = 0; k < 2; ++k) {
      if (!sources[k]) continue;
      const auto& rows = sources[k]->rows;
      while (at[k] < rows.size() && rows[at[k]] < mine[i]) ++at[k];
      if (at[k] < rows.size() && rows[at[k]] == mine[i]) {
        out.rows.push_back(static_cast<int64_t>(i));
        const auto v = sources[k]->values.begin() + static_cast<int64_t>(at[k]) * dim;
        out.values.insert(out.values.end(), v, v + dim);
        ++counts[k];
        break;
      }
    }
  }
  if (out.rows.empty()) return std::nullopt;
  for (int k = 0; k < 2; ++k)
    if (counts[k]) *from += fmt::format("{}{} from {}", from->empty() ? "" : ", ", counts[k], names[k]);
  return out;
}

}  // namespace

namespace {

// The executor of several cuts of one model, from the NAM copy of the backbone whose cut model
// holds every other cut (the deepest of a chain); null when none does (cuts on separate branches).
std::shared_ptr<kernels::Executor> CutsExecutor(StepContext& c, const std::vector<const workflow::BackboneSpec*>& bbs) {
  std::vector<std::string> cuts;
  cuts.reserve(bbs.size());
  for (const auto* bb : bbs) cuts.push_back(bb->feature_layer);
  std::vector<std::pair<uint64_t, std::string>> by_size;  // the largest cut model first
  for (const auto* bb : bbs)
    if (auto info = c.store->Stat(workflow::BackboneObject(bb->name))) by_size.emplace_back(info->size, info->name);
  std::sort(by_size.rbegin(), by_size.rend());
  for (const auto& [size, name] : by_size) {
    const nam::Object o = c.store->Get(name);
    try {
      return std::make_shared<kernels::Executor>(kernels::ImportOnnxCuts(o.bytes, "NAM " + name, cuts));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kNotFound) throw;  // this cut model lacks a shallower cut's tensor
    }
  }
  return nullptr;
}

// What a prepare step keeps across its passes.
struct PrepareRun {
  int64_t part_bytes = 0, classes = 0;
  std::map<std::string, std::string> dataset_digests, backbone_digests;
  // The summary's entries by (backbone, split), listed at the end in the pipeline's order.
  std::map<std::pair<std::string, std::string>, std::pair<bool, nlohmann::json>> entries;  // computed?, entry
  std::map<std::string, std::unique_ptr<kernels::Executor>> own;  // a backbone's own executor, across splits
  // A fine-tuning backbone's executor cut at its feature layer and its tail's inputs (MapsMember),
  // null where one pass would not compute the features as the backbone alone does; its tail's
  // inputs with one image's dims.
  std::map<std::string, std::unique_ptr<kernels::Executor>> with_maps;
  std::map<std::string, nlohmann::json> map_inputs;
  nlohmann::json maps = nlohmann::json::array();                   // the summary's entries of the maps computed here
  std::map<std::string, std::vector<workflow::Pass>> passes;       // by the backbones they compute
  // The whole training split's stamp (WholeTrainStamp), once per step, where known features or a
  // subset need it (halving; datasets.train.subset): an image folder is listed to make it.
  std::string whole_train_stamp;
};

// Rank 0 puts member `m`'s features object (once every rank's parts are in: `stats`) and fills
// its summary entry; every rank notes the seconds, ranks and parts.
void Commit(StepContext& c, PrepareRun& run, const workflow::Pass& pass, const Member& m,
            const workflow::SplitSource& src, const kernels::ImageSet& ds, const std::vector<std::string>& stats,
            bool known, SteadyClock::time_point t0) {
  const workflow::BackboneSpec& bb = *m.bb;
  const FeaturesIndex& idx = m.idx;
  const std::string& split = src.name();
  const int size = c.comm->size();
  nlohmann::json& entry = run.entries[{bb.name, split}].second;
  double secs = SecondsSince(t0);
  if (c.root()) {
    nlohmann::json meta = FeaturesMeta(src.count(), idx.dim, run.classes, idx.part_rows, idx.half);
    meta.update({{"backbone", bb.name}, {"backbone_digest", run.backbone_digests[bb.name]},
                 {"dataset_digest", run.dataset_digests[split]}, {"split", split}});
    if (const auto& t = c.pipeline().train; split == "train" && t.subset())  // a later round's prepare grows from it
      meta["subset"] = {{"fraction", t.subset_fraction}, {"seed", t.subset_seed}, {"whole_rows", src.whole_count()},
                        {"whole_stamp", run.whole_train_stamp}};
    if (!src.class_names().empty()) meta["class_names"] = src.class_names();
    const auto& labels = src.labels();
    c.store->Put(idx.object, std::string_view(reinterpret_cast<const char*>(labels.data()), labels.size()), meta);
    secs = SecondsSince(t0);
    c.Say(fmt::format("features {}/{}: computed {} x {} in {} part{} on {} rank{} in {:.1f} s ({:.2f} ms/image){} -> {}",
                      bb.name, split, src.count(), idx.dim, idx.parts, idx.parts > 1 ? "s" : "", size,
                      size > 1 ? "s" : "", secs, 1e3 * secs / static_cast<double>(std::max<int64_t>(1, src.count())),
                      pass.bbs.size() > 1 ? " in one pass with the model's other cuts" : "", idx.object));
    entry["per_rank"] = nlohmann::json::array();
    int64_t reused = 0;
    for (const auto& s : stats) {
      entry["per_rank"].push_back(nlohmann::json::parse(s));
      reused += entry["per_rank"].back().value("reused_rows", int64_t{0});
    }
    if (known) entry["reused_rows"] = reused;  // known rows: through the backbone once, in rung 0 or a round before
    if (bb.prepared()) entry["fpga"] = PrepareFpgaTimes(c, bb, src, ds, stats);
    if (pass.bbs.size() > 1) {
      entry["one_pass_with"] = nlohmann::json::array();
      for (const auto* other : pass.bbs)
        if (other != &bb) entry["one_pass_with"].push_back(other->name);
    }
  }
  entry["seconds"] = secs;
  entry["ranks"] = size;
  entry["parts"] = idx.parts;
}

// Rank 0 puts the maps object of member `m` (MapsMember) once every rank's parts are in
// (PutMapsObject, as PrepareMaps does), and every rank notes the summary's entry.
void CommitMaps(StepContext& c, PrepareRun& run, const Member& m, const workflow::SplitSource& src,
                SteadyClock::time_point t0) {
  const workflow::BackboneSpec& bb = *m.bb;
  const FeaturesIndex& idx = m.idx;
  const int size = c.comm->size();
  const double bytes = PutMapsObject(c, bb, src, idx, run.classes, m.map_inputs, ", in the features' pass");
  run.maps.push_back({{"backbone", bb.name},
                      {"split", src.name()},
                      {"object", idx.object},
                      {"computed", true},
                      {"rows", idx.n},
                      {"bytes", bytes},
                      {"seconds", SecondsSince(t0)},
                      {"ranks", size},
                      {"with_features", true}});
}

// The maps of a fine-tuning backbone (one with "train_from", in any round), computed in its
// features' pass where that gives the same numbers as the two passes would: the pass is of that
// backbone alone, on a whole split (no subset, no features known from before), the maps not in
// the NAM yet, and its features computed by the executor cut at the tail's inputs too exactly
// as by the backbone alone (Executor::CutsAsAlone). The trunk then runs once per image for both.
// Returns the member to add (with `ex` set to the executor to run), or nothing.
std::optional<Member> MapsMember(StepContext& c, PrepareRun& run, const workflow::Pass& pass,
                                 const workflow::SplitSource& src, const Member& features, bool known,
                                 kernels::Executor** ex) {
  const workflow::BackboneSpec& bb = *pass.bbs[0];
  if (pass.bbs.size() != 1 || !bb.finetunes() || !bb.prepared() || known || c.pipeline().train.subset() ||
      bb.precision != kernels::Precision::kF32 || bb.input.batch > 0)
    return std::nullopt;
  const std::string key = MapsKey(c, bb, src.name());
  int have = c.root() && c.store->Stat(key) ? 1 : 0;  // rank 0 decides for all
  c.comm->Bcast(&have, sizeof have, 0);
  if (have) return std::nullopt;
  const auto& in = bb.input;
  if (!run.with_maps.count(bb.name)) {  // every rank builds the same from the same NAM object
    std::unique_ptr<kernels::Executor>& e = run.with_maps[bb.name];
    BackboneTails tails(c);
    const std::unique_ptr<kernels::Tail> tail = tails.Make(bb);
    std::vector<std::string> cuts{bb.feature_layer};
    cuts.insert(cuts.end(), tail->inputs().begin(), tail->inputs().end());
    const nam::Object o = c.store->Get(workflow::BackboneObject(bb.name));
    try {
      e = std::make_unique<kernels::Executor>(kernels::ImportOnnxCuts(o.bytes, "NAM " + o.info.name, cuts));
    } catch (const Error&) {
      e = nullptr;  // the cut model cannot be cut so (a tail input past its feature layer): two passes
    }
    if (e && !e->CutsAsAlone(in.channels, in.height, in.width)[0]) e = nullptr;
    if (e) {
      const std::vector<float> one(static_cast<size_t>(in.channels * in.height * in.width), 0.f);
      std::vector<std::vector<float>> maps;
      std::vector<std::vector<int64_t>> dims;
      e->FeaturesAndMaps(one.data(), 1, in.channels, in.height, in.width, &maps, &dims);
      nlohmann::json inputs = nlohmann::json::array();
      for (size_t i = 0; i < dims.size(); ++i)
        inputs.push_back(
            {{"name", tail->inputs()[i]}, {"dims", kernels::TensorDims(dims[i].begin() + 1, dims[i].end())}});
      run.map_inputs[bb.name] = inputs;
    }
  }
  if (!run.with_maps.at(bb.name)) return std::nullopt;
  Member m;
  m.bb = &bb;
  m.maps = true;
  m.map_inputs = run.map_inputs.at(bb.name);
  m.idx = features.idx;  // the same rows, written with the features' parts
  m.idx.object = key;
  m.idx.half = workflow::MapsInHalf(bb, src.name());
  m.idx.dim = 0;
  for (const auto& i : m.map_inputs) m.idx.dim += kernels::NumElements(i.at("dims").get<kernels::TensorDims>());
  // Parts of about the part size, as the maps' own pass writes them (a rank streaming the maps
  // holds a few parts), a whole number of them to a features part: each written with the
  // features' part that holds its rows.
  const int64_t rows = features.idx.part_rows;
  int64_t k = 1;
  while (k < rows && (rows % k != 0 || rows / k * m.idx.dim * static_cast<int64_t>(sizeof(float)) > run.part_bytes))
    ++k;
  m.idx.part_rows = rows / k;
  m.idx.parts = (m.idx.n + m.idx.part_rows - 1) / m.idx.part_rows;
  *ex = run.with_maps.at(bb.name).get();
  return m;
}

// One pass over split `src` for the backbones of `pass`: this rank's parts computed and written,
// then (rank 0) each features object and its summary entry.
void ComputePass(StepContext& c, PrepareRun& run, const workflow::Pass& pass, const workflow::SplitSource& src) {
  const int rank = c.comm->rank(), size = c.comm->size();
  const std::string& split = src.name();
  auto t0 = SteadyClock::now();
  const workflow::BackboneSpec& first = *pass.bbs[0];
  std::vector<int64_t> dims;
  if (pass.ex) {
    dims = pass.ex->FeatureDimsOfCuts(first.input.channels, first.input.height, first.input.width);
  } else {
    dims.push_back(FeatureDim(c, first, src, run.own[first.name]));
  }
  std::vector<std::optional<workflow::SubsetFeatures>> known_rows(pass.bbs.size());
  std::vector<Member> members(pass.bbs.size());
  const int64_t widest = *std::max_element(dims.begin(), dims.end());
  std::string known_from;  // where the known rows came from (the first member's say for all)
  for (size_t j = 0; j < members.size(); ++j) {
    const workflow::BackboneSpec& bb = *pass.bbs[j];
    std::string from;
    if (split == "train")
      known_rows[j] = KnownTrainRows(c, bb, run.backbone_digests[bb.name], run.whole_train_stamp, src, dims[j], &from);
    if (j == 0) known_from = from;
    FeaturesIndex& idx = members[j].idx;
    idx.object = run.entries[{bb.name, split}].second["object"];
    idx.n = src.count();
    idx.dim = dims[j];
    idx.part_rows = workflow::FeaturesPartRows(widest, BatchOf(bb), run.part_bytes);  // parts of the same rows for all
    idx.parts = (idx.n + idx.part_rows - 1) / idx.part_rows;
    idx.half = bb.feature_dtype == "f16";
    members[j].bb = &bb;
    members[j].known = known_rows[j] ? &*known_rows[j] : nullptr;
  }
  kernels::Executor* ex = pass.ex ? pass.ex.get() : run.own[first.name].get();
  const bool any_known = std::any_of(members.begin(), members.end(), [](const Member& m) { return m.known; });
  if (std::optional<Member> maps = MapsMember(c, run, pass, src, members[0], any_known, &ex))
    members.push_back(std::move(*maps));
  const FeaturesIndex& at = members[0].idx;
  std::string names;
  for (const auto* bb : pass.bbs) names += (names.empty() ? "" : ", ") + bb->name;
  const std::string label = (pass.bbs.size() > 1 ? "{" + names + "}" : names) + "/" + split;
  // This rank's contiguous run of parts; only its images are read (an image folder decodes only these).
  const int64_t p0 = at.parts * rank / size, p1 = at.parts * (rank + 1) / size;
  const kernels::ImageSet ds = p0 < p1 ? src.Read(at.PartLo(p0), at.PartHi(p1 - 1)) : kernels::ImageSet{};
  const bool known = std::any_of(members.begin(), members.end(), [](const Member& m) { return m.known; });
  PartWork w;
  try {
    w = ComputeParts(c, members, ex, ds, p0, p1, label);
  } catch (const SpotCheckFailed& f) {
    c.Say(fmt::format("features {}: the known features ({}) not used: computed again, {} (this CPU's kernels "
                      "depend on the batch); every image runs through the backbone", label, known_from, f.why));
    for (Member& m : members) m.known = nullptr;
    w = ComputeParts(c, members, ex, ds, p0, p1, label);
    w.spot_check = "differed: " + f.why;
  }
  if (!w.spot_check.empty() && w.spot_check.rfind("differed", 0) != 0)
    c.Say(fmt::format("features {}: {} of rows [{}, {}) known ({}), not run through the backbone again ({})", label,
                      w.reused_rows, at.PartLo(p0), at.PartLo(p0) + w.rows, known_from, w.spot_check));
  double secs = SecondsSince(t0);
  if (size > 1)
    c.Say(fmt::format("features {}: images [{}, {}) in {:.2f} s", label, at.PartLo(p0), at.PartLo(p0) + w.rows, secs));
  nlohmann::json mine = {{"rank", rank},
                         {"rows", w.rows},
                         {"parts", w.parts},
                         {"seconds", secs},
                         {"prepare_s", w.batches.fetch_s},
                         {"backbone_s", w.batches.consume_s},
                         {"prepare_wait_s", w.batches.wait_s},
                         {"put_s", w.put_s},
                         {"put_wait_s", w.put_wait_s}};
  if (known) {
    mine["reused_rows"] = w.reused_rows;
    if (!w.spot_check.empty()) mine["spot_check"] = w.spot_check;
  }
  if (first.prepared()) mine["overlap"] = c.OverlapReport()["image batches " + first.name];
  const std::vector<std::string> stats = c.comm->Gather(mine.dump(), 0);  // after every rank's parts are in the NAM
  for (const Member& m : members)
    if (m.maps)
      CommitMaps(c, run, m, src, t0);
    else
      Commit(c, run, pass, m, src, ds, stats, known, t0);
}

// The backbones of `group` whose features of `src` are not in the NAM yet (rank 0 decides for
// all); the others' entries say they were reused.
std::vector<const workflow::BackboneSpec*> ToCompute(StepContext& c, PrepareRun& run,
                                                     const std::vector<const workflow::BackboneSpec*>& group,
                                                     const workflow::SplitSource& src) {
  const std::string& split = src.name();
  std::vector<const workflow::BackboneSpec*> todo;
  for (const auto* bb : group) {
    const std::string key = workflow::FeaturesObject(run.backbone_digests[bb->name], run.dataset_digests[split]);
    nlohmann::json entry = {{"backbone", bb->name}, {"split", split}, {"object", key}, {"rows", src.count()}};
    int reuse = 0;
    if (c.root()) {
      auto info = c.store->Stat(key);
      // Features written before they came in parts have no part_rows: computed again.
      reuse = info && info->meta.contains("part_rows") ? 1 : 0;
      if (info && !reuse)
        c.Say(fmt::format("features {}/{}: {} is in an older layout; computing it again", bb->name, split, key));
    }
    c.comm->Bcast(&reuse, sizeof reuse, 0);
    if (reuse) {
      if (c.root()) c.Say(fmt::format("features {}/{}: reused {} (backbone not run)", bb->name, split, key));
      run.entries[{bb->name, split}] = {false, std::move(entry)};
      continue;
    }
    run.entries[{bb->name, split}] = {true, std::move(entry)};
    todo.push_back(bb);
  }
  return todo;
}

// Rung 0's features (halving) have served once this step is done: removed after its done object
// is committed (a resumed run never prepares that round again).
void RemoveRung0Features(StepContext& c) {
  if (!c.root() || c.pipeline().rounds.strategy != workflow::Strategy::kHalving) return;
  for (const auto& bb : c.pipeline().backbones)
    if (const std::string obj = workflow::Rung0FeaturesObject(c.task.run, bb.name); c.store->Stat(obj))
      c.RemoveOnceDone(obj);
}

}  // namespace

void Prepare(StepContext& c) {
  nlohmann::json summary = {{"computed", nlohmann::json::array()}, {"reused", nlohmann::json::array()},
                            {"overlap", OverlapModeName(c.overlap)}};
  RemoveRung0Features(c);
  if (EverythingReused(c, &summary)) {
    summary["maps"] = PrepareMaps(c);
    summary["fpga"] = c.FpgaReport();
    if (c.root())
      c.store->Put(workflow::PreparedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "prepare-summary"}});
    c.comm->Barrier();
    return;
  }
  c.WorkAhead();
  PrepareRun run;
  run.part_bytes = workflow::FeaturesPartBytes();
  if (c.pipeline().rounds.strategy == workflow::Strategy::kHalving || c.pipeline().train.subset())
    run.whole_train_stamp = WholeTrainStamp(c.pipeline());
  // Every split's labels, checked before anything is computed; the pixels are read per rank.
  const std::vector<workflow::SplitSource> splits = workflow::OpenSplits(c.pipeline(), c.task.test);
  run.classes = workflow::CheckSplits(c.pipeline(), splits);
  for (const auto& bb : c.pipeline().backbones) {
    run.backbone_digests[bb.name] = BackboneDigest(*c.store, bb);
    c.inputs["backbones"][bb.name] = run.backbone_digests[bb.name];
  }
  for (const auto& group : workflow::PassGroups(c.pipeline())) {
    for (const workflow::SplitSource& src : splits) {
      if (!run.dataset_digests.count(src.name())) run.dataset_digests[src.name()] = DatasetDigest(c, src);
      const std::vector<const workflow::BackboneSpec*> todo = ToCompute(c, run, group, src);
      if (todo.empty()) continue;
      std::string todo_key;  // the same backbones for another split: the same passes, executors and all
      for (const auto* bb : todo) todo_key += bb->name + "\n";
      if (!run.passes.count(todo_key))  // every rank plans the same from the same NAM objects
        run.passes[todo_key] = workflow::PlanPasses(todo, [&c](const auto& bbs) { return CutsExecutor(c, bbs); });
      for (const workflow::Pass& pass : run.passes[todo_key]) ComputePass(c, run, pass, src);
    }
  }
  for (const auto& bb : c.pipeline().backbones)
    for (const workflow::SplitSource& src : splits) {
      auto& [computed, entry] = run.entries.at({bb.name, src.name()});
      summary[computed ? "computed" : "reused"].push_back(std::move(entry));
    }
  summary["maps"] = run.maps;  // computed in the features' passes, then those PrepareMaps computes or finds
  for (auto& e : PrepareMaps(c)) summary["maps"].push_back(std::move(e));
  summary["fpga"] = c.FpgaReport();
  if (c.root())
    c.store->Put(workflow::PreparedObject(c.task.run, c.task.round), summary.dump(), {{"kind", "prepare-summary"}});
  c.comm->Barrier();  // no rank reports success before the features are committed
}

}  // namespace msaflow::modules
