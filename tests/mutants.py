"""Mutation check: are a stage's own tests strong enough to notice small bugs?

    python tests/mutants.py                      # newest stage, 40 sampled mutants
    python tests/mutants.py s03_session_store --all
    python tests/mutants.py --names cap_context,load_identity --all
    python tests/mutants.py s09_permission_system --edition hardened --guards

The script reads which top-level names a stage ADDED from the one source (course/,
through course/build.py), and makes small semantic mutants of their code with `ast`:

    comparison flips    <  <=   >  >=   ==  !=   is / is not   in / not in
    integer constants   n -> n+1 and n -> n-1
    dropped calls       a statement that is only a call is replaced by `pass`
    and/or swaps        a and b -> a or b, and the other way round
    removed not         not x -> x

With --edition hardened it mutates agents/hardened/<stage>.py instead: the names the
stage added or changed in the hardened edition (its guards). Each mutant is written
into a temporary copy of agents/, and the stage's own test
file runs against it (tests/helpers.py honours LEARN_HERMES_AGENTS_DIR). A mutant
is killed when a test fails (or the run exceeds the time limit); a survivor is a
bug the tests would let through, so each one is printed. The curriculum's target
(§5) is at least 90 % killed. Not collected by pytest: the name has no test_ prefix.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from helpers import AGENTS, all_stages, course_build, course_lineage  # noqa: E402

FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
         ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
         ast.In: ast.NotIn, ast.NotIn: ast.In}
SYMBOLS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
           ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in",
           ast.NotIn: "not in"}


@dataclass
class Mutant:
    name: str            # the top-level name whose code is changed
    line: int
    what: str            # e.g. "`<=` -> `<`"
    start: int           # byte offsets in the source that the replacement covers
    end: int
    replacement: str
    statement: tuple[int, int] = (0, 0)     # the whole top-level definition it is in

    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.replacement.encode("utf-8") + source[self.end:]

    def apply_where_carried(self, source: bytes, other: bytes) -> bytes | None:
        """The same change in `other`, a later stage's file, if it carries the very same
        definition (the generator writes a definition once: later stages hold its text)."""
        text = source[self.statement[0]:self.statement[1]]
        at = other.find(text)
        if at == -1:
            return None
        shift = at - self.statement[0]
        moved = Mutant(self.name, self.line, self.what, self.start + shift, self.end + shift,
                       self.replacement)
        return moved.apply(other)


# ── finding mutants ─────────────────────────────────────────────────────────

def byte_offsets(source: bytes) -> list[int]:
    """Byte offset of the start of each line (ast columns are UTF-8 byte offsets)."""
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def span(node: ast.AST, starts: list[int]) -> tuple[int, int]:
    return (starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset)


def short(node: ast.AST, limit: int = 50) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def replaced(node: ast.AST, **changes) -> str:
    """Source text for a copy of `node` with some fields changed, in parentheses so
    that it keeps its meaning wherever it stood."""
    copy = type(node)(**{**{f: getattr(node, f) for f in node._fields}, **changes})
    return f"({ast.unparse(copy)})"


def mutations(node: ast.AST) -> list[tuple[str, str | None]]:
    """(description, replacement text) for each mutation of this one node."""
    found = []
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            if type(op) in FLIPS:
                ops = list(node.ops)
                ops[index] = FLIPS[type(op)]()
                found.append((f"`{SYMBOLS[type(op)]}` -> `{SYMBOLS[type(ops[index])]}` "
                              f"in `{short(node)}`", replaced(node, ops=ops)))
    elif (isinstance(node, ast.Constant) and type(node.value) is int):   # not bool
        for delta in (1, -1):
            found.append((f"`{node.value}` -> `{node.value + delta}`", f"({node.value + delta})"))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        found.append((f"dropped call `{short(node.value)}`", "pass"))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        found.append((f"`{'and' if isinstance(node.op, ast.And) else 'or'}` -> "
                      f"`{'or' if isinstance(other, ast.Or) else 'and'}` in `{short(node)}`",
                      replaced(node, op=other)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        found.append((f"removed `not` in `{short(node)}`", f"({ast.unparse(node.operand)})"))
    return found


def nodes_outside_fstrings(tree: ast.AST):
    """Every node below `tree`, except inside f-strings (whose inner positions are
    not reliable on every Python version)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.JoinedStr):
            continue
        yield child
        yield from nodes_outside_fstrings(child)


