#!/usr/bin/python3
"""msaflow serve under load, through real sockets (issue 27):

  /usr/bin/python3 bench/serve_bench.py --msaflow build/msaflow [--requests 8000] [--clients 16]
                                        [--subscribers 100] [--client hey|python] [--keep DIR]

status     GET /v1/runs/{id} of a finished run from --clients connections at once (Debian's
           `hey` when installed, else Python processes), each kept alive: requests/s over the
           whole, p50 and p99 latency.
           Goal: p99 under 10 ms at 16 clients.
events     --subscribers clients follow one run's event stream (GET /v1/runs/{id}/events) from
           before it starts to its end: how many received every journal record, in order and
           once, and how late the last record reached them after it was written.
           Goal: every subscriber receives every event.
The run is the test suite's tiny pipeline (1 round, PP-OCRv4 and pixels, 400/200 images)."""
import argparse
import http.client
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "integration"))
from cpu import describe  # noqa: E402
from small_pipeline import tiny_pipeline  # noqa: E402
from sse import sse_events  # noqa: E402
from workdir import work_directory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def request(conn, method, path, token, body=None):
    conn.request(method, path, body=body, headers={"Authorization": "Bearer " + token})
    r = conn.getresponse()
    return r.status, r.read()


def status_client(args):
    host, port, token, path, n = args
    conn = http.client.HTTPConnection(host, port, timeout=30)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        status, _ = request(conn, "GET", path, token)
        lat.append(time.perf_counter() - t)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status}")
    conn.close()
    return lat


