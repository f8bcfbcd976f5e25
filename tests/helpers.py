"""Shared test helpers: find and load stage files, run them, check message pairing."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# LEARN_HERMES_AGENTS_DIR points the tests at another copy of agents/ (tests/mutants.py).
AGENTS = Path(os.environ.get("LEARN_HERMES_AGENTS_DIR") or ROOT / "agents")
STAGE_FILE = re.compile(r"^s(\d\d)_[a-z0-9_]+\.py$")


@functools.lru_cache(maxsize=None)
def course_build():
    """course/build.py, the generator, as a module (loaded once)."""
    path = ROOT / "course" / "build.py"
    spec = importlib.util.spec_from_file_location("course_build", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module             # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def course_lineage(edition: str = "teaching") -> dict[str, dict[str, list[str]]]:
    """What each stage of `edition` adds, changes and removes, as course/ says:
    {"s03_session_store": {"added": [names], "changed": [...], "removed": [...]}, ...}."""
    build = course_build()
    course = build.read_course()
    return {part.name: {kind: [d.name for d in found] for kind, found in
                        build.lineage(course, part.stage, edition).items()}
            for part in course.parts}


# A stage is named by its file under agents/: "s09_permission_system" is the teaching
# edition, "hardened/s09_permission_system" the hardened one (agents/hardened/).
HARDENED = "hardened/"


def all_stages() -> list[str]:
    """Stage names present in agents/, in order: ['s01_loop', ...] (teaching edition)."""
    return sorted(p.stem for p in AGENTS.glob("s*.py") if STAGE_FILE.match(p.name))


def every_stage() -> list[str]:
    """Every stage of both editions: the smoke tests run on all of them."""
    return all_stages() + [HARDENED + stage for stage in all_stages()]


def base_stage(stage: str) -> str:
    """'s09_permission_system' for either edition's name."""
    return stage.removeprefix(HARDENED)


def short(stage: str) -> str:
    """'s09' for 's09_permission_system' and 'hardened/s09_permission_system'."""
    return stage.removeprefix(HARDENED)[:3]


def stage_number(stage: str) -> int:
    return int(short(stage)[1:])


def edition_of(stage: str) -> str:
    return "hardened" if stage.startswith(HARDENED) else "teaching"


def stages_from(first: str) -> list[str]:
    """Where a feature's tests run (curriculum §5): at the stage that introduced it and at
    the newest stage, in both editions. The stages in between carry the same text by
    construction (course/build.py; tests/test_lineage.py), and each gets smoke tests. A
    test marked `hardening` keeps only the hardened ones (conftest.py)."""
    stages = all_stages()
    carrying = [s for s in stages if stage_number(s) >= stage_number(first)]
    ends = sorted({carrying[0], carrying[-1]})
    return ends + [HARDENED + stage for stage in ends]


def has_config_chain(stage) -> bool:
    """Does `stage` (a name or a loaded module) take its settings from s11's chain?"""
    return stage_number(stage) >= 11 if isinstance(stage, str) else hasattr(stage, "load_config")


def started_session(stage, *argv: str):
    """open_session() as main() calls it: from s11 on, with the configuration chain."""
    args = stage.parse_args(list(argv))
    with offline_servers_recorded(stage):
        if has_config_chain(stage):
            return stage.open_session(args, stage.load_config(args))
        return stage.open_session(args)


# The offline servers that a stage starts in this process (through run_main() and
# started_session()); conftest.py stops them after each test. A server's thread polls 20
# times a second for as long as the process lives, and a test process runs main()
# thousands of times: 300 forgotten servers take a sixth of a core and slow the rest.
OFFLINE_SERVERS: list = []


@contextlib.contextmanager
def offline_servers_recorded(module):
    real = module.start_offline_server

    def start_and_record():
        server = real()
        OFFLINE_SERVERS.append(server)
        return server

    module.start_offline_server = start_and_record
    try:
        yield
    finally:
        module.start_offline_server = real


