"""The Slurm test clusters of scripts/slurm-cluster.sh for a test module: started unless they
run (and then stopped again at the end), SLURM_CONF set from the machine file that uses them."""
import json
import os
import subprocess


class TestCluster:
    def __init__(self, root, machine, hosts=False):
        self.script = os.path.join(root, "scripts", "slurm-cluster.sh")
        self.machine = machine
        self.flags = ["--hosts"] if hosts else []
        self.started = False

    def up(self):
        if subprocess.run([self.script, "status", *self.flags], capture_output=True).returncode != 0:
            r = subprocess.run([self.script, "start", *self.flags], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError("cannot start the test cluster: " + r.stdout + r.stderr)
            self.started = True
        with open(self.machine) as f:
            conf = json.load(f)["slurm"]["conf"]
        os.environ["SLURM_CONF"] = os.path.normpath(os.path.join(os.path.dirname(self.machine), conf))

    def down(self):
        if self.started:
            subprocess.run([self.script, "stop", *self.flags], capture_output=True, timeout=120)
