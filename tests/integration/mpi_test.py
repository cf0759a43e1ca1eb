#!/usr/bin/python3
"""Open MPI inside the modules, through the real path: `msaflow run` starts each step under a
real mpirun (oversubscribed on this machine's cores), on real Fashion-MNIST images.
- train at 1, 2 and 4 ranks in sync, async and hybrid (2 groups of 2) reaches the 1-rank
  champion accuracy within 1 point (sync) or 3 points (async and hybrid: arrival order); sync at 2 ranks gives 1 rank's weights to 1e-4;
- prepare at 1, 2 and 3 ranks commits byte-identical features objects;
- with a 4x straggler, async and hybrid keep the fast ranks going (counted in updates, not
  timed), and the staleness bound holds;
- modes the step cannot run are refused by validate; plan --launcher slurm uses PMIx per
  component."""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

EXE, ROOT = sys.argv[1], sys.argv[2]
FASHION = os.path.join(ROOT, "data", "fashion-mnist")


def pipeline(name, nam, train, epochs=20, lrs=(0.001, 0.003), train_rows=2000, test_rows=1000, backbone=None,
             prepare_ranks=1, select_ranks=1):
    return {
        "format": "msaflow.pipeline/1",
        "name": name,
        "nam": "file://" + nam,
        "datasets": {
            "train": {"images": os.path.join(FASHION, "train-images-idx3-ubyte.gz"),
                      "labels": os.path.join(FASHION, "train-labels-idx1-ubyte.gz"), "limit": train_rows},
            "test": {"images": os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"),
                     "labels": os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"), "limit": test_rows},
        },
        "select_on": "test",  # the training modes are under test here, not the selection
        "backbones": [backbone or {"name": "pixels", "kind": "pixels"}],
        "head": {"type": ["softmax"], "lr": list(lrs), "epochs": [epochs], "batch": 64},
        "steps": {"train": train, "prepare": {"ranks": prepare_ranks}, "evaluate": {"ranks": 2},
                  "select": {"ranks": select_ranks}},
        "rounds": {"max": 1, "candidates": len(lrs), "top_k": 1, "seed": 5},
    }


def floats(raw):
    return struct.unpack("<%df" % (len(raw) // 4), raw)


class Mpi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.nam = os.path.join(cls.dir, "nam")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def msaflow(self, *args, ok=True, timeout=600, env=None):
        r = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout,
                           env=None if env is None else {**os.environ, **env})
        if ok:
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        return r

    def run_pipeline(self, run_id, doc, nam=None, env=None):
        path = os.path.join(self.dir, run_id + ".json")
        with open(path, "w") as f:
            json.dump(doc, f)
        out = self.msaflow("run", path, "--runs", os.path.join(self.dir, "runs"), "--run-id", run_id, env=env).stdout
        with open(os.path.join(self.dir, "runs", run_id, "results.json")) as f:
            return json.load(f), out

    def model(self, results, nam=None):
        """The champion model's metadata and weights, read back through the NAM CLI."""
        uri = "file://" + (nam or self.nam)
        name = results["champion"]["model"]
        meta = json.loads(self.msaflow("nam", "stat", name, "--nam", uri).stdout)["meta"]
        out = os.path.join(self.dir, "weights.bin")
        self.msaflow("nam", "get", name, "--nam", uri, "-o", out)
        with open(out, "rb") as f:
            return meta, floats(f.read())

    def test_train_modes_reach_the_one_rank_champion(self):
        base, _ = self.run_pipeline("sync-1", pipeline("m", self.nam, {"mode": "sync", "ranks": 1}))
        acc = base["champion"]["accuracy"]
        self.assertGreater(acc, 0.75)  # real learning on 10 classes
        meta1, w1 = self.model(base)
        self.assertEqual(meta1["training"]["mode"], "sync")
        self.assertEqual(meta1["training"]["ranks"], 1)
        curve = meta1["curve"]
        self.assertEqual(len(curve["step"]), 20)  # one point per epoch, by step and by wall clock
        self.assertEqual(curve["step"][-1], 20 * 32)
        self.assertEqual(len(curve["seconds"]), 20)
        self.assertEqual(curve["seconds"], sorted(curve["seconds"]))
        for run_id, train in [("sync-2", {"mode": "sync", "ranks": 2}), ("sync-4", {"mode": "sync", "ranks": 4}),
                              ("async-2", {"mode": "async", "ranks": 2}), ("async-4", {"mode": "async", "ranks": 4}),
                              ("hybrid-4", {"mode": "hybrid", "ranks": 4, "groups": 2})]:
            with self.subTest(run_id):
                # sync-2 also selects over 3 ranks: one of them has no candidate of the two.
                res, out = self.run_pipeline(run_id, pipeline("m", self.nam, train,
                                                              select_ranks=3 if run_id == "sync-2" else 1))
                # Sync: no worse than one point below one rank. Async and hybrid depend on arrival
                # order: ten runs of each here spread over 0.802-0.819 around one rank's 0.81, and
                # CI once drew 0.798, so they get three points (a run may also land above: no
                # failure). Lost or doubled updates are caught by the update counts below.
                slack = 0.01 if train["mode"] == "sync" else 0.03
                self.assertGreaterEqual(res["champion"]["accuracy"], acc - slack, (run_id, res["champion"], acc))
                meta, w = self.model(res)
                t = meta["training"]
                self.assertEqual((t["mode"], t["ranks"]), (train["mode"], train["ranks"]))
                self.assertEqual(t["updates"], 20 * 32)  # the same number of updates as one rank
                # The step ran as MPI ranks under mpirun: every rank's lines, and its tag.
                with open(os.path.join(self.dir, "runs", run_id, "logs", "r1-train.log")) as f:
                    log = f.read()
                n = train["ranks"] + (1 if train["mode"] != "sync" else 0)
                self.assertIn("train    on dam (%d ranks)" % n, out)
                self.assertIn("[%s on %d ranks" % (train["mode"], train["ranks"]), log)
                if train["mode"] == "hybrid":
                    self.assertEqual(t["groups"], 2)
                    self.assertEqual(len(t["updates_per_group"]), 2)
                if train["mode"] == "async":
                    self.assertEqual(len(t["updates_per_worker"]), train["ranks"])
                    self.assertEqual(sum(t["updates_per_worker"]), 20 * 32)
                if run_id == "sync-2":
                    best = json.loads(self.msaflow("nam", "get", "best/sync-2/1", "--nam", "file://" + self.nam).stdout)
                    self.assertEqual(best["reduction"], "MPI_MAXLOC over 3 ranks")
                    self.assertEqual(best["champion"]["candidate"]["id"], res["champion"]["candidate"]["id"])
                    self.assertEqual(sorted(c["candidate"]["id"] for c in best["all"]), ["r1-c00", "r1-c01"])
                    accs = [c["accuracy"] for c in best["all"]]
                    self.assertEqual(accs, sorted(accs, reverse=True))
                if run_id == "sync-2" and res["champion"]["candidate"]["id"] == base["champion"]["candidate"]["id"]:
                    # Same global batch and seed: 1 rank's weights up to summation order.
                    self.assertEqual(len(w), len(w1))
                    worst = max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(w, w1))
                    self.assertLess(worst, 1e-4)
                    self.sync2_checked = True
        self.assertTrue(getattr(self, "sync2_checked", False), "sync-2 chose another champion than sync-1")

    def test_sync_ranks_with_different_thread_counts_train_together(self):
        # Heads trained together are split over a rank's threads, one allreduce per part: ranks
        # with other thread counts (nodes with other cores, uneven placement) must split alike.
        # Before rank 0's count was shared, this step died with MPI_ERR_OTHER.
        res, _ = self.run_pipeline("threads-1", pipeline("t", self.nam, {"mode": "sync", "ranks": 1}, epochs=3))
        with open(os.path.join(self.dir, "runs", "threads-1", "tasks", "r1-train.json")) as f:
            task = json.load(f)
        task["run"] = "threads-mixed"
        path = os.path.join(self.dir, "threads-mixed-train.json")
        with open(path, "w") as f:
            json.dump(task, f)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-n", "1", "-x", "OMP_NUM_THREADS=2", EXE, "module", "train", "--task", path, ":",
               "-n", "1", "-x", "OMP_NUM_THREADS=1", EXE, "module", "train", "--task", path]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("training 2 heads together on pixels features", r.stdout)
        self.assertIn("[sync on 2 ranks", r.stdout)

    def test_lbfgs_on_two_ranks_reaches_the_one_rank_optimum(self):
        """Full-batch L-BFGS with the rows sharded over 2 ranks: the same objective, the same
        optimum (up to float summation order), and the solver's figures in the model."""
        runs = {}
        for ranks in (1, 2):
            doc = pipeline("lb", self.nam, {"mode": "sync", "ranks": ranks}, epochs=60, lrs=(0.001,))
            doc["head"]["optimizer"] = ["lbfgs"]
            doc["head"]["l2"] = [1e-3]
            res, _ = self.run_pipeline(f"lbfgs-{ranks}", doc)
            meta, w = self.model(res)
            runs[ranks] = (res["champion"]["accuracy"], meta, w)
        (acc1, meta1, w1), (acc2, meta2, w2) = runs[1], runs[2]
        self.assertGreater(acc1, 0.75)
        self.assertAlmostEqual(acc2, acc1, delta=0.005)
        for meta, ranks in ((meta1, 1), (meta2, 2)):
            solver = meta["training"]["solver"]
            self.assertEqual(solver["name"], "lbfgs")
            self.assertEqual(meta["training"]["ranks"], ranks)
            self.assertLessEqual(solver["iterations"], 60)
            self.assertEqual(len(meta["curve"]["step"]), solver["iterations"])
        # At the iteration cap the iterates have drifted apart by rounding (0.4 % seen), not more.
        self.assertAlmostEqual(meta2["training"]["solver"]["objective"], meta1["training"]["solver"]["objective"],
                               delta=0.01 * abs(meta1["training"]["solver"]["objective"]))

    def test_prepare_is_byte_identical_for_any_rank_count(self):
        mobilenet = {"name": "mobilenetv2", "onnx": os.path.join(ROOT, "models", "mobilenet_v2.onnx"),
                     "feature_layer": "block_13_expand_relu",
                     "input": {"height": 32, "width": 32, "channels": 3, "mean": [0, 0, 0], "std": [1, 1, 1]}}
        objects = {}
        for ranks in (1, 2, 3):
            nam = os.path.join(self.dir, "nam-prepare-%d" % ranks)  # a fresh NAM: the features are computed
            doc = pipeline("p", nam, {"ranks": 1}, epochs=1, lrs=(0.01,), train_rows=300, test_rows=130,
                           backbone=mobilenet, prepare_ranks=ranks)
            # Parts of one 64-image batch: 300 rows are 5 parts, 130 rows 3.
            res, out = self.run_pipeline("prepare-%d" % ranks, doc, env={"MSAFLOW_PART_BYTES": "1"})
            self.assertEqual(res["rounds"][0]["features_computed"], 2, out)
            self.assertIn("prepare  on dam (%d rank" % ranks, out)
            got = {}
            for f in res["rounds"][0]["features"]["computed"]:
                self.assertEqual(f["ranks"], ranks)
                listed = [json.loads(line) for line in
                          self.msaflow("nam", "ls", f["object"], "--nam", "file://" + nam, "--json").stdout.splitlines()]
                names = sorted(o["name"] for o in listed)
                parts = 5 if f["split"] == "train" else 3
                self.assertEqual(names, [f["object"]] + ["%s.p%05d" % (f["object"], p) for p in range(parts)])
                for name in names:  # byte for byte, not only the checksums
                    dest = os.path.join(self.dir, "f.bin")
                    self.msaflow("nam", "get", name, "--nam", "file://" + nam, "-o", dest)
                    with open(dest, "rb") as fh:
                        got[name] = fh.read()
                index = next(o for o in listed if o["name"] == f["object"])
                self.assertEqual(index["meta"]["parts"], parts)
                self.assertEqual(index["meta"]["part_rows"], 64)
            objects[ranks] = got
            if ranks == 3:  # 5 parts over 3 ranks: 1, 2 and 2 parts, each rank writing its own
                with open(os.path.join(self.dir, "runs", "prepare-3", "logs", "r1-prepare.log")) as f:
                    log = f.read()
                self.assertIn("[0] features mobilenetv2/train: images [0, 64)", log)
                self.assertIn("[2] features mobilenetv2/train: images [192, 300)", log)
                per_rank = res["rounds"][0]["features"]["computed"][0]["per_rank"]
                self.assertEqual([r["parts"] for r in per_rank], [1, 2, 2])
        self.assertEqual(len(objects[1]), 2 + 5 + 3)
        self.assertEqual(objects[1], objects[2])
        self.assertEqual(objects[1], objects[3])

    def training_of(self, run_id, train, epochs=20):
        res, _ = self.run_pipeline(run_id, pipeline("s", self.nam, train, epochs=epochs, lrs=(0.001,)))
        meta, _ = self.model(res)
        return meta["training"]

    def test_a_straggler_slows_only_itself_in_async_and_hybrid(self):
        # Async, 4 workers, worker 1 four times slower: the others do not wait for it. Had they
        # waited, every worker would have sent as many gradients as the straggler; they send about
        # four times as many. Their shares are the OS scheduler's to make: 5 processes on 2 cores
        # beside other tests starve one for milliseconds at a time. After 20 epochs CI saw
        # [0, 3, 0, 637] (before the workers started level) and a loaded machine here
        # [101, 64, 461, 14]: the check is on the fast workers' mean, over 50 epochs (0.2-3.6 s).
        t = self.training_of("straggler-async", {"mode": "async", "ranks": 4, "max_staleness": 64,
                                                 "straggler": {"rank": 1, "factor": 4}}, epochs=50)
        per = t["updates_per_worker"]
        self.assertEqual(sum(per), 50 * 32)
        fast = [u for i, u in enumerate(per) if i != 1]
        self.assertGreaterEqual(sum(fast) / len(fast), 2 * per[1], per)
        self.assertLessEqual(t["staleness"]["max"], 64)
        # Hybrid, 2 groups of 2, rank 3 (group 1) four times slower: group 0 runs ahead.
        t = self.training_of("straggler-hybrid", {"mode": "hybrid", "ranks": 4, "groups": 2,
                                                  "straggler": {"rank": 3, "factor": 4}})
        g = t["updates_per_group"]
        self.assertEqual(sum(g), 20 * 32)
        self.assertGreaterEqual(g[0], 2 * g[1], g)
        # Sync for contrast: every update waits for the straggler, so it is never skipped.
        t = self.training_of("straggler-sync", {"mode": "sync", "ranks": 2, "straggler": {"rank": 1, "factor": 4}},
                             epochs=2)
        self.assertEqual(t["updates"], 2 * 32)

    def test_the_staleness_bound_holds(self):
        # A bound below the straggler's natural staleness: its stale gradients are refused (it
        # carries on from the fresh weights it is sent) and no applied update is staler.
        # (A step is a few GEMMs, tens of microseconds: the straggler must be slow enough that
        # the others' updates pile up while it computes. With 5 processes on 2 cores a step of
        # the straggler's can last milliseconds waiting for a core, and 9 times that once ended
        # a run of 20 epochs (0.14 s) before its third gradient: 60 epochs leave it time.)
        t = self.training_of("bound", {"mode": "async", "ranks": 4, "max_staleness": 2,
                                       "straggler": {"rank": 0, "factor": 10}}, epochs=60)
        self.assertLessEqual(t["staleness"]["max"], 2)
        self.assertGreater(t["refused_per_worker"][0], 0, t)
        self.assertEqual(t["refused"], sum(t["refused_per_worker"]))
        self.assertEqual(t["updates"], 60 * 32)

    def test_the_evaluate_farm_runs_every_task_once(self):
        # 2 candidates x 10 shards = 20 (model x shard) tasks pulled by 1, 2 and 4 ranks, by the
        # one-sided counter and by a dispatcher rank, and with one rank 10x slower.
        def run(run_id, evaluate, env=None):
            doc = pipeline("farm", self.nam, {"mode": "sync", "ranks": 1}, epochs=3)
            doc["steps"]["evaluate"] = dict(evaluate, shards=10)
            path = os.path.join(self.dir, run_id + ".json")
            with open(path, "w") as f:
                json.dump(doc, f)
            r = subprocess.run([EXE, "run", path, "--runs", os.path.join(self.dir, "runs"), "--run-id", run_id],
                               capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})))
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)
            with open(os.path.join(self.dir, "runs", run_id, "results.json")) as f:
                res = json.load(f)
            farm = json.loads(self.msaflow("nam", "get", "evaluated/%s/1" % run_id, "--nam", "file://" + self.nam).stdout)
            ids = [k for r in farm["per_rank"] for k in r["task_ids"]]
            self.assertEqual(sorted(ids), list(range(20)), run_id)  # every task, exactly once
            self.assertEqual(res["rounds"][0]["evaluation"]["tasks"], 20)
            metrics = {c["candidate"]["id"]: (c["accuracy"], c["loss"]) for c in res["rounds"][0]["candidates"]}
            return metrics, farm

        one, farm = run("farm-1", {"ranks": 1})
        self.assertEqual(farm["per_rank"][0]["models_read"], 2)
        for run_id, evaluate, env in [("farm-2", {"ranks": 2}, None), ("farm-4", {"ranks": 4}, None),
                                      ("farm-4d", {"ranks": 4, "farm": "dispatcher"}, None),
                                      ("farm-4slow", {"ranks": 4}, {"MSAFLOW_STRAGGLER": "1:10:evaluate"})]:
            with self.subTest(run_id):
                metrics, farm = run(run_id, evaluate, env)
                self.assertEqual(metrics, one)  # the same results as one rank, exactly
                tasks = [r["tasks"] for r in farm["per_rank"]]
                if evaluate.get("farm") == "dispatcher":
                    self.assertEqual(tasks[0], 0)  # rank 0 dispatches
                    self.assertEqual(farm["workers"], 3)
                if env:  # the slow rank does fewer tasks than the others do on average
                    others = [t for i, t in enumerate(tasks) if i != 1]
                    self.assertLess(tasks[1], sum(others) / len(others), tasks)
                for r in farm["per_rank"]:  # a model is read once per rank, not once per shard
                    self.assertLessEqual(r["models_read"], 2)
                self.assertGreater(farm["utilisation"], 0)
                self.assertLessEqual(farm["utilisation"], 1)

    def test_scaling_writes_a_table_per_step_and_mode(self):
        path = os.path.join(self.dir, "scale.json")
        with open(path, "w") as f:
            json.dump(pipeline("scale", self.nam, {"mode": "sync"}, epochs=2, lrs=(0.001,), train_rows=1000,
                               test_rows=200), f)
        runs = os.path.join(self.dir, "scaling")
        r = self.msaflow("scaling", path, "--ranks", "1,2", "--modes", "sync,async", "--runs", runs)
        self.assertIn("async       skipped: async needs 2 ranks or more", r.stdout)
        (study,) = os.listdir(runs)
        with open(os.path.join(runs, study, "scaling.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["format"], "msaflow.scaling/1")
        self.assertEqual(doc["kind"], "strong")
        self.assertEqual(doc["machine"]["cores"], os.cpu_count())
        self.assertEqual([(e["asked_mode"], e["ranks"]) for e in doc["runs"]], [("sync", 1), ("sync", 2), ("async", 2)])
        for e in doc["runs"]:
            for step in ("prepare", "train", "evaluate"):
                self.assertGreater(e["steps"][step]["seconds"], 0)
        rows = [(t["step"], t["mode"], t["ranks"]) for t in doc["table"]]
        self.assertEqual(rows, [("prepare", "-", 1), ("prepare", "-", 2), ("train", "sync", 1), ("train", "sync", 2),
                                ("train", "async", 2), ("evaluate", "-", 1), ("evaluate", "-", 2)])
        first = doc["table"][0]
        self.assertEqual((first["speedup"], first["efficiency"]), (1.0, 1.0))
        with open(os.path.join(runs, study, "scaling.md")) as f:
            md = f.read()
        self.assertIn("one thread per rank", md)
        self.assertIn("| train | sync | 2 | 1000/200 |", md)
        # Weak scaling needs limits to grow; a bad rank list is refused.
        r = self.msaflow("scaling", path, "--ranks", "1,x", "--runs", runs, ok=False)
        self.assertEqual(r.returncode, 3)
        self.assertIn('--ranks: "x" is not a rank count', r.stderr)
        # Only the steps whose work divides among ranks scale; a step that does not, or no step, is refused.
        for bad in ("load", "trian"):
            r = self.msaflow("scaling", path, "--steps", "prepare," + bad, "--runs", runs, ok=False)
            self.assertEqual(r.returncode, 3)
            self.assertIn(f'--steps: "{bad}" is not one of prepare, train, evaluate', r.stderr)

    def test_a_failing_rank_ends_the_step_with_its_message(self):
        # Every rank refuses a malformed knob; mpirun ends the step and the run names the rank's error.
        path = os.path.join(self.dir, "fail.json")
        nam = os.path.join(self.dir, "nam-fail")
        with open(path, "w") as f:
            json.dump(pipeline("fail", nam, {"mode": "async", "ranks": 2}, epochs=1), f)
        env = dict(os.environ, MSAFLOW_STRAGGLER="1x4")
        r = subprocess.run([EXE, "run", path, "--runs", os.path.join(self.dir, "runs"), "--run-id", "fail"],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr)
        self.assertRegex(r.stderr, r"task r1-train \(3 ranks\) failed with exit status \d+; log ")
        self.assertIn("last output: msaflow: error: [rank ", r.stderr)
        self.assertIn("MSAFLOW_STRAGGLER='1x4': expected RANK:FACTOR[:STEP], e.g. 1:4 or 0:10:evaluate", r.stderr)
        staged = self.msaflow("nam", "ls", "staging/", "--nam", "file://" + nam).stdout
        self.assertEqual(staged, "")  # nothing half-trained was staged

    def test_validate_refuses_modes_the_step_cannot_run(self):
        for train, pointer, hint in [
                ({"mode": "async", "ranks": 1}, "/steps/train/mode", 'with 1 rank use "sync"'),
                ({"mode": "hybrid", "ranks": 6, "groups": 4}, "/steps/train/groups",
                 "groups that would work with 6 ranks: 2, 3")]:
            path = os.path.join(self.dir, "bad.json")
            with open(path, "w") as f:
                json.dump(pipeline("bad", self.nam, train), f)
            r = self.msaflow("validate", path, ok=False)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn(path + ": " + pointer + ": ", r.stderr)
            self.assertIn(hint, r.stderr)
        path = os.path.join(self.dir, "good.json")
        with open(path, "w") as f:
            json.dump(pipeline("good", self.nam, {"mode": "hybrid", "ranks": 4}), f)
        r = self.msaflow("validate", path)
        self.assertIn("train: mode hybrid on 4 ranks + 1 parameter server(s)", r.stdout)

    def test_plan_ranks_auto_uses_the_last_runs_measured_costs(self):
        runs = os.path.join(self.dir, "runs-auto")
        doc = pipeline("auto", os.path.join(self.dir, "nam-auto"), {"ranks": 1}, epochs=2, train_rows=1000,
                       test_rows=500, lrs=(0.001, 0.003, 0.01))
        path = os.path.join(self.dir, "auto.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        first = self.msaflow("plan", path, "--runs", runs, "--ranks", "auto").stdout
        self.assertIn("ranks from measured costs: no earlier run", first)
        self.msaflow("run", path, "--runs", runs, "--run-id", "auto-1")
        with open(os.path.join(runs, "auto-1", "results.json")) as f:
            costs = json.load(f)["rounds"][0]["costs"]
        for step, unit in (("prepare", "image pass"), ("train", "training step"), ("evaluate", "(model x shard) task")):
            self.assertEqual(costs[step]["unit"], unit)
            self.assertGreater(costs[step]["items"], 0, step)
            self.assertGreater(costs[step]["per_item_s"], 0, step)
        self.assertEqual(costs["prepare"]["items"], 1500)  # one image pass per row, train and test
        self.assertEqual(costs["evaluate"]["items"], 3 * 4)  # 3 models x (2 shards per rank x 2 ranks)
        out = self.msaflow("plan", path, "--runs", runs, "--ranks", "auto").stdout
        # The ranks come from the simulator's model, calibrated on that run (docs/simulate.md).
        self.assertIn("ranks from measured costs: run %s, through the simulator's model" % os.path.join(runs, "auto-1"),
                      out)
        sim = json.loads(self.msaflow("simulate", path, "--from-runs", runs, "--json").stdout)
        favoured = sim["placement"]["favoured_ranks"]
        chosen = {}
        for step in ("prepare", "train", "evaluate"):
            m = re.search(r"^  %s\s+(\d+) ranks?: [\d.]+ core-s of work in round \d+, [\d.]+ s that does not divide; "
                          r"predicted ([\d.]+) s \(([\d.]+) s on one rank\); (.+)$" % step, out, re.M)
            self.assertIsNotNone(m, out)
            chosen[step] = int(m.group(1))
            # What plan says is what `msaflow simulate` favours, to the printed digits.
            self.assertEqual(chosen[step], favoured[step]["ranks"], (out, favoured))
            self.assertEqual(m.group(2), "%.2f" % favoured[step]["seconds"])
            self.assertEqual(m.group(3), "%.2f" % favoured[step]["seconds_by_ranks"]["1"])
            self.assertTrue(1 <= chosen[step] <= os.cpu_count(), out)  # the local launcher keeps to the cores
            # The plan below uses the ranks the lines above chose.
            self.assertRegex(out, r"r1-%s\s+module \w+\s+ranks %d\b" % (step, chosen[step]))
        # Pixels on 1,500 rows: a second evaluate rank would cost more than it saves.
        self.assertEqual(chosen["evaluate"], 1, out)
        run = self.msaflow("run", path, "--runs", runs, "--run-id", "auto-2", "--ranks", "auto").stdout
        # One rank, and so little work that the coordinator evaluates itself (a step of several
        # ranks is always a process).
        self.assertIn("evaluate in the coordinator: a small step", run)

    def test_plan_for_slurm_uses_pmix_per_component(self):
        path = os.path.join(self.dir, "plan.json")
        with open(path, "w") as f:
            json.dump(pipeline("plan", self.nam, {"mode": "async", "ranks": 2}), f)
        machine = os.path.join(ROOT, "configs", "machines", "slurm-local.json")
        script = self.msaflow("plan", path, "--machine", machine).stdout
        steps = [line for line in script.splitlines() if line.startswith("step ")]
        self.assertEqual(len(steps), 6, script)
        for line in steps:
            self.assertRegex(line, r" srun --het-group=\d --ntasks=\d+ --mpi=pmix ")
        # async on 2 ranks + its server: 3 processes in the dam component.
        self.assertIn("srun --het-group=1 --ntasks=3 --mpi=pmix", script)
        self.assertNotRegex(script, r"--het-group=\d,")
        local = self.msaflow("plan", path).stdout
        self.assertRegex(local, r"mpirun -n 3 --bind-to none \S+ module train --task")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