def stop_offline_servers() -> None:
    """Stop the recorded servers, without waiting for their threads to notice."""
    while OFFLINE_SERVERS:
        threading.Thread(target=stop_server, args=(OFFLINE_SERVERS.pop(),), daemon=True).start()


def stop_server(server) -> None:
    server.shutdown()
    server.server_close()


# How nbclient says that a notebook's kernel exited before it could run a cell. The one
# cause seen (once, in CI): the kernel could not bind a TCP port that jupyter_client had
# just found free, because something else took it in between. The other test workers
# open thousands of loopback connections, each on a port from that same range.
KERNEL_DID_NOT_START = "Kernel died before replying to kernel_info"


def retried_when_the_kernel_does_not_start(runtest, attempts: int = 3):
    """A notebook item's runtest() that starts a new kernel when the first one died
    before the notebook's first cell. Nothing of the notebook has run at that point, so
    starting again hides no failure of the notebook's own code: every other error
    (a cell that fails, a timeout) fails at once, and a kernel that never starts fails
    after the last try."""
    @functools.wraps(runtest)
    def run():
        for attempt in range(1, attempts + 1):
            try:
                return runtest()
            except RuntimeError as error:
                if KERNEL_DID_NOT_START not in str(error) or attempt == attempts:
                    raise
                warnings.warn(f"the notebook's kernel did not start (try {attempt} of "
                              f"{attempts}); starting a new one")
    return run


def started_retry_policy(stage, session, *argv: str):
    args = stage.parse_args(list(argv))
    if has_config_chain(stage):
        return stage.retry_policy_from_config(stage.load_config(args), session)
    return stage.retry_policy_from_args(args, session)


def started_permissions(stage, *argv: str):
    args = stage.parse_args(list(argv))
    if has_config_chain(stage):
        return stage.permissions_from_config(stage.load_config(args))
    return stage.permissions_from_args(args)


def flag_error(stage, flag: str) -> str:
    """How a bad flag value's message starts: argparse's, or the chain's from s11 on."""
    return f"error: {flag}: " if has_config_chain(stage) else f"argument {flag}: "


def first_and_newest(stages: list[str]) -> list[str]:
    """For the few tests that need a real process and real seconds: the teaching stage
    that introduced the feature and the newest hardened stage (`stages` as stages_from()
    gives them). So each edition runs it once, where the feature was written and after
    every later stage's changes, at a cost that does not grow with the number of
    stages."""
    return [stages[0], stages[-1]]


_loaded: dict[str, object] = {}


def load_stage(stage: str):
    """Import agents/<stage>.py by path (stages are not a package), once per test run."""
    if stage not in _loaded:
        _loaded[stage] = new_module(stage, "stage_" + stage.replace("/", "_"))
    return _loaded[stage]


_fresh_names = itertools.count()


def fresh_stage(stage: str):
    """A new, independent copy of agents/<stage>.py (a few ms): its own registries,
    settings and module state, so a test may change them without affecting others."""
    return new_module(stage, f"fresh_{stage.replace('/', '_')}_{next(_fresh_names)}")


def new_module(stage: str, name: str):
    """agents/<stage>.py run as a new module called `name`, from its compiled code."""
    spec = importlib.util.spec_from_file_location(name, AGENTS / f"{stage}.py")
    module = importlib.util.module_from_spec(spec)
    module.__stage__ = stage                    # the name it was loaded by, for the tests
    exec(compiled_stage(stage), module.__dict__)
    return module


@functools.lru_cache(maxsize=None)
def compiled_stage(stage: str):
    """The stage's code, compiled once per test process. Python's own cache (__pycache__)
    is not enough: with PYTHONDONTWRITEBYTECODE, or on a fresh clone before it is written,
    every import compiles the file again (about 0.4 s for s12's 9,000 lines)."""
    path = AGENTS / f"{stage}.py"
    return compile(path.read_bytes(), str(path), "exec", dont_inherit=True)


