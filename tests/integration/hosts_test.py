#!/usr/bin/python3
"""Beyond one host: msaflow on the multi-host test cluster (scripts/slurm-cluster.sh --hosts),
where every node is a network namespace with a hostname and an address of its own on a bridge,
its slurmd inside, and the coordinator runs on the login host. A round as one hetjob trains
in sync on two DAM hosts and evaluates on two ESB hosts, its NAM server on a host of its own
reached by RMA over TCP, and reaches the champion of a local run, model bytes and all; so does
a round that fine-tunes a backbone's last blocks with its head on the two DAM hosts. A DAM
host cut off in the middle of training fails the round naming the node, so does the NAM's host
cut off during the resumed run, and a last `resume` finishes the run to the same champion with
nothing stored lost."""
import json
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_pipeline import FINETUNE_FROM, finetune_pipeline, small_pipeline  # noqa: E402
from tmpdir_case import TempDirCase  # noqa: E402
from slurm_clusters import TestCluster  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]
CLUSTER = os.path.join(ROOT, "scripts", "slurm-cluster.sh")
MACHINE = os.path.join(ROOT, "configs", "machines", "slurm-hosts.json")
CLUSTER_UNDER_TEST = TestCluster(ROOT, MACHINE, hosts=True)


def setUpModule():
    CLUSTER_UNDER_TEST.up()


def tearDownModule():
    CLUSTER_UNDER_TEST.down()


def on_login(*args, timeout=600):
    """msaflow on the login host (the nodes' names known there, as on a real cluster)."""
    return subprocess.run([CLUSTER, "login", "--hosts", "--", EXE, *args], capture_output=True, text=True,
                          timeout=timeout)


def pipeline(name):
    doc = small_pipeline(ROOT, name, rounds=1)
    doc["steps"]["train"] = {"module": "dam", "ranks": 2, "mode": "sync"}
    doc["steps"]["evaluate"] = {"module": "esb", "ranks": 2}
    return doc


def rank_hosts(log):
    """(rank, node, host) of every rank line of a step's log."""
    return re.findall(r"^rank (\d+)/\d+ on node (\S+) \(host (\S+),", log, re.M)


