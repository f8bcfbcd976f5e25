# s12_checkpoints: what this stage adds, changes and removes. course/build.py writes the stage files.

#: docstring | teaching
"""s12 · Checkpoints — a shadow git snapshot before each turn's first change, /rollback.

What this stage adds
    Before each user turn's first change (write_file, patch, a terminal command) the project
    is snapshot into a bare git repository of the agent's own, in $LEARN_HERMES_HOME/
    checkpoints/ (the project's .git is untouched). /rollback lists them, /rollback diff N
    shows the changes since N, /rollback N makes the project N again (undo: /rollback 1).

    first change of a turn ─▶ before_change() ─▶ snapshot(): add -A, commit ─▶ the tool runs
    /rollback N ─▶ restore(): a snapshot first (the undo), then git restore --source=<id>

Reading guide
    "[s12] Checkpoints" is the lesson, then its details and /rollback. agents/hardened/ adds more.
    {changed elsewhere}
Run
    python agents/s12_checkpoints.py --demo           # the walk-through
    printf 'write a.txt 1\n$ echo 2 > a.txt\n/rollback 1\n' | python agents/s12_checkpoints.py
Chapter
    docs/en/s12-checkpoints.md
"""

#: docstring | hardened
"""s12 · Checkpoints — a shadow git snapshot before each turn's first change, /rollback.

What this stage adds
    Before the first change of each user turn (write_file, patch, or a terminal command
    that may change files) the project is snapshot into the agent's own bare git
    repository under $LEARN_HERMES_HOME/checkpoints/; the project's .git is never touched.
    Ignored files, DEFAULT_EXCLUDES, nested repositories and files over 10 MB are left
    out; 20 are kept; a failed one is a warning. /rollback lists them, /rollback diff N
    shows the changes since N, /rollback N makes the project exactly N (undo: /rollback 1).

    user turn: first write_file / patch / terminal that may change files
      ─▶ checkpoint_before_change() ─▶ CheckpointManager.snapshot(reason) ─▶ the tool
          add -A ─▶ diff --numstat ─▶ nothing? skip ─▶ write-tree ─▶ commit-tree
          ─▶ refs/checkpoints/0000000007 ─▶ prune
    /rollback N ──▶ restore(): snapshot("before rollback to …"), then
          git restore --source=<id> --staged --worktree --no-overlay -- .

Reading guide
    Start right below the imports: "[s12] Checkpoints" is this stage's lesson:
    CheckpointManager (snapshot(), list(), diff(), restore(); git() and run()), then when
    a checkpoint is taken: before_change() once per turn, checkpoint_before_change()
    called by the tools, command_may_change_files(). "[s12] Checkpoint details" holds
    git's settings, the excludes, what is left out and the checks. Earlier stages follow,
    then the plumbing (/rollback is under "[s12] Checkpoint commands") and the wiring.
    {changed elsewhere}
Run
    python agents/s12_checkpoints.py                  # REPL (offline model without a key)
    python agents/s12_checkpoints.py --demo           # the walk-through
    printf 'write a.txt 1\n$ echo 2 > a.txt\n/rollback 1\n' |
        python agents/s12_checkpoints.py
Chapter
    docs/en/s12-checkpoints.md
"""

#: imports
import argparse
import base64
import binascii
import bisect
import codecs
import contextvars
import copy
import datetime
import difflib
import email.utils
import fnmatch
import functools
import glob
import hashlib
import html
import itertools
import json
import os
import platform
import posixpath
import random
import re
import select
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from markdown_it import MarkdownIt
import openai
import yaml
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typing import Callable, NamedTuple
from unittest import mock

#: section Checkpoints

CHECKPOINTS_DIR_NAME = "checkpoints"    # $LEARN_HERMES_HOME/checkpoints/<project_key()>/
CHECKPOINT_REFS = "refs/checkpoints/"   # one ref per checkpoint keeps its commit alive
SHORT_ID_CHARS = 7                      # of a commit id, /rollback shows this much
# Defaults of the limits, rows of s11's SETTINGS; main() passes the chain's values.
MAX_SNAPSHOTS = 20                      # checkpoints kept per project
MAX_FILES = 50_000                      # a project with more files gets none
MAX_FILE_SIZE_MB = 10                   # larger files are left out


class CheckpointError(Exception):
    """A checkpoint that cannot be taken, listed or restored; the message says why."""


#: teaching
class Checkpoint(NamedTuple):
    index: int                  # 1 = the newest, as /rollback numbers them
    id: str                     # the commit's id
    ref: str                    # refs/checkpoints/0000000007: the names sort by age
    time: float                 # when it was taken, in seconds since 1970
    reason: str                 # "before write_file notes.txt", "before rollback to 1a2b3c4"
    short: str                  # the id's first SHORT_ID_CHARS characters, as /rollback shows


#: hardened
class Checkpoint(NamedTuple):
    index: int                  # 1 = the newest, as /rollback numbers them
    id: str                     # the commit's id
    ref: str                    # refs/checkpoints/0000000007: the names sort by age
    time: float                 # when it was taken, in seconds since 1970
    reason: str                 # "before write_file notes.txt", "before rollback to 1a2b3c4"
    files: int                  # what changed since the checkpoint before it: files,
    added: int                  # lines added
    removed: int                # and lines removed
    left_out: tuple = ()        # the hardened edition records what was there then, not in
                                # it: nested repositories, large and ignored files
    empty: tuple = ()           # and its empty folders ("logs/"): git stores files only

    @property
    def short(self) -> str:
        return self.id[:SHORT_ID_CHARS]


#: teaching
class Restored(NamedTuple):
    checkpoint: Checkpoint      # the project is now as it was then
    undo: str                   # the checkpoint taken just before: the way back


#: hardened
class Restored(NamedTuple):
    checkpoint: Checkpoint      # the project (or `path` in it) is now as it was then
    undo: str                   # the checkpoint taken just before: the way back
    path: str | None
    # Folders the checkpoint held that are repositories now: left as they are, and
    # /rollback says so (the hardened edition: repositories_now()).
    kept: tuple = ()


