"""course/build.py: one source, twelve generated stage files (curriculum §2, §4).

The committed stage files are exactly what the source produces; a hand edit is caught
and named; a change to one definition reaches every stage that carries it and no other;
a broken source gets a readable error that names the file and line.
"""

import ast
import functools
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT, all_stages, course_build

BUILD = course_build()


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    """Every stage file as the source in course/ produces it (about 2 s)."""
    return BUILD.build()


def test_the_committed_stage_files_are_what_the_source_produces():
    """`python course/build.py --check`, as a contributor (and CI) runs it."""
    run = subprocess.run([sys.executable, "course/build.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"{2 * len(all_stages())} stage files (both editions) are what course/ produces" \
        in run.stdout


def test_one_changed_byte_is_named_with_its_file_and_line(built, tmp_path):
    for path, text in built.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert BUILD.check(built, tmp_path) == []
    target = tmp_path / "agents" / "s05_context_compression.py"
    lines = target.read_text(encoding="utf-8").split("\n")
    line = next(n for n, text in enumerate(lines) if "def estimate_tokens" in text)
    lines[line] = lines[line].replace("def", "dEf", 1)
    target.write_text("\n".join(lines), encoding="utf-8")
    assert BUILD.check(built, tmp_path) == [
        f"agents/s05_context_compression.py:{line + 1}: differs from what course/ produces; "
        f"edit course/, then run python course/build.py"]
    (tmp_path / "agents" / "s13_extra.py").write_text("", encoding="utf-8")
    assert "agents/s13_extra.py: no part in course/ produces it" in BUILD.check(built, tmp_path)


def definition_texts(course, stage: int, edition: str) -> dict[str, str]:
    """name -> text of each definition in one stage file, as rendered from `course`."""
    texts = [text for _, text in BUILD.render(course, stage, edition).statements]
    return {name_of(text): text for text in texts}


@functools.lru_cache(maxsize=None)
def name_of(text: str) -> str:
    return BUILD.statement_name(ast.parse(text).body[0])


def test_a_changed_definition_changes_in_every_stage_that_carries_it_and_nowhere_else(
        tmp_path):
    course_dir = tmp_path / "course"
    shutil.copytree(ROOT / "course", course_dir)
    # tool_message: written once in s01, carried unchanged by every stage.
    # RecordedMessages: s03's variant, carried by s04 only (s05 writes its own).
    s01 = course_dir / "s01_loop.py"
    s01.write_text(s01.read_text(encoding="utf-8").replace(
        "def tool_message(", "def tool_message(  # edited\n        ", 1), encoding="utf-8")
    s03 = course_dir / "s03_session_store.py"
    text = s03.read_text(encoding="utf-8")          # both editions' variants
    s03.write_text(text.replace('class RecordedMessages(list):\n    """',
                                'class RecordedMessages(list):\n    """Edited. '), encoding="utf-8")
    before, after = BUILD.read_course(), BUILD.read_course(course_dir)
    stages = all_stages()
    carriers = {"tool_message": set(stages),
                "RecordedMessages": {"s03_session_store", "s04_prompt_builder"}}
    for edition in BUILD.EDITIONS:
        for number, stage in enumerate(stages, start=1):
            old = definition_texts(before, number, edition)
            new = definition_texts(after, number, edition)
            changed = {name for name in set(old) | set(new) if old.get(name) != new.get(name)}
            expected = {name for name, carried in carriers.items() if stage in carried}
            assert changed == expected, (edition, stage)


def test_a_definition_carried_from_s01_to_the_last_stage_is_written_once():
    parts = sorted((ROOT / "course").glob("s*.py"))
    written = [p.name for p in parts for line in p.read_text(encoding="utf-8").splitlines()
               if line.startswith("def tool_message(")]
    assert written == ["s01_loop.py"]
    newest = (ROOT / "agents" / f"{all_stages()[-1]}.py").read_text(encoding="utf-8")
    assert newest.count("\ndef tool_message(") == 1


def test_generated_files_hold_no_markers_and_say_where_to_edit(built):
    assert len(built) == 2 * len(all_stages())
    for path, text in built.items():
        edition = "hardened" if path.startswith("agents/hardened/") else "teaching"
        assert text.startswith(BUILD.GENERATED_LINES[edition] + "\n"), path
        assert not [line for line in text.splitlines() if line.startswith("#:")], path
        assert "{changed elsewhere}" not in text, path


def test_changes_lists_what_a_stage_adds_changes_and_removes(capsys):
    assert BUILD.main(["--changes", "s09"]) == 0
    out = capsys.readouterr().out
    added, changed = out.split("changed:")[0], out.split("changed:")[1]
    assert "DANGEROUS_PATTERNS" in added and "detect_dangerous_command()" in added
    assert "write_file()" in changed and "[s02]" in changed
    assert BUILD.main(["--changes", "s3"]) == 1
    assert "unknown stage 's3'" in capsys.readouterr().err


# ── A broken source gets a readable error ────────────────────────────────

S01 = '''\
#: docstring
"""s01 · A tiny stage."""
#: imports
import sys
#: section The loop
LIMIT = 3


def loop():
    return LIMIT
#: section Command line | plumbing


def main():
    return loop()
#: wiring
if __name__ == "__main__":
    sys.exit(main())
'''

S02 = '''\
#: docstring
"""s02 · A second stage.

Reading guide
    {changed elsewhere}
"""
#: section Tools
TOOLS = ["terminal"]
#: changes


def loop():
    return LIMIT + len(TOOLS)
'''


def tiny_course(tmp_path, **parts: str):
    """A course of small parts in tmp_path/course: {"s01_a": text, ...}."""
    course = tmp_path / "course"
    course.mkdir(parents=True)
    for name, text in parts.items():
        (course / f"{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    return course


def error_of(course) -> str:
    with pytest.raises(BUILD.BuildError) as raised:
        BUILD.build(course)
    return str(raised.value)


def test_a_tiny_course_builds_lesson_first(tmp_path):
    files = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=S02))
    s02 = files["agents/s02_b.py"]
    banners = [line for line in s02.splitlines() if line.startswith("# ──")]
    assert [b.rstrip("─ ") for b in banners] == [
        "# ── [s02] Tools", "# ── [s01] The loop", "# ── [s01] Command line"]
    assert "Changed in earlier stages' sections: loop() in [s01]." in s02
    assert "return LIMIT + len(TOOLS)" in s02 and "return LIMIT\n" not in s02
    assert "return LIMIT\n" in files["agents/s01_a.py"]
    namespace = {"__name__": "tiny"}
    exec(compile(s02, "s02_b.py", "exec"), namespace)
    assert namespace["main"]() == 4


@pytest.mark.parametrize("names,message", [
    (["s01_a", "s03_c"], "course/s03_c.py: unknown stage"),
    (["s1_a"], "course/s1_a.py: unknown stage"),
])
def test_an_unknown_stage_is_refused(tmp_path, names, message):
    course = tiny_course(tmp_path, **{name: S01 for name in names})
    assert message in error_of(course)


@pytest.mark.parametrize("edit,message", [
    # a variant of a name no earlier stage defines
    (lambda s: s.replace("def loop():\n    return LIMIT + len", "def lop():\n    return LIMIT + len"),
     "course/s02_b.py:12: a variant of lop, which no earlier stage defines"),
    # a name defined twice
    (lambda s: s.replace('TOOLS = ["terminal"]', 'TOOLS = ["terminal"]\nLIMIT = 4'),
     "course/s02_b.py:9: duplicate: LIMIT is already defined (course/s01_a.py:6)"),
    # two variants of one name in one stage
    (lambda s: s + "\n\ndef loop():\n    return 0\n",
     "course/s02_b.py:16: duplicate: a second variant of loop in this stage"),
    # a variant that changes nothing
    (lambda s: s.replace("LIMIT + len(TOOLS)", "LIMIT"),
     "course/s02_b.py:12: this variant of loop is the same text as s01's"),
    (lambda s: s + "#: removes nothing_here\n",
     "course/s02_b.py:14: removes nothing_here, which no earlier stage defines"),
    (lambda s: s + "#: sections Typo\n", "course/s02_b.py:14: unknown directive '#: sections'"),
    (lambda s: s + "#: more for The loop\nX = 1\n",
     "course/s02_b.py:14: 'The loop' is s01's section and its banner says so"),
    (lambda s: s + "#: more for Teh loop\nX = 1\n",
     "course/s02_b.py:14: no earlier stage has a section 'Teh loop'"),
    (lambda s: s.replace('TOOLS = ["terminal"]', 'import os\nTOOLS = ["terminal"]'),
     "course/s02_b.py:8: imports go in the '#: imports' area"),
    (lambda s: "X = 1\n" + s, "course/s02_b.py:1: code before the first '#:' directive"),
    # a variant of what this same stage adds
    (lambda s: s + '\n\nTOOLS = ["terminal", "read_file"]\n',
     "course/s02_b.py:16: a variant of TOOLS, which no earlier stage defines"),
    (lambda s: s.replace('"""s02 · A second stage.', '"""s02 · A second stage.' + "\n" * 36),
     "course/s02_b.py: the teaching docstring of s02_b is 41 lines; at most 40"),
])
def test_a_broken_part_is_named(tmp_path, edit, message):
    course = tiny_course(tmp_path, s01_a=S01, s02_b=edit(S02))
    assert message in error_of(course)


def line_of(course, stage: int, text: str) -> int:
    """Where `text` starts in stage `stage`'s file, rendered without the checks."""
    rendered = BUILD.render(BUILD.read_course(course), stage).text
    return rendered[:rendered.index(text)].count("\n") + 1


def test_a_docstring_of_40_lines_is_fine(tmp_path):
    s02 = S02.replace('"""s02 · A second stage.', '"""s02 · A second stage.' + "\n" * 35)
    text = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=s02))["agents/s02_b.py"]
    assert ast.parse(text).body[0].end_lineno == 41        # line 1 says it is generated


