#!/usr/bin/python3
"""The msaflow CLI on bad inputs: one clear error, the documented exit code, nothing written."""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tmpdir_case import TempDirCase  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]


def msaflow(*args, cwd=None):
    return subprocess.run([EXE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


class Cli(TempDirCase):
    def quickstart(self):
        with open(os.path.join(ROOT, "pipelines", "quickstart.json")) as f:
            return json.load(f)

    def test_examples_validate(self):
        for name in ("quickstart.json", "digits.json"):
            r = msaflow("validate", os.path.join(ROOT, "pipelines", name))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("valid (3 backbones", r.stdout)

    def test_a_model_cut_at_several_layers_is_one_backbone_per_layer(self):
        doc = self.absolute_quickstart()
        doc["backbones"][0]["feature_layer"] = ["block_13_expand_relu", "block_6_expand_relu"]
        path = self.write("p.json", doc)
        r = msaflow("validate", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("valid (4 backbones", r.stdout)
        r = msaflow("plan", path, "--runs", os.path.join(self.dir, "runs"))
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in ("mobilenetv2.block_13_expand_relu", "mobilenetv2.block_6_expand_relu"):
            self.assertIn(name, r.stdout)
        doc["backbones"][0]["feature_layer"] = ["block_13_expand_relu", "block_99"]
        r = msaflow("validate", self.write("p.json", doc))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("no tensor named 'block_99' (the feature layer)", r.stderr)

    def test_bad_mode_names_pointer_and_suggests(self):
        doc = self.quickstart()
        doc["steps"]["train"]["mode"] = "asnyc"
        path = self.write("p.json", doc)
        r = msaflow("run", path, "--runs", self.dir)
        self.assertEqual(r.returncode, 3)
        self.assertEqual(r.stderr.strip(), f'msaflow: error: {path}: /steps/train/mode: "asnyc" is not one of '
                                           'auto, independent, sync, async, hybrid — did you mean "async"?')
        self.assertEqual(sorted(os.listdir(self.dir)), ["p.json"])  # nothing half-written

    def test_missing_model_file(self):
        doc = self.quickstart()
        doc["backbones"][0]["onnx"] = "/nonexistent/model.onnx"
        r = msaflow("validate", self.write("p.json", doc))
        self.assertEqual(r.returncode, 4)
        self.assertIn("/nonexistent/model.onnx: no such file", r.stderr)

    def test_a_device_or_fifo_named_as_a_file_is_refused_without_reading_it(self):
        """/dev/zero as a model or machine file once read until memory was gone, and a FIFO blocked
        for ever (a service accepting pipelines must never): now refused at once, exit 3."""
        fifo = os.path.join(self.dir, "model.onnx")
        os.mkfifo(fifo)
        for key, value, text in (("onnx", "/dev/zero", "/dev/zero: not a regular file (a device); expected an ONNX model"),
                                 ("onnx", fifo, "model.onnx: not a regular file (a FIFO); expected an ONNX model"),
                                 ("machine", "/dev/zero", "expected a machine file (JSON)")):
            with self.subTest(key=key, value=value):
                doc = self.quickstart()
                for b in doc["backbones"]:  # the others found, so that this one is the one refused
                    if "onnx" in b:
                        b["onnx"] = os.path.normpath(os.path.join(ROOT, "pipelines", b["onnx"]))
                for split in doc["datasets"].values():
                    for f in ("images", "labels"):
                        if f in split:
                            split[f] = os.path.normpath(os.path.join(ROOT, "pipelines", split[f]))
                if key == "onnx":
                    doc["backbones"][0]["onnx"] = value
                else:
                    doc["machine"] = value
                r = msaflow("validate", self.write("p.json", doc))  # 120 s timeout: a FIFO would hang it
                self.assertEqual(r.returncode, 3, r.stderr)
                self.assertIn(text, r.stderr)
        r = msaflow("validate", "/dev/zero")
        self.assertEqual(r.returncode, 3)
        self.assertIn("expected a pipeline file (JSON)", r.stderr)

    def test_not_json(self):
        r = msaflow("validate", self.write("p.json", "{oops"))
        self.assertEqual(r.returncode, 3)
        self.assertIn("p.json: not valid JSON (parse error at line 1, column 2", r.stderr)

    def test_usage_errors(self):
        self.assertEqual(msaflow().returncode, 2)
        self.assertEqual(msaflow("frobnicate").returncode, 2)
        r = msaflow("module", "dance", "--task", "/nonexistent")
        self.assertEqual(r.returncode, 2)
        for sub in ("validate", "plan", "run", "status", "module"):
            r = msaflow(sub, "--help")
            self.assertEqual(r.returncode, 0, sub)
            self.assertIn("Usage", r.stdout)

    def test_a_mistyped_command_is_a_usage_error_with_or_without_help(self):
        """A typo must not pass a script: `msaflow verfy --help` exits 2 naming the word and the
        nearest command (one level down too), where the top-level help with exit 0 came before."""
        for args, word, near in ((["verfy", "--help"], "verfy", "nam verify"), (["verfy"], "verfy", "nam verify"),
                                 (["serv"], "serv", "serve"),
                                 (["stauts", "runs"], "stauts", "status"), (["nam", "lss"], "lss", "ls"),
                                 (["nam", "serv", "--help"], "serv", "serve")):
            with self.subTest(args=args):
                r = msaflow(*args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertIn(f"'{word}' is not a command of msaflow", r.stderr)
                self.assertIn(f'did you mean "{near}"?', r.stderr)
        r = msaflow("frobnicate", "--help")
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("did you mean", r.stderr)  # nothing near: no guess
        # Known words are untouched: a command's own arguments are not command words.
        self.assertEqual(msaflow("nam", "serve", "--help").returncode, 0)
        self.assertEqual(msaflow("status", "/nonexistent-run-dir").returncode, 4)

    def test_module_rejects_a_task_of_another_step(self):
        task = self.write("t.json", {"format": "msaflow.task/1", "step": "train", "pipeline": {}, "nam": "mem://x",
                                     "run": "r", "round": 1})
        r = msaflow("module", "select", "--task", task)
        self.assertEqual(r.returncode, 3)
        self.assertIn("task is for step 'train', not 'select'", r.stderr)

    def test_unsupported_operator_is_refused_before_the_run_starts(self):
        # A model whose cut tensor depends on an operator msaflow does not run: validate and run
        # import every backbone first (the load step checks the same when run on its own).
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        import onnx
        from onnx import TensorProto, helper
        node = helper.make_node("LpNormalization", ["input"], ["feat"], name="norm1")
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
                                  [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", 3, 8, 8])])
        model_path = os.path.join(self.dir, "bad.onnx")
        onnx.save(helper.make_model(graph), model_path)
        doc = self.quickstart()
        doc["backbones"] = [{"name": "bad", "onnx": model_path, "feature_layer": "feat",
                             "input": {"height": 8, "width": 8}}]
        doc["rounds"] = {"max": 1, "candidates": 1}
        doc["datasets"]["train"]["limit"] = 300  # every class in every split: only the model is wrong
        doc["datasets"]["test"]["limit"] = 100
        for split in ("train", "test"):
            for k in ("images", "labels"):
                doc["datasets"][split][k] = os.path.join(ROOT, "pipelines", doc["datasets"][split][k])
        path = self.write("p.json", doc)
        for cmd in ("validate", "run"):
            r = msaflow(cmd, path, *(["--runs", os.path.join(self.dir, "runs"), "--run-id", "bad"] if cmd == "run" else []))
            self.assertEqual(r.returncode, 6, cmd + ": " + r.stderr)
            self.assertIn("node 'norm1' (LpNormalization): operator LpNormalization is not supported", r.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["bad.onnx", "p.json"])  # nothing written

    def absolute_quickstart(self):
        doc = self.quickstart()
        base = os.path.join(ROOT, "pipelines")
        for split in (doc["datasets"]["train"], doc["datasets"]["test"]):
            for k in ("images", "labels"):
                split[k] = os.path.normpath(os.path.join(base, split[k]))
        for b in doc["backbones"]:
            if "onnx" in b:
                b["onnx"] = os.path.normpath(os.path.join(base, b["onnx"]))
        return doc

    def test_a_nam_port_out_of_range_is_refused_before_anything_is_written(self):
        # Issue 14: validate passed it and the failed run left a run directory without a journal.
        doc = self.absolute_quickstart()
        doc["nam"] = "fabric://127.0.0.1:99999"
        path = self.write("p.json", doc)
        for cmd in ("validate", "plan", "run"):
            r = msaflow(cmd, path, *([] if cmd == "validate" else ["--runs", os.path.join(self.dir, "runs")]))
            self.assertEqual(r.returncode, 3, cmd + ": " + r.stderr)
            self.assertEqual(r.stderr.strip(), "msaflow: error: pipeline quickstart: /nam: NAM URI "
                                               "'fabric://127.0.0.1:99999': port 99999 is out of range")
        self.assertEqual(sorted(os.listdir(self.dir)), ["p.json"])

    def test_validate_refuses_every_input_run_would_refuse_at_once_and_on_one_line(self):
        """Issue 31's trial, case by case: validate refuses each with its exit code and one line
        (values escaped and cut), quickly (a bound far above the ~0.3 s measured, to catch the
        13 s did-you-mean search or a read of /dev/zero, not to time anything), and run stops
        where validate did, with the same line and nothing written."""
        import numpy as np
        d = self.dir
        np.save(os.path.join(d, "x.npy"), np.zeros((6, 8, 8), np.uint8))
        np.save(os.path.join(d, "y.npy"), np.array([0, 1, 2, 0, 1, 2]))
        np.save(os.path.join(d, "xf.npy"), np.zeros((6, 8, 8), np.float32))
        np.save(os.path.join(d, "y3.npy"), np.array([0, 1, 2]))
        for c in ("a", "b"):
            os.makedirs(os.path.join(d, "gif", c))
            os.makedirs(os.path.join(d, "empty", c))
        png = bytes.fromhex("89504e470d0a1a0a")  # PNG's signature: the listing reads no more
        for path, data in (("gif/a/1.png", b"GIF89a" + bytes(16)), ("gif/b/1.png", png), ("empty/a/1.png", png)):
            with open(os.path.join(d, path), "wb") as f:
                f.write(data)

        def npy(doc, x="x.npy", y="y.npy"):
            doc["datasets"] = {"train": {"format": "npy", "images": os.path.join(d, x), "labels": os.path.join(d, y)},
                               "test": {"format": "npy", "images": os.path.join(d, "x.npy"),
                                        "labels": os.path.join(d, "y.npy")},
                               "validation": {"from": "train", "fraction": 0.5}}
            doc["backbones"] = [{"name": "pixels", "kind": "pixels"}]

        def folder(doc, root):
            doc["datasets"] = {"train": {"format": "folder", "root": os.path.join(d, root)},
                               "test": {"format": "folder", "root": os.path.join(d, root)}, "select_on": "test"}
            doc["select_on"] = "test"
            del doc["datasets"]["select_on"]
            doc["backbones"] = [{"name": "pixels", "kind": "pixels"}]

        model = os.path.join(ROOT, "models", "mobilenet_v2.onnx")
        huge = "x" * 1000000
        cases = [
            ("NUL in a layer", lambda p: p["backbones"][0].update(feature_layer="ab\0cd"), 4,
             f"{model}: no tensor named 'ab\\x00cd' (the feature layer)"),
            ("newline in a layer", lambda p: p["backbones"][0].update(feature_layer="ab\ncd"), 4,
             f"{model}: no tensor named 'ab\\ncd' (the feature layer)"),
            ("1 MB layer", lambda p: p["backbones"][0].update(feature_layer=huge), 4,
             f"{model}: no tensor named '{'x' * 60}… (1000000 bytes)' (the feature layer)"),
            ("1 MB path", lambda p: p["backbones"][0].update(onnx="/" + huge), 4,
             f"PIPE: /backbones/0/onnx: /{'x' * 59}… (1000001 bytes): no such file"),
            ("300-character backbone", lambda p: p["backbones"][2].update(name="b" * 300), 3,
             "(302 characters) is 300 characters long; at most 64"),
            ("backbone ..", lambda p: p["backbones"][2].update(name=".."), 3, "/backbones/2/name"),
            ("NUL in the name", lambda p: p.update(name="a\0b"), 3, '/name: "a\\u0000b" has a control character or'),
            ("IPv4 of 256", lambda p: p.update(nam="fabric://256.1.1.1:5"), 3,
             "pipeline quickstart: /nam: NAM URI 'fabric://256.1.1.1:5': host '256.1.1.1' is not an IPv4 address "
             "(four numbers 0..255)"),
            ("file://", lambda p: p.update(nam="file://"), 3,
             "pipeline quickstart: /nam: NAM URI 'file://' names no directory; expected file://DIR"),
            ("file:///dev/zero", lambda p: p.update(nam="file:///dev/zero"), 3,
             "pipeline quickstart: /nam: NAM URI 'file:///dev/zero': /dev/zero is not a directory; expected "
             "file://DIR (made if missing)"),
            ("mem://", lambda p: p.update(nam="mem://"), 3, "NAM URI 'mem://' is in-process memory (for tests)"),
            ("ranks 1000", lambda p: p["steps"]["train"].update(ranks=1000), 3,
             "pipeline quickstart: /steps/train/ranks: 1000 ranks, but module dam of machine local allows at most 64 "
             "(max_ranks in the machine file); ask for 64 or fewer"),
            ("float images", lambda p: npy(p, x="xf.npy"), 3, f"{d}/xf.npy: dtype '<f4'; images must be uint8 (|u1)"),
            ("short labels", lambda p: npy(p, y="y3.npy"), 3, f"{d}/y3.npy: 3 labels for 6 images in {d}/x.npy"),
            ("too few classes", lambda p: (npy(p), p["datasets"].update(classes=2)), 3,
             "is outside 0..1 (2 classes, /datasets/classes)"),
            ("a GIF named .png", lambda p: folder(p, "gif"), 3, f"{d}/gif/a/1.png: neither PNG nor JPEG (by its first bytes)"),
            ("an empty class", lambda p: folder(p, "empty"), 3, f"{d}/empty/b: class 'b' has no .png, .jpg or .jpeg images"),
        ]
        runs = os.path.join(d, "runs")
        for label, mutate, code, text in cases:
            with self.subTest(case=label):
                doc = self.absolute_quickstart()
                mutate(doc)
                path = self.write("p.json", doc)
                text = text.replace("PIPE", path)
                t0 = time.monotonic()
                r = msaflow("validate", path)
                took = time.monotonic() - t0
                self.assertEqual(r.returncode, code, r.stderr[:500])
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr[:500])
                self.assertLess(len(r.stderr), 400)
                self.assertIn(text, r.stderr)
                self.assertLess(took, 5.0)
                ran = msaflow("run", path, "--runs", runs)
                self.assertEqual((ran.returncode, ran.stderr), (r.returncode, r.stderr))
                self.assertFalse(os.path.exists(runs) and os.listdir(runs), "run got further than validate")

    def no_opencl(self):
        """The environment of a machine without OpenCL: the ICD loader looks in an empty folder."""
        empty = os.path.join(self.dir, "no-icds")
        os.makedirs(empty, exist_ok=True)
        return dict(os.environ, OCL_ICD_VENDORS=empty)

    def test_fpga_opencl_without_a_platform_is_refused_before_anything_is_written(self):
        doc = self.absolute_quickstart()
        doc["fpga"] = "opencl"
        path = self.write("p.json", doc)
        for cmd in ("validate", "run"):
            r = subprocess.run([EXE, cmd, path, *([] if cmd == "validate" else ["--runs", os.path.join(self.dir, "runs")])],
                               capture_output=True, text=True, timeout=120, env=self.no_opencl())
            self.assertEqual(r.returncode, 6, cmd + ": " + r.stderr)
            self.assertTrue(r.stderr.startswith('msaflow: error: pipeline quickstart: step prepare on module dam asks for '
                                                'fpga "opencl" (the pipeline\'s /fpga), but opencl: no OpenCL platform is '
                                                'installed'), r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["no-icds", "p.json"])
        # With OpenCL present (PoCL, which the set-up installs) the same pipeline is valid.
        r = msaflow("validate", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('prepare: fpga "opencl" on module dam', r.stdout)

    def test_fpga_auto_without_a_platform_falls_back_to_the_cpu_with_a_notice(self):
        doc = self.absolute_quickstart()
        doc["backbones"] = doc["backbones"][:1]  # MobileNetV2: prepare uses the FPGA backend
        doc["backbones"][0]["input"]["height"] = doc["backbones"][0]["input"]["width"] = 32
        doc["datasets"]["train"]["limit"] = 128
        doc["datasets"]["test"]["limit"] = 64
        doc["head"] = {"type": "softmax", "epochs": 1}
        doc["rounds"] = {"max": 1, "candidates": 2}
        doc["steps"] = {"train": {"mode": "independent"}, "evaluate": {"ranks": 1}}
        r = subprocess.run([EXE, "run", self.write("p.json", doc), "--runs", self.dir, "--run-id", "auto"],
                           capture_output=True, text=True, timeout=300, env=self.no_opencl())
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout[-2000:])
        notices = [line for line in r.stdout.splitlines() if "fpga auto: no OpenCL device, so the CPU backend" in line]
        self.assertEqual(len(notices), 2, r.stdout)  # one line from each of prepare and select
        self.assertIn("no OpenCL platform is installed", notices[0])
        with open(os.path.join(self.dir, "auto", "results.json")) as f:
            rnd = json.load(f)["rounds"][0]
        self.assertEqual(rnd["selection"]["device"], "cpu (C++)")
        self.assertEqual(rnd["selection"]["fpga"]["requested"], "auto")
        self.assertIn("no OpenCL platform", rnd["selection"]["fpga"]["notice"])
        self.assertEqual(rnd["features"]["fpga"]["backend"], "cpu")

    def start_small_run(self, run_id, stderr=subprocess.DEVNULL):
        """A one-round quickstart on 3,000/500 images started in the background; returns the
        coordinator, its run directory, and a function listing the run's step processes
        (module processes and mpirun)."""
        doc = self.absolute_quickstart()
        doc["datasets"]["train"]["limit"] = 3000
        doc["datasets"]["test"]["limit"] = 500
        doc["rounds"] = {"max": 1, "candidates": 2, "top_k": 1}
        runs = os.path.join(self.dir, "runs")
        run_dir = os.path.join(runs, run_id)
        coordinator = subprocess.Popen([EXE, "run", self.write("p.json", doc), "--runs", runs, "--run-id", run_id],
                                       stdout=subprocess.DEVNULL, stderr=stderr, text=True)

        def steps():
            out = subprocess.run(["pgrep", "-af", "msaflow module|mpirun"], capture_output=True, text=True).stdout
            return [line for line in out.splitlines() if run_dir in line]
        return coordinator, run_dir, steps

    def wait_for(self, coordinator, seen, what, seconds=120):
        """Polls until `seen()`, failing if the run ends first."""
        import time
        deadline = time.monotonic() + seconds
        while not seen() and time.monotonic() < deadline:
            self.assertIsNone(coordinator.poll(), f"the run ended before {what} was seen")
            time.sleep(0.05)

    def assert_no_step_left(self, steps):
        import time
        deadline = time.monotonic() + 5
        while steps() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(steps(), [])

    def test_a_killed_coordinator_leaves_no_step_behind(self):
        # Issue 13: after kill -9 of `msaflow run`, its module processes lived on for ~30 s. Each
        # step (mpirun for several ranks) now gets SIGTERM when the coordinator dies.
        import signal
        coordinator, run_dir, steps = self.start_small_run("killed")
        self.wait_for(coordinator, lambda: any(" prepare " in s or "r1-prepare" in s for s in steps()),
                      "its prepare step")
        self.assertTrue(steps(), "no step process seen")
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
        self.assert_no_step_left(steps)

    def test_cancel_stops_a_running_run_which_resume_could_continue(self):
        # `msaflow cancel` (orchestrator::Runs::Cancel): SIGTERM to the run's live coordinator,
        # which ends its steps and records the run as cancelled (by whom), interrupted by signal 15.
        self.assertEqual(msaflow("cancel", os.path.join(self.dir, "nope")).returncode, 4)
        coordinator, run_dir, steps = self.start_small_run("cancelled", stderr=subprocess.PIPE)
        self.wait_for(coordinator, steps, "a step")
        r = msaflow("cancel", run_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("pid %d" % coordinator.pid, r.stdout)
        _, err = coordinator.communicate(timeout=60)
        self.assertEqual(coordinator.returncode, 1, err)
        self.assertIn("interrupted by signal 15", err)
        self.assert_no_step_left(steps)
        st = msaflow("status", run_dir)
        self.assertEqual(st.returncode, 1, st.stdout)
        self.assertIn("interrupted by signal 15", st.stdout)
        self.assertIn("cancelled: ", st.stdout)
        with open(os.path.join(run_dir, "journal.jsonl")) as f:
            failed = [json.loads(line) for line in f if '"run-failed"' in line][-1]
        self.assertTrue(failed["cancelled"])
        self.assertIn("msaflow cancel", failed["by"])
        again = msaflow("cancel", run_dir)  # nobody left to stop
        self.assertEqual(again.returncode, 3, again.stderr)
        self.assertIn("no live coordinator", again.stderr)

    def test_nam_verify_lists_damaged_objects_and_repair_moves_them_aside(self):
        nam = os.path.join(self.dir, "nam")
        uri = "file://" + nam
        for name, data in (("a/one", "1"), ("a/two", "22"), ("b/three", "333")):
            src = self.write("obj", data)
            self.assertEqual(msaflow("nam", "put", name, src, "--nam", uri).returncode, 0)
        with open(os.path.join(nam, "a", "two.nam"), "r+b") as f:  # a flipped byte in the body
            f.seek(-1, os.SEEK_END)
            f.write(b"X")
        with open(os.path.join(nam, "b", "three.nam"), "r+b") as f:  # a damaged header
            f.write(b"JUNK")
        r = msaflow("nam", "ls", "--nam", uri)
        self.assertEqual(r.returncode, 0, r.stderr)  # one damaged header does not break the listing
        self.assertRegex(r.stdout, r"DAMAGED +b/three  \(.*bad magic")
        r = msaflow("nam", "verify", "--nam", uri)
        self.assertEqual(r.returncode, 5, r.stdout + r.stderr)
        self.assertIn("DAMAGED a/two: ", r.stdout)
        self.assertIn("checksum mismatch", r.stdout)
        self.assertIn("DAMAGED b/three: ", r.stdout)
        self.assertIn("3 objects checked, 1 B of good data, 2 damaged (run with --repair", r.stdout)
        r = msaflow("nam", "verify", "--repair", "--nam", uri)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("-> " + os.path.join(nam, "DAMAGED", "a", "two.nam"), r.stdout)
        r = msaflow("nam", "verify", "--nam", uri)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("1 objects checked, 1 B of good data, 0 damaged", r.stdout)
        self.assertEqual(msaflow("nam", "get", "a/two", "--nam", uri).returncode, 4)  # aside: no object

    def test_status_of_missing_run(self):
        r = msaflow("status", os.path.join(self.dir, "nope"))
        self.assertEqual(r.returncode, 4)
        self.assertIn("journal.jsonl: no such file", r.stderr)

    def test_status_of_a_damaged_journal_is_a_clear_error(self):
        # Found by fuzz/journal_fuzz.cc: a round-end event without its accuracy ended in
        # "internal error: [json.exception.out_of_range.403] key 'accuracy' not found".
        run = os.path.join(self.dir, "run")
        os.makedirs(run)
        head = '{"format":"msaflow.journal/1"}\n{"event":"run-start","run":"r"}\n'
        for bad, line, what in (('{"event":"round-end","champion":"c"}', 3, "a malformed 'round-end' event"),
                                ('{"event":"round-start","round":"one"}', 3, "a malformed 'round-start' event"),
                                ('[1, 2]', 3, "not a JSON object")):
            with open(os.path.join(run, "journal.jsonl"), "w") as f:
                f.write(head + bad + "\n")
            r = msaflow("status", run)
            self.assertEqual(r.returncode, 5, r.stderr)
            self.assertIn("journal.jsonl:%d: " % line, r.stderr)
            self.assertIn(what, r.stderr)
            self.assertNotIn("internal error", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
