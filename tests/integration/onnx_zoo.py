"""Small ONNX graphs, one per pattern of the CNN families users bring (issue 31), built with the
`onnx` helper at random weights, and an independent NumPy evaluation of them (Debian's onnx 1.12
has no reference evaluator): float64, written from the ONNX operator definitions, sharing
nothing with msaflow's executor.

Each builder returns (model, cut tensor). Every model takes x: [N, 3, H, W] float (N dynamic;
H and W dynamic where the pattern computes shapes from them)."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


class Builder:
    def __init__(self, seed, dynamic_hw=False):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0
        self.dynamic_hw = dynamic_hw

    def name(self, stem):
        self.n += 1
        return f"{stem}_{self.n}"

    def const(self, value, stem="c"):
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, outputs=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name("node_" + op_type), **attrs))
        return outs[0] if outputs == 1 else outs

    def conv(self, x, cin, cout, k=3, stride=1, pad=None, group=1):
        pad = k // 2 if pad is None else pad
        w = self.rng.normal(0, (2.0 / (cin // group * k * k)) ** 0.5, (cout, cin // group, k, k)).astype(np.float32)
        b = self.rng.normal(0, 0.1, cout).astype(np.float32)
        return self.op("Conv", [x, self.const(w, "w"), self.const(b, "b")], kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=group)

    def bn(self, x, c):
        p = [self.rng.uniform(0.5, 1.5, c), self.rng.normal(0, 0.1, c), self.rng.normal(0, 0.1, c), self.rng.uniform(0.5, 1.5, c)]
        return self.op("BatchNormalization", [x] + [self.const(v.astype(np.float32), "bn") for v in p], epsilon=1e-5)

    def silu(self, x):
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def model(self, out, rank=4):
        hw = ["H", "W"] if self.dynamic_hw else [None, None]
        dims = ["N", 3] + hw
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [f"d{k}" for k in range(rank)])
        g = helper.make_graph(self.nodes, "zoo", [x], [y], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="msaflow-zoo-test")
        onnx.checker.check_model(m, full_check=True)
        return m


def with_hw(model, h, w):
    """The model with its input's H and W fixed (OpenCV 4.6 needs them)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    d = m.graph.input[0].type.tensor_type.shape.dim
    d[2].dim_value, d[3].dim_value = h, w
    return m


def densenet():
    """A dense layer (BN, ReLU, conv, concatenation) and a transition as torch.onnx writes it:
    a Pad of zeros (count_include_pad) before its AveragePool."""
    b = Builder(1)
    x = b.op("Relu", [b.conv("x", 3, 8)])
    new = b.conv(b.op("Relu", [b.bn(x, 8)]), 8, 4)
    cat = b.op("Concat", [x, new], axis=1)
    t = b.conv(b.op("Relu", [b.bn(cat, 12)]), 12, 6, k=1)
    padded = b.op("Pad", [t, b.const(np.zeros(8, np.int64), "pads")], mode="constant")
    out = b.op("AveragePool", [padded], kernel_shape=[2, 2], strides=[2, 2])
    return b.model(out), out


def pads():
    """Every Pad mode with uneven and negative pads; the last, zeros before a conv, is folded
    into the convolution's padding."""
    b = Builder(2)
    x = b.conv("x", 3, 4)
    x = b.op("Pad", [x, b.const(np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64)), b.const(np.float32(0.5))], mode="constant")
    x = b.op("Pad", [x, b.const(np.array([0, 0, 2, 1, 0, 0, 0, 3], np.int64))], mode="edge")
    x = b.op("Pad", [x, b.const(np.array([0, 0, 3, 1, 0, 0, 1, -2], np.int64))], mode="reflect")
    x = b.op("Relu", [x])
    x = b.op("Pad", [x, b.const(np.array([0, 0, 1, 1, 0, 0, 2, 2], np.int64))])
    out = b.op("Relu", [b.conv(x, 4, 6, pad=0)])
    return b.model(out), out


