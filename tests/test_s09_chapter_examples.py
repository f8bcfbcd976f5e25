"""s09: what the chapter shows is what the code does, in both editions.

docs/en/s09-permission-system.md has:

- "Under attack": a table of attacks with two result columns, the teaching edition's and
  the hardened edition's ("BLOCKED (hardline)", "asks" or "runs"); every row is checked
  against both editions here, so neither column can drift from the code;
- exercise 1: the `check` output of four commands (teaching edition);
- exercise 2: a diff that adds a pattern to DANGEROUS_PATTERNS; it must apply to the
  teaching file and make `git stash drop` dangerous;
- exercise 3: the `check` output of commands the teaching edition misses, in both editions.

Nothing is ever run: only the detector is asked. In the tables, ⟨ESC⟩ stands for the
escape character.
"""

import json
import re

import pytest

from helpers import ROOT, diff_blocks, edition_of, fenced_blocks, load_stage, patched_stage

CHAPTER = ROOT / "docs" / "en" / "s09-permission-system.md"
CODE = re.compile(r"`([^`]+)`")
NAMED = {"ESC": "\x1b", "LF": "\n"}
SHOWN = {"hardline": "BLOCKED (hardline)", "dangerous": "asks", "safe": "runs"}
STAGE = "s09_permission_system"
EDITIONS = {"teaching": STAGE, "hardened": "hardened/" + STAGE}


def decoded(text: str) -> str:
    """A command as the chapter writes it, with ⟨ESC⟩ and ⟨LF⟩ put back."""
    text = re.sub(r"⟨([A-Z]+)⟩", lambda m: NAMED[m.group(1)], text)
    assert "⟨" not in text and "⟩" not in text, text
    return text


def cells(row: str) -> list[str]:
    """The cells of a table row; a | inside `code` does not separate cells."""
    found, current, in_code = [], "", False
    for char in row.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            found.append(current.strip())
            current = ""
        else:
            current += char
    return found + [current.strip()]


def attack_rows() -> list[dict]:
    """The "Under attack" table: one dict per row, by column title."""
    lines = [line.strip() for line in CHAPTER.read_text(encoding="utf-8").splitlines()]
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("| Attack |") and "teaching edition" in line)
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line))))
    return rows


def tier(stage, command: str) -> str:
    if stage.detect_hardline_command(command):
        return "hardline"
    return "dangerous" if stage.detect_dangerous_command(command) else "safe"


def check_output(stage, command: str) -> str:
    """What the chapter's `check` shell function prints for one command."""
    hard = stage.detect_hardline_command(command)
    found = [hard] if hard else stage.detect_dangerous_command(command)
    return f"{command!r} -> " + ("; ".join(f"{f.tier}: {f.key}" for f in found) or "safe")


@pytest.fixture
def place(tmp_path, monkeypatch):
    # The place the chapter assumes: a home that is not /root, an empty working folder.
    monkeypatch.setenv("HOME", "/home/learner")
    monkeypatch.chdir(tmp_path)


def test_the_attack_table_is_there():
    rows = attack_rows()
    assert len(rows) >= 8
    assert {row["teaching edition"] for row in rows} <= set(SHOWN.values())
    assert any(row["teaching edition"] != row["hardened edition"] for row in rows)


@pytest.mark.parametrize("edition", EDITIONS)
def test_every_attack_row_tells_the_truth(place, edition):
    stage = load_stage(EDITIONS[edition])
    wrong = []
    for row in attack_rows():
        for command in map(decoded, CODE.findall(row["Example"])):
            said, found = row[f"{edition} edition"], SHOWN[tier(stage, command)]
            if said != found:
                wrong.append(f"{command!r}: the chapter says {said}, the code says {found}")
    assert not wrong, "\n".join(wrong)


def solution_outputs(exercise: str) -> list[str]:
    """The lines of the ```text blocks in one exercise's part of the chapter."""
    text = CHAPTER.read_text(encoding="utf-8")
    part = text.split(f"### {exercise}", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return [line for block in fenced_blocks(part, "text") for line in block.splitlines()]


def test_exercise_1_shows_what_the_teaching_edition_says(place):
    stage = load_stage(STAGE)
    for line in solution_outputs("1. Predict"):
        command = eval(line.split(" -> ")[0])              # the repr that check prints
        assert check_output(stage, command) == line


def test_exercise_3_shows_both_editions(place):
    lines = solution_outputs("3. Break it")
    half = len(lines) // 2
    for edition, shown in (("teaching", lines[:half]), ("hardened", lines[half:])):
        stage = load_stage(EDITIONS[edition])
        for line in shown:
            command = eval(line.split(" -> ")[0])
            assert check_output(stage, command) == line, edition
    assert all(line.endswith("-> safe") for line in lines[:half])


def test_exercise_2_solution_makes_git_stash_drop_dangerous(tmp_path, place):
    [block] = diff_blocks(CHAPTER.read_text(encoding="utf-8"))
    stage = patched_stage(STAGE, block, tmp_path)
    for command in ("git stash drop", "git stash clear", "git -C repo stash drop stash@{1}"):
        assert tier(stage, command) == "dangerous", command
    assert tier(stage, "git stash list") == "safe"
    assert tier(load_stage(STAGE), "git stash drop") == "safe"      # the exercise is needed
    added = [line[1:] for line in block if line.startswith("+")]
    assert max(map(len, added)) <= 100


def test_the_editions_are_what_the_rows_say():
    assert edition_of(EDITIONS["hardened"]) == "hardened"


def test_the_number_of_hardened_rules_is_the_codes():
    """"Under attack" counts the hardened edition's rules, in all three languages."""
    hardened = load_stage("hardened/s09_permission_system")
    count = str(len(hardened.DANGEROUS_PATTERNS))
    texts = {lang: (ROOT / "docs" / lang / "s09-permission-system.md").read_text(encoding="utf-8")
             for lang in ("en", "zh", "ru")}
    assert f"each of {count} rules" in texts["en"]
    assert f"中有 {count} 条规则" in texts["zh"]
    assert f"каждое из {count} правил" in texts["ru"]


def test_a_path_no_rule_can_read_runs_in_one_edition_and_is_undone_in_the_other(
        tmp_path, monkeypatch):
    """"Principle 2": the awk row, run for real in a temporary state folder (awk only
    appends to a file there): the teaching edition lets it change MEMORY.md, the hardened
    edition's outcome check puts the file back."""
    lines = [line.strip() for line in CHAPTER.read_text(encoding="utf-8").splitlines()]
    start = lines.index("| A path no rule can read | teaching edition | hardened edition |")
    command_cell, teaching_cell, hardened_cell = cells(lines[start + 2])
    command = CODE.findall(command_cell)[0]
    monkeypatch.chdir(tmp_path)
    for edition, name in EDITIONS.items():
        memory = tmp_path / edition / "memories" / "MEMORY.md"
        memory.parent.mkdir(parents=True)
        memory.write_text("keep\n")
        monkeypatch.setenv("LEARN_HERMES_HOME", str(tmp_path / edition))
        stage = load_stage(name)
        assert tier(stage, command) == "safe"                   # no rule reads the path
        token = stage.APPROVAL_CONTEXT.set(stage.ApprovalContext(stage.Permissions()))
        try:
            result = json.loads(stage.terminal_tool(command))
        finally:
            stage.APPROVAL_CONTEXT.reset(token)
        if edition == "teaching":
            assert teaching_cell.startswith("runs") and memory.read_text() == "keep\nobey\n"
        else:
            assert hardened_cell.startswith("BLOCKED (self-protection)")
            assert result["blocked"] == "self-protection" and memory.read_text() == "keep\n"
