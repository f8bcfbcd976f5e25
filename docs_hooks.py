"""Build-time helpers for the docs site, loaded by `hooks:` in mkdocs.yml.

1. Stage diff pages. Before every build, docs/<lang>/diff/sNN.md is written for each stage
   from s02: the unified diff of the code from the previous stage file (the docstrings are
   left out, so the page opens with code), then what the stage adds, changes and removes,
   as course/build.py knows it, with a translated title and sentence. The pages are
   generated from the real files, never edited by hand, and git-ignored. They are written into docs/ rather than added as virtual files because
   mkdocs-static-i18n localises only files inside docs_dir. A page is rewritten only when
   its text changed, or `mkdocs serve` would see a change and rebuild in a loop.
2. What the hardened edition adds. docs/<lang>/hardened/sNN.md, for every stage: the diff
   from the teaching edition (agents/sNN_*.py) to the hardened one (agents/hardened/), the
   code only, written the same way.
3. Relative language links on the home pages. mkdocs-static-i18n gives the home pages'
   language switcher absolute links ("/zh/"), which break when the site is served from a
   sub-path or opened from disk. Every page gets the relative link of its translation.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

STAGE_FILE = re.compile(r"^s(\d\d)_[a-z0-9_]+\.py$")

# Per language: the page title, the sentence above the diff, the heading of the list of
# what the stage adds, changes and removes.
DIFF_PAGE_TEXT = {
    "en": ("{stage} · Diff from {previous}",
           "Every change the code of `{new_file}` makes to `{old_file}`, generated from the "
           "real files when this site was built (the docstrings are left out); [the chapter]"
           "({chapter}) explains why. Below the diff: what the stage adds, changes and "
           "removes, as `python course/build.py --changes {stage}` prints it.",
           "What {stage} adds, changes and removes"),
    "zh": ("{stage} · 与 {previous} 的差异",
           "`{new_file}` 的代码相对于 `{old_file}` 的全部改动，在构建本网站时由真实文件生成"
           "（不含文档字符串）；[本章]({chapter})讲解为什么这样改。差异之后列出本阶段新增、"
           "修改和删除的定义，与 `python course/build.py --changes {stage}` 的输出相同。",
           "{stage} 新增、修改和删除的定义"),
    "ru": ("{stage} · Отличия от {previous}",
           "Всё, что код `{new_file}` меняет в `{old_file}`, сгенерировано из настоящих "
           "файлов при сборке сайта (без строк документации); [глава]({chapter}) объясняет, "
           "зачем. После различий — что этап добавляет, меняет и удаляет, как это печатает "
           "`python course/build.py --changes {stage}`.",
           "Что {stage} добавляет, меняет и удаляет"),
}


def stage_files(agents_dir: Path) -> list[Path]:
    """agents/sNN_<name>.py, in stage order."""
    return sorted(p for p in agents_dir.glob("s*.py") if STAGE_FILE.match(p.name))


def code_lines(path: Path) -> list[str]:
    """The file's lines from the first one after its module docstring (a stage file's
    docstring opens on its first line that is not a comment)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines)
                  if line.strip() and not line.startswith("#")), None)
    if first is None or not lines[first].startswith('"""'):
        return lines
    if lines[first].rstrip().endswith('"""') and len(lines[first].strip()) >= 6:
        return lines[first + 1:]                    # a one-line docstring
    end = next((i for i in range(first + 1, len(lines)) if '"""' in lines[i]), len(lines) - 1)
    return lines[end + 1:]


def stage_diff(old: Path, new: Path, new_name: str | None = None) -> str:
    """The unified diff of two stage files' code, as `diff -u` would show it."""
    return "".join(difflib.unified_diff(code_lines(old), code_lines(new),
                                        f"agents/{old.name}", new_name or f"agents/{new.name}"))


