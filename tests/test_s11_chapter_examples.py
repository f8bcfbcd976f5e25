"""s11: what the chapter shows about the configuration chain is what the code does.

docs/en/s11-config-chain.md has

- in "How it works", the table of every setting (key, kind, default, environment
  variable, flag, description). It is made from the stage's SETTINGS by settings_table()
  below and must be exactly that table; zh and ru (once they exist) keep its key, kind,
  default, variable and flag cells. Regenerate it after a change to SETTINGS with

      python tests/test_s11_chapter_examples.py

- in "How it works", the table of mistakes ("The mistake") and the line the agent prints
  for each ("What the agent prints"): each row is run as a flag, a variable or a
  config.yaml and must print exactly that line (and exit 2 for an error);
- in "How it works", the warning a managed file gives a flag it overrides, managed deny
  rules adding up with the user's, what convert() accepts for each kind, the size and
  depth limits, a profile's own config.yaml, the numbers the prose names (how many
  settings, variables, flags, and how many are marked security), and, in the teaching
  edition, which commands a deny rule refuses (a glob over the normalised text and each
  part between separators) and how policy_file_written() finds allowlist.json (by name)
  and a config.yaml (by the path written);
- in "Under attack", the deny-rule table (each edition's column against that edition:
  whether the teaching edition's rule refuses the command; the command the hardened
  edition's parser finds, and that its rule refuses it), what the hardened edition adds
  (input its parser gives up on matches every rule, exercise 3's spellings there, a
  config.yaml found after a cd), the table of attempts to change the configuration with
  the agent's tools (each refused in both editions, with the files unchanged), and the
  limits in "What the guards cannot see" (a lock covers one key, allowlist.json is not
  locked, command_allowlist is not checked, a script can still write config.yaml: the
  last fails once a stage closes it);
- in "Try it", the deny rule and YOLO from a config file, and a typo's warning (rm is a
  stub that only prints, first on PATH);
- in "Exercises", the output of exercise 1's one-shot run, exercise 2's patch (it applies
  to the stage file, and the patched stage does what the solution says), and exercise 3's
  table of commands that a deny rule misses, with the teaching detector's finding for
  each (a known limit: when deny rules stop missing them, the test fails and says to
  update the exercise).

The tables are read from the chapter, so the chapter cannot show what the code does not do.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from helpers import (HARDENED, ROOT, diff_blocks, edition_of, fenced_blocks, fresh_stage,
                     marks, patched_source, patched_stage, run_main, stages_from,
                     stub_programs)

STAGE = "s11_config_chain"
CHAPTER_NAME = "s11-config-chain.md"
CHAPTER = ROOT / "docs" / "en" / CHAPTER_NAME
TRANSLATIONS = ["zh", "ru"]
STAGES = stages_from("s11")
TEACHING_STAGES = [stage for stage in STAGES if edition_of(stage) == "teaching"]
CODE = re.compile(r"`([^`]+)`")
NOTHING = "—"                   # a cell with no value: the same in every language
CODE_COLUMNS = 5                # key, kind, default, variable, flag: never translated


# ── The settings table ─────────────────────────────────────────────────────

def default_cell(value) -> str:
    """A default as one writes it in config.yaml: `30`, `manual`, `false`, `[2, 5]`."""
    if value is None:
        return NOTHING
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(str(item) for item in value) + "]`"
    return f"`{value}`"


def settings_table(module) -> str:
    """The chapter's table of every setting, made from `module`'s SETTINGS."""
    rows = ["| key | kind | default | environment variable | flag | description |",
            "|---|---|---|---|---|---|"]
    for s in module.SETTINGS:
        env = f"`{s.env}`" if s.env else NOTHING
        flag = f"`{s.flag}`" if s.flag else NOTHING
        rows.append(f"| {s.key} | `{s.kind}` | {default_cell(s.default)} | {env} | {flag} | "
                    f"{s.help} |")
    return "\n".join(rows) + "\n"


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def markdown_tables(text: str) -> list[list[str]]:
    """Every table of `text` as its lines (an indented table in an admonition too)."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.strip().startswith("|"):
            current.append(line.strip())
        elif current:
            found.append(current)
            current = []
    return found


def settings_table_in(text: str, keys: list[str]) -> list[str] | None:
    """The lines of the table whose first column is exactly `keys`, or None."""
    for lines in markdown_tables(text):
        if [cells(line)[0] for line in lines[2:]] == keys:
            return lines
    return None


