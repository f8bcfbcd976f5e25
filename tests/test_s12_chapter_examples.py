"""s12: what the chapter shows about checkpoints is what the code does.

docs/en/s12-checkpoints.md has

- in "How it works", the table of GIT_SETTINGS (every setting given to git is named, and
  nothing else), the table of the checkpoints.* settings (key, default, description from
  SETTINGS), the user's own .git staying byte-identical, and --show-config naming
  --no-checkpoints;
- in "Under attack", the table of bad /rollback input and what each edition prints (each
  is typed into a REPL, and neither the project nor the checkpoints change), `git checkout .`
  undone by /rollback 1, the user's git setup (GIT_DIR, GIT_INDEX_FILE, a global config
  with signing, hooks and excludes, a .gitattributes with eol=crlf) reaching no checkpoint,
  names that look like options or pathspec magic, the store refused to write_file and to
  patch, a terminal command on the store in each edition (the teaching edition asks about
  `rm -rf` and runs a one-file `rm`, with a stub rm first on PATH; the hardened edition's
  self-protection refuses both), which commands get a checkpoint (the teaching edition:
  every one that runs; the hardened edition: what command_may_change_files() says; its
  table, each column against its edition), a file the checkpoint does not have being
  removed by the hardened edition's one-path restore, a file ignored then and not now kept
  by a rollback, and the limits in "What the guards cannot see" (commands that change files
  unseen: the test fails once a stage closes the gap, and says to update the chapter);
- in "Compared with Hermes", that `git checkout <id> -- .` leaves files created since,
  and the restore of this stage does not;
- in "Try it", the piped REPL in a git repository;
- in "Exercises", exercise 1's /rollback list, exercise 2's patch (it applies to the stage
  file, and the patched stage takes no checkpoint before `ls`, and none before
  `git checkout .` either), and exercise 3's table of changes that a rollback does not undo.

The tables are read from the chapter, so the chapter cannot show what the code does not do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import (ROOT, diff_blocks, edition_of, fenced_blocks, fresh_stage, marks,
                     patched_source, patched_stage, repl_output, run_main, stages_from,
                     stub_programs)

STAGE = "s12_checkpoints"
CHAPTER = ROOT / "docs" / "en" / "s12-checkpoints.md"
STAGES = stages_from("s12")
CODE = re.compile(r"`([^`]+)`")
PROMPT = "s12> "
USER_GIT = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def chapter() -> str:
    return CHAPTER.read_text(encoding="utf-8") if CHAPTER.exists() else ""


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def table(header_start: str) -> list[list[str]]:
    """The body rows of the chapter's table whose first header cell starts so ([] if
    there is none: the tests that read it then fail, and collection does not)."""
    found, current = [], []
    for line in chapter().splitlines() + [""]:
        if line.strip().startswith("|"):
            current.append(line.strip())
        elif current:
            found.append(current)
            current = []
    for lines in found:
        if cells(lines[0])[0].startswith(header_start):
            return [cells(line) for line in lines[2:]]
    return []


def part_of(heading: str) -> str:
    text = chapter()
    start = text.index(heading)
    end = text.find("\n### ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def git(folder: Path, *args: str) -> str:
    """git as the user runs it in their own repository (no config of this machine's)."""
    done = subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@x", *args],
                          cwd=folder, capture_output=True, text=True, check=True,
                          env={**os.environ, **USER_GIT})
    return done.stdout


def folder_bytes(folder: Path) -> dict:
    return {path.relative_to(folder).as_posix(): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def tree(folder: Path) -> dict:
    """Every file below `folder` (not its .git) and its bytes."""
    return {path: data for path, data in folder_bytes(folder).items()
            if not path.startswith(".git/")}


def a_project(tmp_path: Path, files: dict | None = None, repository: bool = False) -> Path:
    """tmp_path/app: a project (pyproject.toml), with `files`; HOME is tmp_path."""
    app = tmp_path / "app"
    app.mkdir()
    for name, text in {"pyproject.toml": "[project]\n", **(files or {})}.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text, encoding="utf-8")
    if repository:
        git(app, "init", "-q")
        git(app, "add", ".")
        git(app, "commit", "-q", "-m", "the user's commit")
    return app


