#!/usr/bin/env python3
"""`msaflow serve` as a real process over real sockets (issue 27): submit -> events -> finished
with the champion of `msaflow run`; 401, 404, 403, 411, 413 and 422 as docs/service.md says; a
cancelled run; SSE reconnects with Last-Event-ID missing and repeating nothing; kill -9 of the
service mid-run and a restart, the interrupted run resumed by the service itself; the queue's
--max-running and per-user quotas; TLS; hostile HTTP never stopping it.
Usage: service_test.py MSAFLOW_EXE SOURCE_ROOT [Class.test_name ...]"""
import base64
import concurrent.futures
import http.client
import json
import os
import random
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_pipeline import tiny_pipeline  # noqa: E402
from sse import sse_events  # noqa: E402
from processes import processes_naming  # noqa: E402

EXE = os.path.abspath(sys.argv[1])
ROOT = os.path.abspath(sys.argv[2])
DATA = os.path.realpath(os.path.join(ROOT, "data", "fashion-mnist"))
MODELS = os.path.realpath(os.path.join(ROOT, "models"))


STOP_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def thread_masks(pid, field="SigBlk"):
    """{thread id: its mask} from /proc/PID/task/*/status."""
    masks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            masks[int(tid)] = next(int(line.split()[1], 16) for line in f if line.startswith(field + ":"))
    return masks


def children_running(ppid, needle):
    """The pids whose parent is ppid and whose command line holds needle."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if parent == ppid and needle in args:
            found.append(int(d))
    return found


def pipeline(name, rounds=1):
    return tiny_pipeline(ROOT, name, rounds=rounds)


def read_idx(path, limit):
    """The first `limit` images of an IDX file, each a list of rows*cols bytes."""
    import gzip
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
    return [data[16 + i * rows * cols:16 + (i + 1) * rows * cols] for i in range(limit)]


def encode_png(pixels, rows, cols):
    """A gray 8-bit PNG of the image, with zlib only."""
    import struct
    import zlib

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + bytes(pixels[r * cols:(r + 1) * cols]) for r in range(rows))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def prepare(pixels, rows, cols, h, w, mean, std):
    """kernels/prepare.h in Python: bilinear with half-pixel centres, gray to 3 channels."""
    def taps(n_in, n_out):
        out = []
        for o in range(n_out):
            src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
            i0 = min(int(src), n_in - 1)
            out.append((i0, min(i0 + 1, n_in - 1), src - i0))
        return out
    ty, tx = taps(rows, h), taps(cols, w)
    plane = []
    for (y0, y1, wy) in ty:
        for (x0, x1, wx) in tx:
            top = pixels[y0 * cols + x0] + (pixels[y0 * cols + x1] - pixels[y0 * cols + x0]) * wx
            bot = pixels[y1 * cols + x0] + (pixels[y1 * cols + x1] - pixels[y1 * cols + x0]) * wx
            v = top + (bot - top) * wy
            plane.append((v / 255 - mean) / std)
    return plane * 3


class Service:
    """A `msaflow serve` process with its users; request() speaks HTTP/1.1 to it."""

    def __init__(self, work, users, extra=(), env=None, runs=None):
        self.work = work
        self.users_file = os.path.join(work, "users.json")
        self.tokens = {}
        for name, allow, quota, *account in users:  # account: optional, a Slurm account
            if name in self.tokens:
                continue
            args = [EXE, "users", "add", name, "--users", self.users_file]
            for a in allow:
                args += ["--allow", a]
            if quota:
                args += ["--max-running", str(quota)]
            if account:
                args += ["--account", account[0]]
            r = subprocess.run(args, capture_output=True, text=True, check=True)
            self.tokens[name] = r.stdout.strip().splitlines()[-1]
        self.runs = runs or os.path.join(work, "runs")
        self.extra = list(extra)
        self.env = env
        self.start()

    def start(self, env=None):
        ready = os.path.join(self.work, "ready.json")
        if os.path.exists(ready):
            os.unlink(ready)
        self.log = open(os.path.join(self.work, "serve.log"), "a")
        self.proc = subprocess.Popen([EXE, "serve", "--listen", "127.0.0.1:0", "--runs", self.runs, "--users",
                                      self.users_file, "--ready-file", ready] + self.extra,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env or self.env)
        deadline = time.time() + 30
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError("msaflow serve did not start: " + open(self.log.name).read()[-2000:])
            time.sleep(0.05)
        with open(ready) as f:
            url = json.load(f)["url"]
        self.host, self.port = url.split("//")[1].rsplit(":", 1)
        self.port = int(self.port)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
        self.log.close()

    def request(self, method, path, body=None, user=None, token=None, headers=None):
        h = dict(headers or {})
        if user:
            h["Authorization"] = "Bearer " + self.tokens[user]
        if token is not None:
            h["Authorization"] = "Bearer " + token
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = data
        return r.status, doc, r

    def events(self, user, run_id, last_id=None, limit=None):
        """Reads the run's event stream: [(id, type, data)] until `end`, or `limit` journal events."""
        h = {"Authorization": "Bearer " + self.tokens[user]}
        if last_id is not None:
            h["Last-Event-ID"] = str(last_id)
        c = http.client.HTTPConnection(self.host, self.port, timeout=300)
        c.request("GET", f"/v1/runs/{run_id}/events", headers=h)
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        out, journal = [], 0
        for e in sse_events(r):
            out.append((e.get("id"), e.get("event", "message"), json.loads(e["data"])))
            if e.get("event") == "journal":
                journal += 1
            if e.get("event") == "end" or (limit and journal >= limit):
                break
        c.close()
        return out

    def wait_state(self, user, run_id, states, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, v, _ = self.request("GET", "/v1/runs/" + run_id, user=user)
            assert status == 200, (status, v)
            if v["state"] in states:
                return v
            time.sleep(0.2)
        raise AssertionError(f"run {run_id} never reached {states}: {v}")


def answer_of(svc, request, timeout=10):
    """The whole answer to a raw request, read until the service closes the connection (headers
    and body may come apart). The sending side stays open: a service that waits for more body
    than was sent would time out here, not be told the request ended."""
    with socket.create_connection((svc.host, svc.port), timeout=timeout) as sk:
        sk.sendall(request.encode())
        answer = b""
        while True:
            got = sk.recv(4096)
            if not got:
                break
            answer += got
    return answer.decode(errors="replace")


def journal_events(run_dir):
    with open(os.path.join(run_dir, "journal.jsonl")) as f:
        return [(i + 1, json.loads(line)) for i, line in enumerate(f) if i > 0 and line.strip()]


_reference = {}


def reference_champion():
    """The champion of `msaflow run` on the tiny pipeline: what the service's runs must reach."""
    if not _reference:
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "p.json")
            with open(p, "w") as f:
                json.dump(pipeline("svc"), f)
            subprocess.run([EXE, "run", p, "--runs", os.path.join(d, "runs"), "--run-id", "ref"], check=True,
                           capture_output=True)
            with open(os.path.join(d, "runs", "ref", "results.json")) as f:
                c = json.load(f)["champion"]
            _reference.update(candidate=c["candidate"]["id"], accuracy=c["accuracy"])
    return _reference


