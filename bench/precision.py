#!/usr/bin/python3
"""bench/precision.py — does the accuracy hold with less precise features? (docs/performance.md)

    /usr/bin/python3 bench/precision.py [--pipelines quickstart digits] [--msaflow build/msaflow]

Runs each pipeline end to end (`msaflow run`, the same seeds; after one discarded run that
brings the files into the page cache) four times: as it is (f32
arithmetic, float32 features in the NAM); with every ONNX backbone's executor in bfloat16
(`"precision": "bf16"`); in int8 (`"precision": "int8"`, ranges calibrated by the load step on
the first 256 training images); and with the features stored as float16 (`"feature_dtype": "f16"`).
Prints per variant: the champion's test accuracy and each backbone's best, the prepare step's
seconds (round 1) and the features' bytes in the NAM, each beside the f32 run's. The goal: every
accuracy within 0.5 point of f32's.
"""
import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import cpu  # noqa: E402
from workdir import work_directory  # noqa: E402

VARIANTS = [("f32", {}, {}),
            ("bf16 executor", {"precision": "bf16"}, {}),
            ("int8 executor", {"precision": "int8"}, {}),
            ("f16 features", {"feature_dtype": "f16"}, {"feature_dtype": "f16"})]


def absolute(doc, base):
    """The pipeline with its file paths made absolute (it is written elsewhere)."""
    for split in doc["datasets"].values():
        for key in ("images", "labels", "root"):
            if key in split:
                split[key] = str((base / split[key]).resolve())
    for bb in doc["backbones"]:
        if "onnx" in bb:
            bb["onnx"] = str((base / bb["onnx"]).resolve())
    return doc


def run(msaflow, work, name, doc):
    spec = work / f"{name}.json"
    spec.write_text(json.dumps(doc, indent=1))
    runs = work / f"runs-{name}"
    out = subprocess.run([msaflow, "run", str(spec), "--runs", str(runs)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"precision: {name} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    run_dir = next(d for d in runs.iterdir() if d.is_dir() and (d / "results.json").exists())
    results = json.loads((run_dir / "results.json").read_text())
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()[1:] if line]
    prepare = next(e["seconds"] for e in events if e.get("event") == "task-end" and e["task"] == "r1-prepare")
    listing = subprocess.run([msaflow, "nam", "ls", "features/", "--json", "--nam", "file://" + str(runs / "nam")],
                             capture_output=True, text=True, check=True).stdout
    nbytes = sum(json.loads(line)["size"] for line in listing.splitlines() if line.strip())
    per_backbone = {b: v["test_accuracy"] for b, v in results["best_per_backbone_on_test"].items()}
    return {"test": results["champion"]["test"]["accuracy"], "champion": results["champion"]["candidate"]["backbone"],
            "per_backbone": per_backbone, "prepare_s": prepare, "features_bytes": nbytes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"))
    ap.add_argument("--pipelines", nargs="+", default=["quickstart", "digits"])
    ap.add_argument("--keep", help="keep the work directory here")
    a = ap.parse_args()
    print(cpu.describe())
    with work_directory(a.keep, "msaflow-precision-") as work:
        for name in a.pipelines:
            path = ROOT / "pipelines" / f"{name}.json"
            print(f"{name} ({path.relative_to(ROOT)}):")
            base = None
            # A first run, discarded: the dataset and model files into the page cache, so that
            # the f32 run's prepare is not the only one reading them from disk.
            run(a.msaflow, work, f"{name}-warmup", absolute(json.loads(path.read_text()), path.parent))
            for label, onnx_change, pixels_change in VARIANTS:
                why = cpu.missing_for(onnx_change.get("precision", "f32"))
                if why:
                    print(f"  {label:<14} not run: {why}")
                    continue
                doc = absolute(json.loads(path.read_text()), path.parent)
                for bb in doc["backbones"]:
                    bb.update(pixels_change if bb.get("kind") == "pixels" else onnx_change)
                r = run(a.msaflow, work, f"{name}-{label.split()[0]}", doc)
                if base is None:
                    base = r
                worst = max(abs(r["per_backbone"][b] - base["per_backbone"][b]) for b in base["per_backbone"])
                worst = max(worst, abs(r["test"] - base["test"]))
                per = ", ".join(f"{b} {v:.4f}" for b, v in sorted(r["per_backbone"].items()))
                print(f"  {label:<14} champion {r['champion']:<12} test {r['test']:.4f}  (best per backbone: {per})")
                print(f"  {'':<14} prepare {r['prepare_s']:6.2f} s ({r['prepare_s'] / base['prepare_s']:.2f}x)  "
                      f"features {r['features_bytes'] / 2**20:7.2f} MiB ({r['features_bytes'] / base['features_bytes']:.2f}x)"
                      f"  largest accuracy change {worst * 100:.2f} pt  goal <= 0.5 pt"
                      + ("  met" if worst <= 0.005 else "  NOT met"))


if __name__ == "__main__":
    main()
