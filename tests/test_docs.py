"""Docs (curriculum §6): three parallel languages that tell the truth about the code.

- en, zh and ru have the same files; each chapter has the same heading levels in the
  same order, byte-identical code blocks, and tables of the same shape.
- Every stage has a chapter and every chapter has a stage.
- Every `function()`, `ClassName` and `CONSTANT` a chapter names in backticks exists in
  its stage file (or, for what a stage removed, in the previous one); `CONSTANT = value`
  must match the code's value.
- Every ```python excerpt is copied verbatim from the stage file (`...` lines may
  separate pieces).
"""

import ast
import re

import pytest

from helpers import AGENTS, ROOT, all_stages

DOCS = ROOT / "docs"
LANGUAGES = ["en", "zh", "ru"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
CALL = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
CLASS_NAME = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")
CONSTANT_VALUE = re.compile(r"^([A-Z][A-Z0-9_]{2,}) = (.+)$")
NOT_OURS = {"APIConnectionError", "APIStatusError", "APITimeoutError", "AuthenticationError",
            "KeyboardInterrupt", "RateLimitError", "NotFoundError", "TimeoutExpired",
            "OpenAIError", "ThreadingHTTPServer", "BaseHTTPRequestHandler"}


def pages(lang: str) -> list[str]:
    return sorted(p.name for p in (DOCS / lang).glob("*.md"))


def chapters() -> list[str]:
    return [p for p in pages("en") if re.match(r"^s\d\d-", p)]


def read(lang: str, page: str) -> str:
    return (DOCS / lang / page).read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


def heading_levels(text: str) -> list[int]:
    return [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", prose(text), re.MULTILINE)]


def code_blocks(text: str) -> list[tuple[str, str]]:
    return FENCE.findall(text)


def table_shapes(text: str) -> list[list[int]]:
    shapes, current = [], []
    for line in prose(text).splitlines() + [""]:
        if line.startswith("|"):
            current.append(line.strip().strip("|").count("|") + 1)
        elif current:
            shapes.append(current)
            current = []
    return shapes


def stage_for(chapter: str) -> str:
    return chapter[:-3].replace("-", "_")


def defined_names(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def identifier_problems(text: str, source: str) -> list[str]:
    """Backticked names in the prose that the stage file does not have."""
    defined = defined_names(source)
    words = set(re.findall(r"\w+", source))
    problems = []
    for span in INLINE_CODE.findall(prose(text)):
        span = span.strip()
        call, value = CALL.match(span), CONSTANT_VALUE.match(span)
        if call and "." in call.group(1):
            if call.group(1) + "(" not in source:
                problems.append(f"`{span}`: {call.group(1)}( is not in the stage file")
        elif call and call.group(1) not in defined:
            problems.append(f"`{span}`: no def/class {call.group(1)} in the stage file")
        elif value and not re.search(rf"^{re.escape(span)}(\s|$)", source, re.MULTILINE):
            problems.append(f"`{span}`: the stage file does not say exactly this")
        elif (CLASS_NAME.match(span) or CONSTANT.match(span)) and span not in NOT_OURS \
                and span not in words:
            problems.append(f"`{span}`: not in the stage file")
    return problems


def excerpt_problems(text: str, source: str) -> list[str]:
    problems = []
    for lang, body in code_blocks(text):
        if lang.strip() != "python":
            continue
        pieces = re.split(r"^[ \t]*\.\.\.[ \t]*\n", body, flags=re.MULTILINE)
        for piece in pieces:
            if piece.strip() and piece not in source:
                problems.append("python excerpt not found verbatim:\n" + piece[:300])
    return problems


def test_every_language_has_the_same_pages():
    assert pages("en"), "docs/en is empty"
    for lang in LANGUAGES[1:]:
        assert pages(lang) == pages("en"), lang


def test_every_stage_has_a_chapter_and_every_chapter_a_stage():
    assert sorted(stage_for(c) for c in chapters()) == all_stages()


@pytest.mark.parametrize("page", pages("en"))
@pytest.mark.parametrize("lang", LANGUAGES[1:])
def test_translations_are_parallel(page, lang):
    english, other = read("en", page), read(lang, page)
    assert heading_levels(other) == heading_levels(english), "headings differ"
    assert code_blocks(other) == code_blocks(english), "code blocks differ"
    assert table_shapes(other) == table_shapes(english), "tables differ"


def previous_stage_source(stage: str) -> str:
    """A chapter's "changes from the previous stage" may name what was removed."""
    stages = all_stages()
    index = stages.index(stage)
    return (AGENTS / f"{stages[index - 1]}.py").read_text(encoding="utf-8") if index else ""


@pytest.mark.parametrize("chapter", chapters())
@pytest.mark.parametrize("lang", LANGUAGES)
def test_chapter_names_only_what_the_code_has(chapter, lang):
    stage = stage_for(chapter)
    source = (AGENTS / f"{stage}.py").read_text(encoding="utf-8")
    text = read(lang, chapter)
    assert identifier_problems(text, source + "\n" + previous_stage_source(stage)) == []
    assert excerpt_problems(text, source) == []


@pytest.mark.parametrize("chapter", chapters())
def test_chapter_follows_the_skeleton(chapter):
    """Problem, solution, how it works, changes, try it, pitfalls, what's next."""
    levels = heading_levels(read("en", chapter))
    assert levels[0] == 1 and levels.count(1) == 1
    assert levels.count(2) >= 7


# The checks themselves must be able to fail.

def test_checks_catch_invented_names_and_edited_excerpts():
    source = "MAX = 30\n\n\ndef real_function():\n    return MAX\n"
    page = ("Call `real_function()` or `fake_function()`; `MAX = 30` and `MAX = 31`; "
            "`GhostClass`.\n\n```python\ndef real_function():\n    return MAX + 1\n```\n")
    problems = identifier_problems(page, source)
    assert len(problems) == 3
    assert any("fake_function" in p for p in problems)
    assert any("MAX = 31" in p for p in problems)
    assert any("GhostClass" in p for p in problems)
    assert len(excerpt_problems(page, source)) == 1


def test_parallel_checks_see_structure():
    en = "# T\n\n## A\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```bash\nls\n```\n"
    assert heading_levels(en) == [1, 2]
    assert table_shapes(en) == [[2, 2, 2]]
    assert code_blocks(en) == [("bash", "ls\n")]