def test_a_name_used_at_import_before_its_definition_is_named(tmp_path):
    # s02's section comes before s01's, so a constant computed from s01's LIMIT fails.
    s02 = S02.replace('TOOLS = ["terminal"]', 'TOOLS = ["terminal"] * LIMIT')
    course = tiny_course(tmp_path, s01_a=S01, s02_b=s02)
    assert error_of(course).startswith(
        f"agents/s02_b.py:{line_of(course, 2, 'TOOLS =')}: uses LIMIT at import time, but it "
        f"is defined only further down (line {line_of(course, 2, 'LIMIT = 3')}); move the "
        f"statement under '#: wiring'")
    # ... also when a function defined above, called at import time, reads it
    s02 = S02.replace('TOOLS = ["terminal"]', 'def count():\n    return LIMIT\n\n\n'
                      'TOOLS = ["terminal"] * count()')
    assert "uses LIMIT at import time (through count)" in error_of(
        tiny_course(tmp_path / "2", s01_a=S01, s02_b=s02))
    # ... and the same line under '#: wiring' runs once everything is defined
    s02 = S02.replace('#: section Tools\nTOOLS = ["terminal"]\n', '#: section Tools\nMORE = 1\n')
    s02 += '#: wiring\nTOOLS = ["terminal"] * LIMIT\n'
    files = BUILD.build(tiny_course(tmp_path / "3", s01_a=S01, s02_b=s02))
    namespace = {"__name__": "tiny"}
    exec(compile(files["agents/s02_b.py"], "s02_b.py", "exec"), namespace)
    assert namespace["TOOLS"] == ["terminal"] * 3