#: teaching
class CheckpointManager:
    """Checkpoints of one project in a bare git repository of the agent's own (a "shadow")."""

    def __init__(self, project: Path, home: Path | None = None, max_snapshots: int = MAX_SNAPSHOTS,
                 max_files: int = MAX_FILES, max_file_size_mb: int = MAX_FILE_SIZE_MB):
        self.project = Path(os.path.realpath(project))
        self.home = Path(os.path.realpath(home or hermes_home()))
        self.store = self.home / CHECKPOINTS_DIR_NAME / project_key(self.project)
        self.max_snapshots, self.max_files = max_snapshots, max_files
        self.max_file_bytes = max_file_size_mb * 1024 * 1024
        self.git_program = shutil.which("git")      # None: no checkpoint can be taken
        self.left_out: list[str] = []   # nested repositories and large files, last looked
        self.lock = threading.Lock()    # s10's sub-agents share the manager
        self.turn_taken = False         # this user turn has had its checkpoint (run_turn())
        self.told_none = self.warned = False    # once per run: "no checkpoints here", a failure

    def snapshot(self, reason: str, prune_old: bool = True) -> str | None:
        """The project as it is now: the new checkpoint's id (None: nothing changed)."""
        newest = self.list()[:1]
        stage_tree(self)                # the store's index: the project as it is now
        if newest and not self.git("diff", "--cached", "--name-only", newest[0].id):
            return None                 # the same as the newest checkpoint
        tree = self.git("write-tree").strip()
        commit = self.git("commit-tree", tree, input=one_line(reason)).strip()   # no parent
        number = int(newest[0].ref.rpartition("/")[2]) + 1 if newest else 1
        self.git("update-ref", f"{CHECKPOINT_REFS}{number:010d}", commit, "")  # "": a new ref
        if prune_old:
            prune(self)
        return commit

    def list(self) -> list[Checkpoint]:
        """Every checkpoint of the project, newest first."""
        if not (self.store / "HEAD").is_file():
            return []
        output = self.git("for-each-ref", "--sort=-refname", f"--format={LIST_FORMAT}",
                          CHECKPOINT_REFS)
        rows = [line.split(" ", 3) for line in output.split("\n")[:-1]]  # a reason is one line
        return [Checkpoint(index, commit, ref, float(when), reason, commit[:SHORT_ID_CHARS])
                for index, (ref, commit, when, reason) in enumerate(rows, start=1)]

    def diff(self, n: int | str) -> str:
        """The changes from checkpoint n to the project as it is now, as git shows them."""
        checkpoint = find_checkpoint(self, n)
        stage_tree(self)
        return self.git("diff", "--cached", "--no-renames", "--no-ext-diff", checkpoint.id,
                        "--", ".", *excluded(self.left_out))

    def restore(self, n: int | str) -> Restored:
        """The project becomes checkpoint n, after a checkpoint of now: the way back."""
        checkpoint = find_checkpoint(self, n)   # before the new checkpoint renumbers them
        undo = self.snapshot(f"before rollback to {checkpoint.short}", prune_old=False) \
            or self.list()[0].id
        # The snapshot put every file it keeps into the index. --no-overlay removes what
        # the index has and the checkpoint has not (files created since); what is left
        # out now is not in the index, so it stays as it is.
        self.git("restore", f"--source={checkpoint.id}", "--staged", "--worktree",
                 "--no-overlay", "--", ".", *excluded(self.left_out))
        prune(self)                     # only now: the one restored may have been the oldest
        return Restored(checkpoint, undo)

    def git(self, *args: str, input: str = "") -> str:
        """One git command on the store and the project: its output."""
        options = [part for setting in GIT_SETTINGS for part in ("-c", setting)]
        return self.run([f"--git-dir={self.store}", f"--work-tree={self.project}",
                         *options, *args], input)

    def run(self, args: list, input: str = "") -> str:
        """git with `args`, in the project folder; CheckpointError with git's complaint."""
        if self.git_program is None:
            raise CheckpointError("git is not installed (or not on PATH)")
        env = {name: value for name, value in scrubbed_environment().items()   # no secrets,
               if not name.upper().startswith("GIT_")}  # no GIT_DIR, GIT_INDEX_FILE, ...
        env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",   # no user or
                   GIT_TERMINAL_PROMPT="0", LC_ALL="C")                     # system config
        try:                            # an OSError (no project folder, say) is the caller's
            done = subprocess.run([self.git_program, *args], cwd=self.project, input=input,
                                  env=env, capture_output=True, text=True,
                                  encoding="utf-8", errors="replace", timeout=GIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise CheckpointError(f"git took longer than {GIT_TIMEOUT} s") from None
        finally:                        # a git killed (a timeout, Ctrl-C) leaves its lock,
            (self.store / "index.lock").unlink(missing_ok=True)    # which fails every call
        if done.returncode != 0:
            raise CheckpointError("git: " + (first_line(done.stderr or done.stdout)
                                             or f"exit code {done.returncode}"))
        return done.stdout

    def before_change(self, reason: str) -> None:
        """The first change of a user turn: a checkpoint first. Later ones: nothing.
        The lock makes a sub-agent's change wait until the checkpoint is complete."""
        with self.lock:
            if self.turn_taken:
                return
            self.turn_taken = True
            why_not = never_checkpointed(self.project, self.home)
            if why_not:                 # a rule, not a failure: said once, at the first change
                if not self.told_none:  # (a scratch folder is where one tries a real model)
                    how = f". `git init` turns them on; they are kept in {self.store}" \
                        if "not in a project" in why_not else ""
                    console.print(Text(f"  [no checkpoint: {why_not}{how}]", style="dim"))
                self.told_none = True
                return
            try:
                commit = self.snapshot(reason)
            except Exception as exc:    # a safety net that fails must not stop the work
                if not self.warned:     # once: the next turns would fail the same way
                    err_console.print(Text(f"warning: no checkpoint was taken ({first_line(exc)})"
                                           f"; the tool runs anyway", style="yellow"))
                self.warned = True
                return
        if commit is not None:          # shown between the tool call and its result
            left_out = f"; left out: {len(self.left_out)} (nested repositories, files over " \
                       f"checkpoints.max_file_size_mb)" if self.left_out else ""
            console.print(Text(f"  [checkpoint {commit[:SHORT_ID_CHARS]}: {one_line(reason)}"
                               f"{left_out}]", style="dim"))


#: hardened
class CheckpointManager:
    """Checkpoints of one project folder, kept in a git repository of the agent's own
    (a "shadow" store): $LEARN_HERMES_HOME/checkpoints/<key>/, a bare repository with
    no files of its own. Every git call names the store and the project explicitly, so
    the project's own .git is never read or written."""

    def __init__(self, project: Path, home: Path | None = None,
                 max_snapshots: int = MAX_SNAPSHOTS, max_files: int = MAX_FILES,
                 max_file_size_mb: int = MAX_FILE_SIZE_MB):
        self.project = Path(os.path.realpath(project))
        self.home = Path(os.path.realpath(home or hermes_home()))
        self.store = self.home / CHECKPOINTS_DIR_NAME / project_key(self.project)
        self.max_snapshots, self.max_files = max_snapshots, max_files
        self.max_file_bytes = max_file_size_mb * 1024 * 1024
        self.git_program = shutil.which("git")      # None: no checkpoint can be taken
        self.left_out: list[str] = []   # nested repositories and large files, last looked
        self.lock = threading.Lock()    # s10's sub-agents share the manager
        self.turn_taken = False         # this user turn has had its checkpoint
        self.told_none = False          # "no checkpoints here" was said in this run
        self.warned: set = set()        # each warning is shown once per run

    def snapshot(self, reason: str, prune_old: bool = True) -> str | None:
        """Record the project as it is now. The new checkpoint's id, or None when
        nothing changed since the newest one."""
        open_checkpoint_store(self)
        newest = self.list()[:1]
        stage_tree(self, first=not newest)
        # What changed since the newest checkpoint. Before the first one, everything:
        # the store's HEAD is never set, so `diff --cached` compares with an empty tree.
        changes = self.git("diff", "--cached", "--numstat", "-z", "--no-renames",
                           *[checkpoint.id for checkpoint in newest])
        empty = empty_folders(self)
        if newest and not changes and tuple(empty) == newest[0].empty:
            return None
        files, added, removed = numstat_totals(changes)
        tree = self.git("write-tree").strip()
        left_out = [*self.left_out, *ignored_files(self)]   # here, and not in the checkpoint
        message = f"{one_line(reason)}\n\nfiles {files} +{added} -{removed}\n" + \
            "".join(f"left out {json.dumps(path)}\n" for path in left_out) + \
            "".join(f"empty {json.dumps(path)}\n" for path in empty)
        commit = self.git("commit-tree", tree, input=message).strip()   # no parent
        number = int(newest[0].ref.rpartition("/")[2]) + 1 if newest else 1
        self.git("update-ref", "--stdin",
                 input=f"create {CHECKPOINT_REFS}{number:010d} {commit}\n")
        if prune_old:
            prune(self)
        return commit

    def list(self) -> list[Checkpoint]:
        """Every checkpoint of the project, newest first."""
        if not (self.store / "HEAD").is_file():
            return []
        output = self.git("for-each-ref", "--sort=-refname", f"--format={LIST_FORMAT}",
                          CHECKPOINT_REFS)
        return [listed_checkpoint(index, record) for index, record
                in enumerate(output.split(RECORD_END)[:-1], start=1)]

    def diff(self, n: int | str) -> str:
        """The changes from checkpoint n to the project as it is now, as git shows them."""
        checkpoint = find_checkpoint(self, n)
        open_checkpoint_store(self)
        stage_tree(self)
        return self.git("diff", "--cached", "--no-renames", "--no-ext-diff", checkpoint.id,
                        "--", ".", *excluded(self.left_out))

    def restore(self, n: int | str, path: str | None = None) -> Restored:
        """Make the project, or only `path`, exactly what checkpoint n holds. First a
        checkpoint of the project as it is now: the way back."""
        checkpoint = find_checkpoint(self, n)   # before the new checkpoint renumbers them
        wanted = "."
        if path is not None:
            relative = checked_path(self, path)
            check_restorable(self, checkpoint, relative)    # a typo changes nothing
            wanted = ":(literal)" + relative
        # Pruned after the restore: the checkpoint restored may be the oldest one.
        undo = self.snapshot(f"before rollback to {checkpoint.short}", prune_old=False) \
            or self.list()[0].id
        # The snapshot put every file it keeps into the index. --no-overlay removes what
        # the index has and the checkpoint has not (files created since), except what the
        # checkpoint left out: those files were there then. Ignored and left out now:
        # not in the index, they stay as they are.
        try:
            self.git("restore", f"--source={checkpoint.id}", "--staged", "--worktree",
                     "--no-overlay", "--pathspec-from-file=-", "--pathspec-file-nul",
                     input="\0".join([wanted, *excluded([*self.left_out,
                                                         *checkpoint.left_out])]))
        except CheckpointError as exc:
            if "did not match" not in str(exc):
                raise
            raise CheckpointError(f"{visible(path)!r} is left out now (a nested repository "
                                  f"or a large file): it stays as it is") from None
        kept = repositories_now(self, checkpoint, wanted)
        if path is None:
            restore_empty_folders(self, checkpoint)
        prune(self)
        return Restored(checkpoint, undo, path, kept)

    def git(self, *args: str, input: str | None = None, settings=()) -> str:
        """One git command on the store and the project: its output."""
        options = [part for setting in (*GIT_SETTINGS, *settings) for part in ("-c", setting)]
        return self.run([f"--git-dir={self.store}", f"--work-tree={self.project}",
                         *options, *args], input)

    def run(self, args: list, input: str | None = None) -> str:
        """git with `args`, in the project folder; CheckpointError with git's complaint."""
        if self.git_program is None:
            raise CheckpointError("git is not installed (or not on PATH)")
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        try:
            done = subprocess.run([self.git_program, *args], cwd=self.project,
                                  env=git_environment(), capture_output=True, text=True,
                                  encoding="utf-8", errors="replace", timeout=GIT_TIMEOUT,
                                  **stdin)
        except subprocess.TimeoutExpired:
            remove_stale_lock(self.store)
            raise CheckpointError(f"git took longer than {GIT_TIMEOUT} s") from None
        except OSError as exc:
            raise CheckpointError(f"git could not run ({exc})") from None
        except BaseException:                   # Ctrl-C: run() has killed git already
            remove_stale_lock(self.store)
            raise
        if done.returncode != 0:
            complaint = first_line(done.stderr or done.stdout) or f"exit code {done.returncode}"
            raise CheckpointError(f"git {git_command_name(args)}: {complaint}")
        return done.stdout

    def new_turn(self) -> None:
        with self.lock:
            self.turn_taken = False

    def before_change(self, reason: str) -> None:
        """The first change of a user turn: a checkpoint first. Later ones: nothing.
        The lock makes a sub-agent's change wait until the checkpoint is complete."""
        with self.lock:
            if self.turn_taken:
                return
            self.turn_taken = True
            why_not = never_checkpointed(self.project, self.home)
            if why_not:                 # a rule, not a failure: said at the first change
                say_no_checkpoints_once(self, why_not)
                return
            try:
                commit = self.snapshot(reason)
            except Exception as exc:    # a safety net that fails must not stop the work
                warn_once(self, f"warning: no checkpoint was taken ({first_line(exc)}); "
                                f"the tool runs anyway")
                return
        if commit is not None:
            show_checkpoint_note(f"[checkpoint {commit[:SHORT_ID_CHARS]}: {one_line(reason)}"
                                 f"{left_out_note(self.left_out)}]")

    def contains(self, path: Path) -> bool:
        real = Path(os.path.realpath(path))
        return real == self.project or self.project in real.parents


CHECKPOINTS: CheckpointManager | None = None    # this run's; set by main() (None: off)


#: teaching
def checkpoint_before_change(reason: str, target: Path | None = None) -> None:
    """write_file, patch and terminal call this just before a change (outside the project: no)."""
    manager = CHECKPOINTS
    if manager is not None and (target is None or manager.project in Path(
            os.path.realpath(target)).parents):
        manager.before_change(reason)


#: hardened
def checkpoint_before_change(reason: str, target: Path | None = None) -> None:
    """write_file, patch and the terminal tool call this just before they may change
    files. A file outside the project is not the project's change: no checkpoint. The
    store's new refs are the agent's own change: a sub-agent's command running meanwhile
    must not undo them (OutcomeCheck.accept())."""
    manager = CHECKPOINTS
    if manager is not None and (target is None or manager.contains(target)):
        with OutcomeCheck.lock:
            manager.before_change(reason)
            OutcomeCheck.accept(store_roots(manager.store.parent, [manager.store]))


#: hardened
def store_roots(folder, stores: list | None = None) -> list[str]:
    """HEAD, config, packed-refs and refs/ of each store in `folder` (or of `stores`):
    what says which checkpoints there are."""
    if stores is None:
        try:
            with os.scandir(folder) as entries:
                stores = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return []
    return [f"{store}/{name}" for store in stores
            for name in ("HEAD", "config", "packed-refs", "refs")]


#: hardened
def checkpoint_before_command(command: str) -> None:
    """A terminal command that may change files (it runs, so the gate let it pass)."""
    if CHECKPOINTS is not None and command_may_change_files(command):
        checkpoint_before_change(f"before terminal: {command}")


#: hardened
def command_may_change_files(command: str) -> bool:
    """Read by s09's detector, so quoting, wrappers and sh -c hide nothing: a dangerous
    command (it was approved), a command that writes a path (a redirect, rm, mv, cp,
    sed -i, truncate, tee, ...: write_targets()) or a git command that rewrites files.
    When in doubt (too complex to read, or a failing check): yes."""
    try:
        if detect_dangerous_command(command):
            return True
        if any(not target.startswith("/dev/") for target in write_targets(command)):
            return True                         # 2>/dev/null changes no file
        commands = commands_run(command)
        return commands is None or any(git_rewrites_files(line.split()) for line in commands)
    except Exception:
        return True

#: section Checkpoint details

#: hardened
GIT_TIMEOUT = 60                        # seconds one git command may take
MAX_REASON_CHARS = 100                  # of a checkpoint's reason, the store keeps this much
# Never stored (written to the store's info/exclude; the project's .gitignore counts
# too). Git itself never adds a .git. What a project can rebuild, what should not be
# copied around (secrets) and what is large: dependencies, caches, build output, logs,
# binaries, archives and media.
DEFAULT_EXCLUDES = (
    "node_modules/", ".venv/", "venv/", "__pycache__/", "*.pyc", "*.pyo", ".tox/",
    ".cache/", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", "coverage/", ".coverage",
    "build/", "dist/", "target/", "out/", ".next/", ".nuxt/", ".hg/", ".svn/",
    ".env", ".env.*", "*.log", ".DS_Store", "Thumbs.db",
    "*.so", "*.dylib", "*.dll", "*.o", "*.a", "*.obj", "*.exe", "*.class", "*.jar",
    "*.zip", "*.tar", "*.tar.gz", "*.tgz", "*.7z", "*.rar", "*.iso",
    "*.mp4", "*.mov", "*.mkv", "*.webm",
)
# Every file as its bytes: no line-ending conversion, filter or re-encoding that the
# project's .gitattributes asks for (info/attributes beats them), or a restore would
# not give back exactly what was there.
EXACT_ATTRIBUTES = "* -text -filter -ident -working-tree-encoding\n"
# Given to every git call (-c), so nothing of the user's git setup changes what is
# stored or runs: an identity (a machine with no git config has none, and commit-tree
# fails), no signing, no hooks, no global excludes, no automatic gc in the middle of
# a turn, file names as they are (not "\303\251").
GIT_SETTINGS = ("user.name=learn-hermes", "user.email=checkpoints@learn-hermes.invalid",
                "commit.gpgsign=false", f"core.hooksPath={os.devnull}",
                f"core.excludesFile={os.devnull}", "core.autocrlf=false",
                "core.fsmonitor=false", "core.quotePath=false", "gc.auto=0")
# for-each-ref: one record per checkpoint, fields split by NUL, records ended by \x1e
LIST_FORMAT = ("%(refname)%00%(objectname)%00%(committerdate:unix)%00%(contents:subject)"
               "%00%(contents:body)%1e")
RECORD_END = "\x1e\n"
#: hardened
CHECKPOINT_ID = re.compile(r"[0-9a-f]{4,64}")   # a whole or shortened commit id
# A folder with one of these is a project (Hermes's list): only a project is checkpointed.
PROJECT_MARKERS = (".git", "pyproject.toml", "package.json", "Cargo.toml", "go.mod",
                   "Makefile", "pom.xml", "Gemfile", ".hg")
#: hardened
GIT_OPTION_WITH_VALUE = {"-c", "-C", "--git-dir", "--work-tree", "--namespace"}
GIT_REWRITES = {"reset", "checkout", "switch", "restore", "clean", "stash", "rm", "mv",
                "apply", "am", "merge", "rebase", "pull", "revert", "cherry-pick"}

#: hardened
LEFT_OUT_LINE = re.compile(r'^left out ("(?:[^"\\]|\\.)*")$', re.MULTILINE)  # json.dumps()
EMPTY_LINE = re.compile(r'^empty ("(?:[^"\\]|\\.)*")$', re.MULTILINE)
MAX_NAMED_CHANGES = 100                 # more changed files than this: `git add -A .`

#: teaching
GIT_TIMEOUT = 60                        # seconds one git command may take
MAX_REASON_CHARS = 100                  # of a checkpoint's reason, the store keeps this much
# Never stored (the store's info/exclude; .gitignore counts too): rebuildables, secrets, logs.
DEFAULT_EXCLUDES = ("node_modules/", ".venv/", "venv/", "__pycache__/", "*.pyc", ".cache/",
                    "build/", "dist/", "target/", ".env", ".env.*", "*.log")
# Every file as its bytes, whatever .gitattributes asks: a restore gives back what was there.
EXACT_ATTRIBUTES = "* -text -filter -ident -working-tree-encoding\n"
# Given to every git call (-c): an identity (commit-tree needs one), none of the user's setup.
GIT_SETTINGS = ("user.name=learn-hermes", "user.email=checkpoints@learn-hermes.invalid",
                "commit.gpgsign=false", f"core.hooksPath={os.devnull}",
                f"core.excludesFile={os.devnull}", "core.autocrlf=false",
                "core.fsmonitor=false", "core.quotePath=false", "gc.auto=0")
LIST_FORMAT = "%(refname) %(objectname) %(committerdate:unix) %(contents:subject)"  # a line each
# A folder with one of these is a project (Hermes's list): only a project is checkpointed.
PROJECT_MARKERS = (".git", "pyproject.toml", "package.json", "Cargo.toml", "go.mod",
                   "Makefile", "pom.xml", "Gemfile", ".hg")


def project_key(project: Path) -> str:
    """The store's folder name: 16 hex characters of the sha256 of the project's path."""
    return hashlib.sha256(str(project).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def is_project(folder: Path) -> bool:
    """Does `folder` itself hold one of PROJECT_MARKERS?"""
    return any(os.path.lexists(folder / marker) for marker in PROJECT_MARKERS)


#: teaching
def project_root(folder: Path) -> Path:
    """The nearest folder, from `folder` up, with one of PROJECT_MARKERS (else `folder`)."""
    return next((found for found in (folder, *folder.parents) if is_project(found)), folder)


#: hardened
def project_root(folder: Path) -> Path:
    """The project of the working folder: the nearest folder, from `folder` up, that
    holds one of PROJECT_MARKERS; `folder` itself if none does (never_checkpointed()
    then says why it gets no checkpoints)."""
    for candidate in (folder, *folder.parents):
        if is_project(candidate):
            return candidate
    return folder


#: hardened
def say_no_checkpoints_once(manager: CheckpointManager, why_not: str) -> None:
    """The first change of a run where no checkpoint can be taken says so, once: a
    scratch folder is exactly where a learner tries a real model."""
    if manager.told_none:
        return
    manager.told_none = True
    if "not in a project" in why_not:     # home, / and the state folder: no marker helps
        how = (f"`git init` there (or any project marker) turns them on; they are kept "
               f"outside the project, in {manager.store}")
    else:
        how = "start the agent in a project folder to have them"
    console.print(Text(f"  [no checkpoint: {why_not}. {how}]", style="dim"))


#: teaching
def never_checkpointed(project: Path, home: Path) -> str | None:
    """Why this folder gets no checkpoints (/, home, the state folder, no project), or None."""
    if project.parent == project or project == Path(os.path.realpath(os.path.expanduser("~"))):
        return f"{project} is the root or the home folder: it is never checkpointed"
    if project == home or home in project.parents or project in home.parents:
        return f"{project} overlaps the agent's state folder {home}: it is never checkpointed"
    if not is_project(project):
        return (f"{project} is not in a project: neither it nor a folder above holds "
                f"{', '.join(PROJECT_MARKERS[:3])} or another project marker")
    return None


#: hardened
def never_checkpointed(project: Path, home: Path) -> str | None:
    """Why this folder gets no checkpoints, or None. / and the home folder are the
    whole machine or a whole life; the agent's state folder holds the store itself;
    a folder that is no project may be anything (a download folder, /tmp)."""
    if project.parent == project:
        return f"{project} is the root folder: it is never checkpointed"
    if project == Path(os.path.realpath(os.path.expanduser("~"))):
        return f"{project} is the home folder: it is never checkpointed"
    if project == home or home in project.parents:
        return f"{project} is in the agent's state folder {home}: it is never checkpointed"
    if not is_project(project):
        return (f"{project} is not in a project: neither it nor a folder above holds "
                f"{', '.join(PROJECT_MARKERS[:3])} or another project marker")
    return None


#: hardened
def git_environment() -> dict:
    """The environment of a checkpoint's git: no GIT_* variable of the agent's (GIT_DIR
    would point git at another repository, GIT_INDEX_FILE at another index), no secrets,
    and neither the user's nor the system's git config. Messages in English (LC_ALL=C)."""
    env = {name: value for name, value in scrubbed_environment().items()
           if not name.upper().startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


#: hardened
def git_command_name(args: list) -> str:
    """The git command in a call's arguments: "add" in [--git-dir=…, -c, x=y, add, -A]."""
    words = iter(args)
    for word in words:
        if word in GIT_OPTION_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "git"


#: hardened
def git_rewrites_files(words: list) -> bool:
    """`git reset --hard`, `git -C x checkout .`, ...: a git command that changes the
    work tree. `words` is one command, split into words, in lower case."""
    if not words or words[0] != "git":
        return False
    return git_command_name(words[1:]) in GIT_REWRITES


#: hardened
def numstat_totals(numstat: str) -> tuple[int, int, int]:
    """(files, lines added, lines removed) from `git diff --numstat -z`. A binary file
    counts as a file; its lines are "-"."""
    files = added = removed = 0
    for record in numstat.split("\0"):
        parts = record.split("\t", 2)
        if len(parts) == 3:
            files += 1
            added += int(parts[0]) if parts[0].isdecimal() else 0
            removed += int(parts[1]) if parts[1].isdecimal() else 0
    return files, added, removed


def one_line(text: str) -> str:
    """A reason as the store keeps it: one line, nothing hidden, at most MAX_REASON_CHARS."""
    line = visible(" ".join(str(text).split()))
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 1] + "…"

#: hardened
def listed_checkpoint(index: int, record: str) -> Checkpoint:
    ref, commit, when, reason, body = record.lstrip("\n").split("\0")
    stats = re.search(r"files (\d+) \+(\d+) -(\d+)", body)
    files, added, removed = map(int, stats.groups()) if stats else (0, 0, 0)
    left_out = tuple(json.loads(name) for name in LEFT_OUT_LINE.findall(body))
    empty = tuple(json.loads(name) for name in EMPTY_LINE.findall(body))
    return Checkpoint(index, commit, ref, float(when), reason, files, added, removed, left_out,
                      empty)


#: hardened
def checked_id(text: str) -> str:
    """A checkpoint id as typed: 4 to 64 hex characters, never an option (-x, --help)."""
    if text.startswith("-") or not CHECKPOINT_ID.fullmatch(text):
        raise CheckpointError(f"{visible(text)!r} is not a checkpoint: give its number "
                              f"(/rollback lists them) or its id (4-64 hex characters)")
    return text


#: hardened
def left_out_note(left_out: list) -> str:
    return (f"; left out: {len(left_out)} (nested repositories, files over "
            f"checkpoints.max_file_size_mb)" if left_out else "")


#: hardened
def show_checkpoint_note(line: str) -> None:
    console.print(Text(f"  {line}", style="dim"))     # between the tool call and its result


#: teaching
def open_checkpoint_store(manager: CheckpointManager) -> None:
    """Create the store on first use; its excludes and attributes each time (they change)."""
    if problem := never_checkpointed(manager.project, manager.home):
        raise CheckpointError(problem)
    store = manager.store
    if not (store / "HEAD").is_file():
        store.mkdir(parents=True, exist_ok=True, mode=0o700)   # it holds copies of files
        manager.run(["init", "--bare", "--quiet", str(store)])
        (store / "project").write_text(f"{manager.project}\n", encoding="utf-8")
    (store / "info").mkdir(exist_ok=True)
    (store / "info" / "exclude").write_text("\n".join(DEFAULT_EXCLUDES) + "\n", encoding="utf-8")
    (store / "info" / "attributes").write_text(EXACT_ATTRIBUTES, encoding="utf-8")


#: hardened
def open_checkpoint_store(manager: CheckpointManager) -> None:
    """Create the store on first use, and write its excludes and attributes (each
    time: a newer stage may have changed them). The project's path is kept in it."""
    problem = never_checkpointed(manager.project, manager.home)
    if problem:
        raise CheckpointError(problem)
    store = manager.store
    record = store / "project"
    if not (store / "HEAD").is_file():
        store.mkdir(parents=True, exist_ok=True, mode=0o700)   # it holds copies of files
        manager.run(["init", "--bare", "--quiet", str(store)])
        record.write_text(f"{manager.project}\n", encoding="utf-8")
    elif record.is_file() and record.read_text(encoding="utf-8").strip() != str(manager.project):
        raise CheckpointError(f"the store {store} belongs to another folder")
    (store / "info").mkdir(exist_ok=True)
    (store / "info" / "exclude").write_text(
        "\n".join([*DEFAULT_EXCLUDES, *state_folder_exclude(manager)]) + "\n", encoding="utf-8")
    (store / "info" / "attributes").write_text(EXACT_ATTRIBUTES, encoding="utf-8")


#: hardened
def state_folder_exclude(manager: CheckpointManager) -> list[str]:
    """A project that holds the agent's state folder (and so the store): never that."""
    if manager.project not in manager.home.parents:
        return []
    relative = manager.home.relative_to(manager.project).as_posix()
    if "\n" in relative or "\r" in relative:
        raise CheckpointError("the state folder's path has a line break: it cannot be "
                              "excluded")
    return ["/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", relative) + "/"]    # an exact path

#: teaching
def stage_tree(manager: CheckpointManager) -> None:
    """Open the store; its index becomes the project as it is now, minus what is left out."""
    open_checkpoint_store(manager)
    listed = set(manager.git("ls-files", "-z", "--cached", "--others",
                             "--exclude-standard").split("\0")[:-1])   # not what is ignored
    if len(listed) > manager.max_files:
        raise CheckpointError(f"{manager.project} has {len(listed):,} files, more than "
                              f"checkpoints.max_files ({manager.max_files:,})")
    # Left out: nested repositories (git lists a new one as a folder, "vendor/lib/") and
    # files over the limit (lstat: a link's own size; a file deleted since has none).
    repositories = sorted(path for path in listed if path.endswith("/"))
    sizes = {path: os.lstat(manager.project / path).st_size for path in listed
             if not path.endswith("/") and os.path.lexists(manager.project / path)}
    large = sorted(path for path, size in sizes.items() if size > manager.max_file_bytes)
    manager.left_out = repositories + large
    if manager.left_out:    # an earlier checkpoint may hold them: out of the index too
        manager.git("rm", "--cached", "-r", "-f", "-q", "--ignore-unmatch",
                    "--pathspec-from-file=-", "--pathspec-file-nul",
                    input="\0".join(":(literal)" + path for path in manager.left_out))
    manager.git("add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul",
                input="\0".join([".", *excluded(manager.left_out)]))


#: hardened
def stage_tree(manager: CheckpointManager, first: bool = False) -> None:
    """The store's index becomes the project as it is now, minus what is left out."""
    manager.left_out, changed = look_at_tree(manager)
    # A folder the index holds that is a symbolic link now: git will not add a path
    # "beyond a symbolic link", so its old entries go, and the link itself is stored.
    links = links_over_folders(manager.project, changed)
    gone = [*manager.left_out, *(link + "/" for link in links)]
    if gone:                # an earlier checkpoint may hold them: out of the index too
        manager.git("rm", "--cached", "-r", "-f", "-q", "--ignore-unmatch",
                    "--pathspec-from-file=-", "--pathspec-file-nul",
                    input="\0".join(":(literal)" + path for path in gone))
        changed = [path for path in changed if not path.startswith(tuple(gone))] + links
    if not first and not changed:
        return                              # the index is the project already
    # A few changed files are added by name: git then skips the rest of the tree (a
    # third of the time on 10,000 files). The first add of a big tree writes one pack
    # instead of a file per object: about twice as fast (engineering notes §6).
    few = not first and len(changed) <= MAX_NAMED_CHANGES
    specs = [":(literal)" + path for path in changed] if few else \
        [".", *excluded(manager.left_out)]
    manager.git("add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul",
                input="\0".join(specs), settings=["core.bigFileThreshold=1"] if first else [])


#: hardened
def look_at_tree(manager: CheckpointManager) -> tuple[list[str], list[str]]:
    """Ask git which files `add -A` would store (those in the index, "H", and new ones
    that no exclude or .gitignore names, "?") and which of them changed ("?" and "C",
    also a deleted one). Returns what to leave out (each nested repository: `add -A`
    fails on one with no commit; each file over the size limit) and what changed.
    Too many files: CheckpointError. Only new and changed files can have grown, so
    only they are measured: 10,000 stat calls from Python cost 60 ms."""
    listed = manager.git("ls-files", "-z", "-t", "--cached", "--others", "--modified",
                         "--exclude-standard").split("\0")[:-1]
    stored = {entry[2:] for entry in listed if entry[0] in "H?"}
    files = [path for path in stored if not path.endswith("/")]
    # A new repository is listed as a folder ("vendor/lib/"); one in a folder that an
    # earlier checkpoint holds is found by its .git.
    repositories = sorted({path for path in stored if path.endswith("/")}
                          | nested_repositories(manager.project, files))
    if repositories:
        files = [path for path in files if not path.startswith(tuple(repositories))]
    if len(files) > manager.max_files:
        raise CheckpointError(f"{manager.project} has {len(files):,} files, more than "
                              f"checkpoints.max_files ({manager.max_files:,})")
    changed = {entry[2:] for entry in listed if entry[0] in "?C"}.intersection(files)
    large = sorted(path for path in changed if too_large(manager, path))
    return repositories + large, sorted(changed.difference(large))


#: hardened
def repositories_now(manager: CheckpointManager, checkpoint: Checkpoint,
                     wanted: str) -> tuple:
    """The folders the checkpoint held as files that are repositories now (someone ran
    `git init` there): `git restore` above left them as they are, and the caller says
    so. A `.git` that is no repository (an empty file, say) makes no repository: such a
    folder is restored like any other (nested_repositories())."""
    folders = [path for path in manager.left_out
               if path.endswith("/") and path not in checkpoint.left_out]
    if wanted != ".":                       # a one-path restore: only that path's folders
        target = wanted.removeprefix(":(literal)").rstrip("/") + "/"
        folders = [f for f in folders if target.startswith(f) or f.startswith(target)]
    if not folders:
        return ()
    held = manager.git("ls-tree", "-r", "-z", "--name-only", checkpoint.id, "--",
                       *[":(literal)" + folder for folder in folders]).split("\0")[:-1]
    return tuple(sorted({folder for folder in folders
                         for path in held if path.startswith(folder)}))


#: hardened
def links_over_folders(project: Path, paths: list) -> list[str]:
    """The folders above `paths` that are symbolic links now (mv d d.old; ln -s … d)."""
    found = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for end in range(1, len(parts) + 1):
            folder = "/".join(parts[:end])
            if os.path.islink(os.path.join(project, folder)):
                found.add(folder)
                break
    return sorted(found)


#: hardened
def nested_repositories(project: Path, files: list) -> set[str]:
    """The folders of `files` (and the folders above them) that have a .git of their own."""
    folders = {path.rpartition("/")[0] for path in files}   # 10,000 files: ~100 folders
    for folder in list(folders):
        while folder:
            folder = folder.rpartition("/")[0]
            folders.add(folder)
    return {folder + "/" for folder in folders
            if folder and is_repository(os.path.join(project, folder))}


#: hardened
def is_repository(folder: str) -> bool:
    """As git decides it: a .git folder with a HEAD, or a .git file pointing at one. A
    .git that is neither (`touch sub/.git`) makes no repository, and git adds the files."""
    marker = os.path.join(folder, ".git")
    if os.path.isdir(marker) and not os.path.islink(marker):
        return os.path.isfile(os.path.join(marker, "HEAD"))
    try:
        with open(marker, encoding="utf-8", errors="replace") as file:
            first = file.readline(4096)
    except OSError:
        return False
    target = first.removeprefix("gitdir:").strip() if first.startswith("gitdir:") else ""
    return bool(target) and os.path.isfile(os.path.join(folder, target, "HEAD"))


#: hardened
def too_large(manager: CheckpointManager, path: str) -> bool:
    try:
        return os.lstat(os.path.join(manager.project, path)).st_size > manager.max_file_bytes
    except OSError:                         # deleted since: nothing to leave out
        return False


def excluded(left_out: list) -> list[str]:
    """Pathspecs that keep git away from the left-out paths, whatever their names."""
    return [":(exclude,literal)" + path for path in left_out]


#: teaching
def prune(manager: CheckpointManager) -> None:
    """Keep the newest max_snapshots: delete older refs, then the objects no ref uses."""
    old = manager.list()[manager.max_snapshots:]
    if old:
        manager.git("update-ref", "--stdin", input="".join(f"delete {c.ref}\n" for c in old))
        manager.git("prune", "--expire=now")


#: hardened
def prune(manager: CheckpointManager) -> None:
    """Keep the newest checkpoints.max_snapshots checkpoints: delete the refs of the
    older ones, then the objects nothing else uses (the old contents of files)."""
    old = manager.list()[manager.max_snapshots:]
    if old:
        manager.git("update-ref", "--stdin",
                    input="".join(f"delete {checkpoint.ref}\n" for checkpoint in old))
        manager.git("prune", "--expire=now")


#: teaching
def find_checkpoint(manager: CheckpointManager, n: int | str) -> Checkpoint:
    """Checkpoint n by its number in the list (1 = the newest): never any other commit."""
    checkpoints = manager.list()
    if not isinstance(n, int) or isinstance(n, bool):
        raise CheckpointError(f"{visible(str(n))!r} is not a checkpoint: give its number "
                              f"(/rollback lists them)")
    if not 1 <= n <= len(checkpoints):
        there = "there is 1" if len(checkpoints) == 1 else f"there are {len(checkpoints)}"
        raise CheckpointError(f"no checkpoint {n}: {there} (/rollback lists them)")
    return checkpoints[n - 1]


#: hardened
def find_checkpoint(manager: CheckpointManager, n: int | str) -> Checkpoint:
    """Checkpoint n: its number in the list (1 = the newest) or its id (or the start
    of it). Only the project's own checkpoints can be named, never any other commit."""
    checkpoints = manager.list()
    if isinstance(n, int) and not isinstance(n, bool):
        if 1 <= n <= len(checkpoints):
            return checkpoints[n - 1]
        there = "there is" if len(checkpoints) == 1 else "there are"
        raise CheckpointError(f"no checkpoint {n}: {there} {len(checkpoints)} "
                              f"(/rollback lists them)")
    wanted = checked_id(str(n))
    found = [checkpoint for checkpoint in checkpoints if checkpoint.id.startswith(wanted)]
    if len(found) != 1:
        raise CheckpointError(f"{'no' if not found else 'more than one'} checkpoint with "
                              f"the id {n}")
    return found[0]


#: hardened
def checked_path(manager: CheckpointManager, path: str) -> str:
    """A path to restore alone, as a pathspec: relative, inside the project (also after
    symbolic links are followed), and not the project itself."""
    shown = repr(visible(path))
    if not path.strip() or "\0" in path or os.path.isabs(path):
        raise CheckpointError(f"{shown}: give a path relative to the project "
                              f"({manager.project})")
    relative = os.path.normpath(path)
    real = Path(os.path.realpath(manager.project / relative))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep) \
            or manager.project not in real.parents:
        raise CheckpointError(f"{shown} is not inside the project {manager.project}"
                              + (" (all of it: /rollback N)" if real == manager.project else ""))
    return Path(relative).as_posix()


