"""Write the stage files of both editions from the one source in course/.

    python course/build.py                  write agents/sNN_*.py (the teaching edition) and
                                            agents/hardened/sNN_*.py from course/sNN_*.py
    python course/build.py --check          exit 1 if a committed stage file is not what
                                            course/ produces (names the file and line)
    python course/build.py --changes s09    what stage s09 adds, changes and removes
                                            (--edition hardened: in the hardened edition)

The source. Each course/sNN_<name>.py holds exactly what stage NN adds, changes and
removes, in areas that start with a directive line:

    #: docstring                 the stage's module docstring ("#: docstring | hardened":
                                 one edition's own); a line holding only
                                 {changed elsewhere} becomes the list of definitions this
                                 stage changes in earlier stages' sections
    #: imports                   what this part's code imports (each stage file gets the
                                 imports its code uses, in the usual groups)
    #: section Title             a section of this stage: a banner "# ── [sNN] Title ──",
                                 then its definitions. Options after "|": plumbing (placed
                                 after every lesson section), untagged (no [sNN] in the
                                 banner), hardened (its definitions are the hardened
                                 edition's only)
    #: more for Title            more definitions for an earlier stage's untagged section
                                 (the offline model)
    #: changes                   this stage's variants of earlier definitions: each one
                                 replaces the earlier text where it stands
    #: removes a, b              earlier definitions this stage drops
    #: wiring                    statements that run at import time and use names from
                                 other sections (registering a tool, building the settings)

A definition is one top-level statement with the comments right above it, named as
Python names it: a function or class by its name, an assignment by its target, any other
statement by its own text in angle brackets, e.g. <REGISTRY.register(MEMORY_ENTRY)>.
A line "#: teaching" or "#: hardened" right above a definition's comments gives it (and
the definitions right below it, up to a blank line) to one edition; the same name may
then follow with the other edition's text. Everything
else is shared: the teaching edition (agents/) is the simple, never wrong core that
learners read; the hardened edition (agents/hardened/) adds every guard and detail.

The order of a generated stage file: the docstring and imports; this stage's own
sections (its lesson); the earlier stages' lesson sections, newest first; the plumbing
sections in stage order; the wiring of every stage, in stage order, so tools are offered
in the order the stages added them; and last the `if __name__ == "__main__":` block.
Reading newest first, later code may not use a name at import time that an earlier
stage defines further down: the build finds every such line and refuses, as it refuses
a name that the file uses but never defines. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import functools
import re
import symtable
import sys
import textwrap
from pathlib import Path

COURSE = Path(__file__).resolve().parent
ROOT = COURSE.parent
EDITIONS = ("teaching", "hardened")
BOTH = frozenset(EDITIONS)
FOLDERS = {"teaching": "agents", "hardened": "agents/hardened"}
GENERATED_LINE = "# Generated from course/ by course/build.py: edit there, then rebuild."
GENERATED_LINES = {"teaching": GENERATED_LINE,
                   "hardened": "# Generated from course/ by course/build.py (the hardened "
                               "edition): edit there, then rebuild."}
EDITION_MARKER = re.compile(r"^#: (teaching|hardened)$")
CHANGED_ELSEWHERE = "{changed elsewhere}"
PART_FILE = re.compile(r"^s(\d\d)_([a-z0-9_]+)\.py$")
DIRECTIVE = re.compile(r"^#: ?(\S+)(.*)$")
BANNER_WIDTH = 78
MAX_DOCSTRING_LINES = 40
WIRING_TITLE = "Wiring: module-level set-up, run once everything above is defined"
MAIN = "<main>"


class BuildError(Exception):
    """A broken source: the message names the file and line, and what to do."""


# ── Reading the source ────────────────────────────────────────────────────


@dataclasses.dataclass
class Variant:
    stage: int                  # the stage that wrote this text
    text: str                   # the comments right above the statement, and the statement
    where: str                  # course/sNN_<name>.py:line, for messages
    editions: frozenset = BOTH  # the editions that carry it


@dataclasses.dataclass
class Definition:
    name: str
    section: "Section"
    blank_lines: int            # blank lines above it where it stands
    variants: list[Variant]
    removed_in: int | None = None

    def text_at(self, stage: int, edition: str = "teaching") -> str | None:
        """The text stage `stage` of `edition` carries, or None if it does not carry it."""
        if self.removed_in is not None and stage >= self.removed_in:
            return None
        texts = [v.text for v in self.variants if v.stage <= stage and edition in v.editions]
        return texts[-1] if texts else None


@dataclasses.dataclass
class Section:
    stage: int
    title: str
    plumbing: bool = False
    tagged: bool = True
    editions: frozenset = BOTH  # its definitions' editions, unless they say otherwise
    definitions: list[Definition] = dataclasses.field(default_factory=list)

    def banner(self) -> str:
        label = f"[s{self.stage:02d}] {self.title}" if self.tagged else self.title
        return f"# ── {label} ".ljust(BANNER_WIDTH, "─")


@dataclasses.dataclass
class Part:
    stage: int
    name: str                   # e.g. "s09_permission_system"
    path: Path
    docstrings: dict[str, str] = dataclasses.field(default_factory=dict)
    imports: list[ast.stmt] = dataclasses.field(default_factory=list)
    sections: list[Section] = dataclasses.field(default_factory=list)
    wiring: list[Definition] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Course:
    parts: list[Part]
    definitions: dict[str, Definition]

    def part(self, label: str) -> Part:
        """The part for 's09' or 's09_permission_system'."""
        for part in self.parts:
            if label in (part.name, part.name[:3]):
                return part
        known = ", ".join(part.name[:3] for part in self.parts)
        raise BuildError(f"unknown stage {label!r} (the stages are {known})")


def read_course(course_dir: Path = COURSE) -> Course:
    """Every part, in stage order, with each definition's variants linked up."""
    files = sorted(p for p in course_dir.glob("s*.py"))
    parts = []
    for number, path in enumerate(files, start=1):
        match = PART_FILE.match(path.name)
        if not match or int(match.group(1)) != number:
            expected = f"s{number:02d}_<name>.py"
            raise BuildError(f"{relative(path)}: unknown stage: the parts must be named "
                             f"s01_<name>.py, s02_<name>.py, … with no gap ({expected} here)")
        parts.append(Part(number, path.stem, path))
    if not parts:
        raise BuildError(f"{course_dir}: no stage parts (s01_<name>.py, …)")
    course = Course(parts, {})
    for part in parts:
        read_part(course, part)
    return course


