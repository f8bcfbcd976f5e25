"""Benchmark of s12's checkpoints on a tree of 10,000 files.

    python tests/bench_checkpoints.py

A temporary project of 100 folders with 100 small .py files each (and a pyproject.toml,
the marker that makes it a project), and a temporary state
folder: the first snapshot, an incremental snapshot after one file changed, a check
that finds nothing changed, and a full restore to the first checkpoint (which takes a
pre-rollback checkpoint first, as /rollback does). Each step runs through the real
CheckpointManager, so every git call and the Python around them count. The target
(issue 12): an incremental snapshot under 250 ms. Like timeit, the verdict uses the
best of a few rounds: other processes on a shared machine only ever add time.
Not collected by pytest: the name has no test_ prefix.
"""

import shutil
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from helpers import load_stage  # noqa: E402

FOLDERS, FILES_PER_FOLDER = 100, 100
ROUNDS = 3
TARGET_SECONDS = 0.25                   # incremental snapshot


def make_tree(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'bench'\n")  # it is a project
    for folder in range(FOLDERS):
        (root / f"pkg{folder:03d}").mkdir(parents=True)
        for number in range(FILES_PER_FOLDER):
            (root / f"pkg{folder:03d}" / f"mod{number:03d}.py").write_text(
                f"def f{number}():\n    return {folder * FILES_PER_FOLDER + number}\n")


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def one_round(stage, workspace: Path) -> dict:
    project, home = workspace / "project", workspace / "state"
    make_tree(project)
    manager = stage.CheckpointManager(project, home)
    times = {}
    times["first snapshot"], first = timed(manager.snapshot, "first")
    changed = project / "pkg050" / "mod050.py"
    changed.write_text("changed = True\n")
    times["incremental, 1 file changed"], second = timed(manager.snapshot, "one change")
    times["no change"], nothing = timed(manager.snapshot, "nothing")
    assert first and second and nothing is None, (first, second, nothing)
    times["full restore to the first"], _ = timed(manager.restore, first)
    assert changed.read_text().startswith("def f50"), "the restore did not restore"
    return times


def main() -> int:
    stage = load_stage("s12_checkpoints")
    if shutil.which("git") is None:
        print("git is not installed: nothing to measure")
        return 1
    rounds = []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory(prefix="bench-checkpoints-") as folder:
            rounds.append(one_round(stage, Path(folder)))
    print(f"{FOLDERS * FILES_PER_FOLDER:,} files, {ROUNDS} rounds (best, then all):")
    for step in rounds[0]:
        seconds = [r[step] for r in rounds]
        print(f"  {step:<30} {min(seconds) * 1000:8.0f} ms   "
              f"({', '.join(f'{s * 1000:.0f}' for s in seconds)})")
    best = min(r["incremental, 1 file changed"] for r in rounds)
    verdict = "met" if best < TARGET_SECONDS else "MISSED"
    print(f"target: incremental under {TARGET_SECONDS * 1000:.0f} ms: {verdict} "
          f"({best * 1000:.0f} ms)")
    return 0 if best < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
