#!/usr/bin/python3
"""Independent reference implementations used by msaflow's tests.

* `keras_mobilenet(model_json, weights_bin, x_nhwc, stop)`: a TF.js Keras model of nsfwjs
  (MobileNetV2, InceptionV3) evaluated directly from its topology and (dequantized) weights, in
  NHWC with TF padding rules (a "same" average pools over the pixels inside the image only) and
  unfolded BatchNormalization, in numpy. Checks the ONNX converter.
* `cv2_features(onnx_path, cut, x_nchw)`: the ONNX graph cut with onnx.utils.extract_model and
  run by OpenCV's dnn module, then global average pooling. Checks msaflow's executor.
"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))


def _conv_nhwc(x, k, stride, pads, groups):
    """x: [N,H,W,C]; k: [kh,kw,Cin/groups,Cout]; pads: (top,bottom,left,right)."""
    t, b, l, r = pads
    x = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)))
    n, h, w, c = x.shape
    kh, kw, cg, co = k.shape
    oh, ow = (h - kh) // stride[0] + 1, (w - kw) // stride[1] + 1
    out = np.zeros((n, oh, ow, co))
    cog = co // groups
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1], :]
            if groups == 1:
                out += patch @ k[i, j]
            else:  # depthwise, multiplier cog
                out += np.repeat(patch, cog, axis=3) * k[i, j].reshape(co)
    return out


def _same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def _pool_nhwc(x, size, stride, same, op):
    """TF pooling: "same" pads with -inf for max, and averages over the pixels inside only."""
    n, h, w, c = x.shape
    kh, kw = size
    if same:
        (t, b), (l, r) = _same_pads(h, kh, stride[0]), _same_pads(w, kw, stride[1])
    else:
        t = b = l = r = 0
    fill = -np.inf if op == "max" else 0.0
    xp = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=fill)
    inside = np.pad(np.ones((1, h, w, 1)), ((0, 0), (t, b), (l, r), (0, 0)))
    oh, ow = (h + t + b - kh) // stride[0] + 1, (w + l + r - kw) // stride[1] + 1
    acc = np.full((n, oh, ow, c), -np.inf) if op == "max" else np.zeros((n, oh, ow, c))
    count = np.zeros((1, oh, ow, 1))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1], :]
            if op == "max":
                acc = np.maximum(acc, win)
            else:
                acc += win
                count += inside[:, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1], :]
    return acc if op == "max" else acc / count


def keras_mobilenet(model_json, weights_bin, x, stop):
    from tfjs_keras_to_onnx import load_weights
    with open(model_json) as f:
        model = json.load(f)
    with open(weights_bin, "rb") as f:
        weights = load_weights(model["weightsManifest"], f.read())
    vals = {}
    for layer in model["modelTopology"]["model_config"]["config"]["layers"]:
        cls, cfg, name = layer["class_name"], layer["config"], layer["name"]
        src = [s[0] for s in layer["inbound_nodes"][0]] if layer["inbound_nodes"] else []
        if cls == "InputLayer":
            y = x.astype(np.float64)
        elif cls == "ZeroPadding2D":
            (t, b), (l, r) = cfg["padding"]
            y = np.pad(vals[src[0]], ((0, 0), (t, b), (l, r), (0, 0)))
        elif cls in ("Conv2D", "DepthwiseConv2D"):
            v = vals[src[0]]
            kh, kw = cfg["kernel_size"]
            s = cfg["strides"]
            if cfg["padding"] == "same":
                ph, pw = _same_pads(v.shape[1], kh, s[0]), _same_pads(v.shape[2], kw, s[1])
                pads = (ph[0], ph[1], pw[0], pw[1])
            else:
                pads = (0, 0, 0, 0)
            if cls == "Conv2D":
                y = _conv_nhwc(v, weights[name + "/kernel"], s, pads, 1)
            else:
                k = weights[name + "/depthwise_kernel"]
                y = _conv_nhwc(v, k.reshape(kh, kw, 1, -1), s, pads, v.shape[3])
            if cfg.get("use_bias", False):
                y = y + weights[name + "/bias"]
        elif cls == "BatchNormalization":
            g = weights[name + "/gamma"] if cfg.get("scale", True) else 1.0
            b = weights[name + "/beta"] if cfg.get("center", True) else 0.0
            m, var = weights[name + "/moving_mean"], weights[name + "/moving_variance"]
            y = (vals[src[0]] - m) / np.sqrt(var + cfg["epsilon"]) * g + b
        elif cls == "ReLU":
            y = np.clip(vals[src[0]], 0, cfg.get("max_value") or np.inf)
        elif cls == "Activation" and cfg["activation"] == "relu":
            y = np.maximum(vals[src[0]], 0)
        elif cls in ("MaxPooling2D", "AveragePooling2D"):
            y = _pool_nhwc(vals[src[0]], cfg["pool_size"], cfg["strides"], cfg["padding"] == "same",
                           "max" if cls == "MaxPooling2D" else "avg")
        elif cls == "Concatenate":
            y = np.concatenate([vals[s] for s in src], axis=3)
        elif cls == "Add":
            y = vals[src[0]] + vals[src[1]]
        else:
            raise ValueError(f"reference stops before {cls} {name}")
        vals[name] = y
        if name == stop:
            return y
    raise ValueError(f"layer {stop} not found")


def cv2_features(onnx_path, cut, x):
    """Run the ONNX graph up to tensor `cut` with OpenCV dnn; returns GAP features [N, C]."""
    import cv2
    import onnx
    import onnx.utils
    m = onnx.load(onnx_path)
    # Weights stored as Constant nodes become initializers so extract_model keeps them.
    in_name = m.graph.input[0].name
    with tempfile.TemporaryDirectory() as d:
        fixed = os.path.join(d, "fixed.onnx")
        dims = m.graph.input[0].type.tensor_type.shape.dim
        for dim, v in zip(dims, x.shape):
            dim.Clear()
            dim.dim_value = int(v)
        onnx.save(m, fixed)
        cutp = os.path.join(d, "cut.onnx")
        onnx.utils.extract_model(fixed, cutp, [in_name], [cut])
        net = cv2.dnn.readNetFromONNX(cutp)
        net.setInput(x.astype(np.float32))
        y = net.forward()
    return y.reshape(y.shape[0], y.shape[1], -1).mean(axis=2)