def read_part(course: Course, part: Part) -> None:
    lines = part.path.read_text(encoding="utf-8").splitlines()
    areas = []                                      # (directive, argument, first line, lines)
    for number, line in enumerate(lines, start=1):
        match = DIRECTIVE.match(line)
        if match and not EDITION_MARKER.match(line):    # a marker belongs to the area
            areas.append((match.group(1), match.group(2).strip(), number, []))
        elif areas:
            areas[-1][3].append(line)
        elif line.strip() and not line.startswith("#"):
            raise BuildError(f"{where(part, number)}: code before the first '#:' directive")
    seen: set[str] = set()
    for kind, argument, number, body in areas:
        at = where(part, number)
        if kind in ("imports", "changes", "wiring") and argument:
            raise BuildError(f"{at}: '#: {kind}' takes no argument")
        if kind == "docstring":
            for edition in editions_named(argument.removeprefix("|"), at, BOTH):
                part.docstrings[edition] = "\n".join(body).strip("\n")
        elif kind == "imports":
            part.imports.extend(import_statements(part, body, number))
        elif kind == "section":
            section = new_section(part, argument, at)
            add_definitions(course, part, section, body, number)
        elif kind == "more":
            add_definitions(course, part, shared_section(course, part, argument, at), body,
                            number)
        elif kind == "changes":
            add_variants(course, part, body, number)
        elif kind == "removes":
            remove(course, part, argument, at)
        elif kind == "wiring":
            add_definitions(course, part, None, body, number)
        else:
            raise BuildError(f"{at}: unknown directive '#: {kind}' (known: docstring, "
                             f"imports, section, more for, changes, removes, wiring)")
        seen.add(kind)
    if set(part.docstrings) != BOTH:
        raise BuildError(f"{relative(part.path)}: no '#: docstring' area"
                         + (" for the " + " and ".join(sorted(BOTH - set(part.docstrings)))
                            + " edition" if part.docstrings else ""))


def editions_named(words: str, at: str, default: frozenset) -> frozenset:
    """The editions a directive's options name ("teaching", "hardened"), or `default`."""
    named = frozenset(word.strip() for word in words.split(",") if word.strip())
    if named - BOTH:
        raise BuildError(f"{at}: unknown edition(s) {', '.join(sorted(named - BOTH))} "
                         f"(the editions are teaching and hardened)")
    return named or default


