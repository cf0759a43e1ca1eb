// ONNX import: a model file (protobuf) becomes a Graph of float tensors and nodes, cut at a
// feature tensor. Weights may be initializers or Constant nodes; input dims may be dynamic.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace msaflow::kernels {

struct ConstTensor {
  std::vector<int64_t> dims;
  std::vector<float> data;
  // Integer tensors (shapes, axes, indices) keep their exact values here too; `data` holds them
  // as floats for the code that only reads scalars.
  bool is_int = false;
  std::vector<int64_t> ints;
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
};

struct Attr {
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  bool has_tensor = false;
  ConstTensor t;
};

struct Node {
  std::string name;  // node name, or its first output when unnamed
  std::string op;
  std::vector<std::string> inputs;   // "" = optional input left out
  std::vector<std::string> outputs;
  std::map<std::string, Attr> attrs;

  bool Has(const std::string& a) const { return attrs.count(a) != 0; }
  int64_t Int(const std::string& a, int64_t dflt) const;
  float Float(const std::string& a, float dflt) const;
  std::vector<int64_t> Ints(const std::string& a) const;
  std::string Str(const std::string& a, const std::string& dflt) const;
};

struct Graph {
  std::string input;                 // the one non-constant graph input
  std::vector<int64_t> input_dims;   // -1 where dynamic
  std::vector<Node> nodes;           // topological order
  std::map<std::string, ConstTensor> consts;
  std::string output;                // the cut tensor
  std::vector<std::string> more_outputs;  // further cut tensors (ImportOnnxCuts), pooled in the same pass
  int64_t opset = 0;
};

// The largest model file msaflow reads: protobuf's own bound on a message (2 GiB).
inline constexpr uint64_t kMaxOnnxBytes = uint64_t{2} << 30;

// Operators the executor implements (kernels/executor_ops.cc makes their ops).
bool IsSupportedOp(const std::string& op);

// Parses ONNX bytes (`origin` names the file in errors) and keeps only the nodes the tensor
// `cut` depends on. Throws kInvalidInput for malformed protobuf / graphs, kNotFound if `cut`
// names no tensor (with a did-you-mean), kUnsupported naming the first unsupported node.
Graph ImportOnnx(const std::string& bytes, const std::string& origin, const std::string& cut);

// The same with several cuts of one model: the nodes any of them depends on, `cuts[0]` as the
// graph's output and the others as more_outputs, so that one pass of the executor gives the
// features of every cut (Executor::FeaturesOfCuts). Each cut's features are those of the graph
// cut at it alone (kernels_test checks it bit for bit on the models measured here).
Graph ImportOnnxCuts(const std::string& bytes, const std::string& origin, const std::vector<std::string>& cuts);

// `bytes` (an ONNX model) with the float initializers named in `values` replaced by those values
// (a fine-tuned backbone's trained weights). Throws kInvalidInput naming the initializer when
// one is missing, is not float or holds another number of values.
std::string ReplaceInitializers(const std::string& bytes, const std::string& origin,
                                const std::map<std::string, std::vector<float>>& values);

// `bytes` with each tensor of `tensors` rounded through float16 for the nodes that read it: a
// Cast to FLOAT16 and one back to FLOAT after its producer, the readers reading the second
// (what a fine-tuned tail read from maps stored as float16). Throws kInvalidInput naming a
// tensor that no node computes.
std::string RoundThroughHalfAt(const std::string& bytes, const std::string& origin,
                               const std::vector<std::string>& tensors);

// A model's layers as a person picks a cut from them (the service's new-run form): each node,
// in the model's order, whose output the executor can compute (every node it depends on
// supported; constants, shape arithmetic and copies left out), with its first output (what
// `feature_layer` names), its own name (what `train_from` may name) and operator; the image
// input's dims (-1 where dynamic; empty when the model has no rank-4 input); and a suggested
// cut: the input of the last global pooling, else the last layer's output.
struct CutLayer {
  std::string name;  // the node's first output
  std::string node;  // the node's name, or its first output when it has none
  std::string op;
};
struct ModelLayers {
  std::vector<int64_t> input_dims;
  std::vector<CutLayer> layers;
  std::string suggested;
};
ModelLayers ListCutLayers(const std::string& bytes, const std::string& origin);

// The cut model as ONNX bytes (only the needed nodes and initializers, output = cut tensor).
std::string CutOnnx(const std::string& bytes, const std::string& origin, const std::string& cut);

}  // namespace msaflow::kernels