def test_a_class_whose_base_stands_further_down_is_named(tmp_path):
    s01 = S01.replace("LIMIT = 3\n", "LIMIT = 3\n\n\nclass Budget:\n    pass\n")
    s02 = S02.replace('TOOLS = ["terminal"]\n', 'TOOLS = ["terminal"]\n\n\n'
                      'class ChildBudget(Budget):\n    pass\n')
    assert "uses Budget at import time" in error_of(tiny_course(tmp_path, s01_a=s01,
                                                                s02_b=s02))


def test_a_name_that_no_stage_defines_is_named(tmp_path):
    s02 = S02.replace("return LIMIT + len(TOOLS)", "return LIMIT + len(TOOLZ)")
    course = tiny_course(tmp_path, s01_a=S01, s02_b=s02)
    line = line_of(course, 2, "return LIMIT + len(TOOLZ)")
    assert f"agents/s02_b.py:{line}: uses TOOLZ, which this file never defines" in error_of(
        course)


def test_a_removed_definition_leaves_the_later_stages(tmp_path):
    s02 = S02.replace('TOOLS = ["terminal"]', 'TOOLS = ["terminal"]\nLIMIT2 = 3').replace(
        "return LIMIT + len(TOOLS)", "return LIMIT2 + len(TOOLS)") + "#: removes LIMIT\n"
    files = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=s02))
    assert "LIMIT = 3" in files["agents/s01_a.py"]
    assert "LIMIT = 3" not in files["agents/s02_b.py"]


