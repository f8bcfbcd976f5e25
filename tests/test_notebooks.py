"""Notebooks (curriculum §7): one per stage, committed without outputs, each with one
exercise whose solution is kept outside it, in notebooks/solutions/<stage>.py.

The exercise: exactly one line `name = ...  # EXERCISE: …` (the value is `...`), and right
after its cell a checking cell that starts with `if name is ...:`, prints "not solved yet"
for the placeholder, and otherwise asserts and prints a line ending in "all checks pass". So
Run All completes in class. The solution file holds what replaces that one line.

Each notebook is executed once, in one kernel, from notebooks/ as Jupyter runs it: every
cell, top to bottom (the checking cell must say "not solved yet"); then, in the same kernel,
the exercise cell with the solution put in and the checking cell again (it must pass). That
is also how a class uses it: Run All, then solve the exercise and run its two cells again.
"""

import ast
import copy
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers import (KERNEL_DID_NOT_START, ROOT, all_stages,
                     retried_when_the_kernel_does_not_start)

NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
EXERCISE_MARK = "# EXERCISE"
EXERCISE_LINE = re.compile(r"(?P<name>[A-Za-z_]\w*) = \.\.\.  # EXERCISE: \S.*")
NOT_SOLVED = "not solved yet"
SOLVED = "all checks pass"
CELL_TIMEOUT = 60               # seconds for one cell; the course's cells take a few at most


@dataclass
class Exercise:
    cell: int                   # index of the cell holding the exercise line
    check: int                  # index of its checking cell: the next code cell
    line: str                   # the exercise line, as committed
    name: str                   # what it assigns: `...` until the exercise is solved


def exercise_of(notebook) -> Exercise:
    """The notebook's one exercise; AssertionError when it is not as §7 describes it."""
    marked = [(index, line) for index, cell in enumerate(notebook.cells)
              if cell.cell_type == "code"
              for line in cell.source.splitlines() if EXERCISE_MARK in line]
    assert len(marked) == 1, f"one line marked {EXERCISE_MARK!r}, not {len(marked)}: {marked}"
    index, line = marked[0]
    found = EXERCISE_LINE.fullmatch(line)
    assert found, f"the exercise line is not `name = ...  # EXERCISE: …`: {line!r}"
    check = next((i for i in range(index + 1, len(notebook.cells))
                  if notebook.cells[i].cell_type == "code"), None)
    assert check is not None, "no checking cell after the exercise"
    return Exercise(index, check, line, found["name"])


def solution_of(stage: str) -> str:
    return (SOLUTIONS / f"{stage}.py").read_text(encoding="utf-8").rstrip("\n")


def solved_cell(cell, exercise: Exercise, solution: str):
    """The exercise cell with the solution in place of the exercise line."""
    solved = copy.deepcopy(cell)
    lines = solved.source.splitlines()
    lines[lines.index(exercise.line)] = solution
    solved.source = "\n".join(lines)
    return solved


def printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs
                   if output.output_type == "stream" and output.name == "stdout")


def run_with_and_without_solution(path: Path, solution: str,
                                  kernel_name: str | None = None) -> tuple[str, str]:
    """Execute the notebook at `path` in one kernel: every cell, then its exercise cell with
    `solution` in place of the exercise line, and its checking cell again. Returns what the
    checking cell printed each time. A cell that fails raises CellExecutionError. A kernel
    that dies before it replies to kernel_info (nothing has run yet) is started again, up to
    3 tries (helpers.retried_when_the_kernel_does_not_start); nothing else is retried."""
    def run():
        notebook = nbformat.read(path, as_version=4)
        exercise = exercise_of(notebook)
        client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name=kernel_name or
                                notebook.metadata.get("kernelspec", {}).get("name", "python3"))
        with client.setup_kernel(cwd=str(path.parent)):
            for index, cell in enumerate(notebook.cells):
                client.execute_cell(cell, index)
            unsolved = printed(notebook.cells[exercise.check])
            client.execute_cell(solved_cell(notebook.cells[exercise.cell], exercise, solution),
                                exercise.cell)
            check = copy.deepcopy(notebook.cells[exercise.check])
            client.execute_cell(check, exercise.check)
            return unsolved, printed(check)
    return retried_when_the_kernel_does_not_start(run)()


def test_every_stage_has_a_notebook_and_a_solution_and_nothing_else():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == all_stages()
    assert sorted(p.name for p in SOLUTIONS.iterdir()) == [f"{s}.py" for s in all_stages()]


@pytest.mark.parametrize("stage", all_stages())
def test_notebook_is_clean_and_loads_its_own_stage(stage):
    notebook = nbformat.read(NOTEBOOKS / f"{stage}.ipynb", as_version=4)
    nbformat.validate(notebook)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code_cells)
    assert f'load_stage("{stage}")' in "".join(c.source for c in code_cells)


