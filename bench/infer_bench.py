#!/usr/bin/python3
"""Inference served by `msaflow serve` (/v2, dynamic batching) under load, in Triton
perf_analyzer's format (issue 28):

  /usr/bin/python3 bench/infer_bench.py --msaflow build/msaflow [--run RUN_DIR] [--seconds 10]
                                        [--concurrency 1,4,16,64] [--keep DIR]

The model is the quickstart's champion (a run of pipelines/quickstart.json is made unless --run
names one). Each request is one Fashion-MNIST image as UINT8 [1, 28, 28, 1] JSON, sent by
Debian's `hey` (apt-get install hey) from `concurrency` connections for --seconds. Side by side,
in the same run:
  (a) msaflow's executor offline, batch 64 (`msaflow predict`, images/s from two sizes so that
      start-up cancels out): the bound; and batch 1, one image's latency;
  (b) the same model as a PyTorch module (bench/baseline.py's torch_backbone, traced and frozen,
      channels-last, 2 threads) behind Python's ThreadingHTTPServer, answering the same JSON:
      the server a user without a serving stack would write.
Goals: at concurrency 64, >= 80 % of the offline batch throughput; at concurrency 1, p50 <=
1.3 x one image's executor latency; >= 3 x the PyTorch server's infer/s at concurrency 16."""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu import describe  # noqa: E402
from workdir import work_directory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = os.path.join(ROOT, "data", "fashion-mnist", "t10k-images-idx3-ubyte.gz")
LABELS = os.path.join(ROOT, "data", "fashion-mnist", "t10k-labels-idx1-ubyte.gz")

TORCH_SERVER = r'''
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import numpy as np, onnx, torch
from onnx import numpy_helper
sys.path.insert(0, sys.argv[1])
from baseline import torch_backbone
torch.set_num_threads(2)
backbone_onnx, cut, size, exported, port_file = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
init = {t.name: numpy_helper.to_array(t) for t in onnx.load(exported).graph.initializer}
mean, inv_std = (torch.from_numpy(init["msaflow/head/" + k].reshape(1, -1).copy()) for k in ("mean", "inv_std"))
if "msaflow/head/w1t" in init:
    layers = [(init["msaflow/head/w1t"], init["msaflow/head/b1"]), (init["msaflow/head/w2t"], init["msaflow/head/b2"])]
else:
    layers = [(init["msaflow/head/wt"], init["msaflow/head/b"])]
layers = [(torch.from_numpy(w.copy()), torch.from_numpy(b.copy())) for w, b in layers]
model, _ = torch_backbone(backbone_onnx, cut, torch.zeros(1, 3, size, size))
lock = threading.Lock()

def classify(pixels):
    x = torch.from_numpy(pixels.astype(np.float32))[:, None]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False) / 255
    x = x.expand(-1, 3, -1, -1).contiguous(memory_format=model.memory_format)
    with torch.no_grad(), lock:
        h = (model(x) - mean) * inv_std
        for i, (w, b) in enumerate(layers):
            h = h @ w.T + b
            if i + 1 < len(layers):
                h = torch.relu(h)
        return torch.softmax(h, 1)

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        t = req["inputs"][0]
        n, rows, cols, _ = t["shape"]
        p = classify(np.array(t["data"], np.uint8).reshape(n, rows, cols))
        body = json.dumps({"outputs": [{"name": "probabilities", "datatype": "FP32", "shape": list(p.shape),
                                        "data": p.flatten().tolist()}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
with open(port_file, "w") as f:
    f.write(str(srv.server_address[1]))
srv.serve_forever()
'''


def hey(url, body_file, concurrency, seconds, token=None):
    """(infer/s, p50, p90, p95, p99 in microseconds, requests) from `hey`'s report."""
    args = ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
            "-D", body_file]
    if token:
        args += ["-H", "Authorization: Bearer " + token]
    out = subprocess.run(args + [url], check=True, capture_output=True, text=True).stdout
    codes = re.findall(r"\[(\d+)\]\s+(\d+) responses", out)
    if not codes or any(c != "200" for c, _ in codes):
        sys.exit(f"{url}: not every answer was 200:\n{out}")
    pct = {int(p): float(v) * 1e6 for p, v in re.findall(r"(\d+)% in ([\d.]+) secs", out)}
    # hey 0.1.4 prints its 99th percentile as "0% in 0.0000 secs" when it has under 100 samples
    pct.setdefault(99, float(re.search(r"Slowest:\s+([\d.]+) secs", out).group(1)) * 1e6)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rate, pct[50], pct[90], pct[95], pct[99], sum(int(n) for _, n in codes)


