// The trainable tail's passes for tests/python/tail_grad_test.py, which checks them against
// PyTorch's autograd on the same weights:
//   tail_grads describe MODEL.onnx CUT TRAIN_FROM        JSON: the tail's inputs, nodes, params
//   tail_grads run MODEL.onnx CUT TRAIN_FROM DIR         reads DIR/x<i>.npy (float32, one per
//       input) and DIR/dfeat.npy; writes DIR/features.npy, DIR/dx<i>.npy and DIR/g<j>.npy (the
//       gradient of param j, in describe's order)
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "kernels/npy.h"
#include "kernels/onnx_graph.h"
#include "kernels/tail.h"

using namespace msaflow;
using namespace msaflow::kernels;

namespace {

std::vector<float> ReadF32(const std::string& path, TensorDims* dims) {
  const std::string bytes = ReadFile(path);
  const NpyHeader h = ParseNpyHeader(bytes, path);
  if (h.descr != "<f4" || h.fortran_order) Throw(ErrorKind::kInvalidInput, path + ": expected C-order float32");
  *dims = h.shape;
  std::vector<float> v(static_cast<size_t>(NumElements(h.shape)));
  if (bytes.size() < h.data_offset + v.size() * sizeof(float)) Throw(ErrorKind::kInvalidInput, path + ": short body");
  std::memcpy(v.data(), bytes.data() + h.data_offset, v.size() * sizeof(float));
  return v;
}

void WriteF32(const std::string& path, const std::vector<float>& v, const TensorDims& dims) {
  std::string shape = "(";
  for (int64_t d : dims) shape += std::to_string(d) + ",";
  shape += ")";
  const std::string body(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  std::ofstream(path, std::ios::binary) << NpyBytes("<f4", shape, body);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: tail_grads describe|run MODEL.onnx CUT TRAIN_FROM [DIR]\n";
    return 2;
  }
  try {
    const std::string verb = argv[1];
    Graph g = ImportOnnx(ReadFile(argv[2]), argv[2], argv[3]);
    Tail tail(g, argv[4]);
    if (verb == "describe") {
      nlohmann::json j;
      j["inputs"] = tail.inputs();
      j["nodes"] = tail.NodeNames();
      for (const auto& p : tail.params()) j["params"].push_back({{"name", p.name}, {"dims", p.dims}});
      std::cout << j.dump() << "\n";
      return 0;
    }
    const std::string dir = argc > 5 ? argv[5] : ".";
    std::vector<std::vector<float>> xs;
    std::vector<TensorDims> dims(tail.inputs().size());
    std::vector<const float*> ptrs;
    for (size_t i = 0; i < tail.inputs().size(); ++i)
      xs.push_back(ReadF32(dir + "/x" + std::to_string(i) + ".npy", &dims[i]));
    for (const auto& x : xs) ptrs.push_back(x.data());
    const std::vector<float> features = tail.Forward(ptrs, dims);
    const int64_t n = dims[0][0];
    WriteF32(dir + "/features.npy", features, {n, tail.FeatureDim()});
    TensorDims ddims;
    const std::vector<float> dfeat = ReadF32(dir + "/dfeat.npy", &ddims);
    std::vector<std::vector<float>> dx;
    tail.Backward(dfeat.data(), &dx);
    for (size_t i = 0; i < dx.size(); ++i) WriteF32(dir + "/dx" + std::to_string(i) + ".npy", dx[i], dims[i]);
    for (size_t j = 0; j < tail.params().size(); ++j)
      WriteF32(dir + "/g" + std::to_string(j) + ".npy", tail.params()[j].grad, tail.params()[j].dims);
    return 0;
  } catch (const Error& e) {
    std::cerr << "tail_grads: " << e.what() << "\n";
    return 3;
  }
}