def agent_env(tmp_path: Path, **extra: str) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
            "LEARN_HERMES_HOME": str(tmp_path / "state"), "NO_COLOR": "1", "COLUMNS": "300",
            **extra}


def repl(stage, tmp_path: Path, project: Path, lines: list[str], *argv: str, **env):
    run = run_main(stage, *argv, stdin="".join(line + "\n" for line in lines),
                   env=agent_env(tmp_path, **env), cwd=project)
    assert run.returncode == 0, run.stderr
    return run


def checkpoints_of(stage: str, project: Path, home: Path) -> list:
    return fresh_stage(stage).CheckpointManager(project, home).list()


# ── How it works ───────────────────────────────────────────────────────────

def test_the_git_settings_table_names_every_setting_given_to_git():
    s12 = fresh_stage(STAGE)
    names = [name for row in table("setting") for name in CODE.findall(row[0])
             if not name.startswith("/")]
    assert {name.partition("=")[0] for name in names} == \
        {setting.partition("=")[0] for setting in s12.GIT_SETTINGS}
    for name in names:
        if "=" in name:                                 # a value shown is the value given
            assert name in s12.GIT_SETTINGS, name
    assert f"core.hooksPath={os.devnull}" in s12.GIT_SETTINGS
    assert f"core.excludesFile={os.devnull}" in s12.GIT_SETTINGS


TEACHING_STAGES = [stage for stage in STAGES if edition_of(stage) == "teaching"]


def commands_table() -> list[list[str]]:
    rows = table("The command")
    assert len(rows) >= 8, ("a table 'The command | teaching edition | hardened edition | "
                            "why the hardened edition decides so'")
    return rows


def test_the_settings_table_is_the_checkpoints_rows_of_SETTINGS():
    s12 = fresh_stage(STAGE)
    rows = {row[0]: row for row in table("key")}
    wanted = [s for s in s12.SETTINGS if s.key.startswith("checkpoints.")]
    assert sorted(rows) == sorted(s.key for s in wanted)
    for setting in wanted:
        default = "true" if setting.default is True else str(setting.default)
        assert rows[setting.key][1] == f"`{default}`", setting.key
        if setting.kind != "bool":
            assert rows[setting.key][2] == setting.help, setting.key
    assert s12.SETTINGS_BY_KEY["checkpoints.enabled"].flag == "--checkpoints"
    assert (s12.MAX_SNAPSHOTS, s12.MAX_FILES, s12.MAX_FILE_SIZE_MB) == (20, 50_000, 10)
    text = " ".join(chapter().split())
    assert "`checkpoints.max_snapshots` (20)" in text
    assert "`checkpoints.max_file_size_mb` (10 MB)" in text


@pytest.mark.parametrize("stage", STAGES)
def test_show_config_names_the_no_checkpoints_flag(stage, tmp_path):
    project = a_project(tmp_path)
    run = run_main(stage, "--no-checkpoints", "--show-config", env=agent_env(tmp_path),
                   cwd=project)
    row = next(line for line in run.stdout.splitlines() if "checkpoints.enabled" in line)
    assert cells(row.replace("│", "|"))[:3] == ["checkpoints.enabled", "false",
                                                "--no-checkpoints"]
    assert "`--show-config` shows `checkpoints.enabled` as `false`, from `--no-checkpoints`" \
        in " ".join(chapter().split())


@pytest.mark.parametrize("stage", STAGES)
def test_the_users_git_is_byte_identical_and_its_status_the_same(stage, tmp_path):
    project = a_project(tmp_path, {"a.txt": "one\n"}, repository=True)
    (project / "staged.txt").write_text("staged\n")
    git(project, "add", "staged.txt")
    before, status = folder_bytes(project / ".git"), git(project, "status", "--porcelain")
    repl(stage, tmp_path, project, ["write a.txt two", "$ echo three > b.txt", "/rollback 2",
                                    "/rollback 1", "/rollback diff 1", "/rollback 1"])
    assert folder_bytes(project / ".git") == before     # index, refs, config: every byte
    assert git(project, "status", "--porcelain") == status      # back where it started
    assert "never read or written" in chapter()


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_a_one_path_restore_removes_a_file_the_checkpoint_does_not_have(stage, tmp_path):
    project = a_project(tmp_path)
    run = repl(stage, tmp_path, project, ["write todo.txt buy milk", "/rollback 1 todo.txt"])
    assert "restored 'todo.txt'" in run.stdout
    assert not (project / "todo.txt").exists()
    assert "that exists now is removed, as a file created since" in " ".join(chapter().split())