#: hardened
def empty_folders(manager: CheckpointManager) -> list[str]:
    """The project's empty folders ("logs/", "a/b/"), which no commit can hold. git
    lists the folders it stores nothing of; the empty ones are found inside them
    (ignored and left-out folders are not listed)."""
    listed = manager.git("ls-files", "-z", "--others", "--exclude-standard",
                         "--directory").split("\0")[:-1]
    empty = []
    for path in listed:
        if not path.endswith("/") or path in manager.left_out:
            continue
        for folder, names, files in os.walk(os.path.join(manager.project, path)):
            if not names and not files:     # a symbolic link is among the files
                empty.append(Path(folder).relative_to(manager.project).as_posix() + "/")
    return sorted(empty)


#: hardened
def restore_empty_folders(manager: CheckpointManager, checkpoint: Checkpoint) -> None:
    """After a whole-project restore: the empty folders made since go (an empty folder
    holds nothing that could be lost; a folder that held only them is empty next time
    round), and the checkpoint's come back, where no symbolic link stands in the way."""
    while made_since := [path for path in empty_folders(manager)
                         if path not in checkpoint.empty]:
        for path in made_since:
            os.rmdir(os.path.join(manager.project, path))
    for path in checkpoint.empty:
        parts = path.rstrip("/").split("/")
        on_the_way = [os.path.join(manager.project, *parts[:end])
                      for end in range(1, len(parts) + 1)]
        if not any(os.path.islink(place) for place in on_the_way):
            os.makedirs(on_the_way[-1], exist_ok=True)