def shuffle():
    """A ShuffleNetV2 unit: the channels split in two (Split, and Slice with an INT64_MAX end as
    torch writes chunk), one half convolved, concatenated, then the channel shuffle with its
    shape computed from the input's (Shape, Gather, Div, Unsqueeze, Concat, Reshape to 5-D,
    Transpose, Reshape back)."""
    b = Builder(3, dynamic_hw=True)
    x = b.op("Relu", [b.conv("x", 3, 8)])
    left, right = b.op("Split", [x, b.const(np.array([4, 4], np.int64))], outputs=2, axis=1)
    tail = b.op("Slice", [x, b.const(np.array([6], np.int64)), b.const(np.array([2**63 - 1], np.int64)),
                          b.const(np.array([1], np.int64))])
    right = b.op("Relu", [b.conv(right, 4, 4, k=3, group=4)])
    y = b.op("Concat", [left, right, tail], axis=1)  # 10 channels
    shape = b.op("Shape", [y])
    dims = [b.op("Gather", [shape, b.const(np.int64(i))], axis=0) for i in range(4)]
    groups = b.const(np.int64(2))
    per = b.op("Div", [dims[1], groups])
    parts = [b.op("Unsqueeze", [v, b.const(np.array([0], np.int64))]) for v in (dims[0], groups, per, dims[2], dims[3])]
    five = b.op("Reshape", [y, b.op("Concat", parts, axis=0)])
    swapped = b.op("Transpose", [five], perm=[0, 2, 1, 3, 4])
    back = b.op("Concat", [parts[0], b.const(np.array([-1], np.int64)), parts[3], parts[4]], axis=0)
    out = b.op("Relu", [b.conv(b.op("Reshape", [swapped, back]), 10, 6, k=1)])
    return b.model(out), out