# ── Under attack ───────────────────────────────────────────────────────────

def bad_inputs(edition: str) -> list[tuple[str, list[str]]]:
    column = 1 if edition == "teaching" else 2
    return [(CODE.findall(row[0])[0], CODE.findall(row[column])) for row in table("The input")]


def test_the_chapter_has_the_table_of_bad_input():
    assert len(bad_inputs("teaching")) >= 8, \
        "a table 'The input | teaching edition | hardened edition'"


@pytest.mark.parametrize("stage", STAGES)
def test_bad_rollback_input_prints_the_line_the_chapter_shows_and_changes_nothing(stage,
                                                                                  tmp_path):
    project = a_project(tmp_path, {"notes.txt": "one\n"}, repository=True)
    (project / "outside").symlink_to("/etc")
    repl(stage, tmp_path, project, ["write a.txt one", "$ echo two > b.txt"])
    home = tmp_path / "state"
    checkpoints, files = checkpoints_of(stage, project, home), tree(project)
    assert len(checkpoints) == 2                        # "a project with two checkpoints"
    own_commit = git(project, "rev-parse", "--short=7", "HEAD").strip()
    shown_commit = re.search(r"/rollback ([0-9a-f]{7})`, the id of the user", chapter()).group(1)
    inputs = [(given.replace(shown_commit, own_commit),
               [text.replace(shown_commit, own_commit) for text in printed])
              for given, printed in bad_inputs(edition_of(stage))]
    run = repl(stage, tmp_path, project, [given for given, _ in inputs])
    for given, printed in inputs:
        said = repl_output(run.stdout, PROMPT, given)
        assert said.startswith("error: ") and "\n" not in said, (given, said)
        for text in printed:
            assert text in said, (given, text, said)
    assert checkpoints_of(stage, project, home) == checkpoints
    assert tree(project) == files


@pytest.mark.parametrize("stage", STAGES)
def test_git_checkout_dot_is_undone_by_rollback_1(stage, tmp_path):
    project = a_project(tmp_path, {"work.py": "print('committed')\n"}, repository=True)
    (project / "work.py").write_text("print('an hour of work')\n")
    run = repl(stage, tmp_path, project, ["$ git checkout .", "/rollback 1"])
    assert "[checkpoint " in repl_output(run.stdout, PROMPT, "$ git checkout .")
    assert (project / "work.py").read_text() == "print('an hour of work')\n"
    assert git(project, "status", "--porcelain") == " M work.py\n"


@pytest.mark.parametrize("stage", STAGES)
def test_the_users_git_setup_reaches_no_checkpoint(stage, tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\ntouch \"$HOME/hook-ran\"\nexit 1\n")
    (hooks / "pre-commit").chmod(0o755)
    (tmp_path / "global-excludes").write_text("*.txt\n")
    (tmp_path / ".gitconfig").write_text(
        f"[commit]\n\tgpgsign = true\n[core]\n\thooksPath = {hooks}\n"
        f"\texcludesFile = {tmp_path / 'global-excludes'}\n\tautocrlf = true\n"
        f"[diff]\n\tnoprefix = true\n")                 # only GIT_CONFIG_GLOBAL stops this one
    project = a_project(tmp_path, {".gitattributes": "* text eol=crlf\n"})
    (project / "a.txt").write_bytes(b"one\ntwo\n")
    env = {"GIT_DIR": str(tmp_path / "elsewhere"), "GIT_INDEX_FILE": str(tmp_path / "index")}
    repl(stage, tmp_path, project, ["write b.txt x"], **env)
    (project / "a.txt").write_bytes(b"changed\r\n")
    run = repl(stage, tmp_path, project, ["/rollback diff 1", "/rollback 1"], **env)
    assert "--- a/a.txt" in repl_output(run.stdout, PROMPT, "/rollback diff 1")
    assert (project / "a.txt").read_bytes() == b"one\ntwo\n"
    assert not (project / "b.txt").exists()
    assert not (tmp_path / "hook-ran").exists()
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "index").exists()


