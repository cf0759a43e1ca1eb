#!/usr/bin/python3
"""The trainable tail's gradients (kernels/tail.h, run by the tail_grads tool) against PyTorch's
autograd on the same weights: a small ONNX graph per operator that trains, then the tails of the
three shipped models (MobileNetV2 from block_11_expand, PP-OCRv4's recogniser from its last
blocks, InceptionV3's mixed2). The reference is an interpreter of the ONNX nodes in torch.float64;
msaflow computes in float32. Each tensor's largest error relative to its largest value must be
at most 1e-4.

usage: tail_grad_test.py TAIL_GRADS_TOOL SOURCE_ROOT [TestCase.test_name ...]"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

TOOL, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from torch_tail import TorchTail  # noqa: E402
TOLERANCE = 1e-4
# Where float32 and float64 may take different sides of a kink (ReLU6's 0 and 6), the gradient
# differs by a whole term: the inputs are drawn again until no pre-activation lies that close.
KINK_MARGIN = 2e-6


def tool(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"tail_grads {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def input_dims(model_path, names, fixed):
    """The dims of the tail's inputs by ONNX shape inference, the graph input fixed to `fixed`."""
    m = onnx.load(model_path)
    inp = m.graph.input[0]
    for d, v in zip(inp.type.tensor_type.shape.dim, fixed):
        d.Clear()
        d.dim_value = v
    if inp.name in names and len(names) == 1:
        return {inp.name: list(fixed)}
    inferred = onnx.shape_inference.infer_shapes(m)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    dims[inp.name] = list(fixed)
    return {n: dims[n] for n in names}


def rel_err(mine, ref):
    ref, mine = np.asarray(ref, dtype=np.float64), np.asarray(mine, np.float64)
    if not np.isfinite(mine).all():  # a NaN would compare as no error at all
        return float("inf")
    return float(np.abs(mine - ref).max() / max(np.abs(ref).max(), 1e-30))


class Case(unittest.TestCase):
    def check(self, model_path, cut, train_from, fixed, low=-1.0, high=1.0):
        desc = json.loads(tool("describe", model_path, cut, train_from))
        model = onnx.load(model_path)
        dims = input_dims(model_path, desc["inputs"], fixed)
        params = [p["name"] for p in desc["params"]]
        for seed in range(40):
            rng = np.random.default_rng(seed)
            xs = [rng.uniform(low, high, dims[n]).astype(np.float32) for n in desc["inputs"]]
            ref = TorchTail(model, desc["nodes"], params)
            leaves = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in xs]
            out = ref.run(dict(zip(desc["inputs"], leaves)), cut)
            if ref.kink_distance > KINK_MARGIN:
                break
        else:
            self.fail("no inputs away from the kinks in 40 draws")
        feats = out.mean(dim=(2, 3)) if out.dim() == 4 else out
        dfeat = rng.uniform(-1, 1, tuple(feats.shape)).astype(np.float32)
        (feats * torch.tensor(dfeat.astype(np.float64))).sum().backward()
        with tempfile.TemporaryDirectory() as d:
            for i, x in enumerate(xs):
                np.save(os.path.join(d, f"x{i}.npy"), x)
            np.save(os.path.join(d, "dfeat.npy"), dfeat)
            tool("run", model_path, cut, train_from, d)
            errs = {"features": rel_err(np.load(os.path.join(d, "features.npy")), feats.detach().numpy())}
            for i, leaf in enumerate(leaves):
                errs[f"d/d {desc['inputs'][i]}"] = rel_err(np.load(os.path.join(d, f"dx{i}.npy")), leaf.grad.numpy())
            for j, p in enumerate(params):
                errs[f"d/d {p}"] = rel_err(np.load(os.path.join(d, f"g{j}.npy")), ref.params[p].grad.numpy())
        worst = max(errs, key=errs.get)
        print(f"  {os.path.basename(model_path)} from {train_from}: {len(params)} params, "
              f"largest relative error {errs[worst]:.1e} ({worst}), seed {seed}", flush=True)
        self.assertLessEqual(errs[worst], TOLERANCE, f"{worst}: {errs[worst]:.2e}")