#: hardened
def ignored_files(manager: CheckpointManager) -> list[str]:
    """The files (and whole folders, as "node_modules/") that are in the project and that
    no checkpoint stores: what .gitignore and the excludes name. A checkpoint records
    them, so that a rule removed later does not make its restore delete them."""
    return manager.git("ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                       "--directory").split("\0")[:-1]


#: hardened
def check_restorable(manager: CheckpointManager, checkpoint: Checkpoint, relative: str) -> None:
    """A path to restore alone must be in the checkpoint or be stored now (to be removed
    as created since). Checked before the rollback's own checkpoint: a typo changes
    nothing. A path the checkpoint left out stays as it is: it is no path to restore."""
    if any(relative == out.rstrip("/") or out.endswith("/") and relative.startswith(out)
           for out in checkpoint.left_out):
        raise CheckpointError(f"{visible(relative)!r} was left out of checkpoint "
                              f"{checkpoint.short}: it stays as it is")
    held = manager.git("ls-tree", "-z", "--name-only", checkpoint.id, "--",
                       ":(literal)" + relative)
    stored_now = manager.git("ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "--", ":(literal)" + relative).split("\0")[:-1]
    if not held and not any(os.path.lexists(manager.project / name) for name in stored_now):
        raise CheckpointError(f"{visible(relative)!r} is not in checkpoint {checkpoint.short}, "
                              f"and not checkpointed now (missing, ignored or left out)")

#: hardened
def checkpoint_store_problem(real: Path) -> str | None:
    """write_file and patch never write into the checkpoints: a changed ref or
    info/exclude would hide a checkpoint from /rollback or change what it restores.
    (A terminal command that names the state folder is refused by s09's
    self-protection.) Every profile's stores, and this run's, wherever they are."""
    base = Path(os.path.realpath(base_home()))
    homes = {base, Path(os.path.realpath(hermes_home()))}
    if CHECKPOINTS is not None:
        homes.add(CHECKPOINTS.home)
    if base / PROFILES_DIR_NAME in real.parents:
        homes.add(base / PROFILES_DIR_NAME / real.relative_to(base / PROFILES_DIR_NAME).parts[0])
    for stores in (home / CHECKPOINTS_DIR_NAME for home in homes):
        if real == stores or stores in real.parents:
            return (f"is in the checkpoint stores {tilde(stores)}: only snapshots and "
                    f"/rollback change them")
    return None


#: hardened
def remove_stale_lock(store: Path) -> None:
    """A git that was killed (Ctrl-C, a timeout) may leave index.lock behind, and every
    later git call would fail on it."""
    (store / "index.lock").unlink(missing_ok=True)


#: hardened
def warn_once(manager: CheckpointManager, line: str) -> None:
    """Each kind of warning once per run: "12,031 files" and "12,032 files" are one."""
    kind = re.sub(r"\d[\d,]*", "#", line)
    if kind not in manager.warned:
        manager.warned.add(kind)
        err_console.print(Text(line, style="yellow"))

#: section Checkpoint commands | plumbing

MAX_DIFF_LINES = 200                    # /rollback diff shows this much of a diff
CHECKPOINTS_OFF = ("checkpoints are off in this run (--no-checkpoints, checkpoints.enabled: "
                   "false in config.yaml, or no git on PATH)")


def use_checkpoints(manager: CheckpointManager | None) -> CheckpointManager | None:
    """Make `manager` this run's (None: no checkpoints); returns the one before it."""
    global CHECKPOINTS
    previous, CHECKPOINTS = CHECKPOINTS, manager
    return previous


#: teaching
def checkpoints_from_config(config: Config) -> CheckpointManager | None:
    """The working folder's project_root() with the chain's limits, or None: off, no git."""
    folder = current_directory()
    if not config["checkpoints.enabled"] or folder is None:
        return None
    if shutil.which("git") is None:
        err_console.print(Text("warning: checkpoints are off: git is not installed (or not "
                               "on PATH), and /rollback has nothing to restore", style="yellow"))
        return None
    return CheckpointManager(project_root(folder), hermes_home(), *(config[f"checkpoints.{key}"]
                             for key in ("max_snapshots", "max_files", "max_file_size_mb")))


#: hardened
def checkpoints_from_config(config: Config) -> CheckpointManager | None:
    """The project's manager with the chain's limits, or None when checkpoints
    are off: by a setting, or (with one warning) because git is not installed.

    The project, as in Hermes, is the nearest folder from the working folder up with a
    .git, pyproject.toml, package.json or another of PROJECT_MARKERS: in a subfolder
    of a repository, /rollback restores the whole repository. A folder in no project
    gets no checkpoints, silently: /rollback says why."""
    folder = current_directory()
    if not config["checkpoints.enabled"] or folder is None:
        return None
    if shutil.which("git") is None:
        err_console.print(Text("warning: checkpoints are off: git is not installed (or not "
                               "on PATH), and /rollback has nothing to restore", style="yellow"))
        return None
    return CheckpointManager(project_root(folder), hermes_home(),
                             config["checkpoints.max_snapshots"],
                             config["checkpoints.max_files"],
                             config["checkpoints.max_file_size_mb"])


#: hardened
def off_flag(setting: Setting) -> str:
    """--no-checkpoints for --checkpoints: the flag that switches a bool setting off."""
    return "--no-" + setting.flag.removeprefix("--")


#: teaching
def rollback_command(session: Session, argument: str) -> None:
    """/rollback; /rollback diff N; /rollback N. Nothing is asked: a rollback can be undone."""
    manager = CHECKPOINTS
    if manager is None:
        console.print(Text(CHECKPOINTS_OFF, style="yellow"))
        return
    first, _, rest = argument.partition(" ")
    try:
        if not first:               # the list, newest first
            checkpoints = manager.list()
            if not checkpoints:
                why = never_checkpointed(manager.project, manager.home)
                console.print(Text(f"no checkpoints: {why}" if why else f"no checkpoints of "
                                   f"{manager.project} yet: the first change of a turn takes one"))
            for c in checkpoints:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time))
                console.print(Text(f"  {c.index:>2}  {c.short}  {when}  {c.reason}"))
        elif first == "diff":       # from checkpoint N to now; visible(): no escape runs
            lines = manager.diff(checkpoint_number(rest.strip() or "1")).splitlines()
            for line in lines[:MAX_DIFF_LINES]:
                console.print(Text(visible(line.expandtabs())))
            if len(lines) > MAX_DIFF_LINES:
                console.print(Text(f"… {len(lines) - MAX_DIFF_LINES} more lines", style="dim"))
        else:                       # the restore took a checkpoint first: the way back
            c, undo = manager.restore(checkpoint_number(argument))
            console.print(Text(f"restored the project to checkpoint {c.short} ({c.reason})\nthe "
                               f"state before this rollback is checkpoint 1 now "
                               f"({undo[:SHORT_ID_CHARS]}): /rollback 1 undoes it", style="green"))
    except (CheckpointError, OSError) as exc:       # OSError: the store's folder, say
        console.print(Text(f"error: {exc}", style="red"))


