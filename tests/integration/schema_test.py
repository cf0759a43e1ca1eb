"""The pipeline's two definitions kept together: configs/schema/pipeline.schema.json (what editors
and other tools check against) and the parser (workflow/pipeline.cc, what `msaflow validate` and
every run use). Every pipeline in pipelines/ and every pipeline the tests run must pass both; each
invalid pipeline below must be refused by both, the parser naming the JSON pointer; the few rules
a JSON Schema cannot state are listed apart and must be refused by the parser.
Usage: schema_test.py MSAFLOW SOURCE_ROOT"""
import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

import jsonschema

MSAFLOW, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tests' own pipeline builders (each module reads MSAFLOW and ROOT from argv, as here).
import datasets_test  # noqa: E402
import mpi_test  # noqa: E402
import slurm_test  # noqa: E402
from small_pipeline import small_pipeline, tiny_pipeline  # noqa: E402

SCHEMA = json.loads(pathlib.Path(ROOT, "configs/schema/pipeline.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def quickstart():
    return json.loads(pathlib.Path(ROOT, "pipelines/quickstart.json").read_text())


def tests_pipelines():
    """name -> a pipeline exactly as a test builds it."""
    out = {"small": small_pipeline(ROOT, "small"), "tiny": tiny_pipeline(ROOT, "tiny"),
           "slurm-retries": slurm_test.pipeline("r", retries={"max": 1, "on": ["CANCELLED", "SIGNALED"]}),
           "folder": datasets_test.folder_pipeline("/data/train", "/data/test")}
    for train in ({"mode": "sync", "ranks": 1}, {"mode": "sync", "ranks": 2}, {"ranks": 1},
                  {"mode": "independent", "ranks": 2}, {"mode": "async", "ranks": 2},
                  {"mode": "async", "ranks": 3, "servers": 2, "max_staleness": 4},
                  {"mode": "hybrid", "ranks": 4}, {"mode": "hybrid", "ranks": 6, "groups": 3},
                  {"mode": "sync", "ranks": 2, "straggler": {"rank": 1, "factor": 3}}):
        out["mpi-" + json.dumps(train, sort_keys=True)] = mpi_test.pipeline("m", "/tmp/nam", train)
    for precision in ("f32", "bf16", "int8"):
        doc = small_pipeline(ROOT, "e2e")
        doc["backbones"] = [b for b in doc["backbones"] if b["name"] == "mobilenetv2"]
        doc["backbones"][0]["precision"] = precision
        out["e2e-" + precision] = doc
    doc = small_pipeline(ROOT, "f16")
    doc["backbones"][0]["feature_dtype"] = "f16"
    doc["backbones"][2]["feature_dtype"] = "f16"  # pixels may store half floats too
    out["feature-f16"] = doc
    return out


def remove(path):
    def f(doc):
        *parent, last = path
        for k in parent:
            doc = doc[k]
        del doc[last]
    return f


def put(path, value):
    def f(doc):
        *parent, last = path
        for k in parent:
            doc = doc.setdefault(k, {}) if isinstance(k, str) else doc[k]
        doc[last] = value
    return f


# (what is wrong, the change to quickstart.json, the pointer the parser's error names)
INVALID = [
    ("an unknown top-level key", put(["colour"], "blue"), "/colour: unknown key"),
    ("no name", remove(["name"]), "/: missing required key \"name\""),
    ("a name of 65 characters", put(["name"], "n" * 65), "/name"),
    ("another format", put(["format"], "msaflow.pipeline/2"), "/format"),
    ("a NAM that is no URI", put(["nam"], "http://nam:80"), "/nam"),
    ("no test split", remove(["datasets", "test"]), "/datasets"),
    ("an unknown dataset format", put(["datasets", "train", "format"], "csv"), "/datasets/train/format"),
    ("a limit of 0", put(["datasets", "train", "limit"], 0), "/datasets/train/limit"),
    ("a validation fraction of 0.95", put(["datasets", "validation", "fraction"], 0.95),
     "/datasets/validation/fraction"),
    ("one class", put(["datasets", "classes"], 1), "/datasets/classes"),
    ("no backbones", put(["backbones"], []), "/backbones"),
    ("a backbone name in capitals", put(["backbones", 0, "name"], "MobileNet"), "/backbones/0/name"),
    ("an unknown precision", put(["backbones", 0, "precision"], "f64"), "/backbones/0/precision"),
    ("an unknown feature dtype", put(["backbones", 0, "feature_dtype"], "f64"), "/backbones/0/feature_dtype"),
    ("an onnx backbone without its model", remove(["backbones", 0, "onnx"]), "/backbones/0"),
    ("a pixels backbone with a model", put(["backbones", 2, "onnx"], "m.onnx"), "/backbones/2/onnx"),
    ("a pixels backbone with a precision", put(["backbones", 2, "precision"], "int8"), "/backbones/2/precision"),
    ("an input of 4 pixels", put(["backbones", 0, "input", "height"], 4), "/backbones/0/input/height"),
    ("four channels", put(["backbones", 0, "input", "channels"], 4), "/backbones/0/input/channels"),
    ("an unknown head", put(["head", "type"], "cnn"), "/head/type"),
    ("an unknown optimizer", put(["head", "optimizer"], ["adam", "rmsprop"]), "/head/optimizer/1"),
    ("a learning rate of 20", put(["head", "lr"], 20), "/head/lr"),
    ("zero epochs", put(["head", "epochs"], [0]), "/head/epochs/0"),
    ("10001 epochs", put(["head", "epochs"], 10001), "/head/epochs"),
    ("a hidden layer of 5000", put(["head", "hidden"], [128, 5000]), "/head/hidden/1"),
    ("a negative L2", put(["head", "l2"], [-0.1]), "/head/l2/0"),
    ("an unknown step", put(["steps", "deploy"], {}), "/steps/deploy: unknown key"),
    ("an unknown module", put(["steps", "train", "module"], "gpu"), "/steps/train/module"),
    ("no ranks", put(["steps", "evaluate", "ranks"], 0), "/steps/evaluate/ranks"),
    ("an unknown training mode", put(["steps", "train", "mode"], "federated"), "/steps/train/mode"),
    ("shards on train", put(["steps", "train", "shards"], 4), "/steps/train/shards: unknown key"),
    ("an unknown farm", put(["steps", "evaluate", "farm"], "random"), "/steps/evaluate/farm"),
    ("a straggler without its factor", put(["steps", "train", "straggler"], {"rank": 0}), "/steps/train/straggler"),
    ("zero rounds", put(["rounds", "max"], 0), "/rounds/max"),
    ("an unknown strategy", put(["rounds", "strategy"], "grid"), "/rounds/strategy"),
    ("a negative seed", put(["rounds", "seed"], -1), "/rounds/seed"),
    ("a margin above 1", put(["rounds", "backbone_margin"], 2), "/rounds/backbone_margin"),
    ("an unknown metric", put(["metric"], "f1"), "/metric"),
    ("an unknown FPGA backend", put(["fpga"], "gpu"), "/fpga"),
    ("an unknown select_on", put(["select_on"], "train"), "/select_on"),
    ("an unknown retry reason", put(["retries"], {"on": ["BOOM"]}), "/retries/on/0"),
    ("101 retries", put(["retries"], {"max": 101}), "/retries/max"),
]

# Rules between keys that a JSON Schema does not state; the schema's descriptions name them.
PARSER_ONLY = [
    ("async on 1 rank", put(["steps", "train"], {"mode": "async", "ranks": 1}), "/steps/train/mode"),
    ("hybrid groups that do not divide the ranks", put(["steps", "train"], {"mode": "hybrid", "ranks": 6, "groups": 4}),
     "/steps/train/groups"),
    ("servers for mode sync", put(["steps", "train", "servers"], 2), "/steps/train/servers"),
    ("groups for mode async", put(["steps", "train"], {"mode": "async", "ranks": 2, "groups": 2}),
     "/steps/train/groups"),
    ("a straggler rank past the ranks", put(["steps", "train", "straggler"], {"rank": 2, "factor": 2}),
     "/steps/train/straggler/rank"),
    ("async with lbfgs", lambda d: (put(["steps", "train"], {"mode": "async", "ranks": 2})(d),
                                    put(["head", "optimizer"], "lbfgs")(d)), "/steps/train/mode"),
    ("top_k above the candidates", put(["rounds", "top_k"], 7), "/rounds/top_k"),
    ("two backbones of one name", put(["backbones", 1, "name"], "mobilenetv2"), "/backbones/1/name"),
    ("a mean for 2 of 3 channels", put(["backbones", 0, "input", "mean"], [0, 0]), "/backbones/0/input/mean"),
    ("selection on a validation split that is not there", remove(["datasets", "validation"]), "/datasets"),
    ("a key given twice", None, "/head/batch: duplicate key"),
]


class Schema(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def schema_errors(self, doc):
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]

    def validate(self, doc=None, text=None, *args):
        path = os.path.join(self.tmp.name, "p.json")
        with open(path, "w") as f:
            f.write(text if text is not None else json.dumps(doc))
        return subprocess.run([MSAFLOW, "validate", path, *args], capture_output=True, text=True, timeout=60)

    def test_the_schema_is_a_valid_draft_2020_12_schema(self):
        jsonschema.Draft202012Validator.check_schema(SCHEMA)

    def test_the_repositorys_pipelines_pass_both_in_full(self):
        files = sorted(pathlib.Path(ROOT, "pipelines").glob("*.json"))
        self.assertGreaterEqual(len(files), 2)
        for path in files:
            with self.subTest(pipeline=path.name):
                self.assertEqual(self.schema_errors(json.loads(path.read_text())), [])
                # The whole check: machine, dataset files, the models' operators and layers.
                r = subprocess.run([MSAFLOW, "validate", str(path)], capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(": valid (", r.stdout)

    def test_the_tests_pipelines_pass_both(self):
        for name, doc in tests_pipelines().items():
            with self.subTest(pipeline=name):
                self.assertEqual(self.schema_errors(doc), [])
                r = self.validate(doc, None, "--structure-only")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("valid structure", r.stdout)

    def test_invalid_pipelines_are_refused_by_both(self):
        for what, change, pointer in INVALID:
            with self.subTest(what):
                doc = quickstart()
                change(doc)
                self.assertNotEqual(self.schema_errors(doc), [], "the schema accepts " + what)
                r = self.validate(doc, None, "--structure-only")
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)  # invalid input (docs/errors.md)
                self.assertIn("p.json: " + pointer, r.stderr)
                self.assertEqual(r.stdout, "")

    def test_rules_between_keys_are_the_parsers(self):
        for what, change, pointer in PARSER_ONLY:
            with self.subTest(what):
                if change is None:  # a duplicate key is not JSON a schema validator sees
                    text = pathlib.Path(ROOT, "pipelines/quickstart.json").read_text()
                    text = text.replace('"head": {', '"head": {"batch": 32, ', 1)
                    doc = None
                else:
                    doc = quickstart()
                    change(doc)
                    text = None
                    # Listed here because the schema cannot refuse it; if it learns to, move the
                    # case to INVALID.
                    self.assertEqual(self.schema_errors(doc), [], what)
                r = self.validate(doc, text, "--structure-only")
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
                self.assertIn("p.json: " + pointer, r.stderr)

    def test_the_quickstart_itself_is_the_baseline_and_valid(self):
        # The invalid cases each change one thing; the unchanged document must pass, or they
        # would prove nothing.
        doc = quickstart()
        self.assertEqual(self.schema_errors(doc), [])
        r = self.validate(doc, None, "--structure-only")
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
