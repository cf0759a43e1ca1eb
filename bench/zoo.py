#!/usr/bin/python3
"""bench/zoo.py — the CNN families users bring, as msaflow backbones (issue 31).

    scripts/bench-baselines.sh               # once: PyTorch and torchvision from Debian
    /usr/bin/python3 bench/zoo.py [--size 96] [--images 256] [--reps 3]

Ten torchvision classifiers at random initialisation (resnet18, vgg11's feature part,
densenet121, squeezenet1_1, shufflenet_v2_x0_5, mobilenet_v3_small, efficientnet_b0,
regnet_x_400mf, googlenet, mnasnet0_5) are exported to ONNX as torch.onnx writes them (opset 13,
dynamic batch), cut where their classifier starts. Each is validated alone (ran, or refused
with the operator), then every one that validates is a backbone of one `msaflow run`; the test
features that run stored in its NAM are compared with PyTorch's on the same images (largest
error relative to the largest feature), and the executor's images/s (bench_features, batch 64,
all cores) with PyTorch's (eval, no_grad, same threads), measured in the same run.
Goal: all ten run, error <= 1e-5.
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
import cpu  # noqa: E402
from workdir import work_directory  # noqa: E402

# name -> how to take the features: the module whose output is them.
MODELS = ["resnet18", "vgg11", "densenet121", "squeezenet1_1", "shufflenet_v2_x0_5", "mobilenet_v3_small",
          "efficientnet_b0", "regnet_x_400mf", "googlenet", "mnasnet0_5"]
TOLERANCE = 1e-5


def feature_module(name):
    """The classifier at random init (seeded), cut where its classifier starts: vgg11 and
    squeezenet1_1 as their 4-D feature part (msaflow average-pools it), the others with the last
    classifier replaced by the identity (N x features)."""
    import torch
    import torchvision
    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    m = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
    if name in ("vgg11", "squeezenet1_1"):
        return m.features
    for attr in ("fc", "classifier"):
        if hasattr(m, attr):
            setattr(m, attr, torch.nn.Identity())
            return m
    raise SystemExit(f"zoo: no classifier found on {name}")


def torch_features(module, x):
    import torch
    with torch.no_grad():
        v = module(torch.from_numpy(x)).numpy()
    return v.mean(axis=(2, 3)) if v.ndim == 4 else v


def export(module, name, size, path):
    import torch
    torch.onnx.export(module, torch.zeros(1, 3, size, size), str(path), opset_version=13, input_names=["x"],
                      output_names=["features"], dynamic_axes={"x": {0: "N"}, "features": {0: "N"}})


def msaflow(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def stored_features(exe, runs, run_id, backbone):
    uri = "file://" + str(runs / "nam")

    def get(*args):
        return subprocess.run([exe, "nam", *args, "--nam", uri], capture_output=True, check=True).stdout

    summary = json.loads(get("get", f"prepared/{run_id}/1"))
    obj = [c["object"] for c in summary["computed"] if c["backbone"] == backbone and c["split"] == "test"][0]
    meta = json.loads(get("ls", obj, "--json").decode().splitlines()[0])["meta"]
    parts = [np.frombuffer(get("get", f"{obj}.p{p:05d}"), dtype=np.float32) for p in range(meta["parts"])]
    return np.concatenate(parts).reshape(meta["rows"], meta["dim"])


def images(n, size, seed):
    """Smooth random colour images (uint8, N x H x W x 3): features that are not all alike."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (n, size // 8 + 1, size // 8 + 1, 3))
    x = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)[:, :size, :size]
    return np.clip(x + rng.normal(0, 20, x.shape), 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"))
    ap.add_argument("--bench-features", default=str(ROOT / "build" / "bench" / "bench_features"))
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--images", type=int, default=256, help="images timed per model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--keep", help="keep the work directory here")
    a = ap.parse_args()
    for exe in (a.msaflow, a.bench_features):
        if not os.access(exe, os.X_OK):
            sys.exit(f"zoo: {exe} is not built (ninja -C build builds the benches)")
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        sys.exit(f"zoo: {e.name} is missing: run scripts/bench-baselines.sh")
    torch.set_num_threads(os.cpu_count())
    names = a.models.split(",")
    with work_directory(a.keep, "msaflow-zoo-") as work:
        print(cpu.describe())
        print(f"torch {torch.__version__}; images {a.size}x{a.size}, batch 64, {os.cpu_count()} threads\n")
        train, test = images(48, a.size, 1), images(32, a.size, 2)
        for tag, x in (("train", train), ("test", test)):
            np.save(work / f"{tag}_x.npy", x)
            np.save(work / f"{tag}_y.npy", np.arange(len(x)) % 4)
        timed = images(a.images, a.size, 3)
        timed_nchw = np.ascontiguousarray(np.transpose(timed, (0, 3, 1, 2)).astype(np.float32) / 255.0)
        timed_nchw.tofile(work / "timed.f32")
        test_nchw = np.ascontiguousarray(np.transpose(test, (0, 3, 1, 2)).astype(np.float32) / 255.0)
        base = {
            "datasets": {s: {"format": "npy", "images": str(work / f"{s}_x.npy"), "labels": str(work / f"{s}_y.npy")}
                         for s in ("train", "test")},
            "head": {"type": "softmax", "epochs": 2},
            "steps": {"train": {"ranks": 1}, "evaluate": {"ranks": 1}},
            "rounds": {"max": 1, "candidates": 1, "top_k": 1},
        }
        base["datasets"]["validation"] = {"from": "train", "fraction": 0.25, "seed": 1}
        rows, ran, modules = {}, {}, {}
        for name in names:
            print(f"zoo: exporting {name}", file=sys.stderr, flush=True)
            modules[name] = feature_module(name)
            path = work / f"{name}.onnx"
            export(modules[name], name, a.size, path)
            bb = {"name": name.replace("_", "-"), "onnx": str(path), "feature_layer": "features",
                  "input": {"height": a.size, "width": a.size, "channels": 3, "mean": [0, 0, 0], "std": [1, 1, 1]}}
            doc = dict(base, name="zoo-" + bb["name"], backbones=[bb])
            (work / f"{name}.json").write_text(json.dumps(doc))
            r = msaflow(a.msaflow, "validate", str(work / f"{name}.json"))
            if r.returncode != 0:
                rows[name] = {"ran": "refused", "why": r.stderr.strip().splitlines()[-1][-160:]}
                continue
            ran[name] = bb
        if ran:
            print(f"zoo: one msaflow run with {len(ran)} backbones", file=sys.stderr, flush=True)
            doc = dict(base, name="zoo", backbones=list(ran.values()))
            (work / "zoo.json").write_text(json.dumps(doc))
            runs = work / "runs"
            t0 = time.monotonic()
            r = msaflow(a.msaflow, "run", str(work / "zoo.json"), "--runs", str(runs), "--run-id", "zoo")
            if r.returncode != 0:
                sys.exit(f"zoo: msaflow run failed:\n{r.stdout[-3000:]}{r.stderr}")
            print(f"msaflow run: {len(ran)} backbones, {time.monotonic() - t0:.1f} s\n")
        for name, bb in ran.items():
            print(f"zoo: {name}: features and speed", file=sys.stderr, flush=True)
            got = stored_features(a.msaflow, runs, "zoo", bb["name"])
            ref = torch_features(modules[name], test_nchw)
            err = float(np.abs(got - ref).max() / np.abs(ref).max()) if got.shape == ref.shape else float("inf")
            out = subprocess.run([a.bench_features, "--model", bb["onnx"], "--cut", "features", "--input",
                                  str(work / "timed.f32"), "--n", str(a.images), "--channels", "3", "--size",
                                  str(a.size), "--batch", "64", "--reps", str(a.reps)], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"zoo: bench_features failed on {name}:\n{out.stderr}")
            ours = json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]
            torch_features(modules[name], timed_nchw[:64])  # warm-up
            secs = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                for s in range(0, a.images, 64):
                    torch_features(modules[name], timed_nchw[s:s + 64])
                secs.append(time.perf_counter() - t0)
            theirs = a.images / statistics.median(secs)
            rows[name] = {"ran": "ran", "error": err, "ours": ours, "torch": theirs}
        print(f"{'model':<20} {'ran':<8} {'max rel err':>12} {'msaflow img/s':>14} {'PyTorch img/s':>14} {'ratio':>7}")
        ok = True
        for name in names:
            r = rows[name]
            if r["ran"] != "ran":
                ok = False
                print(f"{name:<20} refused  {r['why']}")
                continue
            good = r["error"] <= TOLERANCE
            ok = ok and good
            print(f"{name:<20} ran      {r['error']:>12.2e} {r['ours']:>14.1f} {r['torch']:>14.1f} "
                  f"{r['ours'] / r['torch']:>6.2f}x{'' if good else '  error above 1e-5'}")
        n_ran = sum(1 for r in rows.values() if r["ran"] == "ran")
        print(f"\ngoal: all {len(names)} run with error <= {TOLERANCE:g}: {n_ran}/{len(names)} ran  "
              f"{'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
