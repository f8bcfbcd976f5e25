"""Worked traces (curriculum §6.3): every trace in a chapter is what the stage really does.

tests/traces.py runs the stage on the marker's input and renders the steps; a chapter whose
block differs from a fresh run is stale. Regenerate with `python tests/traces.py`.
"""

import difflib
import re

import pytest

import traces
from helpers import ROOT, all_stages, stages_from

CHAPTERS = sorted({page.name for page in traces.trace_pages()})


def stale_report(where: str, old: str, new: str) -> str:
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "in the chapter",
                                "a fresh run", lineterm="", n=1)
    return (f"{where}: a worked trace is stale; run `python tests/traces.py`\n"
            + "\n".join(list(diff)[:40]))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_traces_are_up_to_date(chapter):
    cache: dict = {}                        # one run per trace, shared by the languages
    for page in sorted(traces.DOCS.glob(f"*/{chapter}")):
        where = str(page.relative_to(ROOT))
        text = page.read_text(encoding="utf-8")
        fresh = traces.updated_text(text, where, cache=cache)
        assert fresh == text, stale_report(where, text, fresh)


def test_a_chapter_proves_the_machinery():
    assert "s01-loop.md" in CHAPTERS, "docs/*/s01-loop.md should carry the `$ echo hello` trace"


@pytest.mark.parametrize("stage", all_stages())
def test_a_trace_runs_on_every_stage(stage):
    text = traces.trace({"stage": stage, "input": ["$ echo hello"]})
    assert text.startswith(f"$ printf '%s\\n' '$ echo hello' | python agents/{stage}.py\n")
    steps = [line for line in text.splitlines() if re.match(r"^ ?\d+\. ", line)]
    assert [re.sub(r"^ ?\d+\. ", "", s).split(":")[0].split(" (")[0] for s in steps] == [
        "learner sees", "→ request 1 to the model", "← the model asks", "tool result",
        "learner sees", "→ request 2 to the model", "← the model answers", "learner sees",
        "exit status 0"], text
    assert 'tool result (terminal): {"output": "hello\\n", "exit_code": 0}' in text
    assert "the model asks: terminal {\"command\": \"echo hello\"}" in text
    assert "+ assistant (calls terminal) + tool (result of terminal)" in text


def test_a_trace_is_the_same_on_every_run_and_machine():
    spec = {"stage": all_stages()[-1], "input": ["$ pwd; echo $HOME; date +%F"],
            "files": {"notes/AGENTS.md": "# Notes\n"}}
    first, second = traces.trace(spec), traces.trace(spec)
    assert first == second
    assert "<work>\n" in first and "<home>\n" in first and "<date>\n" in first
    assert "127.0.0.1:<port>" in first
    assert not re.search(r"/tmp/|127\.0\.0\.1:\d|\d{4}-\d\d-\d\d", first), first
    assert "files in the working directory: notes/AGENTS.md (8 chars)" in first


@pytest.mark.parametrize("stage", stages_from("s04"))
def test_the_system_prompt_describes_the_same_machine_everywhere(stage, tmp_path):
    """s04 puts the OS into the prompt: its length (which the trace shows) must not
    depend on the machine that regenerates the trace."""
    events, _ = traces.record({"stage": stage, "input": ["hi"]}, tmp_path)
    system = next(data for kind, data in events if kind == "request")[0]
    assert system["role"] == "system"
    assert f"{traces.SameMachine.system()} {traces.SameMachine.release()}" in system["content"]


# The machinery itself must be able to fail.

def test_a_stale_block_is_found_and_a_missing_one_inserted():
    marker = '<!-- trace: {"stage": "s01_loop", "input": ["x"]} -->\n'
    current = f"# T\n\n{marker}```text\nfresh\n```\n\nmore\n"
    make = lambda spec: "fresh\n"                        # noqa: E731
    assert traces.updated_text(current, "page", make) == current
    stale = current.replace("fresh\n```", "old\n```")
    assert traces.updated_text(stale, "page", make) == current
    missing = f"# T\n\n{marker}\nmore\n"
    assert traces.updated_text(missing, "page", make) == current


@pytest.mark.parametrize("marker,message", [
    ('<!-- trace: {"stage": "s01_loop", -->', "not JSON"),
    ('<!-- trace: {"input": ["x"]} -->', '"stage"'),
    ('<!-- trace: {"stage": "s01_lop"} -->', "no stage 's01_lop'"),
    ('<!-- trace: {"stage": "s01_loop", "inputs": ["x"]} -->', "unknown trace option"),
    ('<!-- trace: {"stage": "s01_loop", "input": "x"} -->', "list of strings"),
    ('<!-- trace: {"stage": "s01_loop", "files": {"../x": ""}} -->', "inside the work dir"),
])
def test_bad_markers_fail_with_one_clear_line(marker, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        traces.updated_text(f"{marker}\n", "docs/en/x.md", lambda spec: "")
    assert str(caught.value).startswith("docs/en/x.md: ")


def test_long_output_is_cut_with_a_visible_marker():
    screen = "\n".join(f"line {n}" for n in range(30)) + "\n" + "x" * 150
    events = [("screen", screen), ("request", [{"role": "user", "content": "y" * 80}]),
              ("reply", {"content": "done"})]
    text = traces.render({"stage": "s01_loop", "argv": ["-p", "y"]}, events, 0)
    assert "… [+19 lines]" in text
    assert 'user "' + "y" * 60 + '… [+20 chars]"' in text
    assert text.startswith("$ python agents/s01_loop.py -p y\n")
    shown = [line for line in text.splitlines() if not re.match(r"^(\$| ?\d+\.)", line)]
    assert shown and all(line.startswith("      ") for line in shown)   # can never close the fence
