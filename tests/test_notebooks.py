"""Notebooks (curriculum §7): one per stage, committed without outputs.

pytest executes them itself (nbmake, see pyproject.toml); this file checks the rest.
"""

import json

import pytest

from helpers import ROOT, all_stages

NOTEBOOKS = ROOT / "notebooks"


def test_every_stage_has_a_notebook_and_every_notebook_a_stage():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == all_stages()


@pytest.mark.parametrize("stage", all_stages())
def test_notebook_is_clean_and_loads_its_own_stage(stage):
    notebook = json.loads((NOTEBOOKS / f"{stage}.ipynb").read_text(encoding="utf-8"))
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code_cells)
    assert f'load_stage("{stage}")' in "".join("".join(c["source"]) for c in code_cells)