@pytest.mark.parametrize("stage", STAGES)
def test_names_that_look_like_options_or_patterns_are_only_files(stage, tmp_path):
    project = a_project(tmp_path, {"--force": "f\n", ":(glob)*": "g\n", "other.txt": "o\n"})
    (project / "big:(glob)*").write_bytes(b"\0" * (10 * 1024 * 1024 + 1))     # left out
    repl(stage, tmp_path, project, ["write new.txt x"])
    for name in ("--force", ":(glob)*", "other.txt"):
        (project / name).write_text("changed\n")
    if edition_of(stage) == "teaching":                 # the whole project: each name is a file
        run = repl(stage, tmp_path, project, ["/rollback 1"])
        assert "restored the project" in run.stdout
        assert [(project / name).read_text() for name in ("--force", ":(glob)*", "other.txt")] \
            == ["f\n", "g\n", "o\n"]
        assert not (project / "new.txt").exists()
        assert (project / "big:(glob)*").stat().st_size == 10 * 1024 * 1024 + 1
        return
    run = repl(stage, tmp_path, project, ["/rollback 1 :(glob)*"])
    assert "restored ':(glob)*'" in run.stdout
    assert (project / ":(glob)*").read_text() == "g\n"
    assert (project / "--force").read_text() == "changed\n"     # only the one path
    assert (project / "other.txt").read_text() == "changed\n"


@pytest.mark.parametrize("stage", STAGES)
def test_a_terminal_command_on_the_store_in_each_edition(stage, tmp_path):
    """The teaching edition's patterns ask about `rm -rf` of the store and let `rm` of one
    file in it run (here a stub rm, first on PATH); the hardened edition refuses both."""
    project = a_project(tmp_path)
    (tmp_path / "stubs").mkdir()
    stub_programs(tmp_path, ["rm"])
    env = agent_env(tmp_path, PATH=f"{tmp_path / 'stubs'}{os.pathsep}{os.environ['PATH']}")
    del env["LEARN_HERMES_HOME"]                        # the default: ~/.learn-hermes
    everything = "$ rm -rf ~/.learn-hermes/checkpoints"
    one_file = "$ rm ~/.learn-hermes/checkpoints/*/refs/checkpoints/0000000001"
    text = " ".join(part_of("## Under attack").split())
    assert f"`{everything[2:]}` is a \"Recursive/force file deletion\" and asks" in text
    assert f"`{one_file[2:]}` is no finding and runs" in text
    run = run_main(stage, stdin=f"write a.txt one\n{everything}\n{one_file}\n", env=env,
                   cwd=project)
    home = tmp_path / ".learn-hermes"
    ref = next((home / "checkpoints").iterdir()) / "refs" / "checkpoints" / "0000000001"
    if edition_of(stage) == "teaching":
        said = repl_output(run.stdout, PROMPT, everything)
        assert "denied: " in said and "Recursive/force file deletion" in said, said
        assert "refused" not in repl_output(run.stdout, PROMPT, one_file)
        assert marks(project) == [f"rm {ref}"]          # the stub ran, in the real one's place
        assert len(checkpoints_of(stage, project, home)) == 2   # the rm's turn took one
    else:
        for command in (everything, one_file):
            assert "BLOCKED (self-protection)" in repl_output(run.stdout, PROMPT, command)
        assert marks(project) == []
        assert len(checkpoints_of(stage, project, home)) == 1
    assert ref.exists()