def code_fence(text: str) -> str:
    """A backtick fence longer than any backtick run inside the text."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def diff_page(lang: str, old: Path, new: Path, diff: str, changes: str | None = None) -> str:
    title, sentence, heading = DIFF_PAGE_TEXT[lang]
    stage, previous = new.name[:3], old.name[:3]
    chapter = "../" + new.stem.replace("_", "-") + ".md"
    title = title.format(stage=stage, previous=previous)
    sentence = sentence.format(new_file=f"agents/{new.name}", old_file=f"agents/{old.name}",
                               chapter=chapter, stage=stage)
    fence = code_fence(diff)
    # Front matter: keep the diffs out of search, or every query would hit lines of code.
    page = (f"---\nsearch:\n  exclude: true\n---\n\n# {title}\n\n{sentence}\n\n"
            f"{fence}diff\n{diff}{fence}\n")
    if changes:
        fence = code_fence(changes)
        page += f"\n## {heading.format(stage=stage)}\n\n{fence}text\n{changes}{fence}\n"
    return page


# Per language: the title and sentence of a "what the hardened edition adds" page, and the
# sentence for a stage whose two editions are the same.
HARDENED_PAGE_TEXT = {
    "en": ("{stage} · What the hardened edition adds",
           "Everything `{hardened}` has that `{teaching}` has not, and the other way round, "
           "generated from the real files when this site was built (the docstrings are left "
           "out). The teaching edition is what [the chapter]({chapter}) teaches; its "
           "\"Under attack\" says what the hardened edition's guards buy.",
           "The two editions of {stage} are the same code."),
    "zh": ("{stage} · 加固版增加了什么",
           "`{hardened}` 相对于 `{teaching}` 的全部差异，在构建本网站时由真实文件生成（不含文档"
           "字符串）。[本章]({chapter})讲的是教学版；其中的“攻防”一节说明加固版的防护带来了什么。",
           "{stage} 的两个版本代码相同。"),
    "ru": ("{stage} · Что добавляет усиленная редакция",
           "Всё, чем `{hardened}` отличается от `{teaching}`, сгенерировано из настоящих файлов "
           "при сборке сайта (без строк документации). [Глава]({chapter}) учит по учебной "
           "редакции; её раздел «Под атакой» объясняет, что дают защиты усиленной.",
           "У {stage} обе редакции — один и тот же код."),
}


def hardened_page(lang: str, teaching: Path, hardened: Path, diff: str) -> str:
    title, sentence, same = HARDENED_PAGE_TEXT[lang]
    stage = teaching.name[:3]
    chapter = "../" + teaching.stem.replace("_", "-") + ".md"
    page = (f"---\nsearch:\n  exclude: true\n---\n\n# {title.format(stage=stage)}\n\n"
            + sentence.format(hardened=f"agents/hardened/{hardened.name}",
                              teaching=f"agents/{teaching.name}", chapter=chapter) + "\n\n")
    if not diff:
        return page + same.format(stage=stage) + "\n"
    fence = code_fence(diff)
    return page + f"{fence}diff\n{diff}{fence}\n"


def write_hardened_pages(docs_dir: Path, agents_dir: Path) -> list[Path]:
    """Write docs/<lang>/hardened/sNN.md for every stage; return the pages that changed."""
    missing = [lang for lang in language_folders(docs_dir) if lang not in HARDENED_PAGE_TEXT]
    if missing:
        raise PluginError(f"docs_hooks.py: no hardened page text for the language(s) {missing}")
    stages = [(path, agents_dir / "hardened" / path.name) for path in stage_files(agents_dir)]
    diffs = {teaching: stage_diff(teaching, hardened, f"agents/hardened/{hardened.name}")
             for teaching, hardened in stages}
    pages = {lang: {f"{t.name[:3]}.md": hardened_page(lang, t, h, diffs[t]) for t, h in stages}
             for lang in language_folders(docs_dir)}
    return write_pages(docs_dir, "hardened", pages)


def write_pages(docs_dir: Path, folder_name: str, pages: dict[str, dict[str, str]]) -> list[Path]:
    """Write {lang: {file name: text}} into docs/<lang>/<folder_name>/, only what changed
    (or `mkdocs serve` would rebuild in a loop); stale sNN.md pages there are removed."""
    changed = []
    for lang, texts in pages.items():
        folder = docs_dir / lang / folder_name
        folder.mkdir(exist_ok=True)
        for name, text in texts.items():
            page = folder / name
            if not page.is_file() or page.read_text(encoding="utf-8") != text:
                page.write_text(text, encoding="utf-8")
                changed.append(page)
        for stale in set(folder.glob("s[0-9][0-9].md")) - {folder / n for n in texts}:
            stale.unlink()
    return changed


def language_folders(docs_dir: Path) -> list[str]:
    return sorted(p.name for p in docs_dir.iterdir() if (p / "index.md").is_file())


def write_diff_pages(docs_dir: Path, agents_dir: Path,
                     changes: dict[str, str] | None = None) -> list[Path]:
    """Write docs/<lang>/diff/sNN.md for every stage from s02; return the pages that changed.
    `changes` maps "s09" to what the stage adds, changes and removes. Pages of stages that
    no longer exist are removed."""
    missing = [lang for lang in language_folders(docs_dir) if lang not in DIFF_PAGE_TEXT]
    if missing:
        raise PluginError(f"docs_hooks.py: no diff page text for the language(s) {missing}")
    stages = stage_files(agents_dir)
    pairs = list(zip(stages, stages[1:]))
    diffs = {new: stage_diff(old, new) for old, new in pairs}    # once, for every language
    pages = {lang: {f"{new.name[:3]}.md": diff_page(lang, old, new, diffs[new],
                                                   (changes or {}).get(new.name[:3]))
                    for old, new in pairs}
             for lang in language_folders(docs_dir)}
    return write_pages(docs_dir, "diff", pages)


def stage_changes(root: Path) -> dict[str, str]:
    """{"s02": text, …}: `python course/build.py --changes sNN` for every stage."""
    spec = importlib.util.spec_from_file_location("course_build", root / "course" / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, build)        # dataclasses look their module up there
    spec.loader.exec_module(build)
    course = build.read_course(root / "course")
    return {part.name[:3]: build.describe_changes(course, part.name[:3])
            for part in course.parts}


def on_pre_build(config) -> None:
    root = Path(config["config_file_path"]).parent
    write_diff_pages(Path(config["docs_dir"]), root / "agents", stage_changes(root))
    write_hardened_pages(Path(config["docs_dir"]), root / "agents")


def relative_language_links(page, alternates: list[dict]) -> None:
    """Point each language's entry at this page's translation, by its site-relative URL
    (mkdocs' `url` filter then makes it relative to the page)."""
    translations = getattr(page.file, "alternates", None) or {}
    for entry in alternates:
        translation = translations.get(entry.get("lang"))
        if translation is not None:
            entry["link"] = translation.url


@event_priority(-50)                        # after mkdocs-static-i18n has set the links
def on_page_context(context, page, config, nav):
    # The theme reads `config.extra.alternate` as an attribute first, as Jinja does.
    alternates = getattr(config.extra, "alternate", None) or config.extra.get("alternate")
    if alternates:
        relative_language_links(page, alternates)
    return context
