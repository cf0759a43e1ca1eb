#!/usr/bin/python3
"""What a user sees of a run (issue 13): `msaflow report` opened in a real headless Chromium
(Debian's), which renders it without a console message and draws one mark per candidate per
round; `status` as tables; progress bars when stdout is a terminal, plain lines otherwise."""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_pipeline import tiny_pipeline as small_pipeline_tiny  # noqa: E402
from tmpdir_case import TempDirCase  # noqa: E402

EXE, ROOT = sys.argv[1], sys.argv[2]

# Appended to a copy of the report: what the browser laid out, as one console line.
PROBE = """<script>
(() => {
  const box = e => e.getBoundingClientRect();
  const inside = (r, o) => r.width > 0 && r.height > 0 && r.left >= o.left - 1 && r.right <= o.right + 1 &&
                           r.top >= o.top - 1 && r.bottom <= o.bottom + 1;
  const drawn = sel => {
    const svg = document.querySelector(sel);
    if (!svg) return null;
    const o = box(svg);
    return {svg: [o.width, o.height], items: [...svg.querySelectorAll('.mark, .task, .curve, .cell')]
      .filter(e => inside(box(e), o)).map(e => e.getAttribute('class') + ' ' +
        (e.dataset.round || '') + '/' + (e.dataset.candidate || e.dataset.task || ''))};
  };
  const confusion = document.querySelector('#confusion');
  const labels = confusion ? [...confusion.querySelectorAll('text.class')].filter(e => inside(box(e), box(confusion)))
    .map(e => e.textContent) : [];
  const perClass = [...document.querySelectorAll('#per-class tr')].slice(1)
    .map(r => [...r.querySelectorAll('td')].map(d => d.textContent));
  console.log('msaflow-probe ' + JSON.stringify({accuracy: drawn('#accuracy-plot'), gantt: drawn('#gantt'),
    curves: drawn('#curves'), confusion: drawn('#confusion'), classLabels: labels, perClass: perClass,
    title: document.title}));
})();
</script>"""


def msaflow(*args, **kw):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300, **kw)


def tiny_pipeline(name):
    return small_pipeline_tiny(ROOT, name)