def import_statements(part: Part, body: list[str], first_line: int) -> list[ast.stmt]:
    try:
        nodes = ast.parse("\n".join(body)).body
    except SyntaxError as error:
        raise BuildError(f"{where(part, first_line + (error.lineno or 0))}: {error.msg}") \
            from None
    for node in nodes:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            raise BuildError(f"{where(part, first_line + node.lineno)}: only imports go in "
                             f"the '#: imports' area")
    return nodes


def new_section(part: Part, argument: str, at: str) -> Section:
    title, _, options = argument.partition("|")
    words = {word.strip() for word in options.split(",") if word.strip()}
    unknown = words - {"plumbing", "untagged"} - BOTH
    if not title.strip() or unknown:
        raise BuildError(f"{at}: expected '#: section Title | plumbing, untagged, hardened' "
                         f"(unknown: {', '.join(sorted(unknown)) or 'no title'})")
    section = Section(part.stage, title.strip(), "plumbing" in words, "untagged" not in words,
                      editions_named(",".join(words & BOTH), at, BOTH))
    part.sections.append(section)
    return section


def shared_section(course: Course, part: Part, argument: str, at: str) -> Section:
    """`#: more for Title`: more definitions for an untagged section of an earlier stage
    (the offline model, which every stage teaches a verb or two). A tagged section holds
    only what its own stage wrote, so that its banner stays true."""
    if not argument.startswith("for "):
        raise BuildError(f"{at}: expected '#: more for Title'")
    title = argument.removeprefix("for ").strip()
    for earlier in course.parts[:part.stage - 1]:
        for section in earlier.sections:
            if section.title == title:
                if section.tagged:
                    raise BuildError(f"{at}: '{title}' is s{section.stage:02d}'s section and "
                                     f"its banner says so: put this stage's definitions in a "
                                     f"section of its own")
                return section
    raise BuildError(f"{at}: no earlier stage has a section '{title}'")


def statements(part: Part, body: list[str], first_line: int, default: frozenset = BOTH):
    """(name, blank lines above, text, line, editions) for each top-level statement of an
    area. A line "#: teaching" or "#: hardened" above a statement's comments gives it to
    that edition only, and the statements right below it with no blank line between."""
    source = "\n".join(body) + "\n"
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise BuildError(f"{where(part, first_line + (error.lineno or 0))}: "
                         f"{error.msg}") from None
    previous_end, marked = 0, None
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        above = body[previous_end:start - 1]
        blank = 0
        while blank < len(above) and not above[blank].strip():
            blank += 1
        comments = above[blank:]                    # may hold a paragraph of its own
        if comments and EDITION_MARKER.match(comments[0]):
            marked = frozenset([EDITION_MARKER.match(comments[0]).group(1)])
            comments = comments[1:]
        elif blank or previous_end == 0:
            marked = None                           # a blank line ends a marked paragraph
        editions = marked or default
        if any(EDITION_MARKER.match(line) for line in comments):
            raise BuildError(f"{where(part, first_line + start)}: an edition marker goes "
                             f"right above the statement's comments, once")
        text = "\n".join(comments + body[start - 1:node.end_lineno])
        previous_end = node.end_lineno
        yield statement_name(node), min(blank, 2), text, first_line + start, editions
    trailing = [line for line in body[previous_end:] if line.strip()]
    if trailing:
        raise BuildError(f"{where(part, first_line + previous_end + 1)}: a comment after "
                         f"the last statement of the area belongs to no definition")


def statement_name(node: ast.stmt) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign):
        return " = ".join(ast.unparse(target) for target in node.targets)
    if isinstance(node, ast.AnnAssign):
        return ast.unparse(node.target)
    if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
        return MAIN
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return "<import>"
    return f"<{ast.unparse(node)}>"


def add_definitions(course: Course, part: Part, section: Section | None, body: list[str],
                    first_line: int) -> None:
    default = section.editions if section is not None else BOTH
    for name, blank, text, line, editions in statements(part, body, first_line, default):
        at = where(part, line)
        if name == "<import>":
            raise BuildError(f"{at}: imports go in the '#: imports' area")
        variant = Variant(part.stage, text, at, editions)
        defined = course.definitions.get(name)
        if defined is not None:
            same_place = defined.section is section and defined.variants[0].stage == part.stage
            if not same_place:
                raise BuildError(f"{at}: duplicate: {name} is already defined "
                                 f"({defined.variants[0].where}); to change it in this "
                                 f"stage, put the new text under '#: changes'")
            add_edition_variant(defined, variant)     # the other edition's text, side by side
            continue
        definition = Definition(name, section, blank, [variant])
        course.definitions[name] = definition
        if section is None:
            part.wiring.append(definition)
        else:
            section.definitions.append(definition)


