"""Docs (curriculum §6): three parallel languages that tell the truth about the code.

- en, zh and ru have the same files. Section by section (split at headings) they have the
  same heading levels and the same numbers of paragraphs, list items, tables, code blocks,
  links, traces and admonitions of the same kinds; code blocks are byte-identical and tables
  have the same shape.
- Every stage has a chapter and every chapter has a stage.
- Every name a chapter puts in backticks exists in its stage file (or, for what the stage
  removed, in the previous one): `function()`, `ClassName`, `CONSTANT`, a bare
  `snake_case_name` and a dotted `object.attribute`. "What's next" may also name what the
  next stage has. `CONSTANT = value` must match the code. A name the stage removed
  (course/build.py --changes) appears only in "Changes from the previous stage".
- Every ```python excerpt is copied verbatim from the stage file (`...` lines may
  separate pieces).
- The chapter skeleton (checked on en; parity carries it to zh and ru), as ## headings:
  The problem · The idea in one screen · A worked trace (with a trace marker, see
  tests/traces.py) · How it works · Under attack (a collapsed `??? warning` block) ·
  Compared with Hermes (a collapsed `??? note` block) · Changes from the previous stage
  (from s02: a link to `diff/sNN.md`) · Try it · Exercises (at least three ### exercises,
  each with a collapsed `??? success` solution) · What's next.
- The site: docs_hooks.py writes the stage diff pages with the real diff; mkdocs.yml's nav
  lists every page and translates every title; links between pages are relative.
"""

import ast
import difflib
import functools
import importlib.util
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from markdown_it import MarkdownIt

from helpers import AGENTS, ROOT, all_stages, course_lineage, stage_number

