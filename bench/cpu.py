"""What this CPU can run: msaflow's bf16 executor needs AVX-512, its int8 executor VNNI
(kernels/executor.cc refuses them elsewhere), so the benches skip those variants there."""
import pathlib


def flags():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def describe():
    """"cpu: <model>, N cores; AVX2 yes, AVX-512 no, VNNI no": the line a bench starts with
    (ratios against PyTorch and scikit-learn differ between CPUs)."""
    import os
    model = "unknown model"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    f = flags()
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    return (f"cpu: {model}, {os.cpu_count()} cores; AVX2 {yes('avx2' in f)}, AVX-512 {yes('avx512f' in f)}, "
            f"VNNI {yes(has_vnni())}")


def has_vnni():
    f = flags()
    return "avx512_vnni" in f or "avx_vnni" in f


def has_avx512():
    return "avx512f" in flags()


def missing_for(precision):
    """Why this CPU cannot run the executor in `precision`, or None when it can."""
    if precision == "int8" and not has_vnni():
        return "this CPU has no VNNI (AVX512_VNNI or AVX-VNNI)"
    if precision == "bf16" and not has_avx512():
        return "this CPU has no AVX-512"
    return None
