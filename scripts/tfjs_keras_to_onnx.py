#!/usr/bin/python3
"""Convert a TF.js Keras CNN of nsfwjs (MobileNetV2, InceptionV3) into an ONNX model (NCHW).

Input: the topology (model.json, Keras 2.2.4 functional Model) and the weight shards
concatenated (uint8-quantized: w = q * scale + min), both as dumped from the npm package's UMD
modules. Output: an ONNX graph of the convolutional trunk (input -> the TRUNK_END layer) with
  * BatchNormalization folded into the preceding convolution,
  * ZeroPadding2D folded into the following convolution's pads,
  * TF "same" padding made explicit (SAME_UPPER where the stride is > 1),
  * ReLU(max_value=6) as Clip(0, 6) (opset 10: bounds as attributes, which every runtime reads),
  * Activation("relu") as Relu, Concatenate on the channels as Concat(axis=1),
  * MaxPooling2D / AveragePooling2D with TF's padding (a "same" average excludes the padding
    from its count, as ONNX's count_include_pad=0 does),
and every tensor named after the Keras layer that produced it, so `block_13_expand_relu` or
`mixed5` is a valid cut point. Input `input`: [N, 3, H, W] RGB in [0, 1]; N, H, W are dynamic.
The package's own classifier head (Flatten, Dense) is dropped.

Usage: tfjs_keras_to_onnx.py MODEL_JSON WEIGHTS_BIN OUT_ONNX [TRUNK_END [GRAPH_NAME]]
  (TRUNK_END defaults to MobileNetV2's out_relu; GRAPH_NAME to mobilenet_v2_nsfwjs)
"""
import json
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def fail(msg):
    sys.stderr.write(f"tfjs_keras_to_onnx: {msg}\n")
    sys.exit(1)


def load_weights(manifest, blob):
    weights, off = {}, 0
    for group in manifest:
        for w in group["weights"]:
            shape = w["shape"]
            n = int(np.prod(shape)) if shape else 1
            q = w.get("quantization")
            if q:
                if q["dtype"] != "uint8":
                    fail(f"weight {w['name']}: quantization dtype {q['dtype']} unsupported (expected uint8)")
                raw = np.frombuffer(blob, dtype=np.uint8, count=n, offset=off)
                off += n
                arr = raw.astype(np.float64) * q["scale"] + q["min"]
            else:
                raw = np.frombuffer(blob, dtype=np.float32, count=n, offset=off)
                off += 4 * n
                arr = raw.astype(np.float64)
            weights[w["name"]] = arr.reshape(shape)
    if off != len(blob):
        fail(f"weights: manifest describes {off} bytes, shard has {len(blob)}")
    return weights


