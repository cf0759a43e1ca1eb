#!/usr/bin/python3
"""bench/versus.py — msaflow against its baselines, measured in the same run (docs/performance.md).

    scripts/bench-baselines.sh            # once: scikit-learn + OpenBLAS from Debian
    /usr/bin/python3 bench/versus.py [--rows 10000] [--test-rows 2000] [--reps 3]

0. Features: both backbones (MobileNetV2-b13 at 96x96, PP-OCRv4's PP-LCNetV3 at 48x48) through
   msaflow's executor (bench_features) and through PyTorch (the module built from the same ONNX
   file's weights, jit.trace + freeze, in its faster memory format), on the same prepared
   images, batch 64, all cores; the features must agree within 1e-3.
   Beside it the fraction of the machine's sgemm rate the executor reaches.
1. A two-round job on Fashion-MNIST (MobileNetV2 cut at block_13_expand_relu, 96x96, 8 heads
   a round, the best picked): `msaflow run` end to end, timed per step from the run's journal.
2. Its features (train and test) are read back from the run's NAM, and the same float32 rows
   train a softmax head on both sides: scikit-learn's LogisticRegression(lbfgs) with
   StandardScaler (C = 1 / (n * l2), l2 = 1e-4), and msaflow's kernels (bench_heads: Adam
   epochs and its own L-BFGS). The ratio compares the time to the same test accuracy (within
   0.5 point of scikit-learn's converged accuracy), each side's fastest setting that gets there.
3. A round's 8 heads trained together (one GEMM a step) against each alone: time, and the
   largest weight difference (must be <= 1e-5).
4. Round 2 against round 1: prepare (every feature reused) and the whole round.
   The one-round job's time outside prepare and train (goal <= 15 %; `--job-only` measures just
   that, against every step a module process, without the baselines).
   And the whole job of one round (load .. select, 8 heads, the best picked) against the same
   job as a PyTorch + scikit-learn script (bench/baseline.py), with the accuracy each reached;
   once more with the executor in int8 ("precision": "int8").
5. Per step: peak resident memory of its ranks and minor page faults per training image; and the
   one-round job on 1/4, 1/2 and all of the rows: how each step's time and memory grow to 4x.
Every line prints the figure, the baseline's, the ratio and the goal (issue 15).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import baseline  # noqa: E402
import cpu  # noqa: E402
from workdir import work_directory  # noqa: E402

MODEL = ROOT / "models" / "mobilenet_v2.onnx"
CUT = "block_13_expand_relu"


def pipeline(rows, test_rows, rounds=2, precision="f32"):
    data = ROOT / "data" / "fashion-mnist"
    return {
        "format": "msaflow.pipeline/1", "name": "versus", "machine": "local",
        "datasets": {
            "train": {"format": "idx", "images": str(data / "train-images-idx3-ubyte.gz"),
                      "labels": str(data / "train-labels-idx1-ubyte.gz"), "limit": rows},
            "test": {"format": "idx", "images": str(data / "t10k-images-idx3-ubyte.gz"),
                     "labels": str(data / "t10k-labels-idx1-ubyte.gz"), "limit": test_rows},
            "validation": {"from": "train", "fraction": 0.1, "seed": 1}},
        "backbones": [{"name": "mobilenetv2", "onnx": str(ROOT / "models" / "mobilenet_v2.onnx"),
                       "feature_layer": "block_13_expand_relu", "precision": precision,
                       "input": {"height": 96, "width": 96, "channels": 3, "mean": [0, 0, 0], "std": [1, 1, 1]}}],
        "head": {"type": ["softmax", "mlp"], "hidden": [128], "optimizer": "adam", "lr": [0.001, 0.003],
                 "l2": [0.0001, 0.001], "epochs": [15], "batch": 64},
        "steps": {"load": {"module": "cm"}, "prepare": {"module": "dam"}, "train": {"module": "dam"},
                  "store": {"module": "dam"}, "evaluate": {"module": "esb", "ranks": 2}, "select": {"module": "dam"}},
        "rounds": {"max": rounds, "candidates": 8, "top_k": 3, "strategy": "perturb", "min_delta": 0, "patience": 5,
                   "seed": 7},
        "metric": "accuracy"}


def run_job(msaflow, work, rows, test_rows, rounds=2, tag="", precision="f32", env=None):
    spec = work / f"versus-{rounds}{tag}.json"
    spec.write_text(json.dumps(pipeline(rows, test_rows, rounds, precision), indent=1))
    runs = work / f"runs-{rounds}{tag}"
    t0 = time.monotonic()
    out = subprocess.run([msaflow, "run", str(spec), "--runs", str(runs)], capture_output=True, text=True,
                         env=None if env is None else {**os.environ, **env})
    wall = time.monotonic() - t0
    if out.returncode != 0:
        sys.exit(f"versus: msaflow run failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    run_dir = next(d for d in runs.iterdir() if d.is_dir() and d.name.startswith("versus-"))
    events = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()[1:] if line]
    results = json.loads((run_dir / "results.json").read_text())
    return run_dir, events, wall, results


BACKBONES = [  # name, model, cut, input size, normalisation (as the pipelines prepare them)
    ("MobileNetV2-b13", MODEL, CUT, 96, 0.0, 1.0),
    ("PP-OCRv4", ROOT / "models" / "ch_PP-OCRv4_rec_infer.onnx", "p2o.AveragePool.1", 48, 0.5, 0.5),
]


def features_side(a, work, backbone):
    """Item 0: images/s of one backbone on both sides on the same prepared images, and their
    agreement."""
    import torch
    name, model_path, cut, size, mean, std = backbone
    torch.set_num_threads(os.cpu_count())
    pixels = baseline.read_idx(str(ROOT / "data" / "fashion-mnist" / "t10k-images-idx3-ubyte.gz"), a.feature_images)
    x = (baseline.prepare(pixels, size) - mean) / std
    prepared = work / f"prepared-{size}.f32"
    prepared.write_bytes(x.astype("<f4").tobytes())
    # PyTorch's best of channels_last and NCHW (depthwise convolutions differ between them).
    torch_s, best = None, None
    for channels_last in (True, False):
        model, flops = baseline.torch_backbone(str(model_path), cut, torch.from_numpy(x[:64]), channels_last)
        baseline.features(model, x[:128], 64)  # the profiling executor's first runs
        s = baseline.timed(lambda: baseline.features(model, x, 64), a.reps)
        if torch_s is None or s < torch_s:
            torch_s, best, best_format = s, model, channels_last
    ref = baseline.features(best, x, 64)
    out = subprocess.run([a.bench_features, "--model", str(model_path), "--cut", cut, "--input", str(prepared),
                          "--n", str(len(x)), "--size", str(size), "--reps", str(a.reps), "--output",
                          str(work / "features.f32")], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"versus: bench_features failed:\n{out.stderr}")
    ms = json.loads(out.stdout)
    got = np.fromfile(work / "features.f32", dtype=np.float32).reshape(ref.shape)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    return {"name": name, "msaflow": ms["images_per_s"], "torch": len(x) / torch_s, "error": err, "flops": flops,
            "gflops": ms["sgemm_gflops"], "channels_last": best_format}


def executor_settings(a, work):
    """The executor's settings by measurement (MobileNetV2-b13, the same prepared images):
    batch size, OpenMP thread pinning and precision. Returns rows of (batch, binding,
    precision, images/s, largest relative difference from the f32 features)."""
    prepared = work / "prepared-96.f32"
    n = prepared.stat().st_size // (3 * 96 * 96 * 4)
    ref = None
    rows = []
    for batch, bind, precision in [(64, "false", "f32"), (16, "false", "f32"), (32, "false", "f32"),
                                   (128, "false", "f32"), (64, "close", "f32"), (64, "spread", "f32"),
                                   (64, "false", "bf16"), (64, "false", "int8")]:
        env = dict(os.environ, OMP_PROC_BIND=bind, OMP_PLACES="cores")
        out = subprocess.run([a.bench_features, "--model", str(MODEL), "--cut", CUT, "--input", str(prepared),
                              "--n", str(n), "--size", "96", "--reps", str(a.reps), "--batch", str(batch),
                              "--precision", precision, "--output", str(work / "features-setting.f32")],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            rows.append((batch, bind, precision, None, out.stderr.strip().splitlines()[-1:]))
            continue
        got = np.fromfile(work / "features-setting.f32", dtype=np.float32)
        if ref is None:
            ref = got
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        rows.append((batch, bind, precision, json.loads(out.stdout)["images_per_s"], err))
    return rows


def nam(msaflow, uri, *args, binary=False):
    out = subprocess.run([msaflow, "nam", *args, "--nam", uri], capture_output=True, check=True)
    return out.stdout if binary else out.stdout.decode()


def export_features(msaflow, runs, run_id, into):
    """The run's mobilenetv2 train and test features, from its NAM, as raw files for bench_heads."""
    uri = "file://" + str(runs / "nam")
    summary = json.loads(nam(msaflow, uri, "get", f"prepared/{run_id}/1"))
    objects = {c["split"]: c["object"] for c in summary["computed"] if c["backbone"] == "mobilenetv2"}
    meta = {}
    arrays = {}
    for split in ("train", "test"):
        obj = objects[split]
        info = json.loads(nam(msaflow, uri, "ls", obj, "--json").splitlines()[0])["meta"]
        labels = np.frombuffer(nam(msaflow, uri, "get", obj, binary=True), dtype=np.uint8)
        parts = [np.frombuffer(nam(msaflow, uri, "get", f"{obj}.p{p:05d}", binary=True), dtype=np.float32)
                 for p in range(info["parts"])]
        x = np.concatenate(parts).reshape(info["rows"], info["dim"])
        assert x.shape[0] == labels.shape[0], (x.shape, labels.shape)
        (into / f"{split}_x.f32").write_bytes(x.astype("<f4").tobytes())
        (into / f"{split}_y.u8").write_bytes(labels.tobytes())
        meta[split] = int(x.shape[0])
        meta["dim"] = int(x.shape[1])
        meta["classes"] = int(info["classes"])
        arrays[split] = (x, labels)
    (into / "meta.json").write_text(json.dumps(meta))
    return arrays