def chapter(lang: str = "en") -> str:
    return (ROOT / "docs" / lang / CHAPTER_NAME).read_text(encoding="utf-8")


def test_the_settings_table_is_made_from_SETTINGS():
    s11 = fresh_stage(STAGE)
    wanted = settings_table(s11).splitlines()
    shown = settings_table_in(chapter(), [s.key for s in s11.SETTINGS])
    assert shown is not None, ("no table of every setting in the chapter; print it with "
                               "`python tests/test_s11_chapter_examples.py`")
    assert shown == wanted, ("the chapter's table of settings is not SETTINGS; print the "
                             "current one with `python tests/test_s11_chapter_examples.py`")


@pytest.mark.parametrize("lang", TRANSLATIONS)
def test_translations_keep_the_settings_tables_code_cells(lang):
    if not (ROOT / "docs" / lang / CHAPTER_NAME).exists():
        pytest.skip(f"docs/{lang}/{CHAPTER_NAME} is not written yet")
    s11 = fresh_stage(STAGE)
    wanted = settings_table(s11).splitlines()[2:]
    shown = settings_table_in(chapter(lang), [s.key for s in s11.SETTINGS])
    assert shown is not None, f"docs/{lang}/{CHAPTER_NAME} has no table of every setting"
    assert [cells(line)[:CODE_COLUMNS] for line in shown[2:]] == \
        [cells(line)[:CODE_COLUMNS] for line in wanted]


def test_the_table_check_sees_a_change():
    """A changed default, a new flag or a new row makes the chapter's table stale."""
    s11 = fresh_stage(STAGE)
    keys = [s.key for s in s11.SETTINGS]
    table = settings_table(s11)
    assert settings_table_in(table, keys) == table.splitlines()
    edited = table.replace("| `30` |", "| `31` |", 1)
    assert edited != table and settings_table_in(edited, keys) != table.splitlines()
    assert settings_table_in(table, keys + ["extra"]) is None


def test_the_numbers_the_chapter_names():
    s11, text = fresh_stage(STAGE), chapter()
    settings = s11.SETTINGS
    with_env = sum(1 for s in settings if s.env)
    with_flag = sum(1 for s in settings if s.flag)
    file_only = sum(1 for s in settings if not s.env and not s.flag)
    assert (f"{len(settings)} settings; {with_env} have an environment variable and "
            f"{with_flag} a flag") in " ".join(text.split())
    assert f"The other {file_only} are set only in a file" in text
    security = [s.key for s in settings if s.security]
    assert f"{len(security)} of them carry `security=True`" in text
    no_flag = [s.key for s in settings if s.env and not s.flag]
    assert no_flag == ["api_key", "compression.threshold"], no_flag


# ── Mistakes and the lines they print ──────────────────────────────────────

def table(header_start: str) -> list[list[str]]:
    """The body rows of the chapter's table whose first header cell starts so ([] if
    there is none: the tests that read it then fail, and collection does not)."""
    text = chapter() if CHAPTER.exists() else ""
    for lines in markdown_tables(text):
        if cells(lines[0])[0].startswith(header_start):
            return [cells(line) for line in lines[2:]]
    return []


def mistakes() -> list[tuple[str, str]]:
    return [(CODE.findall(mistake)[0], CODE.findall(printed)[0])
            for mistake, printed in table("The mistake")]


def test_the_chapter_has_the_table_of_mistakes():
    assert len(mistakes()) >= 8, f"{CHAPTER_NAME}: a table 'The mistake | What the agent prints'"


def start(stage, tmp_path, argv=(), env=None, config_text=None, *more):
    """main() with HOME in tmp_path, the default home ~/.learn-hermes holding
    `config_text` as config.yaml, and `env` added to a clean environment."""
    home = tmp_path / ".learn-hermes"
    home.mkdir(exist_ok=True)
    if config_text is not None:
        (home / "config.yaml").write_text(config_text, encoding="utf-8")
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1",
                   "COLUMNS": "200", **(env or {})}
    return run_main(stage, *argv, *more, env=environment, cwd=tmp_path)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("mistake, printed", mistakes())
def test_each_mistake_prints_the_line_the_chapter_shows(stage, mistake, printed, tmp_path):
    argv, env, text = [], {}, None
    if mistake.startswith("--"):
        argv = shlex.split(mistake)
    elif re.match(r"^[A-Z_]+=", mistake):
        name, _, value = mistake.partition("=")
        env[name] = value
    else:
        text = mistake + "\n"
    run = start(stage, tmp_path, argv, env, text, "--show-config")
    assert printed in run.stderr.splitlines(), (mistake, run.stderr)
    assert run.returncode == (2 if printed.startswith("error:") else 0), run.stderr


