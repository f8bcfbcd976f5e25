"""s12: checkpoints. A bare shadow git repository per project in $LEARN_HERMES_HOME,
a snapshot before the first change of each user turn, and /rollback (list, diff,
restore, one path) that can itself be undone.

Runs on every stage from s12 up. Everything happens in tmp_path: the project, the state
folder (LEARN_HERMES_HOME) and any user repository. The agent loop runs against the
loopback fake server (tests/fake_openai.py) or the stage's own offline model. The
commands the model runs only touch files inside the temporary project.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

from fake_openai import FakeOpenAI, call, reply
from helpers import (clean_env, edition_of, first_and_newest, load_stage, repl_output,
                     run_main, run_stage, stages_from)

STAGES = stages_from("s12")
CLIENT = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
USER_GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


@pytest.fixture(params=STAGES)
def stage(request):
    module = load_stage(request.param)
    yield module
    module.use_checkpoints(None)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The working folder: a small tree with the kinds of files a restore must get right."""
    root = tmp_path / "project"
    files = {
        "pyproject.toml": "[project]\nname = 'a-project'\n",      # what makes it a project
        "README.md": "# A project\n",
        "src/app.py": "print('hello')\n",
        "src/util/deep.py": "VALUE = 1\n",
        "my notes.txt": "names with spaces\n",
        "café/ünïcode ✓.txt": "non-ASCII names\n",
        "-x": "a file whose name looks like an option\n",
        "empty.txt": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("src/app.py")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def state(tmp_path):
    """$LEARN_HERMES_HOME of the agent under test: outside the project."""
    return tmp_path / "state"


def manager(stage, root, state, **limits):
    return stage.CheckpointManager(root, state, **limits)


def tree_state(root: Path, skip=()) -> dict:
    """Every entry below `root` (except the names in `skip`): its kind, content hash,
    link target or executable bit. Two equal states are the same tree, byte for byte."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in dirs + files:
            path = Path(folder) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[relative] = ("link", os.readlink(path))
            elif path.is_dir():
                if name not in dirs or not (path / ".git").exists():
                    found[relative] = ("dir",)
            else:
                found[relative] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(),
                                   bool(path.stat().st_mode & stat.S_IXUSR))
    return found


def folder_bytes(folder: Path) -> dict:
    """Every file below `folder` and its bytes: a whole .git, compared byte for byte."""
    return {path.relative_to(folder).as_posix(): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def user_git(repo: Path, *args: str) -> str:
    """git as the user runs it in their own repository (no config of this machine's)."""
    done = subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@x", *args],
                          cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **USER_GIT_ENV})
    return done.stdout


def hardened(stage) -> bool:
    return edition_of(stage.__stage__) == "hardened"


def number_of(m, commit: str) -> int:
    """The number /rollback gives the checkpoint with this id (the teaching edition
    names a checkpoint by its number only)."""
    return next(c.index for c in m.list() if c.id == commit)


def checkpoint_files(stage, m, n=1) -> list[str]:
    """The paths checkpoint n holds."""
    checkpoint = stage.find_checkpoint(m, n)
    return m.git("ls-tree", "-r", "--name-only", "-z", checkpoint.id).split("\0")[:-1]


def change_everything(root: Path) -> None:
    """Modified, deleted (a file and a folder), created (a file and a folder), a binary
    changed, a mode changed, a link moved."""
    (root / "README.md").write_text("# Rewritten\n")
    (root / "my notes.txt").unlink()
    for path in sorted((root / "src" / "util").iterdir()):
        path.unlink()
    (root / "src" / "util").rmdir()
    (root / "new file.txt").write_text("created since\n")
    (root / "new" / "folder").mkdir(parents=True)
    (root / "new" / "folder" / "x.py").write_text("x = 1\n")
    (root / "data.bin").write_bytes(bytes(reversed(range(256))))
    (root / "run.sh").chmod(0o644)
    (root / "link").unlink()
    (root / "link").symlink_to("README.md")
    (root / "café" / "ünïcode ✓.txt").write_text("changed\n")


# ── The store ──────────────────────────────────────────────────────────────


def test_one_bare_store_per_project_named_by_its_path_and_recording_it(stage, project, state,
                                                                    tmp_path):
    m = manager(stage, project, state)
    m.snapshot("first")
    key = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:16]
    assert m.store == state.resolve() / "checkpoints" / key
    assert (m.store / "project").read_text().strip() == str(project.resolve())
    assert "bare = true" in (m.store / "config").read_text()   # no files of its own
    assert stat.S_IMODE(m.store.stat().st_mode) == 0o700      # copies of your files
    assert m.list()[0].ref == "refs/checkpoints/0000000001"
    assert not (project / ".git").exists()              # nothing of git's in the project
    other = tmp_path / "other"
    other.mkdir()
    (other / "Makefile").write_text("all:\n")
    assert manager(stage, other, state).store != m.store


def test_a_snapshot_records_the_reason_and_the_time(stage, project, state):
    m = manager(stage, project, state)
    first = m.snapshot("before write_file a.txt")
    (project / "README.md").write_text("# A project\nline two\n")
    second = m.snapshot("before terminal: rm empty.txt")
    newest, oldest = m.list()
    assert (newest.index, newest.id, newest.reason) == (1, second, "before terminal: rm empty.txt")
    assert (oldest.index, oldest.id, oldest.reason) == (2, first, "before write_file a.txt")
    assert abs(newest.time - __import__("time").time()) < 120
    assert newest.short == second[:7] and len(second) == 40


@pytest.mark.hardening
def test_a_snapshot_records_what_changed(stage, project, state):
    m = manager(stage, project, state)
    first = m.snapshot("before write_file a.txt")
    (project / "README.md").write_text("# A project\nline two\nline three\n")
    (project / "empty.txt").unlink()
    (project / "data.bin").write_bytes(b"\0\1\2")       # binary: no lines to count
    (project / "a\tb.txt").write_text("a tab in the name\n")
    second = m.snapshot("before terminal: rm empty.txt")
    newest, oldest = m.list()
    assert (newest.index, newest.id, newest.reason) == (1, second, "before terminal: rm empty.txt")
    assert (oldest.index, oldest.id, oldest.reason) == (2, first, "before write_file a.txt")
    assert (newest.files, newest.added, newest.removed) == (4, 3, 0)
    assert oldest.files == 11                           # the first one: every file
    assert abs(newest.time - __import__("time").time()) < 120
    assert newest.short == second[:7] and len(second) == 40


def test_nothing_changed_means_no_checkpoint(stage, project, state):
    m = manager(stage, project, state)
    assert m.snapshot("one") is not None
    assert m.snapshot("two") is None
    (project / "README.md").write_text("changed")
    assert m.snapshot("three") is not None
    assert [c.reason for c in m.list()] == ["three", "one"]


