"""Notebooks (curriculum §7): one per stage, committed without outputs.

pytest executes them itself (nbmake, see pyproject.toml); this file checks the rest.
"""

import atexit
import json
import sys
from types import SimpleNamespace

import nbformat
import pytest
from nbclient import NotebookClient
from nbmake.pytest_items import NotebookItem

import conftest
from helpers import (KERNEL_DID_NOT_START, ROOT, all_stages,
                     retried_when_the_kernel_does_not_start)

NOTEBOOKS = ROOT / "notebooks"


def test_every_stage_has_a_notebook_and_every_notebook_a_stage():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == all_stages()


@pytest.mark.parametrize("stage", all_stages())
def test_notebook_is_clean_and_loads_its_own_stage(stage):
    notebook = json.loads((NOTEBOOKS / f"{stage}.ipynb").read_text(encoding="utf-8"))
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code_cells)
    assert f'load_stage("{stage}")' in "".join("".join(c["source"]) for c in code_cells)


class Kernel:
    """A notebook item's runtest() whose first `deaths` kernels die before the first cell."""

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


def test_only_notebook_items_get_the_new_kernel_retry():
    assert NotebookItem.nbmake is True          # what the hook recognises nbmake's items by
    notebook, test = Kernel(deaths=1), Kernel(deaths=1)
    items = [SimpleNamespace(nbmake=True, runtest=notebook.runtest),
             SimpleNamespace(runtest=test.runtest)]
    conftest.pytest_collection_modifyitems(None, items)
    with pytest.warns(UserWarning):
        assert items[0].runtest() == "ran"
    with pytest.raises(RuntimeError):
        items[1].runtest()


FLAKY_KERNEL = """\
import os, sys
first_start = os.path.join(os.path.dirname(__file__), "died once")
if not os.path.exists(first_start):
    open(first_start, "w").close()
    sys.exit(1)                      # the first kernel dies before it replies
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[1]])
"""


def test_a_real_kernel_that_dies_before_the_first_cell_is_started_again(tmp_path, monkeypatch):
    # nbclient's own message, from a real kernel that dies once.
    kernel = tmp_path / "jupyter" / "kernels" / "flaky"
    kernel.mkdir(parents=True)
    (kernel / "flaky_kernel.py").write_text(FLAKY_KERNEL, encoding="utf-8")
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(kernel / "flaky_kernel.py"), "{connection_file}"],
        "display_name": "flaky", "language": "python"}), encoding="utf-8")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "one",
                           "metadata": {}, "outputs": [], "source": ["print(6 * 7)"]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "one.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    clients = []

    def run():
        clients.append(NotebookClient(nbformat.read(tmp_path / "one.ipynb", 4),
                                      kernel_name="flaky", timeout=60))
        return clients[-1].execute()

    try:
        with pytest.warns(UserWarning, match=r"did not start \(try 1 of 3\)"):
            executed = retried_when_the_kernel_does_not_start(run)()
    finally:
        # nbclient leaves the dead kernel's clean-up registered for exit, where it fails
        # with an AssertionError (its own bug): unregister it so the run ends quietly.
        for client in clients:
            atexit.unregister(client._cleanup_kernel)
    assert len(clients) == 2
    assert (kernel / "died once").exists()
    assert executed.cells[0].outputs[0]["text"] == "42\n"
