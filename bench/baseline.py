"""The PyTorch + scikit-learn side of bench/versus.py: the backbone as a PyTorch module built from
the same ONNX file's initializers (jit.trace + freeze + channels_last, as fast as PyTorch runs
it), and the whole transfer-learning job as a user would script it with these libraries."""
import gzip
import statistics
import time

import numpy as np


def torch_backbone(onnx_path, cut, example, channels_last=True):
    """A traced, frozen PyTorch module computing the globally average-pooled features of `cut`,
    built from the ONNX graph's nodes up to it (the convolution, elementwise and pooling
    operators the two backbones use) and their initializers or Constant nodes; and the
    multiply-add FLOPs per image of its convolutions (2 per multiply-add). torch.jit.freeze
    folds batch norms and constant scales into the convolutions, as it does for any model.
    Feed it tensors in the memory format it was traced with (`channels_last` or NCHW)."""
    import onnx
    import torch
    from onnx import numpy_helper

    graph = onnx.load(onnx_path).graph
    consts = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    steps = []  # (op, inputs, output, module index or arguments)
    mods = torch.nn.ModuleList()

    def const(name):
        if name not in consts:
            raise SystemExit(f"baseline: {name} must be a constant")
        return consts[name]

    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        op, ins, out = node.op_type, list(node.input), node.output[0]
        if op == "Constant":
            consts[out] = torch.from_numpy(numpy_helper.to_array(attrs["value"]).copy())
            continue
        if op == "Conv":
            w = const(ins[1])
            pads = list(attrs.get("pads", [0, 0, 0, 0]))  # top, left, bottom, right
            symmetric = pads[:2] == pads[2:]
            conv = torch.nn.Conv2d(w.shape[1] * attrs.get("group", 1), w.shape[0], tuple(w.shape[2:]),
                                   stride=tuple(attrs.get("strides", [1, 1])),
                                   padding=tuple(pads[:2]) if symmetric else 0,
                                   dilation=tuple(attrs.get("dilations", [1, 1])), groups=attrs.get("group", 1),
                                   bias=len(ins) > 2)
            with torch.no_grad():
                conv.weight.copy_(w)
                if len(ins) > 2:
                    conv.bias.copy_(const(ins[2]))
            steps.append(("module", ins[:1], out, len(mods)))
            # TensorFlow's "same" padding is asymmetric (more at the end): pad, then convolve.
            mods.append(conv if symmetric else
                        torch.nn.Sequential(torch.nn.ZeroPad2d((pads[1], pads[3], pads[0], pads[2])), conv))
        elif op == "BatchNormalization":
            scale, bias, mean, var = (const(i) for i in ins[1:5])
            bn = torch.nn.BatchNorm2d(len(scale), eps=attrs.get("epsilon", 1e-5))
            with torch.no_grad():
                bn.weight.copy_(scale)
                bn.bias.copy_(bias)
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
            steps.append(("module", ins[:1], out, len(mods)))
            mods.append(bn)
        elif op == "Clip":
            lo = attrs.get("min", float("-inf"))
            hi = attrs.get("max", float("inf"))
            if len(ins) > 1:  # opset 11+: bounds as inputs
                lo = float(const(ins[1])) if ins[1] else lo
                hi = float(const(ins[2])) if len(ins) > 2 and ins[2] else hi
            steps.append(("clip", ins[:1], out, (lo, hi)))
        elif op in ("Add", "Sub", "Mul", "Div"):
            steps.append((op.lower(), ins[:2], out, None))
        elif op == "Relu":
            steps.append(("relu", ins[:1], out, None))
        elif op == "HardSigmoid":
            steps.append(("hardsigmoid", ins[:1], out, (attrs.get("alpha", 0.2), attrs.get("beta", 0.5))))
        elif op == "GlobalAveragePool":
            steps.append(("gap", ins[:1], out, None))
        elif op == "AveragePool":
            pads = list(attrs.get("pads", [0, 0, 0, 0]))
            if pads[:2] != pads[2:]:
                raise SystemExit(f"baseline: asymmetric pooling pads (node {node.name})")
            steps.append(("avgpool", ins[:1], out, (tuple(attrs["kernel_shape"]), tuple(attrs.get("strides", [1, 1])),
                                                    tuple(pads[:2]), bool(attrs.get("count_include_pad", 0)))))
        else:
            raise SystemExit(f"baseline: ONNX operator {op} (node {node.name}) not handled")
        if cut == out:
            break
    else:
        raise SystemExit(f"baseline: no node produces {cut}")
    source = graph.input[0].name
    constants = {k: v for k, v in consts.items()}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mods = mods

        def forward(self, x):
            env = {source: x}

            def get(name):
                return env[name] if name in env else constants[name]

            for op, ins, out, arg in steps:
                a = get(ins[0])
                if op == "module":
                    env[out] = self.mods[arg](a)
                elif op == "clip":
                    env[out] = torch.clamp(a, arg[0], arg[1])
                elif op == "relu":
                    env[out] = torch.relu(a)
                elif op == "hardsigmoid":
                    env[out] = torch.clamp(a * arg[0] + arg[1], 0.0, 1.0)
                elif op == "gap":
                    env[out] = a.mean(dim=(2, 3), keepdim=True)
                elif op == "avgpool":
                    env[out] = torch.nn.functional.avg_pool2d(a, arg[0], arg[1], arg[2], count_include_pad=arg[3])
                else:
                    env[out] = binary[op](a, get(ins[1]))
            return env[cut].mean(dim=(2, 3))

    model = Backbone().eval()
    flops = [0]

    def count(conv, inputs, output):
        k = conv.weight.shape[1] * conv.weight.shape[2] * conv.weight.shape[3]
        flops[0] += 2 * k * output.shape[1] * output.shape[2] * output.shape[3]

    hooks = [m.register_forward_hook(count) for m in mods.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(example[:1])
    for h in hooks:
        h.remove()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    with torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(model, example.contiguous(memory_format=fmt)))
    traced.memory_format = fmt
    return traced, flops[0]