MANAGED = "approvals:\n  mode: manual\n  deny: ['git push --force*']\n"


@pytest.mark.parametrize("stage", STAGES)
def test_a_managed_key_beats_a_flag_with_the_warning_the_chapter_shows(stage, tmp_path):
    text = chapter()
    assert "printf 'approvals:\\n  mode: manual\\n  deny: [\"git push --force*\"]\\n' > " \
           "managed.yaml" in text
    (tmp_path / "managed.yaml").write_text(MANAGED, encoding="utf-8")
    env = {"LEARN_HERMES_MANAGED": str(tmp_path / "managed.yaml")}
    run = start(stage, tmp_path, ["--approval-mode", "off", "--show-config"], env)
    assert run.returncode == 0, run.stderr
    warning = ("warning: --approval-mode is ignored: approvals.mode is locked by the managed "
               "configuration (~/managed.yaml:2)")
    assert run.stderr.splitlines() == [warning]
    assert f"```text\n{warning}\n```" in text


@pytest.mark.parametrize("stage", STAGES)
def test_a_lock_covers_one_key(stage, tmp_path):
    """"What the guards cannot see": locking approvals.mode leaves --yolo free; locking
    approvals.yolo too stops it, with a warning."""
    s = fresh_stage(stage)
    managed = tmp_path / "managed.yaml"
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path),
               "LEARN_HERMES_MANAGED": str(managed)}
    managed.write_text("approvals:\n  mode: manual\n", encoding="utf-8")
    config = s.load_config(s.parse_args(["--yolo"]), environ)
    assert (config["approvals.yolo"], config.warnings) == (True, [])
    managed.write_text("approvals:\n  mode: manual\n  yolo: false\n", encoding="utf-8")
    config = s.load_config(s.parse_args(["--yolo"]), environ)
    assert config["approvals.yolo"] is False
    assert config.warnings[0].startswith("warning: --yolo is ignored: approvals.yolo is locked")


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_managed_deny_rules_add_up_with_the_users(stage, tmp_path):
    s = fresh_stage(stage)
    (tmp_path / "managed.yaml").write_text(MANAGED, encoding="utf-8")
    (tmp_path / "config.yaml").write_text("approvals:\n  deny: ['rm -rf *']\n",
                                          encoding="utf-8")
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path),
               "LEARN_HERMES_MANAGED": str(tmp_path / "managed.yaml")}
    config = s.load_config(s.parse_args([]), environ)
    assert config["approvals.deny"] == ["git push --force*", "rm -rf *"]
    assert config.origin("approvals.deny") == \
        "managed:approvals.deny + config.yaml:approvals.deny"
    assert config.warnings == []


@pytest.mark.parametrize("stage", STAGES)
def test_yaml_words_are_read_as_written(stage, tmp_path):
    """`mode: off` is the mode off, `yolo: off` is false, `mode: no` is refused."""
    s = fresh_stage(stage)
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path)}
    (tmp_path / "config.yaml").write_text("approvals:\n  mode: off\n  yolo: off\n",
                                          encoding="utf-8")
    config = s.load_config(s.parse_args([]), environ)
    assert (config["approvals.mode"], config["approvals.yolo"]) == ("off", False)
    (tmp_path / "config.yaml").write_text("approvals:\n  mode: no\n", encoding="utf-8")
    with pytest.raises(s.ConfigError, match="expected one of manual, smart, off, got 'no'"):
        s.load_config(s.parse_args([]), environ)


@pytest.mark.parametrize("stage", STAGES)
def test_a_secret_is_never_shown(stage, tmp_path):
    run = start(stage, tmp_path, ["--show-config"], {"OPENAI_API_KEY": "sk-test-1234"})
    assert "(set, hidden)" in run.stdout and "sk-test-1234" not in run.stdout + run.stderr


@pytest.mark.parametrize("stage", STAGES)
def test_help_and_show_config_name_the_variable_and_the_offline_model(stage, tmp_path):
    """"Seeing the chain": --help and --show-config name the variable; while the offline
    model answers, the model row says offline and why."""
    text = " ".join(chapter().split())
    shown = "(max_iterations, $HERMES_MAX_ITERATIONS; default 30)"
    assert f"`{shown}`" in text
    assert shown in " ".join(start(stage, tmp_path, ["--help"]).stdout.split())
    assert "Under each key stands the variable that sets it, such as " \
           "`$HERMES_MAX_ITERATIONS`" in text
    assert "the `model` row says `offline` and why" in text
    table = start(stage, tmp_path, ["--show-config"]).stdout
    assert re.search(r"│ max_iterations +│ 30 +│ default +│\n│   \$HERMES_MAX_ITERATIONS +│",
                     table), table
    # The source folds at 80 columns: its first words are on the model's line.
    assert re.search(r"│ model +│ offline +│ no OPENAI_API_KEY or ", table), table


