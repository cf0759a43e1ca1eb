#!/usr/bin/python3
"""bench/simulate_check.py — `msaflow simulate` against measurement (docs/simulate.md, issue 29).

    /usr/bin/python3 bench/simulate_check.py [--exe build-test/msaflow] [--keep DIR] [--hosts]

--hosts adds the same check on the multi-host test cluster (Slurm runs, hetjob and chained, its
fabric measured by bench_comm first) and the verdict over both together. --finetune-hosts checks
fine-tuning rounds there (issue 46: median error <= 15 %): the fine-tuning tests' pipeline
(round 1 heads on frozen MobileNetV2 features, round 2 fine-tuning blocks 11-13 with the head)
calibrated by three runs and predicted in other layouts, data sizes and Slurm modes.

Two calibrating runs of the tiny pipeline (2 training ranks in sync, 2 evaluation ranks, 2
preparation ranks, 1x data; and 1 rank for each, 2x data), then configurations that differ from it in training ranks and mode (independent, sync, async,
hybrid), evaluation and preparation ranks, and data (1x, 2x, 4x): each is run for real on this
machine and predicted by `msaflow simulate --from-runs <the calibrating runs>` with its ranks and
data scale. Prints predicted and measured makespan and the error of each, then the median and
the largest error against the goal (median <= 10 %, none over 25 %), and the CPU. Then the
simulation's speed: the quickstart, run once here, simulated on the 1,000-node machine at
several widths and data sizes, in seconds of wall time per simulated hour (goal: under 1 s).
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import cpu  # noqa: E402
from small_pipeline import finetune_pipeline, tiny_pipeline  # noqa: E402
from workdir import work_directory  # noqa: E402

# (name, train ranks, train mode, evaluate ranks, prepare ranks, data scale)
CONFIGS = [
    ("independent 1 rank", 1, "independent", 1, 1, 1),
    ("independent 2 ranks", 2, "independent", 2, 1, 1),
    ("sync 2 ranks", 2, "sync", 2, 1, 1),
    ("sync 1 rank, eval 1", 1, "sync", 1, 1, 1),
    ("async 2 ranks", 2, "async", 2, 1, 1),
    ("hybrid 4 ranks", 4, "hybrid", 2, 1, 1),
    ("sync 2, prepare 2", 2, "sync", 2, 2, 1),
    ("sync 2, 2x data", 2, "sync", 2, 1, 2),
    ("independent 2, 2x data", 2, "independent", 2, 1, 2),
    ("sync 2, 4x data", 2, "sync", 2, 1, 4),
    ("eval 1, 4x data", 2, "sync", 1, 1, 4),
    ("prepare 2, 4x data", 2, "independent", 2, 2, 4),
]


# On the multi-host test cluster: (name, train ranks, train mode, evaluate ranks, data scale,
# Slurm mode). Prepare keeps one rank; the cluster's six "hosts" share this machine's 2 cores.
HOSTS_CONFIGS = [
    ("hetjob: sync 2, evaluate 2", 2, "sync", 2, 1, "hetjob"),
    ("chained: sync 2, evaluate 2", 2, "sync", 2, 1, "chained"),
    ("hetjob: independent 1, evaluate 1", 1, "independent", 1, 1, "hetjob"),
    ("chained: independent 2, evaluate 2, 2x", 2, "independent", 2, 2, "chained"),
    ("hetjob: sync 2, evaluate 2, 2x", 2, "sync", 2, 2, "hetjob"),
    ("chained: async 2, evaluate 1", 2, "async", 1, 1, "chained"),
]
HOSTS_MACHINE = os.path.join(ROOT, "configs", "machines", "slurm-hosts.json")
CLUSTER = os.path.join(ROOT, "scripts", "slurm-cluster.sh")


def doc_for(name, train_ranks, mode, eval_ranks, prep_ranks, scale):
    doc = tiny_pipeline(ROOT, "simcheck")
    for split in ("train", "test"):
        doc["datasets"][split]["limit"] = int(doc["datasets"][split]["limit"] * scale)
    doc["steps"]["train"] = {"module": "dam", "ranks": train_ranks, "mode": mode}
    if mode == "hybrid":
        doc["steps"]["train"]["groups"] = 2
    doc["steps"]["evaluate"] = {"module": "esb", "ranks": eval_ranks}
    doc["steps"]["prepare"] = {"module": "dam", "ranks": prep_ranks}
    return doc


def run(exe, work, tag, doc, runs=None):
    path = os.path.join(work, tag + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    # Runs of their own: a NAM shared with an earlier run would reuse its features.
    runs = runs or os.path.join(work, "runs-" + tag)
    r = subprocess.run([exe, "run", path, "--runs", runs, "--run-id", tag], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"run {tag} failed: {r.stderr[-2000:]}")
    with open(os.path.join(runs, tag, "results.json")) as f:
        res = json.load(f)
    return path, sum(sum(c["wall_s"] for c in rd["costs"].values()) for rd in res["rounds"])


def compare(exe, name, path, measured, sim_args, width):
    """`msaflow simulate PATH --json SIM_ARGS...` against the measured seconds: prints the row and
    returns the relative error."""
    s = subprocess.run([exe, "simulate", path, "--json", *sim_args], capture_output=True, text=True)
    if s.returncode != 0:
        sys.exit(f"simulate {name} failed: {s.stderr}")
    predicted = json.loads(s.stdout)["makespan_s"]
    err = abs(predicted - measured) / measured
    print(f"{name:<{width}} {predicted:>9.2f}s {measured:>9.2f}s {100 * err:>7.1f}%")
    return err


def hosts_machine(work, mode):
    """slurm-hosts.json with its Slurm mode set and its slurm.conf path made absolute."""
    with open(HOSTS_MACHINE) as f:
        m = json.load(f)
    m["slurm"]["conf"] = os.path.normpath(os.path.join(os.path.dirname(HOSTS_MACHINE), m["slurm"]["conf"]))
    m["slurm"]["mode"] = mode
    path = os.path.join(work, f"slurm-hosts-{mode}.json")
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def round_walls(run_dir):
    """{round: seconds from its start to its end in the journal} (queue waits included)."""
    import datetime
    starts, walls = {}, {}
    with open(os.path.join(run_dir, "journal.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            t = datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
            if e.get("event") == "round-start":
                starts[e["round"]] = t
            elif e.get("event") == "round-end" and e["round"] in starts:
                walls[e["round"]] = t - starts.pop(e["round"])
    return walls


def rounds_wall(run_dir):
    """Seconds from each round's start to its end in the journal (queue waits included), summed."""
    return sum(round_walls(run_dir).values())