def test_a_reason_is_kept_as_one_visible_line(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("before terminal: echo a\necho \x1b[31mred\x1b[0m" + "x" * 300)
    reason = m.list()[0].reason
    assert "\n" not in reason and "\x1b" not in reason and "\\x1b" in reason
    assert len(reason) == 100 and reason.endswith("…")


# ── Restore ────────────────────────────────────────────────────────────────


def test_a_restore_makes_the_tree_exactly_the_checkpoint(stage, project, state):
    m = manager(stage, project, state)
    before = tree_state(project)
    m.snapshot("before")
    change_everything(project)
    changed = tree_state(project)
    assert changed != before
    restored = m.restore(1)
    assert tree_state(project) == before                # created ones gone, deleted back
    assert restored.checkpoint.reason == "before"
    assert m.list()[0].id == restored.undo              # the state before the rollback
    assert m.list()[0].reason == f"before rollback to {restored.checkpoint.short}"
    m.restore(1)                                        # undo the rollback
    assert tree_state(project) == changed


@pytest.mark.hardening
def test_many_changes_at_once_are_staged_as_a_whole_tree(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("before")
    before = tree_state(project)
    for number in range(stage.MAX_NAMED_CHANGES + 20):     # more than are added by name
        (project / "many" / f"{number:03d}.txt").parent.mkdir(exist_ok=True)
        (project / "many" / f"{number:03d}.txt").write_text(f"{number}\n")
    change_everything(project)
    changed = tree_state(project)
    assert m.snapshot("many") is not None
    assert m.list()[0].files == stage.MAX_NAMED_CHANGES + 20 + 9    # and change_everything()
    m.restore(2)
    assert tree_state(project) == before
    m.restore(1)
    assert tree_state(project) == changed


def test_a_restore_with_nothing_changed_is_undone_by_the_newest(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("first")
    (project / "README.md").write_text("second\n")
    newest = m.snapshot("second")
    restored = m.restore(2)                             # nothing changed since "second":
    assert restored.undo == newest and len(m.list()) == 2   # no new checkpoint
    assert (project / "README.md").read_text() == "# A project\n"


@pytest.mark.hardening
def test_a_checkpoint_without_a_stats_line_lists_zeros(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("ours")
    tree = m.git("write-tree").strip()
    commit = m.git("commit-tree", tree, input="made by hand\n").strip()
    m.git("update-ref", "refs/checkpoints/0000000009", commit)
    by_hand = m.list()[0]
    assert (by_hand.reason, by_hand.files, by_hand.added, by_hand.removed) == (
        "made by hand", 0, 0, 0)


def test_a_restore_to_an_older_checkpoint(stage, project, state):
    m = manager(stage, project, state)
    first_state = tree_state(project)
    m.snapshot("first")
    (project / "README.md").write_text("second\n")
    second_state = tree_state(project)
    m.snapshot("second")
    (project / "README.md").write_text("third\n")
    (project / "third.txt").write_text("3")
    m.restore(2)
    assert tree_state(project) == first_state
    assert [c.reason for c in m.list()][1:] == ["second", "first"]   # one more before them
    m.restore(2)
    assert tree_state(project) == second_state


@pytest.mark.hardening
def test_a_restore_by_id(stage, project, state):
    m = manager(stage, project, state)
    first_state = tree_state(project)
    first = m.snapshot("first")
    (project / "README.md").write_text("second\n")
    m.snapshot("second")
    (project / "README.md").write_text("third\n")
    (project / "third.txt").write_text("3")
    m.restore(first[:8])
    assert tree_state(project) == first_state
    with pytest.raises(stage.CheckpointError, match="no checkpoint with the id"):
        m.restore("abcdef12")


@pytest.mark.hardening
def test_one_file_or_folder_is_restored_alone(stage, project, state):
    m = manager(stage, project, state)
    before = m.snapshot("before")
    (project / "README.md").write_text("changed\n")
    (project / "src" / "app.py").write_text("changed too\n")
    (project / "src" / "created.py").write_text("new\n")
    (project / "-x").write_text("changed\n")
    m.restore(1, "README.md")
    assert (project / "README.md").read_text() == "# A project\n"
    assert (project / "src" / "app.py").read_text() == "changed too\n"   # the others stay
    m.restore(before, "-x")                             # a name like an option is a path
    assert (project / "-x").read_text() == "a file whose name looks like an option\n"
    m.restore(before, "src")                            # a folder: exactly as it was
    assert (project / "src" / "app.py").read_text() == "print('hello')\n"
    assert not (project / "src" / "created.py").exists()
    (project / "café" / "ünïcode ✓.txt").unlink()
    m.restore(before, "café/ünïcode ✓.txt")
    assert (project / "café" / "ünïcode ✓.txt").read_text() == "non-ASCII names\n"
    with pytest.raises(stage.CheckpointError, match="not in checkpoint"):
        m.restore(before, "never-there.txt")


RESTORE_PATHS = ["../..", "..", "/etc/passwd", "src/../../outside.txt", "outside-link/x", "",
                 "."]
REFS = [*[(ref, "is not a checkpoint") for ref in ("--help", "-x", "-1", "HEAD", "HEAD~1", "abc",
                                                   "a" * 65, "12345g", "ABCDEF1", "1234 5678",
                                                   "--", "-abcd", "", "1 README.md")],
        (True, "is not a checkpoint"), ("0", "no checkpoint 0"), ("21", "no checkpoint 21"),
        ("abcd", "no checkpoint with the id abcd"), ("999", "no checkpoint 999"),
        ("1234", "no checkpoint with the id 1234")]
# The teaching edition names a checkpoint by its number only: an id is no checkpoint.
TEACHING_REFS = {"abcd": "'abcd' is not a checkpoint: give its number",
                 "1234": "'1234' is not a checkpoint: give its number"}


@pytest.mark.hardening
def test_restore_paths_must_stay_inside_the_project(stage, project, state, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside.txt").write_text("not the project's")
    (project / "outside-link").symlink_to(tmp_path / "outside")
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / "README.md").write_text("changed\n")
    for path in RESTORE_PATHS:
        problem = "give a path relative" if path.startswith("/") or not path else "not inside"
        with pytest.raises(stage.CheckpointError, match=problem):
            m.restore(1, path)
    assert len(m.list()) == 1                           # refused before anything was done
    assert (project / "README.md").read_text() == "changed\n"
    assert (tmp_path / "outside.txt").read_text() == "not the project's"


def test_checkpoint_ids_and_numbers_are_checked(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / "README.md").write_text("changed\n")
    for ref, problem in REFS:
        if not hardened(stage):
            problem = TEACHING_REFS.get(ref, problem)
        n = stage.checkpoint_number(ref) if isinstance(ref, str) else ref
        with pytest.raises(stage.CheckpointError, match=problem):
            m.restore(n)
        with pytest.raises(stage.CheckpointError, match=problem):
            m.diff(n)
    assert len(m.list()) == 1                           # refused before anything was done
    assert (project / "README.md").read_text() == "changed\n"


def test_a_commit_that_is_not_a_checkpoint_cannot_be_restored(stage, project, state):
    user_git(project, "init", "-q")
    user_git(project, "add", "-A")
    user_git(project, "commit", "-qm", "the user's")
    theirs = user_git(project, "rev-parse", "HEAD").strip()
    m = manager(stage, project, state)
    m.snapshot("before")
    problem = "no checkpoint with the id" if hardened(stage) else "is not a checkpoint"
    for ref in (theirs, theirs[:7]):
        with pytest.raises(stage.CheckpointError, match=problem):
            m.restore(stage.checkpoint_number(ref))
    assert len(m.list()) == 1


# ── What is never touched ──────────────────────────────────────────────────


def test_the_users_own_git_folder_is_byte_identical(stage, project, state):
    user_git(project, "init", "-q")
    user_git(project, "add", "README.md", "src")
    user_git(project, "commit", "-qm", "first")
    (project / "README.md").write_text("stashed change\n")
    user_git(project, "stash", "-q")
    (project / "src" / "app.py").write_text("staged change\n")
    user_git(project, "add", "src/app.py")
    user_git(project, "config", "core.hooksPath", "hooks-of-the-user")
    status = user_git(project, "status", "--porcelain")
    git_before, tree_before = folder_bytes(project / ".git"), tree_state(project, {".git"})
    m = manager(stage, project, state)
    for round_ in range(3):
        start = m.snapshot(f"round {round_}") or m.list()[0].id
        change_everything(project)
        m.snapshot("changed")
        assert "+# Rewritten" in m.diff(number_of(m, start))
        m.restore(number_of(m, start))
        if hardened(stage):
            m.restore(1, "README.md")                   # the changed one, once more
            m.restore(start, "README.md")
    assert tree_state(project, {".git"}) == tree_before
    assert folder_bytes(project / ".git") == git_before
    assert user_git(project, "status", "--porcelain") == status
    assert "GIT_DIR" not in os.environ and "GIT_WORK_TREE" not in os.environ
    assert ".git" not in [p.split("/")[0] for p in checkpoint_files(stage, m)]


def test_nested_repositories_are_left_out_and_left_alone(stage, project, state):
    with_commit, without = project / "vendor" / "lib", project / "vendor" / "empty"
    for repo in (with_commit, without):
        repo.mkdir(parents=True)
        (repo / "code.py").write_text("nested = True\n")
        user_git(repo, "init", "-q")
    user_git(with_commit, "add", "-A")
    user_git(with_commit, "commit", "-qm", "nested")
    elsewhere = project.parent / "elsewhere"            # a .git file, as a worktree has
    elsewhere.mkdir()
    user_git(elsewhere, "init", "-q")
    (project / "worktree").mkdir()
    (project / "worktree" / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    (project / "worktree" / "w.txt").write_text("w")
    nested = {repo: folder_bytes(repo / ".git") for repo in (with_commit, without)}
    m = manager(stage, project, state)
    assert m.snapshot("before") is not None              # add -A alone would fail here
    stored = checkpoint_files(stage, m)
    assert not [p for p in stored if p.startswith(("vendor/", "worktree/"))]
    assert "README.md" in stored
    (with_commit / "code.py").write_text("changed inside the nested repository\n")
    (project / "README.md").write_text("changed\n")
    m.restore(1)
    assert (project / "README.md").read_text() == "# A project\n"
    assert (with_commit / "code.py").read_text() == "changed inside the nested repository\n"
    assert {repo: folder_bytes(repo / ".git") for repo in nested} == nested


@pytest.mark.hardening
def test_a_folder_that_becomes_a_repository_leaves_the_checkpoints(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("src is plain")
    user_git(project / "src", "init", "-q")             # now src is someone's repository
    (project / "src" / "app.py").write_text("theirs now\n")
    m.snapshot("src is a repository")
    assert not [p for p in checkpoint_files(stage, m) if p.startswith("src/")]
    m.restore(2)                                        # the old checkpoint has src/: left alone
    assert (project / "src" / "app.py").read_text() == "theirs now\n"


@pytest.mark.hardening
def test_a_folder_of_one_file_that_becomes_a_repository_is_named_too(stage, project, state):
    (project / "lib").mkdir()
    (project / "lib" / "only.py").write_text("one file\n")
    m = manager(stage, project, state)
    m.snapshot("lib is plain")
    user_git(project / "lib", "init", "-q")
    assert m.restore(1).kept == ("lib/",)


@pytest.mark.hardening
def test_no_empty_folder_is_recorded_inside_a_folder_left_out(stage, project, state):
    """A repository of its own is left out whole: the empty folders inside its .git are
    not the project's (a mutation sample's survivor)."""
    (project / "logs").mkdir()
    user_git(project / "src", "init", "-q")
    m = manager(stage, project, state)
    m.snapshot("src is a repository")
    assert "src/" in m.left_out
    assert stage.empty_folders(m) == ["logs/"]


@pytest.mark.hardening
def test_a_folder_that_becomes_a_repository_is_named_by_the_rollback(stage, project, state,
                                                                     capsys):
    m = manager(stage, project, state)
    m.snapshot("src is plain")
    user_git(project / "src", "init", "-q")
    restored = m.restore(1)
    assert restored.kept == ("src/",)
    stage.show_restored(restored)
    assert "src/ is a repository of its own now: left as it is" in capsys.readouterr().out


@pytest.mark.parametrize("make_git", [Path.touch, Path.mkdir], ids=["file", "folder"])
def test_a_git_that_is_no_repository_hides_nothing(stage, project, state, make_git):
    """`touch src/.git` or `mkdir src/.git` makes no repository (git adds the files):
    the folder is checkpointed and restored like any other."""
    m = manager(stage, project, state)
    m.snapshot("before")
    make_git(project / "src" / ".git")
    (project / "src" / "app.py").unlink()
    (project / "src" / "planted.py").write_text("evil\n")
    restored = m.restore(2 if m.snapshot("after") else 1)
    assert getattr(restored, "kept", ()) == ()          # the teaching edition keeps none
    assert (project / "src" / "app.py").read_text() == "print('hello')\n"
    assert not (project / "src" / "planted.py").exists()


def test_a_folder_replaced_by_a_link_is_restored_and_the_outside_untouched(stage, project,
                                                                          state, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs.txt").write_text("not the project's\n")
    m = manager(stage, project, state)
    m.snapshot("src is a folder")
    before = tree_state(project)
    (project / "src").rename(project / "src.old")
    (project / "src").symlink_to(outside)
    assert m.snapshot("src is a link") is not None      # checkpoints still work
    restored = m.restore(2)
    assert tree_state(project) == before                # src.old was made since: gone
    assert folder_bytes(outside) == {"theirs.txt": b"not the project's\n"}
    m.snapshot("after the restore")                     # later checkpoints work
    m.restore(number_of(m, restored.undo))              # and the undo brings the link back
    assert os.readlink(project / "src") == str(outside)
    assert (project / "src.old" / "app.py").read_text() == "print('hello')\n"


@pytest.mark.hardening
def test_empty_folders_come_back_and_new_ones_go(stage, project, state):
    (project / "logs").mkdir()
    (project / "cache" / "a" / "b").mkdir(parents=True)
    m = manager(stage, project, state)
    m.snapshot("with empty folders")
    before = tree_state(project)
    (project / "logs").rmdir()
    (project / "cache" / "a" / "b").rmdir()
    (project / "made" / "since").mkdir(parents=True)
    assert m.snapshot("only the empty folders changed") is not None
    after = tree_state(project)
    restored = m.restore(2)
    assert tree_state(project) == before
    m.restore(restored.undo)                            # the undo: the new ones are back
    assert tree_state(project) == after


@pytest.mark.hardening
def test_a_command_that_deletes_a_checkpoint_ref_is_undone(stage, project, state, monkeypatch):
    """Principle 2 (issue 22): each store's HEAD, config and refs are watched around a
    command; a ref deleted or rewritten is put back, and /rollback still lists it."""
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    m = manager(stage, project, state)
    m.snapshot("one")
    (project / "README.md").write_text("two\n")
    m.snapshot("two")
    listed = [c.id for c in m.list()]
    refs = sorted((m.store / "refs" / "checkpoints").iterdir())
    command = f'rm "{refs[0]}" && echo 0000 > "{refs[1]}" && echo x > "{m.store}/HEAD"'
    refusal = json.loads(stage.checked_run(command))
    assert refusal["blocked"] == "self-protection" and len(refusal["changed"]) == 3
    assert [c.id for c in m.list()] == listed
    m.restore(2)
    assert (project / "README.md").read_text() == "# A project\n"


@pytest.mark.hardening
def test_a_checkpoint_taken_while_another_command_runs_is_no_change_of_that_command(
        stage, project, state, monkeypatch, tmp_path):
    """s10's sub-agents run at once: one takes the turn's checkpoint while another's
    command runs. The new ref is the agent's own (OutcomeCheck.accept()): kept."""
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    m.snapshot("before the turn")
    go = tmp_path / "go"
    results = []
    waiting = threading.Thread(target=lambda: results.append(json.loads(stage.checked_run(
        f'i=0; while [ ! -e "{go}" ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done'))))
    waiting.start()
    while not stage.OutcomeCheck.active:
        time.sleep(0.005)
    (project / "README.md").write_text("changed by a sub-agent\n")
    stage.checkpoint_before_change("before write_file README.md")
    go.touch()
    waiting.join()
    assert results == [{"output": "", "exit_code": 0}]
    assert [c.reason for c in m.list()] == ["before write_file README.md", "before the turn"]


def test_ignored_and_excluded_files_are_left_out_and_untouched(stage, project, state):
    (project / ".gitignore").write_text("secret.txt\ndata/\n")
    kept = {"secret.txt": "mine", "data/big.csv": "1,2", ".env": "TOKEN=x", "app.log": "log",
            "node_modules/pkg/index.js": "js", "__pycache__/m.pyc": "pyc",
            ".venv/lib/site.py": "venv", "archive.zip": "zip", "build/out.o": "o"}
    if not hardened(stage):                             # its shorter DEFAULT_EXCLUDES
        del kept["archive.zip"]
    for name, text in kept.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    m = manager(stage, project, state)
    m.snapshot("before")
    stored = checkpoint_files(stage, m)
    assert ".gitignore" in stored
    assert [name for name in kept if name in stored] == []
    for name in kept:
        (project / name).write_text("changed since")
    (project / "data" / "new.csv").write_text("created since, ignored")
    (project / "README.md").write_text("changed\n")
    m.restore(1)
    assert (project / "README.md").read_text() == "# A project\n"
    assert all((project / name).read_text() == "changed since" for name in kept)
    assert (project / "data" / "new.csv").exists()


def test_exact_bytes_whatever_the_projects_gitattributes_say(stage, project, state):
    (project / ".gitattributes").write_text("* text=auto eol=lf\n*.txt ident\n")
    (project / "crlf.txt").write_bytes(b"one\r\ntwo\r\n$Id$\r\n")
    before = tree_state(project)
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / "crlf.txt").write_bytes(b"gone")
    m.restore(1)
    assert (project / "crlf.txt").read_bytes() == b"one\r\ntwo\r\n$Id$\r\n"
    assert tree_state(project) == before


def test_large_files_are_left_out(stage, project, state):
    (project / "vendor").mkdir()
    user_git(project / "vendor", "init", "-q")         # a nested repository beside them
    (project / "big.bin").write_bytes(b"\0" * (1024 * 1024 + 1))
    (project / "just fits.bin").write_bytes(b"\0" * 1024 * 1024)
    m = manager(stage, project, state, max_file_size_mb=1)
    m.snapshot("before")
    assert "big.bin" not in checkpoint_files(stage, m)
    assert "just fits.bin" in checkpoint_files(stage, m)
    assert m.left_out == ["vendor/", "big.bin"]
    (project / "big.bin").write_bytes(b"changed")       # small again: stored from now on
    m.snapshot("small")
    assert "big.bin" in checkpoint_files(stage, m)
    (project / "big.bin").write_bytes(b"\1" * (1024 * 1024 + 1))
    (project / "README.md").write_text("changed\n")
    m.restore(1)                                        # it grew: left out, left alone
    assert "big.bin" not in checkpoint_files(stage, m, 1)   # nor in the pre-rollback one
    assert (project / "big.bin").read_bytes() == b"\1" * (1024 * 1024 + 1)
    assert (project / "README.md").read_text() == "# A project\n"
    if hardened(stage):
        with pytest.raises(stage.CheckpointError, match="'big.bin' is left out now .*: it stays"):
            m.restore(2, "big.bin")                     # alone: the same
        assert (project / "big.bin").read_bytes() == b"\1" * (1024 * 1024 + 1)


@pytest.mark.hardening
def test_what_a_checkpoint_left_out_stays_when_it_is_restored(stage, project, state):
    """Left out then and not now: ignored by a .gitignore line removed since, over the size
    limit then, in a nested repository whose .git is gone. Each is in the index now and
    not in the checkpoint, and none was created since: the restore leaves them be."""
    (project / ".gitignore").write_text("*.db\n")
    (project / "local.db").write_text("precious\n")
    (project / "big.bin").write_bytes(b"\0" * (1024 * 1024 + 1))
    (project / "lib").mkdir()
    (project / "lib" / "code.py").write_text("nested\n")
    user_git(project / "lib", "init", "-q")
    m = manager(stage, project, state, max_file_size_mb=1)
    m.snapshot("before")
    assert stage.find_checkpoint(m, 1).left_out == ("lib/", "big.bin", "local.db")
    (project / ".gitignore").write_text("")
    (project / "big.bin").write_bytes(b"small now")
    subprocess.run(["rm", "-rf", str(project / "lib" / ".git")], check=True)
    (project / "created.txt").write_text("since\n")
    (project / "src" / "made").mkdir()
    (project / "src" / "made" / "also.py").write_text("since\n")
    m.snapshot("all of them stored")
    assert {"local.db", "big.bin", "lib/code.py"} <= set(checkpoint_files(stage, m))
    m.restore(2)
    assert (project / ".gitignore").read_text() == "*.db\n"
    assert (project / "local.db").read_text() == "precious\n"
    assert (project / "big.bin").read_bytes() == b"small now"
    assert (project / "lib" / "code.py").read_text() == "nested\n"
    assert not (project / "created.txt").exists() and not (project / "src" / "made").exists()
    m.restore(1)                                        # and undone: exactly as before
    assert (project / "created.txt").exists() and (project / ".gitignore").read_text() == ""


@pytest.mark.hardening
def test_one_path_left_out_then_is_not_removed(stage, project, state):
    (project / ".gitignore").write_text("*.db\n")
    (project / "local.db").write_text("precious\n")
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / ".gitignore").write_text("")
    (project / "lib").mkdir()
    (project / "lib" / "code.py").write_text("nested\n")
    user_git(project / "lib", "init", "-q")
    m.snapshot("lib is a repository")
    subprocess.run(["rm", "-rf", str(project / "lib" / ".git")], check=True)
    for path in ("local.db", "lib/code.py", "lib"):
        with pytest.raises(stage.CheckpointError, match="was left out of checkpoint .*: it stays"):
            m.restore(1 if path.startswith("lib") else 2, path)
    assert len(m.list()) == 2
    assert (project / "local.db").read_text() == "precious\n"
    assert (project / "local.db").read_text() == "precious\n"


@pytest.mark.hardening
def test_a_left_out_record_survives_any_name(stage, project, state):
    names = ['big "quoted".bin', "big\\back.bin", "big\nline.bin", "bïg ✓.bin"]
    for name in names:
        (project / name).write_bytes(b"\0" * (1024 * 1024 + 1))
    m = manager(stage, project, state, max_file_size_mb=1)
    m.snapshot("before")
    assert sorted(stage.find_checkpoint(m, 1).left_out) == sorted(names)


@pytest.mark.hardening
def test_a_path_in_neither_the_checkpoint_nor_the_project_changes_nothing(stage, project,
                                                                          state):
    (project / ".gitignore").write_text("*.db\n")
    (project / "ignored.db").write_text("ignored now and then\n")
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / "stale.txt").write_text("in the index, not in checkpoint 1\n")
    m.snapshot("stale.txt stored")
    (project / "stale.txt").unlink()                    # the store's index still lists it
    (project / "README.md").unlink()                    # a change a snapshot would take
    for path, problem in [("typo.txt", "and not checkpointed now"),
                          ("src/typo/", "and not checkpointed now"),
                          ("stale.txt", "and not checkpointed now"),
                          ("ignored.db", "was left out of checkpoint")]:
        with pytest.raises(stage.CheckpointError, match=problem):
            m.restore(2, path)
    assert len(m.list()) == 2 and not (project / "README.md").exists()
    m.restore(2, "README.md")                           # deleted since: in the checkpoint
    assert (project / "README.md").read_text() == "# A project\n"


def test_a_folder_with_too_many_files_gets_no_checkpoint(stage, project, state):
    m = manager(stage, project, state, max_files=10)     # the project has 11 files
    with pytest.raises(stage.CheckpointError, match="checkpoints.max_files"):
        m.snapshot("before")
    assert manager(stage, project, state, max_files=11).snapshot("before") is not None


def test_the_root_the_home_folder_and_the_state_folder_are_never_checkpointed(
        stage, tmp_path, monkeypatch):
    home = tmp_path / "user"
    (home / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    state = home / ".learn-hermes"
    for folder in (Path("/"), home, state, state / "sub"):
        m = stage.CheckpointManager(folder, state)
        with pytest.raises(stage.CheckpointError, match="never checkpointed"):
            m.snapshot("before")
        assert m.list() == []
    assert not (state / "checkpoints").exists()
    (home / "work" / "Makefile").write_text("all:\n")
    assert stage.CheckpointManager(home / "work", state).snapshot("fine") is not None
    (home / ".git").mkdir()                             # a dotfiles repository: home is
    (home / "notes").mkdir()                            # the project of a plain folder in it
    assert stage.project_root(home / "notes") == home.resolve()


def test_the_project_is_the_nearest_folder_with_a_marker(stage, tmp_path, state):
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / "src" / "deep").mkdir(parents=True)
    (repo / "package.json").write_text("{}")
    plain.mkdir()
    assert stage.project_root(repo / "src" / "deep") == repo
    assert stage.project_root(plain) == plain
    result = run_main(stage, "-p", "write a.txt one", env=agent_env(state), cwd=repo / "src")
    assert "[checkpoint " in result.stdout
    assert stage.CheckpointManager(repo, state).list()[0].reason == "before write_file a.txt"
    lines = ["write a.txt one", "write b.txt two", "/rollback"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=plain)
    assert (plain / "a.txt").read_text() == "one" and (plain / "b.txt").read_text() == "two"
    assert "warning" not in result.stderr               # a rule, not a failure: no warning
    assert "is not in a project" in repl_output(result.stdout, "s12> ", "/rollback")
    assert not stage.CheckpointManager(plain, state).store.exists()


def test_outside_a_project_the_first_change_says_so_once(stage, tmp_path, state):
    """Issue 23, item 3: a scratch folder gets no checkpoints; the first change of the
    run says where they would go and how to turn them on, and nothing more after it."""
    plain = tmp_path / "scratch"
    plain.mkdir()
    lines = ["$ echo looked", "write a.txt one", "write b.txt two"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=plain)
    notes = [line for line in result.stdout.splitlines() if "[no checkpoint:" in line]
    store = stage.CheckpointManager(plain, state).store
    assert len(notes) == 1 and "`git init`" in notes[0] and str(store) in notes[0]
    # The teaching edition checkpoints before any command; the hardened one knows that
    # `echo` changes nothing, so its first change is the write.
    first_change = 1 if edition_of(stage.__stage__) == "hardened" else 0
    assert notes[0] in repl_output(result.stdout, "s12> ", lines[first_change])
    assert "warning" not in result.stderr


@pytest.mark.hardening
def test_each_row_counts_what_restoring_it_would_undo(stage, project, state):
    """Issue 23, item 4: a row's numbers and its label ("before …") describe one step:
    the changes made after that checkpoint, which restoring it would undo."""
    m = manager(stage, project, state)
    m.snapshot("before step one")
    (project / "new.txt").write_text("one\ntwo\n")                   # step one: 1 file, +2
    m.snapshot("before step two")
    (project / "README.md").write_text("")                            # step two: 2 files,
    (project / "my notes.txt").unlink()                               # -2 lines
    result = run_main(stage, "-p", "/rollback", env=agent_env(state), cwd=project)
    rows = [line for line in result.stdout.splitlines() if "  before step" in line]
    assert "what restoring it would undo" in result.stdout
    assert rows[0].endswith("2 file(s), +0 -2  before step two"), rows
    assert rows[1].endswith("1 file(s), +2 -0  before step one"), rows


@pytest.mark.hardening
def test_a_state_folder_inside_the_project_is_left_out(stage, project):
    state = project / "state dir [1]"
    m = stage.CheckpointManager(project, state)
    m.snapshot("before")
    m.snapshot("again")                                 # the store changed: no new checkpoint
    assert len(m.list()) == 1
    assert not [p for p in checkpoint_files(stage, m) if p.startswith("state dir")]


@pytest.mark.parametrize("stage_name", [s for s in STAGES if edition_of(s) == "teaching"])
def test_the_teaching_edition_never_checkpoints_a_project_that_holds_the_state_folder(
        stage_name, project):
    """The hardened edition leaves the state folder out (state_folder_exclude()); the
    teaching edition takes no checkpoint of such a project at all, and says why."""
    stage = load_stage(stage_name)
    m = stage.CheckpointManager(project, project / "state")
    with pytest.raises(stage.CheckpointError, match="overlaps the agent's state folder"):
        m.snapshot("before")
    assert m.list() == [] and not (project / "state").exists()


def test_the_users_git_config_and_git_variables_change_nothing(stage, project, state, tmp_path,
                                                               monkeypatch):
    home = tmp_path / "user"
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    marker = tmp_path / "hook-ran"
    for hook in ("pre-commit", "post-commit", "post-checkout", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    (home / ".gitconfig").write_text(
        f"[core]\n\thooksPath = {hooks}\n\tautocrlf = true\n[commit]\n\tgpgsign = true\n"
        f"[gpg]\n\tprogram = /nonexistent-gpg\n[user]\n\tuseConfigOnly = true\n"
        f"[diff]\n\tnoprefix = true\n")
    other = tmp_path / "other-repo"
    other.mkdir()
    user_git(other, "init", "-q")
    other_git = folder_bytes(other / ".git")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))  # as if the user had exported them
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "their-index"))
    (project / "crlf.txt").write_bytes(b"a\r\n")
    m = manager(stage, project, state)
    m.snapshot("before")
    (project / "crlf.txt").write_bytes(b"b\n")
    assert "diff --git a/crlf.txt b/crlf.txt" in m.diff(1)     # not noprefix: not read
    m.restore(1)
    assert (project / "crlf.txt").read_bytes() == b"a\r\n"
    assert not marker.exists() and not (project / ".git").exists()
    assert folder_bytes(other / ".git") == other_git
    assert not (tmp_path / "their-index").exists()


def hanging_git(tmp_path) -> str:
    """A "git" that never answers (as one stuck on a slow disk would)."""
    program = tmp_path / "hanging-git"
    program.write_text("#!/bin/sh\nexec sleep 30\n")
    program.chmod(0o755)
    return str(program)


def test_a_git_that_times_out_leaves_no_lock_behind(stage, project, state, tmp_path,
                                                    monkeypatch):
    m = manager(stage, project, state)
    m.snapshot("before")
    (m.store / "index.lock").write_text("")            # what a git killed halfway leaves
    m.git_program, real = hanging_git(tmp_path), m.git_program
    monkeypatch.setattr(stage, "GIT_TIMEOUT", 0.5)
    with pytest.raises(stage.CheckpointError, match="took longer than 0.5 s"):
        m.snapshot("after")
    m.git_program = real
    (project / "README.md").write_text("changed\n")
    assert m.snapshot("after") is not None


def test_ctrl_c_during_git_leaves_no_lock_behind(stage, project, state, tmp_path, ctrl_c_raises):
    m = manager(stage, project, state)
    m.snapshot("before")
    (m.store / "index.lock").write_text("")
    m.git_program, real = hanging_git(tmp_path), m.git_program
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        with pytest.raises(KeyboardInterrupt):
            m.snapshot("after")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    m.git_program = real
    assert not (m.store / "index.lock").exists()
    (project / "README.md").write_text("changed\n")
    assert m.snapshot("after") is not None


def test_hooks_in_the_store_never_run(stage, project, state, tmp_path):
    m = manager(stage, project, state)
    m.snapshot("before")
    marker = tmp_path / "hook-ran"
    for hook in ("pre-commit", "post-commit", "reference-transaction", "post-checkout",
                 "post-index-change"):
        (m.store / "hooks" / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (m.store / "hooks" / hook).chmod(0o755)
    (project / "README.md").write_text("changed\n")
    m.snapshot("after")
    m.restore(2)
    assert not marker.exists()


# ── Pruning ────────────────────────────────────────────────────────────────


def test_the_oldest_checkpoints_are_pruned(stage, project, state):
    m = manager(stage, project, state, max_snapshots=3)
    ids = []
    for number in range(5):
        (project / "README.md").write_text(f"version {number}\n")
        ids.append(m.snapshot(f"version {number}"))
    assert [c.reason for c in m.list()] == ["version 4", "version 3", "version 2"]
    for pruned in ids[:2]:                              # the commits are gone too
        with pytest.raises(stage.CheckpointError):
            m.git("cat-file", "-e", pruned)
    (project / "README.md").write_text("after\n")
    m.restore(3)                                        # the oldest, at the limit
    assert (project / "README.md").read_text() == "version 2\n"
    assert len(m.list()) == 3 and m.list()[0].reason.startswith("before rollback to")


# ── Automatic checkpoints in the agent loop ────────────────────────────────


def agent(stage, server):
    session = stage.Session(CLIENT.with_options(base_url=server.url, timeout=30), "m",
                            server.url, 30, None, None)
    session.recovery = stage.RetryPolicy(max_retries=0)
    return session


def turn(stage, session, text="go", permissions=None):
    token = stage.APPROVAL_CONTEXT.set(stage.ApprovalContext(
        permissions or stage.Permissions(), session, None))
    try:
        assert stage.run_turn(session, text)
    finally:
        stage.APPROVAL_CONTEXT.reset(token)


def test_one_checkpoint_per_user_turn_before_its_first_change(stage, project, state):
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    script = [
        reply("", call("read_file", {"path": "README.md"}),            # turn 1: reads only
              call("terminal", {"command": "ls 2>/dev/null; git status; cat README.md"})),
        reply("looked"),
        reply("", call("write_file", {"path": "a.txt", "content": "one"}),   # turn 2
              call("patch", {"path": "a.txt", "old_string": "one", "new_string": "two"})),
        reply("", call("terminal", {"command": "echo three > a.txt"})),
        reply("wrote"),
        reply("", call("terminal", {"command": "'m'v a.txt b.txt"})),  # turn 3
        reply("removed"),
    ]
    with FakeOpenAI(script) as server:
        session = agent(stage, server)
        turn(stage, session)
        # The hardened edition reads the command: it changes nothing, so no checkpoint.
        # The teaching edition takes one before any command that runs.
        first = [] if hardened(stage) else [
            "before terminal: ls 2>/dev/null; git status; cat README.md"]
        assert [c.reason for c in m.list()] == first
        turn(stage, session)
        turn(stage, session)
    # turn 2 (teaching): nothing changed since the checkpoint of turn 1, so none is taken
    second = ["before write_file a.txt"] if hardened(stage) else first
    assert [c.reason for c in m.list()] == ["before terminal: 'm'v a.txt b.txt", *second]
    assert "a.txt" not in checkpoint_files(stage, m, 2)     # taken before the write
    assert (project / "a.txt").exists() is False
    m.restore(1)
    assert (project / "a.txt").read_text() == "three\n"


def test_parallel_sub_agents_share_the_turns_one_checkpoint(stage, project, state):
    """Two children write at once, in threads: one checkpoint, taken before either write
    (the other waits for it), and both files are written."""
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    parent = [reply("", call("delegate_task", {"tasks": [{"goal": "a"}, {"goal": "b"}]})),
              reply("both done")]

    def respond(request):
        messages = request["messages"]
        if str(messages[0].get("content")).startswith(stage.CHILD_SYSTEM_PROMPT):
            goal = messages[1]["content"]
            if any(m["role"] == "tool" for m in messages):
                return reply(f"wrote {goal}")
            return reply("", call("write_file", {"path": f"{goal}.txt", "content": goal}))
        return parent[sum(m["role"] == "assistant" for m in messages)]

    with FakeOpenAI(responder=respond) as server:
        session = agent(stage, server)
        session.delegation = stage.DelegationSettings()
        turn(stage, session)
    assert (project / "a.txt").read_text() == "a" and (project / "b.txt").read_text() == "b"
    checkpoints = m.list()
    assert len(checkpoints) == 1 and checkpoints[0].reason in ("before write_file a.txt",
                                                               "before write_file b.txt")
    assert not {"a.txt", "b.txt"} & set(checkpoint_files(stage, m))


@pytest.mark.parametrize("stage_name", [s for s in STAGES if edition_of(s) == "teaching"])
@pytest.mark.parametrize("command", ["ls", "git status", "python3 build.py", "touch new.txt"])
def test_the_teaching_edition_checkpoints_before_any_command_that_runs(stage_name, project,
                                                                        state, command):
    """It does not read the command (command_may_change_files() is the hardened edition's):
    each command the gate lets run may change files, so the turn's checkpoint comes first."""
    stage = load_stage(stage_name)
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    try:
        m.turn_taken = False                            # a new turn, as run_turn() starts it
        json.loads(stage.terminal_tool(command))
        assert [c.reason for c in m.list()] == [f"before terminal: {command}"]
        (project / "README.md").write_text("changed\n")
        json.loads(stage.terminal_tool(command))        # the same turn: no second one
        assert len(m.list()) == 1
    finally:
        stage.use_checkpoints(None)


@pytest.mark.hardening
@pytest.mark.parametrize("command", [
    "rm -f x", "rm -rf build", "mv a b", "cp a b", "sed -i s/a/b/ f", "sed --in-place s/a/b/ f",
    "truncate -s 0 f", "echo hi > f", "echo hi >> f", "cat a | tee b", "git reset --hard",
    "git checkout -- .", "git clean -fd", "git stash", "git -C sub restore .", "'r'm x",
    "env rm x", "sh -c 'rm x'", "python -c 'open(1)'", "x=1; echo $x >f",
    "dd if=/dev/zero of=f count=1", "touch f", "mkdir d",
    # what only the hardened edition's parser reads: a name built at run time, find's action
    *[pytest.param(command, marks=pytest.mark.hardening)
      for command in ("ls; $(echo rm) x", "find . -delete")],
])
def test_commands_that_may_change_files(stage, command):
    assert stage.command_may_change_files(command)


@pytest.mark.hardening
@pytest.mark.parametrize("command", [
    "ls", "ls -la 2>/dev/null", "cat README.md", "echo hi", "git status", "git log --oneline",
    "git diff", "grep -r x .", "sed -n 1p f", "pwd && whoami", "python --version",
    "ls 2>&1", "git -c x=y status",
    # the teaching edition's regexes read "rm -rf" in any text, as the article's did
    pytest.param("echo rm -rf x", marks=pytest.mark.hardening),
])
def test_commands_that_change_no_file(stage, command):
    assert not stage.command_may_change_files(command)


def test_an_approved_dangerous_command_gets_a_checkpoint_a_denied_one_none(stage, project,
                                                                        state):
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    (project / "scratch.tmp").write_text("keep me")
    script = [reply("", call("terminal", {"command": "rm -rf scratch.tmp"})),
              reply("denied"),
              reply("", call("terminal", {"command": "rm -rf scratch.tmp"})),
              reply("ran")]
    with FakeOpenAI(script) as server:
        session = agent(stage, server)
        turn(stage, session)                            # nobody to ask: denied, no checkpoint
        assert m.list() == [] and (project / "scratch.tmp").exists()
        turn(stage, session, permissions=stage.Permissions(yolo_source="--yolo"))
    assert not (project / "scratch.tmp").exists()
    assert [c.reason for c in m.list()] == ["before terminal: rm -rf scratch.tmp"]
    m.restore(1)
    assert (project / "scratch.tmp").read_text() == "keep me"


def test_a_write_outside_the_project_takes_no_checkpoint(stage, project, state, tmp_path):
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    script = [reply("", call("write_file", {"path": str(tmp_path / "elsewhere.txt"),
                                            "content": "x"}),
                    call("write_file", {"path": "inside.txt", "content": "y"})),
              reply("done")]
    with FakeOpenAI(script) as server:
        turn(stage, agent(stage, server))
    assert [c.reason for c in m.list()] == ["before write_file inside.txt"]


@pytest.mark.hardening
def test_write_file_and_patch_never_write_into_a_store(stage, project, state, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    m = manager(stage, project, state)
    m.snapshot("before")
    stage.use_checkpoints(m)
    (project / "store-link").symlink_to(m.store)
    stores = [m.store / "refs" / "checkpoints" / "0000000001", m.store / "info" / "exclude",
              state / "checkpoints", state / "checkpoints" / "not-yet" / "HEAD",
              state / "profiles" / "work" / "checkpoints" / "x" / "HEAD",
              project / "store-link" / "HEAD"]
    for target in stores:
        assert "is in the checkpoint stores" in (stage.write_refusal(target) or ""), target
    for target in (state / "memories" / "MEMORY.md", project / "checkpoints" / "mine.txt",
                   state / "profiles" / "work" / "notes.txt"):
        assert stage.write_refusal(target) is None, target
    before = folder_bytes(m.store)
    script = [reply("", call("write_file", {"path": str(stores[0]), "content": "0" * 40}),
                    call("patch", {"path": str(stores[1]), "old_string": "node_modules/",
                                   "new_string": "*"})),
              reply("done")]
    with FakeOpenAI(script) as server:
        turn(stage, agent(stage, server))
        results = [message["content"] for message in server.requests[-1]["messages"]
                   if message["role"] == "tool"]
    assert len(results) == 2 and all("write refused" in result for result in results)
    assert folder_bytes(m.store) == before


@pytest.mark.hardening
def test_a_profile_run_may_not_write_the_base_folders_store(stage, project, state):
    m = manager(stage, project, state)
    m.snapshot("before")
    ref = m.store / "refs" / "checkpoints" / "0000000001"
    run = run_main(stage, "--profile", "work", stdin=f"write {ref} {'0' * 40}\n",
                   env=clean_env(LEARN_HERMES_HOME=str(state), HOME=str(project.parent)))
    assert "write refused" in run.stdout and "is in the checkpoint stores" in run.stdout
    assert len(m.list()) == 1


def test_a_failing_checkpoint_warns_once_and_the_tools_still_run(stage, project, state,
                                                                 capsys):
    m = manager(stage, project, state, max_files=3)
    stage.use_checkpoints(m)
    script = [reply("", call("write_file", {"path": "a.txt", "content": "one"})),
              reply("wrote"),
              reply("", call("terminal", {"command": "echo two > b.txt"})),
              reply("ran")]
    with FakeOpenAI(script) as server:
        session = agent(stage, server)
        turn(stage, session)
        turn(stage, session)
    assert (project / "a.txt").read_text() == "one"
    assert (project / "b.txt").read_text() == "two\n"
    warnings = capsys.readouterr().err
    assert warnings.count("warning: no checkpoint was taken") == 1, warnings
    assert "checkpoints.max_files" in warnings
    assert m.list() == []


def test_a_broken_store_is_a_warning_too(stage, project, state, capsys):
    m = manager(stage, project, state)
    m.store.parent.mkdir(parents=True)
    m.store.write_text("not a folder")                  # mkdir and git both fail on it
    stage.use_checkpoints(m)
    assert json.loads(stage.write_file("a.txt", "one"))["bytes_written"] == 3
    assert "warning: no checkpoint was taken" in capsys.readouterr().err


# ── The command line and the REPL ──────────────────────────────────────────


def agent_env(state, **extra):
    return clean_env(LEARN_HERMES_HOME=str(state), **extra)


def test_rollback_works_from_a_piped_repl_with_the_offline_model(stage, project, state):
    # a.txt: none, "one" (checkpoint before: none), "two\n" (before: "one"); /rollback 1:
    # "one"; /rollback 1 again: "two\n"; the oldest checkpoint, now 4, has no a.txt.
    lines = ["write a.txt one", "$ echo two > a.txt", "/rollback", "/rollback diff 1",
             "/rollback 1", "/rollback 1", "/rollback 4"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=project)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[checkpoint " in repl_output(out, "s12> ", lines[0])
    listing = repl_output(out, "s12> ", "/rollback")
    assert "before terminal: echo two > a.txt" in listing and "before write_file a.txt" in listing
    diff = repl_output(out, "s12> ", "/rollback diff 1")
    assert "-one" in diff and "+two" in diff
    first, second = out.split("s12> /rollback 1\n")[1:3]
    assert "restored the project to checkpoint " in first and "/rollback 1 undoes it" in first
    assert "(before rollback to " in second
    assert "restored the project to checkpoint " in repl_output(out, "s12> ", "/rollback 4")
    assert not (project / "a.txt").exists()
    assert "Traceback" not in out + result.stderr


@pytest.mark.hardening
def test_one_path_and_the_checkpoints_verb_in_a_piped_repl(stage, project, state):
    lines = ["write a.txt one", "$ echo two > a.txt", "/rollback 1", "/rollback 1",
             "/rollback 4 a.txt", "checkpoints"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=project)
    out = result.stdout
    assert "restored 'a.txt' to checkpoint " in repl_output(out, "s12> ", "/rollback 4 a.txt")
    assert not (project / "a.txt").exists()
    assert "5 checkpoint(s) of " in repl_output(out, "s12> ", "checkpoints")


@pytest.mark.parametrize("stage_name", [s for s in STAGES if edition_of(s) == "teaching"])
def test_the_teaching_edition_refuses_an_id_or_a_path_and_changes_nothing(stage_name,
                                                                         project, state):
    stage = load_stage(stage_name)
    m = manager(stage, project, state)
    first = m.snapshot("before")
    (project / "README.md").write_text("changed\n")
    lines = [f"/rollback {first[:7]}", "/rollback 1 README.md", "/rollback diff 1 README.md"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=project)
    for line in lines:
        assert "is not a checkpoint: give its number" in repl_output(result.stdout, "s12> ", line)
    assert (project / "README.md").read_text() == "changed\n" and len(m.list()) == 1


def test_rollback_undoes_and_redoes(stage, project, state):
    lines = ["write a.txt one", "$ echo two > a.txt", "/rollback 1"]
    run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=project)
    assert (project / "a.txt").read_text() == "one"
    run_main(stage, "-p", "/rollback 1", env=agent_env(state), cwd=project)
    assert (project / "a.txt").read_text() == "two\n"


def test_rollback_tells_what_is_wrong(stage, project, state):
    lines = ["/rollback", "/rollback 1", "write a.txt one", "/rollback 9", "/rollback --help",
             "/rollback 1 ../..", "/rollback diff -x"]
    result = run_main(stage, stdin="\n".join(lines) + "\n", env=agent_env(state), cwd=project)
    assert result.returncode == 0
    out = result.stdout
    assert "no checkpoints of " in repl_output(out, "s12> ", "/rollback")
    assert "yet: the first change of a turn takes one" in repl_output(out, "s12> ", "/rollback")
    assert "error: no checkpoint 1: there are 0" in repl_output(out, "s12> ", "/rollback 1")
    assert "error: no checkpoint 9: there is 1" in repl_output(out, "s12> ", "/rollback 9")
    assert "'--help' is not a checkpoint" in repl_output(out, "s12> ", "/rollback --help")
    assert ("is not inside the project" if hardened(stage) else "'1 ../..' is not a checkpoint"
            ) in repl_output(out, "s12> ", "/rollback 1 ../..")
    assert "'-x' is not a checkpoint" in repl_output(out, "s12> ", "/rollback diff -x")
    assert (project / "a.txt").read_text() == "one"


def test_a_long_diff_is_cut_and_hidden_characters_are_shown(stage, project, state):
    """The hardened edition names the checkpoint above the diff, and says when there is
    none; the teaching edition shows git's diff alone."""
    m = manager(stage, project, state)
    m.snapshot("before")
    result = run_main(stage, "-p", "/rollback diff 1", env=agent_env(state), cwd=project)
    header = 1 if hardened(stage) else 0
    assert result.stdout.splitlines()[1:] == (
        ["  none: the project is as it was then"] if hardened(stage) else [])
    (project / "long.txt").write_text("".join(f"line {n}\n" for n in range(500)))
    (project / "README.md").write_text("\x1b[2J\x1b]0;pwned\x07 cleared\n")
    result = run_main(stage, "-p", "/rollback diff 1", env=agent_env(state), cwd=project)
    shown, whole = result.stdout.splitlines(), m.diff(1).splitlines()
    if hardened(stage):
        assert shown[0].startswith("changes from checkpoint 1 (") and shown[0].endswith(
            ", before) to now:")
    assert shown[header:header + 200] == [stage.visible(line.expandtabs()) for line in whole[:200]]
    assert len(shown) == header + 200 + 1 and shown[-1] == f"… {len(whole) - 200} more lines"
    assert "\x1b" not in result.stdout and "+\\x1b[2J" in result.stdout


def test_no_checkpoints_flag_and_setting(stage, project, state):
    for argv, config in ((["--no-checkpoints"], None), ([], "checkpoints:\n  enabled: false\n")):
        state.mkdir(exist_ok=True)
        if config:
            (state / "config.yaml").write_text(config)
        result = run_main(stage, *argv, stdin="write a.txt one\n/rollback\n",
                          env=agent_env(state), cwd=project)
        assert (project / "a.txt").read_text() == "one"
        assert "checkpoints are off in this run" in result.stdout
        assert not (state / "checkpoints").exists()
    result = run_main(stage, "--checkpoints", "-p", "write b.txt two", env=agent_env(state),
                      cwd=project)                       # the flag beats config.yaml
    assert "[checkpoint " in result.stdout and (state / "checkpoints").is_dir()


def test_show_config_names_the_flag_that_switched_checkpoints_off(stage, project, state):
    result = run_main(stage, "--no-checkpoints", "--show-config", env=agent_env(state))
    row = next(line for line in result.stdout.splitlines() if "checkpoints.enabled" in line)
    assert "false" in row and "--no-checkpoints" in row
    result = run_main(stage, "--checkpoints", "--show-config", env=agent_env(state))
    row = next(line for line in result.stdout.splitlines() if "checkpoints.enabled" in line)
    assert "true" in row and "--checkpoints" in row and "--no-" not in row


def test_the_limits_come_from_the_configuration_chain(stage, project, state):
    state.mkdir()
    (state / "config.yaml").write_text("checkpoints:\n  max_snapshots: 2\n  max_files: 7\n"
                                       "  max_file_size_mb: 3\n")
    config = stage.load_config(stage.parse_args([]), agent_env(state))
    m = stage.checkpoints_from_config(config)
    assert (m.max_snapshots, m.max_files, m.max_file_bytes) == (2, 7, 3 * 1024 * 1024)
    assert m.project == project.resolve()
    (state / "config.yaml").write_text("checkpoints:\n  max_snapshots: 0\n")
    result = run_main(stage, "-p", "hi", env=agent_env(state), cwd=project)
    assert result.returncode == 2
    assert "checkpoints.max_snapshots: must be from 1 to 500, got 0" in result.stderr


def test_without_git_checkpoints_are_off_with_one_warning(stage, project, state, tmp_path):
    no_git = tmp_path / "bin-without-git"
    no_git.mkdir()
    lines = ["write a.txt one", "$ echo two > b.txt", "/rollback", "checkpoints"]
    result = run_main(stage, stdin="\n".join(lines) + "\n",
                      env=agent_env(state, PATH=str(no_git)), cwd=project)
    assert result.returncode == 0
    assert result.stderr.count("warning: checkpoints are off: git is not installed") == 1
    assert (project / "a.txt").read_text() == "one"
    assert (project / "b.txt").read_text() == "two\n"
    assert "checkpoints are off in this run" in repl_output(result.stdout, "s12> ", "/rollback")
    assert "Traceback" not in result.stdout + result.stderr
    m = manager(stage, project, state)
    m.git_program = None
    with pytest.raises(stage.CheckpointError, match="git is not installed"):
        m.snapshot("x")


def test_the_demo_shows_a_snapshot_a_diff_a_rollback_and_its_undo(stage, tmp_path):
    result = run_main(stage, "--demo", cwd=tmp_path,
                      env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("  [checkpoint ") == 2
    assert "+oops" in out and "-So the agent may act." in out
    if hardened(stage):
        after = [line for line in out.splitlines() if line.startswith("  the folder: ")]
        assert after == [
            "  the folder: notes.txt has 0 line(s); present: app.old, scratch.txt; .env "
            "unchanged: True",
            "  the folder: notes.txt has 2 line(s); present: app.py; .env unchanged: True",
            "  the folder: notes.txt has 0 line(s); present: app.old, scratch.txt; .env "
            "unchanged: True"]
        assert "4 checkpoint(s) of " in out and "Only you can roll back" in out
        assert "2. A destructive command (nothing in it needs approval)" in out
    else:                       # the teaching demo reads notes.txt after each rollback
        read = [line.rpartition("/")[2] for line in out.splitlines() if " line(s); " in line]
        assert read == ["notes.txt has 2 line(s); line 1 reads: Every change can be taken back.",
                        "notes.txt has 0 line(s); line 1 reads: "]
        assert "(before rollback to " in out
    assert os.listdir(tmp_path) == []                   # all of it in its own temporary folder


@pytest.mark.hardening
def test_the_checkpoints_verb_names_the_newest_five(stage, project, state):
    m = manager(stage, project, state)
    stage.use_checkpoints(m)
    for number in range(6):
        (project / "README.md").write_text(f"{number}\n")
        m.snapshot(f"version {number}")
    words = stage.describe_checkpoints()
    assert words.startswith(f"6 checkpoint(s) of {project.resolve()}, newest first:")
    assert "5. " in words and "6. " not in words and "version 5" in words
    stage.use_checkpoints(None)
    assert stage.describe_checkpoints().startswith("No checkpoints: checkpoints are off")


def test_the_demo_gives_back_the_runs_own_checkpoints(stage, project, state, monkeypatch):
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    ours = stage.CheckpointManager(project, state)
    stage.use_checkpoints(ours)
    server = stage.start_offline_server()
    try:
        session = stage.Session(stage.make_client(server.url, "offline"), "offline",
                                server.url, 30, None, None)
        assert stage.run_demo(session) == 0
    finally:
        server.shutdown()
    assert stage.CHECKPOINTS is ours and ours.list() == []
    assert Path.cwd() == project


@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_a_real_piped_repl_rolls_back(stage_name, project, state):
    (project / "a.txt").write_text("original\n")
    result = run_stage(stage_name, stdin="$ echo replaced > a.txt\n/rollback 1\n",
                       env=agent_env(state), cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / "a.txt").read_text() == "original\n"
    assert "restored the project to checkpoint " in result.stdout


@pytest.mark.hardening
def test_a_git_file_is_a_repository_only_when_it_points_at_one(stage, tmp_path):
    """As git decides it (issue 22, defect 5): .git as a folder with a HEAD, or as a file
    "gitdir: <path>" whose path holds a HEAD; anything else hides nothing."""
    folder = tmp_path / "sub"
    (folder / "real" / ".git").mkdir(parents=True)
    (folder / "real" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "HEAD").write_text("a file of the project named HEAD\n")
    (folder / ".git").write_text("not a pointer\n")
    assert not stage.is_repository(str(folder))
    (folder / ".git").write_text("gitdir: real/.git\n")
    assert stage.is_repository(str(folder))
    (folder / ".git").write_text("gitdir: missing/.git\n")
    assert not stage.is_repository(str(folder))
    assert stage.is_repository(str(folder / "real"))
    (folder / "real" / ".git" / "HEAD").unlink()
    assert not stage.is_repository(str(folder / "real"))


CHECKPOINT_RANGES = {"checkpoints.max_snapshots": (1, 500),
                     "checkpoints.max_files": (1, 10_000_000),
                     "checkpoints.max_file_size_mb": (1, 100_000)}


@pytest.mark.parametrize("key", CHECKPOINT_RANGES)
def test_each_checkpoint_limit_holds_at_both_ends(stage, key):
    """A config value at either end is taken as written; one past it is an error."""
    low, high = CHECKPOINT_RANGES[key]
    setting = stage.SETTINGS_BY_KEY[key]
    assert [stage.convert(setting, str(value)) for value in (low, high)] == [low, high]
    for outside in (low - 1, high + 1):
        with pytest.raises(stage.ConfigError, match=f"must be from {low:,} to {high:,}"):
            stage.convert(setting, str(outside))
