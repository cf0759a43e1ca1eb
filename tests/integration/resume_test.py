#!/usr/bin/python3
"""Runs that survive failure (issue 13): a coordinator killed (SIGKILL) at random moments is
resumed to the champion an uninterrupted run finds, no completed task runs twice, no process
outlives its coordinator by more than 2 s; a dead NAM server fails the run within 2 s, naming it;
`status` tells running, interrupted, failed and finished apart by its exit code."""
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import processes_naming  # noqa: E402
from small_pipeline import tiny_pipeline as small_pipeline_tiny  # noqa: E402
from tmpdir_case import TempDirCase  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]
KILLS = int(os.environ.get("MSAFLOW_RESUME_KILLS", "20"))


def msaflow(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300)


def tiny_pipeline(name):
    return small_pipeline_tiny(ROOT, name)


def processes_of(run_dir):
    """Processes whose command line names the run directory: steps, mpirun, the NAM server."""
    return [f"{pid}: {cmd}" for pid, cmd in processes_naming(run_dir)]


def journal(run_dir):
    with open(os.path.join(run_dir, "journal.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()][1:]


def champion(run_dir):
    with open(os.path.join(run_dir, "results.json")) as f:
        r = json.load(f)
    return r["champion"]["candidate"]["id"], r["champion"]["accuracy"], r["result"]["accuracy"]


class RunChecks(TempDirCase):
    """What the tests below check of a run (no tests of its own)."""

    def assert_no_task_ran_twice(self, run_dir):
        done = set()
        ends = {}
        for e in journal(run_dir):
            t = e.get("task")
            if e["event"] == "task-start":
                self.assertNotIn(t, done, f"{run_dir}: task {t} started again after it was done")
            if e["event"] in ("task-end", "task-reused"):
                done.add(t)
            if e["event"] == "task-end":
                ends[t] = ends.get(t, 0) + 1
        self.assertTrue(all(n == 1 for n in ends.values()), ends)
        return done

    def assert_provenance(self, run_dir, champion_id):
        """provenance.json covers every task of every round, those an earlier coordinator
        finished included: where it ran, its key, the bytes it moved; then the candidates."""
        with open(os.path.join(run_dir, "provenance.json")) as f:
            prov = json.load(f)
        self.assertEqual(prov["format"], "msaflow.provenance/1")
        self.assertEqual([r["round"] for r in prov["rounds"]], [1, 2])
        steps = ("load", "prepare", "train", "store", "evaluate", "select")
        for r in prov["rounds"]:
            self.assertEqual([t["task"] for t in r["tasks"]], [f"r{r['round']}-{s}" for s in steps])
            for t in r["tasks"]:
                self.assertEqual(t["hosts"], [os.uname().nodename], t)
                self.assertRegex(t["key"], "^[0-9a-f]{16}$")
            train = r["tasks"][2]
            self.assertEqual(train["ranks"], 2)
            self.assertGreater(train["nam_bytes"]["got"], 0)  # the features it trained on
            self.assertGreater(train["nam_bytes"]["put"], 0)  # the heads it staged
            self.assertTrue(all(c["model"].startswith("model/") and c["result"].startswith("result/")
                                for c in r["candidates"]))
        self.assertEqual(prov["champion"]["candidate"], champion_id)

    def assert_gone_within_2_s(self, runs, what):
        """No process names the runs directory 2 s from now (steps, mpirun, its NAM server)."""
        deadline = time.monotonic() + 2.0
        while processes_of(runs + "/") and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(processes_of(runs + "/"), [], what)

    def kill_and_check(self, proc, runs):
        """SIGKILL the coordinator; every process of its run (steps, mpirun, and the runs
        directory's NAM server, which only this run used) must be gone within 2 s."""
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assert_gone_within_2_s(runs, "processes outlived their coordinator by more than 2 s")



class KillChain(RunChecks):
    def test_killed_at_random_moments_resume_finishes_with_the_same_champion(self):
        doc = tiny_pipeline("resume")
        path = self.write("p.json", doc)
        full = os.path.join(self.dir, "runs-full")
        r = msaflow("run", path, "--runs", full, "--run-id", "full")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        expected = champion(os.path.join(full, "full"))
        self.assertEqual(msaflow("status", os.path.join(full, "full")).returncode, 0)

        seed = int(os.environ.get("MSAFLOW_RESUME_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        print(f"kill moments drawn with seed {seed} (MSAFLOW_RESUME_SEED)", flush=True)
        kills = chains = 0
        while kills < KILLS:
            # A chain: run, kill, resume, kill, ... then resume to the end. Its own runs
            # directory, so that its first prepare computes features (and can be killed doing so).
            chains += 1
            runs = os.path.join(self.dir, f"runs-{chains}")
            run_dir = os.path.join(runs, "chain")
            cmd = [EXE, "run", path, "--runs", runs, "--run-id", "chain"]
            while True:
                log = os.path.join(self.dir, f"chain-{chains}-{kills}.log")
                with open(log, "w") as f:
                    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
                if kills >= KILLS:
                    self.assertEqual(proc.wait(timeout=300), 0, f"the last resume of chain {chains} failed")
                    break
                try:
                    proc.wait(timeout=rng.uniform(0.2, 4.0))
                    with open(log) as f:
                        self.assertEqual(proc.returncode, 0, f"chain {chains} failed:\n{f.read()[-3000:]}")
                    break  # it finished before the kill
                except subprocess.TimeoutExpired:
                    pass
                self.kill_and_check(proc, runs)
                kills += 1
                if os.path.exists(os.path.join(run_dir, "journal.jsonl")):
                    st = msaflow("status", run_dir)
                    if st.returncode == 0 and "state: finished" in st.stdout:
                        break  # killed after its journal recorded the end (tearing down): complete
                    self.assertEqual(st.returncode, 1, st.stdout + st.stderr)
                    self.assertIn("state: interrupted", st.stdout)
                    cmd = [EXE, "resume", run_dir]
                else:  # killed before its run directory appeared: nothing to resume
                    self.assertFalse(os.path.exists(run_dir), "a run directory without a journal")
                    cmd = [EXE, "run", path, "--runs", runs, "--run-id", "chain"]
            self.assertEqual(champion(run_dir), expected, f"chain {chains} (kill seed {seed})")
            self.assert_no_task_ran_twice(run_dir)
            self.assert_provenance(run_dir, expected[0])
            self.assertEqual(msaflow("status", run_dir).returncode, 0)
        print(f"{kills} kills over {chains} chain(s), every one resumed to champion {expected[0]}", flush=True)


class Resume(RunChecks):
    def test_a_dead_nam_server_fails_the_run_within_2_s_naming_it(self):
        doc = tiny_pipeline("namdies")
        doc["head"]["epochs"] = [400]  # a train step long enough to kill the server in
        runs = os.path.join(self.dir, "runs")
        run_dir = os.path.join(runs, "dies")
        proc = subprocess.Popen([EXE, "run", self.write("p.json", doc), "--runs", runs, "--run-id", "dies"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        server = None
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(os.path.join(run_dir, "journal.jsonl")):
                events = journal(run_dir)
                pids = [e["pid"] for e in events if e["event"] == "nam-server"]
                if pids and any(e["event"] == "task-start" and e["task"] == "r1-train" for e in events):
                    server = pids[0]
                    break
            time.sleep(0.05)
        self.assertIsNotNone(server, "the train step never started")
        time.sleep(0.5)
        os.kill(server, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
        self.assertEqual(proc.returncode, 8, out[-2000:] + err)
        self.assertIn(f"the run's NAM server (fabric://127.0.0.1:", err)
        self.assertIn(f"pid {server}) killed by signal 9", err)
        self.assertLess(elapsed, 2.0, err)
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 1, st.stdout)
        self.assertIn("state: failed: the run's NAM server", st.stdout)

    def test_a_stop_signal_in_a_coordinators_first_moments_is_journalled(self):
        # SIGTERM (a service's cancel, scancel) at random moments of a coordinator's first
        # 0.6 s after its journal appears: the journal always ends with the run's failure and
        # the signal, so the run reads as interrupted or cancelled with its reason, never as a
        # coordinator that vanished. libfabric's loading once replaced the coordinator's handler
        # then (nam/fabric.h): 7 of 16 runs here ended with no word.
        path = self.write("p.json", tiny_pipeline("stopped"))
        rng = random.Random(5)
        for trial in range(8):
            runs = os.path.join(self.dir, f"runs{trial}")
            j = os.path.join(runs, "r", "journal.jsonl")
            proc = subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", "r"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            while not os.path.exists(j):
                self.assertIsNone(proc.poll(), "the run ended before its journal appeared")
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.6))
            proc.send_signal(signal.SIGTERM)
            err = proc.communicate(timeout=60)[1]
            last = journal(os.path.join(runs, "r"))[-1]
            self.assertEqual((last["event"], last.get("signal")), ("run-failed", signal.SIGTERM), (trial, err[-1500:]))
            self.assertGreater(proc.returncode, 0, err[-1500:])  # it ended itself, not by the signal
            self.assert_gone_within_2_s(runs, "processes outlived their stopped coordinator by more than 2 s")

    def test_two_runs_started_at_once_in_one_runs_directory_both_finish(self):
        # They share the runs directory's NAM server: one starts it, the other attaches; it
        # stops once neither uses it.
        doc = tiny_pipeline("side")
        doc["rounds"]["max"] = 1
        path = self.write("p.json", doc)
        runs = os.path.join(self.dir, "runs")
        procs = [subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", rid], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for rid in ("a", "b")]
        for p in procs:
            out, _ = p.communicate(timeout=300)
            self.assertEqual(p.returncode, 0, out[-3000:])
        servers = [[e for e in journal(os.path.join(runs, rid)) if e["event"] == "nam-server"][0] for rid in ("a", "b")]
        self.assertEqual(sorted(s["attached"] for s in servers), [False, True])
        self.assertEqual(servers[0]["pid"], servers[1]["pid"])
        self.assertEqual(champion(os.path.join(runs, "a")), champion(os.path.join(runs, "b")))
        self.assert_gone_within_2_s(runs, "the shared NAM server outlived its last run by 2 s")

    def test_resume_refuses_a_running_run_and_leaves_a_finished_one(self):
        doc = tiny_pipeline("twice")
        doc["rounds"]["max"] = 1
        path = self.write("p.json", doc)
        runs = os.path.join(self.dir, "runs")
        run_dir = os.path.join(runs, "one")
        proc = subprocess.Popen([EXE, "run", path, "--runs", runs, "--run-id", "one"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while not os.path.exists(os.path.join(run_dir, "journal.jsonl")):
            self.assertIsNone(proc.poll())
            time.sleep(0.05)
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 75, st.stdout)
        self.assertIn(f"state: running (coordinator pid {proc.pid}", st.stdout)
        r = msaflow("resume", run_dir)
        self.assertEqual(r.returncode, 3)
        self.assertIn(f"is still running (coordinator pid {proc.pid})", r.stderr)
        self.assertEqual(proc.wait(timeout=300), 0)
        r = msaflow("resume", run_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("finished already: champion", r.stdout)
        r = msaflow("run", path, "--runs", runs, "--run-id", "one")
        self.assertEqual(r.returncode, 3)
        self.assertIn("already holds a run; continue it with `msaflow resume", r.stderr)


class Retries(TempDirCase):
    def kill_step_when_seen(self, proc, run_dir, step, times):
        """SIGKILLs the `step` module process of round 1 each time one appears (as the OOM
        killer would), `times` times, while the run goes on; returns how many it killed."""
        needle = f"module {step} --task {run_dir}/tasks/r1-{step}.json"
        killed, seen = 0, set()
        while killed < times and proc.poll() is None:
            for line in processes_of(needle):
                pid = int(line.split(":")[0])
                if pid in seen:
                    continue
                seen.add(pid)
                time.sleep(0.3)  # it is under way
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        return killed

    def start(self, name, retries):
        doc = tiny_pipeline(name)
        doc["retries"] = {"max": retries, "on": ["SIGNALED"]}
        runs = os.path.join(self.dir, "runs")
        run_dir = os.path.join(runs, name)
        # store as a module process, which the test kills: by default it is light enough to run
        # in the coordinator (launch/coordinator_tasks.h), where only a killed coordinator ends it.
        proc = subprocess.Popen([EXE, "run", self.write(name + ".json", doc), "--runs", runs, "--run-id", name],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "MSAFLOW_IN_COORDINATOR": "0"})
        return proc, run_dir

    def test_a_step_killed_twice_is_retried_and_one_that_always_fails_ends_the_run_resumably(self):
        # Killed twice, retried twice, then done: the run finishes, the journal says why.
        proc, run_dir = self.start("twice", 2)
        self.assertEqual(self.kill_step_when_seen(proc, run_dir, "store", 2), 2)
        out, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, out[-3000:] + err)
        self.assertEqual(out.count("store    failed (SIGNALED); starting it again"), 2, out)
        ev = [e for e in journal(run_dir) if e.get("task") == "r1-store"]
        self.assertEqual([e["event"] for e in ev], ["task-start", "task-retry", "task-retry", "task-end"])
        for i, e in enumerate(ev[1:3]):
            self.assertEqual((e["attempt"], e["attempts"], e["reason"], e["status"]), (i, 3, "SIGNALED", "signal 9 (Killed)"))
        with open(os.path.join(run_dir, "logs", "r1-store.log")) as f:
            self.assertEqual(f.read().count("this attempt ended with signal 9 (Killed)"), 2)
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 0, st.stdout)
        self.assertRegex(st.stdout, r"(?m)^  r1-store +dam +1  done +2 ")
        expected = champion(run_dir)
        # Killed on every attempt: the run fails naming the task and the attempts, keeps what
        # was done, and `resume` finishes it with the same champion.
        proc, run_dir = self.start("always", 1)
        self.assertEqual(self.kill_step_when_seen(proc, run_dir, "store", 2), 2)
        out, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 1, out[-3000:] + err)
        self.assertIn("task r1-store failed with signal 9 (Killed) on attempt 2 of 2; log ", err)
        self.assertEqual(err.count("msaflow: error:"), 1, err)
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 1, st.stdout)
        self.assertRegex(st.stdout, r"(?m)^  r1-store +dam +1  failed +1 ")
        self.assertIn("state: failed: task r1-store failed", st.stdout)
        r = msaflow("resume", run_dir)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        reused = [e["task"] for e in journal(run_dir) if e["event"] == "task-reused"]
        self.assertEqual(reused, [])  # their task-end was journalled: nothing to re-learn
        starts = [e["task"] for e in journal(run_dir) if e["event"] == "task-start"]
        for t in ("r1-load", "r1-prepare", "r1-train"):
            self.assertEqual(starts.count(t), 1, starts)  # done before the failure: not run again
        self.assertEqual(starts.count("r1-store"), 2)
        self.assertEqual(champion(run_dir), expected)


    def test_a_rank_killed_in_a_two_rank_step_is_signaled_and_retried(self):
        """One rank of the 2-rank evaluate step SIGKILLed, as the OOM killer would: mpirun exits
        137 and names the rank; the step's failure is SIGNALED, so `retries.on: SIGNALED`
        starts it again and the run ends with the champion of a run nobody disturbed."""
        calm = os.path.join(self.dir, "runs", "calm")
        r = msaflow("run", self.write("calm.json", tiny_pipeline("calm")), "--runs", os.path.dirname(calm),
                    "--run-id", "calm")
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)
        proc, run_dir = self.start("rank", 1)
        needle = f"module evaluate --task {run_dir}/tasks/r1-evaluate.json"
        killed = None
        while killed is None and proc.poll() is None:
            for line in processes_of(needle):
                pid, cmd = line.split(": ", 1)
                if os.path.basename(cmd.split()[0]) == "mpirun":
                    continue  # the launcher of the step, not one of its ranks
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed = pid
                except ProcessLookupError:
                    continue
                break
            time.sleep(0.005)
        self.assertIsNotNone(killed, "the run ended before a rank of r1-evaluate was seen")
        out, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, out[-3000:] + err)
        ev = [e for e in journal(run_dir) if e.get("task") == "r1-evaluate"]
        self.assertEqual([e["event"] for e in ev], ["task-start", "task-retry", "task-end"])
        self.assertEqual(ev[1]["reason"], "SIGNALED")
        self.assertRegex(ev[1]["status"], r"^exit status 137 \((rank [01]|a rank) ended by signal 9 \(Killed\)\)$")
        self.assertIn("evaluate failed (SIGNALED); starting it again", out)
        self.assertEqual(champion(run_dir), champion(calm))