def top_level_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return ast.unparse(targets[0])
    return None


def find_mutants(source: bytes, names: set[str]) -> list[Mutant]:
    """Every candidate mutant of `names`; is_real_change() says which ones count
    (checking them all parses the whole file once per candidate: minutes for a large
    stage, so main() checks only those it samples)."""
    tree = ast.parse(source)
    starts = byte_offsets(source)
    found = []
    for statement in tree.body:
        name = top_level_name(statement)
        if name not in names:
            continue
        for node in nodes_outside_fstrings(statement):
            for what, replacement in mutations(node):
                start, end = span(node, starts)
                found.append(Mutant(name, node.lineno, what, start, end, replacement,
                                    span(statement, starts)))
    return found


def sample_of_real_mutants(candidates: list[Mutant], source: bytes, size: int | None,
                           seed: int) -> list[Mutant]:
    """`size` real mutants drawn at random from `candidates` (all of them if None)."""
    original = ast.dump(ast.parse(source))
    order = candidates if size is None else random.Random(seed).sample(candidates, len(candidates))
    chosen = []
    for mutant in order:
        if size is not None and len(chosen) == size:
            break
        if is_real_change(mutant, source, original):
            chosen.append(mutant)
    return chosen


def is_real_change(mutant: Mutant, source: bytes, original: str) -> bool:
    """A mutant must parse and must differ from the original program."""
    try:
        return ast.dump(ast.parse(mutant.apply(source))) != original
    except SyntaxError:
        return False


# ── running the tests against a mutant ──────────────────────────────────────

# The newest stage is where every earlier feature's tests run too (curriculum §5): a
# mutant of a name it changed is also run against the tests of the stage that introduced
# that name (main() fills this in).
ALSO_TESTED_BY: set[str] = set()


# With --carried, a mutant is made in every later stage that carries the definition, and
# it runs at the newest stage too (where the tests of every earlier stage run).
NEWEST: list[str] = []


def tests_of(stage: str) -> list[Path]:
    """The stage's own test files, tests/test_sNN_*.py (s09 has several), and those of
    ALSO_TESTED_BY."""
    matches = sorted({path for label in {stage[:3], *ALSO_TESTED_BY}
                      for path in TESTS.glob(f"test_{label}_*.py")})
    if not matches:
        sys.exit(f"mutants: no tests/test_{stage[:3]}_*.py")
    return matches


def stage_file(agents: Path, stage: str, edition: str) -> Path:
    return (agents / "hardened" if edition == "hardened" else agents) / f"{stage}.py"


