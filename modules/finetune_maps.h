// Fine-tuning in the steps (docs/finetune.md). prepare runs a fine-tuning backbone's frozen trunk
// once per dataset split and caches its activations at the tail's inputs (the maps) in the NAM,
// under a content key like the features'; train trains a candidate's tail with its head on the
// training maps (parallel/finetune.h); evaluate runs the selection and test maps through the
// trained tail. The tail's weights live in the candidate's model object beside its head
// (modules/model_object.h); the frozen trunk stays the backbone the load step stored.
//
// A maps object holds the labels (n bytes); its metadata gives rows, classes, the tail's inputs
// with one image's dims each, part_rows and parts. Its parts (workflow::FeaturesPartObject of
// its name) hold part_rows rows each, a row being every input's values for one image, one input
// after another, float32 (float16 where the metadata's dtype says f16: workflow::MapsInHalf).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kernels/tail.h"
#include "modules/features.h"
#include "modules/step_context.h"
#include "nam/store.h"
#include "parallel/finetune.h"
#include "workflow/datasets.h"
#include "workflow/pipeline.h"

namespace msaflow::modules {

// A split's maps, read from their NAM object a part at a time as training or evaluation reads
// their rows (parallel::FinetuneData): a thread fetches the parts of the rows expected, in the
// order they are first read, while the rows before them are computed. Parts stay as stored
// (float16 maps are widened a batch at a time).
//
// Held whole where the maps take at most `limit` bytes as stored (or limit is 0): a part, once
// read, is kept, so a rank reads each part it uses once (an evaluation rank only its shards');
// an epoch's rows are shuffled whole.
// Streamed where they take more (workflow::MapsKeepBytes): a part is dropped once the rows
// expected of it are read, and the thread fetches ahead only while the parts held stay within
// `limit` (it always fetches what the batch being read needs). An epoch's order keeps the rows
// of windows of parts together: the parts in a shuffled order, limit over twice a part's bytes
// of them a window, the window's rows shuffled. Each part is then read once an epoch, the next
// window while the rows of one are trained on. The order depends on the seed, not on the ranks.
class MapsSource : public parallel::FinetuneData {
 public:
  // Reads the object's metadata and labels; kNotFound, kCorrupt as LoadFeatures.
  MapsSource(nam::Store& store, const std::string& key, int64_t limit);
  ~MapsSource() override;
  MapsSource(const MapsSource&) = delete;
  MapsSource& operator=(const MapsSource&) = delete;

  std::vector<std::string> inputs;       // the tail's inputs, in dims' order
  std::vector<uint8_t> labels;           // every row's (y points here)
  std::vector<std::string> class_names;  // an image folder's
  int64_t classes = 0;

  bool streamed() const { return keep_ > 0; }
  int64_t bytes() const { return idx_.n * idx_.dim * (idx_.half ? 2 : 4); }  // the whole split's, as stored
  // Bytes of a whole part as stored, and the parts of a window when streamed.
  int64_t part_bytes() const;
  int64_t window_parts() const;

  void Shuffle(std::vector<int64_t>& rows, std::mt19937_64& rng) const override;
  // Throws, in the reading thread, what reading a part threw (kNotFound, kCorrupt, kIo).
  void Expect(const int64_t* rows, int64_t count) override;
  void Batch(const int64_t* rows, int64_t count, std::vector<std::vector<float>>* out,
             std::vector<kernels::TensorDims>* batch_dims) override;

  struct Stats {
    int64_t parts_read = 0;   // fetches from the NAM (a part read again counts again)
    int64_t bytes_read = 0;   // their bytes as stored
    int64_t peak_bytes = 0;   // the most the parts held (and being fetched) took at once
    double wait_seconds = 0;  // Batch waiting for parts not fetched yet
  };
  Stats stats() const;

 private:
  void Fetch();  // the fetching thread
  int64_t PartOf(int64_t row) const { return row / idx_.part_rows; }
  void Drop(int64_t p);  // under mu_

  nam::Store& store_;
  FeaturesIndex idx_;
  int64_t keep_;                // streamed: the bytes to hold at most; 0: held whole
  std::vector<int64_t> sizes_;  // floats of each input in a row
  mutable std::mutex mu_;
  std::condition_variable fetch_cv_, ready_cv_;
  std::vector<std::string> held_;              // by part: its bytes as stored while held
  std::vector<uint8_t> state_;                 // by part: 0 absent, 1 being fetched, 2 held
  std::vector<int64_t> pending_;               // by part: rows expected and not read yet
  std::vector<int64_t> queue_;                 // rows expected, in order; [head_, end) not read yet
  size_t head_ = 0, scan_ = 0, need_end_ = 0;  // scan_: rows before it have their parts fetched
  int64_t held_bytes_ = 0;
  Stats stats_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

// The maps object of backbone `bb` (which has train_from) on `split`.
std::string MapsKey(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split);

// prepare: the maps of every backbone that round c.task.round fine-tunes, on every split the
// round uses, computed (the parts shared over the ranks) where the NAM lacks them. Collective.
// Returns the summary's entries: {backbone, split, object, computed, bytes, seconds}.
nlohmann::json PrepareMaps(StepContext& c);

// The maps object of `idx` (its rows, parts and dtype; labels in the body, the tail's `inputs`
// with one image's dims in the metadata), put by rank 0 once every rank's parts are in the
// NAM, and said (`how` after the ranks: " in 1.2 s"). Returns the maps' bytes. Every rank calls it.
double PutMapsObject(StepContext& c, const workflow::BackboneSpec& bb, const workflow::SplitSource& src,
                     const FeaturesIndex& idx, int64_t classes, const nlohmann::json& inputs, const std::string& how);

// Maps held in memory (`a`, the tail's `inputs` in its order) put in `store` as the maps object
// `key`, float32, in parts of `part_rows` rows, as prepare writes maps it computes: for benches
// and tests that stream maps they made (a MapsSource reads them). Returns the bytes put.
int64_t PutMapsArrays(nam::Store& store, const std::string& key, const parallel::FinetuneArrays& a,
                      const std::vector<std::string>& inputs, int64_t classes, int64_t part_rows);

// The maps of backbone `bb` on `split`, as a MapsSource (limit as it says). kNotFound before
// prepare made them (naming the backbone and the split), kCorrupt for a malformed object.
std::unique_ptr<MapsSource> OpenMaps(StepContext& c, const workflow::BackboneSpec& bb, const std::string& split,
                                     int64_t limit);

// Backbones' tails (train_from to feature_layer) with their pretrained weights, from the models
// the load step stored, each model fetched and imported once however many candidates need it.
class BackboneTails {
 public:
  explicit BackboneTails(StepContext& c) : c_(c) {}
  // Throws as kernels::Tail does, naming the backbone.
  std::unique_ptr<kernels::Tail> Make(const workflow::BackboneSpec& bb);

 private:
  StepContext& c_;
  std::map<std::string, kernels::Graph> graphs_;  // by backbone name
};

}  // namespace msaflow::modules