class Api(unittest.TestCase):
    """One service for the API's checks: users ana and ben, each with their own folders."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = cls.tmp.name
        cls.own = os.path.join(cls.work, "ben-files")
        os.makedirs(cls.own)
        cls.svc = Service(cls.work, [("ana", [DATA, MODELS], 0), ("ben", [cls.own], 0)],
                          extra=["--max-running", "2", "--request-timeout", "4"])

    @classmethod
    def tearDownClass(cls):
        cls.svc.stop()
        cls.tmp.cleanup()

    def submit(self, doc, user="ana", expect=202):
        status, v, r = self.svc.request("POST", "/v1/runs", doc, user=user)
        self.assertEqual(status, expect, v)
        if expect == 202:
            self.assertIn(v["state"], ("queued", "running"))
            self.assertEqual(r.getheader("Location"), "/v1/runs/" + v["id"])
        return v

    def test_health_needs_no_token_and_everything_else_does(self):
        status, v, _ = self.svc.request("GET", "/v1/health")
        self.assertEqual((status, v["ok"]), (200, True))
        for path in ("/v1/runs", "/v1/openapi.json", "/v1/whoami", "/v1/runs/x", "/v1/events"):
            status, v, r = self.svc.request("GET", path)
            self.assertEqual(status, 401, path)
            self.assertEqual(v["error"]["code"], "unauthorized")
            self.assertIn("Bearer", r.getheader("WWW-Authenticate"))
            status, v, _ = self.svc.request("GET", path, token="0" * 64)
            self.assertEqual(status, 401, path)
            status, v, _ = self.svc.request("GET", path, headers={"Authorization": "Basic YW5hOmFuYQ=="})
            self.assertEqual(status, 401, path)
        status, v, _ = self.svc.request("GET", "/v1/openapi.json", user="ana")
        self.assertEqual((status, v["openapi"]), (200, "3.0.3"))
        status, v, _ = self.svc.request("GET", "/v1/whoami", user="ben")
        self.assertEqual((status, v["user"], v["folders"]), (200, "ben", [os.path.realpath(self.own)]))
        status, v, _ = self.svc.request("GET", "/v1/nowhere", user="ana")
        self.assertEqual((status, v["error"]["code"]), (404, "not_found"))

    def test_a_run_goes_to_the_champion_of_msaflow_run_and_its_events_resume_exactly(self):
        v = self.submit(pipeline("svc"))
        rid = v["id"]
        # The first three journal events, then the rest from Last-Event-ID: together, the
        # journal itself, nothing missing and nothing twice.
        first = [e for e in self.svc.events("ana", rid, limit=3) if e[1] == "journal"]
        self.assertEqual(len(first), 3)
        rest = self.svc.events("ana", rid, last_id=first[-1][0])
        self.assertEqual(rest[-1][1], "end")
        self.assertEqual(rest[-1][2]["state"], "finished")
        got = first + [e for e in rest if e[1] == "journal"]
        ids = [int(e[0]) for e in got]
        run_dir = os.path.join(self.svc.runs, "ana", rid)
        journal = journal_events(run_dir)
        self.assertEqual(ids, [line for line, _ in journal])
        self.assertEqual([e[2] for e in got], [e for _, e in journal])
        self.assertIn("run-end", [e[2]["event"] for e in got])
        # A reconnect after the end: nothing again, only the end.
        again = self.svc.events("ana", rid, last_id=ids[-1])
        self.assertEqual([e[1] for e in again], ["state", "end"])
        status, v, _ = self.svc.request("GET", "/v1/runs/" + rid, user="ana")
        self.assertEqual(status, 200)
        for key in ("id", "state", "pipeline", "created", "tasks", "champion", "result"):
            self.assertIn(key, v)
        self.assertEqual(v["state"], "finished")
        ref = reference_champion()
        self.assertEqual(v["champion"]["candidate"], ref["candidate"])
        self.assertAlmostEqual(v["champion"]["accuracy"], ref["accuracy"], places=12)
        self.assertTrue(all(t["state"] == "done" for t in v["tasks"]), v["tasks"])
        status, res, _ = self.svc.request("GET", f"/v1/runs/{rid}/results", user="ana")
        self.assertEqual((status, res["champion"]["candidate"]["id"]), (200, ref["candidate"]))
        status, html, r = self.svc.request("GET", f"/v1/runs/{rid}/report", user="ana")
        self.assertEqual(status, 200)
        self.assertIn(b"<html", html[:200].lower())
        status, part, r = self.svc.request("GET", f"/v1/runs/{rid}/logs/r1-train", user="ana",
                                           headers={"Range": "bytes=0-9"})
        self.assertEqual((status, len(part)), (206, 10))
        status, _, _ = self.svc.request("GET", f"/v1/runs/{rid}/logs/coordinator", user="ana")
        self.assertEqual(status, 200)
        status, v, _ = self.svc.request("GET", f"/v1/runs/{rid}/logs/..%2F..%2Fusers", user="ana")
        self.assertIn(status, (400, 404))
        status, lst, _ = self.svc.request("GET", "/v1/runs?limit=1", user="ana")
        self.assertEqual((status, lst["limit"], len(lst["runs"])), (200, 1, 1))
        # Finished: nothing to cancel, nothing to resume.
        self.assertEqual(self.svc.request("DELETE", "/v1/runs/" + rid, user="ana")[0], 409)
        self.assertEqual(self.svc.request("POST", f"/v1/runs/{rid}/resume", user="ana")[0], 409)

        # Another user's run does not exist for them, by any route.
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/resume"), ("GET", "/results"),
                             ("GET", "/report"), ("GET", "/logs/r1-train"), ("GET", "/events")):
            status, v, _ = self.svc.request(method, f"/v1/runs/{rid}{path}", user="ben")
            self.assertEqual(status, 404, (method, path, v))
        status, lst, _ = self.svc.request("GET", "/v1/runs", user="ben")
        self.assertNotIn(rid, [r["id"] for r in lst["runs"]])

    def test_an_invalid_pipeline_gets_422_with_what_validate_says(self):
        doc = pipeline("bad")
        doc["rounds"]["max"] = "three"
        doc["head"]["optimiser"] = "adam"
        path = os.path.join(self.work, "bad.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        cli = subprocess.run([EXE, "validate", path], capture_output=True, text=True)
        self.assertEqual(cli.returncode, 3)
        status, v, _ = self.svc.request("POST", "/v1/runs", json.dumps(doc), user="ana")
        self.assertEqual(status, 422, v)
        e = v["error"]
        self.assertEqual(e["code"], "invalid_pipeline")
        # The CLI prints "<file>: <pointer>: <message> — <hint>": the same three parts.
        self.assertIn(f"{path}: {e['pointer']}: {e['message']}", cli.stderr)
        self.assertEqual(e["pointer"], "/head/optimiser")
        self.assertIn('did you mean "optimizer"', e["hint"])
        self.assertIn(e["hint"], cli.stderr)
        for body, pointer in (("{not json", "/"), (json.dumps({"pipeline": 3}), "/pipeline"),
                              (json.dumps({"pipeline": doc, "colour": "red"}), "/colour")):
            status, v, _ = self.svc.request("POST", "/v1/runs", body, user="ana")
            self.assertEqual((status, v["error"].get("pointer")), (422, pointer), v)
        status, lst, _ = self.svc.request("GET", "/v1/runs", user="ana")
        self.assertNotIn("bad", [r["name"] for r in lst["runs"]])

    def test_the_catalog_lists_what_the_folders_hold_and_nothing_else(self):
        own = os.path.join(os.path.realpath(self.own), "catalog")
        for split, n in (("train", 2), ("test", 1)):
            for cls in ("circle", "square"):
                os.makedirs(os.path.join(own, "shapes", split, cls))
                for k in range(n):
                    with open(os.path.join(own, "shapes", split, cls, f"{k}.png"), "wb") as f:
                        f.write(encode_png(bytes(64), 8, 8))
        os.makedirs(os.path.join(own, "idx"))
        for part in ("images-idx3", "labels-idx1"):
            shutil.copy(os.path.join(DATA, f"t10k-{part}-ubyte.gz"), os.path.join(own, "idx"))
        shutil.copy(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"), os.path.join(own, "idx", "lonely-images-idx3-ubyte.gz"))
        # NumPy arrays, written by NumPy: pairs by their names and by the one labels array of as
        # many rows; arrays no pipeline takes (float images, unpaired images) are not listed.
        import numpy as np
        os.makedirs(os.path.join(own, "npy"))
        os.makedirs(os.path.join(own, "npy-by-rows"))
        for name, array in (("x_train", np.zeros((3, 4, 4), np.uint8)), ("y_train", np.arange(3, dtype=np.int64)),
                            ("y_other", np.arange(3, dtype=np.int64)),
                            ("test_images", np.zeros((2, 4, 4, 3), np.uint8)), ("test_labels", np.ones(2, np.uint8)),
                            ("floats", np.zeros((2, 4, 4), np.float32)), ("lonely_images", np.zeros((5, 4, 4), np.uint8))):
            np.save(os.path.join(own, "npy", name + ".npy"), array)
        np.save(os.path.join(own, "npy-by-rows", "pixels.npy"), np.zeros((4, 6, 6, 1), np.uint8))
        np.save(os.path.join(own, "npy-by-rows", "classes.npy"), np.arange(4, dtype=np.int32))
        shutil.copy(os.path.join(MODELS, "ch_ppocr_mobile_v2.0_cls_infer.onnx"), os.path.join(own, "cls.onnx"))
        os.makedirs(os.path.join(own, ".hidden"))
        shutil.copy(os.path.join(own, "cls.onnx"), os.path.join(own, ".hidden", "hidden.onnx"))
        os.symlink(DATA, os.path.join(own, "data-link"))  # links lead out of the folders: not followed
        os.symlink(os.path.join(MODELS, "mobilenet_v2.onnx"), os.path.join(own, "linked.onnx"))
        status, c, _ = self.svc.request("GET", "/v1/catalog", user="ben")
        self.assertEqual(status, 200, c)
        mine = lambda items, key: [x for x in items if x[key].startswith(own + "/")]  # noqa: E731
        self.assertEqual(mine(c["image_folders"], "path"), [{"path": f"{own}/shapes/test", "classes": 2},
                                              {"path": f"{own}/shapes/train", "classes": 2}])
        self.assertEqual(mine(c["idx"], "images"), [{"images": f"{own}/idx/t10k-images-idx3-ubyte.gz",
                                     "labels": f"{own}/idx/t10k-labels-idx1-ubyte.gz"}])
        self.assertEqual(mine(c["npy"], "images"), [
            {"images": f"{own}/npy-by-rows/pixels.npy", "labels": f"{own}/npy-by-rows/classes.npy", "count": 4},
            {"images": f"{own}/npy/test_images.npy", "labels": f"{own}/npy/test_labels.npy", "count": 2},
            {"images": f"{own}/npy/x_train.npy", "labels": f"{own}/npy/y_train.npy", "count": 3}])
        # (Other tests leave files in ben's folder; those under catalog/ are this test's.)
        self.assertEqual(mine(c["models"], "path"),
                         [{"path": f"{own}/cls.onnx", "bytes": os.path.getsize(f"{own}/cls.onnx")}])
        self.assertFalse(c["truncated"])
        status, c, _ = self.svc.request("GET", "/v1/catalog", user="ana")
        self.assertIn({"images": f"{DATA}/train-images-idx3-ubyte.gz", "labels": f"{DATA}/train-labels-idx1-ubyte.gz"}, c["idx"])
        self.assertIn(f"{MODELS}/mobilenet_v2.onnx", [m["path"] for m in c["models"]])
        # A model's layers: those msaflow cuts at, with the quickstart's and fine-tuning's among them.
        status, m, _ = self.svc.request("GET", "/v1/catalog/layers?onnx=" + f"{MODELS}/mobilenet_v2.onnx", user="ana")
        self.assertEqual(status, 200, m)
        names = [layer["name"] for layer in m["layers"]]
        nodes = [layer["node"] for layer in m["layers"]]
        self.assertLess(nodes.index("block_11_expand"), names.index("block_13_expand_relu"))
        self.assertIn(m["suggested"], names)
        self.assertEqual(m["input"]["channels"], 3)
        status, m, _ = self.svc.request("GET", "/v1/catalog/layers?onnx=" + f"{own}/cls.onnx", user="ben")
        self.assertEqual(status, 200, m)
        self.assertGreater(len(m["layers"]), 10)
        for path, code in ((f"{MODELS}/mobilenet_v2.onnx", 403), (f"{own}/linked.onnx", 403), ("cls.onnx", 400),
                           (f"{own}/none.onnx", 404), (f"{own}/idx/t10k-labels-idx1-ubyte.gz", 422),
                           ("/etc/passwd", 403), (own + "/.." * own.count("/") + "/etc/passwd", 403),
                           ("/nonexistent/x.onnx", 403)):
            status, v, _ = self.svc.request("GET", "/v1/catalog/layers?onnx=" + urllib.parse.quote(path), user="ben")
            self.assertEqual(status, code, (path, v))
            self.assertTrue(v["error"]["message"], v)
        self.assertEqual(self.svc.request("GET", "/v1/catalog")[0], 401)

    def test_validate_checks_as_submit_does_and_starts_nothing(self):
        status, before, _ = self.svc.request("GET", "/v1/runs", user="ana")
        doc = pipeline("checked")
        status, v, _ = self.svc.request("POST", "/v1/validate", json.dumps(doc), user="ana")
        self.assertEqual(status, 200, v)
        self.assertTrue(v["validation"])
        self.assertEqual(v["pipeline"]["datasets"]["train"]["images"], os.path.normpath(doc["datasets"]["train"]["images"]))
        doc["rounds"]["max"] = 0
        status, v, _ = self.svc.request("POST", "/v1/validate", json.dumps(doc), user="ana")
        self.assertEqual((status, v["error"]["pointer"]), (422, "/rounds/max"), v)
        status, v, _ = self.svc.request("POST", "/v1/validate", json.dumps(pipeline("theirs")), user="ben")
        self.assertEqual((status, v["error"]["code"]), (403, "outside_your_folders"), v)
        status, after, _ = self.svc.request("GET", "/v1/runs", user="ana")
        self.assertNotIn("checked", [r["name"] for r in after["runs"]])
        self.assertEqual(after["total"], before["total"])

    def test_files_outside_the_users_folders_are_refused_before_anything_runs(self):
        before = sorted(os.listdir(os.path.join(self.svc.runs))) if os.path.isdir(self.svc.runs) else []
        doc = pipeline("outside")
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ben")  # ben may not read the dataset
        self.assertEqual((status, v["error"]["code"], v["error"]["pointer"]), (403, "outside_your_folders",
                                                                               "/datasets/train/images"))
        # A symbolic link inside ben's folder to the dataset outside it, and a path climbing out.
        link = os.path.join(self.own, "fm")
        if not os.path.islink(link):
            os.symlink(DATA, link)
        doc["datasets"]["train"]["images"] = os.path.join(link, "train-images-idx3-ubyte.gz")
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ben")
        self.assertEqual((status, v["error"]["pointer"]), (403, "/datasets/train/images"))
        doc["datasets"]["train"]["images"] = self.own + "/../../../" + DATA + "/train-images-idx3-ubyte.gz"
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ben")
        self.assertEqual((status, v["error"]["pointer"]), (403, "/datasets/train/images"))
        # A model outside ana's folders, after a model cut at two layers (two backbones of one
        # entry): refused, pointing at the entry that names it.
        os.makedirs(self.own, exist_ok=True)
        theirs = os.path.join(self.own, "model.onnx")
        with open(theirs, "wb") as f:
            f.write(b"\0")
        doc = pipeline("zoo")
        doc["backbones"] = [{"name": "m", "onnx": os.path.join(MODELS, "mobilenet_v2.onnx"),
                             "feature_layer": ["block_3_expand_relu", "block_13_expand_relu"],
                             "input": {"height": 32, "width": 32}},
                            {"name": "t", "onnx": theirs, "feature_layer": "x", "input": {"height": 32, "width": 32}}]
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ana")
        self.assertEqual((status, v["error"]["code"], v["error"]["pointer"]), (403, "outside_your_folders",
                                                                               "/backbones/1/onnx"), v)
        doc = pipeline("nam")
        doc["nam"] = "file:///tmp/elsewhere"
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ana")
        self.assertEqual((status, v["error"]["pointer"]), (403, "/nam"))
        doc = pipeline("machine")
        doc["machine"] = "/etc/passwd"
        status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ana")
        self.assertEqual((status, v["error"]["pointer"]), (403, "/machine"))
        # Whether a file outside the user's folders exists is not told: a missing one and a
        # present one get the same 403; a missing one in a folder of theirs is named missing.
        for path, want in ((os.path.join(DATA, "no-such-images.gz"), 403), ("/nonexistent/x.gz", 403),
                           (os.path.join(self.own, "no-such-images.gz"), 422)):
            doc = pipeline("missing")
            doc["datasets"]["train"]["images"] = path
            status, v, _ = self.svc.request("POST", "/v1/runs", doc, user="ben")
            self.assertEqual((status, v["error"].get("pointer")), (want, "/datasets/train/images"), (path, v))
            self.assertEqual("no such file" in v["error"]["message"], want == 422, v)
        self.assertFalse(os.path.exists(os.path.join(self.svc.runs, "ben", ".service")))
        after = sorted(os.listdir(os.path.join(self.svc.runs))) if os.path.isdir(self.svc.runs) else []
        self.assertEqual([d for d in after if d not in before and d != "ana"], [])

    def test_a_body_over_the_limit_gets_413(self):
        status, v, _ = self.svc.request("POST", "/v1/runs", b"{" + b" " * (1 << 20) + b"}", user="ana")
        self.assertEqual((status, v["error"]["code"]), (413, "payload_too_large"))
        # A declared length over the bound is answered before the body is sent (only an infer
        # request may be larger): the 413 comes at once, nothing read.
        with socket.create_connection((self.svc.host, self.svc.port), timeout=10) as sk:
            sk.sendall(("POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + self.svc.tokens["ana"] +
                        "\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n").encode())
            head = sk.recv(4096).decode(errors="replace")
        self.assertTrue(head.startswith("HTTP/1.1 413"), head[:200])
        # A chunked body has no length to check first: refused at once outside infer (411).
        answer = answer_of(self.svc, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           self.svc.tokens["ana"] + "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.assertTrue(answer.startswith("HTTP/1.1 411"), answer[:200])
        self.assertIn('"length_required"', answer)
        # Sent as a form (curl -d's default type), cpp-httplib takes 8 KiB: the answer says so.
        status, v, _ = self.svc.request("POST", "/v1/runs", b"{" + b" " * 9000 + b"}", user="ana",
                                        headers={"Content-Type": "application/x-www-form-urlencoded"})
        self.assertEqual(status, 413)
        self.assertIn("Content-Type: application/json", v["error"]["hint"])

    def test_a_post_without_a_length_has_no_body(self):
        """`curl -X POST .../resume` sends neither Content-Length nor Transfer-Encoding: no body
        (RFC 9112), answered at once, not a 400 after the read timeout (issue 47 item 5)."""
        auth = "Authorization: Bearer " + self.svc.tokens["ana"] + "\r\n"
        answer = answer_of(self.svc, "POST /v1/runs/no-such-run/resume HTTP/1.1\r\nHost: x\r\n" + auth +
                           "Connection: close\r\n\r\n", timeout=5)
        self.assertTrue(answer.startswith("HTTP/1.1 404"), answer[:300])
        self.assertIn("no run no-such-run", answer)
        # As an attacker would send it: without a token (401), and a new run with no pipeline
        # (a 4xx naming what is missing), each at once.
        answer = answer_of(self.svc, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
        self.assertTrue(answer.startswith("HTTP/1.1 401"), answer[:300])
        answer = answer_of(self.svc, "POST /v1/runs HTTP/1.1\r\nHost: x\r\n" + auth + "Connection: close\r\n\r\n",
                           timeout=5)
        self.assertRegex(answer[:12], r"HTTP/1.1 4\d\d", answer[:300])
        self.assertIn('"error"', answer)

    def test_cancel_stops_a_running_run_and_resume_continues_it(self):
        doc = pipeline("cancel")
        doc["head"]["epochs"] = [60]  # a train step long enough to be cancelled in
        v = self.submit(doc)
        rid = v["id"]
        run_dir = os.path.join(self.svc.runs, "ana", rid)
        deadline = time.time() + 120
        while time.time() < deadline:
            if os.path.exists(os.path.join(run_dir, "journal.jsonl")) and any(
                    e["event"] == "task-start" and e["task"] == "r1-train" for _, e in journal_events(run_dir)):
                break
            time.sleep(0.1)
        # Every thread of the service holds SIGINT/SIGTERM back but the one that takes them (in
        # sigtimedwait the kernel shows them unheld), so none lands in inference's oneDNN kernels;
        # the coordinator it started holds none back.
        masks = thread_masks(self.svc.proc.pid)
        self.assertGreater(len(masks), 2)
        self.assertLessEqual(sum(1 for m in masks.values() if m & STOP_BITS != STOP_BITS), 1, masks)
        coordinators = children_running(self.svc.proc.pid, "--run-id " + rid)
        self.assertEqual(len(coordinators), 1, coordinators)
        self.assertEqual(thread_masks(coordinators[0])[coordinators[0]] & STOP_BITS, 0)
        status, v, _ = self.svc.request("DELETE", "/v1/runs/" + rid, user="ana")
        self.assertEqual(status, 202, v)
        v = self.svc.wait_state("ana", rid, ("cancelled", "failed", "interrupted", "finished"))
        self.assertEqual(v["state"], "cancelled", v)
        failed = [e for _, e in journal_events(run_dir) if e["event"] == "run-failed"][-1]
        self.assertTrue(failed["cancelled"])
        self.assertIn("user ana", failed["by"])
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        self.assertNotIn(run_dir, ps)
        status, v, _ = self.svc.request("POST", f"/v1/runs/{rid}/resume", user="ana")
        self.assertEqual(status, 202, v)
        v = self.svc.wait_state("ana", rid, ("finished", "failed"))
        self.assertEqual(v["state"], "finished", v)
        self.assertIn("resume", [e["event"] for _, e in journal_events(run_dir)])

    def test_clients_that_stall_mid_request_are_cut_off_and_others_are_served(self):
        # Half a request's headers, then silence: each connection holds a worker until the
        # service's read timeout (10 s) ends it; meanwhile other clients are answered.
        stalled = []
        for _ in range(20):
            sk = socket.create_connection((self.svc.host, self.svc.port), timeout=30)
            sk.sendall(b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ")
            stalled.append(sk)
        t0 = time.monotonic()
        status, v, _ = self.svc.request("GET", "/v1/health")
        self.assertEqual(status, 200, v)
        self.assertLess(time.monotonic() - t0, 5)
        for sk in stalled:
            try:
                got = sk.recv(65536)  # the server closes it (perhaps with a 408 first)
                while got and sk.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            sk.close()
        # Cut off by the read timeout, not kept until this test's own 30 s socket timeout.
        self.assertLess(time.monotonic() - t0, 25)
        self.assertEqual(self.svc.request("GET", "/v1/health")[0], 200)

    def test_clients_that_trickle_a_request_are_cut_off_at_its_deadline(self):
        # A byte every half second keeps every read within the read timeout: cpp-httplib alone
        # kept such a connection, and a worker, for ever ("slow loris"). The service gives a
        # request's headers 10 s from the connection's start, its body --request-timeout (4 s
        # here) after them.
        def trickle(head, drip):
            """Seconds until the service closed a connection that sent `head`, then `drip` every 0.5 s."""
            sk = socket.create_connection((self.svc.host, self.svc.port), timeout=30)
            t0 = time.monotonic()
            try:
                sk.sendall(head)
                while time.monotonic() - t0 < 40:
                    readable, _, _ = select.select([sk], [], [], 0.5)
                    if readable:
                        while sk.recv(65536):  # a 408 perhaps, then the close
                            pass
                        return time.monotonic() - t0
                    sk.sendall(drip)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - t0
            finally:
                sk.close()
            return None

        token = self.svc.tokens["ana"].encode()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            headers = pool.submit(trickle, b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a")
            body = pool.submit(trickle, b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                               b"\r\nContent-Type: application/json\r\nContent-Length: 900\r\n\r\n{", b" ")
            # Meanwhile others are served.
            t0 = time.monotonic()
            status, v, _ = self.svc.request("GET", "/v1/runs", user="ana")
            self.assertEqual(status, 200, v)
            self.assertLess(time.monotonic() - t0, 5)
            cut_headers, cut_body = headers.result(), body.result()
        self.assertIsNotNone(cut_headers, "a connection trickling its headers was kept 40 s")
        self.assertGreater(cut_headers, 9)
        self.assertLess(cut_headers, 14)
        self.assertIsNotNone(cut_body, "a connection trickling its body was kept 40 s")
        self.assertGreater(cut_body, 3)
        self.assertLess(cut_body, 8)
        self.assertEqual(self.svc.request("GET", "/v1/health")[0], 200)

    def test_hostile_http_gets_4xx_and_never_stops_the_service(self):
        def raw(data, read=True):
            s = socket.create_connection((self.svc.host, self.svc.port), timeout=20)
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                out = b""
                while read:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                return out
            finally:
                s.close()

        def status_of(reply):
            if not reply:
                return None  # closed without a word: also not a crash
            return int(reply.split(b" ", 2)[1])

        token = self.svc.tokens["ana"].encode()
        cases = [b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n",
                 b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                 b"\r\nContent-Length: 12\r\n\r\n{\"a\": \"\xff\xfe\"}",
                 b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                 b"\r\nContent-Length: 5\r\n\r\n[1,2,",
                 b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
                 b"GET /v1/runs/%00%ff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n\r\n",
                 b"GET /v1/runs?limit=-1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n\r\n",
                 b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200)]
        for c in cases:
            st = status_of(raw(c))
            self.assertTrue(st is None or 400 <= st < 500, (c[:60], st))
        # 10,000 requests with random methods and paths, 8 clients at once.
        rng = random.Random(7)
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW", "G\x01T"]
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789/._-%?=&~"
        reqs = []
        for i in range(10000):
            path = "/" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
            if rng.random() < 0.3:
                path = "/v1/runs/" + path.lstrip("/")
            auth = b"Authorization: Bearer " + token + b"\r\n" if rng.random() < 0.5 else b""
            reqs.append(f"{rng.choice(methods)} {path} HTTP/1.1\r\nHost: x\r\n".encode() + auth +
                        b"Connection: close\r\n\r\n")
        bad = []
        # The dashboard's files and the health check are public: GET (and HEAD, which cpp-httplib
        # answers as a GET) of one of them, with any query, is answered 200. Every other request
        # here is refused with a 4xx or closed (the limits may refuse before routing).
        public = {"/", "/app.js", "/app.css", "/v1/health", "/v1/openapi.json"}

        def allowed(r):
            method, target = r.split(b" ", 2)[:2]
            return {200} if method in (b"GET", b"HEAD") and target.split(b"?")[0].decode() in public else set()

        def client(part):
            for r in part:
                st = status_of(raw(r))
                if st is not None and not (400 <= st < 500) and st not in allowed(r):
                    bad.append((r[:80], st))

        threads = [threading.Thread(target=client, args=(reqs[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(bad, [])
        self.assertIsNone(self.svc.proc.poll())
        self.assertEqual(self.svc.request("GET", "/v1/health")[0], 200)


def service_log(svc):
    """The service's structured lines (one JSON object each) from its log."""
    out = []
    with open(os.path.join(svc.work, "serve.log")) as f:
        for line in f:
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


