"""Benchmark: search_files on an ordinary tree, and on a regex that backtracks without end.

    python tests/bench_search.py

The hardened edition's search_files (the teaching edition has no deadline, so only the
hardened stages are measured) runs the regex in a worker process that is killed at
SEARCH_TIMEOUT, so a pattern like `^(a+)+$` (2**40 ways to fail on a line of 40 a's and a b)
costs at most that long. On ordinary searches the worker costs its start-up, about 40 ms; the plain
in-process loop (the old design, which nothing could stop) is shown for comparison.
"""

import json
import re
import tempfile
import time
from pathlib import Path

from helpers import HARDENED, load_stage, stages_from

FILES = 2_000
LINES_PER_FILE = 40


def make_tree(root: Path) -> None:
    for number in range(FILES):
        folder = root / f"pkg{number % 20}" / f"mod{number % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def handle_{number}_{line}(request):\n    return {line}\n"
                       for line in range(LINES_PER_FILE // 2))
        (folder / f"file{number}.py").write_text(body)


def in_process_search(stage, pattern: str, root: Path) -> int:
    regex, found = re.compile(pattern), 0
    for file in stage.searchable_files(root, None, time.monotonic() + 3600):
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            found += bool(regex.search(line))
    return found


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
        root = Path(folder)
        make_tree(root)
        print(f"{FILES:,} files, {FILES * LINES_PER_FILE:,} lines")
        for stage_name in [s for s in stages_from("s02") if s.startswith(HARDENED)]:
            stage = load_stage(stage_name)
            rare = r"def handle_1999_\d+\("           # 20 lines, all in the last file
            result, seconds = timed(stage.search_files, rare, str(root))
            count, plain = timed(in_process_search, stage, rare, root)
            print(f"{stage_name}: search of all files {seconds * 1000:.0f} ms, "
                  f"{len(json.loads(result)['matches'])} matches; the same in-process "
                  f"{plain * 1000:.0f} ms, {count} matches")
            result, seconds = timed(stage.search_files, r"_3\(", str(root), "pkg1/**/file1*.py")
            print(f"{stage_name}: with glob pkg1/**/file1*.py {seconds * 1000:.0f} ms, "
                  f"{len(json.loads(result)['matches'])} matches")
        (root / "bad.txt").write_text(("a" * 40 + "b\n") * 3)
        result, seconds = timed(stage.search_files, r"^(a+)+$", str(root / "bad.txt"))
        print(f"{stage_name}: ^(a+)+$ on 'a'*40+'b' returned after {seconds:.1f} s "
              f"(SEARCH_TIMEOUT {stage.SEARCH_TIMEOUT} s): {json.loads(result)['error'][:40]}…")
        sample = "a" * 22 + "b"
        _, seconds = timed(re.search, r"^(a+)+$", sample)
        print(f"for scale, in-process re.search on 'a'*22+'b' alone: {seconds:.1f} s; "
              f"each extra 'a' doubles it, so 'a'*40+'b' would take days")


if __name__ == "__main__":
    main()