DOCS = ROOT / "docs"
LANGUAGES = ["en", "zh", "ru"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
CALL = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
CLASS_NAME = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")
CONSTANT_VALUE = re.compile(r"^([A-Z][A-Z0-9_]{2,}) = (.+)$")
BARE_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")          # count_strikes
DOTTED_NAME = re.compile(r"^[a-z_]\w*(?:\.[a-z_]\w*)+$")             # session.messages
FILE_NAME = re.compile(r"\.(py|md|db|json|ipynb|ya?ml|txt|toml|sh|log|cfg|ini|html?|csv)$")
NOT_OURS = {"APIConnectionError", "APIStatusError", "APITimeoutError", "AuthenticationError",
            "KeyboardInterrupt", "RateLimitError", "NotFoundError", "TimeoutExpired",
            "OpenAIError", "ThreadingHTTPServer", "BaseHTTPRequestHandler",
            "ImportError",              # what a model's pytest run shows (s06's "The problem")
            "run_shell"}                # a tool name a model invents (s02's "The problem")

SKELETON = ["The problem", "The idea in one screen", "A worked trace", "How it works",
            "Under attack", "Compared with Hermes", "Changes from the previous stage",
            "Try it", "Exercises", "What's next"]
CHANGES = "Changes from the previous stage"
COLLAPSED = {"Under attack": "??? warning", "Compared with Hermes": "??? note"}
SOLUTION = "??? success"
MIN_EXERCISES = 3


def pages(lang: str) -> list[str]:
    return sorted(p.name for p in (DOCS / lang).glob("*.md"))


def chapters() -> list[str]:
    return [p for p in pages("en") if re.match(r"^s\d\d-", p)]


def read(lang: str, page: str) -> str:
    return (DOCS / lang / page).read_text(encoding="utf-8")


def stage_for(chapter: str) -> str:
    return chapter[:-3].replace("-", "_")


@functools.lru_cache(maxsize=None)
def stage_source(stage: str, offset: int = 0, edition: str = "teaching") -> str:
    """The source of `stage`, or of the stage `offset` places before/after it ("" if none),
    in the teaching edition (agents/) or the hardened one (agents/hardened/)."""
    stages = all_stages()
    index = stages.index(stage) + offset
    folder = AGENTS if edition == "teaching" else AGENTS / edition
    return (folder / f"{stages[index]}.py").read_text(encoding="utf-8") \
        if 0 <= index < len(stages) else ""


# The ## parts of a chapter that explain the hardened edition: their names and excerpts
# are checked against agents/hardened/; the rest of the chapter teaches agents/.
HARDENED_PARTS = ("Under attack", "Compared with Hermes")


def parts_by_edition(text: str, english: str) -> tuple[str, str]:
    """(the teaching parts, the hardened parts) of a chapter in any language, split at its
    ## headings; which parts are which comes from the English chapter (they are parallel)."""
    titles = re.findall(r"^## (.*)$", english, flags=re.MULTILINE)
    pieces = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    head, parts = pieces[0], pieces[1:]
    hardened = [part for title, part in zip(titles, parts) if title in HARDENED_PARTS]
    teaching = [head] + [part for title, part in zip(titles, parts)
                         if title not in HARDENED_PARTS]
    return "".join(teaching), "".join(hardened)


# ── The structure of a page ────────────────────────────────────────────────

MARKDOWN = MarkdownIt("commonmark").enable("table")
ADMONITION = re.compile(r"^(\?\?\?\+?|!!!) ([a-z]+)\b")
ADMONITION_COMMENT = re.compile(r"^<!-- admonition (\S+ \S+) -->")


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


def unfold_admonitions(text: str) -> str:
    """CommonMark does not know `??? note` blocks: their 4-space body would read as code.
    Turn each header into a comment naming the block and un-indent its body, so the body's
    paragraphs, lists and code are counted like any others."""
    lines, bodies, in_fence = [], [], False      # bodies: indents of the open blocks' bodies
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        while line.strip() and bodies and indent < bodies[-1]:
            bodies.pop()
        line = line[bodies[-1]:] if bodies else line
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        header = None if in_fence else ADMONITION.match(line)
        if header:
            lines.append(f"<!-- admonition {header.group(1).rstrip('+')} {header.group(2)} -->")
            bodies.append(indent + 4)
        else:
            lines.append(line)
    return "\n".join(lines)


@dataclass
class Section:
    """One heading and what follows it up to the next heading."""
    level: int
    title: str
    blocks: Counter = field(default_factory=Counter)
    admonitions: list = field(default_factory=list)     # e.g. ["??? warning"]
    links: list = field(default_factory=list)

    def shape(self) -> dict:
        return {**self.blocks, "admonitions": self.admonitions, "links": len(self.links)}


def sections(text: str) -> list[Section]:
    current = Section(0, "(above the title)")
    found, open_lists = [current], 0
    tokens = MARKDOWN.parse(unfold_admonitions(text))
    for index, token in enumerate(tokens):
        kind = token.type
        if kind == "heading_open":
            current = Section(int(token.tag[1]), tokens[index + 1].content)
            found.append(current)
        elif kind in ("bullet_list_open", "ordered_list_open"):
            open_lists += 1
        elif kind in ("bullet_list_close", "ordered_list_close"):
            open_lists -= 1
        elif kind == "list_item_open":
            current.blocks["list items"] += 1
        elif kind == "paragraph_open" and not open_lists:    # tight or loose lists alike
            current.blocks["paragraphs"] += 1
        elif kind == "table_open":
            current.blocks["tables"] += 1
        elif kind in ("fence", "code_block"):
            current.blocks["code blocks"] += 1
        elif kind == "html_block" and ADMONITION_COMMENT.match(token.content):
            current.admonitions.append(ADMONITION_COMMENT.match(token.content).group(1))
        elif kind == "html_block" and token.content.startswith("<!-- trace:"):
            current.blocks["traces"] += 1
        elif kind == "inline":
            current.links += [child.attrGet("href") for child in token.children or []
                              if child.type == "link_open"]
    return found


def h2_part(found: list[Section], title_start: str) -> tuple[int, list[Section]]:
    """The ## section whose title starts with `title_start` with its subsections, and its
    position among the ## sections; (-1, []) if there is none."""
    h2_seen = -1
    for index, section in enumerate(found):
        if section.level == 2:
            h2_seen += 1
            if section.title.startswith(title_start):
                end = next((i for i in range(index + 1, len(found)) if found[i].level <= 2),
                           len(found))
                return h2_seen, found[index:end]
    return -1, []


def nth_h2_part(found: list[Section], position: int) -> list[Section]:
    h2 = [i for i, s in enumerate(found) if s.level == 2]
    if not 0 <= position < len(h2):
        return []
    end = next((i for i in range(h2[position] + 1, len(found)) if found[i].level <= 2),
               len(found))
    return found[h2[position]:end]


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


def parallel_problems(english: str, other: str) -> list[str]:
    """How a translation's structure differs from the English page's."""
    en, xx = sections(english), sections(other)
    levels_en, levels_xx = [s.level for s in en], [s.level for s in xx]
    if levels_en != levels_xx:
        return [f"heading levels differ: en {levels_en[1:]}, translation {levels_xx[1:]}"]
    problems = [f"section '{a.title}' (translated '{b.title}'): en has {a.shape()}, "
                f"the translation has {b.shape()}"
                for a, b in zip(en, xx) if a.shape() != b.shape()]
    if code_blocks(english) != code_blocks(other):
        problems.append("code blocks differ (they must be byte-identical)")
    if table_shapes(english) != table_shapes(other):
        problems.append("tables differ in shape")
    return problems


# ── Names in a chapter ─────────────────────────────────────────────────────

def defined_names(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


@functools.lru_cache(maxsize=None)
def known_names(source: str) -> tuple[frozenset, frozenset]:
    """(names the source defines, every word in it): parsed once per source."""
    return frozenset(defined_names(source)), frozenset(re.findall(r"\w+", source))


def name_problems(text: str, *sources: str) -> list[str]:
    """Backticked names in `text` (prose) that none of `sources` has."""
    defined = frozenset().union(*(known_names(s)[0] for s in sources))
    words = frozenset().union(*(known_names(s)[1] for s in sources))
    source = "\n".join(sources)
    problems = []
    for span in INLINE_CODE.findall(text):
        span = span.strip()
        call, value = CALL.match(span), CONSTANT_VALUE.match(span)
        if span in NOT_OURS:
            continue
        if call and "." in call.group(1):
            owner, method = call.group(1).rsplit(".", 1)
            is_method = owner in defined and f"    def {method}(" in source    # Class.method()
            if call.group(1) + "(" not in source and not is_method:
                problems.append(f"`{span}`: {call.group(1)}( is not in the stage file")
        elif call and call.group(1) not in defined:
            problems.append(f"`{span}`: no def/class {call.group(1)} in the stage file")
        elif value and not re.search(rf"^{re.escape(span)}(\s|$)", source, re.MULTILINE):
            problems.append(f"`{span}`: the stage file does not say exactly this")
        elif (CLASS_NAME.match(span) or CONSTANT.match(span) or BARE_NAME.match(span)) \
                and span not in words:
            problems.append(f"`{span}`: not in the stage file")
        elif DOTTED_NAME.match(span) and not FILE_NAME.search(span) and span not in source:
            problems.append(f"`{span}`: not in the stage file")
    return problems


def identifier_problems(text: str, source: str, *more: str, next_source: str = "") -> list[str]:
    """Names that neither `source` nor `more` has; the last ## section ("What's next")
    may also name what the next stage has."""
    body = prose(text)
    start = body.rfind("\n## ")
    if start < 0:
        return name_problems(body, source, *more)
    return (name_problems(body[:start], source, *more)
            + name_problems(body[start:], source, *more, next_source))


def h2_texts(text: str) -> list[tuple[str, str]]:
    """(title, text) of each ## section of the prose; the part above the first has title ""."""
    parts = re.split(r"^## (.*)$", prose(text), flags=re.MULTILINE)
    above = ("(above the first ## heading)", parts[0])
    return [above] + list(zip(parts[1::2], parts[2::2]))


def removed_name_problems(text: str, removed: list[str],
                          changes_position: int | None) -> list[str]:
    """A removed name may be mentioned only in the ## section at `changes_position`
    (counted from 0; None: the chapter has no such section)."""
    problems = []
    for position, (title, body) in enumerate(h2_texts(text), start=-1):
        if position == changes_position:
            continue
        for name in removed:
            if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", body):
                problems.append(f"'{title}' names {name}, which this stage removed: only "
                                f"'{CHANGES}' may")
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


# ── The chapter skeleton ───────────────────────────────────────────────────

def skeleton_problems(text: str) -> list[str]:
    found = sections(text)
    problems = []
    if [s.level for s in found[1:2]] != [1] or [s.level for s in found].count(1) != 1:
        problems.append("the chapter must start with its only # title")
    h2 = [s.title for s in found if s.level == 2]
    if h2 != SKELETON:
        problems.append(f"the ## headings are {h2}; curriculum §6 wants {SKELETON}")
    for title, kind in COLLAPSED.items():
        part = h2_part(found, title)[1]
        if part and kind not in [a for s in part for a in s.admonitions]:
            problems.append(f"'{title}' has no collapsed `{kind}` block")
    trace_part = h2_part(found, "A worked trace")[1]
    if trace_part and not sum(s.blocks["traces"] for s in trace_part):
        problems.append("'A worked trace' has no trace marker (see tests/traces.py)")
    exercises = [s for s in h2_part(found, "Exercises")[1] if s.level == 3]
    if h2_part(found, "Exercises")[1] and len(exercises) < MIN_EXERCISES:
        problems.append(f"'Exercises' has {len(exercises)} ### exercises, fewer than "
                        f"{MIN_EXERCISES}")
    for exercise in exercises:
        part = h2_part_below(found, exercise)
        if SOLUTION not in [a for s in part for a in s.admonitions]:
            problems.append(f"exercise '{exercise.title}' has no collapsed `{SOLUTION}` "
                            f"solution")
    return problems


def h2_part_below(found: list[Section], heading: Section) -> list[Section]:
    """`heading` and its subsections."""
    index = found.index(heading)
    end = next((i for i in range(index + 1, len(found)) if found[i].level <= heading.level),
               len(found))
    return found[index:end]


def diff_link_problems(english: str, text: str, stage: str) -> list[str]:
    """From s02 on, "Changes from the previous stage" links to the stage's diff page."""
    wanted = f"diff/{stage[:3]}.md"
    position, _ = h2_part(sections(english), CHANGES)
    if position < 0:
        return [f"no '{CHANGES}' section to hold the link to {wanted}"]
    links = [link for s in nth_h2_part(sections(text), position) for link in s.links]
    if wanted not in links:
        return [f"'{CHANGES}' has no link to {wanted} (the stage's diff page); add e.g. "
                f"[the whole diff]({wanted})"]
    return []


# ── The tests ──────────────────────────────────────────────────────────────

def test_every_language_has_the_same_pages():
    assert pages("en"), "docs/en is empty"
    for lang in LANGUAGES[1:]:
        assert pages(lang) == pages("en"), lang


def test_every_stage_has_a_chapter_and_every_chapter_a_stage():
    assert sorted(stage_for(c) for c in chapters()) == all_stages()


@pytest.mark.parametrize("page", pages("en"))
@pytest.mark.parametrize("lang", LANGUAGES[1:])
def test_translations_are_parallel(page, lang):
    assert parallel_problems(read("en", page), read(lang, page)) == []


@pytest.mark.parametrize("chapter", chapters())
@pytest.mark.parametrize("lang", LANGUAGES)
def test_chapter_names_only_what_the_code_has(chapter, lang):
    """The teaching parts against the teaching file; "Under attack" and "Compared with
    Hermes" against the hardened file (and the teaching one, which they compare with)."""
    stage = stage_for(chapter)
    source, previous = stage_source(stage), stage_source(stage, -1)
    hardened = stage_source(stage, 0, "hardened")
    teaching_text, hardened_text = parts_by_edition(read(lang, chapter), read("en", chapter))
    assert identifier_problems(teaching_text, source, previous,
                               next_source=stage_source(stage, +1)) == []
    assert excerpt_problems(teaching_text, source) == []
    assert name_problems(prose(hardened_text), hardened, source,
                         stage_source(stage, -1, "hardened"), previous) == []
    assert excerpt_problems(hardened_text, hardened + "\n" + source) == []


@pytest.mark.parametrize("chapter", chapters())
@pytest.mark.parametrize("lang", LANGUAGES)
def test_removed_names_appear_only_in_changes(chapter, lang):
    stage = stage_for(chapter)
    removed = [n for n in course_lineage()[stage]["removed"] if not n.startswith("<")]
    position, _ = h2_part(sections(read("en", chapter)), CHANGES)
    changes = position if position >= 0 else None
    assert removed_name_problems(read(lang, chapter), removed, changes) == []


MAIN_PATH_WORDS = 3500       # a reader finishes the main path in one sitting (curriculum §6)
FOLDED_HEADER = re.compile(r"^( *)\?\?\? ")          # ??? is folded; ???+ and !!! are shown


def main_path(text: str) -> str:
    """The prose a reader meets: no fenced code, no collapsed (???) admonition's body."""
    kept, folded_at = [], None
    for line in prose(text).split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        if folded_at is not None:
            if not line.strip() or indent > folded_at:
                continue
            folded_at = None
        header = FOLDED_HEADER.match(line)
        if header:
            folded_at = len(header.group(1))
            continue
        kept.append(line)
    return "\n".join(kept)


def main_path_words(text: str) -> int:
    return len(re.findall(r"\S+", main_path(text)))


@pytest.mark.parametrize("chapter", chapters())
def test_the_main_path_is_read_in_one_sitting(chapter):
    assert main_path_words(read("en", chapter)) <= MAIN_PATH_WORDS


def test_the_main_path_leaves_out_code_and_what_is_folded():
    text = ("One two.\n\n```python\nx = 1\n```\n\n??? note \"Folded\"\n\n    four five six\n"
            "\n!!! note \"Shown\"\n\n    seven\n\n???+ note \"Open\"\n\n    eight\n\nnine\n")
    # "One two." + the !!! header (3) + "seven" + the ???+ header (3) + "eight" + "nine"
    assert main_path_words(text) == 2 + 3 + 1 + 3 + 1 + 1


@pytest.mark.parametrize("chapter", chapters())
def test_chapter_follows_the_skeleton(chapter):
    assert skeleton_problems(read("en", chapter)) == []


@pytest.mark.parametrize("chapter", [c for c in chapters() if stage_number(stage_for(c)) >= 2])
@pytest.mark.parametrize("lang", LANGUAGES)
def test_chapter_links_to_its_diff_page(chapter, lang):
    problems = diff_link_problems(read("en", chapter), read(lang, chapter), stage_for(chapter))
    assert problems == [], f"docs/{lang}/{chapter}: {problems}"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_links_between_pages_are_relative(lang):
    """An absolute link breaks when the site is served from a sub-path or opened from disk."""
    absolute = [(page, link) for page in pages(lang) for s in sections(read(lang, page))
                for link in s.links if link.startswith("/")]
    assert absolute == []


# One Chinese term for a detector's result (issue 23): 检出项. 发现 stays as the verb "to find"
# (扫描发现了, 什么也没发现); these are the phrases that used it as the noun "a finding".
FINDING_AS_NOUN = re.compile(r"发现(?:项|键|\s*id)|[项个]发现|(?:任何|全部)发现|(?<!没)有发现[的就]")


@pytest.mark.parametrize("chapter", chapters())
def test_zh_calls_a_finding_one_name(chapter):
    zh = read("zh", chapter)
    assert FINDING_AS_NOUN.findall(zh) == [], f"docs/zh/{chapter}: 检出项, not 发现"
    en_prose = INLINE_CODE.sub("", prose(read("en", chapter)))
    if re.search(r"\bfindings?\b", en_prose, re.IGNORECASE):
        assert "检出项" in zh, f"docs/zh/{chapter} discusses findings without 检出项"


# ── The site: diff pages, navigation, language links ───────────────────────

def docs_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fenced(page: str, language: str) -> str:
    match = re.search(rf"^(`{{3,}}){language}\n(.*?)^\1$", page, re.MULTILINE | re.DOTALL)
    assert match, f"no ```{language} block in:\n{page[:300]}"
    return match.group(2)


def language_folders(tmp_path: Path, languages=LANGUAGES) -> Path:
    for lang in languages:
        (tmp_path / lang).mkdir(parents=True)
        (tmp_path / lang / "index.md").write_text("# Home\n", encoding="utf-8")
    return tmp_path


@pytest.fixture(scope="module")
def diff_pages(tmp_path_factory):
    """The diff pages of every language, written once (about 2 s) for the tests below:
    (docs folder, the pages written)."""
    docs = language_folders(tmp_path_factory.mktemp("docs"))
    hooks = docs_hooks()
    return docs, hooks.write_diff_pages(docs, AGENTS, hooks.stage_changes(ROOT))


def code_without_docstring(text: str) -> list[str]:
    """The lines after the module docstring (the generated line and docstring go)."""
    end = ast.parse(text).body[0].end_lineno
    return text.splitlines(keepends=True)[end:]


def test_diff_pages_hold_the_real_diff(diff_pages):
    docs, written = diff_pages
    stages = all_stages()
    assert sorted(written) == sorted(docs / lang / "diff" / f"{s[:3]}.md"
                                     for lang in LANGUAGES for s in stages[1:])
    pairs = list(zip(stages, stages[1:]))
    for old, new in {pairs[0], pairs[len(pairs) // 2], pairs[-1]}:     # three are enough
        a, b = [code_without_docstring((AGENTS / f"{s}.py").read_text(encoding="utf-8"))
                for s in (old, new)]
        expected = "".join(difflib.unified_diff(a, b, f"agents/{old}.py", f"agents/{new}.py"))
        assert "Reading guide" not in expected, "the diff leaves the docstrings out"
        titles = set()
        for lang in LANGUAGES:
            page = (docs / lang / "diff" / f"{new[:3]}.md").read_text(encoding="utf-8")
            assert fenced(page, "diff") == expected, f"{lang}/diff/{new[:3]}.md"
            titles.add(re.search(r"^# (.+)$", page, re.MULTILINE).group(1))
            chapter = re.search(r"\]\(\.\./(s\d\d-[a-z0-9-]+\.md)\)", page).group(1)
            assert (DOCS / lang / chapter).is_file(), f"{lang}/diff links to {chapter}"
        assert len(titles) == len(LANGUAGES), f"titles are not translated: {titles}"


def test_diff_pages_list_what_the_stage_adds_changes_and_removes(diff_pages):
    docs, _ = diff_pages
    for lang in LANGUAGES:
        page = (docs / lang / "diff" / "s09.md").read_text(encoding="utf-8")
        assert page.index("```diff") < page.index("\n## ")     # the code comes first
        listed = fenced(page, "text")
        assert "DANGEROUS_PATTERNS" in listed.split("changed:")[0]
        assert "write_file()" in listed.split("changed:")[1]


def test_diff_pages_are_written_only_when_they_change(diff_pages):
    docs, _ = diff_pages
    hooks = docs_hooks()
    stale = docs / "zh" / "diff" / "s99.md"
    stale.write_text("old", encoding="utf-8")
    # `mkdocs serve` must not loop
    assert hooks.write_diff_pages(docs, AGENTS, hooks.stage_changes(ROOT)) == []
    assert not stale.exists()


def test_diff_pages_refuse_a_language_without_text(tmp_path):
    docs = language_folders(tmp_path, LANGUAGES + ["xx"])
    with pytest.raises(Exception, match="xx"):
        docs_hooks().write_diff_pages(docs, AGENTS)
    assert not (docs / "en" / "diff").exists()


def test_diff_page_fence_outlasts_backticks_in_the_code(tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "s01_a.py").write_text("x = 1\n", encoding="utf-8")
    (agents / "s02_b.py").write_text('x = """\n```\n"""\n', encoding="utf-8")
    docs = language_folders(tmp_path / "docs")
    docs_hooks().write_diff_pages(docs, agents)
    page = (docs / "en" / "diff" / "s02.md").read_text(encoding="utf-8")
    assert "+```\n" in fenced(page, "diff")


def mkdocs_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def nav_entries(nav: list) -> list[tuple[str, str | None]]:
    """(title, file) for every page and (title, None) for every section."""
    entries = []
    for item in nav:
        for title, target in item.items():
            if isinstance(target, list):
                entries += [(title, None)] + nav_entries(target)
            else:
                entries.append((title, target))
    return entries


def test_nav_lists_every_page():
    files = {target for _, target in nav_entries(mkdocs_config()["nav"]) if target}
    diff_pages = {f"diff/{s[:3]}.md" for s in all_stages()[1:]}
    hardened_pages = {f"hardened/{s[:3]}.md" for s in all_stages()}
    assert files == {"index.md"} | set(chapters()) | diff_pages | hardened_pages


def test_the_hardened_pages_hold_the_editions_diff(tmp_path):
    docs = language_folders(tmp_path)
    hooks = docs_hooks()
    written = hooks.write_hardened_pages(docs, AGENTS)
    assert len(written) == len(LANGUAGES) * len(all_stages())
    stages = all_stages()
    for stage in (stages[0], stages[len(stages) // 2], stages[-1]):     # three are enough
        teaching = code_without_docstring((AGENTS / f"{stage}.py").read_text(encoding="utf-8"))
        hardened = code_without_docstring(
            (AGENTS / "hardened" / f"{stage}.py").read_text(encoding="utf-8"))
        expected = "".join(difflib.unified_diff(teaching, hardened, f"agents/{stage}.py",
                                                f"agents/hardened/{stage}.py"))
        titles = set()
        for lang in LANGUAGES:
            page = (docs / lang / "hardened" / f"{stage[:3]}.md").read_text(encoding="utf-8")
            titles.add(re.search(r"^# (.+)$", page, re.MULTILINE).group(1))
            if expected:
                assert fenced(page, "diff") == expected, f"{lang}/hardened/{stage[:3]}.md"
            else:
                assert "```" not in page and stage[:3] in page.split("\n")[-2]
        assert len(titles) == len(LANGUAGES)
    assert hooks.write_hardened_pages(docs, AGENTS) == []       # `mkdocs serve` must not loop


def test_the_site_shows_a_100_character_line_whole():
    """The stylesheet tests/check_site_width.py measures in a real browser is in use."""
    assert "assets/extra.css" in mkdocs_config()["extra_css"]
    css = (DOCS / "assets" / "extra.css").read_text(encoding="utf-8")
    assert ".md-grid" in css and "pre > code" in css


def test_nav_titles_are_translated():
    config = mkdocs_config()
    i18n = next(p["i18n"] for p in config["plugins"] if isinstance(p, dict) and "i18n" in p)
    titles = {title for title, _ in nav_entries(config["nav"])
              if not re.match(r"^s\d\d( → s\d\d)?$", title)}  # stage numbers need none
    for language in i18n["languages"]:
        if not language.get("default"):
            missing = titles - set(language.get("nav_translations", {}))
            assert not missing, f"{language['locale']}: no nav_translations for {missing}"


def test_language_links_on_home_pages_are_relative():
    """mkdocs-static-i18n leaves "/zh/" on the home pages; the hook makes every link relative
    (mkdocs' `url` filter, as the theme applies it, then resolves it against the page)."""
    from mkdocs.utils import normalize_url
    homes = {"en": "./", "zh": "zh/", "ru": "ru/"}
    for lang, url in homes.items():
        page = SimpleNamespace(url="" if url == "./" else url, file=SimpleNamespace(
            alternates={other: SimpleNamespace(url=u) for other, u in homes.items()}))
        switcher = [{"lang": other, "link": "/" if other == "en" else f"/{other}/"}
                    for other in homes]
        config = SimpleNamespace(extra=SimpleNamespace(alternate=switcher))
        docs_hooks().on_page_context({}, page, config, None)
        for entry in switcher:
            link = normalize_url(entry["link"], page)
            assert not link.startswith("/"), (lang, entry)
            target = Path("/site", page.url, link).resolve()
            assert target == Path("/site", homes[entry["lang"]]).resolve(), (lang, entry, link)


# ── The checks themselves must be able to fail ─────────────────────────────

def test_checks_catch_invented_names_and_edited_excerpts():
    source = "MAX = 30\nsession = None\n\n\ndef real_function(count_strikes):\n    return MAX\n"
    page = ("Call `real_function()` or `fake_function()`; `MAX = 30` and `MAX = 31`; "
            "`GhostClass`; `count_strikes` and `count_misses`; `session.messages`; "
            "`state.db`, `AGENTS.md`, `--max-iterations`, `OPENAI_API_KEY=x`.\n\n"
            "```python\ndef real_function():\n    return MAX + 1\n```\n")
    problems = identifier_problems(page, source)
    assert len(problems) == 5, problems
    for name in ("fake_function", "MAX = 31", "GhostClass", "count_misses", "session.messages"):
        assert any(name in p for p in problems), name
    assert len(excerpt_problems(page, source)) == 1


def test_whats_next_may_name_the_next_stage():
    page = "# T\n\n## How it works\n\n`later_tool`\n\n## What's next\n\n`later_tool`\n"
    problems = identifier_problems(page, "x = 1\n", next_source="def later_tool(): pass\n")
    assert problems == ["`later_tool`: not in the stage file"]


def test_removed_names_are_allowed_only_in_changes():
    page = ("# T\n\n## How it works\n\nNothing old here.\n\n"
            "## Changes from the previous stage\n\n`old_thing()` is gone.\n")
    assert removed_name_problems(page, ["old_thing"], 1) == []
    assert len(removed_name_problems(page, ["old_thing"], 0)) == 1
    assert len(removed_name_problems(page, ["old_thing"], None)) == 1
    assert len(removed_name_problems("# T\n\nNo old_thing.\n" + page, ["old_thing"], 1)) == 1
    page = page.replace("Nothing old here", "See `old_thing.attribute` here")
    assert removed_name_problems(page, ["old_thing"], 1) == [
        "'How it works' names old_thing, which this stage removed: only "
        "'Changes from the previous stage' may"]


def test_parallel_checks_see_structure():
    en = ("# T\n\n## A\n\nOne.\n\nTwo.\n\n- x\n- y\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
          "```bash\nls\n```\n\n??? note \"More\"\n\n    Inside.\n\n    - z\n")
    assert parallel_problems(en, en) == []
    assert [s.shape() for s in sections(en)][2] == {
        "paragraphs": 3, "list items": 3, "tables": 1, "code blocks": 1,
        "admonitions": ["??? note"], "links": 0}
    assert table_shapes(en) == [[2, 2, 2]]
    assert code_blocks(en) == [("bash", "ls\n")]
    for edited in (en.replace("\n\nTwo.", " Two."),                  # a paragraph fewer
                   en.replace("- y\n", ""),                          # a list item fewer
                   en.replace("??? note", "!!! note"),               # not collapsed
                   en.replace("    Inside.\n\n", ""),                # admonition body
                   en.replace("## A", "### A"),                      # heading level
                   en.replace("ls\n", "ls -l\n")):                   # code differs
        assert parallel_problems(en, edited), edited


GOOD_CHAPTER = """# s02 · Something

## The problem

Text.

## The idea in one screen

Text.

## A worked trace

<!-- trace: {"stage": "s01_loop", "input": ["$ echo hi"]} -->
```text
trace
```

## How it works

Text.

## Under attack

??? warning "What an attacker tries"

    Text.

## Compared with Hermes

??? note "Hermes"

    Text.

## Changes from the previous stage

See [the whole diff](diff/s02.md).

## Try it

Text.

## Exercises

### 1. Predict

??? success "Solution"

    Text.

### 2. Change

??? success "Solution"

    Text.

### 3. Break it

??? success "Solution"

    Text.

## What's next

Text.
"""


def test_skeleton_check_accepts_the_shape_and_catches_each_departure():
    assert skeleton_problems(GOOD_CHAPTER) == []
    assert diff_link_problems(GOOD_CHAPTER, GOOD_CHAPTER, "s02_something") == []
    departures = {
        "## The problem": ("## Problem", "the ## headings"),
        '??? warning "What': ('!!! warning "What', "`??? warning`"),
        '??? note "Hermes"': ('??? tip "Hermes"', "`??? note`"),
        "<!-- trace:": ("<!-- no trace:", "trace marker"),
        "### 3. Break it\n\n??? success": ("### 3. Break it\n\n??? info", "'3. Break it'"),
        "### 3. Break it": ("Break it", "fewer than 3"),
        "# s02 · Something": ("Something", "# title"),
    }
    for old, (new, message) in departures.items():
        problems = skeleton_problems(GOOD_CHAPTER.replace(old, new))
        assert any(message in p for p in problems), (old, problems)
    unlinked = GOOD_CHAPTER.replace("[the whole diff](diff/s02.md)", "the diff")
    assert "diff/s02.md" in diff_link_problems(GOOD_CHAPTER, unlinked, "s02_something")[0]