@pytest.mark.parametrize("stage", STAGES)
def test_the_commands_table_says_which_edition_takes_a_checkpoint(stage, tmp_path):
    """"What the hardened edition adds: which commands get a checkpoint": each column
    against its edition. The teaching edition does not read the command: every command
    that runs gets the turn's checkpoint (two of the table's, run here, show it)."""
    s12 = fresh_stage(stage)
    column = 1 if edition_of(stage) == "teaching" else 2
    for row in commands_table():
        command, answer = CODE.findall(row[0])[0], row[column]
        assert answer in ("no checkpoint", "a checkpoint first"), row
        if edition_of(stage) == "hardened":
            assert s12.command_may_change_files(command) == (answer == "a checkpoint first"), \
                command
        else:
            assert answer == "a checkpoint first", command
    if edition_of(stage) == "teaching":
        assert not hasattr(s12, "command_may_change_files")
        for number, command in enumerate(["ls -la 2>/dev/null", "git status"]):
            (tmp_path / str(number)).mkdir()
            project = a_project(tmp_path / str(number))
            run = repl(stage, tmp_path, project, [f"$ {command}", "/rollback"])
            assert f"before terminal: {command}" in repl_output(run.stdout, PROMPT, "/rollback")


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_the_hardened_edition_counts_a_command_too_complex_to_read_as_a_change(stage):
    s12 = fresh_stage(stage)
    assert "counts a command too complex to read as a change" in \
        " ".join(part_of("## Under attack").split())
    assert s12.commands_run("echo " + "x" * s12.MAX_COMMAND_CHARS) is None
    assert s12.command_may_change_files("echo " + "x" * s12.MAX_COMMAND_CHARS)
    assert s12.commands_run("sudo git checkout .") == ["git checkout ."]


# What the guards cannot see: each test passes while the gap is open. When a stage closes
# one, its test fails: update "What the guards cannot see" (and exercise 2) and the test.

UNSEEN = ["python build.py", "make", "npm install", "tar xf a.tar"]


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_commands_that_change_files_unseen_get_no_checkpoint(stage):
    s12 = fresh_stage(stage)
    text = part_of("## Under attack")
    for command in UNSEEN:
        assert f"`{command}`" in text, command
        assert not s12.command_may_change_files(command), (
            f"{command!r} now gets a checkpoint: update the chapter's 'What the guards "
            f"cannot see' and exercise 2")


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_write_file_and_patch_into_the_store_are_refused(stage, tmp_path):
    project = a_project(tmp_path)
    repl(stage, tmp_path, project, ["write a.txt one"])
    store = next((tmp_path / "state" / "checkpoints").iterdir())
    ref, exclude = store / "refs" / "checkpoints" / "0000000001", store / "info" / "exclude"
    before = folder_bytes(store)
    patch = json.dumps({"path": str(exclude), "old_string": "node_modules/", "new_string": "*"})
    lines = [f"write {ref} {'0' * 40}", f"call patch {patch}"]
    run = repl(stage, tmp_path, project, lines)
    for line in lines:
        said = repl_output(run.stdout, PROMPT, line)
        assert "write refused" in said and "is in the checkpoint stores" in said, (line, said)
    assert folder_bytes(store) == before
    # Checked after: the list stages the project to count what the newest would undo.
    listed = repl(stage, tmp_path, project, ["/rollback"])
    assert "1  " in repl_output(listed.stdout, PROMPT, "/rollback")
    assert "**The store itself.**" in chapter() and "`write_file` and `patch` refuse" in chapter()


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_a_file_ignored_then_and_not_now_is_kept_by_a_rollback(stage, tmp_path):
    project = a_project(tmp_path, {".gitignore": "*.db\n", "local.db": "precious\n"})
    run = repl(stage, tmp_path, project, ["write .gitignore # nothing ignored",
                                          "write created.txt since", "/rollback 2"])
    assert "restored the project" in run.stdout
    assert (project / ".gitignore").read_text() == "*.db\n"
    assert (project / "local.db").read_text() == "precious\n"
    assert not (project / "created.txt").exists()
    assert "**A file left out then and not now stays.**" in chapter()


# ── Compared with Hermes ───────────────────────────────────────────────────

@pytest.mark.parametrize("stage", STAGES)
def test_hermes_checkout_leaves_files_created_since_and_restore_does_not(stage, tmp_path):
    project = a_project(tmp_path, {"a.txt": "one\n"})
    s12 = fresh_stage(stage)
    m = s12.CheckpointManager(project, tmp_path / "state")
    first = m.snapshot("first")
    (project / "a.txt").write_text("two\n")
    (project / "created.txt").write_text("since\n")
    m.snapshot("second")
    m.git("checkout", first, "--", ".")                 # Hermes's full restore
    assert (project / "a.txt").read_text() == "one\n"
    assert (project / "created.txt").exists()
    (project / "a.txt").write_text("two\n")
    m.restore(2)                                        # this stage's: back to "first"
    assert (project / "a.txt").read_text() == "one\n"
    assert not (project / "created.txt").exists()
    assert "`git checkout <hash> -- .`: files created since stay" in chapter()


