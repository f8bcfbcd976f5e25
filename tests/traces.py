"""Worked traces (curriculum §6.3): run a stage on one input and show, step by step, what
the model receives and what the learner sees.

A chapter asks for a trace with a marker line followed immediately by a ```text block:

    <!-- trace: {"stage": "s01_loop", "input": ["$ echo hello"]} -->
    ```text
    (generated: do not edit)
    ```

Options: "stage" (required), "input" (lines typed into the REPL), "argv" (command-line
arguments, e.g. ["-p", "$ ls"]), "files" (created in the working directory first, e.g.
{"AGENTS.md": "# Notes\\n"}). A marker with no block after it gets one.

    python tests/traces.py            # regenerate every trace in docs/*/*.md
    python tests/traces.py --check    # only report stale traces (exit 1)

tests/test_traces.py fails when a chapter's trace is stale. Every language carries the
same marker, so the blocks are byte-identical and the translations stay parallel.

How it runs: a fresh copy of the stage runs its own main() in this process, in a temporary
working directory with its own HOME and LEARN_HERMES_HOME, on its own offline model. The
offline model's `offline_reply(messages, counter)` is wrapped to record every request (the
real openai client is untouched), and stdout and stderr go to one buffer, so what the
learner sees keeps the order in which it was printed. Paths, dates, ports and the OS
release are masked, so a trace is the same on every machine.
"""

from __future__ import annotations

import copy
import io
import json
import os
import platform
import re
import shlex
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ROOT, all_stages, fresh_stage, run_main  # noqa: E402

DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- trace: (.*?) -->[ \t]*$", re.MULTILINE)
BLOCK = re.compile(r"```text\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
OPTIONS = {"stage", "input", "argv", "files"}
# A folder name of the same length on every Linux machine (/tmp/trace-XXXXXXXX), so that
# lengths the stage computes from its working directory (s04's prompt) are the same too.
TEMP_ROOT = "/tmp" if os.path.realpath("/tmp") == "/tmp" and os.path.isdir("/tmp") else None
LINE_CHARS = 100                        # a longer shown line is cut, with a marker
SCREEN_LINES = 12                       # lines of one "learner sees" step
INDENT = " " * 6                        # ≥ 4 spaces: no shown line can close the fence


# ── Running a stage ────────────────────────────────────────────────────────

class SameMachine:
    """The `platform` module as a stage sees it during a trace: the real one, except that
    the OS name and release (which go into s04's system prompt) are the same everywhere."""

    def __getattr__(self, name):
        return getattr(platform, name)

    @staticmethod
    def system() -> str:
        return "Linux"

    @staticmethod
    def release() -> str:
        return "6.1.0"


def check_spec(spec) -> None:
    """Bad options fail with one clear line before anything runs."""
    if not isinstance(spec, dict) or not isinstance(spec.get("stage"), str):
        raise ValueError(f'a trace needs {{"stage": "sNN_name", ...}}, got {spec!r}')
    if spec["stage"] not in all_stages():
        raise ValueError(f"no stage {spec['stage']!r}; the stages are {all_stages()}")
    unknown = set(spec) - OPTIONS
    if unknown:
        raise ValueError(f"unknown trace option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
    for key in ("input", "argv"):
        value = spec.get(key, [])
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ValueError(f'trace option "{key}" must be a list of strings')
    files = spec.get("files", {})
    if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
        raise ValueError('trace option "files" must map file names to their text')
    for name in files:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"trace file {name!r} must be a relative path inside the work dir")


def record(spec: dict, folder: Path) -> tuple[list, int]:
    """Run the stage once. Returns the events, in order, and the exit status:
    ("screen", text) | ("request", messages) | ("reply", assistant message)."""
    module = fresh_stage(spec["stage"])
    screen, events, shown = io.StringIO(), [], [0]

    def screen_so_far() -> None:
        text = screen.getvalue()[shown[0]:]
        shown[0] += len(text)
        if text:
            events.append(("screen", text))

    # Called on the offline server's thread while main() waits for the answer, so the
    # screen holds everything printed before this request.
    model_reply = module.offline_reply

    def recorded_reply(messages, counter):
        screen_so_far()
        events.append(("request", copy.deepcopy(messages)))
        reply = model_reply(messages, counter)
        events.append(("reply", copy.deepcopy(reply)))
        return reply

    stage_main = module.main

    def main_on_one_screen(argv):
        with redirect_stdout(screen), redirect_stderr(screen):
            return stage_main(argv)

    module.offline_reply, module.main = recorded_reply, main_on_one_screen
    if hasattr(module, "platform"):
        module.platform = SameMachine()
    work, home, state = folder / "work", folder / "home", folder / "state"
    for path in (work, home, state):
        path.mkdir()
    for name, content in spec.get("files", {}).items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(content, encoding="utf-8")
    # A minimal environment: nothing from this machine changes what the stage does.
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home),
           "LEARN_HERMES_HOME": str(state), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
           "COLUMNS": "100", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    stdin = "".join(line + "\n" for line in spec.get("input", []))
    run = run_main(module, *spec.get("argv", []), stdin=stdin, env=env, cwd=work)
    screen_so_far()
    return events, run.returncode