class Restart(unittest.TestCase):
    """kill -9 of the service mid-run and a restart (issue 47 item 4): with no request from anyone,
    the run its death interrupted is resumed in its place in the queue, its journal says why, and
    it ends with the uninterrupted champion; a run a user cancelled before stays cancelled; the
    queue keeps its order; the log has a line for each thing the service did."""

    def test_kill_9_and_restart_resume_what_it_interrupted(self):
        with tempfile.TemporaryDirectory() as work:
            env = dict(os.environ)
            # The runs' feature reads are slowed, so a run is surely mid-run when it is cut.
            env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                     "delay_ms": 1500, "count": 6}])
            svc = Service(work, [("ana", [DATA, MODELS], 0)], extra=["--max-running", "1"], env=env)
            ids = []
            for name in ("first", "second", "third"):
                status, v, _ = svc.request("POST", "/v1/runs", pipeline(name), user="ana")
                self.assertEqual(status, 202, v)
                ids.append(v["id"])
            first, second, third = ids
            svc.wait_state("ana", first, ("running",))
            self.assertEqual([svc.request("GET", "/v1/runs/" + i, user="ana")[1].get("position") for i in ids[1:]],
                             [1, 2])

            def wait_training(run_id):
                run_dir = os.path.join(svc.runs, "ana", run_id)
                deadline = time.time() + 120
                while not (os.path.exists(os.path.join(run_dir, "journal.jsonl")) and any(
                        e["event"] == "task-start" and e["task"] == "r1-train" for _, e in journal_events(run_dir))):
                    self.assertLess(time.time(), deadline)
                    time.sleep(0.1)

            # The first is cancelled by its user mid-run: a restart must leave it so.
            wait_training(first)
            self.assertEqual(svc.request("DELETE", "/v1/runs/" + first, user="ana")[0], 202)
            self.assertEqual(svc.wait_state("ana", first, ("cancelled",))["state"], "cancelled")
            wait_training(second)
            svc.stop(signal.SIGKILL)
            svc.start(env=dict(os.environ))  # at once, as systemd's Restart=on-failure would
            status, lst, _ = svc.request("GET", "/v1/runs", user="ana")
            states = {r["id"]: r for r in lst["runs"]}
            self.assertEqual(states[first]["state"], "cancelled", states[first])
            self.assertIn(states[second]["state"], ("queued", "running", "interrupted"), states[second])
            self.assertEqual(states[third]["state"], "queued")  # one at a time: second goes first
            self.assertEqual([r["id"] for r in lst["runs"]], [third, second, first])
            ref = reference_champion()
            for i in (second, third):
                v = svc.wait_state("ana", i, ("finished", "failed", "cancelled"), timeout=400)
                self.assertEqual(v["state"], "finished", v)
                self.assertEqual(v["champion"]["candidate"], ref["candidate"])
                self.assertAlmostEqual(v["champion"]["accuracy"], ref["accuracy"], places=12)
            self.assertEqual(svc.request("GET", "/v1/runs/" + first, user="ana")[1]["state"], "cancelled")
            resumes = {i: [e for _, e in journal_events(os.path.join(svc.runs, "ana", i)) if e["event"] == "resume"]
                       for i in ids}
            self.assertEqual((len(resumes[first]), len(resumes[third])), (0, 0))
            self.assertEqual(len(resumes[second]), 1, resumes[second])
            self.assertIn("msaflow serve", resumes[second][0]["reason"])
            self.assertIn("interrupted", resumes[second][0]["reason"])
            r = subprocess.run([EXE, "status", os.path.join(svc.runs, "ana", second)], capture_output=True, text=True)
            self.assertIn("why: msaflow serve", r.stdout)
            # The journal says `finished` before the coordinator has exited; the service logs
            # run-ended when it reaps it (within a queue tick).
            deadline = time.time() + 30
            while not {("run-ended", second), ("run-ended", third)} <= {(e["event"], e.get("run")) for e in service_log(svc)}:
                self.assertLess(time.time(), deadline, "the service never logged the runs' ends")
                time.sleep(0.2)
            svc.stop()
            log = service_log(svc)
            events = [(e["event"], e.get("run")) for e in log if e["event"] != "http"]
            for want in [("run-admitted", first), ("run-admitted", second), ("run-admitted", third),
                         ("run-started", first), ("run-cancel", first), ("run-ended", first), ("run-started", second),
                         ("serve-start", None), ("run-requeued", second), ("run-ended", second),
                         ("run-started", third), ("run-ended", third), ("serve-stop", None)]:
                self.assertIn(want, events)
            # In that order, the restart's requeue before the second's new start.
            self.assertLess(events.index(("run-requeued", second)), len(events) - 1 -
                            events[::-1].index(("run-started", second)))
            ended = {e["run"]: e["state"] for e in log if e["event"] == "run-ended"}
            self.assertEqual(ended, {first: "cancelled", second: "finished", third: "finished"})
            http = [e for e in log if e["event"] == "http"]
            self.assertTrue(any(e["method"] == "POST" and e["path"] == "/v1/runs" and e["status"] == 202 and
                                e["user"] == "ana" and e["ms"] >= 0 for e in http))
            self.assertFalse(any("Bearer" in json.dumps(e) or svc.tokens["ana"] in json.dumps(e) for e in log))