def python_status(host, port, token, path, requests, clients):
    """--clients processes, each on its own keep-alive connection; (requests/s, p50, p99, max, n)."""
    per = requests // clients
    with multiprocessing.Pool(clients) as pool:
        pool.map(status_client, [(host, port, token, "/v1/health", 20)] * clients)  # warm
        t = time.perf_counter()
        lats = [x for part in pool.map(status_client, [(host, port, token, path, per)] * clients) for x in part]
        wall = time.perf_counter() - t
    lats.sort()
    return len(lats) / wall, lats[len(lats) // 2] * 1e3, lats[int(len(lats) * 0.99)] * 1e3, lats[-1] * 1e3, len(lats)


def hey_status(host, port, token, path, requests, clients):
    """Debian's `hey` (Go, keep-alive connections): far less CPU per request than Python
    clients, which on a 2-core machine otherwise take the cores the service is measured on."""
    url = f"http://{host}:{port}{path}"
    auth = ["-H", "Authorization: Bearer " + token]
    subprocess.run(["hey", "-n", str(clients * 20), "-c", str(clients), *auth, url], check=True, capture_output=True)  # warm
    out = subprocess.run(["hey", "-n", str(requests), "-c", str(clients), *auth, url],
                         check=True, capture_output=True, text=True).stdout
    codes = re.findall(r"\[(\d+)\]\s+(\d+) responses", out)
    if not codes or any(c != "200" for c, _ in codes):
        raise RuntimeError(f"GET {path}: not every answer was 200:\n{out}")
    num = lambda pattern: float(re.search(pattern, out).group(1))  # noqa: E731
    return (num(r"Requests/sec:\s+([\d.]+)"), num(r"50% in ([\d.]+) secs") * 1e3, num(r"99% in ([\d.]+) secs") * 1e3,
            num(r"Slowest:\s+([\d.]+) secs") * 1e3, sum(int(n) for _, n in codes))


def subscriber(host, port, token, rid, out, i):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("GET", f"/v1/runs/{rid}/events", headers={"Authorization": "Bearer " + token})
    r = conn.getresponse()
    ids, last_at = [], None
    for e in sse_events(r):
        if e.get("event") == "journal":
            ids.append(int(e["id"]))
            last_at = time.time()
        if e.get("event") == "end":
            break
    conn.close()
    out[i] = (r.status, ids, last_at)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--msaflow", required=True)
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--subscribers", type=int, default=100)
    ap.add_argument("--client", choices=["hey", "python"],
                    help="status load generator (default: hey when installed: apt-get install hey)")
    ap.add_argument("--keep")
    a = ap.parse_args()
    client = a.client or ("hey" if shutil.which("hey") else "python")
    exe = os.path.abspath(a.msaflow)
    print(describe())
    with work_directory(a.keep, "msaflow-serve-bench-") as work:
        users = str(work / "users.json")
        data = os.path.realpath(os.path.join(ROOT, "data", "fashion-mnist"))
        models = os.path.realpath(os.path.join(ROOT, "models"))
        out = subprocess.run([exe, "users", "add", "bench", "--users", users, "--allow", data, "--allow", models],
                             check=True, capture_output=True, text=True).stdout
        token = out.strip().splitlines()[-1]
        ready = work / "ready.json"
        log = open(work / "serve.log", "w")
        svc = subprocess.Popen([exe, "serve", "--users", users, "--runs", str(work / "runs"), "--listen", "127.0.0.1:0",
                                "--ready-file", str(ready), "--max-streams", str(a.subscribers + 16)],
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            while not ready.exists():
                if svc.poll() is not None:
                    sys.exit("msaflow serve did not start: " + (work / "serve.log").read_text())
                time.sleep(0.05)
            host, port = json.loads(ready.read_text())["url"].split("//")[1].rsplit(":", 1)
            port = int(port)

            def call(method, path, body=None):  # a connection per call: the service closes idle ones after 5 s
                c = http.client.HTTPConnection(host, port, timeout=60)
                try:
                    return request(c, method, path, token, body)
                finally:
                    c.close()

            def submit(name, seed):
                doc = tiny_pipeline(ROOT, name, rounds=1)
                doc["rounds"]["seed"] = seed
                status, body = call("POST", "/v1/runs", json.dumps(doc))
                if status != 202:
                    sys.exit(f"POST /v1/runs: {status} {body[:500]}")
                return json.loads(body)["id"]

            def wait(rid):
                while True:
                    v = json.loads(call("GET", "/v1/runs/" + rid)[1])
                    if v["state"] in ("finished", "failed", "cancelled", "interrupted"):
                        return v
                    time.sleep(0.2)

            first = submit("bench-status", 1)
            v = wait(first)
            print(f"a run to ask about: {first} {v['state']}, {len(v['tasks'])} tasks, "
                  f"journal of {v['events']} lines")

            path = "/v1/runs/" + first
            if client == "hey":
                rate, p50, p99, slowest, n = hey_status(host, port, token, path, a.requests, a.clients)
            else:
                rate, p50, p99, slowest, n = python_status(host, port, token, path, a.requests, a.clients)
            print(f"\nstatus: GET /v1/runs/{{id}}, {a.clients} clients, {n} requests ({client})")
            print(f"  {rate:.0f} requests/s   p50 {p50:.2f} ms   p99 {p99:.2f} ms   max {slowest:.2f} ms")
            print(f"  goal p99 < 10 ms at {a.clients} clients: {'met' if p99 < 10 else 'NOT met'}")

            # events: every subscriber from before the run starts to its end.
            second = submit("bench-events", 2)
            results = [None] * a.subscribers
            threads = [threading.Thread(target=subscriber, args=(host, port, token, second, results, i))
                       for i in range(a.subscribers)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            journal = work / "runs" / "bench" / second / "journal.jsonl"
            lines = journal.read_text().splitlines()
            expect = list(range(2, len(lines) + 1))
            written = json.loads(lines[-1])["time"]
            from datetime import datetime
            end_at = datetime.strptime(written.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").timestamp() - time.timezone
            ok = sum(1 for r in results if r and r[0] == 200 and r[1] == expect)
            delays = sorted(r[2] - end_at for r in results if r and r[2])
            print(f"\nevents: {a.subscribers} subscribers to one run, {len(expect)} journal records")
            print(f"  {ok}/{a.subscribers} received every record, in order, once")
            if delays:
                print(f"  the last record reached them {statistics.median(delays) * 1e3:.0f} ms (median), "
                      f"{delays[-1] * 1e3:.0f} ms (slowest) after it was written")
            for r in results:
                if not (r and r[0] == 200 and r[1] == expect):
                    print(f"  a subscriber got: {r and r[0]} {r and r[1]} (expected {expect})")
                    break
            print(f"  goal every subscriber receives every event: {'met' if ok == a.subscribers else 'NOT met'}")
        finally:
            svc.terminate()
            svc.wait(timeout=60)
            log.close()


if __name__ == "__main__":
    main()