class Report(TempDirCase):
    @classmethod
    def setUpClass(cls):
        cls.chromium = shutil.which("chromium")

    def run_pipeline(self, name):
        path = self.write(name + ".json", tiny_pipeline(name))
        runs = os.path.join(self.dir, "runs")
        r = msaflow("run", path, "--runs", runs, "--run-id", name)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        return runs, os.path.join(runs, name), r.stdout

    def browse(self, html):
        """The report opened in headless Chromium with PROBE appended: what it laid out. The
        report may log nothing to the console but the probe's line."""
        probe = os.path.join(self.dir, "probe.html")
        with open(probe, "w") as f:
            f.write(html.replace("</body>", PROBE + "</body>"))
        out = subprocess.run([self.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                              "--v=0", "--window-size=1000,3000", f"--user-data-dir={self.dir}/chromium",
                              "--dump-dom", "file://" + probe], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
        probes = [line for line in console if "msaflow-probe" in line]
        self.assertEqual(len(probes), 1, out.stderr[-3000:])
        self.assertEqual(len(console), 1, "the report logged to the console:\n" + "\n".join(console))
        line = re.search(r'msaflow-probe (\{.*\})", source', probes[0]).group(1)
        return json.loads(line.replace('\\"', '"'))

    def test_report_renders_in_chromium_with_a_mark_per_candidate_per_round(self):
        self.assertIsNotNone(self.chromium, "Debian's chromium is not installed (scripts/test.sh installs it)")
        runs, run_dir, _ = self.run_pipeline("rep")
        r = msaflow("report", run_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        report = os.path.join(run_dir, "report.html")
        self.assertEqual(r.stdout.strip(), report)
        with open(report) as f:
            html = f.read()
        self.assertNotIn("<script", html)
        self.assertIsNone(re.search(r"(src|href)=\"(https?:)?//", html), "the report fetches something")
        with open(os.path.join(run_dir, "results.json")) as f:
            results = json.load(f)
        with open(os.path.join(run_dir, "provenance.json")) as f:
            prov = json.load(f)
        expected = sorted(f"mark {rnd['round']}/{c['candidate']['id']}" for rnd in results["rounds"]
                          for c in rnd["candidates"] if c["round"] == rnd["round"])
        self.assertEqual(len(expected), 8)  # 2 rounds x 4 candidates
        seen = self.browse(html)
        self.assertEqual(seen["title"], "msaflow report: rep")
        marks = [i for i in seen["accuracy"]["items"] if i.startswith("mark")]
        self.assertEqual(sum(i.startswith("mark champion ") for i in marks), 1, marks)
        self.assertEqual(sorted("mark " + i.split(" ")[-1] for i in marks), expected)
        tasks = [t["task"] for rnd in prov["rounds"] for t in rnd["tasks"]]
        self.assertEqual(len(tasks), 12)
        self.assertEqual(sorted(seen["gantt"]["items"]), sorted(f"task /{t}" for t in tasks))
        self.assertEqual(len(seen["curves"]["items"]), 8)
        classes = prov["champion"]["confusion"]["classes"]
        self.assertEqual(len(seen["confusion"]["items"]), classes * classes)
        champ = results["champion"]["candidate"]["id"]
        # The confusion matrix is the champion's on the test split: its diagonal is its accuracy.
        m = prov["champion"]["confusion"]["matrix"]
        total = sum(map(sum, m))
        self.assertEqual(total, 200)
        self.assertAlmostEqual(sum(m[i][i] for i in range(classes)) / total, results["result"]["accuracy"])
        self.assertIn(f'data-candidate="{champ}"', html)

    def test_a_folder_datasets_classes_are_named_in_the_round_table_results_and_report(self):
        # Issue 32: three classes told apart by brightness, one with a non-ASCII name. Their
        # names, not 0, 1, 2, wherever a class is shown; the index stays in the JSON.
        import numpy as np
        import cv2
        rng = np.random.default_rng(5)
        names = ["ant", "bee", "écureuil"]
        for split, n in (("train", 16), ("test", 6)):
            for k, cls in enumerate(names):
                os.makedirs(os.path.join(self.dir, split, cls))
                for i in range(n):
                    img = np.clip(60 + 70 * k + rng.normal(0, 12, (8, 8)), 0, 255).astype(np.uint8)
                    cv2.imwrite(os.path.join(self.dir, split, cls, f"{i}.png"), img)
        mobilenet = {"name": "mobilenetv2", "onnx": os.path.join(ROOT, "models", "mobilenet_v2.onnx"),
                     "feature_layer": "block_13_expand_relu",
                     "input": {"height": 32, "width": 32, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}}
        doc = {"name": "named", "backbones": [mobilenet],
               "datasets": {"train": {"format": "folder", "root": os.path.join(self.dir, "train")},
                            "test": {"format": "folder", "root": os.path.join(self.dir, "test")},
                            "validation": {"from": "train", "fraction": 0.25, "seed": 1}},
               "head": {"type": "softmax", "epochs": 10, "lr": 0.05},
               "steps": {"train": {"mode": "independent"}},
               "rounds": {"max": 1, "candidates": 2, "top_k": 1}}
        runs = os.path.join(self.dir, "runs")
        r = msaflow("run", self.write("named.json", doc), "--runs", runs, "--run-id", "named")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        line = [x for x in r.stdout.splitlines() if x.startswith("  per class (validation accuracy):")]
        self.assertEqual(len(line), 1, r.stdout)
        self.assertEqual(re.findall(r" (\S+) [01]\.\d{3} \(\d+\)", line[0]), names)
        with open(os.path.join(runs, "named", "results.json"), encoding="utf-8") as f:
            res = json.load(f)
        self.assertEqual(res["class_names"], names)
        test = res["champion"]["test"]["per_class"]
        self.assertEqual([(c["class_index"], c["class"], c["images"]) for c in test],
                         [(0, "ant", 6), (1, "bee", 6), (2, "écureuil", 6)])
        self.assertAlmostEqual(sum(c["correct"] for c in test) / 18, res["result"]["accuracy"])
        self.assertEqual([c["class"] for c in res["champion"]["per_class"]], names)
        self.assertEqual(sum(c["images"] for c in res["champion"]["per_class"]), 12)  # a quarter of 48
        self.assertEqual(msaflow("report", os.path.join(runs, "named")).returncode, 0)
        with open(os.path.join(runs, "named", "report.html"), encoding="utf-8") as f:
            seen = self.browse(f.read())
        # Each class labels its row (true class) and its column (predicted), inside the drawing.
        self.assertEqual(seen["classLabels"], [n for n in names for _ in ("row", "column")])
        self.assertEqual([row[:3] for row in seen["perClass"]], [["0", "ant", "6"], ["1", "bee", "6"],
                                                                 ["2", "écureuil", "6"]])
        for row, c in zip(seen["perClass"], test):
            self.assertAlmostEqual(float(row[3]), c["accuracy"], places=4)

    def test_status_tables_and_progress_bars_on_a_terminal(self):
        path = self.write("bars.json", tiny_pipeline("bars"))
        runs = os.path.join(self.dir, "runs")
        # On a terminal: bars drawn in place (carriage returns), then the same summary lines.
        pid, fd = pty.fork()
        if pid == 0:
            # A terminal that can draw (a CI runner may have set TERM=dumb, which turns the bar off).
            os.execve(EXE, [EXE, "run", path, "--runs", runs, "--run-id", "bars"], {**os.environ, "TERM": "xterm"})
        out = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 120)
            if not ready:
                break
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, st = os.waitpid(pid, 0)
        text = out.decode(errors="replace")
        self.assertEqual(os.waitstatus_to_exitcode(st), 0, text[-3000:])
        bars = re.findall(r"\r\x1b\[K(round \d/\d \[[#.]+\] +\d+/\d+ tasks[^\r\n]*)", text)
        self.assertGreater(len(bars), 6, text[-3000:])
        self.assertTrue(any("[####################] 6/6 tasks" in b for b in bars), bars[-5:])
        self.assertIn("champion: ", text)
        # Not on a terminal (as in every other test): plain lines, no carriage return.
        again = self.write("plain.json", tiny_pipeline("plain"))
        r = msaflow("run", again, "--runs", runs, "--run-id", "plain")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\r", r.stdout)
        self.assertIn("  train    done in", r.stdout)
        # status: the run's task table, and the runs directory's table of runs.
        st = msaflow("status", os.path.join(runs, "plain"))
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        rows = re.findall(r"^  (r\d-\w+) +(\w+) +(\d+)  (\w+) +(\d+) +([\d.]+)  \d\d:\d\d:\d\d$", st.stdout, re.M)
        self.assertEqual(len(rows), 12, st.stdout)
        self.assertEqual({r[3] for r in rows}, {"done"})
        self.assertEqual({r[0]: r[2] for r in rows}["r1-train"], "2")
        table = msaflow("status", runs)
        self.assertEqual(table.returncode, 0, table.stderr)
        lines = table.stdout.splitlines()
        self.assertTrue(lines[0].startswith("run "), table.stdout)
        self.assertRegex(table.stdout, r"(?m)^bars +finished +2 +12/12 +\d{4}-\d\d-\d\dT[\d:]+ +champion r\d-c\d\d")
        self.assertRegex(table.stdout, r"(?m)^plain +finished +2 +12/12 ")
        self.assertLess(table.stdout.index("\nbars "), table.stdout.index("\nplain "))  # oldest first


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
