"""s09: every trick the chapter shows is caught by the code (issue 9).

docs/en/s09-permission-system.md has two tables of commands:

- "Under attack": one example per bypass class, with the column "Caught as" (hardline or
  dangerous, and the key of the finding);
- "The article's 15 patterns": for each of the article series' regexes, commands it misses
  (the column "Misses (caught here)") and commands it flags wrongly ("Flags wrongly (safe
  here)"), next to the regex itself.

This file reads both tables from the chapter and checks them against every stage from
s09, so the chapter cannot show a trick the code does not catch. Nothing is ever run: only
the detector is asked. In the tables, ⟨ESC⟩ stands for the escape character, ⟨LF⟩ for a
newline and ⟨U+200B⟩ for that code point.
"""

import re
from pathlib import Path

import pytest

from helpers import ROOT, load_stage, stages_from

CHAPTER = ROOT / "docs" / "en" / "s09-permission-system.md"
STAGES = stages_from("s09")
CODE = re.compile(r"`([^`]+)`")
NAMED = {"ESC": "\x1b", "LF": "\n"}


def decoded(text: str) -> str:
    """A command as the chapter writes it, with ⟨ESC⟩, ⟨LF⟩ and ⟨U+XXXX⟩ put back."""
    text = re.sub(r"⟨U\+([0-9A-F]{4,6})⟩", lambda m: chr(int(m.group(1), 16)), text)
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


def table(header_word: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the chapter's table whose header has `header_word`."""
    lines = [line.strip() for line in CHAPTER.read_text(encoding="utf-8").splitlines()]
    for index, line in enumerate(lines):     # (a table in an admonition is indented)
        if line.startswith("|") and header_word in line:
            rows = []
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            return cells(line), rows
    pytest.fail(f"no table with the column {header_word!r} in {CHAPTER.name}")


def column(header: list[str], name: str) -> int:
    return next(i for i, title in enumerate(header) if title.startswith(name))


def examples(cell: str) -> list[str]:
    return [decoded(code) for code in CODE.findall(cell)]


def bypasses() -> list[tuple[str, str, str | None]]:
    """(command, tier, key or None) for each example of the "Under attack" table."""
    header, rows = table("Caught as")
    example, caught = column(header, "Example"), column(header, "Caught as")
    found = []
    for row in rows:
        tier = row[caught].split()[0]
        key = (CODE.findall(row[caught]) or [None])[0]
        found += [(command, tier, key) for command in examples(row[example])]
    return found


def article_rows() -> list[tuple[int, list[str], list[str], list[str]]]:
    """(row index, regex cell's code, misses, false alarms) of the 15-pattern table."""
    header, rows = table("Flags wrongly")
    regex = column(header, "Article")
    missed, wrong = column(header, "Misses"), column(header, "Flags wrongly")
    return [(number, CODE.findall(row[regex]), examples(row[missed]), examples(row[wrong]))
            for number, row in enumerate(rows)]


@pytest.fixture(params=STAGES)
def stage(request, tmp_path, monkeypatch):
    # The place the chapter assumes: a home that is not /root, an empty working folder.
    monkeypatch.setenv("HOME", "/home/learner")
    monkeypatch.chdir(tmp_path)
    return load_stage(request.param)


def tier(stage, command):
    hardline = stage.detect_hardline_command(command)
    if hardline is not None:
        return "hardline", [hardline.key]
    found = stage.detect_dangerous_command(command)
    return ("dangerous" if found else "safe"), [f.key for f in found]


def article_flags(stage, command) -> bool:
    """The article series' detector: re.search of the 15 regexes on the raw text."""
    return any(re.search(rule.article_regex, command, re.IGNORECASE)
               for rule in stage.DANGEROUS_PATTERNS[:15])


def test_the_tables_are_there_and_decoded():
    assert len(bypasses()) >= 20
    assert len(article_rows()) == 15
    assert decoded("r⟨ESC⟩[0mm ⟨U+200B⟩x⟨LF⟩") == "r\x1b[0mm \u200bx\n"
    assert cells("| a | `x | y` | b |") == ["a", "`x | y`", "b"]


def test_every_example_in_the_chapter_is_caught(stage):
    wrong = []
    for command, wanted, key in bypasses():
        got, keys = tier(stage, command)
        if got != wanted or (key is not None and key not in keys):
            wrong.append(f"{command!r}: the chapter says {wanted} {key or ''}, "
                         f"the code says {got} {keys}")
    assert not wrong, "\n".join(wrong)


def test_the_article_table_tells_the_truth(stage):
    wrong = []
    for number, regex, missed, false_alarms in article_rows():
        rule = stage.DANGEROUS_PATTERNS[number]
        if rule.article_regex not in regex:
            wrong.append(f"row {number + 1}: the regex is not the code's {rule.article_regex!r}")
        for command in missed:
            if article_flags(stage, command) or tier(stage, command)[0] == "safe":
                wrong.append(f"row {number + 1}: {command!r} should be missed by all 15 "
                             f"regexes and caught here: {tier(stage, command)}")
        for command in false_alarms:
            if not article_flags(stage, command) or tier(stage, command)[0] != "safe":
                wrong.append(f"row {number + 1}: {command!r} should be flagged by the "
                             f"articles and safe here: {tier(stage, command)}")
    assert not wrong, "\n".join(wrong)
