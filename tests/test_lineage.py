"""Cumulative stages (curriculum §4.2), held to what the one source says.

course/build.py knows what each stage adds, changes and removes. These tests read the
generated files with their own parser and check them against it:

- the diff of two neighbouring stages touches exactly the definitions the source says
  the newer stage adds, changes and removes (so a declared change is a real change);
- banners are truthful: every definition stands under the banner of the stage that
  introduced it (the wiring and the offline model have untagged banners of their own);
- lesson first: the first banner after the imports is the stage's own, before line 120,
  and the stage's own sections hold what it adds; earlier stages follow, newest first;
- docstrings are at most 40 lines and no stage file keeps a "Changes from" list.
"""

import ast
import functools
import re

import pytest

from helpers import AGENTS, all_stages, course_build, course_lineage, stage_number

BANNER = re.compile(r"^# ── (?:\[(s\d\d)\] )?(.+?) ─+$")
STAGES = all_stages()
PAIRS = list(zip(STAGES, STAGES[1:]))
EDITIONS = course_build().EDITIONS


@functools.lru_cache(maxsize=None)
def read(stage: str, edition: str = "teaching") -> str:
    folder = AGENTS if edition == "teaching" else AGENTS / edition
    return (folder / f"{stage}.py").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def parsed(source: str) -> ast.Module:
    return ast.parse(source)


def statement_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines, as course/build.py names them."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return ["<imports>"]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [" = ".join(ast.unparse(target) for target in node.targets)]
    if isinstance(node, ast.AnnAssign):
        return [ast.unparse(node.target)]
    if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
        return ["<main>"]
    return [f"<{ast.unparse(node)}>"]


@functools.lru_cache(maxsize=None)
def top_level(source: str) -> dict[str, tuple[str, tuple]]:
    """name -> (its text with the comments above it, the banner it stands under)."""
    lines = source.splitlines()
    tree = parsed(source)
    found: dict[str, tuple[str, tuple]] = {}
    previous_end, banner = 0, None
    for index, node in enumerate(tree.body):
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        above = lines[previous_end:first - 1]
        for offset, line in enumerate(above):
            match = BANNER.match(line)
            if match:
                banner = match.groups()
                above = above[offset + 1:]
        previous_end = node.end_lineno
        if index == 0 and isinstance(node, ast.Expr):
            continue                                            # the module docstring
        while above and not above[0].strip():
            above = above[1:]
        text = "\n".join(above + lines[first - 1:node.end_lineno])
        for name in statement_names(node):
            if name == "<imports>":
                text = found.get(name, ("", None))[0] + text + "\n"
            found[name] = (text, banner)
    return found


def lineage_problems(previous: str, current: str, declared: dict) -> list[str]:
    """Differences between two stage sources that `declared` does not account for.
    The imports are left out: the generator writes what the code uses."""
    before = {n: t for n, (t, _) in top_level(previous).items() if n != "<imports>"}
    after = {n: t for n, (t, _) in top_level(current).items() if n != "<imports>"}
    actual = {"added": set(after) - set(before), "removed": set(before) - set(after),
              "changed": {n for n in set(before) & set(after) if before[n] != after[n]}}
    problems = []
    for kind in ("added", "removed", "changed"):
        expected = set(declared.get(kind, ()))
        for name in sorted(actual[kind] - expected):
            problems.append(f"{name} was {kind} but the source does not say so")
        for name in sorted(expected - actual[kind]):
            problems.append(f"the source says {name} was {kind}, but it was not")
    return problems


@functools.lru_cache(maxsize=None)
def introduced_in(edition: str = "teaching") -> dict[str, int]:
    """Each definition's first stage in `edition`, as the source says; wiring and
    untagged sections: 0."""
    build = course_build()
    course = build.read_course()
    return {name: (0 if d.section is None or not d.section.tagged
                   else build.introduced_in(d, edition))
            for name, d in course.definitions.items()}


def banner_problems(source: str, edition: str = "teaching") -> list[str]:
    problems = []
    for name, (_, banner) in top_level(source).items():
        if name in ("<imports>", "<main>"):
            continue
        tag = banner[0] if banner else None
        expected = introduced_in(edition).get(name)
        if expected is None:
            problems.append(f"{name}: no part of course/ defines it")
        elif (int(tag[1:]) if tag else 0) != expected:
            where = f"[s{expected:02d}]" if expected else "an untagged section"
            problems.append(f"{name} stands under {banner}, but belongs under {where}")
    return problems