class RestartAtRandom(unittest.TestCase):
    """kill -9 of the service at random moments (issue 47 item 5): mid-admission, mid-start,
    mid-resume, mid-cancel, or while runs run; each time it starts again at once. In the end every
    run is finished with the uninterrupted champion, or cancelled because its user asked; none
    reads running, interrupted or failed; no coordinator is left behind. Two seeds here (about 20 s
    each); MSAFLOW_TEST_SEEDS=1,2,... picks others. Before a run its own death interrupted read as
    queued while its coordinator stopped, 2 of the first 11 seeds saw it interrupted; since, by
    hand, 70 tries over seeds 1-60: 68 passed, and the 2 others found a coordinator that had
    written its last line still exiting (this test now gives it 30 s; those seeds passed 4 of 4)."""

    def test_kill_9_at_random_moments(self):
        ref = reference_champion()
        for seed in [int(s) for s in os.environ.get("MSAFLOW_TEST_SEEDS", "47,10").split(",")]:
            with self.subTest(seed=seed):
                self.kill_at_random(seed, ref)

    def kill_at_random(self, seed, ref):
        rng = random.Random(seed)
        with tempfile.TemporaryDirectory() as work:
            svc = Service(work, [("ana", [DATA, MODELS], 0)], extra=["--max-running", "2"])
            asked_cancel = set()
            try:
                for trial in range(6):
                    status, lst, _ = svc.request("GET", "/v1/runs?limit=100", user="ana")
                    ids = [r["id"] for r in lst["runs"]]
                    action = rng.choice(["submit", "submit", "cancel", "resume"] if ids else ["submit"])
                    target = rng.choice(ids) if ids else None
                    if action == "cancel":
                        asked_cancel.add(target)  # asked, whether or not the answer comes back

                    def act():
                        try:
                            if action == "submit":
                                svc.request("POST", "/v1/runs", pipeline(f"t{trial}"), user="ana")
                            elif action == "cancel":
                                svc.request("DELETE", "/v1/runs/" + target, user="ana")
                            else:
                                svc.request("POST", f"/v1/runs/{target}/resume", user="ana")
                        except (OSError, http.client.HTTPException):
                            pass  # the service died under it

                    t = threading.Thread(target=act)
                    t.start()
                    time.sleep(rng.choice([0.0, 0.005, 0.02, 0.1, 0.5, 1.5, 3.0]))
                    svc.stop(signal.SIGKILL)
                    t.join()
                    svc.start()
                status, lst, _ = svc.request("GET", "/v1/runs?limit=100", user="ana")
                self.assertGreater(len(lst["runs"]), 0)
                for r in lst["runs"]:
                    v = svc.wait_state("ana", r["id"], ("finished", "cancelled", "failed", "interrupted"),
                                       timeout=300)
                    if v["state"] == "cancelled":
                        self.assertIn(r["id"], asked_cancel, (seed, v))
                        continue
                    self.assertEqual(v["state"], "finished", (seed, v))
                    self.assertEqual(v["champion"]["candidate"], ref["candidate"], (seed, v))
                    self.assertAlmostEqual(v["champion"]["accuracy"], ref["accuracy"], places=12)
                # Every run has ended: nothing of them runs any more, once the coordinators that
                # wrote their journal's last line (or were told to stop before they began) exit.
                deadline = time.time() + 30
                while (left := [c for _, c in processes_naming(svc.runs) if " serve " not in c]) and time.time() < deadline:
                    time.sleep(0.2)
                self.assertEqual(left, [], seed)
            finally:
                svc.stop()