#: hardened
def rollback_command(session: Session, argument: str) -> None:
    """/rollback: list; /rollback diff N; /rollback N; /rollback N <path>. Nothing is
    asked: a rollback takes a checkpoint first, so it can be undone (also in a pipe)."""
    manager = CHECKPOINTS
    if manager is None:
        console.print(Text(CHECKPOINTS_OFF, style="yellow"))
        return
    first, _, rest = argument.partition(" ")
    try:
        if not first:
            show_checkpoints(manager)
        elif first == "diff":
            show_checkpoint_diff(manager, checkpoint_number(rest.strip() or "1"))
        else:
            show_restored(manager.restore(checkpoint_number(first), rest.strip() or None))
    except (CheckpointError, OSError) as exc:       # OSError: the store's folder, say
        console.print(Text(f"error: {exc}", style="red"))


#: teaching
COMMANDS["/rollback"] = rollback_command

#: hardened
COMMANDS["/rollback"] = told_to_the_outcome_check(     # a rollback changes the store
    rollback_command, lambda: store_roots(f"{hermes_home()}/{CHECKPOINTS_DIR_NAME}"))


def checkpoint_number(text: str) -> int | str:
    """1 to 999 are numbers in the list; any other text is no checkpoint (find_checkpoint())."""
    return int(text) if text.isdecimal() and len(text) <= 3 else text


