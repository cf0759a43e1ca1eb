#!/usr/bin/python3
"""Fine-tuning as a pipeline asks for it (issue 46, docs/finetune.md): MobileNetV2 with
"train_from": "block_11_expand" on 400/200 Fashion-MNIST images at 64 x 64, round 1 training heads
on frozen features and round 2 fine-tuning blocks 11 to 13 with the kept heads (rounds.
finetune_from_round 2), sync on 2 MPI ranks, then again on 1 rank. Checked:
  - the rounds: round 1's candidates frozen, round 2's fine-tuned from their parents' heads at the
    pipeline's backbone_lr_scale; prepare cached the maps at the freeze point for every split, and
    a second run reuses them;
  - the champion is fine-tuned, and its backbone weights moved from the pretrained ones;
  - 1 rank and 2 ranks train the same tail (each weight tensor to 1e-3 of its norm: the
    kernels sum in another order, and Adam magnifies it);
  - `msaflow predict` on the run, and the exported ONNX file in ONNX Runtime (npm's
    onnxruntime-node) and in msaflow's executor, reproduce the run's reported test accuracy as
    counts (the run computed it as cached maps through the tail; these run the whole network);
  - mode independent on 2 ranks fine-tunes from round 1, a candidate per rank;
  - a run killed (SIGKILL of its coordinator) while round 2 fine-tunes its second candidate
    resumes, reusing the cached maps and the first candidate staged before the kill, to the
    uninterrupted run's champion and accuracies;
  - the refusals, before anything runs: a layer the model lacks, an operator without backward,
    lbfgs, another precision, a finetune_from_round past the last round, maps beyond the NAM's
    capacity, training or evaluation ranks beyond their module's memory;
  - mode async fine-tunes (2 workers and a parameter server) streaming its training maps within
    the dam's memory, its evaluation streams the test maps within the esb's, and its champion
    predicts as reported;
  - the halving strategy continues its best candidates into fine-tuning;
  - `msaflow simulate` calibrated on the run predicts its fine-tuning round at 1,024 nodes, with
    the tail's gradient bytes in each sync update.

usage: finetune_run_test.py MSAFLOW SOURCE_ROOT"""
import copy
import gzip
import json
import os
import re
import subprocess
import signal
import sys
import tempfile
import time
import unittest

import numpy as np
import onnx
from onnx import numpy_helper

EXE, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import processes_naming  # noqa: E402
from small_pipeline import FINETUNE_FROM, finetune_pipeline  # noqa: E402

WORK = tempfile.TemporaryDirectory(prefix="msaflow-finetune-test-")
ORT = os.path.join(ROOT, ".cache", "ort", "node_modules")
TRAIN_FROM = FINETUNE_FROM
TRAIN_FROM_INPUT = "block_10_project_BN"  # the tensor the tail reads: its maps


def msaflow(*args, check=True, env=None):
    r = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"msaflow {' '.join(args)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def pipeline(name, ranks=2):
    return finetune_pipeline(ROOT, name, ranks)