def test_write_rewrites_only_what_changed_and_removes_stale_stages(tmp_path):
    files = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=S02))
    assert sorted(BUILD.write(files, tmp_path)) == [
        "agents/hardened/s01_a.py", "agents/hardened/s02_b.py", "agents/s01_a.py",
        "agents/s02_b.py"]
    assert BUILD.write(files, tmp_path) == []
    (tmp_path / "agents" / "s03_old.py").write_text("", encoding="utf-8")
    (tmp_path / "agents" / "hardened" / "s03_old.py").write_text("", encoding="utf-8")
    assert BUILD.write(files, tmp_path) == ["agents/hardened/s03_old.py", "agents/s03_old.py"]
    assert not (tmp_path / "agents" / "s03_old.py").exists()


def test_imports_are_the_ones_the_code_uses_in_the_usual_groups(tmp_path):
    s01 = S01.replace("import sys\n", "import sys\nimport json\nfrom pathlib import Path\n"
                      "import openai\n").replace("return LIMIT\n", "return Path(openai.__name__)\n")
    text = BUILD.build(tiny_course(tmp_path, s01_a=s01))["agents/s01_a.py"]
    head = text.split("# ──")[0]
    assert head.endswith("from __future__ import annotations\n\nimport sys\nfrom pathlib "
                         "import Path\n\nimport openai\n\n")
    assert "json" not in head


# ── Two editions ─────────────────────────────────────────────────────────

S02_EDITIONS = S02.replace('#: section Tools\nTOOLS = ["terminal"]\n', '''\
#: section Tools
#: teaching
TOOLS = ["terminal"]
#: hardened
# The hardened edition offers one more tool.
TOOLS = ["terminal", "read_file"]
#: section Tool details | hardened


def checked(name):
    return name in TOOLS
''').replace("#: changes\n", '''\
#: changes
#: hardened


def main():
    return loop() if checked("terminal") else 0
''')


def test_each_edition_gets_its_own_variants_and_sections(tmp_path):
    files = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=S02_EDITIONS))
    teaching, hardened = files["agents/s02_b.py"], files["agents/hardened/s02_b.py"]
    assert 'TOOLS = ["terminal"]\n' in teaching and "read_file" not in teaching
    assert ('# The hardened edition offers one more tool.\nTOOLS = ["terminal", "read_file"]'
            in hardened and 'TOOLS = ["terminal"]\n' not in hardened)
    assert "Tool details" not in teaching and "# ── [s02] Tool details" in hardened
    assert "checked(" not in teaching
    assert "#:" not in teaching + hardened
    results = []
    for text in (teaching, hardened):
        namespace = {"__name__": "tiny"}
        exec(compile(text, "s02_b.py", "exec"), namespace)
        results.append(namespace["main"]())
    assert results == [4, 5]