#: hardened
def show_checkpoints(manager: CheckpointManager) -> None:
    checkpoints = manager.list()
    problem = never_checkpointed(manager.project, manager.home)
    if problem and not checkpoints:
        console.print(Text(f"no checkpoints: {problem}", style="yellow"))
        return
    if not checkpoints:
        console.print(Text(f"no checkpoints of {manager.project} yet: the first change of "
                           f"a turn takes one", style="dim"))
        return
    console.print(Text(f"checkpoints of {manager.project}, newest first (files and lines: "
                       f"what restoring it would undo, the changes made after it):",
                       style="bold"))
    # A checkpoint records what changed before it; its row shows what changed after it,
    # as its label does ("before terminal: …"): the next one's record, or up to now.
    undone = [changes_since(manager, checkpoints[0]),
              *((c.files, c.added, c.removed) for c in checkpoints[:-1])]
    for c, (files, added, removed) in zip(checkpoints, undone):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time))
        console.print(Text(f"  {c.index:>2}  {c.short}  {when}  {files} file(s), "
                           f"+{added} -{removed}  {c.reason}"))
    console.print(Text("/rollback diff N: the changes since N; /rollback N: back to N "
                       "(undo: /rollback 1); /rollback N <path>: one file", style="dim"))


#: hardened
def changes_since(manager: CheckpointManager, checkpoint: Checkpoint) -> tuple[int, int, int]:
    """Files, lines added and lines removed from `checkpoint` to the project now."""
    open_checkpoint_store(manager)
    stage_tree(manager)
    return numstat_totals(manager.git("diff", "--cached", "--numstat", "-z", "--no-renames",
                                      checkpoint.id, "--", ".", *excluded(manager.left_out)))


#: hardened
def show_checkpoint_diff(manager: CheckpointManager, n: int | str) -> None:
    checkpoint = find_checkpoint(manager, n)
    lines = manager.diff(n).splitlines()
    console.print(Text(f"changes from checkpoint {checkpoint.index} ({checkpoint.short}, "
                       f"{checkpoint.reason}) to now:", style="bold"))
    if not lines:
        console.print(Text("  none: the project is as it was then", style="dim"))
    for line in lines[:MAX_DIFF_LINES]:
        console.print(Text(visible(line.expandtabs()), style=diff_style(line)))
    if len(lines) > MAX_DIFF_LINES:
        console.print(Text(f"… {len(lines) - MAX_DIFF_LINES} more lines", style="dim"))


#: hardened
def diff_style(line: str) -> str:
    if line.startswith(("+++", "---", "diff ")):
        return "bold"
    return {"+": "green", "-": "red", "@": "cyan"}.get(line[:1], "")


#: hardened
def show_restored(restored: Restored) -> None:
    c = restored.checkpoint
    what = repr(visible(restored.path)) if restored.path else "the project"
    console.print(Text(f"restored {what} to checkpoint {c.short} ({c.reason})", style="green"))
    console.print(Text(f"the state before this rollback is checkpoint 1 now "
                       f"({restored.undo[:SHORT_ID_CHARS]}): /rollback 1 undoes it", style="dim"))
    for folder in restored.kept:
        console.print(Text(f"{visible(folder)} is a repository of its own now: left as it is, "
                           f"not restored", style="yellow"))