def fire():
    """SqueezeNet 1.1: pooling with ceil_mode (a window over the end), a fire module (squeeze,
    expand 1x1 and 3x3, concatenated), and an average pool in ceil_mode."""
    b = Builder(4)
    x = b.op("Relu", [b.conv("x", 3, 16, k=3, stride=2, pad=0)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    s = b.op("Relu", [b.conv(x, 16, 4, k=1)])
    e = b.op("Concat", [b.op("Relu", [b.conv(s, 4, 8, k=1)]), b.op("Relu", [b.conv(s, 4, 8, k=3)])], axis=1)
    out = b.op("AveragePool", [e], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    return b.model(out), out


def squeeze_excite():
    """EfficientNet's MBConv: SiLU (x * Sigmoid(x)), a depthwise conv, squeeze-and-excitation
    with ReduceMean and the [N, C, 1, 1] scale multiplied by [N, C, H, W] (the smaller input
    first), a constant minus a tensor and a division by a tensor, and the residual add."""
    b = Builder(5)
    x = b.silu(b.bn(b.conv("x", 3, 8), 8))
    d = b.silu(b.bn(b.conv(x, 8, 8, group=8), 8))
    s = b.op("ReduceMean", [d], axes=[2, 3], keepdims=1)
    s = b.op("Sigmoid", [b.conv(b.silu(b.conv(s, 8, 4, k=1)), 4, 8, k=1)])
    scaled = b.op("Mul", [s, d])
    shifted = b.op("Sub", [b.const(np.linspace(0.5, 1.0, 8, dtype=np.float32).reshape(8, 1, 1)), scaled])
    ratio = b.op("Div", [s, b.op("Add", [b.op("Relu", [shifted]), b.const(np.float32(1))])])
    out = b.op("Add", [b.bn(b.conv(ratio, 8, 8, k=1), 8), x])
    return b.model(out), out


def hardswish():
    """MobileNetV3: hard-swish as torch.onnx writes it below opset 14 (x * HardSigmoid(x, 1/6,
    1/2)) and as x * Clip(x + 3, 0, 6) / 6, and an SE block gated by HardSigmoid."""
    b = Builder(6)
    x = b.conv("x", 3, 8)
    x = b.op("Mul", [x, b.op("HardSigmoid", [x], alpha=1.0 / 6, beta=0.5)])
    d = b.conv(x, 8, 8, group=8)
    clip = b.op("Clip", [b.op("Add", [d, b.const(np.float32(3))]), b.const(np.float32(0)), b.const(np.float32(6))])
    d = b.op("Div", [b.op("Mul", [d, clip]), b.const(np.float32(6))])
    s = b.op("GlobalAveragePool", [d])
    s = b.op("HardSigmoid", [b.conv(b.op("Relu", [b.conv(s, 8, 4, k=1)]), 4, 8, k=1)], alpha=1.0 / 6, beta=0.5)
    out = b.op("Mul", [s, d])
    return b.model(out), out


def gemm_head():
    """A classifier's tail cut after its hidden layer: GlobalAveragePool, Flatten, Gemm (transB)
    with ReLU, and a ReduceMean without keepdims into MatMul + Add on a second path."""
    b = Builder(7)
    x = b.op("Relu", [b.conv("x", 3, 8, stride=2)])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w = b.rng.normal(0, 0.3, (12, 8)).astype(np.float32)
    h = b.op("Relu", [b.op("Gemm", [f, b.const(w), b.const(b.rng.normal(0, 0.1, 12).astype(np.float32))], transB=1)])
    r = b.op("ReduceMean", [x], axes=[-2, -1], keepdims=0)
    m = b.op("Add", [b.op("MatMul", [r, b.const(b.rng.normal(0, 0.3, (8, 12)).astype(np.float32))]),
                     b.const(b.rng.normal(0, 0.1, 12).astype(np.float32))])
    out = b.op("Add", [h, m])
    return b.model(out, rank=2), out


PATTERNS = {"densenet": densenet, "pads": pads, "shuffle": shuffle, "fire": fire, "se": squeeze_excite,
            "hardswish": hardswish, "gemm_head": gemm_head}


def unsupported():
    """A graph the executor refuses: Gather on image data (not shape arithmetic)."""
    b = Builder(8)
    x = b.conv("x", 3, 4)
    out = b.op("Gather", [x, b.const(np.array([0, 2], np.int64))], axis=1)
    return b.model(out), out


# --- the NumPy evaluation -------------------------------------------------------------------

def _attrs(node):
    a = {k.name: helper.get_attribute_value(k) for k in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in a.items()}


def _window_out(size, k, s, pb, pe, ceil):
    span = size + pb + pe - k
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + pb:
        out -= 1
    return out


def _conv(x, w, b, a):
    s, d = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
    p, g = a.get("pads", [0, 0, 0, 0]), a.get("group", 1)
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    n, _, hp, wp = xp.shape
    o, cg, kh, kw = w.shape
    oh, ow = (hp - (kh - 1) * d[0] - 1) // s[0] + 1, (wp - (kw - 1) * d[1] - 1) // s[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // g
    for gi in range(g):
        xs, ws = xp[:, gi * cg:(gi + 1) * cg], w[gi * og:(gi + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0], j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
                out[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out + (b.reshape(1, -1, 1, 1) if b is not None else 0)


def _pool(x, a, op):
    k, s = a["kernel_shape"], a.get("strides", [1, 1])
    p, ceil = a.get("pads", [0, 0, 0, 0]), a.get("ceil_mode", 0)
    include = op == "AveragePool" and a.get("count_include_pad", 0)
    n, c, h, w = x.shape
    oh, ow = _window_out(h, k[0], s[0], p[0], p[2], ceil), _window_out(w, k[1], s[1], p[1], p[3], ceil)
    extra_h, extra_w = max(0, (oh - 1) * s[0] + k[0] - h - p[0] - p[2]), max(0, (ow - 1) * s[1] + k[1] - w - p[1] - p[3])
    fill = -np.inf if op == "MaxPool" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2] + extra_h), (p[1], p[3] + extra_w)), constant_values=fill)
    count = np.pad(np.ones((h, w)), ((p[0], p[2]), (p[1], p[3])), constant_values=1.0 if include else 0.0)
    count = np.pad(count, ((0, extra_h), (0, extra_w)))
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if op == "MaxPool":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                out[:, :, i, j] = win.sum(axis=(2, 3)) / count[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum()
    return out


def _slice(x, starts, ends, axes, steps):
    idx = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        idx[int(ax)] = slice(int(st), int(min(en, 2**62)) if en > 0 else int(en), int(sp))
    return x[tuple(idx)]


def evaluate(model, x, cut):
    """The value of tensor `cut` for input x (float64), node by node."""
    env = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    env["x"] = np.asarray(x, np.float64)
    for node in model.graph.node:
        a, i = _attrs(node), [env[n] if n else None for n in node.input]
        t = node.op_type
        if t == "Conv":
            r = _conv(i[0], i[1], i[2] if len(i) > 2 else None, a)
        elif t == "BatchNormalization":
            sc, bias, mean, var = (v.reshape(1, -1, 1, 1) for v in i[1:5])
            r = (i[0] - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * sc + bias
        elif t == "Relu":
            r = np.maximum(i[0], 0)
        elif t == "Sigmoid":
            r = 1 / (1 + np.exp(-i[0]))
        elif t == "HardSigmoid":
            r = np.clip(a.get("alpha", 0.2) * i[0] + a.get("beta", 0.5), 0, 1)
        elif t == "Clip":
            r = np.clip(i[0], i[1], i[2])
        elif t in ("Add", "Sub", "Mul", "Div"):
            r = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[t](i[0], i[1])
            if i[0].dtype.kind == "i" and i[1].dtype.kind == "i":
                r = (np.trunc(i[0] / i[1]) if t == "Div" else r).astype(np.int64)
        elif t in ("MaxPool", "AveragePool"):
            r = _pool(i[0], a, t)
        elif t == "GlobalAveragePool":
            r = i[0].mean(axis=(2, 3), keepdims=True)
        elif t == "ReduceMean":
            r = i[0].mean(axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1)))
        elif t == "Concat":
            r = np.concatenate(i, axis=a["axis"])
        elif t == "Pad":
            p, mode = i[1], a.get("mode", "constant")
            value = float(i[2]) if len(i) > 2 and i[2] is not None else 0.0
            half = len(p) // 2
            grow = [(max(p[k], 0), max(p[half + k], 0)) for k in range(half)]
            r = np.pad(i[0], grow, mode=mode, constant_values=value) if mode == "constant" else np.pad(i[0], grow, mode=mode)
            crop = tuple(slice(-min(p[k], 0), r.shape[k] + min(p[half + k], 0)) for k in range(half))
            r = r[crop]
        elif t == "Shape":
            r = np.array(i[0].shape, np.int64)
        elif t == "Gather":
            r = np.take(i[0], i[1], axis=a.get("axis", 0))
        elif t == "Unsqueeze":
            r = np.expand_dims(i[0], tuple(int(v) for v in i[1]))
        elif t == "Reshape":
            shape = [i[0].shape[k] if v == 0 else int(v) for k, v in enumerate(i[1])]
            r = i[0].reshape(shape)
        elif t == "Transpose":
            r = np.transpose(i[0], a["perm"])
        elif t == "Flatten":
            ax = a.get("axis", 1)
            r = i[0].reshape(int(np.prod(i[0].shape[:ax])), -1)
        elif t == "Split":
            r = np.split(i[0], np.cumsum(i[1])[:-1], axis=a.get("axis", 0))
        elif t == "Slice":
            r = _slice(i[0], i[1], i[2], i[3] if len(i) > 3 else range(len(i[1])), i[4] if len(i) > 4 else [1] * len(i[1]))
        elif t == "Gemm":
            bm = i[1].T if a.get("transB", 0) else i[1]
            r = a.get("alpha", 1.0) * i[0] @ bm + a.get("beta", 1.0) * i[2]
        elif t == "MatMul":
            r = i[0] @ i[1]
        else:
            raise NotImplementedError(t)
        outs = r if isinstance(r, list) else [r]
        for name, v in zip(node.output, outs):
            env[name] = v
        if cut in node.output:
            return env[cut]
    raise KeyError(cut)


def features(model, x, cut):
    """What msaflow stores for a backbone cut at `cut`: the tensor average-pooled over H and W
    (4-D), or as it is (N x features)."""
    v = evaluate(model, x, cut)
    return v.mean(axis=(2, 3)) if v.ndim == 4 else v
