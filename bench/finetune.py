#!/usr/bin/python3
"""Fine-tuning's training step against PyTorch (issue 46, docs/performance.md): images/s of
forward + backward + update of a model's trained tail and a softmax head at batch 64, msaflow's
(build/bench/bench_finetune: kernels/tail.h under parallel::FinetuneSync on one rank) and
PyTorch's (the same tail built from the same ONNX weights by tests/python/torch_tail.py, float32,
channels-last, Adam with the tail at a tenth of the head's learning rate), with the same threads,
measured side by side in one run. Prints the CPU line first.

With --scaling: the sync fine-tuning step's strong scaling instead, 2 ranks x 1 thread against
1 rank x 1 thread (the test tool tests/finetune_ranks beside the msaflow binary: MobileNetV2's
blocks 11-13 and a softmax head on 192 synthetic 64 x 64 images, global batch --batch, 30 epochs),
with the gradient's sums in buckets during the backward pass and with one sum after it.

With --streamed: the training maps streamed from a NAM server (msaflow nam serve, tcp on
loopback) by modules::MapsSource within 4 parts, windows of 2 (docs/finetune.md), against the
same training on the maps in memory, interleaved in one process (bench_finetune --stream-parts):
MobileNetV2's blocks 11-13 at 96 x 96, --steps batches an epoch, 3 epochs.

usage: bench/finetune.py [--msaflow build/msaflow] [--threads 2] [--steps 20] [--repeat 3]
                         [--scaling | --streamed]"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
import cpu  # noqa: E402

TAILS = [  # model, cut, train_from, image size
    ("mobilenet_v2.onnx", "block_13_expand_relu", "block_11_expand", 96),
    ("mobilenet_v2.onnx", "block_13_expand_relu", "block_13_expand", 96),
    ("inception_v3.onnx", "mixed2", "mixed1", 139),
]


def bench_msaflow(tool, model, cut, start, size, batch, steps, threads, describe=False):
    cmd = [tool, "--model", str(ROOT / "models" / model), "--cut", cut, "--from", start, "--batch", str(batch),
           "--steps", str(steps), "--size", str(size)] + (["--describe"] if describe else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if r.returncode != 0:
        sys.exit(f"bench_finetune: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_torch(model, desc, batch, steps, threads, classes=10):
    import numpy as np
    import onnx
    import torch
    from torch_tail import TorchTail

    torch.set_num_threads(threads)
    tail = TorchTail(onnx.load(str(ROOT / "models" / model)), desc["nodes"], [p["name"] for p in desc["params"]],
                     dtype=torch.float32)
    tail.track_kinks = False
    for p in tail.params.values():
        if p.dim() == 4:
            p.data = p.data.contiguous(memory_format=torch.channels_last)
    rng = np.random.default_rng(1)
    xs = {i["name"]: torch.from_numpy(rng.uniform(0, 1, i["dims"]).astype(np.float32))
          .contiguous(memory_format=torch.channels_last) for i in desc["inputs"]}
    cut = desc["nodes"][-1]
    with torch.no_grad():
        out = tail.run(xs, tail.nodes[-1].output[0])
        feats = out.mean(dim=(2, 3)) if out.dim() == 4 else out
        mean, std = feats.mean(0), feats.std(0) + 1e-3
    head = torch.nn.Linear(feats.shape[1], classes)
    labels = torch.arange(batch) % classes
    opt = torch.optim.Adam([{"params": head.parameters(), "lr": 1e-3},
                            {"params": list(tail.params.values()), "lr": 1e-4}])
    del cut

    def step():
        opt.zero_grad(set_to_none=True)
        out = tail.run(xs, tail.nodes[-1].output[0])
        f = out.mean(dim=(2, 3)) if out.dim() == 4 else out
        loss = torch.nn.functional.cross_entropy(head((f - mean) / std), labels)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t0)


def scaling(msaflow, repeat, batch):
    """Seconds of training at 1 rank and at 2 (bucketed sums, one sum), each the median of `repeat`."""
    import tempfile
    tool = str(pathlib.Path(msaflow).resolve().parent / "tests" / "finetune_ranks")
    if not os.path.exists(tool):
        sys.exit(f"{tool} is missing: build the tests (ninja -C {pathlib.Path(msaflow).parent})")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    configs = [("1 rank", 1, None), ("2 ranks, sums in buckets during backward", 2, None),
               ("2 ranks, one sum after backward", 2, 0)]
    times = {name: [] for name, _, _ in configs}
    waits = {name: [] for name, _, _ in configs}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeat):  # interleaved, so that a noisy moment hits every configuration
            for name, ranks, bucket in configs:
                cmd = [tool, str(ROOT / "models" / "mobilenet_v2.onnx"), "block_13_expand_relu", "block_11_expand", d,
                       "30", "sync", str(65536 if bucket is None else bucket), str(batch)]
                if ranks > 1:
                    cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-n", str(ranks)] + cmd
                r = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if r.returncode != 0:
                    sys.exit(f"finetune_ranks: {r.stderr.strip()[-2000:]}")
                with open(os.path.join(d, "result.json")) as f:
                    t = json.load(f)["training"]
                times[name].append(t["seconds"])
                waits[name].append(t["allreduce"]["wait_s"])
    print(cpu.describe())
    print(f"sync fine-tuning, MobileNetV2 blocks 11-13 + softmax head, 192 images 64x64, batch {batch}, 30 epochs, "
          f"1 thread a rank, median of {repeat}")
    print(f"{'configuration':44} {'train s':>8} {'waiting for sums s':>19} {'speed-up':>9}")
    one = statistics.median(times["1 rank"])
    for name, _, _ in configs:
        t = statistics.median(times[name])
        print(f"{name:44} {t:>8.3f} {statistics.median(waits[name]):>19.3f} {one / t:>8.2f}x")


def streamed(tool, args):
    model, cut, start, size = TAILS[0]
    cmd = [tool, "--model", str(ROOT / "models" / model), "--cut", cut, "--from", start, "--batch", str(args.batch),
           "--steps", str(args.steps), "--size", str(size), "--stream-parts", "4", "--msaflow",
           str(pathlib.Path(args.msaflow).resolve()), "--epochs", "3", "--reps", str(args.repeat)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if r.returncode != 0:
        sys.exit(f"bench_finetune: {r.stderr.strip()}")
    s = json.loads(r.stdout.strip().splitlines()[-1])["streamed"]
    print(cpu.describe())
    print(f"{model} {start} .. {cut} at {size}x{size}, batch {args.batch}, {args.steps} batches an epoch, "
          f"{s['epochs']} epochs, {args.threads} threads, median of {args.repeat} interleaved")
    print(f"maps {s['maps_bytes'] / 1e6:.1f} MB in parts of {s['part_rows']} rows; streamed within "
          f"{s['limit_bytes'] / 1e6:.1f} MB (windows of {s['window_parts']} parts) from the NAM server, "
          f"{s['nam']}")
    print(f"{'maps':34} {'img/s':>9}")
    print(f"{'in memory (held whole)':34} {s['whole_images_per_s']:>9.1f}")
    print(f"{'streamed from the NAM':34} {s['streamed_images_per_s']:>9.1f}")
    print(f"streamed vs in memory: {s['streamed_images_per_s'] / s['whole_images_per_s']:.3f}x; "
          f"{s['parts_read']} parts read, at most {s['peak_bytes'] / 1e6:.1f} MB held, "
          f"training waited {s['wait_seconds']:.3f} s for them")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--msaflow", default=str(ROOT / "build" / "msaflow"),
                    help="the msaflow binary; bench_finetune is taken from bench/ beside it")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scaling", action="store_true", help="2 sync ranks against 1 instead (see above)")
    ap.add_argument("--streamed", action="store_true", help="maps streamed from a NAM server vs in memory (above)")
    args = ap.parse_args()
    if args.scaling:
        scaling(args.msaflow, args.repeat, args.batch)
        return
    tool = str(pathlib.Path(args.msaflow).resolve().parent / "bench" / "bench_finetune")
    if args.streamed:
        streamed(tool, args)
        return
    import torch
    print(cpu.describe())
    print(f"PyTorch {torch.__version__}; {args.threads} threads each; batch {args.batch}, {args.steps} steps, "
          f"median of {args.repeat}")
    print(f"{'tail':58} {'weights':>9} {'msaflow img/s':>14} {'PyTorch img/s':>14} {'ratio':>6}")
    for model, cut, start, size in TAILS:
        desc = bench_msaflow(tool, model, cut, start, size, args.batch, args.steps, args.threads, describe=True)
        ours, theirs = [], []
        for _ in range(args.repeat):  # interleaved, so that a noisy moment hits both
            ours.append(bench_msaflow(tool, model, cut, start, size, args.batch, args.steps,
                                      args.threads)["images_per_s"])
            theirs.append(bench_torch(model, desc, args.batch, args.steps, args.threads))
        a, b = statistics.median(ours), statistics.median(theirs)
        name = f"{model} {start} .. {cut} ({'x'.join(map(str, desc['inputs'][0]['dims'][1:]))} in)"
        print(f"{name:58} {desc['tail_weights']:>9} {a:>14.1f} {b:>14.1f} {a / b:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