def test_every_stage_has_a_part():
    assert list(course_lineage()) == STAGES


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("previous,current", PAIRS)
def test_stage_is_previous_plus_what_the_source_says(previous, current, edition):
    assert lineage_problems(read(previous, edition), read(current, edition),
                            course_lineage(edition)[current]) == []


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_banners_are_truthful(stage, edition):
    assert banner_problems(read(stage, edition), edition) == []


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_the_stage_lesson_comes_first(stage, edition):
    source = read(stage, edition)
    lines = source.splitlines()
    banners = [(number, *BANNER.match(line).groups()) for number, line in
               enumerate(lines, start=1) if BANNER.match(line)]
    imports_end = max(node.end_lineno for node in parsed(source).body
                      if isinstance(node, (ast.Import, ast.ImportFrom)))
    first_line, first_tag, _ = banners[0]
    assert first_line > imports_end and first_tag == stage[:3] and first_line < 120, banners[0]
    # The lesson sections, newest first, up to the first plumbing section ([s01] Command
    # line and REPL); within a stage its sections keep their order.
    lesson = [int(tag[1:]) for _, tag, title in banners[:banners.index(
        next(b for b in banners if b[2] == "Command line and REPL"))]]
    assert lesson == sorted(lesson, reverse=True) and lesson[-1] == 1, lesson
    # What the stage adds stands in its own sections (or in the wiring, or the offline
    # model, whose banners are untagged).
    added = set(course_lineage(edition)[stage]["added"])
    misplaced = {name for name, (_, banner) in top_level(source).items()
                 if name in added and banner and banner[0] not in (None, stage[:3])}
    assert not misplaced


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_docstring_is_short_and_lists_no_changes(stage, edition):
    source = read(stage, edition)
    docstring = parsed(source).body[0]
    assert docstring.end_lineno - docstring.lineno + 1 <= 40
    assert "Changes from" not in source
    assert source.startswith(course_build().GENERATED_LINES[edition] + "\n")


@pytest.mark.parametrize("edition", EDITIONS)
@pytest.mark.parametrize("stage", STAGES)
def test_banners_name_a_stage_and_never_say_new(stage, edition):
    found = [BANNER.match(line).groups() for line in read(stage, edition).splitlines()
             if BANNER.match(line)]
    number = stage_number(stage)
    for tag, title in found:
        assert "new" not in title.lower().split(), title
        tag = tag or ""
        if tag:
            assert int(tag[1:]) <= number, f"banner [{tag}] in {stage}"
    found = [(tag or "", title) for tag, title in found]
    wiring = ("", course_build().WIRING_TITLE)
    last = found[:-1] if found[-1] == wiring else found      # s01 has nothing to wire
    assert last[-1] == ("", "Offline model (not part of the lesson)")


@pytest.mark.parametrize("edition", EDITIONS)
def test_tools_keep_the_order_the_stages_added_them_in(edition):
    """The wiring registers tools in stage order: each stage's registrations come after
    the earlier stages' ones, which keep their order, so the model is offered the tools
    in the order the stages added them."""
    offered: list[str] = []
    for stage in STAGES:
        lines = read(stage, edition).splitlines()
        registered = [line for line in lines if line.startswith("REGISTRY.register(")]
        assert registered[:len(offered)] == offered, stage
        if registered:
            assert lines.index("REGISTRY = build_registry()") < lines.index(registered[0])
        offered = registered


# The mechanism itself must be able to fail: check it on small synthetic stages.

BASE = '"""doc"""\nimport os\n\nA = 1\n\n\ndef f():\n    return 1\n'


def test_mechanism_flags_an_undeclared_change():
    edited = BASE.replace("return 1", "return 2")
    assert lineage_problems(BASE, edited, {}) == ["f was changed but the source does not say so"]
    assert lineage_problems(BASE, edited, {"changed": ["f"]}) == []


def test_mechanism_flags_undeclared_additions_removals_and_stale_declarations():
    edited = BASE.replace("A = 1\n", "B = 2\n") + "import sys\n"
    problems = lineage_problems(BASE, edited, {"changed": ["f"]})
    assert "B was added but the source does not say so" in problems
    assert "A was removed but the source does not say so" in problems
    assert "the source says f was changed, but it was not" in problems
    assert not [p for p in problems if "<imports>" in p]


def test_mechanism_sees_a_changed_comment_and_ignores_the_docstring():
    assert lineage_problems(BASE, BASE.replace('"""doc"""', '"""other"""'), {}) == []
    commented = BASE.replace("def f", "# why f\ndef f")
    assert lineage_problems(BASE, commented, {}) == ["f was changed but the source does not "
                                                     "say so"]


def test_banner_check_catches_a_definition_under_the_wrong_banner():
    source = ('"""doc"""\n# ── [s01] The agent loop ───\n\ndef run_conversation():\n    pass\n'
              '# ── [s03] Session store ───\n\ndef run_terminal():\n    pass\n')
    assert banner_problems(source) == [
        "run_terminal stands under ('s03', 'Session store'), but belongs under [s01]"]