def run_on_hosts(exe, work, tag, doc, mode, runs):
    path = os.path.join(work, tag + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    r = subprocess.run([CLUSTER, "login", "--hosts", "--", exe, "run", path, "--machine", hosts_machine(work, mode),
                        "--runs", runs, "--run-id", tag], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"run {tag} failed: {r.stderr[-2000:]}")
    return path, rounds_wall(os.path.join(runs, tag))


def fabric_link(exe):
    """The fabric between two of the cluster's hosts, measured (bench_comm): the simulate options
    every prediction on the cluster gets."""
    comm = subprocess.run([CLUSTER, "login", "--hosts", "--", "srun", "-N", "2", "-n", "2", "-p", "dam",
                           "--mpi=pmix", os.path.join(os.path.dirname(exe), "bench", "bench_comm")],
                          capture_output=True, text=True, timeout=300)
    if comm.returncode != 0:
        sys.exit(f"bench_comm failed: {comm.stderr[-2000:]}")
    fabric = json.loads(comm.stdout.strip().splitlines()[-1])["simulate"]
    link = ["--latency", f"{fabric['latency']:.6g}", "--link-bandwidth", f"{fabric['link_bandwidth']:.6g}"]
    print(f"fabric (bench_comm, dam01-dam02): {' '.join(link)}")
    return link


@contextlib.contextmanager
def on_cluster(exe):
    """The multi-host test cluster up, its fabric measured (fabric_link's options); down after."""
    from slurm_clusters import TestCluster
    cluster = TestCluster(ROOT, HOSTS_MACHINE, hosts=True)
    cluster.up()
    try:
        yield fabric_link(exe)
    finally:
        cluster.down()


def hosts_check(exe, work):
    """--hosts: the same check on the multi-host test cluster, as Slurm runs (hetjob, chained),
    calibrated by two configurations run twice each there (one of the four runs chained), each
    round measured from its start to its end (the queue wait included, as the model has it)."""
    with on_cluster(exe) as link:
        # Each calibrating configuration twice: one Slurm run here moves by up to 2x from the next
        # (a queue wait, a slow first launch), and the calibration pools medians over its runs.
        # Each run in a runs directory (a NAM) of its own, moved into the calibration directory
        # afterwards: a second run over the same NAM would reuse the first one's features and
        # calibrate prepare as doing nothing.
        calib = os.path.join(work, "runs-hosts-calibration")
        os.makedirs(calib, exist_ok=True)

        def calibrating(tag, doc, mode):
            runs = os.path.join(work, "runs-" + tag)
            seconds = run_on_hosts(exe, work, tag, doc, mode, runs)[1]
            os.rename(os.path.join(runs, tag), os.path.join(calib, tag))
            return seconds
        # The second sync run chained: a chained round's jobs wait for the one before, which a
        # hetjob never shows (the calibration measures that wait from chained rounds only).
        b_s = [calibrating(f"hcal-b{k}", doc_for("hcal-b", 1, "independent", 1, 1, 2), "hetjob") for k in range(2)]
        a_s = [calibrating(f"hcal-a{k}", doc_for("hcal-a", 2, "sync", 2, 1, 1), mode)
               for k, mode in enumerate(("hetjob", "chained"))]
        print("calibration on the multi-host cluster: independent 1 rank, evaluate 1, 2x data, hetjob twice: "
              f"{b_s[0]:.2f}, {b_s[1]:.2f} s; sync 2 ranks, evaluate 2, 1x data, hetjob and chained: {a_s[0]:.2f}, "
              f"{a_s[1]:.2f} s (rounds' wall)")
        print(f"{'configuration':<40} {'predicted':>10} {'measured':>10} {'error':>8}")
        errors = []
        for i, (name, tr, mode, ev, scale, slurm) in enumerate(HOSTS_CONFIGS):
            path, measured = run_on_hosts(exe, work, f"h{i}", doc_for(name, tr, mode, ev, 1, scale), slurm,
                                          os.path.join(work, f"runs-h{i}"))
            errors.append(compare(exe, name, path, measured,
                                  ["--machine", hosts_machine(work, slurm), "--from-runs", calib, "--ranks", f"train={tr}",
                                   "--ranks", f"evaluate={ev}", "--ranks", "prepare=1", "--data-scale", str(scale),
                                   "--slurm-mode", slurm, *link], 40))
        verdict(errors)
        return errors


# Fine-tuning on the multi-host cluster: (name, train ranks, train mode, data scale, Slurm mode).
FINETUNE_CONFIGS = [
    ("hetjob: sync 2", 2, "sync", 1, "hetjob"),
    ("chained: sync 2", 2, "sync", 1, "chained"),
    ("hetjob: sync 1, 2x", 1, "sync", 2, "hetjob"),
    ("hetjob: sync 2, 2x", 2, "sync", 2, "hetjob"),
    ("hetjob: independent 2", 2, "independent", 1, "hetjob"),
]


def finetune_doc(name, train_ranks, mode, scale):
    doc = finetune_pipeline(ROOT, "simft")
    for split in ("train", "test"):
        doc["datasets"][split]["limit"] = int(doc["datasets"][split]["limit"] * scale)
    doc["steps"]["train"] = {"module": "dam", "ranks": train_ranks, "mode": mode}
    return doc


def finetune_hosts_check(exe, work):
    """--finetune-hosts: fine-tuning rounds on the multi-host cluster, predicted from three
    calibrating runs there (sync 2 ranks, hetjob and chained; 1 rank at 2x data)."""
    with on_cluster(exe) as link:
        calib = os.path.join(work, "runs-ft-calibration")
        os.makedirs(calib, exist_ok=True)
        measured_cal = []
        # The 1x runs last: the latest run's items are what --data-scale multiplies.
        for tag, ranks, scale, mode in (("ftcal-b", 1, 2, "hetjob"), ("ftcal-a0", 2, 1, "chained"),
                                        ("ftcal-a1", 2, 1, "hetjob")):
            runs = os.path.join(work, "runs-" + tag)
            measured_cal.append(run_on_hosts(exe, work, tag, finetune_doc(tag, ranks, "sync", scale), mode, runs)[1])
            os.rename(os.path.join(runs, tag), os.path.join(calib, tag))
        print("calibration (fine-tuning, rounds' wall): sync 1 rank 2x hetjob {:.2f} s; sync 2 ranks chained "
              "{:.2f} s, hetjob {:.2f} s".format(*measured_cal))
        print(f"{'configuration':<26} {'predicted':>10} {'measured':>10} {'error':>8}   "
              f"{'round 2 (fine-tuning) predicted':>31} {'measured':>9} {'error':>7}")
        errors, ft_errors = [], []
        for i, (name, tr, mode, scale, slurm) in enumerate(FINETUNE_CONFIGS):
            tag = f"ft{i}"
            runs = os.path.join(work, f"runs-{tag}")
            path, measured = run_on_hosts(exe, work, tag, finetune_doc(name, tr, mode, scale), slurm, runs)
            sim = subprocess.run([exe, "simulate", path, "--json", "--machine", hosts_machine(work, slurm), "--from-runs",
                                  calib, "--ranks", f"train={tr}", "--data-scale", str(scale), "--slurm-mode", slurm,
                                  *link], capture_output=True, text=True)
            if sim.returncode != 0:
                sys.exit(f"simulate {name} failed: {sim.stderr}")
            j = json.loads(sim.stdout)
            predicted, ft_predicted = j["makespan_s"], j["rounds"][1]["seconds"]
            ft_measured = round_walls(os.path.join(runs, tag))[2]
            errors.append(abs(predicted - measured) / measured)
            ft_errors.append(abs(ft_predicted - ft_measured) / ft_measured)
            print(f"{name:<26} {predicted:>9.2f}s {measured:>9.2f}s {100 * errors[-1]:>7.1f}%   "
                  f"{ft_predicted:>30.2f}s {ft_measured:>8.2f}s {100 * ft_errors[-1]:>6.1f}%")
        for what, errs in (("whole runs", errors), ("fine-tuning rounds (round 2)", ft_errors)):
            med = statistics.median(errs)
            print(f"{what} on the cluster: median error {100 * med:.1f} % (goal <= 15 %): "
                  f"{'met' if med <= 0.15 else 'NOT met'}; largest {100 * max(errs):.1f} %")
        return errors


def verdict(errors, what=""):
    med, worst = statistics.median(errors), max(errors)
    print(f"{what}median error {100 * med:.1f} % (goal <= 10 %): {'met' if med <= 0.10 else 'NOT met'}; "
          f"largest {100 * worst:.1f} % (goal <= 25 %): {'met' if worst <= 0.25 else 'NOT met'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", default=os.path.join(ROOT, "build-test", "msaflow"))
    ap.add_argument("--keep", metavar="DIR", help="keep the runs in DIR")
    ap.add_argument("--hosts", action="store_true",
                    help="then the same on the multi-host test cluster (Slurm, hetjob and chained), and both together")
    ap.add_argument("--finetune-hosts", action="store_true",
                    help="only fine-tuning rounds on the multi-host test cluster, predicted against measured")
    a = ap.parse_args()
    print(cpu.describe())
    if a.finetune_hosts:
        with work_directory(a.keep, "simcheck-ft") as work:
            finetune_hosts_check(os.path.abspath(a.exe), work)
        return
    with work_directory(a.keep, "simcheck") as work:
        # Two calibrating runs, as docs/simulate.md advises: every divisible step on one rank and
        # on several (one rank starts without mpirun, or in the coordinator; several start through
        # mpirun, and prepare's serial part - its models imported on one thread each - grows from
        # 0.4 s to 1.5 s here), and two data sizes 2x apart (the work that does not grow with the
        # data is fitted apart from the work that does).
        # The 1x run last: the latest run's items are what --data-scale multiplies.
        calib = os.path.join(work, "runs-calibration")
        _, b_s = run(a.exe, work, "cal-b", doc_for("cal-b", 1, "independent", 1, 1, 2), calib)
        _, a_s = run(a.exe, work, "cal-a", doc_for("cal-a", 2, "sync", 2, 2, 1), calib)
        print(f"calibration: sync 2 ranks, evaluate 2, prepare 2, 1x data: {a_s:.2f} s; independent 1 rank, "
              f"evaluate 1, prepare 1, 2x data: {b_s:.2f} s (steps' sums)")
        print(f"{'configuration':<26} {'predicted':>10} {'measured':>10} {'error':>8}")
        errors = []
        for i, (name, tr, mode, ev, pr, scale) in enumerate(CONFIGS):
            path, measured = run(a.exe, work, f"c{i}", doc_for(name, tr, mode, ev, pr, scale))
            errors.append(compare(a.exe, name, path, measured,
                                  ["--from-runs", calib, "--ranks", f"train={tr}", "--ranks", f"evaluate={ev}", "--ranks",
                                   f"prepare={pr}", "--data-scale", str(scale)], 26))
        verdict(errors)
        if a.hosts:
            print()
            hosts = hosts_check(os.path.abspath(a.exe), work)
            verdict(errors + hosts, f"all {len(errors) + len(hosts)} configurations, this machine and the cluster: ")
        speed(a.exe, work)


def speed(exe, work):
    """The quickstart, calibrated by one real run here, simulated on the 1,000-node machine: the
    simulation's own seconds per hour of simulated time (goal: under 1 s, >= 3,600x)."""
    quick = os.path.join(ROOT, "pipelines", "quickstart.json")
    runs = os.path.join(work, "runs-quickstart")
    r = subprocess.run([exe, "run", quick, "--runs", runs, "--run-id", "q"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"quickstart failed: {r.stderr[-2000:]}")
    machine = os.path.join(ROOT, "configs", "machines", "msa-1000.json")
    print(f"\nquickstart on {machine} (1,000 nodes):")
    print(f"{'ranks, data':<64} {'simulated':>10} {'wall':>9} {'actors':>7} {'s per sim. hour':>16}")
    for label, args in [("as the pipeline says", []),
                        ("prepare 64, train 6, evaluate 256", ["--ranks", "prepare=64", "--ranks", "train=6",
                                                               "--ranks", "evaluate=256"]),
                        ("prepare 64, train 6, evaluate 256, 100x data", ["--ranks", "prepare=64", "--ranks", "train=6",
                                                                          "--ranks", "evaluate=256", "--data-scale", "100"]),
                        ("prepare 192, train 64 sync, evaluate 744, 1000x data, 10 rounds",
                         ["--ranks", "prepare=192", "--ranks", "train=64", "--ranks", "evaluate=744",
                          "--data-scale", "1000", "--rounds", "10"])]:
        s = subprocess.run([exe, "simulate", quick, "--from-runs", runs, "--machine", machine, "--json", *args],
                           capture_output=True, text=True)
        if s.returncode != 0:
            sys.exit(f"simulate failed: {s.stderr}")
        d = json.loads(s.stdout)
        sim, wall = d["makespan_s"], d["simulation"]["wall_s"]
        per_hour = wall * 3600 / sim
        print(f"{label:<64} {sim:>9.1f}s {wall:>8.3f}s {d['simulation']['actors']:>7} {per_hour:>12.2f} s "
              f"{'met' if per_hour < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
