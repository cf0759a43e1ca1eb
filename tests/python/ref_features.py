#!/usr/bin/python3
"""Reference features for a raw float32 NCHW batch: ONNX cut + OpenCV dnn + global average pool.
Usage: ref_features.py MODEL CUT N C H W IN.bin OUT.bin"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from reference import cv2_features  # noqa: E402

model, cut = sys.argv[1], sys.argv[2]
n, c, h, w = (int(v) for v in sys.argv[3:7])
x = np.fromfile(sys.argv[7], dtype=np.float32).reshape(n, c, h, w)
cv2_features(model, cut, x).astype(np.float32).tofile(sys.argv[8])