# ── Masking what differs between machines ─────────────────────────────────

def checkpoint_ids(state: Path) -> list[tuple[re.Pattern, str]]:
    """s12's checkpoints are git commits, and a commit's id depends on the time it was
    made: each id (whole, or shortened as /rollback shows it) becomes <id N>, N being the
    checkpoint's ref number in the shadow store (1 = the first taken)."""
    refs = {}
    for store in sorted((state / "checkpoints").glob("*")):
        for ref in sorted((store / "refs" / "checkpoints").glob("*")):
            refs[ref.read_text(encoding="utf-8").strip()] = int(ref.name)
        packed = store / "packed-refs"              # never written by s12, but git may
        for line in packed.read_text(encoding="utf-8").splitlines() if packed.is_file() else []:
            commit, _, name = line.partition(" ")
            if name.startswith("refs/checkpoints/"):
                refs.setdefault(commit, int(name.rpartition("/")[2]))
    return [(re.compile(rf"(?<![0-9a-f]){commit[:length]}(?![0-9a-f])"), f"<id {number}>")
            for commit, number in refs.items() for length in (40, 7)]


def masks(folder: Path) -> list[tuple[re.Pattern, str]]:
    """What changes from run to run or machine to machine, and what it is shown as.
    A later stage that prints something new of this kind adds a pattern here
    (tests/test_traces.py runs every trace twice to catch it)."""
    places = []
    for base in sorted({str(folder), os.path.realpath(folder)}, key=len, reverse=True):
        places += [(f"{base}/work", "<work>"), (f"{base}/home", "<home>"),
                   (f"{base}/state", "<state>"), (base, "<tmp>")]
    same_system = f"{SameMachine.system()} {SameMachine.release()}"
    real_release = [(re.compile(re.escape(platform.release())), "<release>")] \
        if len(platform.release()) >= 5 else []            # e.g. `uname -r` in a command
    return (checkpoint_ids(folder / "state")
            + [(re.compile(re.escape(path)), shown) for path, shown in places]
            + [(re.compile(re.escape(same_system)), "<os> <release>")] + real_release
            + [
               (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
               (re.compile(r"(?<!\d)\d{8}-\d{6}-[0-9a-f]{8,}(?![0-9a-f])"), "<session id>"),
               (re.compile(r"(?<!\d)\d{4}-\d\d-\d\d(?!\d)"), "<date>"),
               (re.compile(r"(?<!\d)\d\d:\d\d:\d\d(?!\d)"), "<time>")])


def masked(value, rules):
    """`value` (text, or lists and dicts of it) with every rule applied."""
    if isinstance(value, str):
        for pattern, shown in rules:
            value = pattern.sub(shown, value)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(masked(item, rules) for item in value)
    if isinstance(value, dict):
        return {key: masked(item, rules) for key, item in value.items()}
    return value


# ── Rendering ──────────────────────────────────────────────────────────────
# `hide` masks a text for display; lengths are counted on the real text, so they
# agree with what the stage itself reports.

def cut(text: str, limit: int = LINE_CHARS) -> str:
    """One line: newlines shown as \\n, long text cut with a visible marker."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[:limit]}… [+{len(text) - limit} chars]"


def quoted(text: str, limit: int) -> str:
    return json.dumps(cut(text, limit), ensure_ascii=False)


def screen_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.rstrip("\n").split("\n")]
    if len(lines) > SCREEN_LINES:
        lines = lines[:SCREEN_LINES] + [f"… [+{len(lines) - SCREEN_LINES} lines]"]
    return [cut(line) for line in lines]


def call_names(message: dict) -> list[str]:
    return [call["function"]["name"] for call in message.get("tool_calls") or []]


def describe_message(message: dict, names_by_id: dict, hide) -> str:
    role, content = message.get("role"), message.get("content") or ""
    if role == "system":
        first = hide(content.split("\n", 1)[0])
        return f"system ({quoted(first, 60)}, {len(content)} chars)"
    if role == "assistant" and message.get("tool_calls"):
        return f"assistant (calls {', '.join(call_names(message))})"
    if role == "tool":
        return f"tool (result of {names_by_id.get(message.get('tool_call_id'), '?')})"
    return f"{role} {quoted(hide(content), 60)}"


def describe_request(number: int, messages: list, previous: list, hide) -> str:
    """All messages of the first request; later ones name only what is new."""
    names_by_id = {call["id"]: call["function"]["name"]
                   for m in messages for call in m.get("tool_calls") or []}
    count = f"{len(messages)} message{'s' if len(messages) != 1 else ''}"
    same = len(previous) if previous and messages[:len(previous)] == previous else 0
    parts = [describe_message(m, names_by_id, hide) for m in messages[same:]]
    if same:
        parts.insert(0, f"the {same} sent before")
    return f"→ request {number} to the model: {count}: " + " + ".join(parts)


def tool_results(events: list, reply: dict, hide) -> list[str]:
    """The results of `reply`'s tool calls, as the next request carries them back."""
    asked = {call["id"]: call["function"]["name"] for call in reply.get("tool_calls") or []}
    for kind, data in events:
        if kind == "request":
            return [f"tool result ({asked[m['tool_call_id']]}): "
                    f"{cut(hide(m.get('content') or ''))}"
                    for m in data if m.get("role") == "tool" and m.get("tool_call_id") in asked]
    return []


def command_line(spec: dict) -> str:
    """The shell command a learner types to see the same thing."""
    command = " ".join([f"python agents/{spec['stage']}.py"]
                       + [shlex.quote(arg) for arg in spec.get("argv", [])])
    if spec.get("input"):
        lines = " ".join(shlex.quote(line) for line in spec["input"])
        command = f"printf '%s\\n' {lines} | {command}"
    return command


def render(spec: dict, events: list, status: int, hide=lambda text: text) -> str:
    steps: list[tuple[str, list[str]]] = []
    requests, previous = 0, []
    for index, (kind, data) in enumerate(events):
        if kind == "screen":
            steps.append(("learner sees:", screen_lines(hide(data))))
        elif kind == "request":
            requests += 1
            steps.append((describe_request(requests, data, previous, hide), []))
            previous = data
        elif data.get("tool_calls"):
            asks = "; ".join(f"{call['function']['name']} "
                             f"{cut(hide(call['function']['arguments']), 70)}"
                             for call in data["tool_calls"])
            steps.append((f"← the model asks: {asks}", []))
            steps += [(line, []) for line in tool_results(events[index + 1:], data, hide)]
        else:
            steps.append((f"← the model answers: {cut(hide(data.get('content') or ''))}", []))
    steps.append((f"exit status {status}", []))
    lines = [f"$ {command_line(spec)}"]
    if spec.get("files"):
        lines.append("files in the working directory: " + ", ".join(
            f"{name} ({len(content)} chars)" for name, content in spec["files"].items()))
    for number, (text, body) in enumerate(steps, 1):
        lines.append(f"{number:>2}. {text}")
        lines += [f"{INDENT}{line}".rstrip() for line in body]
    return "\n".join(lines) + "\n"


def trace(spec: dict) -> str:
    """The trace text for one marker's options."""
    check_spec(spec)
    with tempfile.TemporaryDirectory(prefix="trace-", dir=TEMP_ROOT) as folder:
        events, status = record(spec, Path(folder))
        rules = masks(Path(folder))
        return render(spec, events, status, lambda text: masked(text, rules))


# ── Chapters ───────────────────────────────────────────────────────────────

def parse_marker(raw: str, where: str) -> dict:
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: the trace marker is not JSON: {exc}") from None
    try:
        check_spec(spec)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return spec


def updated_text(text: str, where: str, make=trace, cache: dict | None = None) -> str:
    """`text` with the block after every trace marker regenerated (or inserted)."""
    cache = {} if cache is None else cache
    pieces, position = [], 0
    for marker in MARKER.finditer(text):
        spec = parse_marker(marker.group(1), where)
        key = json.dumps(spec, sort_keys=True)
        if key not in cache:
            cache[key] = make(spec)
        after = marker.end() + 1                    # just past the marker's newline
        block = BLOCK.match(text, after)
        pieces += [text[position:after], f"```text\n{cache[key]}```\n"]
        position = block.end() + 1 if block else after
    return "".join(pieces) + text[position:]


def trace_pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*/*.md") if MARKER.search(p.read_text(encoding="utf-8")))


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    cache: dict = {}
    stale = []
    for page in trace_pages():
        text = page.read_text(encoding="utf-8")
        where = str(page.relative_to(ROOT))
        new = updated_text(text, where, cache=cache)
        if new != text:
            stale.append(where)
            if not check_only:
                page.write_text(new, encoding="utf-8")
    verb = "stale" if check_only else "updated"
    for where in stale:
        print(f"{verb}: {where}")
    if not stale:
        print("every trace is up to date")
    return 1 if stale and check_only else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