def main(argv):
    if not 4 <= len(argv) <= 6:
        fail("usage: tfjs_keras_to_onnx.py MODEL_JSON WEIGHTS_BIN OUT_ONNX [TRUNK_END [GRAPH_NAME]]")
    with open(argv[1]) as f:
        model = json.load(f)
    with open(argv[2], "rb") as f:
        blob = f.read()
    weights = load_weights(model["weightsManifest"], blob)
    layers = model["modelTopology"]["model_config"]["config"]["layers"]

    nodes, inits = [], []
    # Keras layer name -> ONNX tensor name holding its output.
    out_of = {}
    # Convolutions not yet emitted, waiting for a BatchNormalization to fold in.
    pending_conv = {}
    pad_of = {}  # ZeroPadding2D layer -> ((top, bottom), (left, right)) and its input tensor
    graph_out = argv[4] if len(argv) > 4 else "out_relu"
    graph_name = argv[5] if len(argv) > 5 else "mobilenet_v2_nsfwjs"

    def inbound(layer):
        return [src[0] for src in layer["inbound_nodes"][0]]

    consumers = {}
    for layer in layers:
        for src in (layer["inbound_nodes"][0] if layer["inbound_nodes"] else []):
            consumers.setdefault(src[0], []).append(layer["class_name"])

    def is_head_pool(layer):
        # The pooling that feeds the package's classifier (Flatten -> Dense) is part of the head.
        return consumers.get(layer["name"]) == ["Flatten"]

    def add_init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), name))

    def emit_conv(name, out_name, conv):
        w, b = conv["w"], conv["b"]
        add_init(name + ".W", w)
        add_init(name + ".B", b)
        attrs = dict(kernel_shape=list(w.shape[2:]), strides=conv["strides"], group=conv["group"])
        if conv["auto_pad"]:
            attrs["auto_pad"] = conv["auto_pad"]
        else:
            attrs["pads"] = conv["pads"]
        nodes.append(helper.make_node("Conv", [conv["input"], name + ".W", name + ".B"], [out_name],
                                      name=name, **attrs))

    for layer in layers:
        cls, cfg, name = layer["class_name"], layer["config"], layer["name"]
        if cls == "InputLayer":
            out_of[name] = "input"
            continue
        src = inbound(layer)
        if cls == "ZeroPadding2D":
            (t, b), (l, r) = cfg["padding"]
            pad_of[name] = ((t, b, l, r), out_of[src[0]])
            out_of[name] = None  # folded into the consumer
            continue
        if cls in ("Conv2D", "DepthwiseConv2D"):
            if cfg.get("activation", "linear") != "linear":
                fail(f"layer {name}: fused activation {cfg['activation']} unsupported")
            kh, kw = cfg["kernel_size"]
            sh, sw = cfg["strides"]
            if cfg.get("dilation_rate", [1, 1]) != [1, 1]:
                fail(f"layer {name}: dilation unsupported")
            if cls == "Conv2D":
                k = weights[name + "/kernel"]  # HWIO
                w = k.transpose(3, 2, 0, 1)
                group = 1
            else:
                k = weights[name + "/depthwise_kernel"]  # H W C M
                c, m = k.shape[2], k.shape[3]
                w = k.transpose(2, 3, 0, 1).reshape(c * m, 1, kh, kw)
                group = c
            bias = weights.get(name + "/bias", np.zeros(w.shape[0]))
            pads, auto_pad = [0, 0, 0, 0], None
            inp = src[0]
            if inp in pad_of:
                (t, b, l, r), tensor = pad_of[inp]
                if cfg["padding"] != "valid":
                    fail(f"layer {name}: explicit padding followed by 'same' padding unsupported")
                pads = [t, l, b, r]
                in_tensor = tensor
            else:
                in_tensor = out_of[inp]
                if cfg["padding"] == "same":
                    if sh == 1 and sw == 1:
                        pads = [(kh - 1) // 2, (kw - 1) // 2, kh - 1 - (kh - 1) // 2, kw - 1 - (kw - 1) // 2]
                    else:
                        auto_pad = "SAME_UPPER"  # TF's rule: the odd pixel goes at the end
            pending_conv[name] = dict(w=w, b=bias, strides=[sh, sw], group=group, pads=pads,
                                      auto_pad=auto_pad, input=in_tensor)
            out_of[name] = None
            continue
        if cls == "BatchNormalization":
            conv_name = src[0]
            if conv_name not in pending_conv:
                fail(f"layer {name}: BatchNormalization not after a convolution")
            conv = pending_conv.pop(conv_name)
            g = weights[name + "/gamma"] if cfg.get("scale", True) else 1.0
            beta = weights[name + "/beta"] if cfg.get("center", True) else 0.0
            mean, var = weights[name + "/moving_mean"], weights[name + "/moving_variance"]
            s = g / np.sqrt(var + cfg["epsilon"])
            conv["w"] = conv["w"] * s[:, None, None, None]
            conv["b"] = (conv["b"] - mean) * s + beta
            emit_conv(conv_name, name, conv)
            out_of[name] = name
            continue
        # Any other layer reads tensors: flush convolutions without BatchNormalization.
        for s in src:
            if s in pending_conv:
                emit_conv(s, s, pending_conv.pop(s))
                out_of[s] = s
        if cls == "ReLU":
            mx = cfg.get("max_value")
            if cfg.get("negative_slope", 0) != 0 or cfg.get("threshold", 0) != 0:
                fail(f"layer {name}: leaky/thresholded ReLU unsupported")
            if mx is None:
                nodes.append(helper.make_node("Relu", [out_of[src[0]]], [name], name=name))
            else:
                nodes.append(helper.make_node("Clip", [out_of[src[0]]], [name], name=name,
                                              min=0.0, max=float(mx)))
            out_of[name] = name
        elif cls == "Activation":
            if cfg["activation"] != "relu":
                fail(f"layer {name}: activation {cfg['activation']} unsupported (expected relu)")
            nodes.append(helper.make_node("Relu", [out_of[src[0]]], [name], name=name))
            out_of[name] = name
        elif cls == "Add":
            nodes.append(helper.make_node("Add", [out_of[s] for s in src], [name], name=name))
            out_of[name] = name
        elif cls == "Concatenate":
            if cfg.get("axis", -1) not in (-1, 3):
                fail(f"layer {name}: concatenation on axis {cfg['axis']} unsupported (expected the channels)")
            nodes.append(helper.make_node("Concat", [out_of[s] for s in src], [name], name=name, axis=1))
            out_of[name] = name
        elif cls in ("MaxPooling2D", "AveragePooling2D") and not is_head_pool(layer):
            kh, kw = cfg["pool_size"]
            sh, sw = cfg["strides"]
            attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw])
            if cfg["padding"] == "same":
                if sh == 1 and sw == 1:
                    attrs["pads"] = [(kh - 1) // 2, (kw - 1) // 2, kh - 1 - (kh - 1) // 2, kw - 1 - (kw - 1) // 2]
                else:
                    attrs["auto_pad"] = "SAME_UPPER"
            op = "MaxPool" if cls == "MaxPooling2D" else "AveragePool"
            nodes.append(helper.make_node(op, [out_of[src[0]]], [name], name=name, **attrs))
            out_of[name] = name
        else:
            # The classifier head (pooling, dense layers) of the package's own task is dropped.
            break
        if name == graph_out:
            break

    if out_of.get(graph_out) != graph_out:
        fail(f"layer {graph_out} not reached; the topology has no such layer in its trunk")

    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])
    out = helper.make_tensor_value_info(graph_out, TensorProto.FLOAT, ["N", None, None, None])
    graph = helper.make_graph(nodes, graph_name, [inp], [out], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)],
                          producer_name="msaflow tfjs_keras_to_onnx")
    m.doc_string = (f"{graph_name}: the convolutional trunk (to {graph_out}) of a model of nsfwjs@4.3.0, "
                    "BN folded; input RGB in [0,1], NCHW")
    if graph_name == "mobilenet_v2_nsfwjs":
        m.doc_string = ("MobileNetV2 (alpha 1.0) trunk from nsfwjs@4.3.0, BN folded; "
                        "input RGB in [0,1], NCHW")
    onnx.checker.check_model(m)
    tmp = argv[3] + ".tmp"
    onnx.save(m, tmp)
    import os
    os.replace(tmp, argv[3])
    print(f"wrote {argv[3]}: {len(nodes)} nodes, {len(inits)} initializers")


if __name__ == "__main__":
    main(sys.argv)
