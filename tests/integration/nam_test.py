#!/usr/bin/python3
"""The NAM server as a real process on loopback, driven by several client processes at once;
kill -9 in the middle of puts and a restart with --persist; the nam CLI for people."""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tmpdir_case import TempDirCase  # noqa: E402

EXE, STRESS = sys.argv[1], sys.argv[2]
MiB = 1 << 20


class Server:
    """`msaflow nam serve` started by this test and stopped by its PID."""

    def __init__(self, tmp, *args):
        self.ready = os.path.join(tmp, "ready-%d.json" % time.monotonic_ns())
        self.log = open(os.path.join(tmp, "server.log"), "a")
        self.proc = subprocess.Popen([EXE, "nam", "serve", "--ready-file", self.ready, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("the NAM server did not start; see " + self.log.name)
            time.sleep(0.02)
        with open(self.ready) as f:
            self.uri = json.load(f)["uri"]

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.log.close()


def stress(*args, **kw):
    return subprocess.Popen([STRESS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def msaflow(*args, **kw):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120, **kw)


class NamServer(TempDirCase):
    def test_eight_clients_at_once_from_one_byte_to_256_mib(self):
        srv = Server(self.dir, "--listen", "127.0.0.1:0", "--capacity", "3GiB")
        try:
            small = ["1", "7", "4096", "32768", "32769", str(MiB + 3), str(16 * MiB + 5)]
            procs = []
            for k in range(8):
                sizes = small + ([str(256 * MiB)] if k < 2 else [str(64 * MiB)])
                transport = "map" if k % 2 else "rma"
                procs.append(stress("roundtrip", srv.uri + "?transport=" + transport, str(k), *sizes))
            for k, p in enumerate(procs):
                out, err = p.communicate(timeout=600)
                self.assertEqual(p.returncode, 0, "client %d: %s %s" % (k, out, err))
                self.assertIn("verified 8 via " + ("map" if k % 2 else "rma"), out)
            # Every client's objects are there, with the sizes they were given.
            ls = msaflow("nam", "ls", "--json", "--nam", srv.uri)
            self.assertEqual(ls.returncode, 0, ls.stderr)
            objs = [json.loads(line) for line in ls.stdout.splitlines()]
            self.assertEqual(len(objs), 64)
            for o in objs:
                self.assertEqual(o["size"], int(o["name"].split("/")[1]))
            df = json.loads(msaflow("nam", "df", "--nam", srv.uri).stdout)
            self.assertEqual(df["pinned"], 0)
            self.assertEqual(df["uncommitted"], 0)
        finally:
            srv.stop()

    def test_kill_9_mid_put_then_restart_with_persist(self):
        persist = os.path.join(self.dir, "persist")
        srv = Server(self.dir, "--listen", "127.0.0.1:0", "--capacity", "1GiB", "--persist", persist)
        port = srv.uri.rsplit(":", 1)[1]
        uri = srv.uri + "?timeout=3"
        writers = [stress("writer", uri + ("&transport=map" if k % 2 else "&transport=rma"), str(k), str(6 * MiB + k))
                   for k in range(4)]
        holder = stress("hold", srv.uri, "held/never", str(4 * MiB))
        self.assertEqual(holder.stdout.readline().strip(), "held")
        time.sleep(2.0)
        srv.stop(signal.SIGKILL)
        killed_at = time.time()
        committed, started = [], []
        for k, w in enumerate(writers):
            out, err = w.communicate(timeout=60)
            self.assertLess(time.time() - killed_at, 30, "a client hung after the server died")
            self.assertEqual(w.returncode, 3, "writer %d should fail: %s %s" % (k, out, err))
            self.assertIn("unavailable", err)
            for line in out.splitlines():
                kind, _, name = line.partition(" ")
                (committed if kind == "committed" else started if kind == "start" else []).append(name)
        holder.kill()
        holder.communicate()
        self.assertGreater(len(committed), 4, "the writers committed too little before the kill")
        # No temporary file may pass for an object; the restart sweeps them.
        srv2 = Server(self.dir, "--listen", "127.0.0.1:" + port, "--capacity", "1GiB", "--persist", persist)
        try:
            v = stress("verify", srv2.uri, *committed)
            out, err = v.communicate(timeout=300)
            self.assertEqual(v.returncode, 0, out + err)
            present = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("present ")]
            # Every committed object is back, intact; nothing appears that no put started
            # (the held allocation was never committed).
            print("  kill -9 after %d committed puts (%d started); %d objects back after the restart"
                  % (len(committed), len(started), len(present)), file=sys.stderr)
            self.assertTrue(set(committed) <= set(present))
            self.assertTrue(set(present) <= set(started))
            self.assertNotIn("held/never", present)
            self.assertLessEqual(len(set(present) - set(committed)), len(writers))  # at most the in-flight ones
            for root, _, files in os.walk(persist):
                for f in files:
                    self.assertNotIn(".tmp.", f)
        finally:
            srv2.stop()

    def test_cli_round_trip_and_errors(self):
        srv = Server(self.dir, "--listen", "127.0.0.1:0", "--capacity", "64MiB")
        try:
            src = os.path.join(self.dir, "blob")
            with open(src, "wb") as f:
                f.write(os.urandom(3 * MiB + 11))
            r = msaflow("nam", "put", "by-hand/blob", src, "--meta", '{"who": "test"}', "--nam", srv.uri)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("version 1", r.stdout)
            out = os.path.join(self.dir, "back")
            r = msaflow("nam", "get", "by-hand/blob", "-o", out, "--nam", srv.uri)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(src, "rb") as a, open(out, "rb") as b:
                self.assertEqual(a.read(), b.read())
            st = json.loads(msaflow("nam", "stat", "by-hand/blob", "--nam", srv.uri).stdout)
            self.assertEqual(st["meta"], {"who": "test"})
            with open(src, "rb") as stdin:
                r = subprocess.run([EXE, "nam", "put", "by-hand/stdin", "--nam", srv.uri], stdin=stdin,
                                   capture_output=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = subprocess.run([EXE, "nam", "get", "by-hand/stdin", "--nam", srv.uri], capture_output=True, timeout=60)
            with open(src, "rb") as f:
                self.assertEqual(got.stdout, f.read())
            # Errors: exit codes from docs/cli.md, one line naming the problem.
            r = msaflow("nam", "get", "by-hand/missing", "--nam", srv.uri)
            self.assertEqual(r.returncode, 4)
            self.assertIn("no object 'by-hand/missing'", r.stderr)
            r = msaflow("nam", "put", "Bad/Name", src, "--nam", srv.uri)
            self.assertEqual(r.returncode, 3)
            self.assertIn("not allowed", r.stderr)
            big = os.path.join(self.dir, "big")
            with open(big, "wb") as f:
                f.truncate(80 * MiB)
            r = msaflow("nam", "put", "by-hand/big", big, "--nam", srv.uri)
            self.assertEqual(r.returncode, 9, r.stderr)
            self.assertIn("NAM full", r.stderr)
            r = msaflow("nam", "put", "x", src, "--meta", "[1]", "--nam", srv.uri)
            self.assertEqual(r.returncode, 3)
            self.assertIn("--meta", r.stderr)
            r = msaflow("nam", "rm", "by-hand/blob", "--nam", srv.uri)
            self.assertEqual(r.returncode, 0)
            r = msaflow("nam", "rm", "by-hand/blob", "--nam", srv.uri)
            self.assertEqual(r.returncode, 4)
            r = msaflow("nam", "ls", "--nam", "fabric://127.0.0.1:1?timeout=1")
            self.assertEqual(r.returncode, 8)
            self.assertIn("is it running", r.stderr)
            r = msaflow("nam", "serve", "--listen", "0.0.0.0:0")
            self.assertEqual(r.returncode, 3)
            self.assertIn("needs a token", r.stderr)
            r = msaflow("nam", "serve", "--capacity", "lots")
            self.assertEqual(r.returncode, 3)
            self.assertIn("--capacity", r.stderr)
            r = msaflow("nam", "ls")
            self.assertEqual(r.returncode, 3)
            self.assertIn("MSAFLOW_NAM", r.stderr)
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