@pytest.mark.parametrize("stage", all_stages())
def test_the_committed_notebook_holds_the_exercise_and_not_its_solution(stage):
    notebook = nbformat.read(NOTEBOOKS / f"{stage}.ipynb", as_version=4)
    exercise = exercise_of(notebook)
    assert notebook.cells[exercise.check].source.startswith(f"if {exercise.name} is ...:\n")
    solution = solution_of(stage)
    # The solution replaces the line: it (re)defines the same name, and is no placeholder.
    tree = ast.parse(solution)
    defined = {target.id for node in tree.body if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Name)}
    defined |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert exercise.name in defined, f"{SOLUTIONS.name}/{stage}.py does not define {exercise.name}"
    assert EXERCISE_MARK not in solution and "= ..." not in solution
    # Nor does the notebook hold the solution's code (its def lines and docstrings aside:
    # the exercise line may name the function it asks for).
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    body = [line.strip() for line in solution.splitlines()
            if not line.strip().startswith(("def ", '"""'))]
    assert not [line for line in body if len(line) > 20 and line in code]


@pytest.mark.parametrize("stage", all_stages())
def test_the_notebook_runs_and_its_check_passes_only_with_the_solution(stage):
    unsolved, solved = run_with_and_without_solution(NOTEBOOKS / f"{stage}.ipynb",
                                                     solution_of(stage))
    assert NOT_SOLVED in unsolved and SOLVED not in unsolved, unsolved
    assert solved.rstrip("\n").splitlines()[-1].endswith(SOLVED), solved
    assert NOT_SOLVED not in solved


class Kernel:
    """A run whose first `deaths` kernels die before the first cell."""

    def __init__(self, deaths: int, error: Exception | None = None):
        self.deaths, self.calls = deaths, 0
        self.error = error or RuntimeError(f"{KERNEL_DID_NOT_START}\n(zmq: Address in use)")

    def runtest(self):
        self.calls += 1
        if self.calls <= self.deaths:
            raise self.error
        return "ran"


def test_a_notebook_whose_kernel_died_before_the_first_cell_runs_with_a_new_kernel():
    kernel = Kernel(deaths=2)
    with pytest.warns(UserWarning) as warned:
        assert retried_when_the_kernel_does_not_start(kernel.runtest)() == "ran"
    assert kernel.calls == 3
    assert [str(w.message) for w in warned] == [
        f"the notebook's kernel did not start (try {n} of 3); starting a new one" for n in (1, 2)]


def test_a_kernel_that_never_starts_fails_after_three_tries():
    kernel = Kernel(deaths=99)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=KERNEL_DID_NOT_START):
        retried_when_the_kernel_does_not_start(kernel.runtest)()
    assert kernel.calls == 3


@pytest.mark.parametrize("error", [RuntimeError("a cell failed"), ValueError(KERNEL_DID_NOT_START)])
def test_any_other_failure_of_a_notebook_fails_at_once(error):
    kernel = Kernel(deaths=1, error=error)
    with pytest.raises(type(error)):
        retried_when_the_kernel_does_not_start(kernel.runtest)()
    assert kernel.calls == 1


def small_notebook(folder: Path, check: str) -> Path:
    """An exercise notebook of two cells: `answer = ...`, and a checking cell."""
    cells = [nbformat.v4.new_code_cell("answer = ...  # EXERCISE: six times seven", id="one"),
             nbformat.v4.new_code_cell(check, id="two")]
    notebook = nbformat.v4.new_notebook(cells=cells)
    nbformat.write(notebook, folder / "small.ipynb")
    return folder / "small.ipynb"


SMALL_CHECK = """\
if answer is ...:
    print("not solved yet")
else:
    assert answer == 42
    print("exercise: all checks pass")"""


FLAKY_KERNEL = """\
import os, sys
first_start = os.path.join(os.path.dirname(__file__), "died once")
if not os.path.exists(first_start):
    open(first_start, "w").close()
    sys.exit(1)                      # the first kernel dies before it replies
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[1]])
"""


def test_a_real_kernel_that_dies_before_the_first_cell_is_started_again(tmp_path, monkeypatch):
    # nbclient's own message, from a real kernel that dies once, through the notebooks' runner.
    kernel = tmp_path / "jupyter" / "kernels" / "flaky"
    kernel.mkdir(parents=True)
    (kernel / "flaky_kernel.py").write_text(FLAKY_KERNEL, encoding="utf-8")
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(kernel / "flaky_kernel.py"), "{connection_file}"],
        "display_name": "flaky", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    path = small_notebook(tmp_path, SMALL_CHECK)
    with pytest.warns(UserWarning, match=r"did not start \(try 1 of 3\)") as warned:
        printed_by_check = run_with_and_without_solution(path, "answer = 6 * 7", "flaky")
    assert len(warned) == 1 and (kernel / "died once").exists()
    assert printed_by_check == ("not solved yet\n", "exercise: all checks pass\n")


def test_a_cell_that_fails_fails_the_run_at_once(tmp_path):
    # A wrong solution: the checking cell raises, and nothing is run again.
    runs = tmp_path / "runs.txt"
    check = f"open({str(runs)!r}, 'a').write('ran\\n')\n" + SMALL_CHECK
    with pytest.raises(CellExecutionError, match="AssertionError"):
        run_with_and_without_solution(small_notebook(tmp_path, check), "answer = 6 * 9")
    assert runs.read_text() == "ran\n" * 2          # once unsolved, once with the wrong answer