@pytest.mark.parametrize("stage", STAGES)
def test_what_convert_accepts_for_each_kind(stage, tmp_path):
    """The list of kinds in "Checking every value"."""
    s = fresh_stage(stage)
    setting = s.SETTINGS_BY_KEY
    assert s.convert(setting["approvals.yolo"], "TRUE") is True
    assert s.convert(setting["approvals.yolo"], "Off") is False
    assert s.convert(setting["approvals.mode"], "Smart") == "smart"
    with pytest.raises(s.ConfigError, match="expected whole seconds, got '1e3'"):
        s.convert(setting["approvals.timeout"], "1e3")
    assert s.convert(setting["toolsets"], "terminal,file") == ["terminal", "file"]
    assert s.convert(setting["toolsets"], ["terminal", "file"]) == ["terminal", "file"]
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert s.convert(setting["write_root"], str(tmp_path / "link")) == \
        (tmp_path / "real").resolve()
    with pytest.raises(s.ConfigError, match="is empty"):
        s.convert(setting["model"], "  ")


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_a_file_too_large_or_too_deep_is_refused(stage, tmp_path):
    s = fresh_stage(stage)
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path)}
    path = tmp_path / "config.yaml"
    path.write_text("#" * (s.MAX_CONFIG_BYTES + 1), encoding="utf-8")
    with pytest.raises(s.ConfigError, match="not a regular file of at most 262,144 bytes"):
        s.load_config(s.parse_args([]), environ)
    assert s.MAX_CONFIG_BYTES == 256 * 1024 and s.MAX_CONFIG_DEPTH == 4
    path.write_text("a:\n b:\n  c:\n   d: 1\n", encoding="utf-8")          # 4 deep: read
    assert "unknown key 'a.b.c.d'" in s.load_config(s.parse_args([]), environ).warnings[0]
    path.write_text("a:\n b:\n  c:\n   d:\n    e: 1\n", encoding="utf-8")  # 5 deep: refused
    with pytest.raises(s.ConfigError, match="sections nested more than 4 deep"):
        s.load_config(s.parse_args([]), environ)


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_a_key_given_twice_is_refused_also_in_two_spellings(stage, tmp_path):
    s = fresh_stage(stage)
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path)}
    (tmp_path / "config.yaml").write_text("approvals:\n  mode: smart\napprovals.mode: off\n",
                                          encoding="utf-8")
    with pytest.raises(s.ConfigError, match="approvals.mode is given twice"):
        s.load_config(s.parse_args([]), environ)


@pytest.mark.parametrize("stage", STAGES)
def test_a_profile_reads_its_own_config_only(stage, tmp_path):
    s = fresh_stage(stage)
    environ = {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path)}
    (tmp_path / "config.yaml").write_text("approvals:\n  timeout: 45\n", encoding="utf-8")
    config = s.load_config(s.parse_args(["--profile", "work"]), environ)
    assert config["approvals.timeout"] == 60 and config.home == tmp_path / "profiles" / "work"
    profile = tmp_path / "profiles" / "work"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text("approvals:\n  timeout: 30\n", encoding="utf-8")
    config = s.load_config(s.parse_args(["--profile", "work"]), environ)
    assert (config["approvals.timeout"], config.origin("approvals.timeout")) == \
        (30, "config.yaml:approvals.timeout")


@pytest.mark.parametrize("stage", STAGES)
def test_a_misspelled_allowlist_key_is_accepted_without_a_word(stage, tmp_path):
    """"What the guards cannot see": command_allowlist's items are not checked."""
    s = fresh_stage(stage)
    (tmp_path / "config.yaml").write_text("command_allowlist: [rm_recursive_forc]\n",
                                          encoding="utf-8")
    config = s.load_config(s.parse_args([]),
                           {"HOME": str(tmp_path), "LEARN_HERMES_HOME": str(tmp_path)})
    assert config["command_allowlist"] == ["rm_recursive_forc"] and config.warnings == []


