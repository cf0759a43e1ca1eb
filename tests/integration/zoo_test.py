#!/usr/bin/python3
"""Bring your own model (issue 31): one small ONNX graph per pattern of the CNN families users
bring (tests/integration/onnx_zoo.py: DenseNet's Pad and concatenation, ShuffleNet's channel
split and shuffle with shapes computed at run time, SqueezeNet's ceil_mode pooling,
EfficientNet's SiLU and squeeze-and-excitation broadcasting, MobileNetV3's hard-swish, a
Flatten + Gemm head), every one a backbone of one pipeline run through `msaflow run`. The
features the run stored in its NAM are checked against an independent NumPy evaluation of each
graph, and against OpenCV's dnn where OpenCV 4.6 runs the pattern, within 1e-5 relative. What
the executor does not run is refused by `validate` with exit 6, naming backbone, file, node and
operator."""
import json
import os
import subprocess
import sys
import unittest

import numpy as np
import onnx

EXE, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_zoo  # noqa: E402
from tmpdir_case import TempDirCase  # noqa: E402

SIZE = 29  # odd: ceil_mode windows hang over the end, strided convs round
TOLERANCE = 1e-5
# The patterns OpenCV 4.6's dnn runs (the others: its Pad refuses negative pads, its Permute
# 5-D tensors, its Mul the [N, C, 1, 1] x [N, C, H, W] broadcast).
OPENCV_RUNS = ("densenet", "fire", "gemm_head")


def msaflow(*args, timeout=600):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def stored_features(runs, run_id, backbone, split):
    """A split's features as the run stored them in its NAM (docs/nam.md), [rows, dim]."""
    uri = "file://" + os.path.join(runs, "nam")

    def get(*args):
        return subprocess.run([EXE, "nam", *args, "--nam", uri], capture_output=True, check=True).stdout

    summary = json.loads(get("get", f"prepared/{run_id}/1"))
    obj = [c["object"] for c in summary["computed"] if c["backbone"] == backbone and c["split"] == split][0]
    meta = json.loads(get("ls", obj, "--json").decode().splitlines()[0])["meta"]
    parts = [np.frombuffer(get("get", f"{obj}.p{p:05d}"), dtype=np.float32) for p in range(meta["parts"])]
    return np.concatenate(parts).reshape(meta["rows"], meta["dim"])