def add_variants(course: Course, part: Part, body: list[str], first_line: int) -> None:
    for name, _, text, line, editions in statements(part, body, first_line):
        at = where(part, line)
        definition = course.definitions.get(name)
        if definition is None or definition.variants[0].stage >= part.stage:
            raise BuildError(f"{at}: a variant of {name}, which no earlier stage defines "
                             f"(to add it, put it in a '#: section')")
        if definition.removed_in is not None:
            raise BuildError(f"{at}: {name} was removed in s{definition.removed_in:02d}")
        add_edition_variant(definition, Variant(part.stage, text, at, editions))


def add_edition_variant(definition: Definition, variant: Variant) -> None:
    """Add a later stage's variant, or the other edition's text in the same stage."""
    for other in definition.variants:
        if other.stage == variant.stage and other.editions & variant.editions:
            raise BuildError(f"{variant.where}: duplicate: a second variant of "
                             f"{definition.name} in this stage (the first is at "
                             f"{other.where})")
    earlier = {edition: definition.text_at(variant.stage - 1, edition)
               for edition in variant.editions}
    if variant.stage > definition.variants[0].stage and \
            all(text == variant.text for text in earlier.values()):
        latest = [v for v in definition.variants if v.stage < variant.stage][-1]
        raise BuildError(f"{variant.where}: this variant of {definition.name} is the same "
                         f"text as s{latest.stage:02d}'s ({latest.where}): drop it")
    definition.variants.append(variant)
    definition.variants.sort(key=lambda v: v.stage)


def remove(course: Course, part: Part, argument: str, at: str) -> None:
    for name in (n.strip() for n in argument.split(",")):
        definition = course.definitions.get(name)
        if definition is None or definition.variants[0].stage >= part.stage:
            raise BuildError(f"{at}: removes {name}, which no earlier stage defines")
        if definition.removed_in is not None:
            raise BuildError(f"{at}: {name} was already removed in "
                             f"s{definition.removed_in:02d}")
        definition.removed_in = part.stage


def where(part: Part, line: int) -> str:
    return f"{relative(part.path)}:{line}"


def relative(path: Path) -> str:
    """course/s09_permission_system.py: a part as a contributor names it."""
    return f"{path.parent.name}/{path.name}"


# ── What a stage adds, changes and removes ────────────────────────────────


def lineage(course: Course, stage: int, edition: str = "teaching"
            ) -> dict[str, list[Definition]]:
    """The definitions stage `stage` of `edition` adds, changes and removes, compared
    with the stage before it, in source order."""
    found: dict[str, list[Definition]] = {"added": [], "changed": [], "removed": []}
    for definition in course.definitions.values():
        before = definition.text_at(stage - 1, edition) if stage > 1 else None
        after = definition.text_at(stage, edition)
        if before is None and after is not None:
            found["added"].append(definition)
        elif before is not None and after is None:
            found["removed"].append(definition)
        elif before is not None and before != after:
            found["changed"].append(definition)
    return found


def introduced_in(definition: Definition, edition: str) -> int | None:
    """The first stage of `edition` that carries the definition."""
    stages = [v.stage for v in definition.variants if edition in v.editions]
    return stages[0] if stages else None


def place(definition: Definition) -> str:
    if definition.section is None:
        return "wiring"
    if definition.section.plumbing:
        return "plumbing"
    return f"[s{definition.section.stage:02d}]"


def shown(definition: Definition) -> str:
    text = definition.variants[0].text
    is_function = re.search(rf"^(?:async )?def {re.escape(definition.name)}\b", text, re.M)
    return definition.name + ("()" if is_function else "")


def changed_elsewhere(course: Course, stage: int, edition: str = "teaching") -> str:
    """The reading guide's list of what this stage changes where earlier stages' lesson
    code stands, e.g. "run_conversation() in [s01]; IterationBudget in [s06]"."""
    groups: dict[str, list[str]] = {}
    plumbing = 0
    for definition in lineage(course, stage, edition)["changed"]:
        if definition.name in ("STAGE", "STAGE_TITLE"):
            continue                                # every stage names itself
        if place(definition).startswith("["):
            groups.setdefault(place(definition), []).append(shown(definition))
        else:
            plumbing += 1
    parts = [f"{', '.join(names)} in {where_}" for where_, names in sorted(groups.items())]
    text = "Changed in earlier stages' sections: " + ("; ".join(parts) if parts else "none")
    if plumbing:
        flag = "" if edition == "teaching" else f" --edition {edition}"
        text += (f"; and {plumbing} definitions of the plumbing (python course/build.py "
                 f"--changes s{stage:02d}{flag} lists them all)")
    return text + "."


