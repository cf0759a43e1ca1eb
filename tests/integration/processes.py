"""The processes whose command line names a text (a run directory): steps, mpirun, the NAM
server. Shared by the tests that kill runs and check what they leave behind."""
import os


def processes_naming(text):
    """[(pid, command line)] of every process whose command line contains `text`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append((pid, cmd))
    return out