def write(doc, name):
    path = os.path.join(WORK.name, name + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


RUNS = {}


def run(name, ranks):
    if name not in RUNS:
        path = write(pipeline(name, ranks), name)
        out = msaflow("run", path, "--runs", os.path.join(WORK.name, "runs"), "--run-id", name)
        run_dir = os.path.join(WORK.name, "runs", name)
        with open(os.path.join(run_dir, "results.json")) as f:
            RUNS[name] = (run_dir, json.load(f), out.stdout)
    return RUNS[name]


def commands(run_dir):
    """The command lines of the processes that name the run directory (steps, mpirun)."""
    return [cmd for _, cmd in processes_naming(run_dir)]


def read_idx(path, limit):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    if int.from_bytes(data[:4], "big") == 0x803:
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        return np.frombuffer(data[16:], np.uint8)[: n * rows * cols].reshape(n, rows, cols)[:limit]
    return np.frombuffer(data[8:], np.uint8)[:n][:limit]


def exported(run_dir, name, pre=False):
    path = os.path.join(WORK.name, name + ("-pre" if pre else "") + ".onnx")
    msaflow("export", run_dir, "-o", path, *(["--with-preprocessing"] if pre else []))
    return path


def initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


class Finetune(unittest.TestCase):
    def test_rounds_maps_and_champion(self):
        run_dir, res, out = run("ft2", 2)
        rounds = res["rounds"]
        self.assertEqual(len(rounds), 2)
        for c in rounds[0]["candidates"]:
            self.assertNotIn("finetune", c["candidate"])
        fresh = [c for c in rounds[1]["candidates"] if c["candidate"]["id"].startswith("r2-")]
        self.assertEqual(len(fresh), 2)
        for c in fresh:  # (a round's table lists the models kept from before too)
            self.assertEqual(c["candidate"]["finetune"], {"backbone_lr_scale": 0.3})
            self.assertTrue(c["candidate"]["warm_start"].startswith("model/ft2/1/"), c["candidate"])
        self.assertIn("finetune", res["champion"]["candidate"])
        self.assertIn(f"fine-tuned from {TRAIN_FROM}", out)
        for split in ("train", "validation", "test"):
            self.assertRegex(out, rf"maps mobilenetv2/{split} at {TRAIN_FROM}: \d+ images x 1536 values")
        # The champion's exported backbone: the tail's weights trained, the trunk's as pretrained.
        ft = initializers(exported(run_dir, "ft2"))
        frozen = initializers(self.frozen_export(run_dir, res))
        moved = [k for k in ft if k in frozen and ft[k].shape == frozen[k].shape and not np.array_equal(ft[k], frozen[k])]
        self.assertTrue(any(k.startswith("block_11") for k in moved), moved)
        self.assertTrue(all(not k.startswith(("block_10", "block_9", "Conv1")) for k in moved), moved)

    def test_maps_in_the_features_pass_are_those_of_their_own_pass(self):
        # A round that computes a fine-tuning backbone's features computes its maps in the same
        # pass (the trunk once per image). They must be the very bytes the maps' own pass gives
        # (round 2's prepare, when round 1's features were there already), and the features those
        # of the backbone alone.
        def one_round(name, nam, finetune=True):
            doc = pipeline(name, 1)
            doc["nam"] = "file://" + nam
            doc["rounds"].update({"max": 1, "candidates": 1, "finetune_from_round": 1})
            doc["head"]["epochs"] = [1]
            if not finetune:
                del doc["backbones"][0]["train_from"]
                del doc["rounds"]["finetune_from_round"]
            return msaflow("run", write(doc, name), "--runs", os.path.join(WORK.name, "runs-" + name),
                           "--run-id", name).stdout

        one, two = os.path.join(WORK.name, "nam-one-pass"), os.path.join(WORK.name, "nam-two-passes")
        out = one_round("mp-one", one)
        self.assertRegex(out, rf"maps mobilenetv2/train at {TRAIN_FROM}: 360 images x 1536 values .* in the features' pass")
        one_round("mp-frozen", two, finetune=False)
        out = one_round("mp-two", two)
        self.assertRegex(out, rf"maps mobilenetv2/train at {TRAIN_FROM}: 360 images x 1536 values")
        self.assertNotIn("in the features' pass", out)  # the features were there: the maps' own pass

        def objects(nam):
            r = msaflow("nam", "ls", "--json", "--nam", "file://" + nam)  # one object a line
            listed = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
            return {o["name"]: o for o in listed if o["name"].startswith(("maps/", "features/"))}

        def content(nam, listed, obj):
            """The object's bytes (its labels) and its parts' bytes end to end: the rows in order.
            (Maps written in the features' pass come in parts that divide the features' parts, of
            other sizes than the maps' own pass writes.)"""
            out = []
            for name in [obj] + sorted(k for k in listed if k.startswith(obj + ".p")):
                path = os.path.join(WORK.name, "object.bin")
                msaflow("nam", "get", name, "-o", path, "--nam", "file://" + nam)
                with open(path, "rb") as f:
                    out.append(f.read())
            return out[0], b"".join(out[1:])

        a, b = objects(one), objects(two)
        wholes = sorted(k for k in a if ".p" not in k)
        self.assertEqual(wholes, sorted(k for k in b if ".p" not in k))
        self.assertEqual(len([k for k in wholes if k.startswith("maps/")]), 3, wholes)  # train, validation, test
        for obj in wholes:
            labels_a, rows_a = content(one, a, obj)
            labels_b, rows_b = content(two, b, obj)
            self.assertEqual(labels_a, labels_b, obj)
            self.assertGreater(len(rows_a), 0, obj)
            self.assertTrue(rows_a == rows_b, f"{obj}: its rows differ between one pass and two")

    def frozen_export(self, run_dir, res):
        cand = res["rounds"][0]["candidates"][0]["candidate"]["id"]
        path = os.path.join(WORK.name, "ft2-frozen.onnx")
        msaflow("export", run_dir, "--candidate", cand, "-o", path)
        return path

    def test_one_rank_trains_what_two_do(self):
        _, _, _ = run("ft2", 2)
        run_dir1, res1, out1 = run("ft1", 1)
        # The second run found the first one's maps in the NAM (the same content keys).
        self.assertNotRegex(out1, r"maps mobilenetv2/train at")
        a = initializers(exported(RUNS["ft2"][0], "ft2"))
        b = initializers(exported(run_dir1, "ft1"))
        self.assertEqual(res1["champion"]["candidate"]["id"], RUNS["ft2"][1]["champion"]["candidate"]["id"])
        worst, worst_max, which = 0.0, 0.0, ""
        for k in a:
            x, y = a[k].astype(np.float64), b[k].astype(np.float64)
            rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30))
            worst_max = max(worst_max, float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)))
            if rel > worst:
                worst, which = rel, k
        print(f"1 rank vs 2 ranks: largest relative difference of a weight tensor {worst:.2e} ({which}; "
              f"largest single weight's difference {worst_max:.2e} of its tensor's largest)")
        # Sync on 2 ranks sums each rank's half-batch gradient; one rank computes the whole batch's
        # at once. oneDNN's kernels for a batch of 16 and of 32 add in other orders (on AVX-512 more
        # than on AVX2), and Adam, which divides by the gradient's running size, magnifies those
        # last bits where a gradient is near 0. Measured: 4e-6 on an AVX2 CPU, 2.1e-4 on an
        # AVX-512 one (block_12_expand.W). A rank's share lost or counted twice is 1e-1 or more.
        self.assertLess(worst, 1e-3)

    def test_predict_and_onnx_runtime_reproduce_the_accuracy(self):
        run_dir, res, _ = run("ft2", 2)
        self.assertExportReproduces(run_dir, res, "ft2")

    def assertExportReproduces(self, run_dir, res, name):
        """msaflow predict on the run counts the reported test accuracy on 200 test images, on
        the run's export gives the same probabilities, and ONNX Runtime on its export with
        preprocessing counts it too. Returns the plain export's path."""
        with open(os.path.join(run_dir, "pipeline.json")) as f:
            test = json.load(f)["datasets"]["test"]
        limit = 200
        images, labels = read_idx(test["images"], limit), read_idx(test["labels"], limit)
        reported = sum(c["correct"] for c in res["champion"]["test"]["per_class"])
        r = msaflow("predict", run_dir, test["images"], "--labels", test["labels"], "--limit", str(limit), "--json")
        ref = np.array([e["probabilities"] for e in json.loads(r.stdout)], np.float64)
        self.assertEqual(int((ref.argmax(1) == labels).sum()), reported)
        plain = exported(run_dir, name)
        r = msaflow("predict", plain, test["images"], "--labels", test["labels"], "--limit", str(limit), "--json")
        mine = np.array([e["probabilities"] for e in json.loads(r.stdout)], np.float64)
        np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-7)
        self.assertOrtCounts(run_dir, name, images, labels, ref, reported)
        return plain

    def assertOrtCounts(self, run_dir, name, images, labels, ref, reported):
        """The run's export with preprocessing, in ONNX Runtime on the raw images, counts the
        run's reported test accuracy and gives msaflow predict's probabilities `ref`."""
        if not os.path.isdir(os.path.join(ORT, "onnxruntime-node")):
            self.fail(f"ONNX Runtime is not installed in {ORT}: MSAFLOW_TESTS=1 scripts/setup.sh installs it")
        pre = exported(run_dir, name, pre=True)
        raw = os.path.join(WORK.name, name + "-images.u8")
        images[:, :, :, None].tofile(raw)
        limit = len(labels)
        got = subprocess.run(["node", os.path.join(ROOT, "tests", "integration", "ort_run.js"), pre, raw, "uint8",
                              str(limit), "28", "28", "1"], capture_output=True, timeout=300,
                             env=dict(os.environ, NODE_PATH=ORT))
        self.assertEqual(got.returncode, 0, got.stderr.decode()[-2000:])
        probs = np.frombuffer(got.stdout, np.float32).reshape(limit, -1).astype(np.float64)
        diff = np.abs(probs - ref).max()
        print(f"{name}: ONNX Runtime (with preprocessing) vs msaflow predict: max abs {diff:.2e}, "
              f"correct {int((probs.argmax(1) == labels).sum())} of {limit}, the run reported {reported}")
        self.assertEqual(int((probs.argmax(1) == labels).sum()), reported)
        self.assertLess(diff, 1e-4)

    def test_killed_mid_finetuning_resume_reaches_the_same_champion(self):
        _, want, _ = run("ft2", 2)
        doc = pipeline("ftkill", 2)
        # Rank 1 sleeps 5x its step time (sync waits for it; the weights do not change), so that
        # the second candidate's fine-tuning lasts long enough to be killed in.
        doc["steps"]["train"]["straggler"] = {"rank": 1, "factor": 5.0}
        path = write(doc, "ftkill")
        runs = os.path.join(WORK.name, "runs-kill")
        run_dir = os.path.join(runs, "ftkill")
        log_path = os.path.join(WORK.name, "ftkill.log")
        log = open(log_path, "w")
        proc = subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", "ftkill"], stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        # Round 2's first fine-tuned candidate staged: kill while the second trains.
        while "trained r2-c00" not in open(log_path).read():
            self.assertIsNone(proc.poll(), "the run ended before round 2's first candidate was trained")
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        self.assertTrue(any("r2-train" in c for c in commands(run_dir)), "round 2's train step is not running")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        st = msaflow("status", run_dir, check=False)
        self.assertIn("state: interrupted", st.stdout)
        r = msaflow("resume", run_dir)
        self.assertNotRegex(r.stdout, r"maps mobilenetv2/\w+ at")  # the cached maps, reused
        self.assertIn("r2-c00: staged by an earlier attempt of this step, not trained again", r.stdout)
        self.assertNotRegex(r.stdout, r"trained r2-c00 ")
        self.assertRegex(r.stdout, rf"trained r2-c01 .*fine-tuned from {TRAIN_FROM}")  # the killed one, again
        with open(os.path.join(run_dir, "results.json")) as f:
            got = json.load(f)
        for key in ("accuracy",):
            self.assertEqual(got["champion"][key], want["champion"][key])
        self.assertEqual(got["champion"]["candidate"]["id"], want["champion"]["candidate"]["id"])
        self.assertEqual(got["champion"]["test"]["accuracy"], want["champion"]["test"]["accuracy"])

    def test_independent_ranks_fine_tune_from_round_one(self):
        doc, out, run_dir, res = self.one_round("ftind", {"module": "dam", "ranks": 2, "mode": "independent"}, 2)
        self.assertIn("[0] fine-tuning candidates dealt in turn: r1-c00", out)
        self.assertIn("[1] fine-tuning candidates dealt in turn: r1-c01", out)
        for c in res["rounds"][0]["candidates"]:  # no warm start: heads initialised on the tail's features
            self.assertEqual(c["candidate"]["finetune"], {"backbone_lr_scale": 0.3})
            self.assertEqual(c["candidate"]["warm_start"], "")
        self.assertPredictCounts(doc, run_dir, res)

    def one_round(self, name, train, candidates, memory=None, test_images=200):
        """A one-round run of `name` that fine-tunes from round 1 with the train step `train`
        (on a local machine whose modules' nodes have `memory`, {module: size}, if given) on
        `test_images` test images: the pipeline, the run's output, its directory and its results."""
        doc = pipeline(name)
        doc["rounds"] = {"max": 1, "candidates": candidates, "top_k": 1, "strategy": "perturb", "seed": 3}
        doc["steps"]["train"] = train
        doc["datasets"]["test"]["limit"] = test_images
        if memory:
            with open(os.path.join(ROOT, "configs", "machines", "local.json")) as f:
                machine = json.load(f)
            for module, size in memory.items():
                machine["modules"][module]["memory"] = size
            doc["machine"] = write(machine, name + "-machine")
        runs = os.path.join(WORK.name, "runs-" + name)
        out = msaflow("run", write(doc, name), "--runs", runs, "--run-id", name).stdout
        with open(os.path.join(runs, name, "results.json")) as f:
            return doc, out, os.path.join(runs, name), json.load(f)

    def assertPredictCounts(self, doc, run_dir, res):
        """`msaflow predict` on the run counts the champion's reported test accuracy."""
        test = doc["datasets"]["test"]
        images = test["limit"]
        r = msaflow("predict", run_dir, test["images"], "--labels", test["labels"], "--limit", str(images))
        reported = sum(c["correct"] for c in res["champion"]["test"]["per_class"])
        self.assertIn(f"accuracy: {reported} of {images} labelled images", r.stdout)

    def test_maps_in_float16(self):
        # feature_dtype f16: every split's maps are stored as float16 (half the NAM bytes); the
        # model the run exports, predicts and serves with rounds the trunk's output through float16
        # where the tail reads it (a Cast to float16 and back), so that msaflow predict (whose
        # executor runs the pair) and ONNX Runtime count the reported test accuracy.
        doc = pipeline("maps-f16", 1)
        doc["backbones"][0]["feature_dtype"] = "f16"
        doc["nam"] = "file://" + os.path.join(WORK.name, "nam-f16")
        doc["rounds"].update({"max": 1, "candidates": 1, "finetune_from_round": 1})
        runs = os.path.join(WORK.name, "runs-maps-f16")
        run_dir = os.path.join(runs, "maps-f16")
        msaflow("run", write(doc, "maps-f16"), "--runs", runs, "--run-id", "maps-f16")
        with open(os.path.join(run_dir, "results.json")) as f:
            res = json.load(f)
        self.assertIn("finetune", res["champion"]["candidate"])
        r = msaflow("nam", "ls", "maps/", "--json", "--nam", doc["nam"])
        listed = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
        wholes = {o["meta"]["split"]: o for o in listed if ".p" not in o["name"]}
        self.assertEqual(sorted(wholes), ["test", "train", "validation"])
        for split, o in wholes.items():
            parts = [p for p in listed if p["name"].startswith(o["name"] + ".p")]
            self.assertEqual(o["meta"].get("dtype", "f32"), "f16", split)
            self.assertEqual(sum(p["size"] for p in parts), o["meta"]["rows"] * 1536 * 2, split)
        plain = self.assertExportReproduces(run_dir, res, "maps-f16")
        casts = [(n.input[0], n.attribute[0].i) for n in onnx.load(plain).graph.node if n.op_type == "Cast"]
        self.assertEqual(casts, [(TRAIN_FROM_INPUT, onnx.TensorProto.FLOAT16),
                                 (f"msaflow.f16/{TRAIN_FROM_INPUT}", onnx.TensorProto.FLOAT)], casts)
        # plan counts the maps at two bytes a value: 600 x 1536 x 2 bytes.
        plan = msaflow("plan", write(doc, "maps-f16-plan")).stdout
        self.assertIn("1536 values an image, 1.8 MB for the 600 images of the splits", plan)

    def test_async_fine_tunes_with_a_parameter_server(self):
        # The dam's nodes have 48 MiB for 3 processes: 16.8 MB a rank, 14.7 MB of them the tail's
        # activations for a batch of 32, so the 2.2 MB of training maps are streamed within 2.0 MB.
        # The esb's have 63 MiB for its 2 evaluation ranks: 33.0 MB a rank, 29.5 MB of them the
        # activations for a batch of 64, the rest shared by the validation and test maps: the 400
        # test images' 2.5 MB of maps are streamed within 1.8 MB (the validation's held whole),
        # and the test accuracy evaluation computes from them is the one predict counts.
        doc, out, run_dir, res = self.one_round("ftasync", {"module": "dam", "ranks": 2, "mode": "async"}, 1,
                                                memory={"dam": "48MiB", "esb": "63MiB"}, test_images=400)
        self.assertRegex(out, r"trained r1-c00 .*\[async on 2 ranks \+ 1 server\(s\), staleness mean [0-9.]+ max \d+, "
                              rf"\d+ refused\] \[fine-tuned from {TRAIN_FROM}: 289920 weights at lr x 0.3\]")
        self.assertIn("fine-tuning mobilenetv2: the training maps (2.2 MB) streamed from the NAM, at most 2.0 MB a rank",
                      out)
        for rank in (1, 2):  # the workers, each streaming its shard's parts pass after pass
            read = [int(x) for x in re.findall(rf"fine-tuning r1-c00: rank {rank} read (\d+) maps parts", out)]
            self.assertTrue(read and read[0] >= 4, out[-3000:])
        print("streamed: " + "; ".join(re.findall(r"fine-tuning r1-c00: rank \d read [^\n]*", out)))
        self.assertIn("fine-tuning mobilenetv2: the test maps (2.5 MB) streamed from the NAM for evaluation, at most "
                      "1.8 MB a rank (the rank's memory 33.0 MB less 29.5 MB of activations, shared by 2 maps)", out)
        held = [float(x) for x in re.findall(r"rank \d/2: evaluated .* maps parts read \([0-9.]+ MB\), held at most "
                                             r"([0-9.]+) MB", out)]
        self.assertEqual(len(held), 2, out[-3000:])
        self.assertTrue(all(h <= 1.8 + 0.3 for h in held), held)  # the test's share and the validation's 0.24 MB
        champion = res["champion"]
        self.assertEqual(champion["candidate"]["finetune"], {"backbone_lr_scale": 0.3})
        # 400 images, 3 epochs from a head initialised on the pretrained tail: it learns (10 classes).
        print(f"async fine-tuning: validation {champion['accuracy']:.3f}, test {champion['test']['accuracy']:.3f}")
        self.assertGreater(champion["test"]["accuracy"], 0.5)
        # The trained weights are the servers': the export's tail moved from the pretrained one.
        ft = initializers(exported(run_dir, "ftasync"))
        pre = {t.name: numpy_helper.to_array(t) for t in onnx.load(doc["backbones"][0]["onnx"]).graph.initializer}
        moved = [k for k in ft if k in pre and ft[k].shape == pre[k].shape and not np.array_equal(ft[k], pre[k])]
        self.assertTrue(any(k.startswith("block_13") for k in moved), moved)
        self.assertTrue(all(not k.startswith(("block_10", "block_9", "Conv1")) for k in moved), moved)
        self.assertPredictCounts(doc, run_dir, res)

    def test_halving_continues_into_fine_tuning(self):
        doc = pipeline("fthalv")
        doc["backbones"].append({"name": "pixels", "kind": "pixels"})
        doc["head"]["lr"] = [0.001, 0.003]
        doc["steps"]["train"] = {"module": "dam", "ranks": 2, "mode": "independent"}
        doc["rounds"] = {"max": 2, "candidates": 4, "top_k": 1, "seed": 6, "strategy": "halving", "eta": 2,
                         "finetune_from_round": 2}
        runs = os.path.join(WORK.name, "runs-halving")
        out = msaflow("run", write(doc, "fthalv"), "--runs", runs, "--run-id", "fthalv").stdout
        self.assertIn("rung 0: ranking 2 backbones", out)
        with open(os.path.join(runs, "fthalv", "results.json")) as f:
            res = json.load(f)
        r1 = [c["candidate"] for c in res["rounds"][0]["candidates"]]
        r2 = [c["candidate"] for c in res["rounds"][1]["candidates"] if c["candidate"]["id"].startswith("r2-")]
        self.assertTrue(all("finetune" not in c for c in r1), r1)
        self.assertEqual(len(r2), 2)  # the best half of round 1, continued
        for c in r2:
            self.assertEqual(c["finetune"], {"backbone_lr_scale": 0.3})
            self.assertEqual(c["warm_start"], f"model/fthalv/1/{c['parent']}")
            self.assertRegex(out, rf"trained {c['id']} .*fine-tuned from {TRAIN_FROM}")

    def test_simulate_predicts_a_fine_tuning_round_at_1024_nodes(self):
        run_dir, _, _ = run("ft2", 2)
        r = msaflow("simulate", os.path.join(WORK.name, "ft2.json"), "--from-runs", run_dir, "--machine",
                    os.path.join(ROOT, "configs", "machines", "msa-1000.json"), "--nodes", "dam=1024", "--ranks",
                    "train=1024", "--json")
        sim = json.loads(r.stdout)
        frozen, tuned = (rd["train"] for rd in sim["calibration"]["rounds"])
        # Round 2's sync update moves the head's and the tail's gradient (290k weights), round 1's the head's.
        self.assertGreater(tuned["model_bytes"], 289920 * 4)
        self.assertLess(frozen["model_bytes"], 100_000)
        # Fitted apart: a tail's update against a head's (7x here; pooled, both were their average).
        self.assertTrue(tuned["finetunes"] and not frozen["finetunes"])
        self.assertGreater(tuned["per_item_s"], 2 * frozen["per_item_s"])
        steps = {s["step"]: s for s in sim["rounds"][1]["steps"]}
        self.assertEqual((steps["train"]["ranks"], steps["train"]["nodes"]), (1024, 1024))
        self.assertGreater(steps["train"]["seconds"], 0)
        print(f"simulate: round 2's fine-tuning train step at 1,024 ranks {steps['train']['seconds']:.2f} s; "
              f"calibrated {tuned['per_item_s'] * 1e3:.1f} ms an update (round 1's heads "
              f"{frozen['per_item_s'] * 1e3:.1f} ms), {tuned['model_bytes'] / 1e6:.2f} MB a sum")

    def test_plan_says_what_trains_and_the_maps_bytes(self):
        r = msaflow("plan", write(pipeline("planned"), "planned"))
        self.assertIn("fine-tuning mobilenetv2: from round 2, its 14 layers from block_11_expand to "
                      "block_13_expand_relu (289920 weights) train with the heads on module dam, 2 ranks (sync), at "
                      "the head's learning rate x 0.3, for 3 epochs; the trunk's maps at block_10_project_BN (96 x 4 x "
                      "4) cached in the NAM: 1536 values an image, 3.7 MB for the 600 images of the splits; each "
                      "training rank holds 9.6 MB (2.2 MB of maps, 7.4 MB of activations for 16 images)", r.stdout)

    def refused(self, doc, kind, *needles):
        r = msaflow("validate", write(doc, "bad"), check=False)
        self.assertEqual(r.returncode, kind, r.stdout + r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        self.assertEqual(len(lines), 1, r.stderr)
        for n in needles:
            self.assertIn(n, lines[0])

    def test_refusals(self):
        doc = pipeline("bad")
        d = copy.deepcopy(doc)
        d["backbones"][0]["train_from"] = "block_11_expnd"
        self.refused(d, 4, "train_from 'block_11_expnd'", "did you mean", "block_11_expand")
        d = copy.deepcopy(doc)
        d["head"]["optimizer"] = ["adam", "lbfgs"]
        self.refused(d, 3, "/head/optimizer", "lbfgs", "/backbones/0/train_from")
        d = copy.deepcopy(doc)
        d["backbones"][0]["precision"] = "bf16"
        self.refused(d, 3, "/backbones/0/train_from", "precision")
        d = copy.deepcopy(doc)
        d["rounds"]["finetune_from_round"] = 3
        self.refused(d, 3, "/rounds/finetune_from_round", "after the last round")
        d = copy.deepcopy(doc)  # maps of 3.7 MB for a NAM of 1 MiB
        with open(os.path.join(ROOT, "configs", "machines", "local.json")) as f:
            machine = json.load(f)
        machine["nam"]["capacity"] = "1MiB"
        d["machine"] = write(machine, "small-nam")
        self.refused(d, 3, "fine-tuning: the maps of every split take 3.7 MB", "capacity of 1MiB")
        d = copy.deepcopy(doc)  # 2 ranks of 9.6 MB each on a module whose nodes have 16 MiB: streamed
        machine["nam"]["capacity"] = "2GiB"  # maps would fit in 1.0 MB a rank, but two parts take 1.6 MB
        machine["modules"]["dam"]["memory"] = "16MiB"
        d["machine"] = write(machine, "small-dam")
        self.refused(d, 3, "fine-tuning mobilenetv2: each training rank needs 8.9 MB: the tail's activations for 16 "
                     "images (7.4 MB) and at least two parts of the training maps streamed from the NAM (1.6 MB; all "
                     "of them take 2.2 MB); a node of module dam has 16.8 MB for 2 ranks, 8.4 MB each",
                     "modules.dam.memory")
        machine["modules"]["dam"]["memory"] = "18MiB"  # 9.4 MB a rank: the maps streamed within 2.1 MB
        d["machine"] = write(machine, "streaming-dam")
        r = msaflow("validate", write(d, "streaming"))
        self.assertIn("each training rank holds 9.4 MB (at most 2.1 MB of maps streamed from the NAM, of 2.2 MB, as "
                      "its memory of 9.4 MB allows, 7.4 MB of activations for 16 images)", r.stdout)
        machine["modules"]["dam"]["memory"] = "32MiB"  # fits whole
        d["machine"] = write(machine, "enough-dam")
        r = msaflow("validate", write(d, "enough"))
        self.assertIn("each training rank holds 9.6 MB (2.2 MB of maps, 7.4 MB", r.stdout)
        # Evaluation: 2 esb ranks of 21.0 MB cannot hold the tail's activations for a batch of 64.
        machine["modules"]["esb"]["memory"] = "40MiB"
        d["machine"] = write(machine, "small-esb")
        self.refused(d, 3, "fine-tuning mobilenetv2: each evaluation rank needs 31.0 MB: the tail's activations for 64 "
                     "images (29.5 MB) and at least two parts of the maps of each split it evaluates; a rank of "
                     "module esb has 21.0 MB", "modules.esb.memory")
        machine["modules"]["esb"]["memory"] = "64MiB"  # 33.5 MB a rank: both splits' 1.5 MB held whole
        d["machine"] = write(machine, "esb-64")
        r = msaflow("validate", write(d, "enough-esb"))
        self.assertIn("each evaluation rank on module esb holds 31.0 MB (1.5 MB of maps of its 2 evaluated splits, "
                      "held whole, 29.5 MB of activations for 64 images)", r.stdout)
        d = copy.deepcopy(doc)
        d["backbones"][0]["train_from"] = "block_13_expand_relu"  # ReLU6 at the cut: no weights after it
        self.refused(d, 3, "train_from 'block_13_expand_relu'", "no weights")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
