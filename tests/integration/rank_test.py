#!/usr/bin/python3
"""`msaflow rank` through the real CLI (issue 30): the backbones of a pipeline ranked on a
stratified subset of its training images, training nothing. The raw-pixels backbone's
estimates are recomputed here from the IDX bytes of the rows the command names, by the
independent NumPy reference (tests/python/transferability_reference.py); the table is ordered by
kNN; a feature layer list ranks one model cut at several depths; bad input is refused as
validate refuses it; a run with rounds.strategy "halving" keeps what rung 0 (the same ranking)
keeps, prepares and trains only those backbones, continues the best half of its heads from their
weights, journals the decision and `why` explains it."""
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

EXE, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import transferability_reference as ref  # noqa: E402

FASHION = os.path.join(ROOT, "data", "fashion-mnist")
MODEL = os.path.join(ROOT, "models", "mobilenet_v2.onnx")
OCR = os.path.join(ROOT, "models", "ch_PP-OCRv4_rec_infer.onnx")


def msaflow(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600)


STOP_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def signal_bits(pid, field):
    """A signal mask of /proc/PID/status (SigBlk: the main thread's; SigCgt: the process's)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def pipeline(limit=1500):
    return {
        "name": "rank",
        "datasets": {
            "train": {"images": os.path.join(FASHION, "train-images-idx3-ubyte.gz"),
                      "labels": os.path.join(FASHION, "train-labels-idx1-ubyte.gz"), "limit": limit},
            "test": {"images": os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"),
                     "labels": os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"), "limit": 200},
        },
        "select_on": "test",
        "backbones": [
            {"name": "pixels", "kind": "pixels"},
            {"name": "mnv2", "onnx": MODEL, "feature_layer": ["block_3_expand_relu", "block_13_expand_relu"],
             "input": {"height": 32, "width": 32}},
        ],
    }


def halving_doc():
    doc = pipeline()
    # A second model, cut twice: five backbones, of which rung 0 keeps three that run two models
    # (the data grows only while the race runs at least two: docs/search.md).
    doc["backbones"].append({"name": "ocr", "onnx": OCR, "feature_layer": ["conv2d_195.tmp_0", "p2o.AveragePool.1"],
                             "input": {"height": 48, "width": 48, "mean": [0.5] * 3, "std": [0.5] * 3}})
    doc["datasets"]["validation"] = {"from": "train", "fraction": 0.2, "seed": 1}
    doc["select_on"] = "validation"
    doc["head"] = {"type": "softmax", "lr": [0.001, 0.003], "epochs": 4}
    doc["steps"] = {"train": {"mode": "independent"}, "evaluate": {"ranks": 1}}
    doc["rounds"] = {"max": 2, "candidates": 4, "top_k": 1, "seed": 6, "strategy": "halving", "eta": 2,
                     "rank_fraction": 0.15}
    return doc


def idx(path, limit):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[2] == 8 and raw[3] == 3:
        return np.frombuffer(raw, np.uint8, offset=16)[:limit * 784].reshape(limit, 784)
    return np.frombuffer(raw, np.uint8, offset=8)[:limit]


class Rank(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "p.json")
        with open(cls.path, "w") as f:
            json.dump(pipeline(), f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_pixels_estimates_match_the_numpy_reference(self):
        r = msaflow("rank", self.path, "--json", "--fraction", "0.1", "--min-per-class", "12", "--seed", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        rows = np.array(out["subset_rows"])
        labels = idx(os.path.join(FASHION, "train-labels-idx1-ubyte.gz"), 1500)
        self.assertEqual(out["train_images"], 1500)
        self.assertEqual(out["subset_images"], len(rows))
        counts = np.bincount(labels[rows], minlength=10)
        want = np.maximum(12, np.floor(0.1 * np.bincount(labels, minlength=10) + 0.5))  # halves up; at least 12
        np.testing.assert_array_equal(counts, want)
        by_name = {b["backbone"]: b for b in out["backbones"]}
        self.assertEqual(set(by_name), {"pixels", "mnv2.block_3_expand_relu", "mnv2.block_13_expand_relu"})
        x = idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"), 1500)[rows].astype(np.float32) / np.float32(255)
        y = labels[rows]
        px = by_name["pixels"]
        self.assertEqual(px["dim"], 784)
        self.assertAlmostEqual(px["logme"], ref.logme(x.astype(np.float64), y, 10), delta=1e-7 * abs(px["logme"]))
        self.assertEqual(px["knn"], ref.knn(x.astype(np.float64), y, 5))
        # Best first by kNN; the two cuts of one model have their own widths.
        knn = [b["knn"] for b in out["backbones"]]
        self.assertEqual(knn, sorted(knn, reverse=True))
        self.assertEqual(by_name["mnv2.block_13_expand_relu"]["dim"], 576)
        self.assertEqual(by_name["mnv2.block_3_expand_relu"]["dim"], 144)
        # ... and one pass of the model gives both (tests/integration/features_test.cc: the same bits).
        for cut in ("mnv2.block_3_expand_relu", "mnv2.block_13_expand_relu"):
            self.assertEqual(by_name[cut]["note"], "one pass for 2 cuts of mobilenet_v2.onnx")
        self.assertEqual(by_name["pixels"]["note"], "")
        for b in out["backbones"]:
            self.assertGreater(b["knn"], 0.3)  # ten classes: chance is 0.1
        # Another seed takes other images.
        other = json.loads(msaflow("rank", self.path, "--json", "--seed", "5").stdout)
        self.assertNotEqual(other["subset_rows"], out["subset_rows"])

    def test_the_table_and_bad_input(self):
        r = msaflow("rank", self.path, "--max-images", "200")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("rank: 3 backbones on "), lines[0])
        self.assertIn("of 1500 training images", lines[0])
        self.assertLessEqual(int(lines[0].split(" on ")[1].split()[0]), 200)
        self.assertEqual(lines[1].split(), ["backbone", "kNN", "LogME", "features", "seconds"])
        self.assertEqual(len(lines), 6)
        self.assertEqual(msaflow("rank", self.path, "--fraction", "0").returncode, 2)
        doc = pipeline()
        doc["backbones"][1]["onnx"] = os.path.join(self.tmp.name, "missing.onnx")
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            json.dump(doc, f)
        v, r = msaflow("validate", bad), msaflow("rank", bad)
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertEqual((r.returncode, r.stderr), (v.returncode, v.stderr))
        self.assertEqual(r.stdout, "")

    def test_a_killed_halving_run_resumes_with_the_decision_it_made(self):
        path = os.path.join(self.tmp.name, "halving-resume.json")
        with open(path, "w") as f:
            json.dump(halving_doc(), f)
        runs = os.path.join(self.tmp.name, "runs-resume")
        run_dir = os.path.join(runs, "h")
        proc = subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", "h"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        journal = os.path.join(run_dir, "journal.jsonl")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(journal) and '"round-start"' in open(journal).read():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # in round 1, after rung 0
        proc.wait()
        with open(os.path.join(run_dir, "rung0.json")) as f:
            decided = json.load(f)
        r = msaflow("resume", run_dir)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        self.assertIn("rung 0: decided before the run was resumed", r.stdout)
        with open(journal) as f:
            events = [json.loads(line).get("event") for line in f if line.strip()]  # line 1: the format
        self.assertEqual(events.count("rung0"), 1)
        self.assertIn("resume", events)
        with open(os.path.join(run_dir, "results.json")) as f:
            res = json.load(f)
        self.assertEqual(res["halving"]["rung0"], decided)
        self.assertTrue(all(c["candidate"]["backbone"] in decided["kept"] for r in res["rounds"] for c in r["candidates"]))

    def test_a_cancel_during_rung_0_ends_the_run_there_as_cancelled(self):
        # Rung 0 is the coordinator's own work (no task to wait on): the signal is looked for as
        # each backbone is ranked, and the journal records the cancel, before round 1.
        doc = halving_doc()
        doc["datasets"]["train"]["limit"] = 3000  # rung 0 of a few seconds: the cancel lands in it
        doc["rounds"]["rank_fraction"] = 1.0
        path = os.path.join(self.tmp.name, "halving-cancel.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        runs = os.path.join(self.tmp.name, "runs-cancel")
        run_dir = os.path.join(runs, "c")
        proc = subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", "c"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("rung 0: ranking"):
                break
        # While it ranks, the coordinator holds SIGINT/SIGTERM back from its computing threads (a
        # signal landing in oneDNN's kernels corrupted the heap), and an abort is not caught (it
        # was, by libinfinipath, whose handler then deadlocked): it would die, not hang.
        deadline = time.monotonic() + 30
        while not signal_bits(proc.pid, "SigBlk") & STOP_BITS == STOP_BITS and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(signal_bits(proc.pid, "SigBlk") & STOP_BITS, STOP_BITS, "SIGINT/SIGTERM not held in rung 0")
        self.assertEqual(signal_bits(proc.pid, "SigCgt") & STOP_BITS, STOP_BITS)  # the coordinator's handler
        self.assertFalse(signal_bits(proc.pid, "SigCgt") & (1 << (signal.SIGABRT - 1)), "SIGABRT is caught")
        c = msaflow("cancel", run_dir)
        self.assertEqual(c.returncode, 0, c.stdout + c.stderr)
        seen += proc.stdout.readlines()
        proc.stdout.close()
        self.assertNotEqual(proc.wait(timeout=120), 0, "".join(seen))
        with open(os.path.join(run_dir, "journal.jsonl")) as f:
            events = [json.loads(line) for line in f if line.strip()][1:]  # line 1: the format
        names = [e.get("event") for e in events]
        self.assertNotIn("rung0", names)
        self.assertNotIn("round-start", names)
        failed = events[-1]
        self.assertEqual(failed["event"], "run-failed", names)
        self.assertEqual(failed["round"], 0)
        self.assertTrue(failed["cancelled"])
        self.assertIn("during rung 0", failed["error"])
        self.assertFalse(os.path.exists(os.path.join(run_dir, "rung0.json")))
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 1, st.stdout + st.stderr)
        self.assertIn("state: cancelled: interrupted by signal 15 during rung 0", st.stdout, st.stderr)

    def test_a_halving_run_trains_only_what_rung_0_keeps(self):
        doc = halving_doc()
        path = os.path.join(self.tmp.name, "halving.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        v = msaflow("validate", path)
        self.assertIn("rounds: halving: rung 0 ranks 5 backbones by knn on 15% of each class and keeps 3; heads 4 x 4 "
                      "epochs on 50 % of the data, then 2 x 2 epochs on all the data (continued: as many steps as 2, 4 "
                      "epochs of all the data by each round's end)", v.stdout)
        self.assertIn("rounds: halving: while the race runs two models or more, the test split waits for the last "
                      "round (2): no backbone that leaves the race before it runs a test image", v.stdout)
        runs = os.path.join(self.tmp.name, "runs")
        r = msaflow("run", path, "--runs", runs, "--run-id", "halving")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        with open(os.path.join(runs, "halving", "results.json")) as f:
            res = json.load(f)
        rung0 = res["halving"]["rung0"]
        # Rung 0 is `msaflow rank` on the same subset: the same figures, the best three by kNN kept.
        ranked = json.loads(msaflow("rank", path, "--json", "--fraction", "0.15", "--seed", "6").stdout)
        self.assertEqual({b["backbone"]: (b["knn"], b["logme"]) for b in ranked["backbones"]},
                         {b["backbone"]: (b["knn"], b["logme"]) for b in rung0["backbones"]})
        order = sorted(rung0["backbones"], key=lambda b: (-b["knn"], -b["logme"]))
        kept = [b["backbone"] for b in order[:3]]
        self.assertEqual(rung0["kept"], kept)
        self.assertEqual(rung0["dropped"], [b["backbone"] for b in order[3:]])
        self.assertEqual(len({MODEL if b.startswith("mnv2") else OCR for b in kept if b != "pixels"}), 2, kept)
        self.assertIn("rung 0: ranking 5 backbones by kNN", r.stdout)
        # Only the kept backbones were prepared and trained on, round 1 on half the training split
        # (stratified), round 2 on all of it.
        r1, r2 = res["rounds"]
        self.assertEqual({e["backbone"] for e in r1["features"]["computed"]}, set(kept))
        train_rows = rung0["train_images"]  # 1500 less the validation carve's fifth
        self.assertLess(abs(train_rows - 1200), 5)
        half = [e["rows"] for e in r1["features"]["computed"] if e["split"] == "train"]
        self.assertTrue(half and all(abs(n - train_rows // 2) <= 10 for n in half), half)
        # Rung 0's subset ran through each kept model once: prepare took those rows' features from
        # it (one computed again as a check), not from the backbone (bit for bit the same: the
        # modules unit test Rung0sFeaturesAreNotComputedAgainAndChangeNoBit).
        onnx_train = [e for e in r1["features"]["computed"] if e["split"] == "train" and e["backbone"] != "pixels"]
        self.assertTrue(onnx_train, kept)
        for e in onnx_train:
            self.assertEqual(e["reused_rows"], rung0["subset_images"] - 1, e)
            self.assertIn("identical", e["per_rank"][0]["spot_check"])
            self.assertIn(f"features {e['backbone']}/train: {rung0['subset_images'] - 1} of rows [0, {e['rows']}) known "
                          f"({rung0['subset_images']} from rung 0)", r.stdout)
        self.assertTrue(all("reused_rows" not in e for e in r1["features"]["computed"] if e["split"] != "train"))
        # Round 2 grows the data for the backbones whose heads go on, and only for those: the rows
        # round 1 computed are taken from its features (the modules unit test
        # AHalvingRoundsDataGrowsFromTheRoundBefore checks the bytes).
        with open(os.path.join(runs, "halving", "journal.jsonl")) as f:
            events = [json.loads(line) for line in f if line.strip()]
        starts = {e["round"]: e["halving"] for e in events if e.get("event") == "round-start"}
        self.assertEqual(sorted(starts[1]["backbones"]), sorted(kept))
        self.assertEqual(starts[1]["train_fraction"], 0.5)
        self.assertEqual([r1["halving"], r2["halving"]], [starts[1], starts[2]])  # results.json says it too
        race = sorted({c["candidate"]["backbone"] for c in r2["candidates"] if c["candidate"]["id"].startswith("r2-")})
        self.assertEqual(sorted(starts[2]["backbones"]), race)
        self.assertEqual(starts[2]["train_fraction"], 1)
        self.assertIn(f"round 2 (halving): {len(race)} backbone", r.stdout)
        grown = [e for e in r2["features"]["computed"] if e["split"] == "train"]
        self.assertEqual(sorted(e["backbone"] for e in grown), race)
        for e in grown:
            self.assertEqual(e["rows"], train_rows)
            before = next(b for b in r1["features"]["computed"] if b["split"] == "train" and b["backbone"] == e["backbone"])
            if e["backbone"] != "pixels":
                self.assertEqual(e["reused_rows"], before["rows"] - 1, e)
                self.assertIn(f"({before['rows']} from the previous round)", r.stdout)
        # The test split waited for the last round: round 1 ran no test image through a backbone,
        # round 2 ran them through the backbones still in the race, and only those.
        self.assertEqual({(e["backbone"], e["split"]) for e in r1["features"]["computed"]},
                         {(b, s) for b in kept for s in ("train", "validation")})
        self.assertEqual(sorted(e["backbone"] for e in r2["features"]["computed"] if e["split"] == "test"), race)
        self.assertEqual({e["split"] for e in r2["features"]["computed"]}, {"train", "test"})
        self.assertEqual((r1["halving"]["test"], r2["halving"]["test"]), (False, True))
        self.assertIn("round 1 (halving): 3 backbones in the race", r.stdout)
        self.assertIn("; the test split held back for the last round", r.stdout)
        # Once round 1's prepare is done they have served, and are gone from the NAM.
        left = msaflow("nam", "ls", "rung0/", "--nam", "file://" + os.path.join(runs, "nam"))
        self.assertEqual((left.returncode, left.stdout), (0, ""), left.stderr)
        first = [c for c in r1["candidates"] if c["candidate"]["id"].startswith("r1-")]
        self.assertEqual(len(first), 4)
        # On half the data, twice the epochs: the steps of 2 epochs of all of it.
        self.assertTrue(all(c["candidate"]["backbone"] in kept and c["candidate"]["head"]["epochs"] == 4 for c in first))
        # Round 2 continues the best half of round 1 from its weights, 2 epochs of all the data.
        best_first = sorted(first, key=lambda c: -c["accuracy"])[:2]
        second = sorted((c for c in r2["candidates"] if c["candidate"]["id"].startswith("r2-")),
                        key=lambda c: c["candidate"]["id"])
        self.assertEqual([c["candidate"]["parent"] for c in second], [c["candidate"]["id"] for c in best_first])
        self.assertEqual([c["candidate"]["warm_start"] for c in second], [c["model"] for c in best_first])
        self.assertTrue(all(c["candidate"]["head"]["epochs"] == 2 for c in second))
        # Round 1's heads were scored on validation only; round 2 scored its own on test, and its
        # select the model it kept from round 1 (the best so far, on a backbone in the race).
        self.assertTrue(all("test" not in c for c in first), first)
        self.assertTrue(all("test" in c for c in r2["candidates"]), r2["candidates"])
        kept_r1 = [c for c in r2["candidates"] if c["candidate"]["id"].startswith("r1-")]
        self.assertEqual([c["candidate"]["id"] for c in kept_r1], [best_first[0]["candidate"]["id"]])
        self.assertIn(f"kept model {kept_r1[0]['candidate']['id']} of round 1: scored on the test split its round "
                      "held back", r.stdout)
        # ... to the figure msaflow predict gives that model from the test images themselves.
        test = doc["datasets"]["test"]
        labels = idx(test["labels"], test["limit"])
        p = msaflow("predict", os.path.join(runs, "halving"), test["images"], "--labels", test["labels"],
                    "--limit", str(test["limit"]), "--candidate", kept_r1[0]["candidate"]["id"], "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        probs = np.array([e["probabilities"] for e in json.loads(p.stdout)])
        self.assertEqual(int((probs.argmax(1) == labels).sum()), sum(c["correct"] for c in kept_r1[0]["test"]["per_class"]))
        # The champion's test figure is held out, and a backbone that left the race has none.
        self.assertFalse(res["result"]["optimistic"])
        self.assertEqual(res["result"]["accuracy"], res["champion"]["test"]["accuracy"])
        on_test = res["best_per_backbone_on_test"]
        self.assertEqual(sorted(b for b in on_test if "test_accuracy" in on_test[b]), race)
        # The run's last lines say why those that left have none (and say it only then).
        self.assertEqual("(-: left the race before the test split ran)" in r.stdout, bool(set(kept) - set(race)))
        # Journalled, and explained by `why`.
        rung = [e for e in events if e.get("event") == "rung0"]
        self.assertEqual(len(rung), 1)
        self.assertEqual(rung[0]["kept"], kept)
        w = msaflow("why", os.path.join(runs, "halving"), order[3]["backbone"])
        self.assertEqual(w.returncode, 0, w.stderr)
        self.assertIn(f"{order[3]['backbone']} in run halving: dropped at rung 0: kNN {order[3]['knn']:.3f} vs "
                      f"{order[2]['knn']:.3f} of {order[2]['backbone']}", w.stdout)
        # ... and what became of the kept ones in the rounds.
        for b in kept:
            w = msaflow("why", os.path.join(runs, "halving"), b)
            self.assertEqual(w.returncode, 0, w.stderr)
            self.assertIn("in the race in round", w.stdout)
            if b in race:
                self.assertIn("still in the race in round 2, the last one run", w.stdout)
            else:
                self.assertIn("left the race after round 1: its best head r1-c", w.stdout)
                self.assertIn("the best 2 of 4 heads continued had at least", w.stdout)
        # Halving's keys belong to halving.
        doc["rounds"]["strategy"] = "perturb"
        with open(path, "w") as f:
            json.dump(doc, f)
        bad = msaflow("validate", path)
        self.assertEqual(bad.returncode, 3)
        self.assertIn("/rounds/eta: only for \"strategy\": \"halving\"", bad.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