def sklearn_side(arrays, l2, reps, iterations):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    import warnings
    from sklearn.exceptions import ConvergenceWarning
    warnings.simplefilter("ignore", ConvergenceWarning)
    (x, y), (xt, yt) = arrays["train"], arrays["test"]
    out = []
    for it in iterations:
        secs, acc = [], None
        for _ in range(reps):
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0 / (len(y) * l2), max_iter=it))
            t0 = time.perf_counter()
            model.fit(x, y)
            secs.append(time.perf_counter() - t0)
            acc = float((model.predict(xt) == yt).mean())
        n_iter = int(model[-1].n_iter_[0])
        out.append({"iterations": it, "ran": n_iter, "seconds": statistics.median(secs), "test_accuracy": acc})
    return out


def fastest_within(entries, target, tolerance=0.005):
    ok = [e for e in entries if e["test_accuracy"] >= target - tolerance]
    return min(ok, key=lambda e: e["seconds"]) if ok else None


def step_table(events):
    """Per task: seconds, the ranks' peak RSS (max) and minor faults (sum)."""
    rows = {}
    for e in events:
        if e.get("event") == "task-end":
            ranks = e.get("ranks", [])
            rows[e["task"]] = {"seconds": e["seconds"],
                               "max_rss_mib": max((r.get("max_rss_kib", 0) for r in ranks), default=0) / 1024,
                               "minor_faults": sum(r.get("minor_faults", 0) for r in ranks)}
    return rows


