"""Benchmark: the s04 injection scanner on large and hostile context files.

    python tests/bench_scanner.py

Prints, for each input, the time find_injection() takes on every stage that has it.
Near-miss inputs repeat the start of a pattern 65,536 characters long, the kind of
text that makes a careless regular expression backtrack for minutes.
"""

import time

from helpers import load_stage, stages_from

NEAR_MISSES = ["ignore all ", "disregard your\n", "act as if you no ", "do not tell ",
               "<!-- ignore ", "<!--system", '<div style="', "<a style = ", "curl $", "cat a ",
               "<!-- "]


def timed(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def main() -> None:
    ordinary = "Run pytest before committing. Use 4-space indentation.\n" * 1_200
    for stage_name in stages_from("s04"):
        stage = load_stage(stage_name)
        print(f"{stage_name}: find_injection() on {stage.CONTEXT_FILE_MAX_CHARS:,}-char limit files")
        print(f"  ordinary AGENTS.md, {len(ordinary):,} chars: "
              f"{timed(stage.find_injection, ordinary) * 1000:8.1f} ms")
        worst = 0.0
        for unit in NEAR_MISSES:
            hostile = (unit * 65_536)[:65_536]
            seconds = timed(stage.find_injection, hostile)
            worst = max(worst, seconds)
            print(f"  near-miss {unit!r:22} 65,536 chars: {seconds * 1000:8.1f} ms")
        print(f"  worst case: {worst * 1000:.1f} ms")


if __name__ == "__main__":
    main()