#: hardened
def describe_checkpoints() -> str:
    """The offline model's `checkpoints` verb: what it knows, and who rolls back."""
    if CHECKPOINTS is None:
        return f"No checkpoints: {CHECKPOINTS_OFF}."
    try:
        checkpoints = CHECKPOINTS.list()
    except CheckpointError as exc:
        return f"The checkpoints cannot be read: {exc}"
    lines = [f"{len(checkpoints)} checkpoint(s) of {CHECKPOINTS.project}, newest first:"]
    lines += [f"  {c.index}. {c.short} {c.reason}" for c in checkpoints[:5]]
    return "\n".join(lines + ["Only you can roll back (I have no tool for it): /rollback "
                              "lists them, /rollback N restores one, and /rollback 1 "
                              "afterwards undoes that."])


DEMO_FILES = {"pyproject.toml": "[project]\nname = \"demo\"\n",     # a project marker
              "notes.txt": "Every change can be taken back.\nSo the agent may act.\n",
              "app.py": "print('hello')\n", ".env": "TOKEN=left out of every checkpoint\n"}


#: hardened
def demo_checkpoints(session: Session) -> None:
    for name, text in DEMO_FILES.items():
        Path(name).write_text(text, encoding="utf-8")
    saved = use_checkpoints(CheckpointManager(project_root(Path.cwd()), hermes_home()))
    try:
        console.print(Text("\n1. The first change of a turn is preceded by a checkpoint of "
                           "the project (the working folder: it has a pyproject.toml):",
                           style="bold"))
        demo_turn(session, DEMO_INPUTS[0])
        console.print(Text("\n2. A destructive command (nothing in it needs approval) in "
                           "the next turn: another checkpoint first.", style="bold"))
        demo_turn(session, DEMO_INPUTS[1])
        show_demo_folder()
        for title, line in DEMO_ROLLBACKS:
            console.print(Text(f"\n{title}", style="bold"))
            console.print(Text(f"{STAGE}> {line}", style="bold"))
            handle_command(session, line)
            if line != "/rollback" and "diff" not in line:
                show_demo_folder()
        demo_turn(session, DEMO_INPUTS[2])
    finally:
        use_checkpoints(saved)


#: hardened
DEMO_ROLLBACKS = [
    ("3. /rollback lists the checkpoints, newest first:", "/rollback"),
    ("4. What changed since checkpoint 1:", "/rollback diff 1"),
    ("5. Back to checkpoint 1: exactly as it was (files created since are removed; .env, "
     "left out of checkpoints, is untouched). Nothing is asked:", "/rollback 1"),
    ("6. The rollback took a checkpoint first, so /rollback 1 again undoes it:",
     "/rollback 1"),
]


#: hardened
def show_demo_folder() -> None:
    notes = Path("notes.txt").read_text(encoding="utf-8").count("\n")
    there = [name for name in ("app.py", "app.old", "scratch.txt") if Path(name).exists()]
    console.print(Text(f"  the folder: notes.txt has {notes} line(s); present: "
                       f"{', '.join(there)}; .env unchanged: "
                       f"{Path('.env').read_text(encoding='utf-8') == DEMO_FILES['.env']}",
                       style="dim"))

#: changes

#: hardened
def roots_written_by_the_agent() -> list[str]:
    """The small protected roots that the agent (or you, between two commands) changes
    most, looked at again right before each command: the policy files, memories/ and,
    s12, this project's checkpoint store."""
    store = [CHECKPOINTS.store] if CHECKPOINTS is not None else []
    return [*map(str, policy_files()), f"{hermes_home()}/{MEMORY_DIR_NAME}",
            *store_roots("", store)]


#: hardened
def protected_roots() -> list[str]:
    """The files and folders the outcome check watches: the approval policy, memories/,
    skills/ and the configuration chain; s12: each checkpoint store's HEAD, config and
    refs, which say what /rollback can restore."""
    home = str(hermes_home())
    files = dict.fromkeys(map(str, [*policy_files(), *chain_files()]))
    stores = [root for base in dict.fromkeys([home, str(base_home())])
              for root in store_roots(f"{base}/{CHECKPOINTS_DIR_NAME}")]
    return [*files, f"{home}/{MEMORY_DIR_NAME}", real_skills_root(home), *stores]



STAGE = "s12"


STAGE_TITLE = "checkpoints: a git snapshot before each turn's first change, and /rollback"


def write_file(path: str, content: str) -> str:
    """Create or overwrite a file (and its parent folders)."""
    target = tool_path(path)
    if refused := write_refusal(target):
        return refused
    if target.is_dir():
        return error_result(f"is a directory: {path}")
    checkpoint_before_change(f"before write_file {path}", target)      # s12
    try:
        written = write_text_atomically(target, content)
    except (ValueError, OSError) as exc:    # ValueError: text that UTF-8 cannot encode
        return error_result(f"nothing written to {path}: {exc}")
    return json.dumps({"bytes_written": written, "path": str(target.resolve())},
                      ensure_ascii=False)


def patch(path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
    """Replace exact text. Missing or ambiguous old text is an error, not a guess."""
    target = tool_path(path)
    if refused := write_refusal(target):
        return refused
    if not target.is_file():
        return error_result(f"not a file: {path}")
    if not old_string:
        return error_result("old_string must not be empty")
    with open(target, encoding="utf-8", newline="") as file:    # keep \r\n as it is
        text = file.read()
    count = text.count(old_string)
    if count == 0:
        return error_result(f"old_string not found in {path}")
    if count > 1 and not replace_all:
        return error_result(f"old_string appears {count} times in {path}; "
                            f"add surrounding text to make it unique, or set replace_all")
    checkpoint_before_change(f"before patch {path}", target)           # s12
    try:
        write_text_atomically(target, text.replace(old_string, new_string))
    except (ValueError, OSError) as exc:    # the file is exactly as it was
        return error_result(f"nothing written to {path}: {exc}")
    return json.dumps({"success": True, "replacements": count, "path": str(target.resolve())},
                      ensure_ascii=False)


#: teaching
def terminal_tool(command: str, timeout: int | None = None) -> str:
    """The gate, then s01's run_terminal(); s12: any command may change files: checkpoint first."""
    if refusal := command_gate(command):
        return refusal
    checkpoint_before_change(f"before terminal: {command}")
    return run_terminal(command, timeout)


#: hardened
def terminal_tool(command: str, timeout: int | None = None) -> str:
    """The terminal tool from this stage on: the gate, then s01's run_terminal() inside
    the outcome check (checked_run()). s12: a command that may change files gets the
    turn's checkpoint first."""
    refusal = command_gate(command)
    if refusal is not None:
        return refusal
    checkpoint_before_command(command)
    return checked_run(command, timeout)


#: hardened
def write_refusal(target: Path) -> str | None:
    """Why write_file or patch may not write `target`, as the tool's refusal; None if it
    may. The resolved path counts: links are followed, also to a file not there yet."""
    real = Path(os.path.realpath(target))
    problem = protected_path_problem(real) or write_root_problem(real) \
        or child_state_problem(real) or checkpoint_store_problem(real)   # s10, s12
    if problem is None:
        return None
    return refusal(f"write refused: {tilde(real)} {problem}. Nothing was written.")


MORE_SETTINGS = (       # s12's rows of SETTINGS (s11's build_settings() ends with them)
    Setting("checkpoints.enabled", "bool", True, "a checkpoint of the project before the first "
            "change of each turn (/rollback)", None, "--checkpoints"),
    Setting("checkpoints.max_snapshots", "int", MAX_SNAPSHOTS, "checkpoints kept per project; "
            "the oldest are pruned", low=1, high=500),
    Setting("checkpoints.max_files", "int", MAX_FILES, "a project with more files is not "
            "checkpointed", low=1, high=10_000_000),
    Setting("checkpoints.max_file_size_mb", "int", MAX_FILE_SIZE_MB, "larger files are left "
            "out of checkpoints", low=1, high=100_000, unit="MB"))


#: teaching
def flag_entries(args) -> list[Entry]:
    entries = []
    for s in SETTINGS:
        raw = getattr(args, s.key, None) if s.flag else None
        if raw is not None:             # s12: --no-checkpoints is named as itself
            flag = "--no-" + s.flag[2:] if s.kind == "bool" and raw == "false" else s.flag
            entries.append(Entry(s.key, raw, flag, flag))
    return entries


#: hardened
def flag_entries(args) -> list[Entry]:
    entries = []
    for s in SETTINGS:
        raw = getattr(args, s.key, None) if s.flag else None
        if raw is not None:             # s12: --no-checkpoints is named as itself
            flag = off_flag(s) if s.kind == "bool" and raw == "false" else s.flag
            entries.append(Entry(s.key, raw, flag, flag))
    return entries

#: teaching
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /memory        the memory files as they are on disk, and how full they are
  /skills        the skills a new session's index lists, and any that are not usable
  /permissions   the approval mode, YOLO, timeout, write root and what is approved
  /yolo          YOLO on or off for this session only (never for hardline commands)
  /delegation    how sub-agents run: budget, limits, approvals, heartbeat
  /config        every setting, its value and where it came from (--show-config)
  /rollback      checkpoints, newest first; /rollback diff N; /rollback N (undo: /rollback 1)
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL (at an approval prompt: deny).
The offline model understands:
  $ <command>            run a shell command with the terminal tool (through the gate)
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails first (rate_limit, billing, auth, server, connection,
                         model_not_found, context_overflow, bad_request); default: once
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)
  remember <fact>        save a note with the memory tool (MEMORY.md)
  remember about me: <fact>   save it to the user profile (USER.md)
  skills                 list the skills with skills_list
  skill <name>           load a skill with skill_view
  delegate <goal>        a sub-agent does it (delegate_task); <goal> | <goal>: up to 3 at once
  config                 the model says which settings this run has and who set them"""


#: hardened
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /memory        the memory files as they are on disk, and how full they are
  /skills        the skills a new session's index lists, and any that are not usable
  /permissions   the approval mode, YOLO, timeout, write root and what is approved
  /yolo          YOLO on or off for this session only (never for hardline commands)
  /delegation    how sub-agents run: budget, limits, approvals, heartbeat
  /config        every setting, its value and where it came from (--show-config)
  /rollback      the checkpoints of this project, newest first
  /rollback diff N     what changed since checkpoint N
  /rollback N [path]   the project (or one path) back to checkpoint N; /rollback 1
                       afterwards undoes it
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL (at an approval prompt: deny).
The offline model understands:
  $ <command>            run a shell command with the terminal tool (a dangerous one
                         only after your approval; a hardline one never)
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails this request (default once) before it
                         answers; kinds: rate_limit, billing, auth, model_not_found,
                         context_overflow, bad_request, server, connection
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)
  remember <fact>        save a note with the memory tool (MEMORY.md)
  remember about me: <fact>   save it to the user profile (USER.md)
  skills                 list the skills with skills_list
  skill <name>           load a skill with skill_view
  delegate <goal>        give the goal to a sub-agent with delegate_task (try
                         delegate $ ls); delegate <goal> | <goal> runs up to 3 at once
  config                 the model says which settings this run has and who set them
  checkpoints            the model says which checkpoints there are (only you roll back)"""