class Why(TempDirCase):
    def test_why_names_a_changed_hyper_parameter_dataset_and_backbone_file(self):
        import gzip
        import shutil
        import onnx
        doc = tiny_pipeline("why")
        doc["rounds"]["max"] = 1
        doc["backbones"] = [b for b in doc["backbones"] if b["name"] == "ppocrv4"]
        model = os.path.join(self.dir, "model.onnx")
        shutil.copy(doc["backbones"][0]["onnx"], model)
        doc["backbones"][0]["onnx"] = model
        images = os.path.join(self.dir, "train-images.gz")
        shutil.copy(doc["datasets"]["train"]["images"], images)
        doc["datasets"]["train"]["images"] = images
        runs = os.path.join(self.dir, "runs")

        def run(rid):
            r = msaflow("run", self.write("p.json", doc), "--runs", runs, "--run-id", rid)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)

        def why(rid, task):
            r = msaflow("why", os.path.join(runs, rid), task)
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stdout

        run("a")
        self.assertIn("r1-train in run a: ran", why("a", "r1-train"))
        self.assertIn("no earlier run", why("a", "r1-train"))
        # A hyper-parameter.
        doc["head"]["lr"] = [0.002, 0.003]
        run("b")
        out = why("b", "r1-train")
        self.assertIn("compared with run a", out)
        self.assertIn("changed: task file /pipeline/head/lr/0: 0.001 -> 0.002", out)
        self.assertNotIn("changed: dataset", out)
        # A dataset file's content, under the same name: one pixel of the first image.
        with gzip.open(images) as f:
            data = bytearray(f.read())
        data[16] ^= 0xFF
        with gzip.open(images, "wb", compresslevel=1) as f:
            f.write(bytes(data))
        run("c")
        out = why("c", "r1-prepare")
        self.assertIn("compared with run b", out)
        self.assertRegex(out, r"changed: dataset train \(its files' content\): \"[0-9a-f]+\" -> \"[0-9a-f]+\"")
        self.assertNotIn("changed: backbone", out)
        self.assertIn("nothing in its key changed", why("c", "r1-load"))
        # The backbone's model file.
        m = onnx.load(model)
        m.producer_name = "edited"
        onnx.save(m, model)
        run("d")
        out = why("d", "r1-load")
        self.assertIn("compared with run c", out)
        self.assertIn("changed: backbone ppocrv4 (model file, cut or input)", out)
        self.assertIn("changed: backbone ppocrv4", why("d", "r1-prepare"))
        r = msaflow("why", os.path.join(runs, "d"), "r7-train")
        self.assertEqual(r.returncode, 4)
        self.assertIn("no task r7-train", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)  # after EXE ROOT: which tests