class Queue(unittest.TestCase):
    def test_max_running_and_quotas(self):
        with tempfile.TemporaryDirectory() as work:
            env = dict(os.environ)  # runs that wait on their features until they are cancelled
            env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                     "delay_ms": 300000, "count": 0}])
            svc = Service(work, [("ana", [DATA, MODELS], 1), ("ben", [DATA, MODELS], 0)],
                          extra=["--max-running", "2"], env=env)
            try:
                doc = pipeline("q")
                a1 = svc.request("POST", "/v1/runs", doc, user="ana")[1]["id"]
                a2 = svc.request("POST", "/v1/runs", doc, user="ana")[1]["id"]
                b1 = svc.request("POST", "/v1/runs", doc, user="ben")[1]["id"]
                b2 = svc.request("POST", "/v1/runs", doc, user="ben")[1]["id"]
                svc.wait_state("ana", a1, ("running",))
                svc.wait_state("ben", b1, ("running",))  # ana's quota of 1 lets ben's run pass hers
                time.sleep(1)
                self.assertEqual(svc.request("GET", "/v1/runs/" + a2, user="ana")[1]["state"], "queued")
                v = svc.request("GET", "/v1/runs/" + b2, user="ben")[1]
                self.assertEqual((v["state"], v["position"]), ("queued", 2))  # behind ana's second
                # Cancelled in the queue: it leaves it and never starts.
                self.assertEqual(svc.request("DELETE", "/v1/runs/" + a2, user="ana")[0], 202)
                self.assertEqual(svc.request("GET", "/v1/runs/" + a2, user="ana")[1]["state"], "cancelled")
                self.assertEqual(svc.request("GET", "/v1/runs/" + b2, user="ben")[1]["position"], 1)
                for user, rid in (("ana", a1), ("ben", b1), ("ben", b2)):
                    svc.request("DELETE", "/v1/runs/" + rid, user=user)
                for user, rid in (("ana", a1), ("ben", b1), ("ben", b2)):
                    self.assertEqual(svc.wait_state(user, rid, ("cancelled",))["state"], "cancelled")
                self.assertFalse(os.path.exists(os.path.join(svc.runs, "ana", a2)))
            finally:
                svc.stop()


