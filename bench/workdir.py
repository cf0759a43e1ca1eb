"""The benches' work directory: a fresh temporary one removed at the end, or `keep` (made if
missing) left in place with its path printed, for looking at the runs afterwards."""
import contextlib
import pathlib
import shutil
import tempfile


@contextlib.contextmanager
def work_directory(keep, prefix):
    work = pathlib.Path(keep or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
        if keep:
            print(f"\nwork directory: {work}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