def describe_changes(course: Course, label: str, edition: str = "teaching") -> str:
    """The text of `--changes sNN`, also shown on the site's diff page."""
    part = course.part(label)
    found = lineage(course, part.stage, edition)
    lines = [f"{part.name}: what stage {part.name[:3]} adds, changes and removes "
             f"(course/{part.name}.py" + (")" if edition == "teaching" else
                                            f", the {edition} edition)")]
    for kind in ("added", "changed", "removed"):
        groups: dict[str, list[str]] = {}
        for definition in found[kind]:
            key = place(definition)
            if definition.section is not None:
                key += f" {definition.section.title}"
            groups.setdefault(key, []).append(shown(definition))
        if not groups:
            continue
        lines.append(f"{kind}:")
        for key, names in groups.items():
            wrapped = textwrap.wrap(", ".join(names), 88 - 4)
            lines.append(f"  {key}:")
            lines.extend(f"    {line}" for line in wrapped)
    return "\n".join(lines) + "\n"


# ── Writing a stage file ──────────────────────────────────────────────────


@dataclasses.dataclass
class Rendered:
    text: str
    statements: list[tuple[int, str]]       # (first line in the file, text) of each one


class Writer:
    """Lines of code, and where each statement starts (for the checks' messages)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.statements: list[tuple[int, str]] = []

    def statement(self, text: str, blank_lines: int = 0) -> None:
        self.lines.extend([""] * blank_lines)
        self.statements.append((len(self.lines) + 1, text))
        self.lines.extend(text.split("\n"))


def render(course: Course, stage: int, edition: str = "teaching") -> Rendered:
    """Stage `stage`'s file of `edition`: docstring, imports, then its own lesson sections,
    the earlier stages' lesson sections newest first, the plumbing, the wiring, main."""
    lesson = [s for p in reversed(course.parts[:stage]) for s in p.sections if not s.plumbing]
    plumbing = [s for p in course.parts[:stage] for s in p.sections if s.plumbing]
    plumbing.sort(key=lambda s: not s.tagged)       # untagged ones (the offline model) last
    code = Writer()
    for section in lesson + plumbing:
        carried = [(d, d.text_at(stage, edition)) for d in section.definitions]
        carried = [(d, text) for d, text in carried if text is not None]
        if carried:
            code.lines.extend([section.banner()] if not code.lines else ["", section.banner()])
            previous = None
            for definition, text in carried:
                code.statement(text, blank_lines_above(definition, text, previous))
                previous = text
    add_wiring(course, stage, edition, code)
    main = course.definitions.get(MAIN)
    if main is not None and main.text_at(stage, edition) is not None:
        code.lines.append("")
        code.statement(main.text_at(stage, edition), 1)
    used = set().union(*(facts(text).names for _, text in code.statements))
    head = [GENERATED_LINES[edition], docstring_text(course, course.parts[stage - 1], edition),
            "",
            "from __future__ import annotations", "", import_block(course, stage, used), ""]
    head_lines = "\n".join(head).count("\n")
    statements = [(line + head_lines, text) for line, text in code.statements]
    return Rendered("\n".join(head) + "\n".join(code.lines) + "\n", statements)


def blank_lines_above(definition: Definition, text: str, previous: str | None) -> int:
    """As the source has them, but one around a function or class: a definition carried by
    only one edition may stand next to other neighbours than in the source. One, not PEP 8's
    two: the section banners already group the file, and the teaching edition has a line
    budget spent better on code than on ~330 extra blank lines (s12). At most one anywhere
    else too, e.g. right below a banner."""
    if previous is not None and (is_function_or_class(text) or is_function_or_class(previous)):
        return 1
    return min(definition.blank_lines, 1)


def is_function_or_class(text: str) -> bool:
    code = next(line for line in text.splitlines() if not line.startswith("#"))
    return code.startswith(("def ", "class ", "async def ", "@"))


