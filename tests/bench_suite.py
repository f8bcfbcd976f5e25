"""How long the test suite takes, what each stage costs, and a projection for more stages.

    python tests/bench_suite.py                  # runs the suite once (-n 2), then reports
    python tests/bench_suite.py --junit FILE     # reports on a run you already made with
                                                 # pytest --junitxml=FILE

Each test's time is charged to the stage in its parameters (s05_context_compression or
hardened/s05_…); a test with no stage, or with several, is "shared". By curriculum §5 a
feature's tests run where the stage introduces it and at the newest stage, and every stage gets
smoke tests, so one more stage adds about one stage's average cost (its feature tests move to
the new newest stage, they do not multiply). The projection for N stages is:

    wall(N) = wall(12) × (shared + N × average stage cost) / (shared + 12 × average stage cost)

Not collected by pytest (no test_ prefix): it runs the suite itself.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = re.compile(r"(?:hardened/)?(s\d\d)_[a-z0-9_]+")


def run_suite(junit: Path) -> float:
    """Run the whole suite as the README says (with -n 2: this machine class); wall seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                    f"--junitxml={junit}", "tests/"], cwd=ROOT, check=False,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def costs(junit: Path) -> tuple[dict, float]:
    """Seconds of test time per stage ("s05"), and the shared rest."""
    per_stage: dict[str, float] = collections.defaultdict(float)
    shared = 0.0
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        seconds = float(case.get("time") or 0)
        stages = set(STAGE.findall(case.get("name", "")))
        if len(stages) == 1:
            per_stage[stages.pop()] += seconds
        else:
            shared += seconds
    return dict(sorted(per_stage.items())), shared


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", type=Path, help="report on this junit XML instead of running")
    parser.add_argument("--wall", type=float, help="the wall time of that run, in seconds")
    parser.add_argument("--stages", type=int, nargs="*", default=[19], help="project for these")
    args = parser.parse_args(argv)
    if args.junit:
        junit, wall = args.junit, args.wall
    else:
        junit = Path(tempfile.mkdtemp()) / "suite.xml"
        wall = run_suite(junit)
    per_stage, shared = costs(junit)
    total = shared + sum(per_stage.values())
    print(f"{'stage':8} {'test seconds':>12}")
    for stage, seconds in per_stage.items():
        print(f"{stage:8} {seconds:12.1f}")
    print(f"{'shared':8} {shared:12.1f}   (build, docs, notebooks, lineage, more than one stage)")
    print(f"{'total':8} {total:12.1f}   test seconds over 2 workers")
    if wall:
        print(f"wall time: {wall:.0f} s for {len(per_stage)} stages")
        average = sum(per_stage.values()) / len(per_stage)
        for count in args.stages:
            projected = wall * (shared + count * average) / (shared + len(per_stage) * average)
            print(f"projection for {count} stages: {projected:.0f} s "
                  f"(average stage {average:.1f} test seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