def features(model, x, batch):
    """Features of x (N x C x H x W float32 NumPy) in batches, as a NumPy array."""
    import torch
    out = []
    with torch.no_grad():
        for s in range(0, len(x), batch):
            t = torch.from_numpy(x[s:s + batch]).contiguous(memory_format=model.memory_format)
            out.append(model(t).numpy())
    return np.concatenate(out)


def read_idx(path, limit):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    a = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    return a[:limit]


def prepare(pixels, size):
    """Gray 28x28 uint8 -> size x size RGB float32 in [0, 1] (bilinear), as msaflow prepares them."""
    import torch
    import torch.nn.functional as F
    x = torch.from_numpy(pixels.astype(np.float32) / 255.0)[:, None]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.expand(-1, 3, -1, -1).contiguous().numpy()


def job(data_dir, onnx_path, cut, rows, test_rows, channels_last, size=96, batch=64):
    """The whole job as a PyTorch + scikit-learn script: features for train and test, the 8
    heads of the pipeline's grid (softmax as LogisticRegression, MLP-128 as MLPClassifier, 15
    epochs of Adam; lr x l2), the best on a 10 % validation split, its test accuracy."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    import warnings
    from sklearn.exceptions import ConvergenceWarning
    warnings.simplefilter("ignore", ConvergenceWarning)
    t0 = time.perf_counter()
    xs = read_idx(f"{data_dir}/train-images-idx3-ubyte.gz", rows)
    ys = read_idx(f"{data_dir}/train-labels-idx1-ubyte.gz", rows)
    xt = read_idx(f"{data_dir}/t10k-images-idx3-ubyte.gz", test_rows)
    yt = read_idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz", test_rows)
    tr, te = prepare(xs, size), prepare(xt, size)
    model, _ = torch_backbone(onnx_path, cut, torch.from_numpy(tr[:batch]), channels_last)
    ftr, fte = features(model, tr, batch), features(model, te, batch)
    t_features = time.perf_counter() - t0
    f_fit, f_val, y_fit, y_val = train_test_split(ftr, ys, test_size=0.1, stratify=ys, random_state=1)
    best = None
    for kind in ("softmax", "mlp"):
        for lr in (1e-3, 3e-3):
            for l2 in (1e-4, 1e-3):
                if kind == "softmax":
                    head = LogisticRegression(C=1.0 / (len(y_fit) * l2), max_iter=100)
                else:
                    head = MLPClassifier(hidden_layer_sizes=(128,), alpha=l2, learning_rate_init=lr, batch_size=64,
                                         max_iter=15, random_state=1)
                clf = make_pipeline(StandardScaler(), head).fit(f_fit, y_fit)
                val = float((clf.predict(f_val) == y_val).mean())
                if best is None or val > best[0]:
                    best = (val, clf, f"{kind} lr={lr:g} l2={l2:g}")
    test = float((best[1].predict(fte) == yt).mean())
    return {"seconds": time.perf_counter() - t0, "features_s": t_features, "validation": best[0], "test": test,
            "champion": best[2]}


def timed(f, reps):
    secs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs)