def add_wiring(course: Course, stage: int, edition: str, code: Writer) -> None:
    banner = f"# ── {WIRING_TITLE} ".ljust(BANNER_WIDTH, "─")
    for part in course.parts[:stage]:
        texts = [d.text_at(stage, edition) for d in part.wiring if d.name != MAIN]
        texts = [text for text in texts if text is not None]
        if texts:
            if banner:
                code.lines.extend(["", banner])
                banner = ""
            code.lines.extend(["", f"# [s{part.stage:02d}]"])
            for text in texts:
                code.statement(text)


def docstring_text(course: Course, part: Part, edition: str) -> str:
    text = part.docstrings[edition]
    if CHANGED_ELSEWHERE in text:
        line = next(line for line in text.splitlines() if CHANGED_ELSEWHERE in line)
        indent = line[:len(line) - len(line.lstrip())]
        replacement = "" if part.stage == 1 else textwrap.fill(
            changed_elsewhere(course, part.stage, edition), 92, initial_indent=indent,
            subsequent_indent=indent)
        text = text.replace(line + "\n", replacement + "\n" if replacement else "")
    count = len(text.splitlines())
    if count > MAX_DOCSTRING_LINES:
        raise BuildError(f"{relative(part.path)}: the {edition} docstring of {part.name} is "
                         f"{count} lines; at most {MAX_DOCSTRING_LINES}")
    return text


def import_block(course: Course, stage: int, used: set[str]) -> str:
    """The imports of every part up to `stage` that the code uses, grouped as usual:
    the standard library, then the rest; plain imports before from-imports."""
    plain: dict[str, set[str]] = {}                   # "import x" / "import x as y" lines
    from_: dict[str, set[str]] = {}                   # module -> "name" or "name as y"
    for node, alias in imports(course, stage):
        if bound_name(alias) not in used:
            continue
        shown_name = alias.name + (f" as {alias.asname}" if alias.asname else "")
        if isinstance(node, ast.Import):
            plain.setdefault(alias.name.split(".")[0], set()).add(shown_name)
        else:
            from_.setdefault(node.module, set()).add(shown_name)
    groups: list[list[str]] = [[], []]
    for module in sorted(plain, key=str.lower):
        for name in sorted(plain[module]):
            groups[third_party(module)].append(f"import {name}")
    for module in sorted(from_, key=str.lower):
        line = f"from {module} import {', '.join(sorted(from_[module]))}"
        groups[third_party(module)].append(line)
    return "\n\n".join("\n".join(group) for group in groups if group) + "\n"


def imports(course: Course, stage: int):
    """(import statement, alias) for each name the parts up to `stage` import."""
    for part in course.parts[:stage]:
        for node in part.imports:
            for alias in node.names:
                yield node, alias


def bound_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def third_party(module: str) -> int:
    return 0 if module.split(".")[0] in sys.stdlib_module_names else 1