@dataclass
class Run:
    """What a learner would see from one run of a stage: exit code, stdout, stderr."""
    returncode: int
    stdout: str
    stderr: str


class _TextInput(io.StringIO):
    """A piped stdin: never a TTY, like `printf ... | python agents/sNN.py`."""

    def isatty(self) -> bool:
        return False


def run_main(stage, *argv: str, stdin: str = "", env: dict | None = None, cwd=None) -> Run:
    """Run `main(argv)` of a stage in this process, as `run_stage` would in a new one.

    `stage` is a stage name (a fresh module is loaded) or an already loaded module.
    stdin is a pipe holding `stdin`; `env` replaces os.environ (default: clean_env());
    output is captured (rich resolves sys.stdout at print time). Everything global that
    main() touches (environment, working directory, signal handlers, std streams) is
    restored afterwards. About 40x cheaper than a process (engineering notes §8).
    """
    module = fresh_stage(stage) if isinstance(stage, str) else stage
    saved_env, saved_cwd = dict(os.environ), working_directory()
    saved_signals = {name: signal.getsignal(getattr(signal, name))
                     for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)}
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    new_env = clean_env() if env is None else env     # read before clearing: keeps HOME
    os.environ.clear()
    os.environ.update(new_env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = _TextInput(stdin)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with offline_servers_recorded(module):
                    code = module.main(list(argv))
            except SystemExit as exc:            # argparse: --help, bad flags
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        if saved_cwd is not None:
            os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for name, handler in saved_signals.items():
            signal.signal(getattr(signal, name), handler)
    return Run(code if code is not None else 0, out.getvalue(), err.getvalue())


def working_directory() -> str | None:
    """os.getcwd(), or None when a test has deleted the directory it is in."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def repl_output(stdout: str, prompt: str, line: str) -> str:
    """What a piped REPL printed for one input `line`: from the echo of the line
    (`s04> /help`) up to the next prompt, or to the end without its final newline.
    Fails clearly if the line was never read."""
    echo = f"{prompt}{line}\n"
    assert echo in stdout, f"the REPL never echoed {echo!r}:\n{stdout}"
    output = stdout.split(echo, 1)[1]
    end = output.find(f"\n{prompt}")
    return output[:end] if end >= 0 else output.removesuffix("\n")


def clean_env(**extra: str) -> dict:
    """The current environment without any OPENAI_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    env.update(extra)
    return env


def run_stage(stage: str, *args: str, stdin: str = "", env: dict | None = None,
              cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `python agents/<stage>.py ARGS` as a learner would, stdin from a pipe."""
    return subprocess.run([sys.executable, str(AGENTS / f"{stage}.py"), *args],
                          input=stdin, capture_output=True, text=True, encoding="utf-8",
                          errors="replace", env=env or clean_env(), cwd=cwd, timeout=timeout)


def pairing_problems(messages: list[dict]) -> list[str]:
    """Every assistant tool call must be followed by exactly one tool message with its
    id, before the next non-tool message; no tool message may answer nothing."""
    problems = []
    open_ids: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in open_ids:
                open_ids.remove(call_id)
            else:
                problems.append(f"message {index}: tool result for unknown or answered id {call_id}")
            continue
        if open_ids:
            problems.append(f"message {index}: calls {open_ids} were never answered")
            open_ids = []
        if role == "assistant":
            open_ids = [c["id"] for c in message.get("tool_calls") or []]
    return problems


# Real processes: only they get signals. A signal is sent once the command runs.

def pid_in_file(path: Path, within: float = 60.0) -> int | None:
    """The pid a command wrote to `path` (`echo $$ > path`), once the whole line is there:
    the observable sign that the command runs. None if it never came (a generous
    deadline: a loaded machine can take many seconds to start a process)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n") and text.strip().isdigit():
            return int(text)
        time.sleep(0.02)
    return None


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def dies_soon(pid: int, within: float = 10.0) -> bool:
    """SIGKILL is asynchronous: give the kernel a moment to finish the kill."""
    deadline = time.monotonic() + within
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stub_programs(root: Path, names) -> None:
    """Programs in root/stubs that only leave a line "<name> <args>" in root/marks and
    print "stub <name>": a guard that failed would run these, never the real ones."""
    marks_file = root / "marks"
    for name in names:
        script = root / "stubs" / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{marks_file}"\necho "stub {name}"\n')
        script.chmod(0o755)


def stubbed_work_folder(tmp_path: Path, monkeypatch, names) -> Path:
    """A working folder (the current one) with stub programs first on PATH and a
    temporary HOME; what the stubs were asked to do is read back with marks()."""
    folder, stubs, user = tmp_path / "work", tmp_path / "stubs", tmp_path / "user"
    for path in (folder, stubs, user):
        path.mkdir()
    stub_programs(tmp_path, names)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.chdir(folder)
    return folder


def marks(work: Path) -> list[str]:
    path = work.parent / "marks"
    return path.read_text().splitlines() if path.exists() else []


def start_agent(stage_name, tmp_path, home=None) -> subprocess.Popen:
    """The stage as a real process: a REPL reading a pipe (bytes), working in tmp_path,
    its state in `home` (default tmp_path/h)."""
    home = home or tmp_path / "h"
    return subprocess.Popen([sys.executable, str(AGENTS / f"{stage_name}.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(LEARN_HERMES_HOME=str(home)), cwd=tmp_path)


def type_line(proc: subprocess.Popen, line: bytes) -> None:
    proc.stdin.write(line + b"\n")
    proc.stdin.flush()


def pid_of_running_command(proc: subprocess.Popen, pid_file: Path, problem: str) -> int:
    """Wait until the agent's command has written its pid: only then may a signal be
    sent, or it lands during start-up. Fails with `problem` if that never happens."""
    pid = pid_in_file(pid_file)
    if pid is None:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{problem} (no {pid_file.name} after 60 s):\n"
                    f"{out.decode(errors='replace')}\n{err.decode(errors='replace')}")
    return pid


# ── Chapter examples (tests/test_s1N_chapter_examples.py) ─────────────────

def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows (lists of cells) of the Markdown table in `text` whose first header
    cell starts with `header_start`; [] if there is none. A table in an admonition is
    indented, so lines are read stripped."""
    lines = [line.strip() for line in text.splitlines()] + [""]
    for index, line in enumerate(lines):
        if line.startswith("|") and table_cells(line)[0].startswith(header_start):
            return [table_cells(row) for row in itertools.takewhile(
                lambda row: row.startswith("|"), lines[index + 2:])]
    return []


def table_cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the ```language blocks of `text`, their indentation removed (a block
    inside an admonition is indented)."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```$", text, re.MULTILINE | re.DOTALL)
    return ["\n".join(line[len(indent):] for line in body.splitlines()) + "\n"
            for indent, body in found]


def diff_blocks(text: str) -> list[list[str]]:
    """The lines of each ```diff block of `text` (an exercise's solution)."""
    return [body.splitlines() for body in fenced_blocks(text, "diff")]


def patched_stage(stage_name: str, block: list[str], folder: Path):
    """The stage with an exercise's diff applied, written to `folder` and imported."""
    path = folder / f"{stage_name}.py"
    path.write_text(patched_source(stage_name, block), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"patched_{stage_name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patched_source(stage_name: str, block: list[str]) -> str:
    """The stage file with an exercise's diff (the lines of a ```diff block) applied; the
    diff's old lines must stand in the file exactly once."""
    source = (ROOT / "agents" / f"{stage_name}.py").read_text(encoding="utf-8")
    before = "\n".join(line[1:] for line in block if line[:1] in (" ", "-")) + "\n"
    after = "\n".join(line[1:] for line in block if line[:1] in (" ", "+")) + "\n"
    assert source.count(before) == 1, block
    return source.replace(before, after)
