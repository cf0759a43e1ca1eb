// The trainable tail of a cut CNN (fine-tuning, docs/finetune.md): the layers from a freeze
// point to the cut. The frozen part before it runs once per dataset (its activations at the
// freeze point are cached); the tail runs forward on those activations, keeping every
// intermediate, and backward to the gradient of each of its weights, so that a head's loss
// trains the tail's convolutions (and batch norms' scale and shift, and Gemm matrices) with it.
//
// The forward pass computes what Executor::Features computes for the same weights (the cut
// tensor averaged over its spatial axes), in f32 on plain NCHW tensors between operators
// (kernels/tail_ops.h has the operators and what each one's backward does).
//
// Thread-safety: a Tail is not thread-safe; use one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/onnx_graph.h"
#include "kernels/tail_ops.h"

namespace msaflow::kernels {

// Where a graph's trainable tail starts.
struct TailSplit {
  std::vector<size_t> nodes;        // the tail's nodes (indices into Graph::nodes), in graph order
  std::vector<std::string> inputs;  // what the tail reads from the frozen part, in first-read order
};

// The tail of `g` from the node named `from` (or the node that computes the tensor `from`):
// that node and every node that reads, directly or not, what it computes. Throws kNotFound
// (with a did-you-mean) when no node of the cut graph has that name; kUnsupported, naming the
// first operator on the tail without a backward pass and the nearest later layer that would
// work; kInvalidInput for a tail with no weight to train.
TailSplit SplitTail(const Graph& g, const std::string& from);

// A weight of the tail that training changes: an ONNX initializer of the graph.
struct TailParam {
  std::string name;
  TensorDims dims;
  std::vector<float> value, grad;
};

class Tail {
 public:
  // Throws as SplitTail, and kUnsupported naming a node whose attributes the backward pass does
  // not implement. A weight read by a node outside the tail too stays frozen.
  Tail(const Graph& graph, const std::string& from);
  ~Tail();
  Tail(const Tail&) = delete;
  Tail& operator=(const Tail&) = delete;

  // The cached tensors the tail reads (SplitTail's inputs).
  const std::vector<std::string>& inputs() const { return split_.inputs; }
  // The names of the tail's nodes, in graph order.
  std::vector<std::string> NodeNames() const;
  // The trainable weights, in the order the tail's nodes read them. Their values may be set
  // (an optimiser's update) between passes.
  std::vector<TailParam>& params() { return params_; }
  const std::vector<TailParam>& params() const { return params_; }
  int64_t ParamCount() const;

  // Runs the tail on one batch: xs[i] holds inputs()[i], of dims dims[i] (one batch size n for
  // all). Keeps what Backward needs. Returns n x FeatureDim() pooled features, row-major.
  // Throws kInvalidInput naming the node for shapes that do not fit.
  const std::vector<float>& Forward(const std::vector<const float*>& xs, const std::vector<TensorDims>& dims);
  int64_t FeatureDim() const { return feature_dim_; }

  // After Forward: dfeat (n x FeatureDim()) is the loss's gradient with respect to the pooled
  // features. Sets every param's grad (for this batch, overwriting), and with input_grads the
  // gradient with respect to each input (dims as given to Forward).
  // The backward pass visits the nodes in reverse, so the params' grads become final from the
  // last param to the first: `final_from(p)` is called whenever the grads of params p, p + 1,
  // ... (all of them to the last) have become final, p decreasing from call to call and 0 at
  // the last call, so that a caller can start summing them over ranks while the pass goes on
  // (parallel::FinetuneSync's buckets). It may be called more than once with the same p.
  using FinalFrom = std::function<void(size_t first_final_param)>;
  void Backward(const float* dfeat, std::vector<std::vector<float>>* input_grads = nullptr,
                const FinalFrom& final_from = nullptr);

  // The floats the last Forward and Backward keep for their batch: every intermediate tensor
  // (the inputs' channels-last copies among them), every gradient of one, and the largest
  // scratch the ops used (TailOp::Scratches). A training step's activation memory is about
  // this times 4 bytes (oneDNN's workspaces come on top).
  int64_t KeptValues() const;
  // KeptValues of a step on one image whose inputs have `image_dims` (C, H, W each): what a
  // training step keeps per image. Runs one image of zeros forward and backward.
  int64_t KeptValuesPerImage(const std::vector<TensorDims>& image_dims);

  // `g` with the params' current values as its initializers (the fine-tuned model).
  void WriteWeights(Graph* g) const;

 private:
  Graph graph_;
  TailSplit split_;
  std::vector<TailParam> params_;
  std::vector<size_t> first_reader_;          // per param: the position in split_.nodes of its first reader
  std::vector<std::unique_ptr<TailOp>> ops_;  // one per split_.nodes
  std::vector<std::string> writes_;           // per node: the tensor its op writes (a fused activation's output)
  std::vector<bool> taken_over_;              // per node: an activation its convolution applies (TailOp::Fuse)
  std::map<std::string, Act> consts_;         // the frozen constants the tail's ops read as data
  std::map<std::string, Act> acts_;           // this batch's tensors (inputs included)
  std::map<std::string, Act> grads_;          // this batch's gradients of them
  std::vector<float> features_;
  TensorDims out_dims_;
  int64_t feature_dim_ = 0;
};

}  // namespace msaflow::kernels