def test_up_to_s10_an_unknown_yolo_value_meant_off(monkeypatch):
    s10 = fresh_stage("s10_subagent_delegation")
    monkeypatch.setenv("HERMES_YOLO_MODE", "maybe")
    assert s10.permissions_from_args(s10.parse_args([])).yolo_source is None


# ── Runs with stub programs: the REPL as a learner sees it ─────────────────

def stubbed(tmp_path: Path, config_text: str, *more_files: tuple[Path, str]) -> dict:
    """A work folder, a home ~/state holding `config_text` as config.yaml, an rm that only
    prints first on PATH; the environment for run_main()."""
    work, state, stubs = tmp_path / "work", tmp_path / "state", tmp_path / "stubs"
    for folder in (work, state, stubs):
        folder.mkdir()
    stub_programs(tmp_path, ["rm"])
    (state / "config.yaml").write_text(config_text, encoding="utf-8")
    for path, text in more_files:
        path.write_text(text, encoding="utf-8")
    return {"PATH": f"{stubs}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path),
            "LEARN_HERMES_HOME": str(state), "NO_COLOR": "1", "COLUMNS": "200"}


@pytest.mark.parametrize("stage", STAGES)
def test_try_it_a_deny_rule_and_yolo_from_the_file(stage, tmp_path):
    text = chapter()
    config_text = 'approvals:\n  yolo: true\n  deny: ["rm -rf *"]\n'
    assert "printf 'approvals:\\n  yolo: true\\n  deny: [\"rm -rf *\"]\\n' > " \
           "state/config.yaml" in text
    env = stubbed(tmp_path, config_text)
    (tmp_path / "work" / "build").mkdir()
    run = run_main(stage, stdin="$ rm -rf build\n$ rm -r build\n", env=env,
                   cwd=tmp_path / "work")
    assert "BLOCKED (deny rule): the user's rule 'rm -rf *'" in run.stdout
    note = "[approved without asking: YOLO is on (config.yaml:approvals.yolo);"
    assert note in run.stdout + run.stderr and note in " ".join(text.split())
    assert marks(tmp_path / "work") == ["rm -r build"]


@pytest.mark.parametrize("stage", STAGES)
def test_try_it_a_typo_starts_with_the_default_mode(stage, tmp_path):
    assert "printf 'aprovals:\\n  mode: of\\n' > state/config.yaml" in chapter()
    env = stubbed(tmp_path, "aprovals:\n  mode: of\n")
    run = run_main(stage, "--show-config", env=env, cwd=tmp_path / "work")
    assert run.returncode == 0
    suggestion = " (did you mean 'approvals.mode'?)" if edition_of(stage) == "hardened" else ""
    assert f"unknown key 'aprovals.mode'{suggestion}; ignored" in run.stderr
    assert re.search(r"approvals\.mode\s*│ manual\s*│ default", run.stdout), run.stdout


@pytest.mark.parametrize("stage", STAGES)
def test_exporting_a_variable_in_a_command_changes_nothing(stage, tmp_path):
    env = stubbed(tmp_path, "approvals:\n  mode: manual\n")
    run = run_main(stage, stdin="$ export HERMES_YOLO_MODE=1\n$ rm -r build\n", env=env,
                   cwd=tmp_path / "work")
    assert "denied" in run.stdout and marks(tmp_path / "work") == []


# The key of `rm -r build`'s finding: the teaching edition's is the pattern's description.
RM_R_KEYS = {"teaching": ["Recursive file deletion"], "hardened": ["rm_recursive"]}


@pytest.mark.parametrize("stage", STAGES)
def test_the_managed_file_does_not_lock_allowlist_json(stage, tmp_path):
    managed = tmp_path / "managed.yaml"
    allowlist = tmp_path / "state" / "allowlist.json"
    env = stubbed(tmp_path, "", (managed, "command_allowlist: []\n"))
    keys = RM_R_KEYS[edition_of(stage)]
    assert [f.key for f in fresh_stage(stage).detect_dangerous_command("rm -r build")] == keys
    allowlist.write_text(json.dumps({"version": 1, "keys": keys}) + "\n", encoding="utf-8")
    env["LEARN_HERMES_MANAGED"] = str(managed)
    run = run_main(stage, stdin="$ rm -r build\n", env=env, cwd=tmp_path / "work")
    assert marks(tmp_path / "work") == ["rm -r build"], run.stdout