def outside_share(events, wall):
    """The one-round job's seconds outside prepare and train (the steps that compute on every
    image), and their share of its wall time: issue 30's goal is <= 15 %."""
    inside = sum(e["seconds"] for e in events if e.get("event") == "task-end"
                 and e["task"].split("-", 1)[1] in ("prepare", "train"))
    return wall - inside, (wall - inside) / wall


def job_only(a, work):
    """--job-only: the one-round job alone, --reps times, each time also with every step a module
    process (MSAFLOW_IN_COORDINATOR=0, as before issue 30), interleaved: where its time goes."""
    print(f"one-round job: {a.rows} train / {a.test_rows} test images, MobileNetV2-b13 @96x96, 8 heads; "
          f"{a.reps} runs each way, interleaved")
    ways = {"light steps in the coordinator": {}, "every step a process": {"MSAFLOW_IN_COORDINATOR": "0"}}
    got = {w: [] for w in ways}
    for rep in range(a.reps):
        for w, env in ways.items():
            progress(f"one-round job, {w} ({rep + 1} of {a.reps})")
            _, events, wall, _ = run_job(a.msaflow, work, a.rows, a.test_rows, rounds=1,
                                         tag=f"-{len(got[w])}-{'p' if env else 'c'}", env=env)
            got[w].append((wall, events))
    for w, runs in got.items():
        print(f"\n{w}:")
        for wall, events in runs:
            steps = " ".join(f"{e['task'][3:]} {e['seconds']:.2f}" for e in events if e.get("event") == "task-end")
            out, share = outside_share(events, wall)
            print(f"  wall {wall:5.2f} s: {steps}; outside prepare and train {out:.2f} s = {share:.1%}")
        shares = [outside_share(ev, wall)[1] for wall, ev in runs]
        med = statistics.median(shares)
        line(f"  outside prepare+train, median of {len(runs)}", f"{med:.1%}", "", "", "<= 15 %", med <= 0.15)


