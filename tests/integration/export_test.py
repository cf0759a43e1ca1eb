#!/usr/bin/python3
"""The champion outside msaflow (issue 28): the quickstart and digits pipelines as shipped are
run, their champions exported to ONNX (as is and --with-preprocessing) and checked by three
independent readers on every test image:
  - onnx.checker (full check, shape inference included);
  - OpenCV's dnn (Debian's python3-opencv), fed images prepared in NumPy (the plain model) or the
    raw 8-bit images (the model with preprocessing);
  - msaflow's own executor (`msaflow predict MODEL.onnx`), against `msaflow predict RUN`;
and `msaflow predict` reproduces the run's reported test accuracy as counts, from the IDX
files, from an image folder of PNGs and through both exported files. Bad inputs get one clear
error each."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import cv2
import numpy as np
import onnx

EXE, ROOT = sys.argv[1], sys.argv[2]
WORK = tempfile.TemporaryDirectory(prefix="msaflow-export-test-")
# ONNX Runtime's CPU build, from npm's onnxruntime-node (MSAFLOW_TESTS=1 scripts/setup.sh).
ORT = os.path.join(ROOT, ".cache", "ort", "node_modules")
RUNS = {}
def msaflow(*args, check=True):
    r = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"msaflow {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr}")
    return r


def run_of(name):
    """The pipeline as shipped, run once for every test that needs it."""
    if name not in RUNS:
        msaflow("run", os.path.join(ROOT, "pipelines", name + ".json"), "--runs", WORK.name, "--run-id", name)
        run_dir = os.path.join(WORK.name, name)
        with open(os.path.join(run_dir, "results.json")) as f:
            res = json.load(f)
        with open(os.path.join(run_dir, "pipeline.json")) as f:
            pipe = json.load(f)
        RUNS[name] = (run_dir, res, pipe)
    return RUNS[name]


def read_idx(path, limit):
    import gzip
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[:4], "big")
    n = int.from_bytes(data[4:8], "big")
    if magic == 0x803:
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        return np.frombuffer(data[16:], np.uint8)[: n * rows * cols].reshape(n, rows, cols)[:limit]
    return np.frombuffer(data[8:], np.uint8)[:n][:limit]


def onnx_runtime(path, feed):
    """The exported model at `path` run by ONNX Runtime on `feed` (tests/integration/ort_run.js)."""
    if not os.path.isdir(os.path.join(ORT, "onnxruntime-node")):
        raise AssertionError(f"ONNX Runtime is not installed in {ORT}: MSAFLOW_TESTS=1 scripts/setup.sh installs it")
    raw = os.path.join(WORK.name, "ort-input.bin")
    np.ascontiguousarray(feed).tofile(raw)
    dtype = "uint8" if feed.dtype == np.uint8 else "float32"
    r = subprocess.run(["node", os.path.join(ROOT, "tests", "integration", "ort_run.js"), path, raw, dtype,
                        *map(str, feed.shape)], capture_output=True, timeout=600, env=dict(os.environ, NODE_PATH=ORT))
    if r.returncode != 0:
        raise AssertionError(f"ONNX Runtime on {path}: {r.stderr.decode()[-2000:]}")
    return np.frombuffer(r.stdout, np.float32).reshape(len(feed), -1).astype(np.float64)


def predictions(out):
    return np.array([e["probabilities"] for e in json.loads(out)], np.float64)


class Export(unittest.TestCase):
    def check_champion(self, name):
        run_dir, res, pipe = run_of(name)
        test = pipe["datasets"]["test"]
        limit = test["limit"]
        images, labels = read_idx(test["images"], limit), read_idx(test["labels"], limit)
        champion = res["champion"]
        reported = sum(c["correct"] for c in champion["test"]["per_class"])
        backbone = next(b for b in pipe["backbones"] if b["name"] == champion["candidate"]["backbone"])
        print(f"{name}: champion {champion['candidate']['id']} on {backbone['name']}, test {reported}/{len(images)}")

        # The run's own model, through msaflow: the reported accuracy, as counts.
        r = msaflow("predict", run_dir, test["images"], "--labels", test["labels"], "--limit", str(limit), "--json")
        ref = predictions(r.stdout)
        self.assertEqual(ref.shape, (len(images), 10))
        self.assertEqual(int((ref.argmax(1) == labels).sum()), reported)
        np.testing.assert_allclose(ref.sum(1), 1, rtol=1e-5)

        for pre in (False, True):
            path = os.path.join(WORK.name, f"{name}{'-pre' if pre else ''}.onnx")
            msaflow("export", run_dir, "-o", path, *(["--with-preprocessing"] if pre else []))
            model = onnx.load(path)
            onnx.checker.check_model(model, full_check=True)
            self.assertEqual(model.opset_import[0].version, 13)
            meta = {p.key: p.value for p in model.metadata_props}
            self.assertEqual(meta["msaflow.candidate"], champion["candidate"]["id"])
            self.assertEqual(meta["msaflow.run"], name)
            self.assertEqual(json.loads(meta["msaflow.classes"]), [str(i) for i in range(10)])
            self.assertEqual(json.loads(meta["msaflow.head"]), champion["candidate"]["head"])
            self.assertEqual(model.graph.input[0].type.tensor_type.shape.dim[0].dim_param, "N")

            # msaflow's executor on the file: what the run computes.
            r = msaflow("predict", path, test["images"], "--labels", test["labels"], "--limit", str(limit), "--json")
            np.testing.assert_allclose(predictions(r.stdout), ref, rtol=1e-5, atol=0)

            # OpenCV's dnn, a reader msaflow shares no code with.
            net = cv2.dnn.readNetFromONNX(path)
            if pre:
                feed = images[:, :, :, None]
            elif backbone.get("kind") == "pixels":
                feed = images[:, :, :, None].astype(np.float32) / np.float32(255)
            else:
                inp = backbone["input"]
                h, w = inp["height"], inp["width"]
                mean = np.array(inp.get("mean", [0, 0, 0]), np.float32).reshape(1, 3, 1, 1)
                std = np.array(inp.get("std", [1, 1, 1]), np.float32).reshape(1, 3, 1, 1)
                x = np.stack([cv2.resize(im.astype(np.float32), (w, h), interpolation=cv2.INTER_LINEAR)
                              for im in images])
                x = np.repeat(x[:, None], 3, axis=1) / np.float32(255)
                feed = ((x - mean) / std).astype(np.float32)
            out = []
            for s in range(0, len(feed), 64):
                net.setInput(np.ascontiguousarray(feed[s:s + 64]))
                out.append(net.forward())
            got = np.concatenate(out).astype(np.float64)
            diff = np.abs(got - ref)
            print(f"  {os.path.basename(path)}: OpenCV's dnn vs msaflow: max abs {diff.max():.2e}, "
                  f"max rel {(diff / np.maximum(ref, 1e-30)).max():.2e}, argmax equal on "
                  f"{int((got.argmax(1) == ref.argmax(1)).sum())}/{len(ref)}")
            # OpenCV sums its float32 convolutions in another order (docs/inference.md, measured
            # up to 2.2e-5 absolute): the same classes on every image, probabilities within 1e-4.
            self.assertTrue((got.argmax(1) == ref.argmax(1)).all())
            self.assertEqual(int((got.argmax(1) == labels).sum()), reported)
            self.assertLess(diff.max(), 1e-4)

            # ONNX Runtime (issue 47), the runtime people deploy with: the run's accuracy exactly.
            ort = onnx_runtime(path, feed.astype(np.float32) if feed.dtype != np.uint8 else feed)
            diff = np.abs(ort - ref)
            print(f"  {os.path.basename(path)}: ONNX Runtime vs msaflow: max abs {diff.max():.2e}, correct "
                  f"{int((ort.argmax(1) == labels).sum())} of {len(ref)} (the run: {reported})")
            self.assertEqual(int((ort.argmax(1) == labels).sum()), reported)
            self.assertLess(diff.max(), 1e-4)
        return run_dir, images, labels, reported

    def test_quickstart_champion(self):
        run_dir, images, labels, reported = self.check_champion("quickstart")
        # An image folder of the test images as PNGs: the same accuracy.
        folder = os.path.join(WORK.name, "folder")
        for i, (im, lab) in enumerate(zip(images, labels)):
            os.makedirs(os.path.join(folder, str(lab)), exist_ok=True)
            cv2.imwrite(os.path.join(folder, str(lab), f"{i:05d}.png"), im)
        r = msaflow("predict", run_dir, folder)
        self.assertIn(f"accuracy: {reported} of {len(images)} labelled images", r.stdout)
        # One image, as a user would ask: the top 3 with probabilities.
        one = os.path.join(folder, str(labels[0]), "00000.png")
        r = msaflow("predict", run_dir, one, "--top", "3", "--json")
        [e] = json.loads(r.stdout)
        self.assertEqual(e["image"], one)
        self.assertEqual(len(e["top"]), 3)
        self.assertEqual(e["top"][0]["class_index"], e["class_index"])
        self.assertGreaterEqual(e["top"][0]["probability"], e["top"][1]["probability"])

    def test_digits_champion(self):
        self.check_champion("digits")

    def test_features_stored_as_float16(self):
        """A backbone whose features the run stored as float16: the export rounds them the same
        way (Cast to float16 and back), so msaflow's executor on the file is the run's model."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from small_pipeline import tiny_pipeline
        doc = tiny_pipeline(ROOT, "half", rounds=1)
        doc["backbones"] = [dict(b, feature_dtype="f16") for b in doc["backbones"] if b["name"] == "ppocrv4"]
        path = os.path.join(WORK.name, "half.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        msaflow("run", path, "--runs", WORK.name, "--run-id", "half")
        run_dir = os.path.join(WORK.name, "half")
        with open(os.path.join(run_dir, "results.json")) as f:
            champion = json.load(f)["champion"]
        test = doc["datasets"]["test"]
        limit = test["limit"]
        images, labels = read_idx(test["images"], limit), read_idx(test["labels"], limit)
        ref = predictions(msaflow("predict", run_dir, test["images"], "--labels", test["labels"], "--limit", str(limit),
                                  "--json").stdout)
        reported = sum(c["correct"] for c in champion["test"]["per_class"])
        self.assertEqual(int((ref.argmax(1) == labels).sum()), reported)
        model = os.path.join(WORK.name, "half.onnx")
        msaflow("export", run_dir, "-o", model)
        onnx.checker.check_model(onnx.load(model), full_check=True)
        self.assertIn("Cast", [n.op_type for n in onnx.load(model).graph.node])
        got = predictions(msaflow("predict", model, test["images"], "--labels", test["labels"], "--limit", str(limit),
                                  "--json").stdout)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=0)
        # OpenCV's dnn reads it and picks the same classes; its probabilities are further off
        # (measured 6e-4: float16's rounding steps magnify its other summation order).
        x = np.stack([cv2.resize(im.astype(np.float32), (48, 48), interpolation=cv2.INTER_LINEAR) for im in images])
        x = np.repeat(((x / np.float32(255) - 0.5) / 0.5).astype(np.float32)[:, None], 3, axis=1)
        net = cv2.dnn.readNetFromONNX(model)
        net.setInput(x)
        out = net.forward().astype(np.float64)
        print(f"  float16 features: OpenCV's dnn vs msaflow: max abs {np.abs(out - ref).max():.2e}")
        self.assertTrue((out.argmax(1) == ref.argmax(1)).all())
        self.assertLess(np.abs(out - ref).max(), 5e-3)

    def test_unlabelled_arrays_are_predicted(self):
        """An IDX or .npy image file without --labels (issue 47): the predictions alone, the same
        probabilities as with the labels, no label and no accuracy line."""
        run_dir, res, pipe = run_of("quickstart")
        test = pipe["datasets"]["test"]
        labelled = json.loads(msaflow("predict", run_dir, test["images"], "--labels", test["labels"], "--limit", "40",
                                      "--json").stdout)
        npy = os.path.join(WORK.name, "unlabelled.npy")
        np.save(npy, read_idx(test["images"], 40))
        for source in (test["images"], npy):
            with self.subTest(source=os.path.basename(source)):
                r = msaflow("predict", run_dir, source, "--limit", "40", "--json")
                got = json.loads(r.stdout)
                self.assertEqual(len(got), 40)
                self.assertTrue(all("label" not in e for e in got))
                np.testing.assert_array_equal(predictions(r.stdout), predictions(json.dumps(labelled)))
                text = msaflow("predict", run_dir, source, "--limit", "40").stdout
                self.assertNotIn("accuracy", text)
                self.assertEqual(len(text.strip().splitlines()), 40, text)

    def test_bad_inputs_get_one_clear_error(self):
        run_dir, res, pipe = run_of("quickstart")
        test = pipe["datasets"]["test"]
        out = os.path.join(WORK.name, "never.onnx")
        cases = [
            (["export", os.path.join(WORK.name, "nope"), "-o", out], 4, "no such run directory"),
            (["export", run_dir, "--candidate", "r9-c99", "-o", out], 4, "r1-c00"),
            (["predict", run_dir, os.path.join(WORK.name, "missing.png")], 4, "missing.png: no such file"),
            (["predict", run_dir, "/dev/zero"], 3, "/dev/zero: not a regular file (a device)"),
        ]
        bad_png = os.path.join(WORK.name, "bad.png")
        with open(bad_png, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
        cases.append((["predict", run_dir, bad_png], 3, "bad.png"))
        not_ours = os.path.join(WORK.name, "not-ours.onnx")
        onnx.save(onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])), not_ours)
        cases.append((["predict", not_ours, bad_png], 3, "not a model `msaflow export` wrote"))
        # An export whose metadata names no precision there is: refused naming the file and the field.
        exported = os.path.join(WORK.name, "to-damage.onnx")
        msaflow("export", run_dir, "-o", exported)
        model = onnx.load(exported)
        for p in model.metadata_props:
            if p.key == "msaflow.backbone":
                bb = json.loads(p.value)
                bb["precision"] = "fp8"
                p.value = json.dumps(bb)
        damaged = os.path.join(WORK.name, "damaged-precision.onnx")
        onnx.save(model, damaged)
        cases.append((["predict", damaged, bad_png], 3, "damaged-precision.onnx: msaflow.backbone's precision is not "
                                                        "f32, bf16 or int8"))
        for args, code, text in cases:
            with self.subTest(args=args[:2]):
                r = msaflow(*args, check=False)
                self.assertEqual(r.returncode, code, r.stdout + r.stderr)
                self.assertIn(text, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertFalse(os.path.exists(out))
        # A run that has not finished: no results.json.
        unfinished = os.path.join(WORK.name, "unfinished")
        os.makedirs(unfinished)
        r = msaflow("export", unfinished, "-o", out, check=False)
        self.assertEqual(r.returncode, 4)
        self.assertIn("has not finished", r.stderr)


if __name__ == "__main__":
    try:
        unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
    finally:
        WORK.cleanup()
