#!/usr/bin/python3
"""The ONNX MobileNetV2 written by scripts/tfjs_mobilenet_to_onnx.py matches an independent
numpy evaluation of the original Keras topology and weights (unfolded BatchNorm, TF padding)."""
import os
import sys

import numpy as np

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "tests", "python"))
from reference import cv2_features, keras_mobilenet  # noqa: E402

tfjs = os.path.join(root, ".cache", "tfjs")
onnx_path = os.path.join(root, "models", "mobilenet_v2.onnx")
x = np.random.default_rng(5).random((2, 64, 80, 3))
worst = 0.0
for stop in ["Conv1_relu", "block_2_add", "block_13_expand_relu", "out_relu"]:
    a = keras_mobilenet(os.path.join(tfjs, "model.json"), os.path.join(tfjs, "weights.bin"), x, stop).mean(axis=(1, 2))
    b = cv2_features(onnx_path, stop, x.transpose(0, 3, 1, 2).astype(np.float32))
    err = np.abs(a - b).max() / np.abs(a).max()
    print(f"{stop}: max relative error {err:.2e}")
    worst = max(worst, err)
if worst > 1e-4:
    sys.exit(f"FAIL: converter differs from the Keras reference by {worst:.2e} (> 1e-4)")
print("1 passed, 0 failed")
