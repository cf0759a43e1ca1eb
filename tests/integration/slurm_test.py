#!/usr/bin/python3
"""Rounds as Slurm jobs on a real one-machine Slurm cluster (scripts/slurm-cluster.sh):
hetjobs, the chained fallback (after a real refusal) and the single allocation reach the
local launcher's champion, each step on its module's nodes; submit --wait; a job
cancelled with scancel and a step killed by its time limit are reported with their state and
retried or failed as the pipeline says, with nothing left running."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_pipeline import small_pipeline  # noqa: E402
from tmpdir_case import TempDirCase  # noqa: E402
from service_test import DATA, MODELS, Service  # noqa: E402
from slurm_clusters import TestCluster  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]
MACHINE = os.path.join(ROOT, "configs", "machines", "slurm-local.json")
CLUSTER_UNDER_TEST = TestCluster(ROOT, MACHINE)


def setUpModule():
    CLUSTER_UNDER_TEST.up()


def tearDownModule():
    CLUSTER_UNDER_TEST.down()


def pipeline(name, rounds=2, retries=None):
    doc = small_pipeline(ROOT, name, rounds)
    if retries is not None:
        doc["retries"] = retries
    return doc


def events(run_dir):
    path = os.path.join(run_dir, "journal.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [e for e in (json.loads(line) for line in f if line.strip()) if "event" in e]


def step_nodes(run_dir):
    """task -> the nodes its ranks reported running on ("rank R/S on node N ...")."""
    out = {}
    logs = os.path.join(run_dir, "logs")
    for name in os.listdir(logs):
        if name.startswith("r") and name.endswith(".log") and "-" in name:
            with open(os.path.join(logs, name)) as f:
                nodes = set(re.findall(r"^rank \d+/\d+ on node (\S+) ", f.read(), re.M))
            out[name[:-4]] = nodes
    return out


def squeue():
    return subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.strip()


def leftovers(run_dir):
    """Processes of this run still alive: module steps or sruns."""
    out = subprocess.run(["pgrep", "-af", "msaflow module|srun"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if run_dir in line]


class Slurm(TempDirCase):
    def machine(self, **changes):
        with open(MACHINE) as f:
            m = json.load(f)
        m["slurm"]["conf"] = os.environ["SLURM_CONF"]
        for module, fields in changes.get("modules", {}).items():
            m["modules"][module].update(fields)
        m["slurm"].update(changes.get("slurm", {}))
        if "nam" in changes:
            m["nam"] = changes["nam"]
        return self.write("machine-%d.json" % time.monotonic_ns(), m)

    def run_msaflow(self, *args, env=None, timeout=600):
        return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout, env=env)

    def results(self, run_id):
        with open(os.path.join(self.dir, "runs", run_id, "results.json")) as f:
            return json.load(f)

    def test_hetjobs_chained_jobs_and_single_allocations_reach_the_local_champion(self):
        p = self.write("p.json", pipeline("slurm-e2e"))
        runs = os.path.join(self.dir, "runs")
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "local")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "het", "--machine", MACHINE)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        local, het = self.results("local"), self.results("het")
        self.assertEqual(het["champion"]["candidate"]["id"], local["champion"]["candidate"]["id"])
        self.assertAlmostEqual(het["champion"]["accuracy"], local["champion"]["accuracy"])
        ev = events(os.path.join(runs, "het"))
        jobs = [e for e in ev if e["event"] == "slurm-job"]
        self.assertEqual(len(jobs), 2)  # one hetjob per round
        for j in jobs:
            self.assertEqual(j["mode"], "hetjob")
            self.assertEqual([c["module"] for c in j["components"]], ["cm", "dam", "esb"])
        ends = [e for e in ev if e["event"] == "slurm-end"]
        for e in ends:
            self.assertEqual(e["state"], "COMPLETED")
            comps = e["jobs"][0]["components"]
            self.assertEqual([c["partition"] for c in comps], ["cm", "dam", "esb"])
            self.assertEqual(comps[1]["nodes"], "dam01")  # the only node with the fpga GRES
        with open(os.path.join(runs, "het", "slurm", "round-1.0.sh")) as f:
            script = f.read()
        self.assertIn("#SBATCH hetjob", script)
        self.assertIn("--gres=fpga:1", script)
        # The FPGA steps ran in the dam component, which holds the fpga GRES, on the simulated
        # FPGA (the machine's dam says "auto"; PoCL is on the node), and say where.
        for rnd in het["rounds"]:
            for fpga in (rnd["selection"]["fpga"], rnd["features"]["fpga"]):
                self.assertEqual(fpga["slurm"]["node"], "dam01", fpga)
                self.assertEqual(fpga["slurm"]["gres"], "fpga:1", fpga)
                self.assertRegex(fpga["slurm"]["job"], r"^\d+$")
            self.assertTrue(rnd["selection"]["device"].startswith("opencl: Portable Computing Language"), rnd["selection"])
        # Every step is an MPI program launched with PMIx inside one component: train as 2 sync
        # ranks on the dam, evaluate as 2 ranks on the esb; no step spans components.
        self.assertIn("srun --het-group=1 --ntasks=2 --mpi=pmix", script)  # train on dam, 2 ranks
        self.assertIn("srun --het-group=2 --ntasks=2 --mpi=pmix", script)  # evaluate on esb, 2 ranks
        steps = [line for line in script.splitlines() if line.startswith("step ")]
        self.assertEqual(len(steps), 6)
        for line in steps:
            self.assertRegex(line, r" srun --het-group=\d --ntasks=\d+ --mpi=pmix ")
        with open(os.path.join(runs, "het", "logs", "r1-train.log")) as f:
            train_log = f.read()
        self.assertIn("[sync on 2 ranks]", train_log)
        self.assertEqual(set(re.findall(r"^rank (\d)/2 on node dam01 ", train_log, re.M)), {"0", "1"})
        # Held vs used: the hetjob holds cm, dam and esb for the whole round and uses each for
        # its steps only; chained jobs would hold only the steps' node-seconds.
        for rnd in het["rounds"]:
            ns = rnd["node_seconds"]
            self.assertEqual(ns["mode"], "hetjob")
            mods = {m["module"]: m for m in ns["modules"]}
            self.assertEqual(set(mods), {"cm", "dam", "esb"})
            for m in mods.values():
                self.assertGreater(m["used_s"], 0)
                self.assertLessEqual(m["used_s"], m["held_s"] + 0.5)
                self.assertAlmostEqual(m["held_s"], ns["round_s"] * m["nodes"], places=6)
            self.assertLess(mods["cm"]["used_s"], mods["cm"]["held_s"])  # cm runs load only
        self.assertRegex(r.stdout, r"node-seconds \(hetjob\): cm held [\d.]+ used [\d.]+, dam held")
        self.assertIn("chained jobs would hold", r.stdout)
        st = self.run_msaflow("status", os.path.join(runs, "het"))
        self.assertIn("COMPLETED", st.stdout)
        self.assertIn("state: finished", st.stdout)
        self.assert_on_module_nodes(os.path.join(runs, "het"))
        self.assert_nam_job_came_and_went(os.path.join(runs, "het"))
        # The chained fallback, after a real refusal: the test cluster's job_submit policy
        # refuses round jobs named "nohet". One job per step, afterok dependencies, same champion.
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "nohet-chain", "--machine", MACHINE)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        ch = self.results("nohet-chain")
        for rnd in ch["rounds"]:  # chained jobs hold a module only while its step runs
            self.assertEqual(rnd["node_seconds"]["mode"], "chained")
            for m in rnd["node_seconds"]["modules"]:
                self.assertEqual(m["held_s"], m["used_s"])
        self.assertEqual(ch["champion"]["candidate"]["id"], local["champion"]["candidate"]["id"])
        self.assertAlmostEqual(ch["champion"]["accuracy"], local["champion"]["accuracy"])
        ev = events(os.path.join(runs, "nohet-chain"))
        fallback = [e for e in ev if e["event"] == "slurm-fallback"]
        self.assertEqual([(e["from"], e["to"]) for e in fallback], [("hetjob", "chained")])
        self.assertIn("refuses heterogeneous jobs", fallback[0]["why"])
        cj = [e for e in ev if e["event"] == "slurm-job"]
        self.assertEqual(len(cj), 12)
        self.assertTrue(all(e["mode"] == "chained" for e in cj))
        self.assert_on_module_nodes(os.path.join(runs, "nohet-chain"))
        # The single mode: one allocation over partition "all", modules as node subsets by feature.
        single = self.machine(slurm={"mode": "single"})
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "single", "--machine", single)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        sg = self.results("single")
        self.assertEqual(sg["champion"]["candidate"]["id"], local["champion"]["candidate"]["id"])
        self.assertAlmostEqual(sg["champion"]["accuracy"], local["champion"]["accuracy"])
        sj = [e for e in events(os.path.join(runs, "single")) if e["event"] == "slurm-job"]
        self.assertEqual([e["mode"] for e in sj], ["single", "single"])
        self.assertEqual({c["partition"] for c in sj[0]["components"]}, {"all"})
        with open(os.path.join(runs, "single", "slurm", "round-1.0.single.sh")) as f:
            script = f.read()
        self.assertIn("--partition=all --nodes=3 --ntasks-per-node=2 --time=0:30:00 --constraint=[cm*1&dam*1&esb*1]",
                      script)
        self.assertNotIn("hetjob", script)
        with open(os.path.join(runs, "single", "slurm", "round-1.0.progress")) as f:
            taken = dict(line.split()[1:3] for line in f if line.startswith("nodes "))
        self.assertEqual(taken, {"cm": "cm01", "dam": "dam01", "esb": "esb01"})
        self.assert_on_module_nodes(os.path.join(runs, "single"))
        self.assertEqual(squeue(), "")

    def assert_nam_job_came_and_went(self, run_dir, node="nam01"):
        """The run's NAM server ran as a Slurm job on the nam module, and stopped cleanly."""
        nam = [e for e in events(run_dir) if e["event"] == "nam-server"]
        self.assertEqual(len(nam), 1)
        self.assertEqual(nam[0]["node"], node)
        self.assertTrue(nam[0]["slurm_job"])
        with open(os.path.join(run_dir, "logs", "nam-server.log")) as f:
            log = f.read()
        self.assertIn("serving " + nam[0]["uri"], log)
        self.assertIn("stopping:", log)  # TERM reached the server itself, not a SIGKILL of its step

    def assert_on_module_nodes(self, run_dir):
        """Every step ran on nodes of its module: load on cm, evaluate on esb, the rest on dam."""
        nodes = step_nodes(run_dir)
        self.assertEqual(len(nodes), 12, nodes)  # 6 steps x 2 rounds, each with a node line
        for task, ns in nodes.items():
            step = task.split("-", 1)[1]
            want = {"load": "cm", "evaluate": "esb"}.get(step, "dam")
            self.assertTrue(ns and all(n.startswith(want) for n in ns), (task, ns))

    def test_submit_wait(self):
        p = self.write("p.json", pipeline("slurm-submit", rounds=1))
        runs = os.path.join(self.dir, "runs")
        r = self.run_msaflow("submit", p, "--runs", runs, "--run-id", "sub", "--machine", MACHINE, "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("submitted as Slurm job", r.stdout)
        self.assertIn("ended COMPLETED", r.stdout)
        self.assertRegex(r.stdout, r"\d+\+2 +esb +COMPLETED")  # status lists every component
        self.assertIn("state: finished", r.stdout)
        # The NAM server was component 1 of the coordinator's own job.
        with open(os.path.join(runs, "sub", "coordinator.sh")) as f:
            script = f.read()
        self.assertIn("#SBATCH hetjob\n#SBATCH --partition=nam --nodes=1", script)
        self.assert_nam_job_came_and_went(os.path.join(runs, "sub"))
        self.assertEqual(squeue(), "")
        r = self.run_msaflow("submit", p, "--runs", runs, "--run-id", "sub2")
        self.assertEqual(r.returncode, 3)
        self.assertIn("needs a Slurm machine", r.stderr)

    def test_ctrl_c_stops_following_a_submitted_run_not_the_run(self):
        """`submit --wait` interrupted: it says the run goes on as its Slurm job and how to stop it,
        and the job does go on until `msaflow cancel`."""
        p = self.write("p.json", pipeline("slurm-follow", rounds=1))
        rd = os.path.join(self.dir, "runs", "fol")
        proc = subprocess.Popen([EXE, "submit", p, "--runs", os.path.join(self.dir, "runs"), "--run-id", "fol",
                                 "--machine", MACHINE, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not any(e["event"] == "task-start" for e in events(rd)):
            self.assertIsNone(proc.poll(), "submit --wait ended before the run started")
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT, out + err)
        job = re.search(r"submitted as Slurm job (\d+)", out).group(1)
        self.assertIn(f"it goes on as Slurm job {job}", out)
        self.assertIn(f"msaflow cancel {rd}", out)
        self.assertIn(job, squeue())  # still there: the coordinator was not the follower's
        r = self.run_msaflow("cancel", rd)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        deadline = time.time() + 120
        while time.time() < deadline and squeue():
            time.sleep(0.2)
        self.assertEqual(squeue(), "")

    def test_a_machine_can_name_a_running_nam_server(self):
        """The NAM at an address the machine file names: a server this test started on the node's
        name (not loopback, so with a token), used by every step, left running."""
        token = os.path.join(self.dir, "token")
        with open(token, "w") as f:
            f.write(os.urandom(16).hex())
        os.chmod(token, 0o600)
        ready = os.path.join(self.dir, "ready.json")
        log = open(os.path.join(self.dir, "server.log"), "w")
        srv = subprocess.Popen([EXE, "nam", "serve", "--listen", "*:0", "--token-file", token, "--ready-file", ready],
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 20
            while not os.path.exists(ready):
                self.assertIsNone(srv.poll(), "the NAM server did not start")
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            with open(ready) as f:
                uri = json.load(f)["uri"] + "?token-file=" + token
            self.assertNotIn("127.0.0.1", uri)
            machine = self.machine(nam={"serve": False, "uri": uri})
            p = self.write("p.json", pipeline("slurm-uri", rounds=1))
            runs = os.path.join(self.dir, "runs")
            r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "uri", "--machine", machine)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
            self.assertEqual(self.results("uri")["nam"], uri)
            self.assertEqual([e for e in events(os.path.join(runs, "uri")) if e["event"] == "nam-server"], [])
            models = self.run_msaflow("nam", "ls", "model/uri/", "--nam", uri)
            self.assertEqual(models.returncode, 0, models.stderr)
            self.assertEqual(len(models.stdout.strip().splitlines()), 4, models.stdout)  # round 1's 4 candidates
            self.assertIsNone(srv.poll())  # not the run's to stop
            no_token = self.run_msaflow("nam", "ls", "--nam", uri.split("?")[0] + "?timeout=2")
            self.assertNotEqual(no_token.returncode, 0)
            self.assertIn("needs its token", no_token.stderr)
        finally:
            srv.terminate()
            srv.wait(timeout=30)
            log.close()

    def test_a_killed_coordinator_leaves_no_nam_job(self):
        p = self.write("p.json", pipeline("slurm-kill", rounds=1))
        runs = os.path.join(self.dir, "runs")
        env = dict(os.environ)
        env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                 "delay_ms": 1500, "count": 2}])
        proc = subprocess.Popen([EXE, "run", p, "--runs", runs, "--run-id", "k", "--machine", MACHINE],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        rd = os.path.join(runs, "k")
        deadline = time.time() + 120
        while time.time() < deadline and not any(e["event"] == "task-start" for e in events(rd)):
            time.sleep(0.1)
        self.assertTrue(any(e["event"] == "nam-server" for e in events(rd)))
        proc.kill()  # no chance to clean up
        proc.wait()
        # The NAM's srun learns of it (parent-death signal) and ends its job; the round's job
        # fails without its NAM or finishes; nothing stays.
        deadline = time.time() + 120
        while time.time() < deadline and (squeue() or leftovers(rd)):
            time.sleep(0.5)
        self.assertEqual(squeue(), "")
        self.assertEqual(leftovers(rd), [])

    def test_a_coordinator_killed_during_hetjob_rounds_is_resumed_and_reattaches(self):
        # Issue 13: three SIGKILLs of the coordinator while a round's hetjob runs; each resume
        # waits for the job the dead coordinator left (not submitting its tasks again), reuses
        # what it finished, and the run ends with the local launcher's champion.
        import random
        doc = pipeline("slurm-resume", rounds=1)
        p = self.write("p.json", doc)
        local = self.run_msaflow("run", p, "--runs", os.path.join(self.dir, "local"), "--run-id", "l",
                                 "--machine", "local")
        self.assertEqual(local.returncode, 0, local.stderr)
        with open(os.path.join(self.dir, "local", "l", "results.json")) as f:
            expected = json.load(f)["champion"]["candidate"]["id"]
        runs = os.path.join(self.dir, "runs")
        rd = os.path.join(runs, "k")
        rng = random.Random(int(os.environ.get("MSAFLOW_RESUME_SEED", random.randrange(1 << 30))))
        cmd = [EXE, "run", p, "--runs", runs, "--run-id", "k", "--machine", MACHINE]
        for kill in range(3):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            jobs_before = sum(e["event"] == "slurm-job" for e in events(rd))
            deadline = time.time() + 180
            while time.time() < deadline and sum(e["event"] == "slurm-job" for e in events(rd)) <= jobs_before:
                self.assertIsNone(proc.poll(), "the run ended before a round's job was submitted")
                time.sleep(0.1)
            time.sleep(rng.uniform(0.5, 4.0))  # the job queued or its steps running
            proc.kill()
            proc.wait()
            st = self.run_msaflow("status", rd)
            self.assertEqual(st.returncode, 1, st.stdout + st.stderr)
            self.assertIn("state: interrupted", st.stdout)
            cmd = [EXE, "resume", rd]
        r = self.run_msaflow(*cmd[1:])
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        self.assertEqual(self.results("k")["champion"]["candidate"]["id"], expected)
        ev = events(rd)
        self.assertEqual(sum(e["event"] == "slurm-reattached" for e in ev), 3)
        done = set()
        for e in ev:
            if e["event"] == "task-start":
                self.assertNotIn(e["task"], done, "a completed task ran again")
            if e["event"] in ("task-end", "task-reused"):
                done.add(e["task"])
        deadline = time.time() + 60
        while time.time() < deadline and squeue():
            time.sleep(0.5)
        self.assertEqual(squeue(), "")

    def test_an_interrupted_coordinator_cancels_its_jobs(self):
        p = self.write("p.json", pipeline("slurm-int", rounds=1))
        runs = os.path.join(self.dir, "runs")
        env = dict(os.environ)
        env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                 "delay_ms": 300000, "count": 0}])  # training would hang
        proc = subprocess.Popen([EXE, "run", p, "--runs", runs, "--run-id", "i", "--machine", MACHINE],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        rd = os.path.join(runs, "i")
        deadline = time.time() + 120
        while time.time() < deadline and not any(e["event"] == "task-start" and e["task"] == "r1-train"
                                                 for e in events(rd)):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 1, out[-2000:] + err)
        self.assertIn("interrupted by signal 15", err)
        ev = events(rd)
        self.assertEqual([e["event"] for e in ev if e["event"] in ("slurm-interrupted", "run-failed")],
                         ["slurm-interrupted", "run-failed"])
        self.assertEqual(squeue(), "")  # the round's job and the NAM job are gone already
        self.assertEqual(leftovers(rd), [])

    def test_the_service_runs_a_slurm_run_under_the_users_account_and_cancels_it(self):
        # msaflow serve on this cluster (issue 27): the run's coordinator is submitted as a job,
        # every job carries the user's Slurm account, and DELETE leaves nothing in squeue.
        env = dict(os.environ)
        env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                 "delay_ms": 1500, "count": 0}])
        svc = Service(self.dir, [("ana", [DATA, MODELS], 0, "proj1")], extra=["--machine", MACHINE], env=env)
        try:
            status, v, _ = svc.request("POST", "/v1/runs", pipeline("svc-slurm", rounds=1), user="ana")
            self.assertEqual((status, v["launcher"]), (202, "slurm"), v)
            rid = v["id"]
            rd = os.path.join(svc.runs, "ana", rid)
            deadline = time.time() + 180
            while not any(e["event"] == "task-start" and e["task"] == "r1-train" for e in events(rd)):
                if time.time() > deadline:
                    with open(os.path.join(svc.runs, "ana", ".service", rid + ".log")) as f:
                        self.fail("the train step never started: " + f.read()[-3000:])
                time.sleep(0.2)
            jobs = [line.split()[0] for line in squeue().splitlines()]
            self.assertGreaterEqual(len(jobs), 2, squeue())  # the coordinator's and the round's
            for job in jobs:
                show = subprocess.run(["scontrol", "show", "job", job.split("+")[0]], capture_output=True, text=True).stdout
                self.assertIn("Account=proj1", show, show)
            status, v, _ = svc.request("DELETE", "/v1/runs/" + rid, user="ana")
            self.assertEqual(status, 202, v)
            v = svc.wait_state("ana", rid, ("cancelled", "failed", "interrupted", "finished"), timeout=120)
            self.assertEqual(v["state"], "cancelled", v)
            deadline = time.time() + 60
            while squeue() and time.time() < deadline:
                time.sleep(0.5)
            self.assertEqual(squeue(), "")
            self.assertEqual(leftovers(rd), [])
        finally:
            svc.stop()

    def start_slow_features(self, pipeline_path, runs, run_id, count):
        """`msaflow run` under Slurm in the background, its first `count` reads of features
        delayed 1.5 s each (steps are then surely under way for a while); (process, run dir)."""
        env = dict(os.environ)
        env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                 "delay_ms": 1500, "count": count}])
        proc = subprocess.Popen([EXE, "run", pipeline_path, "--runs", runs, "--run-id", run_id, "--machine", MACHINE],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        return proc, os.path.join(runs, run_id)

    def cancel_mid_round(self, retries):
        p = self.write("p.json", pipeline("slurm-cancel", rounds=1, retries=retries))
        runs = os.path.join(self.dir, "runs")
        # Training waits on its features, so the round is surely running when we cancel it.
        proc, rd = self.start_slow_features(p, runs, "c", count=2)
        deadline = time.time() + 120
        job = None
        while time.time() < deadline and job is None:
            ev = events(rd)
            if any(e["event"] == "task-start" and e["task"] == "r1-train" for e in ev):
                job = [e for e in ev if e["event"] == "slurm-job"][-1]["job"]
            time.sleep(0.1)
        self.assertIsNotNone(job, "the round never reached training")
        subprocess.run(["scancel", job], check=True)
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err, rd

    def test_scancel_without_retries_fails_with_the_state(self):
        rc, out, err, rd = self.cancel_mid_round(None)
        self.assertEqual(rc, 1, out[-2000:] + err)
        self.assertIn("CANCELLED", err)
        self.assertIn("r1-train", err)
        failed = [e for e in events(rd) if e["event"] == "slurm-failed"]
        self.assertEqual(failed[0]["state"], "CANCELLED")
        time.sleep(1)
        self.assertEqual(squeue(), "")
        self.assertEqual(leftovers(rd), [])

    def test_scancel_is_retried_when_the_pipeline_says_so(self):
        rc, out, err, rd = self.cancel_mid_round({"max": 1, "on": ["CANCELLED"]})
        self.assertEqual(rc, 0, out[-2000:] + err)
        ev = events(rd)
        self.assertEqual([e["state"] for e in ev if e["event"] == "slurm-retry"], ["CANCELLED"])
        attempts = [e for e in ev if e["event"] == "slurm-job"]
        self.assertEqual(len(attempts), 2)
        # The retry resubmitted only what had not finished: load and prepare were done.
        with open(attempts[1]["script"]) as f:
            retry = f.read()
        self.assertNotIn("step r1-load ", retry)
        self.assertIn("step r1-train ", retry)
        self.assertEqual(ev[-1]["event"], "run-end")
        self.assertEqual(squeue(), "")

    def test_a_rank_killed_inside_srun_is_signaled_and_retried(self):
        """Issue 32: one rank of the 2-rank train step SIGKILLed inside its srun, as the OOM
        killer would. srun exits 137 or 143 and the job ends FAILED, but the step's failure is SIGNALED,
        so `retries.on: SIGNALED` resubmits it, and the run reaches the local champion."""
        retries = {"max": 1, "on": ["SIGNALED"]}
        p = self.write("p.json", pipeline("slurm-rank", rounds=1, retries=retries))
        runs = os.path.join(self.dir, "runs")
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "local")
        self.assertEqual(r.returncode, 0, r.stderr)
        # Training waits on its features, so its ranks are surely alive when one is killed.
        proc, rd = self.start_slow_features(p, runs, "k", count=1)
        needle = f"module train --task {rd}/tasks/r1-train.json"
        killed, deadline = None, time.time() + 180
        while killed is None and time.time() < deadline and proc.poll() is None:
            out = subprocess.run(["pgrep", "-af", "msaflow module train"], capture_output=True, text=True).stdout
            ranks = [int(line.split()[0]) for line in out.splitlines()
                     if needle in line and line.split()[1].endswith("/msaflow")]  # the ranks, not srun
            if len(ranks) == 2:
                time.sleep(0.3)
                os.kill(ranks[1], signal.SIGKILL)
                killed = ranks[1]
            time.sleep(0.05)
        self.assertIsNotNone(killed, "no two ranks of r1-train were seen")
        out, err = proc.communicate(timeout=400)
        self.assertEqual(proc.returncode, 0, out[-3000:] + err)
        ev = events(rd)
        retry = [e for e in ev if e["event"] == "slurm-retry"]
        self.assertEqual([(e["state"], e["reason"]) for e in retry], [("FAILED", "SIGNALED")])
        # srun's status is the highest of its tasks': 143 when it ended the other rank with SIGTERM;
        # the rank named is the one SIGKILL ended.
        self.assertRegex(retry[0]["message"], r"task r1-train exited with status 1(37|43) \(rank [01] \(on dam0\d\) "
                                              r"ended by signal 9 \(Killed\)\)")
        self.assertEqual(len([e for e in ev if e["event"] == "slurm-job"]), 2)
        local, k = self.results("local"), self.results("k")
        self.assertEqual(k["champion"]["candidate"]["id"], local["champion"]["candidate"]["id"])
        self.assertAlmostEqual(k["champion"]["accuracy"], local["champion"]["accuracy"])
        time.sleep(1)
        self.assertEqual(squeue(), "")
        self.assertEqual(leftovers(rd), [])

    def test_a_step_past_its_time_limit_is_killed_and_reported(self):
        p = self.write("p.json", pipeline("slurm-timeout", rounds=1))
        runs = os.path.join(self.dir, "runs")
        machine = self.machine(modules={"dam": {"time": "1"}})
        env = dict(os.environ)
        env["MSAFLOW_NAM_FAULTS"] = json.dumps([{"op": "get", "prefix": "features/", "action": "delay",
                                                 "delay_ms": 300000, "count": 0}])  # a hung step
        t0 = time.time()
        r = self.run_msaflow("run", p, "--runs", runs, "--run-id", "t", "--machine", machine, env=env, timeout=400)
        self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr)
        self.assertIn("TIMEOUT", r.stderr)
        self.assertIn("time limit", r.stderr)
        self.assertLess(time.time() - t0, 300)
        rd = os.path.join(runs, "t")
        ends = [e for e in events(rd) if e["event"] == "slurm-end"]
        self.assertEqual(ends[-1]["state"], "TIMEOUT")
        time.sleep(1)
        self.assertEqual(squeue(), "")
        self.assertEqual(leftovers(rd), [])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