class Inference(unittest.TestCase):
    """/v2: the Open Inference Protocol over a run's champion (issue 28), through the real server:
    a batch, a single image, FP32/UINT8/BYTES, each bad request a 4xx, names by run id and by
    <pipeline>@champion, 64 concurrent clients with no error and resident memory held."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        work = cls.tmp.name
        doc = pipeline("inf", rounds=1)
        p = os.path.join(work, "inf.json")
        with open(p, "w") as f:
            json.dump(doc, f)
        subprocess.run([EXE, "run", p, "--runs", os.path.join(work, "cli-runs"), "--run-id", "inf"], check=True,
                       capture_output=True, timeout=600)
        cls.run_dir = os.path.join(work, "cli-runs", "inf")
        test = doc["datasets"]["test"]
        cls.images = read_idx(test["images"], 16)
        r = subprocess.run([EXE, "predict", cls.run_dir, test["images"], "--labels", test["labels"], "--limit", "16",
                            "--json"], check=True, capture_output=True, text=True)
        cls.ref = [e["probabilities"] for e in json.loads(r.stdout)]
        cls.svc = Service(work, [("ana", [DATA, MODELS], 0), ("bob", [DATA, MODELS], 0)],
                          extra=["--model", "tiny=" + cls.run_dir])

    @classmethod
    def tearDownClass(cls):
        cls.svc.stop()
        cls.tmp.cleanup()

    def infer(self, model, inputs, user="ana", **extra):
        body = dict(extra, inputs=inputs)
        return self.svc.request("POST", f"/v2/models/{model}/infer", body, user=user,
                                headers={"Content-Type": "application/json"})

    def close(self, got, want, tol=1e-6):
        self.assertEqual(len(got), len(want))
        for a, b in zip(got, want):
            self.assertLessEqual(abs(a - b), tol * max(1.0, abs(b)), (a, b))

    def test_a_batch_and_single_images_in_each_datatype(self):
        n = len(self.images)
        status, out, _ = self.infer("tiny", [{"name": "image", "datatype": "UINT8", "shape": [n, 28, 28, 1],
                                               "data": [int(v) for im in self.images for v in im]}], id="b1")
        self.assertEqual(status, 200, out)
        self.assertEqual(out["id"], "b1")
        [t] = out["outputs"]
        self.assertEqual((t["name"], t["datatype"], t["shape"]), ("probabilities", "FP32", [n, 10]))
        self.close(t["data"], [v for row in self.ref for v in row])
        # One image as a PNG file, base64: the same row.
        png = encode_png(self.images[3], 28, 28)
        status, out, _ = self.infer("tiny", [{"name": "image", "datatype": "BYTES", "shape": [1],
                                               "data": [base64.b64encode(png).decode()]}])
        self.assertEqual(status, 200, out)
        self.close(out["outputs"][0]["data"], self.ref[3])
        # The metadata names what it takes.
        status, meta, _ = self.svc.request("GET", "/v2/models/tiny", user="ana")
        self.assertEqual(status, 200, meta)
        self.assertEqual(meta["inputs"][0]["shape"], [-1, 3, 48, 48])
        self.assertEqual(meta["outputs"][0]["shape"], [-1, 10])
        # FP32, prepared by the caller as msaflow prepares: what the UINT8 image gave.
        prepared = prepare(self.images[0], 28, 28, 48, 48, 0.5, 0.5)
        status, out, _ = self.infer("tiny", [{"name": "image", "datatype": "FP32", "shape": [1, 3, 48, 48],
                                               "data": prepared}])
        self.assertEqual(status, 200, out)
        self.close(out["outputs"][0]["data"], self.ref[0], tol=1e-4)
        for path in ("/v2/health/live", "/v2/health/ready", "/v2"):
            self.assertEqual(self.svc.request("GET", path)[0], 200, path)

    def test_each_bad_request_gets_a_4xx_that_says_why(self):
        good = {"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1], "data": [0] * 784}
        cases = [
            ([dict(good, shape=[1, 28, 28, 2])], 400, "channels"),
            ([dict(good, shape=[2, 28, 28, 1])], 400, "1568"),
            ([dict(good, datatype="FP16")], 400, "FP32, UINT8 or BYTES"),
            ([dict(good, datatype="FP32", shape=[1, 3, 48, 47], data=[0.0] * 6768)], 400, "FP32 [1, 3, 48, 48]"),
            ([dict(good, data=[300] + [0] * 783)], 400, "0 to 255"),
            ([{"name": "image", "datatype": "BYTES", "shape": [1],
               "data": [base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 30).decode()]}], 400, "inputs[0].data[0]"),
            ([{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["not base64!"]}], 400, "base64"),
            ([], 400, "one tensor"),
        ]
        for inputs, code, text in cases:
            with self.subTest(text=text):
                status, out, _ = self.infer("tiny", inputs)
                self.assertEqual(status, code, out)
                self.assertIn(text, out["error"]["message"])
        status, out, _ = self.svc.request("POST", "/v2/models/tiny/infer", "{not json", user="ana",
                                          headers={"Content-Type": "application/json"})
        self.assertEqual(status, 400, out)
        self.assertEqual(self.infer("nope", [good])[0], 404)
        self.assertEqual(self.svc.request("GET", "/v2/models/nope", user="ana")[0], 404)
        self.assertEqual(self.svc.request("POST", "/v2/models/tiny/infer", {"inputs": [good]})[0], 401)
        self.assertEqual(self.svc.request("GET", "/v2/models/tiny", token="wrong")[0], 401)
        self.assertEqual(self.svc.request("GET", "/v2/health/live")[0], 200)

    def test_runs_by_id_and_pipeline_champion_only_for_their_owner(self):
        status, sub, _ = self.svc.request("POST", "/v1/runs", pipeline("alias"), user="ana")
        self.assertEqual(status, 202, sub)
        self.svc.wait_state("ana", sub["id"], ("finished",))
        one = [{"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1], "data": [int(v) for v in self.images[5]]}]
        status, by_id, _ = self.infer(sub["id"], one)
        self.assertEqual(status, 200, by_id)
        status, by_alias, _ = self.infer("alias@champion", one)
        self.assertEqual(status, 200, by_alias)
        self.assertEqual(by_alias["outputs"][0]["data"], by_id["outputs"][0]["data"])
        _, view, _ = self.svc.request("GET", "/v1/runs/" + sub["id"], user="ana")
        status, _, _ = self.infer(sub["id"] + ":" + view["champion"]["candidate"], one)
        self.assertEqual(status, 200)
        # bob sees neither
        self.assertEqual(self.infer(sub["id"], one, user="bob")[0], 404)
        self.assertEqual(self.infer("alias@champion", one, user="bob")[0], 404)

    def test_64_concurrent_clients_no_error_and_memory_held(self):
        one = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1],
                                      "data": [int(v) for v in self.images[2]]}]})
        headers = {"Authorization": "Bearer " + self.svc.tokens["ana"], "Content-Type": "application/json"}
        errors, counts = [], [0] * 64

        def client(i, seconds):
            c = http.client.HTTPConnection(self.svc.host, self.svc.port, timeout=60)
            end = time.time() + seconds
            while time.time() < end:
                c.request("POST", "/v2/models/tiny/infer", body=one, headers=headers)
                r = c.getresponse()
                body = r.read()
                if r.status != 200:
                    errors.append((r.status, body[:200]))
                    return
                counts[i] += 1
            c.close()

        def rss():
            with open(f"/proc/{self.svc.proc.pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

        def burst(seconds):
            threads = [threading.Thread(target=client, args=(i, seconds)) for i in range(64)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        # Warm-up: every batch size's plan compiled, and the connection threads (a pool of 160,
        # each touching its stack and malloc arena when first used) and allocator grown.
        sizes = []
        for seconds in (3, 3, 5, 5):
            before = sum(counts)
            burst(seconds)
            sizes.append(rss())
            print(f"64 clients, {seconds} s: {(sum(counts) - before) / seconds:.0f} requests/s, "
                  f"resident memory {sizes[-1] / 1024:.1f} MiB")
        self.assertFalse(errors, errors[:3])
        self.assertTrue(all(counts), "a client was never served")
        growth = sizes[-1] - sizes[-2]
        print(f"growth over the last 5 s: {growth / 1024:.1f} MiB")
        # The requests were batched: fewer batches than requests.
        served = self.svc.request("GET", "/v2/models/tiny", user="ana")[1]["parameters"]["served"]
        print(f"served: {served}, {served['images'] / served['batches']:.1f} images a batch")
        self.assertGreater(served["images"] / served["batches"], 1.5)
        if "ASAN_OPTIONS" in os.environ:  # scripts/sanitize.sh: ASan's quarantine holds freed memory (256 MiB)
            print("under AddressSanitizer: resident memory is not the program's; not checked")
        else:
            self.assertLess(growth, 4 * 1024, "resident memory still grew after the warm-up")


class Tls(unittest.TestCase):
    def test_tls_and_the_refusal_of_clear_text_beyond_loopback(self):
        with tempfile.TemporaryDirectory() as work:
            users = os.path.join(work, "users.json")
            subprocess.run([EXE, "users", "add", "ana", "--users", users], check=True, capture_output=True)
            r = subprocess.run([EXE, "serve", "--listen", "0.0.0.0:0", "--users", users, "--runs", work + "/runs"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("--tls-cert", r.stderr)
            cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                           check=True, capture_output=True)
            os.makedirs(os.path.join(work, "tls"))
            svc = Service(os.path.join(work, "tls"), [("ana", [], 0)], extra=["--tls-cert", cert, "--tls-key", key])
            try:
                ctx = ssl.create_default_context(cafile=cert)
                c = http.client.HTTPSConnection(svc.host, svc.port, context=ctx, timeout=30)
                c.request("GET", "/v1/whoami", headers={"Authorization": "Bearer " + svc.tokens["ana"]})
                r = c.getresponse()
                self.assertEqual((r.status, json.loads(r.read())["user"]), (200, "ana"))
                c.close()
            finally:
                svc.stop()


class Browser:
    """Debian's headless Chromium driven over the DevTools protocol (python3-websocket): pages
    evaluated in, console errors and uncaught exceptions collected, screenshots taken."""

    def __init__(self, work, url):
        import websocket
        self.work = work
        self.proc = subprocess.Popen([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                                      "--remote-debugging-port=0", f"--user-data-dir={work}/chromium",
                                      "--window-size=1200,1600", url],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(work, "chromium", "DevToolsActivePort")
        deadline = time.time() + 60
        def port_text():
            if not os.path.exists(port_file):
                return ""
            with open(port_file) as f:
                return f.read()
        while port_text().count("\n") < 1:
            assert time.time() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = int(port_text().split()[0])
        while True:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/json/list")
            pages = [p for p in json.loads(c.getresponse().read()) if p["type"] == "page"]
            c.close()
            if pages:
                break
            assert time.time() < deadline
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60)
        self.next_id = 0
        self.errors = []
        self.call("Runtime.enable")
        self.call("Log.enable")

    def _note(self, msg):
        m, p = msg.get("method"), msg.get("params", {})
        if m == "Runtime.exceptionThrown":
            self.errors.append(p["exceptionDetails"].get("exception", {}).get("description", str(p)))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            e = p["entry"]
            # The answers the test asks for (a wrong token, an invalid pipeline) are logged by
            # the browser as failed loads; any other failed load is an error of the page.
            if not (e.get("source") == "network" and ("status of 401" in e.get("text", "") or
                                                      "status of 422" in e.get("text", ""))):
                self.errors.append(e.get("text", "") + " " + e.get("url", ""))

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._note(msg)

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def until(self, expr, timeout=120, what=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"never true: {what or expr}")

    def screenshot(self, path):
        import base64
        data = self.call("Page.captureScreenshot")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Dashboard(unittest.TestCase):
    """The dashboard in headless Chromium: sign in, a validation error shown at its pointer, a
    pipeline composed in the new-run form from the user's folders (checked as it changes),
    submitted and watched to `finished` without a reload, its accuracy chart growing a point per
    round, a second one cancelled from its page; no console error. On failure a screenshot is kept in
    $MSAFLOW_TEST_ARTIFACTS (default /tmp/msaflow-test-artifacts)."""

    def test_sign_in_submit_watch_and_cancel(self):
        self.assertIsNotNone(shutil.which("chromium"), "Debian's chromium is not installed (scripts/test.sh installs it)")
        with tempfile.TemporaryDirectory() as work:
            svc = Service(work, [("ana", [DATA, MODELS], 0)], extra=["--max-running", "1"])
            browser = Browser(work, f"http://{svc.host}:{svc.port}/")
            try:
                b = browser
                b.until("document.readyState === 'complete' && !!document.getElementById('token')")
                b.js("window.__noReload = 1")
                b.js(f"document.getElementById('token').value = 'wrong';"
                     "document.querySelector('#signin-form button').click()")
                b.until("document.getElementById('signin-error').textContent.includes('not valid')")
                b.js(f"document.getElementById('token').value = {json.dumps(svc.tokens['ana'])};"
                     "document.querySelector('#signin-form button').click()")
                b.until("!document.getElementById('home').hidden")
                self.assertIn("ana", b.js("document.getElementById('who').textContent"))
                bad = pipeline("dash")
                bad["rounds"]["max"] = 0
                b.js(f"document.getElementById('pipeline').value = {json.dumps(json.dumps(bad, indent=1))};"
                     "document.getElementById('submit').click()")
                b.until("!document.getElementById('submit-error').hidden")
                self.assertEqual(b.js("document.getElementById('error-pointer').textContent"), "/rounds/max")
                self.assertTrue(b.js("document.getElementById('error-message').textContent.length > 0"))
                # The new-run form: the data sets and models of ana's folders, a model's layers
                # once it is checked, the pipeline composed and checked by /v1/validate as the
                # form changes, an invalid choice shown at its pointer, then submitted.
                b.until("document.getElementById('nr-train').options.length >= 2 && "
                        "document.querySelectorAll('#nr-models tbody tr').length >= 5")
                self.assertIn("train-images", b.js("document.getElementById('nr-train').selectedOptions[0].textContent"))
                self.assertIn("t10k-images", b.js("document.getElementById('nr-test').selectedOptions[0].textContent"))
                row = "document.querySelector('#nr-models tr[data-path$=\"/ch_PP-OCRv4_rec_infer.onnx\"]')"
                b.js(f"{row}.querySelector('.nr-use').click()")
                b.until(f"!{row}.querySelector('.nr-cut').disabled")

                def put(element, value, event="input"):
                    b.js(f"(e => {{ e.value = {json.dumps(value)}; e.dispatchEvent(new Event('{event}', {{bubbles: true}})); }})"
                         f"({element})")
                put(f"{row}.querySelector('.nr-cut')", "p2o.AveragePool.1", "change")
                for k, v in (("h", "48"), ("w", "48"), ("mean", "0.5"), ("std", "0.5")):
                    put(f"{row}.querySelector('.nr-{k}')", v)
                for k, v in (("limit", "400"), ("rounds", "2"), ("candidates", "2"), ("epochs", "8"), ("name", "dash")):
                    put(f"document.getElementById('nr-{k}')", v)
                valid = "document.getElementById('validate-answer').dataset.state === 'valid'"
                b.until(valid, what="the composed pipeline checked valid")
                doc = json.loads(b.js("document.getElementById('pipeline').value"))
                self.assertEqual(doc["backbones"], [
                    {"name": "ch_pp_ocrv4_rec_infer", "onnx": os.path.join(MODELS, "ch_PP-OCRv4_rec_infer.onnx"),
                     "feature_layer": "p2o.AveragePool.1",
                     "input": {"height": 48, "width": 48, "channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3}},
                    {"name": "pixels", "kind": "pixels"}])
                self.assertEqual(doc["datasets"]["train"], {"format": "idx", "limit": 400,
                                                            "images": os.path.join(DATA, "train-images-idx3-ubyte.gz"),
                                                            "labels": os.path.join(DATA, "train-labels-idx1-ubyte.gz")})
                self.assertEqual((doc["rounds"]["max"], doc["rounds"]["candidates"], doc["head"]["epochs"]), (2, 2, [8]))
                put("document.getElementById('nr-rounds')", "0")
                b.until("document.getElementById('validate-state').textContent.includes('/rounds/max')")
                put("document.getElementById('nr-rounds')", "2")
                b.until(valid)
                b.js("document.getElementById('submit').click()")
                rid = b.until("(document.getElementById('submit-ok').textContent.match(/submitted as (\\S+)/) || [])[1]")
                slow = pipeline("dash-slow")
                slow["head"]["epochs"] = [400]
                b.js(f"document.getElementById('pipeline').value = {json.dumps(json.dumps(slow))};"
                     "document.getElementById('submit').click()")
                second = b.until("((document.getElementById('submit-ok').textContent.match(/submitted as (\\S+)/) || [])[1]"
                                 f" || {json.dumps(rid)}) !== {json.dumps(rid)} && "
                                 "document.getElementById('submit-ok').textContent.match(/submitted as (\\S+)/)[1]")
                # Its page while it runs: the accuracy chart grows a point per round, no reload.
                b.js(f"location.hash = '#run/' + {json.dumps(rid)}")
                points = "document.getElementById('chart').dataset.points"
                b.until(f"{points} === '1' && document.getElementById('run-state').textContent === 'running'",
                        timeout=300, what="the chart's first round while the run runs")
                b.until(f"{points} === '2' && document.getElementById('run-state').textContent === 'finished'",
                        timeout=300, what="the chart's second round once the run finished")
                self.assertEqual(b.js("document.querySelectorAll('#chart circle').length"), 2)
                # The table follows the runs live: the first shows `finished` with no reload.
                b.js("location.hash = ''")
                row = f"document.querySelector('#runs tr[data-id={json.dumps(rid)}]')"
                b.until(f"{row} && {row}.children[1].textContent.startsWith('finished')", timeout=300,
                        what="the first run shown finished")
                self.assertEqual(b.js("window.__noReload"), 1)
                self.assertTrue(b.js(f"{row}.children[3].textContent.length > 0"))  # its champion
                # Its page: the tasks and the round table.
                b.js(f"{row}.click()")
                b.until("!document.getElementById('run').hidden && "
                        "document.querySelectorAll('#tasks tbody tr').length >= 6")
                self.assertEqual(b.js("document.getElementById('run-state').textContent"), "finished")
                self.assertEqual(b.js("document.querySelectorAll('#rounds tbody tr').length"), 2)
                b.js("document.getElementById('show-report').click()")
                b.until("!document.getElementById('report').hidden && "
                        "document.getElementById('report').srcdoc.includes('<svg')")
                # The second run: cancelled from its page, which then says so without a reload.
                b.js(f"location.hash = '#run/' + {json.dumps(second)}")
                b.until(f"document.getElementById('run-title').textContent === {json.dumps(second)} && "
                        "!document.getElementById('cancel').disabled")
                b.js("document.getElementById('cancel').click()")
                b.until("document.getElementById('run-state').textContent === 'cancelled'", timeout=120)
                self.assertEqual(b.js("window.__noReload"), 1)
                self.assertEqual(svc.request("GET", "/v1/runs/" + second, user="ana")[1]["state"], "cancelled")
                self.assertEqual(b.errors, [])
            except BaseException:
                keep = os.environ.get("MSAFLOW_TEST_ARTIFACTS", "/tmp/msaflow-test-artifacts")
                os.makedirs(keep, exist_ok=True)
                try:
                    browser.screenshot(os.path.join(keep, "dashboard-failure.png"))
                    print("screenshot kept in", os.path.join(keep, "dashboard-failure.png"), file=sys.stderr)
                except Exception as e:  # the browser itself may be what failed
                    print("no screenshot:", e, file=sys.stderr)
                print("console errors:", browser.errors, file=sys.stderr)
                raise
            finally:
                browser.close()
                svc.stop()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
