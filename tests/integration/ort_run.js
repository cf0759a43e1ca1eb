// Runs an ONNX model in ONNX Runtime (npm's onnxruntime-node, CPU), for the export tests:
//   node ort_run.js MODEL.onnx INPUT.bin DTYPE DIM... > OUTPUT.bin
// INPUT.bin holds the input tensor's values (DTYPE float32 or uint8) of dims DIM...; the first
// output's float32 values are written to stdout as raw bytes. NODE_PATH finds the package
// (scripts/setup.sh installs it in .cache/ort when MSAFLOW_TESTS=1).
const ort = require('onnxruntime-node');
const fs = require('fs');

(async () => {
  const [model, input, dtype, ...dims] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(model);
  const buf = fs.readFileSync(input);
  const data = dtype === 'uint8' ? new Uint8Array(buf.buffer, buf.byteOffset, buf.length) :
                                   new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  const feeds = {[session.inputNames[0]]: new ort.Tensor(dtype, data, dims.map(Number))};
  const out = (await session.run(feeds))[session.outputNames[0]];
  process.stdout.write(Buffer.from(out.data.buffer, out.data.byteOffset, out.data.length * 4));
})().catch((e) => {
  console.error('ort_run: ' + e.message);
  process.exit(1);
});