# ── Checks of a generated file ────────────────────────────────────────────


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one top-level statement binds and reads, lines counted from its text."""
    binds: frozenset            # the module-level names it binds
    at_import: tuple            # (name, line): names read when the statement runs
    calls_at_import: frozenset  # names called when it runs
    reads: frozenset            # a function or class: the names calling it may read
    calls: frozenset            # ... and the names it calls in turn
    free: tuple                 # (name, line): names it reads that it does not bind
    names: frozenset            # every name it mentions (which imports to keep)


@functools.lru_cache(maxsize=None)
def facts(text: str) -> Facts:
    """Cached per text: a definition carried by twelve stages is analysed once."""
    node = ast.parse(text).body[0]
    at_import = list(walk_at_import(node))
    local = comprehension_names(node)
    loads = tuple((n.id, n.lineno) for n in at_import if isinstance(n, ast.Name)
                  and isinstance(n.ctx, ast.Load) and n.id not in local)
    body = node
    if isinstance(node, ast.ClassDef):                  # calling a class runs these
        body = ast.Module([n for n in node.body if isinstance(n, ast.FunctionDef)
                           and n.name in ("__init__", "__new__", "__post_init__")], [])
    everything = list(ast.walk(node))
    return Facts(frozenset(bound_at_top(node)), loads, frozenset(called_names(at_import)),
                 frozenset(n.id for n in ast.walk(body) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Load)),
                 frozenset(called_names(ast.walk(body))), tuple(free_names(text)),
                 frozenset(n.id for n in everything if isinstance(n, ast.Name)))


def called_names(nodes) -> set[str]:
    return {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def order_problems(rendered: Rendered, filename: str, imported: set[str]) -> list[str]:
    """Lines that use a name at import time which the file defines only further down,
    and names the file uses but defines nowhere."""
    first_definition: dict[str, int] = {name: 0 for name in imported}
    for line, text in rendered.statements:
        for name in facts(text).binds:
            first_definition.setdefault(name, line)
    needs = names_each_function_needs(rendered, set(first_definition))
    problems = []
    defined = set(dir(builtins)) | imported
    for start, text in rendered.statements:
        found = facts(text)
        for name, line in sorted(found.at_import, key=lambda item: item[1]):
            through = sorted(needs.get(name, ())) if name in found.calls_at_import else []
            missing = [n for n in [name] + through
                       if n not in defined and n in first_definition]
            if missing:
                via = "" if missing[0] == name else f" (through {name})"
                problems.append(f"{filename}:{start + line - 1}: uses {missing[0]} at import "
                                f"time{via}, but it is defined only further down (line "
                                f"{first_definition[missing[0]]}); move the statement under "
                                f"'#: wiring'")
        defined |= found.binds
    known = set(dir(builtins)) | set(first_definition) | MODULE_DUNDERS
    for start, text in rendered.statements:
        problems += [f"{filename}:{start + line - 1}: uses {name}, which this file never "
                     f"defines" for name, line in facts(text).free if name not in known]
    return problems


MODULE_DUNDERS = {"__file__", "__name__", "__doc__", "__spec__", "__builtins__"}


def names_each_function_needs(rendered: Rendered, module_names: set[str]) -> dict[str, set]:
    """For each module-level function and class: the module-level names that calling it
    reads, through the functions it calls in turn (calling a class runs its __init__)."""
    reads, calls = {}, {}
    for _, text in rendered.statements:
        found = facts(text)
        for name in found.binds:
            reads[name] = found.reads & module_names
            calls[name] = found.calls & module_names
    needs = {}
    for name in reads:
        seen, todo, visited = set(reads[name]), list(calls[name]), {name}
        while todo:
            callee = todo.pop()
            if callee in reads and callee not in visited:
                visited.add(callee)
                seen |= reads[callee]
                todo.extend(calls[callee])
        needs[name] = seen
    return needs


def bound_at_top(node: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    found = set()
    for child in walk_at_import(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
            found.add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            found |= bound_at_top(child)
    return found


def walk_at_import(node: ast.AST):
    """The nodes evaluated when `node` runs at module level: not the bodies of functions
    and lambdas, nor annotations (deferred by `from __future__ import annotations`)."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        arguments = node.args
        children = arguments.defaults + [d for d in arguments.kw_defaults if d is not None]
        children += getattr(node, "decorator_list", [])
    elif isinstance(node, ast.ClassDef):
        children = node.decorator_list + node.bases + [k.value for k in node.keywords]
        children += node.body
    elif isinstance(node, ast.AnnAssign):
        children = [node.target] + ([node.value] if node.value else [])
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from walk_at_import(child)


def comprehension_names(node: ast.AST) -> set[str]:
    """Names bound inside comprehensions (their loop variables), which are local."""
    return {n.id for child in ast.walk(node) if isinstance(child, ast.comprehension)
            for n in ast.walk(child.target) if isinstance(n, ast.Name)}


def free_names(text: str):
    """(name, line) for each global name the statement reads but does not bind: its own
    module-level reads, and the global reads of the functions inside it."""
    table = symtable.symtable(text, "statement", "exec")
    missing: dict[str, int] = {}

    def visit(scope: symtable.SymbolTable) -> None:
        top = scope.get_type() == "module"
        for symbol in scope.get_symbols():
            if not symbol.is_referenced():
                continue
            if top and not (symbol.is_assigned() or symbol.is_imported()) or \
                    not top and symbol.is_global() and not symbol.is_assigned():
                missing.setdefault(symbol.get_name(), scope.get_lineno())
        for child in scope.get_children():
            visit(child)

    visit(table)
    lines = text.splitlines()
    for name, scope_line in missing.items():
        pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\b")
        line = next((n for n, t in enumerate(lines, 1)
                     if n >= max(scope_line, 1) and pattern.search(t.split("#")[0])),
                    max(scope_line, 1))
        yield name, line


# ── Building, checking, the command line ──────────────────────────────────


