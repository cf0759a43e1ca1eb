#!/usr/bin/python3
"""The ONNX MobileNetV2 and InceptionV3 written by scripts/tfjs_keras_to_onnx.py match an
independent numpy evaluation of the original Keras topology and weights (unfolded BatchNorm, TF
padding, TF pooling), each run on the ONNX file by OpenCV's dnn."""
import os
import sys

import numpy as np

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "tests", "python"))
from reference import cv2_features, keras_mobilenet  # noqa: E402

worst = 0.0
# InceptionV3 at 83 x 91: odd sizes through its stride-2 valid convolutions and poolings, and
# its "same" 3 x 3 average poolings at the border of every mixed block.
for model, tfjs, size, stops in [
        ("mobilenet_v2.onnx", "tfjs", (64, 80), ["Conv1_relu", "block_2_add", "block_13_expand_relu", "out_relu"]),
        ("inception_v3.onnx", "tfjs-inception", (83, 91), ["max_pooling2d_2", "mixed2", "mixed5", "mixed7", "mixed10"])]:
    cache = os.path.join(root, ".cache", tfjs)
    onnx_path = os.path.join(root, "models", model)
    x = np.random.default_rng(5).random((2, *size, 3))
    for stop in stops:
        a = keras_mobilenet(os.path.join(cache, "model.json"), os.path.join(cache, "weights.bin"), x, stop).mean(axis=(1, 2))
        b = cv2_features(onnx_path, stop, x.transpose(0, 3, 1, 2).astype(np.float32))
        err = np.abs(a - b).max() / np.abs(a).max()
        print(f"{model} @ {stop}: max relative error {err:.2e}")
        worst = max(worst, err)
# OpenCV 4.6 ignores count_include_pad (it always leaves the padding out), so the comparison above
# cannot see it: TF's "same" averages leave the padding out, and so must every ONNX AveragePool.
import onnx  # noqa: E402
for node in onnx.load(os.path.join(root, "models", "inception_v3.onnx")).graph.node:
    if node.op_type == "AveragePool":
        cip = [a.i for a in node.attribute if a.name == "count_include_pad"]
        if cip and cip[0] != 0:
            sys.exit(f"FAIL: {node.name} counts the padding in its average; TF's 'same' pooling does not")
if worst > 1e-4:
    sys.exit(f"FAIL: converter differs from the Keras reference by {worst:.2e} (> 1e-4)")
print("1 passed, 0 failed")
