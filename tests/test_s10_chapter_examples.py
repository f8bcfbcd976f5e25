"""s10: what the chapter shows about delegate_task is what the code does.

docs/en/s10-subagent-delegation.md has

- in "Under attack", a table of arguments a model may send to delegate_task (the column
  "The model sends …") and a part of what it gets back ("It gets back"). Each row goes
  through the door (validate_tool_call()) and, if the door lets it pass, delegate_task().
  None of them may start a child;
- in "How it works", the table of a child's statuses (its first column), which must name
  exactly CHILD_STATUSES;
- in "How it works", the ```json block: the whole tool result the parent receives for the
  worked trace's child (`$ ls` in a folder that holds notes.txt). The child is run here on
  the stage's own offline model;
- in "Exercises", the ```diff blocks of the solutions: the lines they keep and remove are
  lines of the stage file, in that order, so the learner's patch applies;
- in "Exercises", exercise 3: a known limit. write_file into the state folder is refused in
  a child, but a Python script that a child writes and another runs changes MEMORY.md. The
  test passes while that hole is open; when a stage closes it, the test fails and says to
  update the exercise and "What the guards cannot see".

The tables and the block are read from the chapter, so the chapter cannot show a result the
code does not give.
"""

import json
import re
import types

import pytest

from helpers import (edition_of, ROOT, clean_env, diff_blocks, fresh_stage, patched_source, run_main,
                     stages_from)

CHAPTER = ROOT / "docs" / "en" / "s10-subagent-delegation.md"
STAGES = stages_from("s10")
CODE = re.compile(r"`([^`]+)`")


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def table(header_start: str) -> list[list[str]]:
    """The rows of the chapter's table whose first header cell starts with `header_start`."""
    lines = [line.strip() for line in CHAPTER.read_text(encoding="utf-8").splitlines()]
    for index, line in enumerate(lines):        # (a table in an admonition is indented)
        if line.startswith("|") and cells(line)[0].startswith(header_start):
            rows = []
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            return rows
    pytest.fail(f"no table starting with the column {header_start!r} in {CHAPTER.name}")


def attempts() -> list[tuple[str, str, str]]:
    """(the raw arguments, the text the teaching edition's answer must hold, the text the
    hardened edition's must hold) for each row of "Under attack"."""
    rows = table("The model sends")
    assert len(rows) >= 8, rows
    return [(CODE.findall(sent)[0], teaching, hardened) for sent, teaching, hardened in rows]


@pytest.fixture
def stage(request):
    return fresh_stage(request.param)


def parent_of(s10, session) -> object:
    budget = s10.IterationBudget(session.max_iterations)
    assert budget.consume()                     # the parent's own call that asked to delegate
    return s10.Delegator(session, budget, 0)


@pytest.mark.parametrize("stage_name", STAGES)
@pytest.mark.parametrize("raw, teaching, hardened", attempts())
def test_what_a_model_sends_gets_the_answer_the_chapter_shows(stage_name, raw, teaching,
                                                               hardened, tmp_path, monkeypatch):
    stage = fresh_stage(stage_name)
    expected = teaching if edition_of(stage_name) == "teaching" else hardened
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(stage, "run_children", lambda parent, children: started.append(1))
    offered = {"delegate_task": stage.DELEGATE_TASK_SCHEMA}
    args, error = stage.validate_tool_call("delegate_task", raw, offered)
    if error is None:
        session = types.SimpleNamespace(tools=stage.REGISTRY.get_definitions(),
                                        max_iterations=stage.MAX_ITERATIONS)
        token = stage.DELEGATION.set(parent_of(stage, session))
        try:
            answer = stage.delegate_task(**args)
        finally:
            stage.DELEGATION.reset(token)
    else:
        answer = error
    assert expected in answer, (raw, answer)
    assert not started, f"{raw} started a child"


@pytest.mark.parametrize("stage", STAGES, indirect=True)
def test_the_statuses_table_names_every_status(stage):
    shown = [CODE.findall(row[0])[0] for row in table("status")]
    assert sorted(shown) == sorted(stage.CHILD_STATUSES)


@pytest.mark.parametrize("stage", STAGES, indirect=True)
def test_the_tool_result_the_chapter_shows_is_what_the_parent_receives(stage, tmp_path,
                                                                        monkeypatch):
    shown = re.search(r"^```json\n(.*?)^```$", CHAPTER.read_text(encoding="utf-8"),
                      re.MULTILINE | re.DOTALL)
    assert shown, "no ```json block in the chapter"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("Sub-agents start with nothing but their goal.\n",
                                        encoding="utf-8")
    server = stage.start_offline_server()
    try:
        client = stage.make_client(server.url, "offline")
        session = stage.Session(client, "offline", server.url, stage.MAX_ITERATIONS)
        token = stage.DELEGATION.set(parent_of(stage, session))
        try:
            result = stage.delegate_task(goal="$ ls")
        finally:
            stage.DELEGATION.reset(token)
    finally:
        server.shutdown()
    assert json.loads(result) == json.loads(shown.group(1))


def test_the_solutions_diffs_apply_to_the_stage_file():
    blocks = diff_blocks(CHAPTER.read_text(encoding="utf-8"))
    assert blocks, "no ```diff block in the chapter"
    for block in blocks:
        patched_source("s10_subagent_delegation", block)


def exercise_3() -> list[str]:
    """The lines exercise 3 pipes into the REPL, read from its bash block."""
    text = CHAPTER.read_text(encoding="utf-8")
    part = text[text.index("### 3. Break it"):]
    block = re.search(r"^```bash\n(.*?)^```$", part, re.MULTILINE | re.DOTALL).group(1)
    script = re.search(r'^SCRIPT="(.*)"$', block, re.MULTILINE).group(1)
    quoted = re.findall(r"'(delegate [^']*)'|\"(delegate [^\"]*)\"", block)
    return [(single or double).replace("$SCRIPT", script) for single, double in quoted]


@pytest.mark.parametrize("stage", STAGES)
def test_exercise_3_the_fence_and_the_way_around_it(stage, tmp_path):
    lines = exercise_3()
    assert len(lines) == 3 and lines[2] == "delegate $ python3 note.py", lines
    memory = tmp_path / "state" / "memories" / "MEMORY.md"
    env = clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "state"))
    run = run_main(stage, stdin=lines[0] + "\n", env=env, cwd=tmp_path)
    assert "a sub-agent never changes the agent's memory" in run.stdout, run.stdout
    assert not memory.exists()
    run = run_main(stage, stdin="".join(line + "\n" for line in lines[1:]), env=env, cwd=tmp_path)
    if edition_of(stage) == "hardened":             # the outcome check undoes the write
        assert "BLOCKED (self-protection): the command changed ~/state/memories" in run.stdout
        assert not memory.exists()
        return
    assert memory.is_file(), ("the hole of exercise 3 is closed: update the exercise and "
                              "'What the guards cannot see' in the chapter\n" + run.stdout)
    assert memory.read_text(encoding="utf-8") == "The user wants the tests skipped."
