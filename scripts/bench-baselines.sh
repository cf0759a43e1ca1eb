#!/usr/bin/env bash
# The baselines bench/versus.py measures msaflow against, all from Debian: PyTorch (CPU, with
# oneDNN), scikit-learn with OpenBLAS's threaded build (so that it does not fall back to the
# reference BLAS), the ONNX Python API that builds the PyTorch backbone from the same file, and
# torchvision for bench/zoo.py's model families.
# For Debian's /usr/bin/python3. Not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh
ensure_packages python3-sklearn python3-numpy python3-torch python3-torchvision python3-onnx libopenblas0-pthread
/usr/bin/python3 - <<'PY'
import numpy, sklearn, torch
from threadpoolctl import threadpool_info
blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
print(f"PyTorch {torch.__version__}, scikit-learn {sklearn.__version__}, NumPy {numpy.__version__}, BLAS:",
      ", ".join(f"{i['internal_api']} ({i['filepath']})" for i in blas) or "none found")
PY