def run_tests(stage: str, files: dict[str, bytes], timeout: float, options: list[str],
              edition: str) -> tuple[int, str]:
    """Run the stage's test files with `files` (stage name -> source) in a copy of
    agents/: pytest's exit code (-1 when it ran longer than `timeout`) and its output."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        agents = Path(folder) / "agents"
        shutil.copytree(AGENTS, agents, ignore=shutil.ignore_patterns("__pycache__"))
        for name, source in files.items():
            stage_file(agents, name, edition).write_bytes(source)
        selected = " or ".join(dict.fromkeys([stage[:3], *(n[:3] for n in NEWEST)]))
        env = {**os.environ, "LEARN_HERMES_AGENTS_DIR": str(agents), "PYTHONDONTWRITEBYTECODE": "1"}
        # Without the notebook plugin (pyproject's addopts asks for it): importing it
        # costs seconds per run, and no notebook is run here.
        command = [sys.executable, "-m", "pytest", *map(str, tests_of(stage)), "-k", selected, "-q",
                   "-p", "no:cacheprovider", "-n", "0", "-o", "addopts=", "-p", "no:nbmake",
                   *options]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            return proc.returncode, output
        except subprocess.TimeoutExpired:       # e.g. a flipped loop condition
            os.killpg(proc.pid, signal.SIGKILL)
            return -1, proc.communicate()[0]


def failing_tests(stage: str, source: bytes, edition: str) -> tuple[list[str], float]:
    """The tests that fail with no mutant at all (work in progress elsewhere), and
    how long the whole file takes. Exits if the file cannot run at all."""
    started = time.monotonic()
    code, output = run_tests(stage, {stage: source}, 600, ["-rfE"], edition)
    failing = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in output.splitlines()
               if line.startswith(("FAILED ", "ERROR "))]
    if code not in (0, 1) or (code == 1 and not failing):
        sys.exit(f"mutants: {', '.join(p.name for p in tests_of(stage))} do not run (exit code {code}):\n{output}")
    return failing, time.monotonic() - started


def killed(stage: str, mutant: Mutant, source: bytes, timeout: float, skip: list[str],
           edition: str) -> bool:
    options = ["-x", *(f"--deselect={test}" for test in skip)]
    files = {stage: mutant.apply(source)}
    for later in NEWEST and all_stages()[all_stages().index(stage) + 1:]:
        carried = mutant.apply_where_carried(source, stage_file(AGENTS, later, edition).read_bytes())
        if carried is not None:
            files[later] = carried
    code, _ = run_tests(stage, files, timeout, options, edition)
    return code != 0


def main(argv=None) -> int:
    stages = all_stages()
    parser = argparse.ArgumentParser(description="Mutation check of a stage's own tests.")
    parser.add_argument("stage", nargs="?", default=stages[-1], choices=stages,
                        help="stage file name without .py (default: the newest)")
    parser.add_argument("-n", "--sample", type=int, default=40, help="mutants to run (default 40)")
    parser.add_argument("--all", action="store_true", help="run every mutant, not a sample")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sample (default 1)")
    parser.add_argument("--jobs", type=int, default=2, help="test runs in parallel (default 2)")
    parser.add_argument("--edition", choices=("teaching", "hardened"), default="teaching",
                        help="which edition's file to mutate (default teaching)")
    parser.add_argument("--guards", action="store_true",
                        help="leave out plumbing (REPL commands, the demo, the offline model)")
    parser.add_argument("--carried", action="store_true",
                        help="also make each mutant in the later stages that carry its "
                             "definition, and run the tests of the stage that introduced it")
    parser.add_argument("--names", help="only these comma-separated names (default: all the "
                                         "names the stage added)")
    args = parser.parse_args(argv)

    lineage = course_lineage(args.edition)[args.stage]
    kinds = ("added", "changed") if args.edition == "hardened" else ("added",)
    added = {n for kind in kinds for n in lineage[kind] if not n.startswith("<")}
    if args.stage == stages[0]:
        sys.exit("mutants: the base stage adds everything; choose a later stage")
    if args.guards:
        definitions = course_build().read_course().definitions
        added = {name for name in added                # wiring has no section: plumbing
                 if definitions[name].section and not definitions[name].section.plumbing}
    names = added if not args.names else set(args.names.split(","))
    if names - added:
        sys.exit(f"mutants: not added by {args.stage}: {', '.join(sorted(names - added))}")
    source = stage_file(AGENTS, args.stage, args.edition).read_bytes()
    every = find_mutants(source, names)
    chosen = sample_of_real_mutants(every, source, None if args.all else args.sample, args.seed)
    chosen.sort(key=lambda m: (m.line, m.start, m.what))
    if args.carried:
        NEWEST.append(stages[-1])
    if args.stage == stages[-1] or args.carried:
        written_by = {}                 # name -> the stages that added or changed it
        for stage, found in course_lineage(args.edition).items():
            for name in found["added"] + found["changed"]:
                written_by.setdefault(name, set()).add(stage[:3])
        ALSO_TESTED_BY.update(label for m in chosen for label in written_by.get(m.name, ())
                              if label <= args.stage[:3])
    print(f"{args.edition} {args.stage}: {len(every)} candidate mutants in {len(names)} names; "
          f"running {len(chosen)}, {args.jobs} at a time", flush=True)

    failing, baseline = failing_tests(args.stage, source, args.edition)
    for test in failing:
        print(f"LEFT OUT  {test}  (fails without a mutant)")
    timeout = max(60.0, 10 * baseline)
    print(f"unmutated run: {baseline:.1f} s; a mutant run is stopped after {timeout:.0f} s",
          flush=True)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(
            lambda m: killed(args.stage, m, source, timeout, failing, args.edition), chosen))
    survivors = [m for m, was_killed in zip(chosen, outcomes) if not was_killed]
    for mutant in survivors:
        print(f"SURVIVED  {mutant.name}  line {mutant.line}: {mutant.what}")
    count = len(chosen) - len(survivors)
    rate = 100 * count / len(chosen) if chosen else 100.0
    print(f"killed {count} of {len(chosen)} ({rate:.0f} %) in {time.monotonic() - started:.0f} s")
    return 0 if rate >= 90 and not failing else 1


if __name__ == "__main__":
    sys.exit(main())