def models(nam_dir, run):
    """name -> checksum of the run's models in a persisted NAM."""
    r = subprocess.run([EXE, "nam", "ls", "--json", "--nam", "file://" + nam_dir, f"model/{run}/"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {o["name"].split("/", 2)[2]: o["checksum"] for o in map(json.loads, r.stdout.splitlines())}


class Hosts(TempDirCase):
    def read(self, *parts):
        with open(os.path.join(self.dir, *parts)) as f:
            return f.read()

    def assert_local_champion(self, runs, run):
        """`run` reached the champion of run "local" in the same runs directory, model bytes and all."""
        local = json.loads(self.read("runs", "local", "results.json"))
        got = json.loads(self.read("runs", run, "results.json"))
        self.assertEqual(got["champion"]["candidate"]["id"], local["champion"]["candidate"]["id"])
        self.assertEqual(got["champion"]["accuracy"], local["champion"]["accuracy"])
        self.assertEqual(models(os.path.join(runs, "nam"), run), models(os.path.join(runs, "nam"), "local"))

    def local_then_on_hosts(self, doc):
        """`doc` run locally (run "local") and as Slurm jobs from the login host (run "het"), in
        one runs directory; both must succeed. Returns (runs directory, the second run)."""
        p = self.write(doc["name"] + ".json", doc)
        runs = os.path.join(self.dir, "runs")
        r = subprocess.run([EXE, "run", p, "--runs", runs, "--run-id", "local"], capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        r = on_login("run", p, "--machine", MACHINE, "--runs", runs, "--run-id", "het")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        return runs, r

    def test_a_hetjob_across_hosts_reaches_the_local_champion(self):
        runs, _ = self.local_then_on_hosts(pipeline("hosts"))
        # The same models, byte for byte: sync training on two hosts over TCP is the local run's.
        self.assert_local_champion(runs, "het")
        # Each step on its module's hosts, the multi-rank ones on two distinct hosts.
        logs = os.path.join(runs, "het", "logs")
        expect = {"r1-load": {"cm01"}, "r1-train": {"dam01", "dam02"}, "r1-evaluate": {"esb01", "esb02"}}
        for task, hosts in expect.items():
            with open(os.path.join(logs, task + ".log")) as f:
                log = f.read()
            seen = rank_hosts(log)
            self.assertEqual({h for _, _, h in seen}, hosts, log[-2000:])
            self.assertTrue(all(n == h for _, n, h in seen), seen)  # each node is its own host
            # No rank shares the NAM server's host: every one moved its bytes over the fabric.
            self.assertEqual(log.count("NAM bytes by RMA over the fabric"), len(seen), log[-2000:])
            self.assertNotIn("mapped on this host", log)
            # The hosts are namespaces of this machine: ranks on two of them share its cores, and
            # each takes its share as threads (not every core, as Open MPI's hostname-based node
            # would say), in the log and in what the journal records for the simulator.
            share = max(1, len(os.sched_getaffinity(0)) // len(seen))
            self.assertEqual(re.findall(r"^rank \d+/\d+ on node .*, (\d+) threads?$", log, re.M), [str(share)] * len(seen),
                             log[:2000])
        ev = [json.loads(line) for line in self.read("runs", "het", "journal.jsonl").splitlines()[1:] if line.strip()]
        train_end = [e for e in ev if e.get("event") == "task-end" and e.get("task") == "r1-train"][-1]
        self.assertEqual([rk["threads"] for rk in train_end["ranks"]], [max(1, len(os.sched_getaffinity(0)) // 2)] * 2)
        nam = [e for e in ev if e.get("event") == "nam-server"]
        self.assertEqual(len(nam), 1, ev)
        self.assertIn("fabric://nam01:", json.dumps(nam[0]))
        self.assertIn("token-file=", json.dumps(nam[0]))  # off loopback: the token is required

    def test_fine_tuning_on_two_dam_hosts_trains_the_local_weights(self):
        """Issue 46 on a cluster: round 2 fine-tunes MobileNetV2 from block_11_expand with its head
        as 2 sync ranks under srun --mpi=pmix on two hosts, its gradients summed over TCP, and
        stores the same model bytes (tail and head) as the local mpirun run."""
        doc = finetune_pipeline(ROOT, "fthosts")
        doc["steps"]["evaluate"] = {"module": "esb", "ranks": 2}
        runs, r = self.local_then_on_hosts(doc)
        self.assert_local_champion(runs, "het")
        res = json.loads(self.read("runs", "het", "results.json"))
        tuned = [c["candidate"] for c in res["rounds"][1]["candidates"] if "finetune" in c["candidate"]]
        self.assertTrue(tuned, res["rounds"][1])
        self.assertIn("finetune", res["champion"]["candidate"])  # a fine-tuned model won, as locally
        for c in tuned:
            self.assertRegex(r.stdout, rf"trained {c['id']} .*fine-tuned from {FINETUNE_FROM}")
        log = self.read("runs", "het", "logs", "r2-train.log")
        self.assertEqual({h for _, _, h in rank_hosts(log)}, {"dam01", "dam02"}, log[-2000:])

    def cut_during_train(self, node, run_dir, args):
        """msaflow ARGS on the login host, `node`'s link taken down a second into the train step
        (its next task-start in the journal) and up again once msaflow ended; waits until Slurm
        has the node back. Returns (exit status, output, seconds from the cut to the end)."""
        journal = os.path.join(run_dir, "journal.jsonl")
        starts = 0
        if os.path.exists(journal):
            with open(journal) as f:
                starts = len(re.findall(r'"task-start".*"r1-train"', f.read()))
        proc = subprocess.Popen([CLUSTER, "login", "--hosts", "--", EXE, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                if os.path.exists(journal):
                    with open(journal) as f:
                        if len(re.findall(r'"task-start".*"r1-train"', f.read())) > starts:
                            break
                time.sleep(0.1)
            time.sleep(1)
            self.assertIsNone(proc.poll(), "msaflow ended before its train step could be cut")
            subprocess.run([CLUSTER, "link", node, "down", "--hosts"], check=True, capture_output=True)
            cut = time.monotonic()
            out, _ = proc.communicate(timeout=300)
            lost_after = time.monotonic() - cut
        finally:
            subprocess.run([CLUSTER, "link", node, "up", "--hosts"], capture_output=True)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # The node answers again (ReturnToService=2).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True)
            if st.stdout.split()[:1] == ["idle"]:
                break
            time.sleep(1)
        return proc.returncode, out, lost_after

    def test_hosts_cut_off_mid_step_fail_the_round_naming_them_and_resume_finishes(self):
        doc = pipeline("cut")
        doc["head"]["epochs"] = [1000]  # a train step of seconds: the link goes down inside it
        p = self.write("p.json", doc)
        runs = os.path.join(self.dir, "runs")
        r = subprocess.run([EXE, "run", p, "--runs", runs, "--run-id", "local"], capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        run_dir = os.path.join(runs, "cut")
        # A DAM host lost in the middle of sync training: Slurm fails the job (NODE_FAIL, not
        # requeued), and the failure names the node. Within the cluster's liveness bound
        # (SlurmdTimeout 10 s, pings every third of it, Slurm's own handling): ~30 s seen.
        rc, out, lost_after = self.cut_during_train(
            "dam02", run_dir, ["run", p, "--machine", MACHINE, "--runs", runs, "--run-id", "cut"])
        self.assertEqual(rc, 1, out[-3000:])
        self.assertLess(lost_after, 90, out[-3000:])
        self.assertIn("ended NODE_FAIL", out)
        self.assertIn("lost node(s): dam02 (DOWN", out)
        self.assertIn("task r1-train did not finish", out)
        # Resumed, and this time the NAM's host is cut off: the run's NAM server is gone, said
        # with the node Slurm lost (~30 s) - or, should a rank reach for the NAM first and wait
        # out its 30 s, the rank's own error names the unreachable server.
        rc, out, lost_after = self.cut_during_train("nam01", run_dir, ["resume", run_dir])
        self.assertNotEqual(rc, 0, out[-3000:])
        self.assertLess(lost_after, 90, out[-3000:])
        self.assertRegex(out, r"the run's NAM server \(fabric://nam01:\d+.*NODE_FAIL.*lost node\(s\): nam01 \(DOWN"
                              r"|last output: .*(no answer|cannot reach).*nam01:\d+")
        # Resumed once more with every host back: the local run's champion, the same model
        # bytes, nothing stored lost.
        r = on_login("resume", run_dir)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        self.assert_local_champion(runs, "cut")
        v = subprocess.run([EXE, "nam", "verify", "--nam", "file://" + os.path.join(runs, "nam")], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(v.returncode, 0, v.stdout + v.stderr)
        self.assertIn(" 0 damaged", v.stdout)

if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