def relative_error(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


class Zoo(TempDirCase):
    def dataset(self, n, seed):
        rng = np.random.default_rng(seed)
        x = rng.integers(0, 256, (n, SIZE, SIZE, 3), dtype=np.uint8)
        y = np.arange(n) % 3
        np.save(os.path.join(self.dir, f"x{seed}.npy"), x)
        np.save(os.path.join(self.dir, f"y{seed}.npy"), y)
        return {"format": "npy", "images": os.path.join(self.dir, f"x{seed}.npy"),
                "labels": os.path.join(self.dir, f"y{seed}.npy")}, x

    def pipeline(self, backbones, name="zoo"):
        train, _ = self.dataset(24, 1)
        test, x = self.dataset(10, 2)
        return {
            "name": name,
            "datasets": {"train": train, "test": test, "validation": {"from": "train", "fraction": 0.25, "seed": 1}},
            "backbones": [{"name": b, "onnx": path, "feature_layer": cut,
                           "input": {"height": SIZE, "width": SIZE, "channels": 3, "mean": [0, 0, 0], "std": [1, 1, 1]}}
                          for b, (path, cut) in backbones.items()],
            "head": {"type": "softmax", "epochs": 2},
            "steps": {"train": {"ranks": 1}, "evaluate": {"ranks": 1}},
            "rounds": {"max": 1, "candidates": len(backbones), "top_k": 1},
        }, x

    def test_every_pattern_runs_as_a_backbone_and_matches_numpy_and_opencv(self):
        models, backbones = {}, {}
        for name, build in onnx_zoo.PATTERNS.items():
            model, cut = build()
            path = os.path.join(self.dir, name + ".onnx")
            onnx.save(model, path)
            models[name] = (model, cut)
            backbones[name.replace("_", "-")] = (path, cut)
        doc, x = self.pipeline(backbones)
        path = self.write("zoo.json", doc)
        r = msaflow("validate", path)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        runs = os.path.join(self.dir, "runs")
        r = msaflow("run", path, "--runs", runs, "--run-id", "zoo")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        pixels = np.transpose(x, (0, 3, 1, 2)).astype(np.float64) / 255.0  # what prepare feeds the backbone
        for name, (model, cut) in models.items():
            got = stored_features(runs, "zoo", name.replace("_", "-"), "test")
            ref = onnx_zoo.features(model, pixels, cut)
            self.assertEqual(got.shape, ref.shape, name)
            err = relative_error(got, ref)
            self.assertLessEqual(err, TOLERANCE, f"{name}: msaflow's stored features vs NumPy, relative error {err:.2e}")
            if name in OPENCV_RUNS:
                cv = self.opencv(onnx_zoo.with_hw(model, SIZE, SIZE), pixels.astype(np.float32))
                err = relative_error(got, cv)
                self.assertLessEqual(err, TOLERANCE, f"{name}: msaflow vs OpenCV dnn, relative error {err:.2e}")
        self.exports_of_each_backbone(os.path.join(runs, "zoo"), doc["datasets"]["test"])

    def exports_of_each_backbone(self, run_dir, test):
        """A candidate on each backbone exported (its nodes in their opset-13 form) passes
        onnx.checker, and msaflow's predict on the file gives the run's probabilities."""
        with open(os.path.join(run_dir, "results.json")) as f:
            candidates = {c["candidate"]["backbone"]: c["candidate"]["id"] for c in json.load(f)["rounds"][0]["candidates"]}
        self.assertEqual(len(candidates), len(onnx_zoo.PATTERNS), candidates)

        def probabilities(*args):
            r = msaflow("predict", *args, test["images"], "--labels", test["labels"], "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            return np.array([e["probabilities"] for e in json.loads(r.stdout)])

        for backbone, cid in sorted(candidates.items()):
            path = os.path.join(self.dir, f"{backbone}-export.onnx")
            r = msaflow("export", run_dir, "--candidate", cid, "-o", path)
            self.assertEqual(r.returncode, 0, r.stderr)
            onnx.checker.check_model(onnx.load(path), full_check=True)
            np.testing.assert_allclose(probabilities(path), probabilities(run_dir, "--candidate", cid), rtol=1e-5,
                                       atol=1e-7, err_msg=backbone)

    def opencv(self, model, x):
        """OpenCV's dnn in a process of its own (4.6 can die of SIGFPE on graphs it mis-reads)."""
        path, xin, out = (os.path.join(self.dir, f) for f in ("cv.onnx", "cv_in.npy", "cv_out.npy"))
        onnx.save(model, path)
        np.save(xin, x)
        code = ("import sys, cv2, numpy as np\n"
                "net = cv2.dnn.readNetFromONNX(sys.argv[1]); net.setInput(np.load(sys.argv[2])); v = net.forward()\n"
                "np.save(sys.argv[3], v.mean(axis=(2, 3)) if v.ndim == 4 else v)\n")
        r = subprocess.run([sys.executable, "-c", code, path, xin, out], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return np.load(out).astype(np.float64)

    def test_what_the_executor_does_not_run_is_refused_by_validate(self):
        model, cut = onnx_zoo.unsupported()
        path = os.path.join(self.dir, "gather.onnx")
        onnx.save(model, path)
        doc, _ = self.pipeline({"gathered": (path, cut)})
        p = self.write("bad.json", doc)
        node = [n.name for n in model.graph.node if n.op_type == "Gather"][0]
        want = (f"msaflow: error: backbone 'gathered': {path}: node '{node}' (Gather): runs on image tensors here; "
                "only shape arithmetic (folded once the input size is known) is supported for this operator")
        r = msaflow("validate", p)
        self.assertEqual((r.returncode, r.stderr.strip()), (6, want))
        runs = os.path.join(self.dir, "runs-bad")
        r = msaflow("run", p, "--runs", runs)
        self.assertEqual((r.returncode, r.stderr.strip()), (6, want))
        self.assertFalse(os.path.exists(runs) and os.listdir(runs), "run got further than validate")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