def small_model(nodes, inits, in_dims, out="out"):
    rng = np.random.default_rng(1)
    initializers = []
    for name, dims, *rest in inits:
        scale, offset = (rest + [0.4, 0.0])[:2] if rest else (0.4, 0.0)
        initializers.append(numpy_helper.from_array((rng.uniform(-scale, scale, dims) + offset).astype(np.float32), name))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims)],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], initializers)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def conv(name, inp, cin, cout, k, group=1, **kw):
    node = helper.make_node("Conv", [inp, name + ".W", name + ".B"], [name], name=name, group=group,
                            pads=kw.pop("pads", [k // 2] * 4), **kw)
    return node, [(name + ".W", [cout, cin // group, k, k]), (name + ".B", [cout], 0.1)]


class Operators(Case):
    """One small graph per operator: a convolution to train, then the operator, then the cut."""

    def run_graph(self, nodes, inits, in_dims=(2, 4, 6, 6), train_from="c1", out="out"):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.onnx")
            onnx.save(small_model(nodes, inits, list(in_dims), out), path)
            self.check(path, out, train_from, in_dims)

    def with_op(self, op_nodes, extra_inits=(), **kw):
        c1, i1 = conv("c1", "x", 4, 6, 3)
        self.run_graph([c1, *op_nodes], i1 + list(extra_inits), **kw)

    def test_conv_strides_pads_dilation(self):
        c1, i1 = conv("c1", "x", 4, 6, 3, strides=[2, 2], pads=[1, 0, 2, 1])
        c2, i2 = conv("out", "c1", 6, 4, 3, dilations=[2, 2], pads=[2, 2, 2, 2])
        self.run_graph([c1, c2], i1 + i2, in_dims=(2, 4, 9, 8))

    def test_conv_grouped_and_depthwise(self):
        c1, i1 = conv("c1", "x", 4, 6, 3, group=2)
        c2, i2 = conv("out", "c1", 6, 6, 3, group=6, strides=[2, 2])
        self.run_graph([c1, c2], i1 + i2)

    def test_batch_normalization(self):
        bn = helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["out"], name="bn", epsilon=1e-3)
        self.with_op([bn], [("s", [6], 0.5, 1.0), ("b", [6]), ("m", [6]), ("v", [6], 0.3, 1.0)])

    def test_relu(self):
        self.with_op([helper.make_node("Relu", ["c1"], ["out"], name="r")])

    def test_clip_relu6(self):
        lo = helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(0, np.float32)))
        hi = helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(0.5, np.float32)))
        self.with_op([lo, hi, helper.make_node("Clip", ["c1", "lo", "hi"], ["out"], name="clip")])

    def test_relu_and_clip_on_tensors_read_twice(self):
        # Above, the convolution applies the activation itself (TailOp::Fuse); here its output is
        # read twice and the activations are operators of their own.
        lo = helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(-0.2, np.float32)))
        hi = helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(0.4, np.float32)))
        self.with_op([helper.make_node("Relu", ["c1"], ["r"], name="r"),
                      helper.make_node("Add", ["r", "c1"], ["sum"], name="sum"), lo, hi,
                      helper.make_node("Clip", ["sum", "lo", "hi"], ["out"], name="clip")])

    def test_clip_after_1x1_convolution_in_blocks(self):
        # A 1 x 1 convolution with its activation goes through its pixels in blocks (288 pixels,
        # 128 a block at 512 channels: three blocks, the last one short).
        c1, i1 = conv("c1", "x", 4, 512, 1)
        lo = helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(0, np.float32)))
        hi = helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(0.5, np.float32)))
        self.run_graph([c1, lo, hi, helper.make_node("Clip", ["c1", "lo", "hi"], ["out"], name="clip")], i1,
                       in_dims=(2, 4, 12, 12))

    def test_hardswish(self):
        self.with_op([helper.make_node("Mul", ["c1", "k"], ["big"], name="big"),
                      helper.make_node("HardSwish", ["big"], ["out"], name="hs")], [("k", [1], 0.1, 8.0)])

    def test_hardsigmoid(self):
        self.with_op([helper.make_node("Mul", ["c1", "k"], ["big"], name="big"),
                      helper.make_node("HardSigmoid", ["big"], ["out"], name="hsig", alpha=1 / 6, beta=0.5)],
                     [("k", [1], 0.1, 8.0)])

    def test_sigmoid(self):
        self.with_op([helper.make_node("Sigmoid", ["c1"], ["out"], name="sig")])

    def test_mul_broadcast_squeeze_excite(self):
        c2, i2 = conv("gate", "pool", 6, 6, 1)
        self.with_op([helper.make_node("GlobalAveragePool", ["c1"], ["pool"], name="pool"), c2,
                      helper.make_node("Sigmoid", ["gate"], ["g"], name="g"),
                      helper.make_node("Mul", ["c1", "g"], ["out"], name="se")], i2)

    def test_add_residual_and_constant(self):
        c2, i2 = conv("c2", "c1", 6, 6, 3)
        self.with_op([c2, helper.make_node("Add", ["c2", "c1"], ["sum"], name="res"),
                      helper.make_node("Add", ["sum", "bias"], ["sub"], name="bias_add"),
                      helper.make_node("Div", ["sub", "six"], ["out"], name="div")], i2 + [("bias", [6, 1, 1]),
                                                                                           ("six", [1], 0.0, 6.0)])

    def test_sub_div_by_computed(self):
        c2, i2 = conv("c2", "c1", 6, 6, 3)
        self.with_op([c2, helper.make_node("Sigmoid", ["c2"], ["s"], name="s"),
                      helper.make_node("Add", ["s", "one"], ["den"], name="den"),
                      helper.make_node("Sub", ["c1", "c2"], ["diff"], name="diff"),
                      helper.make_node("Div", ["diff", "den"], ["out"], name="div")], i2 + [("one", [1], 0.0, 1.0)])

    def test_concat(self):
        c2, i2 = conv("c2", "c1", 6, 3, 1)
        self.with_op([c2, helper.make_node("Concat", ["c1", "c2"], ["out"], name="cat", axis=1)], i2)

    def test_max_pool(self):
        self.with_op([helper.make_node("MaxPool", ["c1"], ["out"], name="mp", kernel_shape=[3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1])])

    def test_average_pool_ceil_mode(self):
        self.with_op([helper.make_node("AveragePool", ["c1"], ["out"], name="ap", kernel_shape=[3, 3],
                                       strides=[2, 2], ceil_mode=1)], in_dims=(2, 4, 8, 8))

    def test_average_pool_counting_pads(self):
        self.with_op([helper.make_node("AveragePool", ["c1"], ["out"], name="ap", kernel_shape=[3, 3],
                                       pads=[1, 1, 1, 1], count_include_pad=1)])

    def test_global_average_pool_flatten_gemm(self):
        self.with_op([helper.make_node("GlobalAveragePool", ["c1"], ["p"], name="gap"),
                      helper.make_node("Flatten", ["p"], ["f"], name="flat"),
                      helper.make_node("Gemm", ["f", "fc.W", "fc.B"], ["out"], name="fc", transB=1, alpha=0.7)],
                     [("fc.W", [5, 6]), ("fc.B", [5])])

    def test_reshape_matmul(self):
        shape = helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([0, -1], np.int64)))
        self.with_op([shape, helper.make_node("Reshape", ["c1", "shape"], ["f"], name="reshape"),
                      helper.make_node("MatMul", ["f", "mm.B"], ["out"], name="mm")], [("mm.B", [216, 7])])


class ShippedModels(Case):
    """The tails the quickstart and the search fine-tune, at small image sizes."""

    def model(self, name):
        path = os.path.join(ROOT, "models", name)
        if not os.path.exists(path):
            self.fail(f"{path} missing: scripts/setup.sh converts it")
        return path

    def test_mobilenet_v2_blocks_11_to_13(self):
        self.check(self.model("mobilenet_v2.onnx"), "block_13_expand_relu", "block_11_expand", (1, 3, 64, 64), 0.0, 3.0)

    def test_ppocr_recogniser_last_blocks(self):
        self.check(self.model("ch_PP-OCRv4_rec_infer.onnx"), "p2o.AveragePool.1", "p2o.Conv.30", (1, 3, 48, 12),
                   -1.0, 2.0)

    def test_inception_v3_mixed2_from_mixed1(self):
        self.check(self.model("inception_v3.onnx"), "mixed2", "mixed1", (1, 3, 75, 75), 0.0, 2.0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
