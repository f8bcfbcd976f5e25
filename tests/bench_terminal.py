"""Benchmark: the terminal tool's memory and time on a command that never stops printing.

    python tests/bench_terminal.py

`yes` prints hundreds of megabytes per second. The tool keeps only the head and the
tail (BoundedOutput), so the agent's peak memory must stay flat while the command
runs until its timeout and is killed.
"""

import json
import resource
import time

from helpers import load_stage, stages_from


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # kB on Linux


def main() -> None:
    for stage_name in stages_from("s01"):
        stage = load_stage(stage_name)
        before = peak_rss_mb()
        started = time.perf_counter()
        result = json.loads(stage.run_terminal("yes", timeout=3))
        seconds = time.perf_counter() - started
        cut = result["output"].split("... [", 1)[1].split(" characters", 1)[0]
        print(f"{stage_name}: `yes` for 3 s: exit {result['exit_code']}, {int(cut):,} characters "
              f"counted and dropped, returned after {seconds:.1f} s, "
              f"peak memory {before:.0f} MB -> {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