# ── Try it ─────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("stage", STAGES)
def test_try_it_a_rollback_in_a_git_repository(stage, tmp_path):
    block = fenced_blocks(part_of("## Try it"), "bash")[1]
    lines = ["write a.txt two", "$ echo three > b.txt", "/rollback", "/rollback 2", "$ ls"]
    assert "printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) in block
    assert "git init -q && printf 'one\\n' > a.txt" in block
    app = tmp_path / "app"
    app.mkdir()
    git(app, "init", "-q")
    (app / "a.txt").write_text("one\n")
    repl(stage, tmp_path, app, lines)
    assert (app / "a.txt").read_text() == "one\n" and not (app / "b.txt").exists()
    assert git(app, "status", "--short") == "?? a.txt\n"
    assert len(list((tmp_path / "state" / "checkpoints").iterdir())) == 1


# ── Exercises ──────────────────────────────────────────────────────────────

EXERCISE_1 = ["$ ls", "write a.txt one", "write a.txt one", "write a.txt one",
              "$ cat a.txt > b.txt", "$ sed -i s/one/two/ a.txt"]


@pytest.mark.parametrize("stage", TEACHING_STAGES)
def test_exercise_1_the_list_the_solution_shows(stage, tmp_path):
    part = part_of("### 1. Predict")
    command = fenced_blocks(part, "bash")[0]
    assert "printf '%s\\n' " + " ".join(f"'{line}'" for line in EXERCISE_1) + " /rollback" \
        in command
    assert "mkdir app && cd app && touch pyproject.toml" in command
    project = a_project(tmp_path)
    (project / "pyproject.toml").write_text("")
    run = repl(stage, tmp_path, project, EXERCISE_1 + ["/rollback"])
    shown = repl_output(run.stdout, PROMPT, "/rollback").splitlines()
    shown = [re.sub(r"  [0-9a-f]{7}  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ", "  …  ", line)
             for line in shown]
    assert fenced_blocks(part, "text")[0].splitlines() == shown


def test_the_solutions_diffs_apply_to_the_stage_file():
    blocks = diff_blocks(chapter())
    assert blocks, "no ```diff block in the chapter"
    for block in blocks:
        patched_source(STAGE, block)


def test_exercise_2_the_patched_stage_skips_ls_and_misses_git_checkout(tmp_path):
    part = part_of("### 2. Change")
    lines = ["$ ls", "$ echo one > a.txt"]
    check = fenced_blocks(part, "bash")[0]
    assert "printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + " /rollback" in check
    for name in ("s12", "patched"):
        (tmp_path / name).mkdir()
    patched = patched_stage(STAGE, diff_blocks(part)[0], tmp_path / "patched")
    for name, stage, listed in (("s12", fresh_stage(STAGE), "before terminal: ls"),
                                ("patched", patched, "before terminal: echo one > a.txt")):
        project = a_project(tmp_path / name)
        run = run_main(stage, stdin="".join(line + "\n" for line in lines + ["/rollback"]),
                       env=agent_env(tmp_path / name), cwd=project)
        shown = repl_output(run.stdout, PROMPT, "/rollback")
        assert len(shown.splitlines()) == 1 and shown.endswith(f"  {listed}"), (name, shown)
    # the solution's "break it": git checkout . is neither dangerous nor a write target
    assert not patched.detect_dangerous_command("git checkout .")
    assert not patched.write_targets("git checkout .")
    assert "`$ git checkout .`" in part and "gets no checkpoint now" in part