@pytest.mark.parametrize("stage", STAGES)
def test_a_projects_own_config_yaml_may_be_edited(stage, tmp_path):
    env = stubbed(tmp_path, "approvals:\n  mode: manual\n")
    run = run_main(stage, stdin="$ echo 'debug: true' > config.yaml\n", env=env,
                   cwd=tmp_path / "work")
    assert (tmp_path / "work" / "config.yaml").read_text() == "debug: true\n", run.stdout


def test_code_in_a_file_can_still_write_config_yaml(tmp_path):
    """A known limit ("What the guards cannot see"): the fence covers tools and command
    lines, not what a script does. When a stage closes it, this test fails: update the
    chapter's "Code in a file"."""
    env = stubbed(tmp_path, "approvals:\n  mode: manual\n")
    env["PATH"] += os.pathsep + str(Path(sys.executable).parent)   # a python3 to run it
    script = ("import os, pathlib; pathlib.Path(os.environ['LEARN_HERMES_HOME'], "
              "'config.yaml').write_text('approvals: {mode: off}')")
    run = run_main(STAGE, stdin=f"write note.py {script}\n$ python3 note.py\n", env=env,
                   cwd=tmp_path / "work")
    assert (tmp_path / "state" / "config.yaml").read_text() == "approvals: {mode: off}", \
        run.stdout


# ── Deny rules ─────────────────────────────────────────────────────────────

def section(heading: str) -> str:
    """The chapter from `heading` ("## …" or "### …") to the next heading of its level or
    a higher one."""
    text = chapter()
    start = text.index(heading)
    level = len(heading.split()[0])
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, start + 1)
    return text[start:end.start() if end else len(text)]


@pytest.mark.parametrize("stage", TEACHING_STAGES)
def test_a_deny_rule_is_a_glob_over_the_text_and_each_part(stage):
    """"How it works": the teaching edition matches a rule against the normalised command
    and each part between ; && || | &, from its first character."""
    s = fresh_stage(stage)
    part = section("### Deny rules")
    for command in ("RM -RF build", '"rm" -rf build', "cd src && rm -rf build"):
        assert f"`{command}`" in part, command
        assert s.deny_rule_matched(command, ("rm -rf *",)) == "rm -rf *", command
    for command in ("sudo rm -rf build", "/bin/rm -rf build"):
        assert f"`{command}`" in part, command
        assert s.deny_rule_matched(command, ("rm -rf *",)) is None, command
    assert s.deny_rule_matched("echo hello", ("git push*",)) is None
    assert s.deny_rule_matched("echo hello", ()) is None


@pytest.mark.parametrize("stage", STAGES)
def test_the_deny_rule_table_says_what_each_edition_refuses(stage):
    """"Under attack": the teaching column against the teaching edition, the hardened
    column (the command its parser finds, and the rule's answer) against the hardened."""
    s = fresh_stage(stage)
    rows = table("The command")
    assert len(rows) >= 6, rows
    for command_cell, teaching_cell, hardened_cell in rows:
        command = CODE.findall(command_cell)[0]
        matched = s.deny_rule_matched(command, ("rm -rf *",))
        if edition_of(stage) == "teaching":
            assert teaching_cell in ("refused", "passes"), teaching_cell
            assert matched == ("rm -rf *" if teaching_cell == "refused" else None), command
        else:
            parsed = CODE.findall(hardened_cell)[0]
            assert parsed in s.commands_run(command), (command, s.commands_run(command))
            assert hardened_cell.endswith(": refused") and matched == "rm -rf *", command
    assert {row[1] for row in rows} == {"refused", "passes"}     # the editions differ


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_input_the_parser_gives_up_on_matches_every_rule(stage):
    s = fresh_stage(stage)
    assert "`MAX_COMMAND_CHARS`" in section("## Under attack")
    assert s.deny_rule_matched("echo " + "x" * s.MAX_COMMAND_CHARS, ("git push*",)) == \
        "git push*"
    assert s.deny_rule_matched("echo hello", ("git push*",)) is None
    assert s.deny_rule_matched("echo hello", ()) is None