#: teaching
def run_turn(session: Session, user_text: str) -> bool:
    """One user turn. Returns False if the model call failed. The turn's budget is
    made here, so that sub-agents started during the turn can pay from it (s10)."""
    session.messages.append({"role": "user", "content": undecodable_to_replacement(user_text)})
    if CHECKPOINTS is not None:         # s12: the first change of this turn gets a checkpoint
        CHECKPOINTS.turn_taken = False
    budget = IterationBudget(session.max_iterations)
    delegation = DELEGATION.set(Delegator(session, budget, 0, show_child_event))
    try:
        answer = run_conversation(session.client, session.model, session.messages,
                                  session.max_iterations, show_event, session.tools,
                                  session.context_length, session.recovery, budget)
    except (openai.OpenAIError, json.JSONDecodeError) as exc:   # JSONDecodeError: not an API
        line = explain_api_failure(exc, session.base_url, session.model)
        err_console.print(Text("error: " + line, style="red"))
        return False
    finally:
        DELEGATION.reset(delegation)
    console.print(Text(answer))
    return True


#: hardened
def run_turn(session: Session, user_text: str) -> bool:
    """One user turn. Returns False if the model call failed. The turn's budget is
    made here, so that sub-agents started during the turn can pay from it (s10)."""
    session.messages.append({"role": "user", "content": undecodable_to_replacement(user_text)})
    if CHECKPOINTS is not None:         # s12: the first change of this turn gets a checkpoint
        CHECKPOINTS.new_turn()
    budget = IterationBudget(session.max_iterations)
    delegation = DELEGATION.set(Delegator(session, budget, 0, show_child_event))
    try:
        answer = run_conversation(session.client, session.model, session.messages,
                                  session.max_iterations, show_event, session.tools,
                                  session.context_length, session.recovery, budget)
    except (openai.OpenAIError, json.JSONDecodeError) as exc:   # JSONDecodeError: not an API
        line = explain_api_failure(exc, session.base_url, session.model)
        err_console.print(Text("error: " + line, style="red"))
        return False
    finally:
        DELEGATION.reset(delegation)
    console.print(Text(answer))
    return True


#: teaching
DEMO_INPUTS = ["write todo.txt buy milk",
               "$ truncate -s 0 notes.txt && mv app.py app.old && echo oops > scratch.txt",
               "/rollback", "/rollback diff 1", "/rollback 1", "read notes.txt", "/rollback 1",
               "read notes.txt"]


#: hardened
DEMO_INPUTS = ["write todo.txt buy milk",
               "$ truncate -s 0 notes.txt && mv app.py app.old && echo oops > scratch.txt",
               "checkpoints"]


#: teaching
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    saved_environment, saved_folder = os.environ.copy(), current_directory()
    saved_checkpoints = CHECKPOINTS
    with tempfile.TemporaryDirectory(prefix="s12-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            for name, text in DEMO_FILES.items():
                Path(name).write_text(text, encoding="utf-8")
            use_checkpoints(CheckpointManager(project_root(Path.cwd()), hermes_home()))
            for line in DEMO_INPUTS:    # a write, a destructive command (no approval), /rollback
                demo_turn(session, line)
        finally:
            use_checkpoints(saved_checkpoints)
            os.environ.clear()
            os.environ.update(saved_environment)    # HOME, PATH, LEARN_HERMES_HOME as before
            if saved_folder is not None:
                os.chdir(saved_folder)
    return 0


#: hardened
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    saved = {name: os.environ.get(name) for name in ("HOME", "LEARN_HERMES_HOME", "PATH")}
    saved_folder = current_directory()
    with tempfile.TemporaryDirectory(prefix="s12-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            demo_checkpoints(session)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if saved_folder is not None:
                os.chdir(saved_folder)
    return 0


#: teaching
def add_setting_flag(parser, setting: Setting) -> None:
    """A flag of SETTINGS, with no type and no default: the chain checks its text."""
    variable = f", ${setting.env}" if setting.env else ""     # every way to set it
    default = shown_value(setting, setting.default)
    help_text = f"{setting.help} ({setting.key}{variable}; default {default})".replace("%", "%%")
    if setting.kind == "bool":                  # --yolo, not --yolo true
        options = {"action": "store_const", "const": "true"}
    else:
        options = {"metavar": "{" + ",".join(setting.choices) + "}" if setting.kind == "choice"
                   else setting.unit.upper() or setting.kind.upper()}
    parser.add_argument(setting.flag, dest=setting.key, help=help_text, **options)
    if setting.kind == "bool" and setting.default is True:     # s12: --no-checkpoints
        parser.add_argument("--no-" + setting.flag[2:], dest=setting.key, action="store_const",
                            const="false", help=f"switch {setting.key} off")


#: hardened
def add_setting_flag(parser, setting: Setting) -> None:
    """A flag of SETTINGS. Its text is checked by the chain, like a value from any layer."""
    default = shown_value(setting, setting.default)
    # Every way to set it: this flag, the key in config.yaml, and the variable if any.
    variable = f", ${setting.env}" if setting.env else ""
    help_text = f"{setting.help} ({setting.key}{variable}; default {default})".replace("%", "%%")
    if setting.kind == "bool":
        parser.add_argument(setting.flag, dest=setting.key, action="store_const",
                            const="true", help=help_text)
        if setting.default is True:     # s12: what is on by default can be switched off
            parser.add_argument(off_flag(setting), dest=setting.key, action="store_const",
                                const="false", help=f"switch {setting.key} off")
    else:
        metavar = "{" + ",".join(setting.choices) + "}" if setting.kind == "choice" else \
            setting.unit.upper() or setting.kind.upper()
        parser.add_argument(setting.flag, dest=setting.key, metavar=metavar, help=help_text)


def main(argv=None) -> int:
    exit_on_signals()
    CtrlC.install()
    args = parse_args(argv)
    config = checked_config(args)
    if config is None:
        return 2
    if args.show_config:
        show_config(config)
        return 0
    saved_home = os.environ.get("LEARN_HERMES_HOME")
    start_with(config)
    session = open_session(args, config)
    session.recovery = retry_policy_from_config(config, session)
    session.delegation = delegation_settings_from_config(config)
    use_checkpoints(checkpoints_from_config(config))       # s12
    approvals = APPROVAL_CONTEXT.set(ApprovalContext(permissions_from_config(config), session,
                                                     terminal_reader()))
    try:
        if args.demo:
            return run_demo(session)
        wanted = args.resume or ("latest" if args.continue_session else None)
        if wanted and not resume_session(session, wanted):
            return 1
        if args.prompt is not None:
            return run_prompt(session, args.prompt)
        return repl(session)
    finally:
        APPROVAL_CONTEXT.reset(approvals)
        use_checkpoints(None)
        close_session(session)
        restore_home(saved_home)

#: teaching
# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'write <path> <text>', '$ <command>' or 'read <path>'"


#: hardened
# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'write <path> <text>', '$ <command>' or 'checkpoints'"


#: hardened
def offline_reply(messages: list, counter: list) -> dict:
    """The next assistant message, as plain data."""
    last = messages[-1] if messages else {}
    if messages and messages[0].get("content") == SUMMARY_INSTRUCTIONS:    # the summariser
        return {"content": offline_compression_summary(str(last.get("content")))}
    if messages and messages[0].get("content") == SMART_REVIEW_PROMPT:     # the reviewer
        return {"content": offline_review(str(last.get("content")))}
    if last.get("role") == "tool":
        return stubborn_retry(messages) or stubborn_rerun(messages, counter) \
            or {"content": offline_summary(messages)}
    text = str(last.get("content") or "").strip()
    if text == "prompt":
        return {"content": describe_system_prompt(messages)}
    if text == "context":
        return {"content": describe_context(messages)}
    if text == "config":
        return {"content": describe_config()}
    if text == "checkpoints":
        return {"content": describe_checkpoints()}
    if text.startswith(("fail ", "retry ")):
        return recovery_reply(text, counter)
    plan = offline_plan(text)
    if plan is None:
        return {"content": OFFLINE_HELP}
    counter[0] += 1
    name, args = plan
    raw = isinstance(args, str)
    call_id = f"call_{'raw' if raw else 'offline'}_{counter[0]}"
    arguments = args if raw else json.dumps(args)
    return {"content": "", "tool_calls": [{"id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": arguments}}]}


#: teaching
def demo_turn(session: Session, line: str) -> bool:
    shown = line if len(line) <= 80 else f"{line[:60]}… ({len(line):,} characters)"
    console.print(Text(f"\n{STAGE}> {shown}", style="bold"))
    if line.startswith("/"):            # s12: the demo's /rollback commands
        return handle_command(session, line)
    return run_turn(session, line)