def test_what_an_edition_changes_is_listed_for_that_edition(tmp_path):
    course = BUILD.read_course(tiny_course(tmp_path, s01_a=S01, s02_b=S02_EDITIONS))
    teaching, hardened = (BUILD.describe_changes(course, "s02", edition)
                          for edition in BUILD.EDITIONS)
    assert "main()" not in teaching.split("changed:")[1]
    assert "main()" in hardened.split("changed:")[1] and "checked()" in hardened
    assert "the hardened edition" in hardened.splitlines()[0]


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.replace("#: hardened\n# The hardened", "#: teaching\n# The hardened"),
     "course/s02_b.py:12: duplicate: a second variant of TOOLS in this stage"),
    (lambda s: s.replace("#: hardened\n# The", "#: hardend\n# The"),
     "course/s02_b.py:10: unknown directive '#: hardend'"),
    (lambda s: s.replace("Tool details | hardened", "Tool details | hard"),
     "course/s02_b.py:13: expected '#: section Title | plumbing, untagged, hardened'"),
    (lambda s: s.replace("#: changes\n#: hardened\n", "#: changes\n#: hardened\n#: hardened\n"),
     "an edition marker goes right above the statement's comments, once"),
    (lambda s: s.replace('"""s02 · A second stage.', '#: docstring | hard\n"""s02'),
     "unknown edition(s) hard"),
])
def test_a_broken_edition_marker_is_named(tmp_path, edit, message):
    assert message in error_of(tiny_course(tmp_path, s01_a=S01, s02_b=edit(S02_EDITIONS)))


def test_a_teaching_file_may_not_use_what_only_the_hardened_edition_defines(tmp_path):
    s02 = S02_EDITIONS.replace("#: changes\n#: hardened\n", "#: changes\n")
    assert "agents/s02_b.py:" in error_of(tiny_course(tmp_path, s01_a=S01, s02_b=s02))
    assert "uses checked, which this file never defines" in error_of(
        tiny_course(tmp_path / "2", s01_a=S01, s02_b=s02))


def test_each_edition_may_have_its_own_docstring(tmp_path):
    s02 = S02_EDITIONS.replace("#: section Tools", '#: docstring | hardened\n'
                               '"""s02 · A second stage, every guard."""\n#: section Tools')
    files = BUILD.build(tiny_course(tmp_path, s01_a=S01, s02_b=s02))
    assert '"""s02 · A second stage.\n' in files["agents/s02_b.py"]
    assert '"""s02 · A second stage, every guard."""' in files["agents/hardened/s02_b.py"]


def test_no_generated_line_is_longer_than_100_characters(built):
    """Curriculum §4a: a line of code is read whole, on a screen and on the site."""
    long = [f"{path}:{number}" for path, text in built.items()
            for number, line in enumerate(text.splitlines(), start=1) if len(line) > 100]
    assert long == []


def teaching_lines(built) -> dict[int, int]:
    """Lines of each teaching-edition stage file, by stage number."""
    return {int(path.split("/s")[1][:2]): text.count("\n") for path, text in built.items()
            if path.startswith("agents/s")}


def test_the_teaching_edition_keeps_its_line_budget(built):
    """Issue 21 (curriculum §4a), everything counted: s01 at most 450 lines, each later stage
    adds at most 400 (s09: 600), the last stage at most 4,500 in all."""
    lines = teaching_lines(built)
    over = [f"s01: {lines[1]} lines > 450"] if lines[1] > 450 else []
    for stage in sorted(lines)[1:]:
        added, limit = lines[stage] - lines[stage - 1], 600 if stage == 9 else 400
        if added > limit:
            over.append(f"s{stage:02}: adds {added} lines > {limit}")
    last = max(lines)
    if lines[last] > 4500:
        over.append(f"s{last:02}: {lines[last]} lines > 4,500")
    assert over == []