def test_exercise_3_the_commands_a_deny_rule_misses():
    """A known limit: the rule is text, so other spellings of the same deletion pass it
    (and YOLO then approves them). If this test fails because a deny rule now blocks one
    of them, update exercise 3 and "What the guards cannot see"."""
    s = fresh_stage(STAGE)
    rows = table("Missed by")
    assert len(rows) >= 4, rows
    for command_cell, finding_cell in rows:
        command, finding = CODE.findall(command_cell)[0], CODE.findall(finding_cell)[0]
        assert s.deny_rule_matched(command, ("rm -rf *",)) is None, \
            f"{command} is now blocked by 'rm -rf *': update exercise 3"
        assert finding in [f.key for f in s.detect_dangerous_command(command)], command
    wider = ("rm -*r*",)                    # the solution's wider rule, and what it also hits
    for command in ("rm -fr build", "rm -r -f build", "rm --recursive --force build",
                    "rm -f report.txt"):
        assert s.deny_rule_matched(command, wider) == "rm -*r*", command
    assert s.deny_rule_matched("sudo rm -fr build", wider) is None    # a wrapper passes it
    # find's -delete: past the rule, and past every pattern of the teaching edition
    solution = part_of(chapter(), "### 3. Break it")
    assert "`find build -delete` passes" in " ".join(solution.split())
    assert s.deny_rule_matched("find build -delete", ("rm -rf *",)) is None
    assert s.detect_dangerous_command("find build -delete") == []
    assert fresh_stage(HARDENED + STAGE).detect_dangerous_command("find build -delete")


@pytest.mark.hardening
def test_exercise_3s_spellings_in_the_hardened_edition():
    """"The hardened rule language": a rule read as a command refuses every spelling of
    exercise 3 (the parser hands it the rm inside sudo and xargs); find's -delete is no
    rm, and rm without -f is not rm -rf."""
    hardened = fresh_stage(HARDENED + STAGE)
    text = " ".join(section("## Under attack").split())
    assert "every spelling of exercise 3 is refused there" in text
    for command_cell, _ in table("Missed by"):
        command = CODE.findall(command_cell)[0]
        assert hardened.deny_rule_matched(command, ("rm -rf *",)) == "rm -rf *", command
    assert hardened.deny_rule_matched("find build -delete", ("rm -rf *",)) is None
    assert hardened.deny_rule_matched("rm -r build", ("rm -rf *",)) is None
    assert hardened.commands_run("xargs rm -rf < list") == ["rm -rf"]


@pytest.mark.hardening
def test_the_hardened_rule_language_table():
    """Each row of "The rule" table, against the hardened edition; the teaching edition
    misses at least one refused row (else the table teaches nothing)."""
    hardened, teaching = fresh_stage(HARDENED + STAGE), fresh_stage(STAGE)
    rows = table("The rule")
    assert len(rows) >= 8, rows
    teaching_misses = 0
    for rule_cell, command_cell, answer in rows:
        rule, command = CODE.findall(rule_cell)[0], CODE.findall(command_cell)[0]
        assert answer in ("refused", "passes"), answer
        wanted = rule if answer == "refused" else None
        assert hardened.deny_rule_matched(command, (rule,)) == wanted, (rule, command)
        teaching_misses += wanted is not None and teaching.deny_rule_matched(command, (rule,)) \
            is None
    assert teaching_misses >= 3


# ── The agent cannot change its configuration ──────────────────────────────

@pytest.mark.parametrize("stage", STAGES)
def test_allowlist_json_is_found_by_its_name_a_config_yaml_by_the_path_written(
        stage, tmp_path, monkeypatch):
    """"The config files are policy files": a command that names allowlist.json is refused
    (the hardened edition lets one that only reads name it); a config.yaml only when the
    path written is the agent's."""
    s = fresh_stage(stage)
    assert "refuses any command that names `allowlist.json`" in " ".join(chapter().split())
    state, work = tmp_path / "state", tmp_path / "work"
    state.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    monkeypatch.chdir(work)
    assert s.policy_file_written("cp /tmp/x allowlist.json") == state / "allowlist.json"
    reading = s.policy_file_written("cat allowlist.json")
    assert reading == (None if edition_of(stage) == "hardened" else state / "allowlist.json")
    assert s.policy_file_written("echo 'debug: true' > config.yaml") is None
    assert s.policy_file_written(f"echo 'mode: off' > {state}/config.yaml") == \
        state / "config.yaml"


@pytest.mark.hardening
@pytest.mark.parametrize("stage", STAGES)
def test_the_hardened_edition_finds_config_yaml_after_a_cd(stage, tmp_path, monkeypatch):
    s = fresh_stage(stage)
    assert "`config.yaml` after a `cd` into the state folder (`policy_named()`)" in \
        " ".join(section("## Under attack").split())
    state, work = tmp_path / "state", tmp_path / "work"
    state.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LEARN_HERMES_HOME", str(state))
    monkeypatch.chdir(work)
    assert s.policy_file_written("cd ~/state && echo 'mode: off' > config.yaml") == \
        state / "config.yaml"


