"""A reference for fine-tuning's tail (kernels/tail.h): the tail's ONNX nodes evaluated by PyTorch,
the weights that train as leaves. tests/python/tail_grad_test.py checks msaflow's gradients
against it in float64; bench/finetune.py times it in float32 as the PyTorch baseline."""
import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper


def attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def same_pads(size, k, s, d, upper):
    out = (size + s - 1) // s
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


class TorchTail:
    """Evaluates the tail's nodes (by name, in order) of an ONNX model with torch, floats in
    `dtype`; the weights named in `params` are leaves that require grad. kink_distance: the
    closest any pre-activation came to a kink (relative to its tensor's largest value)."""

    def __init__(self, model, node_names, params, dtype=torch.float64):
        def tensor(arr):
            return torch.tensor(arr.astype(np.float64)).to(dtype) if arr.dtype.kind == "f" else torch.tensor(arr)
        self.consts = {t.name: tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
        for n in model.graph.node:
            if n.op_type == "Constant":
                self.consts[n.output[0]] = tensor(numpy_helper.to_array(attrs(n)["value"]))
        by_name = {n.name or n.output[0]: n for n in model.graph.node}
        self.nodes = [by_name[name] for name in node_names]
        self.params = {p: self.consts[p].clone().requires_grad_(True) for p in params}
        self.track_kinks = True
        self.kink_distance = float("inf")

    def kink(self, x, points):
        if not self.track_kinks:
            return
        scale = max(float(x.detach().abs().max()), 1e-12)
        for p in points:
            self.kink_distance = min(self.kink_distance, float((x.detach() - p).abs().min()) / scale)

    def value(self, env, name):
        if name in self.params:
            return self.params[name]
        if name in env:
            return env[name]
        return self.consts[name]

    def run(self, inputs, output):
        env = dict(inputs)
        for n in self.nodes:
            args = [self.value(env, i) if i else None for i in n.input]
            env[n.output[0]] = self.op(n, args)
        return env[output]

    def op(self, n, x):
        a, t = attrs(n), n.op_type
        if t == "Conv":
            w = x[1]
            k = w.shape[2:]
            s, d = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
            auto = a.get("auto_pad", b"NOTSET").decode() if isinstance(a.get("auto_pad"), bytes) else a.get("auto_pad", "NOTSET")
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                ph = same_pads(x[0].shape[2], k[0], s[0], d[0], auto == "SAME_UPPER")
                pw = same_pads(x[0].shape[3], k[1], s[1], d[1], auto == "SAME_UPPER")
                p = [ph[0], pw[0], ph[1], pw[1]]
            else:
                p = a.get("pads", [0, 0, 0, 0])
            y = F.pad(x[0], (p[1], p[3], p[0], p[2]))
            return F.conv2d(y, w, x[2] if len(x) > 2 else None, stride=s, dilation=d, groups=a.get("group", 1))
        if t == "Relu":
            self.kink(x[0], [0.0])
            return F.relu(x[0])
        if t == "Clip":
            lo = float(x[1]) if len(x) > 1 and x[1] is not None else a.get("min", -3.4e38)
            hi = float(x[2]) if len(x) > 2 and x[2] is not None else a.get("max", 3.4e38)
            self.kink(x[0], [lo, hi])
            return F.hardtanh(x[0], lo, hi)
        if t == "Sigmoid":
            return torch.sigmoid(x[0])
        if t == "HardSigmoid":
            al, be = a.get("alpha", 0.2), a.get("beta", 0.5)
            self.kink(x[0], [-be / al, (1 - be) / al])
            return torch.clamp(al * x[0] + be, 0, 1)
        if t == "HardSwish":
            self.kink(x[0], [-3.0, 3.0])
            return F.hardswish(x[0])
        if t in ("Identity", "Dropout"):
            return x[0]
        if t == "BatchNormalization":
            return F.batch_norm(x[0], x[3], x[4], x[1], x[2], training=False, eps=a.get("epsilon", 1e-5))
        if t in ("Add", "Sub", "Mul", "Div"):
            return {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[t](x[0], x[1])
        if t == "Concat":
            return torch.cat(x, dim=a.get("axis", 1))
        if t in ("MaxPool", "AveragePool"):
            k, s = a["kernel_shape"], a.get("strides", [1, 1])
            p = a.get("pads", [0, 0, 0, 0])
            if p[0] != p[2] or p[1] != p[3]:
                raise ValueError(f"{n.name}: asymmetric pooling pads in the reference")
            if t == "MaxPool":
                return F.max_pool2d(x[0], k, s, (p[0], p[1]), ceil_mode=bool(a.get("ceil_mode", 0)))
            return F.avg_pool2d(x[0], k, s, (p[0], p[1]), ceil_mode=bool(a.get("ceil_mode", 0)),
                                count_include_pad=bool(a.get("count_include_pad", 0)))
        if t == "GlobalAveragePool":
            return x[0].mean(dim=(2, 3), keepdim=True)
        if t == "ReduceMean":
            axes = a.get("axes") or [int(v) for v in x[1]]
            return x[0].mean(dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))
        if t == "Flatten":
            return torch.flatten(x[0], a.get("axis", 1))
        if t == "Reshape":
            shape = [int(v) for v in x[1]]
            shape = [x[0].shape[i] if v == 0 else v for i, v in enumerate(shape)]
            return x[0].reshape(shape)
        if t == "Gemm":
            b = x[1].t() if a.get("transB", 0) else x[1]
            y = a.get("alpha", 1.0) * (x[0] @ b)
            return y + a.get("beta", 1.0) * x[2] if len(x) > 2 and x[2] is not None else y
        if t == "MatMul":
            return x[0] @ x[1]
        raise ValueError(f"no reference for {t}")
