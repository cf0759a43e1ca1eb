#!/usr/bin/python3
"""End to end: a small pipeline through the real module processes (real ONNX backbones, real
Fashion-MNIST images, the NAM server the run starts (fabric://), persisting to <runs>/nam), two
rounds. Checks the champion and that round 2 reused
every feature object instead of running the backbones again. The FPGA steps run on OpenCL
(PoCL, which CI installs); a run with the C++ backend must give the same metrics, bit for bit."""
import json
import os
import subprocess
import sys
import time
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_pipeline import small_pipeline  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]
with open("/proc/cpuinfo") as f:
    FLAGS = {flag for line in f if line.startswith("flags") for flag in line.split()}
HAS_VNNI = bool(FLAGS & {"avx512_vnni", "avx_vnni"})
HAS_AVX512 = "avx512f" in FLAGS  # bf16 (emulated below AVX512_BF16)


class EndToEnd(unittest.TestCase):
    def test_two_rounds(self):
        doc = small_pipeline(ROOT, "e2e")
        doc["fpga"] = "opencl"
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "p.json")
            with open(p, "w") as f:
                json.dump(doc, f)
            r = subprocess.run([EXE, "run", p, "--runs", d, "--run-id", "e2e"], capture_output=True, text=True,
                               timeout=800)
            print(r.stdout[-3000:])
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "e2e", "results.json")) as f:
                res = json.load(f)
            self.assertEqual(res["format"], "msaflow.results/1")
            self.assertEqual(len(res["rounds"]), 2)
            r1, r2 = res["rounds"]
            # Round 1 ran every backbone on both splits; round 2 ran none.
            self.assertEqual(r1["features_computed"], 9)  # 3 backbones x train, validation, test
            self.assertEqual(r2["features_computed"], 0)
            self.assertEqual(r2["features_reused"], 9)
            self.assertIn("features computed 0, reused 9 (no backbone ran this round)", r.stdout)
            # Chosen on the validation split (taken from train, stratified); the test split chose
            # nothing and is the reported result.
            self.assertEqual(res["result"]["selected_on"], "validation")
            self.assertFalse(res["result"]["optimistic"])
            self.assertEqual(res["result"]["accuracy"], res["champion"]["test"]["accuracy"])
            for c in r1["candidates"]:
                self.assertEqual(c["split"], "validation")
                self.assertIn("accuracy", c["test"])
            self.assertIn("test accuracy", r.stdout)
            self.assertIn("the test split chose nothing", r.stdout)
            self.assertEqual(set(res["best_per_backbone_on_test"]), {"mobilenetv2", "ppocrv4", "pixels"})
            # The champion is the best of everything evaluated, ties by id.
            everything = {}
            for rnd in res["rounds"]:
                for c in rnd["candidates"]:
                    everything[c["candidate"]["id"]] = c["accuracy"]
            best = max(everything.values())
            expect = min(k for k, v in everything.items() if v == best)
            self.assertEqual(res["champion"]["candidate"]["id"], expect)
            self.assertAlmostEqual(res["champion"]["accuracy"], best)
            # Real learning happened: well above chance (10 classes) on 300 test images.
            self.assertGreater(best, 0.6)
            self.assertEqual(set(res["best_per_backbone"]), {"mobilenetv2", "ppocrv4", "pixels"})
            # The FPGA's two steps ran on the PoCL device and say so.
            self.assertIn("fpga: opencl: Portable Computing Language / ", r.stdout)
            for rnd in res["rounds"]:
                self.assertTrue(rnd["selection"]["device"].startswith("opencl: Portable Computing Language / "),
                                rnd["selection"])
                self.assertEqual(rnd["selection"]["fpga"]["requested"], "opencl")
            self.assertEqual(r1["features"]["fpga"]["backend"], "opencl")
            self.assertGreater(r1["features"]["computed"][0]["fpga"]["measured_s"], 0)
            # Round 2 kept round 1's top-2 and derived 4 new candidates from them.
            kept = [c for c in r2["candidates"] if c["round"] == 1]
            self.assertEqual(len(kept), 2)
            self.assertEqual(len([c for c in r2["candidates"] if c["round"] == 2]), 4)
            # The run started the runs directory's NAM server (the local machine asks for one),
            # which stopped once no run used it.
            self.assertTrue(res["nam"].startswith("fabric://127.0.0.1:"), res["nam"])
            deadline = time.monotonic() + 2
            while os.path.exists(os.path.join(d, "nam-server.json")) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertFalse(os.path.exists(os.path.join(d, "nam-server.json")))
            with open(os.path.join(d, "nam-server.log")) as f:
                log = f.read()
            self.assertIn("serving " + res["nam"], log)
            self.assertIn("no run uses this server any more", log)
            self.assertIn("stopping:", log)
            down = subprocess.run([EXE, "nam", "ls", "--nam", res["nam"] + "?timeout=1"], capture_output=True, text=True)
            self.assertEqual(down.returncode, 8, down.stdout)
            # It persisted to <runs>/nam in the file:// layout: the champion model is there, checksummed.
            nam = os.path.join(d, "nam")
            self.assertTrue(os.path.exists(os.path.join(nam, res["champion"]["model"] + ".nam")))
            model = subprocess.run([EXE, "nam", "stat", res["champion"]["model"], "--nam", "file://" + nam],
                                   capture_output=True, text=True)
            self.assertEqual(model.returncode, 0, model.stderr)
            with open(os.path.join(d, "e2e", "journal.jsonl")) as f:
                lines = [json.loads(line) for line in f]
            self.assertEqual(lines[0]["format"], "msaflow.journal/1")
            self.assertEqual(lines[-1]["event"], "run-end")
            # Light steps and, in round 2, load and prepare (nothing to compute) ran in the
            # coordinator: no process was started for them, and they left their log and done
            # object as usual; the provenance says why.
            here = {e["task"]: e["why"] for e in lines if e.get("event") == "task-in-coordinator"}
            light = "a light step: less work than starting a module process"
            settled = "nothing to compute: its outputs are in the NAM"
            self.assertEqual(here, {"r1-load": light, "r1-store": light, "r1-select": light, "r2-load": settled,
                                    "r2-prepare": settled, "r2-store": light, "r2-select": light})
            starts = {e["task"]: e["module"] for e in lines if e.get("event") == "task-start"}
            self.assertEqual(starts["r2-prepare"], "coordinator")
            for task in ("r1-prepare", "r1-train", "r1-evaluate", "r2-train", "r2-evaluate"):
                self.assertNotEqual(starts[task], "coordinator", task)
            ends = {e["task"]: e for e in lines if e.get("event") == "task-end"}
            self.assertTrue(ends["r2-prepare"]["key"])
            self.assertEqual(ends["r2-prepare"]["ranks"][0]["rank"], 0)
            self.assertTrue(ends["r1-select"]["outputs"])
            with open(os.path.join(d, "e2e", "logs", "r2-prepare.log")) as f:
                self.assertIn("every features object was there: no image read", f.read())
            self.assertIn("prepare  in the coordinator: " + settled, r.stdout)
            self.assertIn("select   in the coordinator: " + light, r.stdout)
            with open(os.path.join(d, "e2e", "provenance.json")) as f:
                how = {t["task"]: t["how"] for rnd in json.load(f)["rounds"] for t in rnd["tasks"]}
            self.assertEqual(how["r1-store"], "ran in the coordinator: " + light)
            self.assertEqual(how["r1-train"], "ran")
            s = subprocess.run([EXE, "status", os.path.join(d, "e2e")], capture_output=True, text=True)
            self.assertEqual(s.returncode, 0)
            self.assertIn("state: finished: champion " + expect, s.stdout)
            # A second run over the same NAM reuses the first run's features from round 1 on.
            r = subprocess.run([EXE, "run", p, "--runs", d, "--run-id", "e2e-again"], capture_output=True, text=True,
                               timeout=800)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "e2e-again", "results.json")) as f:
                again = json.load(f)
            self.assertEqual(again["rounds"][0]["features_computed"], 0)
            with open(os.path.join(d, "e2e-again", "journal.jsonl")) as f:
                here = [json.loads(line).get("task") for line in f if '"task-in-coordinator"' in line]
            self.assertEqual(here, ["r1-load", "r1-prepare", "r1-store", "r1-select", "r2-load", "r2-prepare",
                                    "r2-store", "r2-select"])
            # Same pipeline, same seeds: the same champion configuration and accuracy.
            self.assertAlmostEqual(again["champion"]["accuracy"], res["champion"]["accuracy"])
            self.assertEqual(again["champion"]["candidate"]["id"], res["champion"]["candidate"]["id"])
            # file:// stays available: the same pipeline over a plain directory, same champion; and
            # with the FPGA steps in C++ (features computed again there), the same metrics exactly.
            doc["nam"] = "file://" + os.path.join(d, "plain-nam")
            doc["fpga"] = "cpu"
            with open(p, "w") as f:
                json.dump(doc, f)
            r = subprocess.run([EXE, "run", p, "--runs", d, "--run-id", "e2e-file"], capture_output=True, text=True,
                               timeout=800)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "e2e-file", "results.json")) as f:
                plain = json.load(f)
            self.assertEqual(plain["nam"], doc["nam"])
            self.assertEqual(plain["champion"]["candidate"]["id"], res["champion"]["candidate"]["id"])
            self.assertEqual(plain["champion"]["accuracy"], res["champion"]["accuracy"])
            self.assertEqual(plain["rounds"][0]["features_computed"], 9)
            self.assertEqual(plain["rounds"][0]["selection"]["device"], "cpu (C++)")
            for a, b in zip(res["rounds"], plain["rounds"]):
                metrics = [(c["candidate"]["id"], c["accuracy"], c["loss"]) for c in a["candidates"]]
                self.assertEqual(metrics, [(c["candidate"]["id"], c["accuracy"], c["loss"]) for c in b["candidates"]])


    @unittest.skipUnless(HAS_VNNI, "int8 needs VNNI (the load step refuses it elsewhere)")
    def test_int8_backbone_is_calibrated_when_loaded_and_trains_as_well_as_f32(self):
        """An int8 MobileNetV2: its ranges are measured by the load step on the first training
        images and kept with the backbone in the NAM; prepare's two ranks quantize with them;
        the round's champion is as good as the f32 one (the same data, seeds and candidates).
        `msaflow predict` on each run (and a bf16 one) computes the backbone as the run did: the
        run's test images classify as the run counted them (in f32 an int8 or bf16 run's counts
        came out one image off), while the exported file computes in float32 and says so."""
        doc = small_pipeline(ROOT, "int8", rounds=1)
        doc["backbones"] = [b for b in doc["backbones"] if b["name"] == "mobilenetv2"]
        doc["steps"]["prepare"]["ranks"] = 2
        test = doc["datasets"]["test"]
        with tempfile.TemporaryDirectory() as d:
            results, outs = {}, {}
            # int8 last: the NAM's backbone is then the int8 one, checked below.
            for precision in ("f32",) + (("bf16",) if HAS_AVX512 else ()) + ("int8",):
                doc["backbones"][0]["precision"] = precision
                p = os.path.join(d, f"{precision}.json")
                with open(p, "w") as f:
                    json.dump(doc, f)
                r = subprocess.run([EXE, "run", p, "--runs", d, "--run-id", precision], capture_output=True,
                                   text=True, timeout=600)
                self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
                outs[precision] = r.stdout
                with open(os.path.join(d, precision, "results.json")) as f:
                    results[precision] = json.load(f)
                # Before the next run loads its own backbone under the same name.
                reported = sum(c["correct"] for c in results[precision]["champion"]["test"]["per_class"])
                r = subprocess.run([EXE, "predict", os.path.join(d, precision), test["images"], "--labels",
                                    test["labels"], "--limit", str(test["limit"]), "--batch", "7"],
                                   capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                line = next((x for x in r.stdout.splitlines() if x.startswith("accuracy:")), "")
                self.assertTrue(line.startswith(f"accuracy: {reported} of {test['limit']} labelled images"),
                                (precision, reported, line))
                self.assertEqual(r.stderr, "")  # nothing to note: it computed as the run did
                if precision != "f32":
                    onnx_file = os.path.join(d, f"{precision}.onnx")
                    subprocess.run([EXE, "export", os.path.join(d, precision), "-o", onnx_file], check=True,
                                   capture_output=True)
                    r = subprocess.run([EXE, "predict", onnx_file, test["images"], "--labels", test["labels"],
                                        "--limit", "8"], capture_output=True, text=True, timeout=120)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertIn(f"the exported model computes in float32, as every ONNX runtime does; the run "
                                  f"computed its backbone in {precision}", r.stderr)
            self.assertRegex(outs["int8"], r"backbone mobilenetv2: int8 ranges of \d+ tensors measured on the "
                                           r"first 256 training images")
            self.assertNotIn("int8 ranges", outs["f32"])
            stat = subprocess.run([EXE, "nam", "stat", "backbone/mobilenetv2", "--nam", "file://" + os.path.join(d, "nam")],
                                  capture_output=True, text=True)
            self.assertEqual(stat.returncode, 0, stat.stderr)
            # Every tensor's range, the input's and the feature layer's among them.
            self.assertRegex(stat.stdout, r'"int8_ranges":\s*\{[^}]*"input":')
            self.assertRegex(stat.stdout, r'"int8_ranges":\s*\{[^}]*"block_13_expand_relu":')
            a32 = results["f32"]["champion"]["test"]["accuracy"]
            a8 = results["int8"]["champion"]["test"]["accuracy"]
            print(f"champion test accuracy: f32 {a32:.4f}, int8 {a8:.4f}")
            self.assertGreater(a32, 0.6)
            self.assertLess(abs(a8 - a32), 0.04)  # 300 test images: 12 of them


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
