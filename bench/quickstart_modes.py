#!/usr/bin/python3
"""The quickstart's training step in the layouts a user could pick, through the real path
(msaflow run, real mpirun ranks), on the quickstart pipeline itself (issue 32):

  /usr/bin/python3 bench/quickstart_modes.py --msaflow build/msaflow [--reps 3] [--keep DIR]

  1 rank   train on one rank (the baseline)
  sync 2   2 ranks, every head data-parallel: an allreduce per step
  auto 2   2 ranks, mode left out: the round's heads dealt over the ranks (what quickstart.json says)

Per layout: the train step's wall time summed over the 3 rounds (mpirun's start included:
what the user waits for), as a ratio to one rank measured in the same repetition (> 1: faster),
and the champion's validation and test accuracy. All runs share one runs directory, so the
features are computed once, before the first timed run. Medians of --reps interleaved
repetitions."""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu import describe  # noqa: E402
from workdir import work_directory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from small_pipeline import quickstart  # noqa: E402
LAYOUTS = {"1 rank": {"ranks": 1}, "sync 2": {"ranks": 2, "mode": "sync"}, "auto 2": {"ranks": 2}}


def quickstart_with(train):
    doc = quickstart(ROOT)
    doc["steps"]["train"] = dict(copy.deepcopy(train), module="dam")
    return doc


def run(exe, work, name, train):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(quickstart_with(train), f)
    r = subprocess.run([exe, "run", path, "--runs", os.path.join(work, "runs"), "--run-id", name],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(f"{name}: msaflow run failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr}")
    with open(os.path.join(work, "runs", name, "results.json")) as f:
        res = json.load(f)
    return {"train_s": sum(rd["step_seconds"]["train"] for rd in res["rounds"]),
            "validation": res["champion"]["accuracy"], "test": res["result"]["accuracy"],
            "modes": sorted({rd["training"].get("mode", "?") for rd in res["rounds"]})}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--msaflow", default=os.path.join(ROOT, "build", "msaflow"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one, removed)")
    a = ap.parse_args()
    print(describe())
    with work_directory(a.keep, "msaflow-quickstart-modes-") as work:
        run(a.msaflow, str(work), "warm", LAYOUTS["1 rank"])  # features into the NAM, untimed
        seen = {k: [] for k in LAYOUTS}
        for rep in range(a.reps):
            for k, train in LAYOUTS.items():
                seen[k].append(run(a.msaflow, str(work), f"{k.replace(' ', '')}-{rep}", train))
        base = statistics.median(s["train_s"] for s in seen["1 rank"])
        print(f"\nquickstart train step, 3 rounds of 6 candidates, median of {a.reps}:")
        print(f"  {'layout':<8} {'mode':<12} {'train s':>8} {'vs 1 rank':>10} {'val acc':>8} {'test acc':>9}")
        for k, runs in seen.items():
            t = statistics.median(s["train_s"] for s in runs)
            print(f"  {k:<8} {','.join(runs[0]['modes']):<12} {t:8.2f} {base / t:9.2f}x "
                  f"{statistics.median(s['validation'] for s in runs):8.4f} "
                  f"{statistics.median(s['test'] for s in runs):9.4f}")


if __name__ == "__main__":
    main()
