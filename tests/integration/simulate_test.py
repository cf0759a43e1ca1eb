"""`msaflow simulate` on a real run: the tiny pipeline runs once here, and the simulator, calibrated
by that run, must give back the steps it measured (same machine, ranks and data), scale them the
way the model says when ranks, data and machine change, run the 1,000-node machine, and refuse bad
input with one clear error. Its accuracy against runs it was not calibrated by, and its speed, are
bench/simulate_check's (docs/simulate.md).

Usage: simulate_test.py MSAFLOW_EXE SOURCE_ROOT"""
import datetime
import json
import os
import subprocess
import sys
import tempfile
import unittest

EXE, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(__file__))
from small_pipeline import tiny_pipeline  # noqa: E402

MACHINE_1000 = os.path.join(ROOT, "configs", "machines", "msa-1000.json")
MACHINE_SLURM = os.path.join(ROOT, "configs", "machines", "slurm-local.json")


def msaflow(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600)


class Simulate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.pipeline = os.path.join(cls.tmp.name, "sim.json")
        with open(cls.pipeline, "w") as f:
            json.dump(tiny_pipeline(ROOT, "sim"), f)
        cls.runs = os.path.join(cls.tmp.name, "runs")
        r = msaflow("run", cls.pipeline, "--runs", cls.runs, "--run-id", "a")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        with open(os.path.join(cls.runs, "a", "results.json")) as f:
            cls.results = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def simulate(self, *args):
        r = msaflow("simulate", self.pipeline, "--from-runs", self.runs, "--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_the_calibrating_run_comes_back(self):
        s = self.simulate()
        self.assertEqual(s["calibration"]["runs"], [os.path.join(self.runs, "a")])
        self.assertEqual(len(s["rounds"]), len(self.results["rounds"]))
        end = 0.0

        def spread(step, real):
            """How far apart the rounds' work per item is, as seconds of this round's step."""
            rates = [r["costs"][step]["work_s"] / r["costs"][step]["items"] for r in self.results["rounds"]
                     if r["costs"].get(step, {}).get("items", 0) > 0]
            c = real["costs"][step]
            return (max(rates) - min(rates)) * c["items"] / max(1, c["ranks"]) if rates and c.get("items") else 0.0

        for sim, real in zip(s["rounds"], self.results["rounds"]):
            self.assertEqual([st["step"] for st in sim["steps"]],
                             [st for st in ("load", "prepare", "train", "store", "evaluate", "select") if st in real["costs"]])
            for st in sim["steps"]:
                self.assertGreaterEqual(st["start_s"] + 1e-9, end)  # one after the other
                end = st["start_s"] + st["seconds"]
                measured = real["costs"][st["step"]]["wall_s"]
                self.assertEqual(st["measured_s"], measured)
                # The same machine, ranks and data: the model is its calibration, within what
                # pooling the rounds (per item, serial by median) and the NAM's copies add. The
                # pooled work per item lies between the rounds' own, so a round's prediction may
                # be off by as much as the rounds differ: steps beside other tests (CI runs this
                # under ASan, three tests at a time) can take 40 % longer in one round than the other.
                self.assertLess(abs(st["seconds"] - measured), 0.1 * measured + 0.1 + spread(st["step"], real),
                                (st, real["costs"][st["step"]]))
        self.assertAlmostEqual(s["makespan_s"], end, delta=1e-6)
        used = sum(st["nodes"] * st["seconds"] for r in s["rounds"] for st in r["steps"])
        self.assertAlmostEqual(sum(n["used"] for n in s["node_seconds"].values()), used, delta=1e-6)
        self.assertEqual(s["placement"]["mode"], "local")
        self.assertEqual(s["placement"]["steps"]["train"], {"module": "dam", "ranks": 2, "nodes": 1})

    def test_ranks_and_data_move_the_prediction_as_the_model_says(self):
        base = self.simulate()
        more = self.simulate("--data-scale", "3")
        step = lambda s, name: s["rounds"][0]["steps"][[x["step"] for x in s["rounds"][0]["steps"]].index(name)]
        real = self.results["rounds"][0]["costs"]["prepare"]
        # prepare: serial + 3x the work over one rank.
        self.assertAlmostEqual(step(more, "prepare")["seconds"] - step(base, "prepare")["seconds"],
                               2 * real["work_s"] / real["ranks"], delta=0.05 + 0.05 * real["work_s"])
        self.assertNotIn("measured_s", step(more, "prepare"))  # other data: nothing measured to compare
        self.assertGreater(more["makespan_s"], base["makespan_s"])

    def test_the_1000_node_machine(self):
        s = self.simulate("--machine", MACHINE_1000, "--ranks", "prepare=128", "--ranks", "train=64",
                          "--ranks", "evaluate=512", "--data-scale", "100", "--rounds", "3")
        # Hosts for the nodes the steps use (512 ESB, 128 DAM, 1 CM) and the NAM; the machine's
        # other nodes only count as held.
        self.assertEqual(s["simulation"]["hosts"], 512 + 128 + 1 + 1)
        self.assertEqual(len(s["rounds"]), 3)
        ev = [x for x in s["rounds"][0]["steps"] if x["step"] == "evaluate"][0]
        self.assertEqual((ev["module"], ev["ranks"]), ("esb", 512))
        self.assertEqual(s["placement"]["mode"], "hetjob")
        # hetjob: every module of the round is held for the whole round, used only while it computes
        for mod, n in s["node_seconds"].items():
            self.assertGreaterEqual(n["held"] + 1e-6, n["used"], mod)
        chained = self.simulate("--machine", MACHINE_1000, "--ranks", "prepare=128", "--ranks", "train=64",
                                "--ranks", "evaluate=512", "--data-scale", "100", "--rounds", "3",
                                "--slurm-mode", "chained", "--queue-wait", "30")
        # chained: a job per step (as the launcher submits them), each waiting 30 s in the queue;
        # a hetjob round waits once
        later_jobs = sum(len(r["steps"]) - 1 for r in chained["rounds"])
        self.assertGreater(chained["makespan_s"], s["makespan_s"] + later_jobs * 30 - 1)
        self.assertLess(sum(n["held"] for n in chained["node_seconds"].values()),
                        sum(n["held"] for n in s["node_seconds"].values()))

    def machine(self, share):
        """The one-host test cluster's machine file, its nodes sharing this machine's cores or not."""
        with open(MACHINE_SLURM) as f:
            m = json.load(f)
        m["slurm"]["conf"] = os.path.join(self.tmp.name, "slurm.conf")
        m["slurm"]["nodes_share_cores"] = share
        path = os.path.join(self.tmp.name, f"machine-{share}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        return path

    def test_nodes_that_share_this_machines_cores_compute_as_this_machine(self):
        args = ["--ranks", "evaluate=2", "--nodes", "esb=2", "--queue-wait", "0"]
        local, shared, own = (self.simulate(*args), self.simulate("--machine", self.machine(True), *args),
                              self.simulate("--machine", self.machine(False), *args))
        ev = lambda s: [x for x in s["rounds"][0]["steps"] if x["step"] == "evaluate"][0]
        self.assertEqual((ev(shared)["ranks"], ev(shared)["nodes"]), (2, 2))
        # Two ESB nodes that are namespaces of this machine: its cores, as the local run had them.
        self.assertAlmostEqual(ev(shared)["seconds"], ev(local)["seconds"], delta=0.02 + 0.02 * ev(local)["seconds"])
        # Nodes of their own: each rank has its node's cores, the work goes faster.
        work = local["placement"]["favoured_ranks"]["evaluate"]["work_s"]
        self.assertGreater(work, 0)
        self.assertLess(ev(own)["seconds"], ev(shared)["seconds"] - 0.2 * work / 4)

    def test_a_chained_rounds_waits_are_measured_from_its_journal(self):
        # The calibrating run as a chained Slurm run would have recorded it: its rounds waited
        # 0.4 s in the queue, and each later job started 0.7 s after the step before it ended.
        src, run = os.path.join(self.runs, "a"), os.path.join(self.tmp.name, "chained", "a")
        os.makedirs(run)
        with open(os.path.join(src, "results.json")) as f:
            res = json.load(f)
        for rd in res["rounds"]:
            rd["node_seconds"] = {"mode": "chained", "queue_s": 0.4, "round_s": 0, "modules": []}
        with open(os.path.join(run, "results.json"), "w") as f:
            json.dump(res, f)
        costs = {rd["round"]: rd["costs"] for rd in res["rounds"]}
        t, lines = 1.7e9, []
        stamp = lambda: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
        with open(os.path.join(src, "journal.jsonl")) as f:
            events = [json.loads(line) for line in f]
        first = True
        for e in events:
            if e.get("event") == "run-start":
                e["launcher"] = "slurm"
            elif e.get("event") == "round-start":
                first = True
            elif e.get("event") == "task-start":
                t += 0.4 if first else 0.7
                first = False
            elif e.get("event") == "task-end":
                rnd, step = e["task"][1:].split("-", 1)
                t += costs[int(rnd)][step]["wall_s"]
            e["time"] = stamp()
            lines.append(json.dumps(e))
        with open(os.path.join(run, "journal.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        r = msaflow("simulate", self.pipeline, "--from-runs", run, "--json", "--machine", self.machine(True),
                    "--slurm-mode", "chained")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        cal = s["calibration"]
        self.assertAlmostEqual(cal["chain_wait_s"], 0.7, delta=0.002)
        self.assertAlmostEqual(cal["queue_wait_s"], 0.4, delta=1e-9)
        self.assertAlmostEqual(cal["job_overhead_s"], 0.0, delta=0.01)
        for rd in s["rounds"]:  # the round's first job after the queue wait, every later one 0.7 s after the step before
            steps = rd["steps"]
            self.assertAlmostEqual(steps[0]["start_s"] - rd["start_s"], 0.4, delta=0.011)
            for a, b in zip(steps, steps[1:]):
                self.assertAlmostEqual(b["start_s"] - (a["start_s"] + a["seconds"]), 0.7, delta=0.002)
        r = msaflow("simulate", self.pipeline, "--from-runs", run, "--machine", self.machine(True), "--slurm-mode", "chained")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("chained, 0.70 s from one job's step to the next's", r.stdout)

    def test_bad_input_gets_one_clear_error(self):
        cases = [
            (["--from-runs", os.path.join(self.tmp.name, "nowhere")], "no such directory"),
            (["--from-runs", self.tmp.name], "no finished run of pipeline 'sim'"),
            (["--from-runs", self.runs, "--ranks", "trian=2"], "not a step"),
            (["--from-runs", self.runs, "--ranks", "train=0"], "at least 1"),
            (["--from-runs", self.runs, "--ranks", "train"], "expected NAME=N"),
            (["--from-runs", self.runs, "--nodes", "gpu=4"], "module 'gpu'"),
            (["--from-runs", self.runs, "--data-scale", "0"], "--data-scale"),
        ]
        for args, says in cases:
            r = msaflow("simulate", self.pipeline, *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(says, r.stderr, args)
            self.assertEqual(r.stdout, "", args)
        broken = os.path.join(self.tmp.name, "broken")
        os.makedirs(broken)
        with open(os.path.join(broken, "results.json"), "w") as f:
            f.write("{\"rounds\": 3")
        r = msaflow("simulate", self.pipeline, "--from-runs", broken)
        self.assertEqual(r.returncode, 5, r.stderr)  # corrupt
        self.assertIn(os.path.join(broken, "results.json"), r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