@pytest.mark.parametrize("stage", STAGES)
def test_exercise_3_the_changes_a_rollback_does_not_undo(stage, tmp_path):
    block = fenced_blocks(part_of("### 3. Break it"), "bash")[0]
    for piece in ("echo TOKEN=1 > .env", "head -c 11000000 /dev/zero > data.csv",
                  "echo v1 > v.txt", "echo kept > ../outside.txt", "echo one > a.txt",
                  "'$ echo two > a.txt'", "head -c 12000000 /dev/zero > data.csv"):
        assert piece in block, piece
    project = a_project(tmp_path, {".env": "TOKEN=1\n", "node_modules/m.js": "x\n",
                                   "vendor/lib/v.txt": "v1\n", "a.txt": "one\n"})
    subprocess.run(["git", "init", "-q"], cwd=project / "vendor" / "lib", check=True,
                   env={**os.environ, **USER_GIT})
    (project / "data.csv").write_bytes(b"\0" * 11_000_000)
    (tmp_path / "outside.txt").write_text("kept\n")
    run = repl(stage, tmp_path, project, ["$ echo two > a.txt"])
    note = "left out: 2 (nested repositories, files over checkpoints.max_file_size_mb)"
    assert note in run.stdout and note in " ".join(chapter().split())
    (project / ".env").write_text("TOKEN=2\n")
    (project / "node_modules" / "m.js").unlink()
    (project / "vendor" / "lib" / "v.txt").write_text("v2\n")
    (tmp_path / "outside.txt").write_text("lost\n")
    (project / "data.csv").write_bytes(b"\0" * 12_000_000)
    repl(stage, tmp_path, project, ["/rollback 1"])
    assert (project / "a.txt").read_text() == "one\n"
    survived = {".env": (project / ".env").read_text() == "TOKEN=2\n",
                "node_modules/m.js": not (project / "node_modules" / "m.js").exists(),
                "vendor/lib/v.txt": (project / "vendor" / "lib" / "v.txt").read_text() == "v2\n",
                "data.csv": (project / "data.csv").stat().st_size == 12_000_000,
                "../outside.txt": (tmp_path / "outside.txt").read_text() == "lost\n"}
    rows = [CODE.findall(row[0])[0] for row in table("Changed after the checkpoint")]
    assert sorted(rows) == sorted(survived), rows
    assert all(survived.values()), (f"a rollback now undoes {survived}: update exercise 3 "
                                    f"and 'What the guards cannot see'")


# ── The worked traces ──────────────────────────────────────────────────────

def test_traces_show_checkpoint_ids_in_the_order_they_were_taken():
    """A commit id depends on the time: tests/traces.py shows each as <id N>."""
    import traces
    spec = {"stage": STAGE, "input": ["write a.txt one", "write a.txt two", "/rollback"],
            "files": {"pyproject.toml": ""}}
    text = traces.trace(spec)
    assert "[checkpoint <id 1>: before write_file a.txt]" in text
    assert re.search(r"^ +1  <id 2>  <date> <time>  before write_file a.txt$", text,
                     re.MULTILINE), text
    assert not re.search(r"(?<![0-9a-f])[0-9a-f]{7}(?![0-9a-f])", text.split("\n", 1)[1]), text


@pytest.mark.parametrize("stage", STAGES)
def test_a_path_no_rule_can_read_removes_the_refs_in_one_edition_only(stage, tmp_path):
    """"A path no rule can read": with --approval-mode off, python3 removes every ref of
    every store (the state folder is a temporary one); the hardened outcome check puts them
    back."""
    (command_cell, teaching_cell, hardened_cell), = table("A command no rule reads")
    command = re.findall(r"`([^`]+)`", command_cell)[0]
    project = a_project(tmp_path)
    run = repl(stage, tmp_path, project, ["write a.txt one", f"$ {command}", "/rollback"],
               "--approval-mode", "off")
    listed = repl_output(run.stdout, PROMPT, "/rollback")
    home = tmp_path / "state"
    if edition_of(stage) == "teaching":
        assert teaching_cell == "runs: `/rollback` lists no checkpoint"
        assert checkpoints_of(stage, project, home) == [] and "before write_file" not in listed
    else:
        assert hardened_cell == "BLOCKED (self-protection): every ref is put back"
        assert "BLOCKED (self-protection)" in repl_output(run.stdout, PROMPT, f"$ {command}")
        assert len(checkpoints_of(stage, project, home)) == 1 and "before write_file" in listed


@pytest.mark.parametrize("stage", STAGES)
def test_the_large_file_limit_the_chapter_names_is_each_editions(stage):
    s12 = fresh_stage(stage)
    assert f"`checkpoints.max_file_size_mb` ({s12.MAX_FILE_SIZE_MB} MB)" in chapter()
    assert s12.SETTINGS_BY_KEY["checkpoints.max_file_size_mb"].default == s12.MAX_FILE_SIZE_MB
