// The ONNX importer (kernels/onnx_graph.h) on arbitrary bytes: cut at the graph's first output
// (or a fixed name when it has none), the cut model written back and imported again, and the
// executor's ops built and resolved for one input size.
#include <onnx/onnx_pb.h>

#include "fuzz/fuzz_util.h"
#include "kernels/executor.h"
#include "kernels/onnx_graph.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = msaflow::fuzz::Text(data, size);
  std::string cut = "out";
  onnx::ModelProto m;
  if (m.ParseFromString(bytes) && m.has_graph() && m.graph().output_size() > 0) cut = m.graph().output(0).name();
  msaflow::fuzz::Expect([&] {
    msaflow::kernels::Graph g = msaflow::kernels::ImportOnnx(bytes, "fuzz.onnx", cut);
    std::string again = msaflow::kernels::CutOnnx(bytes, "fuzz.onnx", cut);
    msaflow::kernels::ImportOnnx(again, "fuzz-cut.onnx", cut);
    // The ops built and one input size resolved: shape arithmetic folded, every shape checked
    // (no oneDNN primitive is made).
    const msaflow::kernels::Executor ex(std::move(g));
    ex.CheckShape(2, 3, 9, 9);
  });
  return 0;
}