@pytest.mark.parametrize("stage", STAGES)
def test_every_attempt_on_the_config_files_is_refused(stage, tmp_path):
    rows = [(CODE.findall(tried)[0], gets) for tried, gets in table("The model tries")]
    assert len(rows) >= 6, rows
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    (state / "profiles" / "work").mkdir(parents=True)
    files = {state / "config.yaml": "approvals:\n  mode: manual\n",
             work / "team.yaml": "approvals:\n  deny: ['rm -rf *']\n"}
    for path, content in files.items():
        path.write_text(content, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LEARN_HERMES_HOME": str(state),
           "NO_COLOR": "1", "COLUMNS": "200"}
    stdin = "".join(tried + "\n" for tried, _ in rows)
    run = run_main(stage, "--config", "team.yaml", stdin=stdin, env=env, cwd=work)
    turns = re.split(r"(?m)^s\d\d> ", run.stdout)[1:]     # `sNN> ` starts every turn
    for (tried, gets), turn in zip(rows, turns):
        assert turn.startswith(tried), (tried, turn[:80])
        for fragment in CODE.findall(gets) or [gets]:
            assert fragment in turn, (tried, fragment, turn)
    for path, content in files.items():
        assert path.read_text(encoding="utf-8") == content, path
    assert not (state / "profiles" / "work" / "allowlist.json").exists()


# ── Exercises ──────────────────────────────────────────────────────────────

def part_of(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n### ", start + 1)
    return text[start:] if end < 0 else text[start:end]


EXERCISE_1_CONFIG = "max_iterations: 12\napprovals:\n  yolo: true\n  timeout: 45\n"
EXERCISE_1_ENV = {"HERMES_MAX_ITERATIONS": "20", "HERMES_YOLO_MODE": "no",
                  "HERMES_APPROVAL_TIMEOUT": ""}


@pytest.mark.parametrize("stage", STAGES)
def test_exercise_1_the_answer_the_solution_shows(stage, tmp_path):
    part = part_of(chapter(), "### 1. Predict")
    command = fenced_blocks(part, "bash")[0]
    assert "printf 'max_iterations: 12\\napprovals:\\n  yolo: true\\n  timeout: 45\\n'" in command
    assert "printf 'approvals:\\n  mode: manual\\n' > managed.yaml" in command
    for name, value in EXERCISE_1_ENV.items():
        assert f"{name}={value}" in command, name
    assert "--max-iterations 5 --approval-mode off -p config" in command
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.yaml").write_text(EXERCISE_1_CONFIG, encoding="utf-8")
    (tmp_path / "managed.yaml").write_text("approvals:\n  mode: manual\n", encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LEARN_HERMES_HOME": str(state),
           "LEARN_HERMES_MANAGED": str(tmp_path / "managed.yaml"), "NO_COLOR": "1",
           **EXERCISE_1_ENV}
    run = run_main(stage, "--max-iterations", "5", "--approval-mode", "off", "-p", "config",
                   env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    shown = fenced_blocks(part, "text")
    assert shown[0] == run.stdout, run.stdout
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert shown[1].splitlines() == warnings


def test_the_solutions_diffs_apply_to_the_stage_file():
    blocks = diff_blocks(chapter())
    assert blocks, "no ```diff block in the chapter"
    for block in blocks:
        patched_source(STAGE, block)


def test_exercise_2_the_patched_stage_has_the_variable_and_the_flag(tmp_path):
    text = part_of(chapter(), "### 2. Change")
    patched = patched_stage(STAGE, diff_blocks(text)[0], tmp_path)
    run = start(patched, tmp_path, ["-p", "config"], {"HERMES_MAX_CHILD_ITERATIONS": "5"})
    line = "  delegation.max_child_iterations = 5   (HERMES_MAX_CHILD_ITERATIONS)"
    assert line in run.stdout.splitlines() and line.strip() in text
    run = start(patched, tmp_path, ["--max-child-iterations", "0", "--show-config"])
    error = ("error: --max-child-iterations: delegation.max_child_iterations: must be from "
             "1 to 100, got 0")
    assert run.returncode == 2 and error in run.stderr.splitlines() and error in text
    stale = settings_table(patched)
    assert stale != settings_table(fresh_stage(STAGE))   # the chapter's table test now fails
    assert "`HERMES_MAX_CHILD_ITERATIONS` | `--max-child-iterations` |" in stale


if __name__ == "__main__":
    sys.stdout.write(settings_table(fresh_stage(STAGE)))