def block(name, c, r):
    rate, p50, p90, p95, p99, n = r
    print(f"Request concurrency: {c}   [{name}]")
    print("  Client:")
    print(f"    Request count: {n}")
    print(f"    Throughput: {rate:.1f} infer/sec")
    print(f"    p50 latency: {p50:.0f} usec")
    print(f"    p90 latency: {p90:.0f} usec")
    print(f"    p95 latency: {p95:.0f} usec")
    print(f"    p99 latency: {p99:.0f} usec")


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--msaflow", required=True)
    ap.add_argument("--run")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--keep")
    a = ap.parse_args()
    if not shutil.which("hey"):
        sys.exit("infer_bench: needs Debian's hey (apt-get install hey)")
    exe = os.path.abspath(a.msaflow)
    levels = [int(c) for c in a.concurrency.split(",")]
    print(describe())
    with work_directory(a.keep, "msaflow-infer-bench-") as work:
        run = a.run
        if not run:
            subprocess.run([exe, "run", os.path.join(ROOT, "pipelines", "quickstart.json"), "--runs", str(work),
                            "--run-id", "quickstart"], check=True, capture_output=True)
            run = str(work / "quickstart")
        res = json.load(open(os.path.join(run, "results.json")))
        pipe = json.load(open(os.path.join(run, "pipeline.json")))
        cand = res["champion"]["candidate"]
        bb = next(b for b in pipe["backbones"] if b["name"] == cand["backbone"])
        print(f"model: {run} champion {cand['id']} on {bb['name']} ({cand['head']['type']})")
        exported = str(work / "champion.onnx")
        subprocess.run([exe, "export", run, "-o", exported], check=True, capture_output=True)
        with gzip.open(IMAGES) as f:
            pixels = f.read()[16:16 + 784]
        body_file = str(work / "one.json")
        with open(body_file, "w") as f:
            json.dump({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1],
                                   "data": list(pixels)}]}, f)

        # (a) the executor offline: batch 64 throughput, batch 1 latency (start-up cancels out).
        def predict(n, batch):
            return timed([exe, "predict", run, IMAGES, "--labels", LABELS, "--limit", str(n), "--batch", str(batch)])
        t_small, t_big = min(predict(128, 64) for _ in range(2)), min(predict(2176, 64) for _ in range(2))
        offline = 2048 / (t_big - t_small)
        t1, t257 = min(predict(1, 1) for _ in range(2)), min(predict(257, 1) for _ in range(2))
        one_us = (t257 - t1) / 256 * 1e6
        print(f"\n(a) msaflow's executor offline: {offline:.1f} infer/sec at batch 64; "
              f"one image at batch 1: {one_us:.0f} usec\n")

        # msaflow serve
        users = str(work / "users.json")
        token = subprocess.run([exe, "users", "add", "bench", "--users", users], check=True, capture_output=True,
                               text=True).stdout.strip().splitlines()[-1]
        ready = work / "ready.json"
        log = open(work / "serve.log", "w")
        svc = subprocess.Popen([exe, "serve", "--users", users, "--runs", str(work / "svc-runs"), "--listen",
                                "127.0.0.1:0", "--ready-file", str(ready), "--model", "champion=" + run],
                               stdout=log, stderr=subprocess.STDOUT)
        port_file = work / "torch.port"
        torch_log = open(work / "torch.log", "w")
        torch_srv = subprocess.Popen(["/usr/bin/python3", "-c", TORCH_SERVER, os.path.dirname(os.path.abspath(__file__)),
                                      bb["onnx"], bb["feature_layer"], str(bb["input"]["height"]), exported,
                                      str(port_file)], stdout=torch_log, stderr=subprocess.STDOUT)
        try:
            for p, f in ((svc, ready), (torch_srv, port_file)):
                deadline = time.time() + 120
                while not f.exists():
                    if p.poll() is not None or time.time() > deadline:
                        sys.exit(f"a server did not start: see {work}")
                    time.sleep(0.1)
            url = json.loads(ready.read_text())["url"] + "/v2/models/champion/infer"
            torch_url = f"http://127.0.0.1:{port_file.read_text().strip()}/"
            ours, theirs = {}, {}
            for c in levels:
                hey(url, body_file, c, 2, token)  # warm
                ours[c] = hey(url, body_file, c, a.seconds, token)
                block("msaflow serve", c, ours[c])
                hey(torch_url, body_file, c, 2)
                theirs[c] = hey(torch_url, body_file, c, a.seconds)
                block("PyTorch + http.server", c, theirs[c])
                print()
            print("Inferences/Second vs. Client p50 Latency")
            for c in levels:
                print(f"Concurrency: {c}, throughput: {ours[c][0]:.1f} infer/sec, latency {ours[c][1]:.0f} usec   "
                      f"(PyTorch server: {theirs[c][0]:.1f} infer/sec, latency {theirs[c][1]:.0f} usec)")
            print(f"offline executor, batch 64: {offline:.1f} infer/sec; one image, batch 1: {one_us:.0f} usec")
            print("\ngoals:")
            if 64 in ours:
                r = ours[64][0] / offline
                print(f"  concurrency 64 >= 80 % of offline batch throughput: {100 * r:.0f} % "
                      f"{'met' if r >= 0.8 else 'NOT met'}")
            if 1 in ours:
                r = ours[1][1] / one_us
                print(f"  concurrency 1 p50 <= 1.3 x one image's executor latency: {r:.2f} x "
                      f"{'met' if r <= 1.3 else 'NOT met'}")
            if 16 in ours:
                r = ours[16][0] / theirs[16][0]
                print(f"  concurrency 16 >= 3 x the PyTorch server's infer/sec: {r:.2f} x {'met' if r >= 3 else 'NOT met'}")
        finally:
            for p in (svc, torch_srv):
                p.terminate()
                p.wait(timeout=60)
            log.close()
            torch_log.close()


if __name__ == "__main__":
    main()