def build(course_dir: Path = COURSE) -> dict[str, str]:
    """{"agents/s01_loop.py": text, "agents/hardened/s01_loop.py": text, …}: every stage
    file of both editions, checked."""
    course = read_course(course_dir)
    files, problems = {}, []
    for edition in EDITIONS:
        for part in course.parts:
            path = f"{FOLDERS[edition]}/{part.name}.py"
            rendered = render(course, part.stage, edition)
            imported = {bound_name(alias) for _, alias in imports(course, part.stage)}
            problems += order_problems(rendered, path, imported)
            files[path] = rendered.text
    if problems:
        raise BuildError("\n".join(problems))
    return files


def write(files: dict[str, str], root: Path = ROOT) -> list[str]:
    """Write the files that differ; return their paths. Stage files of no part go."""
    written = []
    for path, text in files.items():
        target = root / path
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            written.append(path)
    for stale in sorted(stale_stage_files(files, root)):
        (root / stale).unlink()
        written.append(stale)
    return written


def stale_stage_files(files: dict[str, str], root: Path) -> set[str]:
    present = {f"{folder}/{p.name}" for folder in FOLDERS.values()
               for p in (root / folder).glob("s*.py") if PART_FILE.match(p.name)}
    return present - set(files)


def check(files: dict[str, str], root: Path = ROOT) -> list[str]:
    """One line per committed stage file that is not what the source produces."""
    problems = []
    for path, text in files.items():
        target = root / path
        if not target.is_file():
            problems.append(f"{path}: missing; run python course/build.py")
            continue
        committed = target.read_text(encoding="utf-8")
        if committed != text:
            line = first_difference(committed, text)
            problems.append(f"{path}:{line}: differs from what course/ produces; edit "
                            f"course/, then run python course/build.py")
    for stale in sorted(stale_stage_files(files, root)):
        problems.append(f"{stale}: no part in course/ produces it")
    return problems


# The teaching edition's line budget (curriculum §4a): s01 at most 450 lines, each later
# stage at most 400 more (s09: 600), s12 at most 4,500; no line over 100 characters.
FIRST_STAGE_BUDGET, STAGE_BUDGET, LAST_STAGE_BUDGET, MAX_LINE_CHARS = 450, 400, 4500, 100
STAGE_BUDGETS = {9: 600}


def size_table(files: dict[str, str]) -> str:
    """Lines per stage file of both editions, and the teaching edition's ceilings."""
    rows = ["stage                       teaching  (budget)   hardened  longest line"]
    previous = 0
    for path, text in files.items():
        if not path.startswith(FOLDERS["teaching"] + "/s"):
            continue
        name = path.rsplit("/", 1)[1]
        lines = text.count("\n")
        number = int(name[1:3])
        budget = FIRST_STAGE_BUDGET if number == 1 else \
            previous + STAGE_BUDGETS.get(number, STAGE_BUDGET)
        hardened = files[f"{FOLDERS['hardened']}/{name}"].count("\n")
        longest = max(map(len, text.splitlines()))
        rows.append(f"{name[:-3]:27} {lines:8,}  ({budget:6,})   {hardened:8,}  {longest:12}")
        previous = lines
    return "\n".join(rows) + f"\nthe last stage's ceiling: {LAST_STAGE_BUDGET:,} lines\n"


def first_difference(a: str, b: str) -> int:
    a_lines, b_lines = a.splitlines(keepends=True), b.splitlines(keepends=True)
    for number, (x, y) in enumerate(zip(a_lines, b_lines), start=1):
        if x != y:
            return number
    return min(len(a_lines), len(b_lines)) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python course/build.py",
                                     description="Write agents/sNN_*.py from course/.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a stage file is not what course/ "
                             "produces")
    parser.add_argument("--changes", metavar="STAGE",
                        help="print what STAGE (e.g. s09) adds, changes and removes")
    parser.add_argument("--edition", choices=EDITIONS, default="teaching",
                        help="the edition --changes describes (default: teaching)")
    parser.add_argument("--sizes", action="store_true",
                        help="print the lines of every stage file of both editions, next to "
                             "the teaching edition's budget")
    args = parser.parse_args(argv)
    try:
        if args.sizes:
            print(size_table(build()), end="")
            return 0
        if args.changes:
            print(describe_changes(read_course(), args.changes, args.edition), end="")
            return 0
        files = build()
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check:
        problems = check(files)
        for problem in problems:
            print(problem, file=sys.stderr)
        if not problems:
            print(f"{len(files)} stage files (both editions) are what course/ produces")
        return 1 if problems else 0
    written = write(files)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{len(files)} stage files were already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
