#!/usr/bin/python3
"""bench/simulate_scaling.py — predicted strong and weak scaling of each step, 1 to 1,024 nodes
(docs/simulate.md, issue 29).

    /usr/bin/python3 bench/simulate_scaling.py [--exe build-test/msaflow] [--from-runs RUN_DIR]
        [--machine configs/machines/deep-est.json] [--max-nodes 1024]

Calibrated by one run of the quickstart (made here unless --from-runs names one), `msaflow
simulate` predicts round 1 of the quickstart on the machine with its modules grown to N nodes,
one rank per node (each rank the node's cores as threads): prepare and evaluate, and train in
sync, hybrid (groups of 8 ranks, a parameter server across them) and async. Strong scaling keeps
the data; weak scaling grows it with N. Prints time, speed-up and efficiency per N and where each
stops scaling (efficiency under 50 %), as Markdown.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import cpu  # noqa: E402
from small_pipeline import quickstart  # noqa: E402

STEPS = [("prepare", None), ("train", "sync"), ("train", "hybrid"), ("train", "async"), ("evaluate", None)]


def step_seconds(exe, pipeline, runs, machine, step, module, n, scale):
    s = subprocess.run([exe, "simulate", pipeline, "--from-runs", runs, "--machine", machine, "--json", "--rounds", "1",
                        "--nodes", f"{module}={n}", "--ranks", f"{step}={n}", "--data-scale", str(scale),
                        "--queue-wait", "0"], capture_output=True, text=True)
    if s.returncode != 0:
        sys.exit(f"simulate {step} at {n}: {s.stderr}")
    d = json.loads(s.stdout)
    return [x for x in d["rounds"][0]["steps"] if x["step"] == step][0]["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "build-test", "msaflow"))
    ap.add_argument("--from-runs", help="a run directory of the quickstart (default: run it once here)")
    ap.add_argument("--machine", default=os.path.join(ROOT, "configs", "machines", "deep-est.json"))
    ap.add_argument("--max-nodes", type=int, default=1024)
    a = ap.parse_args()
    print(cpu.describe())
    quick = os.path.join(ROOT, "pipelines", "quickstart.json")
    with tempfile.TemporaryDirectory(prefix="simscale") as work:
        runs = a.from_runs
        if not runs:
            runs = os.path.join(work, "runs", "q")
            r = subprocess.run([a.exe, "run", quick, "--runs", os.path.dirname(runs), "--run-id", "q"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"quickstart failed: {r.stderr[-2000:]}")
        base = quickstart(ROOT)
        nodes = [1]
        while nodes[-1] * 2 <= a.max_nodes:
            nodes.append(nodes[-1] * 2)
        print(f"\nround 1 of the quickstart on {os.path.basename(a.machine)}, calibrated by {runs}; one rank per node\n")
        stops = {}
        for kind in ("strong", "weak"):
            print(f"### {kind} scaling ({'the data fixed' if kind == 'strong' else 'the data grows with the nodes'})\n")
            print("| step | " + " | ".join(str(n) for n in nodes) + " |")
            print("|---|" + "---|" * len(nodes))
            for step, mode in STEPS:
                doc = json.loads(json.dumps(base))
                module = doc["steps"][step]["module"]
                path = os.path.join(work, f"{step}-{mode}.json")
                cells, t1 = [], None
                for n in nodes:
                    if mode:  # hybrid: groups of 8 ranks (2 below 16); under 4 ranks hybrid, under 2 async, are sync
                        doc["steps"]["train"] = {"module": module, "ranks": n, "mode": mode}
                        if (mode == "hybrid" and n < 4) or (mode == "async" and n < 2):
                            doc["steps"]["train"]["mode"] = "sync"
                        elif mode == "hybrid":
                            doc["steps"]["train"]["groups"] = max(2, n // 8)
                    with open(path, "w") as f:
                        json.dump(doc, f)
                    t = step_seconds(a.exe, path, runs, a.machine, step, module, n, n if kind == "weak" else 1)
                    t1 = t1 or t
                    eff = (t1 / t / n) if kind == "strong" else (t1 / t)
                    if eff < 0.5 and (kind, step, mode) not in stops:
                        stops[(kind, step, mode)] = n
                    cells.append(f"{t:.2f} s ({100 * eff:.0f} %)")
                print(f"| {step}{' ' + mode if mode else ''} | " + " | ".join(cells) + " |")
            print()
        print("Where efficiency falls under 50 %:")
        for (kind, step, mode), n in sorted(stops.items(), key=lambda kv: (kv[0][0], kv[1])):
            print(f"  {kind:<6} {step}{' ' + mode if mode else ''}: at {n} nodes")
        for kind, step, mode in [(k, s, m) for k in ("strong", "weak") for s, m in STEPS]:
            if (kind, step, mode) not in stops:
                print(f"  {kind:<6} {step}{' ' + mode if mode else ''}: not up to {nodes[-1]} nodes")


if __name__ == "__main__":
    main()