_START = time.monotonic()


def progress(what):
    """One line on stderr as each part starts (the table comes at the end, ~12 minutes in)."""
    print(f"versus: [{time.monotonic() - _START:6.0f} s] {what}", file=sys.stderr, flush=True)


def line(what, value, baseline, ratio, goal, ok):
    mark = "" if ok is None else ("  met" if ok else "  NOT met")
    print(f"{what:<46} {value:>12} {baseline:>12} {ratio:>9}   goal {goal}{mark}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"))
    ap.add_argument("--bench-heads", default=str(ROOT / "build" / "bench" / "bench_heads"))
    ap.add_argument("--bench-features", default=str(ROOT / "build" / "bench" / "bench_features"))
    ap.add_argument("--feature-images", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--test-rows", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", help="keep the work directory here")
    ap.add_argument("--job-only", action="store_true",
                    help="only the one-round job, with and without light steps in the coordinator (no baselines)")
    a = ap.parse_args()
    if a.job_only:
        if not os.access(a.msaflow, os.X_OK):
            sys.exit(f"versus: {a.msaflow} is not built (ninja -C build builds the benches)")
        with work_directory(a.keep, "msaflow-versus-") as work:
            print(cpu.describe())
            job_only(a, work)
        return
    for exe in (a.msaflow, a.bench_heads, a.bench_features):
        if not os.access(exe, os.X_OK):
            sys.exit(f"versus: {exe} is not built (ninja -C build builds the benches)")
    try:
        import sklearn  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit(f"versus: {e.name} is missing: run scripts/bench-baselines.sh")
    with work_directory(a.keep, "msaflow-versus-") as work:
        print(cpu.describe())
        print(f"machine: {os.cpu_count()} cores; job: {a.rows} train / {a.test_rows} test Fashion-MNIST images, "
              "MobileNetV2-b13 @96x96, 8 heads a round, 2 rounds")
        fes = []
        for b in BACKBONES:
            progress(f"features, msaflow and PyTorch: {b[0]}")
            fes.append(features_side(a, work, b))
        fe = fes[0]  # MobileNetV2, the job's backbone
        progress("the executor's settings (batch size, thread binding, precision)")
        settings = executor_settings(a, work)
        progress("the two-round job (msaflow run)")
        run_dir, events, wall, _ = run_job(a.msaflow, work, a.rows, a.test_rows)
        progress("the one-round job (msaflow run)")
        _, events1, wall1, res1 = run_job(a.msaflow, work, a.rows, a.test_rows, rounds=1)
        # The same with the executor in int8 (ranges calibrated by the load step), where the CPU
        # has the VNNI instructions msaflow's int8 path needs (its load step refuses it elsewhere).
        wall_i8 = res_i8 = None
        if cpu.missing_for("int8") is None:
            _, _, wall_i8, res_i8 = run_job(a.msaflow, work, a.rows, a.test_rows, rounds=1, tag="-int8",
                                            precision="int8")
        # The same one-round job on 1/4 and 1/2 of the data: how time and memory grow to 4x.
        scaled = {4: (events1, wall1)}
        for part in (1, 2):
            progress(f"the one-round job on {part}/4 of the data")
            _, ev, w, _ = run_job(a.msaflow, work, a.rows * part // 4, a.test_rows * part // 4, rounds=1,
                                  tag=f"-x{part}")
            scaled[part] = (ev, w)
        import torch
        torch.set_num_threads(os.cpu_count())
        progress("the same job as a PyTorch + scikit-learn script")
        script = baseline.job(str(ROOT / "data" / "fashion-mnist"), str(MODEL), CUT, a.rows, a.test_rows,
                              fe["channels_last"])
        steps = step_table(events)
        feats = work / "features"
        feats.mkdir(exist_ok=True)
        arrays = export_features(a.msaflow, work / "runs-2", run_dir.name, feats)
        n, dim = arrays["train"][0].shape
        print(f"features: {n} x {dim} train, {arrays['test'][0].shape[0]} test (from the run's NAM)\n")

        progress("head training: scikit-learn, then bench_heads")
        sk = sklearn_side(arrays, 1e-4, a.reps, [25, 50, 100, 200, 1000])
        heads = subprocess.run([a.bench_heads, "--data", str(feats), "--reps", str(a.reps)], capture_output=True,
                               text=True)
        if heads.returncode != 0:
            sys.exit(f"versus: bench_heads failed:\n{heads.stderr}")
        ms = [json.loads(x) for x in heads.stdout.splitlines() if x.strip()]
        target = max(e["test_accuracy"] for e in sk)
        print("head training (softmax, l2 1e-4), test accuracy per setting:")
        for e in sk:
            print(f"  scikit-learn lbfgs max_iter={e['iterations']:<5} ran {e['ran']:>4} it  "
                  f"{e['seconds']:8.3f} s  acc {e['test_accuracy']:.4f}")
        for e in ms:
            if e["what"] in ("adam", "lbfgs"):
                how = (f"adam b={e['batch']} lr={e['lr']:g} {e['epochs']} ep" if e["what"] == "adam"
                       else f"lbfgs <= {e['iterations']} it")
                print(f"  msaflow {how:<28}      {e['seconds']:8.3f} s  acc {e['test_accuracy']:.4f}")
        print()
        print(f"{'':<46} {'msaflow':>12} {'baseline':>12} {'ratio':>9}")
        for f in fes:
            r = f["msaflow"] / f["torch"]
            line(f"features img/s vs PyTorch ({f['name']}, " + ("channels_last" if f["channels_last"] else "NCHW") + ")",
                 f"{f['msaflow']:.0f}", f"{f['torch']:.0f}", f"{r:.2f}x", ">= 2x", r >= 2)
            bound = f["gflops"] * 1e9 / f["flops"]
            line(f"  of the sgemm bound ({f['gflops']:.0f} GFLOP/s / {f['flops'] / 1e6:.0f} MFLOP)",
                 f"{f['msaflow'] / bound:.0%}", f"{f['torch'] / bound:.0%}", "", "(toward 100 %)", None)
            line("  features' largest difference (relative)", f"{f['error']:.1e}", "", "", "<= 1e-3", f["error"] <= 1e-3)
        print("  executor settings, MobileNetV2-b13 (batch, OMP_PROC_BIND, precision: img/s, difference from f32):")
        for batch, bind, precision, ips, err in settings:
            if ips is None:
                print(f"    {batch:>4} {bind:<7} {precision:<5} refused: {err}")
            else:
                print(f"    {batch:>4} {bind:<7} {precision:<5} {ips:8.0f} img/s  {ips / settings[0][3]:5.2f}x  {err:.1e}")
        sk_best = fastest_within(sk, target)
        ms_best = fastest_within([e for e in ms if e["what"] in ("adam", "lbfgs")], target)
        if ms_best is None:
            line("head to equal accuracy vs scikit-learn", "not reached", f"{sk_best['seconds']:.3f} s", "-",
                 ">= 20x", False)
        else:
            r = sk_best["seconds"] / ms_best["seconds"]
            line(f"head to acc >= {target - 0.005:.4f} vs scikit-learn", f"{ms_best['seconds']:.3f} s",
                 f"{sk_best['seconds']:.3f} s", f"{r:.1f}x", ">= 20x", r >= 20)
        tog = next(e for e in ms if e["what"] == "together")
        r = tog["alone_seconds"] / tog["seconds"]
        line(f"{tog['heads']} heads together vs each alone", f"{tog['seconds']:.3f} s", f"{tog['alone_seconds']:.3f} s",
             f"{r:.2f}x", "> 1x", r > 1)
        line("  largest weight difference, together vs alone", f"{tog['max_weight_difference']:.1e}", "", "",
             "<= 1e-5", tog["max_weight_difference"] <= 1e-5)
        r1 = {k[3:]: v for k, v in steps.items() if k.startswith("r1-")}
        r2 = {k[3:]: v for k, v in steps.items() if k.startswith("r2-")}
        if "prepare" in r2:
            ratio = r2["prepare"]["seconds"] / r1["prepare"]["seconds"]
            line("round 2 prepare vs round 1 prepare", f"{r2['prepare']['seconds']:.2f} s",
                 f"{r1['prepare']['seconds']:.2f} s", f"{ratio:.3f}", "<= 0.05", ratio <= 0.05)
        t1 = sum(v["seconds"] for v in r1.values())
        t2 = sum(v["seconds"] for v in r2.values())
        line("round 2 vs round 1 (sum of steps)", f"{t2:.2f} s", f"{t1:.2f} s", f"{t2 / t1:.2f}", "(smaller)", None)
        line("whole job, 2 rounds (msaflow run, wall)", f"{wall:.1f} s", "", "", "", None)
        out1, share1 = outside_share(events1, wall1)
        line("one-round job outside prepare and train", f"{out1:.2f} s", f"{wall1:.1f} s", f"{share1:.1%}", "<= 15 %",
             share1 <= 0.15)
        champ = res1.get("champion", {})
        r = script["seconds"] / wall1
        line("whole job, 1 round, vs PyTorch + scikit-learn", f"{wall1:.1f} s", f"{script['seconds']:.1f} s", f"{r:.1f}x",
             ">= 20x", r >= 20)
        print(f"  champions (test accuracy): msaflow {champ['candidate']['id']} {champ['test']['accuracy']:.4f} "
              f"(validation {champ['accuracy']:.4f}); script {script['champion']} {script['test']:.4f} "
              f"(validation {script['validation']:.4f}); the script's features took {script['features_s']:.1f} s")
        if wall_i8 is None:
            print(f"  whole job with the int8 executor: not run, {cpu.missing_for('int8')}")
        else:
            r = script["seconds"] / wall_i8
            line("whole job, 1 round, int8 executor, vs the script", f"{wall_i8:.1f} s",
                 f"{script['seconds']:.1f} s", f"{r:.1f}x", ">= 20x", r >= 20)
            c8 = res_i8.get("champion", {})
            ok = abs(c8["test"]["accuracy"] - script["test"]) <= 0.005
            print(f"  int8 champion (test accuracy): {c8['candidate']['id']} {c8['test']['accuracy']:.4f}: "
                  f"{'within' if ok else 'NOT within'} 0.5 point of the script's {script['test']:.4f}")
        print(f"\ngrowth from 1x to 4x the data ({a.rows // 4} -> {a.rows} train images, one round): seconds "
              "and peak RSS at 1x, 2x, 4x, and the 4x/1x ratio (linear: 4)")
        tables = {k: step_table(ev) for k, (ev, _) in scaled.items()}
        for task in tables[4]:
            secs = [tables[k][task]["seconds"] for k in (1, 2, 4)]
            rss = [tables[k][task]["max_rss_mib"] for k in (1, 2, 4)]
            print(f"  {task[3:]:<9} {secs[0]:6.2f} {secs[1]:6.2f} {secs[2]:6.2f} s  {secs[2] / secs[0]:5.2f}x   "
                  f"{rss[0]:7.1f} {rss[1]:7.1f} {rss[2]:7.1f} MiB  {rss[2] / max(rss[0], 1e-9):5.2f}x")
        g = scaled[4][1] / scaled[1][1]
        line("whole one-round job, 4x the data vs 1x", f"{scaled[4][1]:.1f} s", f"{scaled[1][1]:.1f} s", f"{g:.2f}x",
             "<= 4x (linear or better)", g <= 4)
        print("\nper step (round 1): seconds, peak RSS of its ranks, minor page faults per training image:")
        for step, v in r1.items():
            print(f"  {step:<9} {v['seconds']:6.2f} s  {v['max_rss_mib']:8.1f} MiB  "
                  f"{v['minor_faults'] / n:8.1f} faults/image")


if __name__ == "__main__":
    main()
