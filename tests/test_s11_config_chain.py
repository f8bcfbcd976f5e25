"""s11: the configuration chain. Every setting comes from the strongest layer that sets it
(flag > environment > config.yaml or --config > default), the managed file locks what it
sets, every value knows its origin, every value of every layer is checked, --profile gives
a home of its own, approvals.deny beats YOLO, and no tool changes a config file.

Runs on every stage from s11 up. The chain is asked through its public entry points:
load_config(parse_args(argv), environ) with an explicit environ (nothing of the test's own
environment leaks in), main() through run_main() for --show-config, exit codes and
warnings, and the real agent loop against tests/fake_openai.py for deny rules and
self-protection (the tool result the model gets, and the file left as it was). The real
/etc is never read: DEFAULT_MANAGED_FILE points into tmp_path. Commands that a failed guard
would run name programs that are stubs first on PATH (rm, sed, cp, tee, make, mv, chmod), and every
file they name is inside tmp_path.
"""

import json
import os
import re
import stat
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, call, reply
from helpers import (clean_env, edition_of, load_stage, marks, pairing_problems, repl_output,
                     run_main, stages_from, stubbed_work_folder)

STAGES = stages_from("s11")
STUBBED = ("rm", "sed", "cp", "tee", "make", "mv", "chmod")
SYSTEM_MANAGED_FILE = {}            # module name -> DEFAULT_MANAGED_FILE as the stage has it


@pytest.fixture(params=STAGES)
def stage(request, tmp_path, monkeypatch):
    module = load_stage(request.param)
    SYSTEM_MANAGED_FILE.setdefault(module.__name__, module.DEFAULT_MANAGED_FILE)
    # Never the real /etc/learn-hermes/config.yaml, whether or not this machine has one.
    monkeypatch.setattr(module, "DEFAULT_MANAGED_FILE", tmp_path / "etc" / "config.yaml")
    for setting in module.SETTINGS:             # the test's own shell settings stay out
        if setting.env:
            monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.delenv(module.MANAGED_ENV_VAR, raising=False)
    yield module
    module.ActiveSession.store = None
    module.ActiveSession.session_id = None
    module.CONFIG = None


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder with stub programs first on PATH; HOME is a temporary folder."""
    return stubbed_work_folder(tmp_path, monkeypatch, STUBBED)


@pytest.fixture
def limits_restored(stage, tmp_path):
    """start_with() sets module limits (guardrails, memory, ...): back to the defaults."""
    yield
    empty = tmp_path / "defaults-home"
    stage.apply_limits(stage.load_config(stage.parse_args([]),
                                         {"LEARN_HERMES_HOME": str(empty)}))


_parsed = {}


def chain(stage, home, *argv, yaml=None, managed=None, **env):
    """load_config() for this command line and exactly this environment; `yaml` is written
    to home/config.yaml, `managed` to a managed file that LEARN_HERMES_MANAGED names."""
    if yaml is not None:
        (home / "config.yaml").write_text(yaml, encoding="utf-8")
    environ = {"LEARN_HERMES_HOME": str(home), **env}
    if managed is not None:
        path = home.parent / "managed.yaml"
        path.write_text(managed, encoding="utf-8")
        environ[stage.MANAGED_ENV_VAR] = str(path)
    key = (stage.__name__, argv)
    if key not in _parsed:                  # argparse with 25 options is the slow part
        _parsed[key] = stage.parse_args(list(argv))
    return stage.load_config(_parsed[key], environ)


def as_the_edition_words_it(stage, warning: str) -> str:
    """A warning about an unknown key: the hardened edition also names the nearest known
    key, "(did you mean 'approvals.mode'?)"; the teaching edition does not."""
    if edition_of(stage.__stage__) == "hardened":
        return warning
    return re.sub(r" \(did you mean '[^']+'\?\)", "", warning)


def chain_error(stage, home, *argv, **kwargs) -> str:
    with pytest.raises(stage.ConfigError) as caught:
        chain(stage, home, *argv, **kwargs)
    return str(caught.value)


def changed(config) -> dict:
    """Every key that is not at its default: key -> (value, origin)."""
    return {key: (config[key], config.origin(key)) for key in config.resolved
            if config.origin(key) != "default"}


def nested(key: str, text: str) -> str:
    """`approvals.mode` and `off` as config.yaml nests them: approvals:\\n  mode: off."""
    *sections, last = key.split(".")
    lines = [f"{'  ' * depth}{section}:" for depth, section in enumerate(sections)]
    return "\n".join([*lines, f"{'  ' * len(sections)}{last}: {text}"]) + "\n"


def agent_run(stage, turns, *argv, env=None, stdin=""):
    """-p through main() against the fake server; the result and the server."""
    with FakeOpenAI(turns) as server:
        result = run_main(stage, "-p", "go", *argv, stdin=stdin,
                          env=clean_env(OPENAI_BASE_URL=server.url, **(env or {})))
    return result, server


def results(server) -> dict:
    """Each tool result of the last request, by call id, as the model got it: the JSON
    (a guardrail may have appended a note after it)."""
    return {m["tool_call_id"]: json.JSONDecoder().raw_decode(m["content"])[0]
            for m in server.requests[-1]["messages"] if m["role"] == "tool"}


# ── the table of settings ─────────────────────────────────────────────────

# The settings, written out here (not read from SETTINGS): key, environment
# variable, flag, a value as text (a list as "a, b"), and what it means.
SPEC = [
    ("model", "OPENAI_MODEL", "--model", "m-1", "m-1"),
    ("base_url", "OPENAI_BASE_URL", "--base-url", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
    ("api_key", "OPENAI_API_KEY", None, "sk-spec", "sk-spec"),
    ("max_iterations", "HERMES_MAX_ITERATIONS", "--max-iterations", "7", 7),
    ("toolsets", "HERMES_TOOLSETS", "--toolsets", "terminal, file", ["terminal", "file"]),
    ("disabled_toolsets", "HERMES_DISABLED_TOOLSETS", "--disable-toolsets", "memory",
     ["memory"]),
    ("compression.context_length", "HERMES_CONTEXT_LENGTH", "--context-length", "5000", 5000),
    ("compression.threshold", "HERMES_COMPRESSION_THRESHOLD", None, "0.7", 0.7),
    ("retries.max", "HERMES_MAX_RETRIES", "--max-retries", "2", 2),
    ("fallback.model", "HERMES_FALLBACK_MODEL", "--fallback-model", "fb", "fb"),
    ("fallback.base_url", "HERMES_FALLBACK_BASE_URL", "--fallback-base-url",
     "http://127.0.0.1:8/v1", "http://127.0.0.1:8/v1"),
    ("approvals.mode", "HERMES_APPROVAL_MODE", "--approval-mode", "smart", "smart"),
    ("approvals.timeout", "HERMES_APPROVAL_TIMEOUT", "--approval-timeout", "9", 9),
    ("approvals.yolo", "HERMES_YOLO_MODE", "--yolo", "true", True),
    ("approvals.deny", None, None, "rm -rf *, git push*", ["rm -rf *", "git push*"]),
    ("command_allowlist", None, None, "rm_recursive", ["rm_recursive"]),
    ("write_root", "HERMES_WRITE_ROOT", "--write-root", "{folder}", "{folder}"),
    ("guardrails.exact_failure", None, None, "4, 9", [4, 9]),
    ("guardrails.same_tool_failure", None, None, "4, 9", [4, 9]),
    ("guardrails.no_progress", None, None, "4, 9", [4, 9]),
    ("memory.memory_chars", None, None, "500", 500),
    ("memory.user_chars", None, None, "400", 400),
    ("delegation.child_budget", "HERMES_CHILD_BUDGET", "--child-budget", "independent",
     "independent"),
    ("delegation.child_approvals", "HERMES_CHILD_APPROVALS", "--child-approvals", "once",
     "once"),
    ("delegation.max_child_iterations", None, None, "4", 4),
    ("delegation.heartbeat_interval", "HERMES_HEARTBEAT_INTERVAL", "--heartbeat-interval",
     "5", 5),
    ("delegation.stale_beats", None, None, "3", 3),
]
DEFAULTS = {
    "model": "gpt-4o-mini", "base_url": None, "api_key": None, "max_iterations": 30,
    "toolsets": None, "disabled_toolsets": [], "compression.context_length": 128_000,
    "compression.threshold": 0.5, "retries.max": 3, "fallback.model": None,
    "fallback.base_url": None, "approvals.mode": "manual", "approvals.timeout": 60,
    "approvals.yolo": False, "approvals.deny": [], "command_allowlist": [], "write_root": None,
    "guardrails.exact_failure": [2, 5], "guardrails.same_tool_failure": [3, 8],
    "guardrails.no_progress": [2, 5], "memory.memory_chars": 2200, "memory.user_chars": 1375,
    "delegation.child_budget": "shared", "delegation.child_approvals": "deny",
    "delegation.max_child_iterations": 15, "delegation.heartbeat_interval": 30,
    "delegation.stale_beats": 15,
}
# Ranges: the smallest and the largest value each number setting takes.
RANGES = {
    "max_iterations": (1, 1000), "compression.context_length": (1, 100_000_000),
    "retries.max": (0, 10), "approvals.timeout": (1, 3600),
    "guardrails.exact_failure": (1, 100), "guardrails.same_tool_failure": (1, 100),
    "guardrails.no_progress": (1, 100), "memory.memory_chars": (100, 100_000),
    "memory.user_chars": (100, 100_000), "delegation.max_child_iterations": (1, 100),
    "delegation.heartbeat_interval": (1, 3600), "delegation.stale_beats": (1, 1000),
}


def full_table(stdout: str) -> list[tuple[str, str, str, str]]:
    """The rows of --show-config's table: (key, value, source, variable). A setting's
    variable is under its key, "$NAME" on a line of its own ("" if it has none). The table
    is as wide as the captured console (80 columns), so a long cell folds onto the next
    line: a line continues the row above when its key cell is empty or holds the variable,
    or while that row's key or variable is not yet one of the settings'."""
    settings = [setting for name in STAGES for setting in load_stage(name).SETTINGS]
    keys, variables = {s.key for s in settings}, {s.env or "" for s in settings}
    rows = []
    for line in stdout.splitlines():
        if not line.startswith("│"):
            continue
        key, *cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        last = rows[-1] if rows else None
        if last is None or key and not key.startswith("$") and last[0] in keys \
                and last[3] in variables:
            rows.append([key, *cells, ""])      # a new row
            continue
        if key.startswith("$"):
            last[3] = key[1:]
        elif last[0] not in keys:
            last[0] += key
        else:
            last[3] += key
        last[1:3] = [a + b for a, b in zip(last[1:3], cells)]
    return [tuple(row) for row in rows]


def table(stdout: str) -> list[tuple[str, str, str]]:
    """The rows of --show-config's table without the variable: (key, value, source)."""
    return [row[:3] for row in full_table(stdout)]


# s06's no-progress guardrail is in the hardened edition only, and so is its setting.
NO_PROGRESS = "guardrails.no_progress"
HARDENED_ONLY_KEYS = {NO_PROGRESS}


def has_setting(stage, key: str) -> bool:
    """Whether this edition has `key` (checked, not assumed: the teaching edition must
    not have a hardened-only key either)."""
    expected = key not in HARDENED_ONLY_KEYS or "hardened" in stage.__name__
    assert (key in stage.SETTINGS_BY_KEY) == expected, key
    return expected


def spec_value(value, folder: Path):
    return folder.resolve() if value == "{folder}" else value


def test_the_table_has_every_setting_with_its_default(stage, home):
    ours = [s for s in stage.SETTINGS if s.key in DEFAULTS]     # later stages add more
    spec = [row for row in SPEC if has_setting(stage, row[0])]
    defaults = {key: value for key, value in DEFAULTS.items() if has_setting(stage, key)}
    assert [setting.key for setting in ours] == [row[0] for row in spec]
    assert {s.key: (s.env, s.flag) for s in ours} == {
        key: (env, flag) for key, env, flag, _, _ in spec}
    config = chain(stage, home)
    assert {key: config[key] for key in defaults} == defaults
    assert {config.origin(key) for key in defaults} == {"default"}
    assert [s.key for s in stage.SETTINGS if s.secret] == ["api_key"]
    assert config.files == [] and config.warnings == []


@pytest.mark.parametrize("key,env,flag,text,value", SPEC, ids=[row[0] for row in SPEC])
def test_every_setting_from_every_layer_that_has_it(stage, home, tmp_path, key, env, flag,
                                                    text, value):
    if not has_setting(stage, key):
        return
    text, value = text.replace("{folder}", str(tmp_path)), spec_value(value, tmp_path)
    from_file = chain(stage, home, yaml=nested(key, text))
    assert changed(from_file) == {key: (value, f"config.yaml:{key}")}
    dotted = chain(stage, home, yaml=f"{key}: {text}\n")
    assert changed(dotted) == {key: (value, f"config.yaml:{key}")}
    if env:
        assert changed(chain(stage, home, **{env: text})) == {key: (value, env)}
    if flag:
        argv = (flag,) if flag == "--yolo" else (flag, text)
        assert changed(chain(stage, home, *argv)) == {key: (value, flag)}


# ── precedence: every pair of layers ──────────────────────────────────────

TIMEOUT = "approvals.timeout"
LAYER_VALUES = {"config.yaml": 45, "--config": 40, "env": 30, "flag": 20, "managed": 10}
LAYER_ORIGINS = {"config.yaml": "config.yaml:approvals.timeout",
                 "--config": "team.yaml:approvals.timeout", "env": "HERMES_APPROVAL_TIMEOUT",
                 "flag": "--approval-timeout", "managed": "managed:approvals.timeout"}
STRENGTH = ["config.yaml", "--config", "env", "flag", "managed"]    # weakest first
PAIRS = [(weak, strong) for i, weak in enumerate(STRENGTH) for strong in STRENGTH[i + 1:]]


def set_layers(stage, home, layers) -> tuple[tuple, dict]:
    """argv and environ with approvals.timeout set in each of `layers`."""
    argv, environ = [], {"LEARN_HERMES_HOME": str(home)}
    if "config.yaml" in layers:
        (home / "config.yaml").write_text("approvals:\n  timeout: 45\n")
    if "--config" in layers:
        team = home.parent / "team.yaml"
        team.write_text("# the team's settings\napprovals:\n  timeout: 40\n")
        argv += ["--config", str(team)]
    if "env" in layers:
        environ["HERMES_APPROVAL_TIMEOUT"] = "30"
    if "flag" in layers:
        argv += ["--approval-timeout", "20"]
    if "managed" in layers:
        managed = home.parent / "managed.yaml"
        managed.write_text("approvals:\n  timeout: 10\n")
        environ[stage.MANAGED_ENV_VAR] = str(managed)
    return tuple(argv), environ


@pytest.mark.parametrize("layers", [(), *[(layer,) for layer in STRENGTH], *PAIRS,
                                    tuple(STRENGTH), tuple(STRENGTH[:-1])],
                         ids=lambda layers: "+".join(layers) or "nothing")
def test_the_strongest_layer_wins(stage, home, layers):
    argv, environ = set_layers(stage, home, layers)
    config = stage.load_config(stage.parse_args(list(argv)), environ)
    winner = max(layers, key=STRENGTH.index) if layers else None
    assert config[TIMEOUT] == (LAYER_VALUES[winner] if winner else 60)
    assert config.origin(TIMEOUT) == (LAYER_ORIGINS[winner] if winner else "default")
    assert changed(config) == ({TIMEOUT: (config[TIMEOUT], config.origin(TIMEOUT))}
                               if winner else {})


def test_config_replaces_the_homes_file_it_does_not_add_to_it(stage, home):
    team = home.parent / "team.yaml"
    team.write_text("model: team-model\n")
    config = chain(stage, home, "--config", str(team), yaml="approvals:\n  timeout: 45\n")
    assert changed(config) == {"model": ("team-model", "team.yaml:model")}
    assert config.files == [team]


def test_a_missing_config_file_is_defaults_a_named_one_must_exist(stage, home):
    assert changed(chain(stage, home)) == {}
    assert chain_error(stage, home, "--config", str(home / "nope.yaml")) == \
        f"{home / 'nope.yaml'}: no such file"


# ── the managed layer ─────────────────────────────────────────────────────

def locked_warning(origin, key, where):
    return (f"warning: {origin} is ignored: {key} is locked by the managed configuration "
            f"({where})")


def test_the_managed_file_locks_its_keys_with_one_warning_per_override(stage, home):
    config = chain(stage, home, "--approval-timeout", "20", "--yolo",
                   yaml="approvals:\n  timeout: 45\nmodel: mine\n",
                   managed="# policy\napprovals:\n  timeout: 10\n  yolo: false\n",
                   HERMES_APPROVAL_TIMEOUT="30", HERMES_YOLO_MODE="1")
    managed = home.parent / "managed.yaml"
    assert changed(config) == {TIMEOUT: (10, "managed:approvals.timeout"),
                               "approvals.yolo": (False, "managed:approvals.yolo"),
                               "model": ("mine", "config.yaml:model")}
    assert config.warnings == [
        locked_warning("config.yaml:approvals.timeout", TIMEOUT, f"{managed}:3"),
        locked_warning("HERMES_APPROVAL_TIMEOUT", TIMEOUT, f"{managed}:3"),
        locked_warning("HERMES_YOLO_MODE", "approvals.yolo", f"{managed}:4"),
        locked_warning("--approval-timeout", TIMEOUT, f"{managed}:3"),
        locked_warning("--yolo", "approvals.yolo", f"{managed}:4")]
    assert config.files == [home / "config.yaml", managed]


@pytest.mark.parametrize("locked", ["false", "true"])
def test_yolo_in_the_repl_honours_the_managed_lock(stage, home, work, tmp_path, locked):
    """The managed file locks approvals.yolo: --yolo is ignored with a warning, and /yolo
    may not change it either, whichever way it is locked (review of s11)."""
    managed = tmp_path / "managed.yaml"
    managed.write_text(f"approvals:\n  yolo: {locked}\n")
    turns = [reply("", call("terminal", {"command": "rm -rf build"}, "c0")), reply("done")]
    with FakeOpenAI(turns) as server:
        result = run_main(stage, stdin="/yolo\n/permissions\ngo\n", cwd=work,
                          env=clean_env(OPENAI_BASE_URL=server.url,
                                        **{stage.MANAGED_ENV_VAR: str(managed)}))
    assert result.returncode == 0, result.stderr
    shown = repl_output(result.stdout, f"{stage.STAGE}> ", "/yolo")
    assert shown == ("YOLO is locked by the managed configuration (managed:approvals.yolo); "
                     "/yolo cannot change it")
    state = repl_output(result.stdout, f"{stage.STAGE}> ", "/permissions")
    assert ("on (managed:approvals.yolo)" in state) == (locked == "true"), state
    ran = results(server)["c0"]
    if locked == "true":
        assert ran["output"] == "stub rm\n"
    else:
        assert ran["error"].startswith("denied: no terminal to ask on")
        assert marks(work) == []


def test_a_key_the_managed_file_does_not_set_is_the_users(stage, home):
    config = chain(stage, home, "--approval-mode", "off", managed="approvals:\n  timeout: 10\n")
    assert config["approvals.mode"] == "off" and config.origin("approvals.mode") == \
        "--approval-mode"
    assert config.warnings == []


def test_the_lock_is_shown_by_main_once(stage, home, tmp_path):
    managed = tmp_path / "managed.yaml"
    managed.write_text("approvals:\n  mode: manual\n")
    result = run_main(stage, "--show-config", "--approval-mode", "off",
                      env=clean_env(**{stage.MANAGED_ENV_VAR: str(managed)}))
    assert result.returncode == 0
    assert result.stderr == locked_warning("--approval-mode", "approvals.mode",
                                           f"{managed}:2") + "\n"
    assert ("approvals.mode", "manual", "managed:approvals.mode") in table(result.stdout)


def test_the_managed_deny_rules_cannot_be_removed(stage, home):
    managed = "approvals:\n  deny: ['rm -rf *', 'curl *']\n"
    emptied = chain(stage, home, yaml="approvals:\n  deny: []\n", managed=managed)
    assert emptied["approvals.deny"] == ["rm -rf *", "curl *"]
    alone = chain(stage, home, yaml="# nothing\n", managed=managed)
    assert changed(alone) == {"approvals.deny": (["rm -rf *", "curl *"],
                                                 "managed:approvals.deny")}


@pytest.mark.hardening
def test_deny_rules_add_up_the_managed_ones_cannot_be_removed(stage, home):
    managed = "approvals:\n  deny: ['rm -rf *', 'curl *']\n"
    both = chain(stage, home, yaml="approvals:\n  deny: ['git push*', 'curl *']\n",
                 managed=managed)
    assert both["approvals.deny"] == ["rm -rf *", "curl *", "git push*"]
    assert both.origin("approvals.deny") == "managed:approvals.deny + config.yaml:approvals.deny"
    assert both.warnings == []                  # adding rules overrides nothing
    emptied = chain(stage, home, yaml="approvals:\n  deny: []\n", managed=managed)
    assert emptied["approvals.deny"] == ["rm -rf *", "curl *"]
    alone = chain(stage, home, yaml="# nothing\n", managed=managed)
    assert changed(alone) == {"approvals.deny": (["rm -rf *", "curl *"],
                                                 "managed:approvals.deny")}


def test_the_managed_file_named_must_exist_and_must_be_valid(stage, home, tmp_path):
    missing = tmp_path / "gone.yaml"
    assert chain_error(stage, home, **{stage.MANAGED_ENV_VAR: str(missing)}) == \
        f"{missing}: no such file"
    assert chain_error(stage, home, managed="approvals:\n  mode: never\n") == (
        f"{home.parent / 'managed.yaml'}:2: approvals.mode: expected one of manual, smart, "
        f"off, got 'never'")


def test_the_system_managed_file_is_read_when_present(stage, home, tmp_path, monkeypatch):
    assert SYSTEM_MANAGED_FILE[stage.__name__] == Path("/etc/learn-hermes/config.yaml")
    system = tmp_path / "etc" / "config.yaml"
    assert stage.managed_file({}) is None               # not there: no managed layer
    system.parent.mkdir()
    system.mkdir()                                      # a folder is not a file
    assert stage.managed_file({}) is None
    system.rmdir()
    system.write_text("approvals:\n  mode: smart\n")
    config = chain(stage, home, "--approval-mode", "off")
    assert config["approvals.mode"] == "smart" and config.files == [system]
    if "hardened" in stage.__file__:           # the files list of --show-config
        assert config.read_from[1] == f"managed file: {system}"
    assert stage.managed_file({stage.MANAGED_ENV_VAR: "  "}) == system
    named = tmp_path / "named.yaml"             # the user's variable cannot lift the locks
    named.write_text("approvals:\n  mode: off\n")
    config = chain(stage, home, **{stage.MANAGED_ENV_VAR: str(named)})
    assert config["approvals.mode"] == "smart" and config.files == [system]
    system.unlink()
    assert stage.managed_file({stage.MANAGED_ENV_VAR: str(named)}) == named


# ── provenance ────────────────────────────────────────────────────────────

@pytest.mark.parametrize("argv,env,yaml,origin", [
    ((), {}, None, "default"),
    (("--approval-mode", "smart"), {}, None, "--approval-mode"),
    ((), {"HERMES_APPROVAL_MODE": "smart"}, None, "HERMES_APPROVAL_MODE"),
    ((), {}, "approvals:\n  mode: smart\n", "config.yaml:approvals.mode"),
    ((), {}, "approvals.mode: smart\n", "config.yaml:approvals.mode"),
    ((), {}, "approvals: {mode: smart}\n", "config.yaml:approvals.mode"),
    ((), {"HERMES_APPROVAL_MODE": ""}, None, "default"),           # empty: not set
    ((), {"HERMES_APPROVAL_MODE": "   "}, None, "default"),
])
def test_every_value_knows_where_it_came_from(stage, home, argv, env, yaml, origin):
    config = chain(stage, home, *argv, yaml=yaml, **env)
    assert config.origin("approvals.mode") == origin
    assert config["approvals.mode"] == ("manual" if origin == "default" else "smart")


def test_the_origin_reaches_the_permissions(stage, home, tmp_path):
    for argv, env, source in [(("--yolo",), {}, "--yolo"),
                              ((), {"HERMES_YOLO_MODE": "yes"}, "HERMES_YOLO_MODE")]:
        permissions = stage.permissions_from_config(chain(stage, home, *argv, **env))
        assert permissions.yolo_source == source
    config = chain(stage, home, "--approval-mode", "smart", "--approval-timeout", "9",
                   "--write-root", str(tmp_path),
                   yaml="approvals:\n  deny: ['rm -rf *']\ncommand_allowlist: [x_key]\n",
                   HERMES_YOLO_MODE="off")
    permissions = stage.permissions_from_config(config)
    assert (permissions.mode, permissions.yolo_source, permissions.timeout,
            permissions.write_root, permissions.deny_rules, permissions.config_allowlist) == \
        ("smart", None, 9, tmp_path.resolve(), ("rm -rf *",), frozenset({"x_key"}))


# ── validation: every error names its source ──────────────────────────────

# config.yaml text -> what follows "<file>:" in the error
FILE_ERRORS = [
    ("approvals:\n  timeout: soon\n", "2: approvals.timeout: expected whole seconds, got 'soon'"),
    ("approvals:\n  timeout: 1.5\n", "2: approvals.timeout: expected whole seconds, got '1.5'"),
    ("approvals:\n  timeout: 0x10\n", "2: approvals.timeout: expected whole seconds, got '0x10'"),
    ("max_iterations: 1.5\n", "1: max_iterations: expected a whole number, got '1.5'"),
    ("approvals:\n  timeout: 0\n", "2: approvals.timeout: must be from 1 to 3,600 seconds, got 0"),
    ("memory:\n  memory_chars: 99\n",
     "2: memory.memory_chars: must be from 100 to 100,000, got 99"),
    ("compression:\n  threshold: nan\n", "2: compression.threshold: expected a number, got 'nan'"),
    ("compression:\n  threshold: half\n",
     "2: compression.threshold: expected a number, got 'half'"),
    ("compression:\n  threshold: 0.99\n",
     "2: compression.threshold: must be from 0.1 to 0.95, got 0.99"),
    ("approvals:\n  yolo: maybe\n", "2: approvals.yolo: expected true or false, got 'maybe'"),
    ("approvals:\n  mode: never\n",
     "2: approvals.mode: expected one of manual, smart, off, got 'never'"),
    ("approvals:\n  mode: no\n", "2: approvals.mode: expected one of manual, smart, off, got 'no'"),
    ("delegation:\n  child_approvals: always\n",
     "2: delegation.child_approvals: expected one of deny, once, got 'always'"),
    ("write_root: /no/such/folder\n",
     "1: write_root: expected an existing folder, got '/no/such/folder'"),
    ("toolsets: [terminal, nope, zilch]\n", "1: toolsets: unknown 'nope'; known: "),
    ("disabled_toolsets: nope\n", "1: disabled_toolsets: unknown 'nope'; known: "),
    ("guardrails:\n  exact_failure: [5, 3]\n", "2: guardrails.exact_failure: the first number "
     "(warn at) must be below the second (stop at), got 5, 3"),
    ("guardrails:\n  exact_failure: [4, 4]\n", "2: guardrails.exact_failure: the first number "
     "(warn at) must be below the second (stop at), got 4, 4"),
    ("guardrails:\n  exact_failure: 1\n", "2: guardrails.exact_failure: expected two whole "
     "numbers: warn at, stop at, got 1"),
    ("guardrails:\n  exact_failure: [1, 2, 3]\n", "2: guardrails.exact_failure: expected two "
     "whole numbers: warn at, stop at, got 1, 2, 3"),
    ("guardrails:\n  exact_failure: [a, 5]\n", "2: guardrails.exact_failure: expected two whole "
     "numbers: warn at, stop at, got a, 5"),
    ("guardrails:\n  exact_failure: []\n", "2: guardrails.exact_failure: expected two whole "
     "numbers: warn at, stop at, got nothing"),
    ("guardrails:\n  exact_failure: [1, 200]\n",
     "2: guardrails.exact_failure: must be from 1 to 100, got 200"),
    ("guardrails:\n  exact_failure: [0, 5]\n",
     "2: guardrails.exact_failure: must be from 1 to 100, got 0"),
    ("model: [a, b]\n", "1: model: expected text, got a list"),
    ("approvals:\n  mode: [manual]\n",
     "2: approvals.mode: expected one of manual, smart, off, got a list"),
    ("model:\n", "1: model: expected text, got no value"),
    ("model: ~\n", "1: model: expected text, got no value"),
    ("model: ''\n", "1: model: is empty"),
    ("model:\n  name: x\n", "1: model: expected text, got a section"),
    ("approvals:\n  deny: [[rm]]\n", "2: approvals.deny: item 1 of the list is a list: each "
     "item must be a plain value"),
    ("approvals:\n  deny: [a, ~]\n", "2: approvals.deny: item 2 of the list is empty: each "
     "item must be a plain value"),
    ("guardrails:\n  exact_failure: [1, {a: b}]\n", "2: guardrails.exact_failure: item 2 of the "
     "list is a section: each item must be a plain value"),
    ("model: [a, ~]\n", "1: model: expected text, got a list"),
    pytest.param("approvals: off\n", "1: approvals is a section, not a setting: put its keys "
                 "under it (approvals.mode, approvals.timeout, approvals.yolo, ...)",
                 marks=pytest.mark.hardening),          # teaching: an unknown key, ignored
    ("approvals:\n  deny:\n    a: 3\n", "2: approvals.deny: expected a list, got a section"),
    # ${VAR} and a key given twice: the hardened edition's (the teaching one reads the
    # text as written, and the last of two keys wins).
    pytest.param("model: ${NOT_SET_ANYWHERE}\n", "1: model: ${NOT_SET_ANYWHERE} is not set",
                 marks=pytest.mark.hardening),
    pytest.param("approvals:\n  deny: ['rm ${NOT_SET_ANYWHERE}']\n",
                 "2: approvals.deny: ${NOT_SET_ANYWHERE} is not set", marks=pytest.mark.hardening),
    pytest.param("# settings\nmodel: a\nmodel: b\n", "3: model is given twice (first on line 2)",
                 marks=pytest.mark.hardening),
    pytest.param("approvals:\n  mode: off\napprovals:\n  yolo: true\n",   # teaching: merged
                 "3: approvals is given twice (first on line 1)", marks=pytest.mark.hardening),
    ("? [a, b]\n: 1\n", "1: a key must be a plain name"),
    ("- model: a\n", "1: expected settings (key: value lines), got a list"),
    ("\nhello\n", "2: expected settings (key: value lines), got 'hello'"),
    pytest.param("a: {b: {c: {d: {e: 1}}}}\n", "1: sections nested more than 4 deep",
                 marks=pytest.mark.hardening),
    ("model: x\napprovals:\n  mode: [manual\n", "4: not valid YAML (expected ',' or ']', "
     "but got '<stream end>')"),
    ("model: a\n  bad indent: b\n", "2: not valid YAML (mapping values are not allowed here)"),
    ("---\nmodel: a\n---\nmodel: b\n", "3: not valid YAML (but found another document)"),
    ("model: 'open\n", "2: not valid YAML (found unexpected end of stream)"),
    ("model: \"\\q\"\n", "1: not valid YAML (found unknown escape character 'q')"),
]


# A value or a file of the wrong shape: both editions refuse it with the file, the line,
# the key and what was expected; the hardened edition's words also name what it got
# ("got a section", "item 2 of the list is empty"), so those rows of FILE_ERRORS are its own.
SHAPE_ERRORS = {
    "model:\n": "1: model: expected text",
    "model: ~\n": "1: model: expected text",
    "model:\n  name: x\n": "1: model: expected text",
    "approvals:\n  deny: [[rm]]\n": "2: approvals.deny: ",
    "approvals:\n  deny: [a, ~]\n": "2: approvals.deny: ",
    "guardrails:\n  exact_failure: [1, {a: b}]\n": "2: guardrails.exact_failure: ",
    "model: [a, ~]\n": "1: model: expected text",
    "approvals:\n  deny:\n    a: 3\n": "2: approvals.deny: expected a list",
    "- model: a\n": "1: expected settings (key: value lines)",
    "\nhello\n": "2: expected settings (key: value lines)",
}
FILE_ERROR_CASES = [pytest.param(*row, marks=pytest.mark.hardening)
                    if isinstance(row, tuple) and row[0] in SHAPE_ERRORS else row
                    for row in FILE_ERRORS]


@pytest.mark.parametrize("text,message", FILE_ERROR_CASES, ids=range(len(FILE_ERRORS)))
def test_a_bad_config_file_is_an_error_with_file_and_line(stage, home, text, message):
    error = chain_error(stage, home, yaml=text)
    assert error.startswith(f"{home / 'config.yaml'}:{message}"), error
    assert "\n" not in error


@pytest.mark.parametrize("text,message", SHAPE_ERRORS.items(), ids=range(len(SHAPE_ERRORS)))
def test_a_value_of_the_wrong_shape_is_an_error_with_file_and_line(stage, home, text,
                                                                    message):
    error = chain_error(stage, home, yaml=text)
    assert error.startswith(f"{home / 'config.yaml'}:{message}"), error
    assert "\n" not in error


@pytest.mark.parametrize("argv,env,message", [
    ((), {"HERMES_APPROVAL_TIMEOUT": "soon"},
     "HERMES_APPROVAL_TIMEOUT: approvals.timeout: expected whole seconds, got 'soon'"),
    ((), {"HERMES_YOLO_MODE": "maybe"},
     "HERMES_YOLO_MODE: approvals.yolo: expected true or false, got 'maybe'"),
    ((), {"HERMES_APPROVAL_MODE": "auto"},
     "HERMES_APPROVAL_MODE: approvals.mode: expected one of manual, smart, off, got 'auto'"),
    ((), {"HERMES_TOOLSETS": "terminal,web"},
     "HERMES_TOOLSETS: toolsets: unknown 'web'; known: "),
    ((), {"OPENAI_MODEL": "  "}, None),                        # blank: not set at all
    (("--approval-timeout", "3601"), {},
     "--approval-timeout: approvals.timeout: must be from 1 to 3,600 seconds, got 3,601"),
    (("--max-retries", "-1"), {}, "--max-retries: retries.max: must be from 0 to 10, got -1"),
    (("--model", " "), {}, "--model: model: is empty"),
    (("--write-root", "no-such-folder"), {},
     "--write-root: write_root: expected an existing folder, got 'no-such-folder'"),
    (("--profile", "Work"), {}, "--profile: expected a name of a-z, 0-9, - and _ (at most "
     "64 characters, first a letter or digit), got 'Work'"),
])
def test_a_bad_variable_or_flag_is_an_error_that_names_it(stage, home, argv, env, message):
    if message is None:
        assert changed(chain(stage, home, *argv, **env)) == {}
    else:
        assert chain_error(stage, home, *argv, **env).startswith(message)


def test_write_root_must_be_a_folder_not_a_file(stage, home):
    (home / "notes.txt").write_text("x", encoding="utf-8")
    assert chain_error(stage, home, "--write-root", str(home / "notes.txt")) == (
        f"--write-root: write_root: expected an existing folder, got '{home / 'notes.txt'}'")
    assert chain(stage, home, "--write-root", str(home))["write_root"] == home.resolve()


def test_every_bad_value_is_reported_not_only_the_first(stage, home):
    error = chain_error(stage, home, "--max-iterations", "0",
                        yaml="approvals:\n  timeout: soon\n", HERMES_YOLO_MODE="maybe")
    assert error.splitlines() == [
        f"{home / 'config.yaml'}:2: approvals.timeout: expected whole seconds, got 'soon'",
        "HERMES_YOLO_MODE: approvals.yolo: expected true or false, got 'maybe'",
        "--max-iterations: max_iterations: must be from 1 to 1,000, got 0"]


@pytest.mark.parametrize("key", RANGES)
def test_each_range_holds_at_both_ends(stage, home, key):
    if not has_setting(stage, key):
        return
    low, high = RANGES[key]
    pair = key.startswith("guardrails.")

    def value(number, other):
        return f"[{number}, {other}]" if pair else str(number)

    inside = [value(low, low + 1), value(high - 1, high)] if pair else [value(low, 0),
                                                                         value(high, 0)]
    for text in inside:
        chain(stage, home, yaml=nested(key, text))
    for text, shown in [(value(low - 1, low + 1) if pair else value(low - 1, 0), low - 1),
                        (value(high - 1, high + 1) if pair else value(high + 1, 0),
                         high + 1)]:
        assert f": {key}: must be from {low:,} to {high:,}" in \
            chain_error(stage, home, yaml=nested(key, text))
        assert chain_error(stage, home, yaml=nested(key, text)).endswith(f"got {shown:,}")


def test_the_threshold_range_holds_at_both_ends(stage, home):
    for text in ("0.1", "0.95"):
        assert chain(stage, home, HERMES_COMPRESSION_THRESHOLD=text)[
            "compression.threshold"] == float(text)
    for text in ("0.09", "0.96", "inf"):
        assert "compression.threshold: must be from 0.1 to 0.95" in \
            chain_error(stage, home, HERMES_COMPRESSION_THRESHOLD=text)
    assert chain_error(stage, home, HERMES_COMPRESSION_THRESHOLD="1").endswith(
        "must be from 0.1 to 0.95, got 1.0")                   # a float, also when whole


def test_a_file_that_is_not_text_is_refused(stage, home):
    path = home / "config.yaml"
    path.write_bytes(b"model: caf\xe9\n")
    assert chain_error(stage, home).startswith(f"{path}: cannot be read (")
    path.unlink()
    path.mkdir()
    assert chain_error(stage, home).startswith(f"{path}: ")


@pytest.mark.hardening
def test_a_file_too_large_or_not_a_file_or_not_text_is_refused(stage, home):
    path = home / "config.yaml"
    limit = stage.MAX_CONFIG_BYTES
    assert limit == 256 * 1024
    path.write_text("#" * (limit - 1) + "\n")               # exactly the limit: read
    assert changed(chain(stage, home)) == {}
    path.write_text("#" * limit + "\n")
    assert chain_error(stage, home) == \
        f"{path}: not a regular file of at most 262,144 bytes"
    path.unlink()
    path.mkdir()
    assert chain_error(stage, home) == f"{path}: not a regular file of at most 262,144 bytes"
    path.rmdir()
    path.write_bytes(b"model: caf\xe9\n")
    assert chain_error(stage, home).startswith(f"{path}: cannot be read (")


@pytest.mark.hardening
def test_four_levels_of_sections_are_read_five_are_refused(stage, home):
    assert stage.MAX_CONFIG_DEPTH == 4
    config = chain(stage, home, yaml="a:\n  b:\n    c:\n      d: 1\n")
    assert config.warnings == [f"warning: {home / 'config.yaml'}:4: unknown key 'a.b.c.d'; "
                               f"ignored"]
    assert chain_error(stage, home, yaml="a:\n  b:\n    c:\n      d:\n        e: 1\n") == \
        f"{home / 'config.yaml'}:5: sections nested more than 4 deep"


@pytest.mark.hardening
def test_a_dotted_key_and_its_section_are_the_same_key(stage, home):
    error = chain_error(stage, home, yaml="approvals.mode: manual\napprovals:\n  mode: off\n")
    assert error == f"{home / 'config.yaml'}:3: approvals.mode is given twice (first on line 1)"


# ── main: a bad configuration never starts ────────────────────────────────

def test_a_bad_configuration_refuses_to_start_and_changes_nothing(stage, home, work):
    (home / "config.yaml").write_text("approvals:\n  mode: off\n  timeout: soon\n")
    for argv in (("--offline", "-p", "$ touch started"), ("--show-config",)):
        result = run_main(stage, *argv, env=clean_env(HERMES_YOLO_MODE="perhaps"))
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"error: {home / 'config.yaml'}:3: approvals.timeout: expected whole seconds, "
            f"got 'soon'",
            "error: HERMES_YOLO_MODE: approvals.yolo: expected true or false, got 'perhaps'"]
        assert result.stdout == ""
    assert sorted(p.name for p in home.iterdir()) == ["config.yaml"]    # no state.db
    assert list(work.iterdir()) == []


def test_a_yaml_syntax_error_refuses_to_start_with_file_and_line(stage, home):
    (home / "config.yaml").write_text("approvals:\n  mode: manual\n yolo: true\n")
    result = run_main(stage, "--offline", "-p", "hi")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {home / 'config.yaml'}:3: not valid YAML (")
    assert "offline model" not in result.stderr


def test_a_bad_profile_name_refuses_to_start(stage, home):
    for name in ("../x", "Work", "-x", "a" * 65, "a/b", "work\n", ""):
        result = run_main(stage, f"--profile={name}", "--show-config")
        assert result.returncode == 2, name
        assert result.stderr.startswith("error: --profile: expected a name of a-z")
    assert list(home.iterdir()) == []
    for name in ("a" * 64, "work_2-b", "0"):
        assert run_main(stage, "--profile", name, "--show-config").returncode == 0


# ── unknown keys ──────────────────────────────────────────────────────────

@pytest.mark.parametrize("text,warning", [
    ("aprovals:\n  mode: manual\n", "2: unknown key 'aprovals.mode' (did you mean "
     "'approvals.mode'?); ignored"),
    ("modle: x\n", "1: unknown key 'modle' (did you mean 'model'?); ignored"),
    ("approvals:\n  timout: 5\n", "2: unknown key 'approvals.timout' (did you mean "
     "'approvals.timeout'?); ignored"),
    ("# mine\nmax_iteration: 3\n", "2: unknown key 'max_iteration' (did you mean "
     "'max_iterations'?); ignored"),
    ("colour: blue\n", "1: unknown key 'colour'; ignored"),
])
def test_an_unknown_key_is_a_warning_with_a_suggestion(stage, home, text, warning):
    config = chain(stage, home, yaml=text)
    wanted = f"warning: {home / 'config.yaml'}:{warning}"
    assert config.warnings == [as_the_edition_words_it(stage, wanted)]
    assert changed(config) == {}


def test_main_shows_the_unknown_key_warning_and_starts(stage, home):
    (home / "config.yaml").write_text("model: m\napprovals:\n  mod: off\n")
    result = run_main(stage, "--show-config")
    assert result.returncode == 0
    assert result.stderr == as_the_edition_words_it(
        stage, f"warning: {home / 'config.yaml'}:3: unknown key 'approvals.mod' "
               f"(did you mean 'approvals.mode'?); ignored\n")
    assert ("approvals.mode", "manual", "default") in table(result.stdout)


def test_a_refused_start_shows_the_warnings_before_the_errors(stage, home):
    (home / "config.yaml").write_text("aprovals:\n  mode: off\napprovals:\n  timeout: soon\n")
    result = run_main(stage, "--show-config")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == as_the_edition_words_it(
        stage,
        f"warning: {home / 'config.yaml'}:2: unknown key 'aprovals.mode' (did you mean "
        f"'approvals.mode'?); ignored\n"
        f"error: {home / 'config.yaml'}:4: approvals.timeout: expected whole seconds, got "
        f"'soon'\n")


# ── YAML edge cases ───────────────────────────────────────────────────────

@pytest.mark.parametrize("text,key,value", [
    ("approvals:\n  mode: off\n", "approvals.mode", "off"),          # YAML 1.1 would say False
    ("approvals:\n  mode: OFF\n", "approvals.mode", "off"),
    ("approvals:\n  mode: 'off'\n", "approvals.mode", "off"),
    ("approvals:\n  mode: Smart\n", "approvals.mode", "smart"),
    ("approvals:\n  yolo: no\n", "approvals.yolo", False),
    ("approvals:\n  yolo: off\n", "approvals.yolo", False),
    ("approvals:\n  yolo: 0\n", "approvals.yolo", False),
    ("approvals:\n  yolo: FALSE\n", "approvals.yolo", False),
    ("approvals:\n  yolo: on\n", "approvals.yolo", True),
    ("approvals:\n  yolo: Yes\n", "approvals.yolo", True),
    ("approvals:\n  yolo: 1\n", "approvals.yolo", True),
    ("approvals:\n  yolo: true\n", "approvals.yolo", True),
    ("approvals: {timeout: 45}\n", "approvals.timeout", 45),
    ("approvals:\n  timeout: !!int 45\n", "approvals.timeout", 45),
    ("approvals:\n  timeout: '45'\n", "approvals.timeout", 45),
    ("approvals:\n  timeout: +45\n", "approvals.timeout", 45),
    ("model: 0123\n", "model", "0123"),                             # text as written
    ("model: 1.10\n", "model", "1.10"),
    ("model: null-model\n", "model", "null-model"),
    ("model: '  padded  '\n", "model", "padded"),
    ("compression:\n  threshold: 5e-1\n", "compression.threshold", 0.5),
    ("toolsets: [terminal, file, terminal]\n", "toolsets", ["terminal", "file"]),
    ("toolsets:\n  - terminal\n  - file\n", "toolsets", ["terminal", "file"]),
    ("toolsets: 'terminal, ,file'\n", "toolsets", ["terminal", "file"]),
    ("toolsets: []\n", "toolsets", []),
    ("guardrails:\n  exact_failure: '3, 7'\n", "guardrails.exact_failure", [3, 7]),
    ("approvals:\n  deny: 'rm -rf *'\n", "approvals.deny", ["rm -rf *"]),
    ("model: &m shared\nfallback:\n  model: *m\n", "fallback.model", "shared"),
])
def test_yaml_values_are_read_as_written(stage, home, text, key, value):
    config = chain(stage, home, yaml=text)
    assert config[key] == value and type(config[key]) is type(value)
    assert config.origin(key) == f"config.yaml:{key}" and config.warnings == []


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "~\n", "null\n", "---\n",
                                  "{}\n"])
def test_an_empty_file_is_all_defaults(stage, home, text):
    config = chain(stage, home, yaml=text)
    assert changed(config) == {} and config.warnings == []
    assert config.files == [home / "config.yaml"]


@pytest.mark.hardening
def test_variables_are_expanded_in_text_and_lists(stage, home):
    config = chain(stage, home, yaml="model: ${MODEL_NAME}\nbase_url: http://${HOST}:8080/v1\n"
                                     "approvals:\n  deny: ['rm -rf ${BUILD}/*', '$BUILD']\n"
                                     "api_key: ${MY_KEY}\n",
                   MODEL_NAME="team-model", HOST="127.0.0.1", BUILD="out", MY_KEY="sk-from-env")
    assert changed(config) == {
        "model": ("team-model", "config.yaml:model"),
        "base_url": ("http://127.0.0.1:8080/v1", "config.yaml:base_url"),
        "approvals.deny": (["rm -rf out/*", "$BUILD"], "config.yaml:approvals.deny"),
        "api_key": ("sk-from-env", "config.yaml:api_key")}
    assert chain_error(stage, home, yaml="model: ${EMPTY}\n", EMPTY="") == \
        f"{home / 'config.yaml'}:1: model: is empty"


@pytest.mark.hardening
def test_variables_are_expanded_in_the_managed_file_too(stage, home):
    config = chain(stage, home, managed="approvals:\n  timeout: ${LIMIT}\n", LIMIT="15")
    assert config[TIMEOUT] == 15
    assert "${NOPE} is not set" in chain_error(stage, home, managed="model: ${NOPE}\n")


# ── --show-config and /config ─────────────────────────────────────────────

def test_show_config_prints_one_row_per_key_and_exits(stage, isolated_home):
    home = isolated_home
    result = run_main(stage, "--show-config")
    assert result.returncode == 0 and result.stderr == ""
    rows = table(result.stdout)
    assert [row[0] for row in rows] == [setting.key for setting in stage.SETTINGS]
    assert {row[2] for row in rows[1:]} == {"default"}
    assert model_row(result.stdout) == offline("no OPENAI_API_KEY or OPENAI_BASE_URL")
    header = next(line for line in result.stdout.splitlines() if line.startswith("┃"))
    assert header.strip("┃ ").split() == ["key", "/", "$variable", "┃", "value", "┃", "source"]
    assert ("approvals.timeout", "60", "default") in rows
    assert ("approvals.yolo", "false", "default") in rows
    assert ("approvals.deny", "(empty)", "default") in rows
    assert ("base_url", "(none)", "default") in rows
    assert ("guardrails.same_tool_failure", "3, 8", "default") in rows
    assert result.stdout.startswith(stage.CHAIN_ORDER)
    if "hardened" in stage.__file__:           # it lists the files it read too
        assert result.stdout.splitlines()[-3:] == [
            f"config file:  {home / 'config.yaml'} (not there: defaults)",
            f"managed file: none ({stage.MANAGED_ENV_VAR} unset)",
            f"home:         {home}"]
    else:
        assert result.stdout.rstrip().endswith("┘")      # the table is the last thing
    assert not home.exists()                    # nothing was started, nothing written


def test_show_config_with_every_layer_set(stage, home, tmp_path):
    (home / "config.yaml").write_text("approvals:\n  deny: ['rm -rf *']\nmodel: from-file\n"
                                      f"write_root: {tmp_path}\n")
    managed = tmp_path / "managed.yaml"
    managed.write_text("delegation:\n  child_approvals: deny\n")
    result = run_main(stage, "--show-config", "--max-iterations", "9", "--profile", "p1",
                      env=clean_env(HERMES_APPROVAL_MODE="smart",
                                    **{stage.MANAGED_ENV_VAR: str(managed)}))
    rows = table(result.stdout)
    assert result.returncode == 0
    assert ("max_iterations", "9", "--max-iterations") in rows
    assert ("approvals.mode", "smart", "HERMES_APPROVAL_MODE") in rows
    assert ("delegation.child_approvals", "deny", "managed:delegation.child_approvals") in rows
    # The profile has its own file: its model is the default, but no key and no endpoint
    # are set, so the offline model answers.
    assert model_row(result.stdout) == offline("no OPENAI_API_KEY or OPENAI_BASE_URL")
    profile = home / "profiles" / "p1"
    if "hardened" in stage.__file__:
        assert result.stdout.splitlines()[-3:] == [
            f"config file:  {profile / 'config.yaml'} (not there: defaults)",
            f"managed file: {managed}", f"home:         {profile} (profile p1)"]
    (profile).mkdir(parents=True)
    (profile / "config.yaml").write_text("approvals:\n  deny: ['rm -rf *']\n"
                                         f"write_root: {tmp_path}\n")
    rows = table(run_main(stage, "--show-config", "--profile", "p1").stdout)
    assert ("approvals.deny", "rm -rf *", "config.yaml:approvals.deny") in rows
    assert ("write_root", str(tmp_path.resolve()), "config.yaml:write_root") in rows


def test_show_config_never_prints_the_key(stage, home):
    result = run_main(stage, "--show-config", env=clean_env(OPENAI_API_KEY="sk-secret-4242"))
    assert ("api_key", "(set, hidden)", "OPENAI_API_KEY") in table(result.stdout)
    (home / "config.yaml").write_text("api_key: ${TEAM_KEY}\n")
    result = run_main(stage, "--show-config", env=clean_env(TEAM_KEY="sk-team-9999"))
    assert ("api_key", "(set, hidden)", "config.yaml:api_key") in table(result.stdout)
    (home / "config.yaml").write_text("api_key: sk-typed-7777\n")
    for argv in (("--show-config",), ("--offline", "-p", "config")):
        for env in (clean_env(OPENAI_API_KEY="sk-secret-4242"), clean_env()):
            result = run_main(stage, *argv, env=env)
            for secret in ("sk-secret-4242", "sk-team-9999", "sk-typed-7777", "sk-"):
                assert secret not in result.stdout + result.stderr
    assert "  api_key = (set, hidden)   (config.yaml:api_key)" in result.stdout


def test_slash_config_in_the_repl_and_the_config_verb(stage, home, work):
    (home / "config.yaml").write_text("approvals:\n  timeout: 45\n")
    result = run_main(stage, "--offline", stdin="/config\nconfig\n/help\n")
    assert result.returncode == 0
    prompt = f"{stage.STAGE}> "
    shown = result.stdout.split(prompt + "/config\n")[1].split(prompt + "config\n")[0]
    assert ("approvals.timeout", "45", "config.yaml:approvals.timeout") in table(shown)
    assert [row[0] for row in table(shown)] == [s.key for s in stage.SETTINGS]
    answer = result.stdout.split(prompt + "config\n")[1].split(prompt)[0]
    assert answer.splitlines()[:3] == [
        f"Who decides a setting? {stage.CHAIN_ORDER}", "Set in this run:",
        "  approvals.timeout = 45   (config.yaml:approvals.timeout)"]
    assert "/config        every setting, its value and where it came from" in result.stdout
    (home / "config.yaml").unlink()
    answer = run_main(stage, "--offline", "-p", "config").stdout
    assert answer.splitlines()[1] == "Every setting has its default."


def model_row(stdout: str) -> tuple[str, str]:
    """The model row's value and source, the source without spaces: a folded cell loses
    the space where it was wrapped."""
    value, source = next(row[1:3] for row in table(stdout) if row[0] == "model")
    return value, "".join(source.split())


def offline(why: str) -> tuple[str, str]:
    return "offline", "".join(f"{why}: the built-in offline model".split())


def test_help_and_show_config_name_every_way_to_set_a_value(stage, isolated_home):
    """A flag's help names the key and the variable; --show-config names the variable of
    every setting that has one: the flag, the variable and config.yaml are all findable."""
    shown = run_main(stage, "--help", env=clean_env(COLUMNS="300")).stdout
    assert "(max_iterations, $HERMES_MAX_ITERATIONS; default 30)" in shown
    for setting in stage.SETTINGS:
        if setting.flag:
            variable = f", ${setting.env}" if setting.env else ""
            assert f"({setting.key}{variable}; default " in shown, setting.key
    rows = full_table(run_main(stage, "--show-config").stdout)
    assert {row[0]: row[3] for row in rows} == {s.key: s.env or "" for s in stage.SETTINGS}
    assert ("max_iterations", "30", "default", "HERMES_MAX_ITERATIONS") in rows
    assert ("approvals.deny", "(empty)", "default", "") in rows


def test_show_config_and_slash_config_name_the_offline_model(stage, home, work):
    """While the offline model answers, the model row says so, not the unused name."""
    no_endpoint = offline("no OPENAI_API_KEY or OPENAI_BASE_URL")
    assert model_row(run_main(stage, "--show-config").stdout) == no_endpoint
    keyed = clean_env(OPENAI_API_KEY="sk-test-1234")
    assert model_row(run_main(stage, "--show-config", env=keyed).stdout) == \
        ("gpt-4o-mini", "default")
    assert model_row(run_main(stage, "--offline", "--show-config", env=keyed).stdout) == \
        offline("--offline")
    (home / "config.yaml").write_text("model: from-file\n")
    assert model_row(run_main(stage, "--offline", stdin="/config\n", env=keyed).stdout) == \
        offline("--offline")
    assert model_row(run_main(stage, stdin="/config\n").stdout) == no_endpoint
    assert model_row(run_main(stage, "--show-config", env=keyed).stdout) == \
        ("from-file", "config.yaml:model")


def test_without_main_there_is_no_configuration_to_show(stage, capsys):
    assert stage.CONFIG is None
    stage.show_config(None)
    stage.config_command(None, "")
    assert capsys.readouterr().out == \
        "no configuration: the agent was not started by main()\n" * 2
    assert stage.describe_config() == \
        "No configuration was loaded: the agent was not started by main()."


def test_the_flags_are_made_from_the_table(stage):
    result = run_main(stage, "--help", env=clean_env(COLUMNS="200"))
    assert result.returncode == 0
    for usage in ("[--approval-mode {manual,smart,off}]", "[--approval-timeout SECONDS]",
                  "[--max-iterations INT]", "[--toolsets LIST]", "[--write-root FOLDER]",
                  "[--yolo]", "[--config PATH]", "[--profile NAME]", "[--show-config]",
                  "[--child-budget {shared,independent}]", "[--model STR]"):
        assert usage in result.stdout
    assert "(approvals.timeout, $HERMES_APPROVAL_TIMEOUT; default 60)" in result.stdout
    assert "(approvals.yolo, $HERMES_YOLO_MODE; default false)" in result.stdout
    assert stage.parse_args(["--yolo"]).__dict__["approvals.yolo"] == "true"
    assert stage.parse_args([]).__dict__["approvals.yolo"] is None


# ── settings reach the agent ──────────────────────────────────────────────

def test_start_with_applies_the_limits(stage, home, limits_restored):
    config = chain(stage, home, yaml="compression:\n  threshold: 0.7\nmemory:\n  memory_chars: "
                   "500\n  user_chars: 400\ndelegation:\n  max_child_iterations: 4\n"
                   "guardrails:\n  exact_failure: [6, 7]\n  same_tool_failure: [8, 9]\n"
                   + ("  no_progress: [3, 4]\n" if has_setting(stage, NO_PROGRESS) else ""))
    stage.start_with(config)
    assert stage.CONFIG is config
    assert (stage.COMPRESSION_THRESHOLD, stage.MEMORY_CHAR_LIMIT, stage.USER_CHAR_LIMIT,
            stage.MAX_CHILD_ITERATIONS) == (0.7, 500, 400, 4)
    assert stage.GUARDRAIL_THRESHOLDS == {"exact_failure": (6, 7), "same_tool_failure": (8, 9),
                                          **({"no_progress": (3, 4)} if has_setting(
                                              stage, NO_PROGRESS) else {})}
    description = stage.MEMORY_ENTRY.schema["function"]["description"]
    assert "at most 500 characters" in description and "at most 400)" in description
    assert os.environ["LEARN_HERMES_HOME"] == str(home)        # no profile: the same home


def test_a_memory_limit_from_config_yaml_holds_in_the_agent(stage, home, work,
                                                            limits_restored):
    (home / "config.yaml").write_text("memory:\n  memory_chars: 100\n")
    result = run_main(stage, "--offline", "-p", "remember " + "x" * 120)
    assert "100" in result.stdout and "Saved in" not in result.stdout
    assert not (home / "memories" / "MEMORY.md").exists()
    stage.apply_limits(chain(stage, home, yaml="# defaults\n"))
    result = run_main(stage, "--offline", "-p", "remember " + "x" * 120)
    assert "Saved in" in result.stdout


def test_retries_fallback_and_delegation_come_from_the_chain(stage, home):
    with FakeOpenAI([reply("hi")]) as server:
        config = chain(stage, home, "--max-retries", "1", "--fallback-model", "backup",
                       "--child-budget", "independent", "--heartbeat-interval", "7",
                       yaml="delegation:\n  stale_beats: 3\n  child_approvals: once\n")
        session = stage.Session(None, "m", server.url, 5, [], None)
        policy = stage.retry_policy_from_config(config, session)
        assert (policy.max_retries, policy.fallback_model) == (1, "backup")
        assert policy.fallback_client is session.client         # the same endpoint
        elsewhere = chain(stage, home, "--fallback-base-url", server.url, yaml="# none\n")
        policy = stage.retry_policy_from_config(elsewhere, session)
        assert str(policy.fallback_client.base_url).rstrip("/") == server.url
        assert policy.fallback_model is None and policy.max_retries == 3
        assert stage.retry_policy_from_config(chain(stage, home), session).fallback_client \
            is None
    delegation = stage.delegation_settings_from_config(config)
    assert vars(delegation) == vars(stage.DelegationSettings("independent", "once", 7, 3))


def test_main_hands_the_chain_to_the_session(stage, home, work):
    (home / "config.yaml").write_text("max_iterations: 2\ntoolsets: [terminal]\n")
    looping = [reply("", call("terminal", {"command": "true"}))] * 3
    result, server = agent_run(stage, looping, "--model", "chain-model")
    assert len(server.requests) == 2                    # max_iterations from config.yaml
    assert {r["model"] for r in server.requests} == {"chain-model"}
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {"terminal"}
    assert "reached its limit of 2 model call(s)" in result.stdout


# ── profiles ──────────────────────────────────────────────────────────────

def prompt_of(stage, *argv) -> str:
    """The system prompt a run with these flags sends."""
    result, server = agent_run(stage, [reply("ok")], *argv)
    assert result.returncode == 0, result.stderr
    return server.requests[0]["messages"][0]["content"]


def test_a_profile_has_its_own_sessions_and_memory(stage, home, work):
    fact = "the build of project zeta uses make"
    result = run_main(stage, "--offline", "--profile", "work", "-p", f"remember {fact}")
    assert result.returncode == 0 and "Saved in" in result.stdout
    profile = home / "profiles" / "work"
    assert fact in (profile / "memories" / "MEMORY.md").read_text()
    assert stat.S_IMODE(profile.stat().st_mode) == 0o700
    assert sorted(p.name for p in home.iterdir()) == ["profiles"]   # nothing in the base
    assert (profile / "state.db").exists()
    for argv in (("--profile", "fresh"), ()):
        result = run_main(stage, "--offline", *argv, "--continue", "-p", "context")
        assert result.returncode == 1
        assert "there are no saved sessions yet" in result.stderr
    resumed = run_main(stage, "--offline", "--profile", "work", "--continue", "-p", "context")
    assert resumed.returncode == 0 and "[resumed session " in resumed.stdout
    assert fact in prompt_of(stage, "--profile", "work")
    assert fact not in prompt_of(stage, "--profile", "other")
    assert fact not in prompt_of(stage)


def test_a_profile_has_its_own_config_and_allowlist(stage, home, work):
    (home / "config.yaml").write_text("approvals:\n  timeout: 45\n")
    keys = sorted(f.key for f in stage.detect_dangerous_command("rm -rf build"))
    (home / "allowlist.json").write_text(json.dumps({"version": 1, "keys": keys}))
    profile = home / "profiles" / "work"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text("approvals:\n  timeout: 12\n")
    assert ("approvals.timeout", "12", "config.yaml:approvals.timeout") in \
        table(run_main(stage, "--show-config", "--profile", "work").stdout)
    assert ("approvals.timeout", "45", "config.yaml:approvals.timeout") in \
        table(run_main(stage, "--show-config").stdout)
    turns = [reply("", call("terminal", {"command": "rm -rf build"}, "c0")), reply("done")]
    _, server = agent_run(stage, turns)
    assert results(server)["c0"]["output"] == "stub rm\n"       # the base allowlist approves
    _, server = agent_run(stage, turns, "--profile", "work")
    assert results(server)["c0"]["error"].startswith("denied: no terminal to ask on")
    assert marks(work) == ["rm -rf build"]


def test_a_profile_has_its_own_skills(stage, home, work):
    folder = home / "skills" / "release-zeta"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: release-zeta\ndescription: Ship zeta.\n---\n"
                                     "1. Run pytest.\n")
    assert "release-zeta" in prompt_of(stage)
    assert "release-zeta" not in prompt_of(stage, "--profile", "work")


def test_the_home_is_restored_after_main(stage, home, monkeypatch):
    result = run_main(stage, "--offline", "--profile", "work", "-p", "hi")
    assert result.returncode == 0 and stage.CONFIG is None
    monkeypatch.setenv("LEARN_HERMES_HOME", "/elsewhere")
    stage.restore_home(None)
    assert "LEARN_HERMES_HOME" not in os.environ
    stage.CONFIG = chain(stage, home)
    stage.restore_home(str(home))
    assert os.environ["LEARN_HERMES_HOME"] == str(home) and stage.CONFIG is None


def test_start_with_a_profile_moves_the_home_for_commands(stage, home, limits_restored):
    config = chain(stage, home, "--profile", "team")
    assert (config.home, config.base) == (home / "profiles" / "team", home)
    stage.start_with(config)
    assert os.environ["LEARN_HERMES_HOME"] == str(home / "profiles" / "team")
    assert stage.hermes_home() == home / "profiles" / "team" and stage.base_home() == home
    assert stat.S_IMODE((home / "profiles" / "team").stat().st_mode) == 0o700


# ── deny rules, through the real loop ─────────────────────────────────────

DENY_TEXT = ("BLOCKED (deny rule): the user's rule 'rm -rf *' (approvals.deny) refuses this "
             "command. Nothing was executed. Deny rules hold even with --yolo or "
             "--approval-mode off. Do not retry it or a variant of it.")


@pytest.mark.parametrize("argv,env", [(("--yolo",), {}), (("--approval-mode", "off"), {}),
                                      ((), {"HERMES_YOLO_MODE": "1"}), ((), {})],
                         ids=["--yolo", "mode-off", "HERMES_YOLO_MODE", "manual"])
def test_a_deny_rule_blocks_before_yolo_and_mode_off(stage, home, work, argv, env):
    (home / "config.yaml").write_text("approvals:\n  deny: ['rm -rf *', 'make deploy*']\n")
    turns = [reply("", call("terminal", {"command": "rm -rf build"}, "c0"),
                   call("terminal", {"command": "make deploy --prod"}, "c1"),
                   call("terminal", {"command": "make test"}, "c2")), reply("done")]
    result, server = agent_run(stage, turns, *argv, env=env)
    found = results(server)
    assert found["c0"] == {"error": DENY_TEXT, "refused": True, "blocked": "deny-rule",
                           "rule": "rm -rf *"}
    assert found["c1"]["blocked"] == "deny-rule" and found["c1"]["rule"] == "make deploy*"
    assert found["c2"]["output"] == "stub make\n"                # not dangerous, no rule
    assert marks(work) == ["make test"]
    assert "approval needed" not in result.stderr             # nobody was asked
    assert pairing_problems(server.requests[-1]["messages"]) == []


def test_a_command_no_rule_matches_still_runs_with_yolo(stage, home, work):
    (home / "config.yaml").write_text("approvals:\n  yolo: true\n  deny: ['rm -rf *']\n")
    turns = [reply("", call("terminal", {"command": "rm -r build"}, "c0")), reply("done")]
    result, server = agent_run(stage, turns)
    assert results(server)["c0"]["output"] == "stub rm\n" and marks(work) == ["rm -r build"]
    assert "YOLO is on (config.yaml:approvals.yolo)" in result.stderr


def test_the_managed_deny_rules_hold_whatever_the_user_sets(stage, home, work, tmp_path):
    managed = tmp_path / "managed.yaml"
    managed.write_text("approvals:\n  deny: ['rm -rf *']\n")
    (home / "config.yaml").write_text("approvals:\n  deny: []\n  yolo: true\n")
    turns = [reply("", call("terminal", {"command": "rm -rf build"}, "c0")), reply("done")]
    _, server = agent_run(stage, turns, "--approval-mode", "off",
                          env={stage.MANAGED_ENV_VAR: str(managed)})
    assert results(server)["c0"]["rule"] == "rm -rf *" and marks(work) == []


@pytest.mark.hardening
def test_a_command_that_changes_a_config_file_of_the_chain_is_undone(stage, home, work,
                                                                     tmp_path):
    """Principle 2 (issue 22): the --config file is no name in the command (awk computes
    its path), so the detector finds nothing; the outcome check puts it back."""
    team = tmp_path / "team" / "team.yaml"
    team.parent.mkdir()
    team.write_text("approvals:\n  deny: ['rm -rf *']\n")
    command = ("awk 'BEGIN{print \"approvals: {mode: off}\" > "
               "(ENVIRON[\"TEAM\" \"DIR\"] \"/team.y\" \"aml\")}'")
    assert stage.detect_dangerous_command(command) == []
    turns = [reply("", call("terminal", {"command": command}, "c0")), reply("done")]
    _, server = agent_run(stage, turns, "--config", str(team), env={"TEAMDIR": str(team.parent)})
    refusal = results(server)["c0"]
    assert refusal["blocked"] == "self-protection" and refusal["changed"] == [str(team)]
    assert team.read_text() == "approvals:\n  deny: ['rm -rf *']\n"


@pytest.mark.parametrize("command,rule", [
    ("rm -rf build", "rm -rf *"),
    ("RM -RF build", "rm -rf *"),
    ("rm   -rf    build", "rm -rf *"),
    ("cd src && rm -rf build", "rm -rf *"),
    ("'rm' -rf build", "rm -rf *"),
    ("git push origin main", "git push*"),
    # commands inside other commands: only the hardened edition's parser reads them
    *[pytest.param(command, rule, marks=pytest.mark.hardening) for command, rule in (
        ("sh -c 'rm -rf build'", "rm -rf *"), ("echo $(rm -rf build)", "rm -rf *"),
        ("env X=1 git push", "git push*"))],
    ("rm -r build", None),
    ("git status", None),
    ("echo rm -rf build", None),                # a word in the text is not a command
    ("rm -rf build # git push now", "rm -rf *"),
    ("ls", None),
])
def test_deny_rules_match_the_command_and_each_command_it_runs(stage, command, rule):
    assert stage.deny_rule_matched(command, ("rm -rf *", "git push*")) == rule
    assert stage.deny_rule_matched(command, ()) is None


@pytest.mark.hardening
@pytest.mark.parametrize("rule,command,refused", [
    # rm's options in any order and spelling (defect 8 of issue 22)
    ("rm -rf *", "rm -fr build", True), ("rm -rf *", "rm -r -f build", True),
    ("rm -rf *", "rm --recursive --force build", True), ("rm -rf *", "rm -R -f build", True),
    ("rm -rf *", "rm --rec --for build", True), ("rm -rf *", "rm build -rf", True),
    ("rm -rf *", "sudo rm -fr build", True), ("rm -rf *", "rm -r build", False),
    ("rm -rf *", "rm --re build", False),       # --re: --recursive, or --remove-...?
    ("rm -rf /tmp/*", "rm -fr /tmp/cache", True), ("rm -rf /tmp/*", "rm -fr build", False),
    # git: its own options before the subcommand, the subcommand's after it
    ("git push --force*", "git push -f origin main", True),
    ("git push --force*", "git -c color.ui=never push --force", True),
    ("git push --force*", "git -C repo push --force-with-lease", True),
    ("git push --force*", "git push origin main", False),
    ("git push --force*", "git pull --force", False),
    ("git clean -fd", "git clean -d -f", True), ("git clean -fd", "git clean --force -d", True),
    ("git clean -fd", "git clean -n -d", False),
    # a subcommand as the first operand; more operands may follow
    ("terraform destroy", "terraform destroy -auto-approve", True),
    ("terraform destroy", "terraform plan", False),
    ("docker system prune*", "docker system prune -af", True),
    ("docker system prune*", "docker system df", False),
    # a rule that is not one command is text only
    ("curl * | sh", "curl -s x | sh", True), ("curl * | sh", "curl -s x", False),
])
def test_a_hardened_rule_is_read_as_a_command(stage, rule, command, refused):
    assert stage.deny_rule_matched(command, (rule,)) == (rule if refused else None)


@pytest.mark.hardening
def test_a_command_too_complex_to_read_matches_the_first_rule(stage):
    rules = ("curl *", "rm -rf *")
    limit = stage.MAX_COMMAND_CHARS
    assert stage.deny_rule_matched("echo " + "a" * (limit + 1 - 5), rules) == "curl *"
    assert stage.deny_rule_matched("echo " + "a" * (limit - 5), rules) is None
    deep = "echo " + "$(echo " * 20 + "x" + ")" * 20
    assert stage.commands_run(deep) is None
    assert stage.deny_rule_matched(deep, rules) == "curl *"
    assert stage.commands_run("sudo rm -rf x; ls -la") == ["rm -rf x", "ls -la"]


@pytest.mark.hardening
def test_a_deny_check_leaves_nothing_of_its_analysis_behind(stage, tmp_path, monkeypatch):
    """The paths (HOME read once) and the glob budget of one check belong to that check:
    afterwards, this thread's detector reads HOME again and has no budget to use up."""
    assert stage.deny_rule_matched("ls ~/x /e*", ("rm *",)) is None
    monkeypatch.setenv("HOME", str(tmp_path / "later"))
    assert stage.resolve("~/notes") == str(tmp_path / "later" / "notes")
    patterns = [f"[e]tc{'?' * n}" for n in range(stage.MAX_GLOB_PATTERNS + 1)]
    assert [stage.is_system_dir(pattern) for pattern in patterns][:2] == [True, False]


def test_hardline_and_self_protection_come_before_the_deny_rules(stage, home, work):
    (home / "config.yaml").write_text("approvals:\n  deny: ['*']\n")
    turns = [reply("", call("terminal", {"command": "rm -rf /"}, "c0"),
                   call("terminal", {"command": f"echo x >> {home / 'config.yaml'}"}, "c1"),
                   call("terminal", {"command": "ls"}, "c2")), reply("done")]
    _, server = agent_run(stage, turns)
    found = results(server)
    assert [found[c]["blocked"] for c in ("c0", "c1", "c2")] == ["hardline", "self-protection",
                                                                  "deny-rule"]
    assert (home / "config.yaml").read_text() == "approvals:\n  deny: ['*']\n"


# ── command_allowlist ─────────────────────────────────────────────────────

def test_command_allowlist_is_merged_with_allowlist_json(stage, home, work):
    def found_keys(command):                # in the order the gate's note names them
        return list(dict.fromkeys(f.key for f in stage.detect_dangerous_command(command)))
    rm, chmod = "rm -rf build", "chmod -R 777 build"
    rm_keys = sorted(f.key for f in stage.detect_dangerous_command("rm -rf build"))
    chmod_keys = sorted(f.key for f in stage.detect_dangerous_command("chmod -R 777 build"))
    assert rm_keys and chmod_keys and not set(rm_keys) & set(chmod_keys)
    (home / "config.yaml").write_text(f"command_allowlist: {json.dumps(rm_keys)}\n")
    (home / "allowlist.json").write_text(json.dumps({"version": 1, "keys": chmod_keys}))
    turns = [reply("", call("terminal", {"command": "rm -rf build"}, "c0"),
                   call("terminal", {"command": "chmod -R 777 build"}, "c1"),
                   call("terminal", {"command": "git reset --hard"}, "c2")), reply("done")]
    result, server = agent_run(stage, turns)
    found = results(server)
    assert found["c0"]["output"] == "stub rm\n"                 # from config.yaml
    notes = [line for line in result.stderr.splitlines() if "without asking" in line]
    assert notes == [f"[approved without asking: {'; '.join(where + key for key in keys)}]"
                     for where, keys in (("config.yaml command_allowlist: ", found_keys(rm)),
                                         ("allowlist.json: ", found_keys(chmod)))]
    assert found["c1"]["output"] == "stub chmod\n"              # from allowlist.json
    assert found["c2"]["error"].startswith("denied: no terminal to ask on")    # from neither
    assert marks(work) == ["rm -rf build", "chmod -R 777 build"]
    permissions = stage.permissions_from_config(chain(stage, home))
    merged = permissions.allowlist if hasattr(permissions, "allowlist") \
        else stage.allowlist_keys(permissions)     # teaching: read once, at start-up
    assert merged == set(rm_keys) | set(chmod_keys)
    (home / "config.yaml").unlink()
    _, server = agent_run(stage, turns)
    assert results(server)["c0"]["error"].startswith("denied: no terminal to ask on")


# ── self-protection: every config file, every tool ────────────────────────

ORIGINAL = "approvals:\n  timeout: 30\n"


def protected_target(name, home, tmp_path):
    """(flags, environment, the file) for one config file of the chain; files that the
    chain reads exist, with ORIGINAL in them."""
    profile = home / "profiles" / "work"
    for folder in (home, profile, tmp_path / "team", tmp_path / "admin"):
        folder.mkdir(parents=True, exist_ok=True)
    if name == "config.yaml":
        path, argv, env = home / "config.yaml", (), {}
    elif name == "--config":
        path = tmp_path / "team" / "team.yaml"
        argv, env = ("--config", str(path)), {}
    elif name == "--config in the home":
        path = home / "team.yaml"
        argv, env = ("--config", str(path)), {}
    elif name == "managed":
        path = tmp_path / "admin" / "policy.yaml"
        argv, env = (), {"LEARN_HERMES_MANAGED": str(path)}
    elif name == "managed config.yaml":
        path = tmp_path / "admin" / "config.yaml"
        argv, env = (), {"LEARN_HERMES_MANAGED": str(path)}
    elif name == "the base config.yaml, from a profile":
        path, argv, env = home / "config.yaml", ("--profile", "work"), {}
    elif name == "the profile's config.yaml":
        path, argv, env = profile / "config.yaml", ("--profile", "work"), {}
    elif name == "another profile's config.yaml":
        path, argv, env = home / "profiles" / "other" / "config.yaml", ("--profile", "work"), {}
    elif name == "another profile's allowlist.json":
        path, argv, env = home / "profiles" / "other" / "allowlist.json", (), {}
    else:
        raise AssertionError(name)
    if name not in ("another profile's config.yaml", "another profile's allowlist.json"):
        path.write_text(ORIGINAL)
    return argv, env, path


TARGETS = ["config.yaml", "--config", "--config in the home", "managed", "managed config.yaml",
           "the base config.yaml, from a profile", "the profile's config.yaml",
           "another profile's config.yaml", "another profile's allowlist.json"]
WRITE_REFUSED = "is a policy file of this agent: only the user changes it. Nothing was written."


# Another profile's policy files are protected by the hardened edition only
# (profile_policy_file()); the teaching edition protects this run's chain.
@pytest.mark.parametrize("target", [
    pytest.param(target, marks=pytest.mark.hardening) if "another profile" in target
    else target for target in TARGETS])
def test_no_tool_changes_a_config_file(stage, home, work, tmp_path, target):
    argv, env, path = protected_target(target, home, tmp_path)
    existed = path.exists()
    commands = [f"echo 'approvals: {{mode: off}}' >> {path}", f"sed -i s/30/1/ {path}",
                f"cp /dev/null {path}", f"echo x | tee {path}"]
    turns = [reply("", call("write_file", {"path": str(path), "content": "approvals:\n  "
                                           "mode: off\n"}, "w"),
                   call("patch", {"path": str(path), "old_string": "30",
                                  "new_string": "1"}, "p"),
                   *[call("terminal", {"command": command}, f"t{number}")
                     for number, command in enumerate(commands)]),
             reply("done")]
    result, server = agent_run(stage, turns, "--yolo", *argv, env=env)
    assert result.returncode == 0, result.stderr
    found = results(server)
    for tool in ("w", "p"):
        assert found[tool]["refused"] is True and found[tool]["error"].endswith(WRITE_REFUSED)
    for number in range(len(commands)):
        refusal = found[f"t{number}"]
        assert refusal["blocked"] == "self-protection", (commands[number], refusal)
        assert refusal["error"].startswith("BLOCKED (self-protection): this command may write ")
    assert (path.read_text() == ORIGINAL) if existed else not path.exists()
    assert marks(work) == []


@pytest.mark.parametrize("target", ["--config", "managed"])
def test_a_chain_file_is_named_exactly_and_can_still_be_read(stage, home, work, tmp_path,
                                                              target):
    argv, env, path = protected_target(target, home, tmp_path)
    turns = [reply("", call("terminal", {"command": f"echo x > {path}"}, "exact"),
                   call("terminal", {"command": f"cat {path}"}, "cat"),
                   call("read_file", {"path": str(path)}, "read")), reply("done")]
    _, server = agent_run(stage, turns, *argv, env=env)
    found = results(server)
    assert found["exact"]["error"].startswith(
        f"BLOCKED (self-protection): this command may write {path}, a policy file")
    assert found["cat"]["output"] == ORIGINAL
    assert "timeout: 30" in found["read"]["content"]
    assert path.read_text() == ORIGINAL and marks(work) == []


@pytest.mark.hardening
@pytest.mark.parametrize("target", ["--config", "managed"])
def test_a_chain_file_named_after_a_cd_is_refused(stage, home, work, tmp_path, target):
    argv, env, path = protected_target(target, home, tmp_path)
    turns = [reply("", call("terminal", {"command": f"cd {path.parent} && cp /tmp/x "
                                                    f"{path.name}"}, "named")), reply("done")]
    _, server = agent_run(stage, turns, *argv, env=env)
    assert results(server)["named"]["error"].startswith(
        f"BLOCKED (self-protection): this command may write {path}, a policy file")
    assert path.read_text() == ORIGINAL and marks(work) == []


def test_a_projects_own_config_yaml_stays_writable(stage, home, work):
    (home / "config.yaml").write_text(ORIGINAL)
    turns = [reply("", call("write_file", {"path": "config.yaml", "content": "a: 1\n"}, "w"),
                   call("terminal", {"command": "echo 'b: 2' >> config.yaml"}, "t"),
                   call("terminal", {"command": "cp config.yaml backup.yaml"}, "cp")),
             reply("done")]
    _, server = agent_run(stage, turns)
    found = results(server)
    assert found["w"]["bytes_written"] == 5 and found["t"]["exit_code"] == 0
    assert found["cp"]["output"] == "stub cp\n"
    assert (work / "config.yaml").read_text() == "a: 1\nb: 2\n"
    assert (home / "config.yaml").read_text() == ORIGINAL


def test_a_sub_agent_cannot_change_a_config_file_either(stage, home, work, tmp_path):
    argv, env, path = protected_target("--config", home, tmp_path)
    child_calls = reply("", call("write_file", {"path": str(path), "content": "x"}, "cw"),
                        call("terminal", {"command": f"echo x >> {path}"}, "ct"))
    turns = [reply("", call("delegate_task", {"goal": "loosen the policy"}, "d1")),
             child_calls, reply("could not"), reply("done")]
    _, server = agent_run(stage, turns, "--yolo", *argv, env=env)
    child_results = {m["tool_call_id"]: m["content"] for m in server.requests[2]["messages"]
                     if m["role"] == "tool"}
    assert WRITE_REFUSED in child_results["cw"]
    assert "BLOCKED (self-protection)" in child_results["ct"]
    assert path.read_text() == ORIGINAL and marks(work) == []


def test_chain_files_are_policy_files(stage, home, tmp_path):
    assert stage.chain_files() == []                        # no configuration loaded
    team = tmp_path / "team.yaml"
    team.write_text(ORIGINAL)
    stage.CONFIG = chain(stage, home, "--config", str(team))
    assert stage.chain_files() == [team]
    assert stage.policy_file_written(f"echo x > {team}") == team


@pytest.mark.hardening
def test_chain_files_and_profile_policy_files(stage, home, tmp_path):
    assert stage.chain_files() == []                        # no configuration loaded
    profiles = home / "profiles"
    for name, protected in [("allowlist.json", True), ("config.yaml", True),
                            ("notes.md", False)]:
        assert stage.profile_policy_file(profiles / "any" / name) is protected
    assert stage.profile_policy_file(profiles / "config.yaml") is False
    assert stage.profile_policy_file(profiles / "a" / "b" / "config.yaml") is False
    assert stage.profile_policy_file(home / "config.yaml") is False
    team = tmp_path / "team.yaml"
    team.write_text(ORIGINAL)
    stage.CONFIG = chain(stage, home, "--config", str(team))
    assert stage.chain_files() == [team]
    assert stage.policy_file_written(f"echo x > {team}") == team


@pytest.mark.hardening
def test_chain_file_written_reads_names_and_links(stage, home, tmp_path):
    team = tmp_path / "team.yaml"
    team.write_text(ORIGINAL)
    stage.CONFIG = chain(stage, home, "--config", str(team))
    assert stage.chain_file_written(f"cat {team}") is None
    assert stage.chain_file_written(f"echo x > {team}") == team
    assert stage.chain_file_written("vim team.yaml") == team
    assert stage.chain_file_written("ls team.yaml") is None
    assert stage.chain_file_written("echo x > other.yaml") is None
    (tmp_path / "alias").symlink_to(team)           # a name that does not say team.yaml
    os.chdir(tmp_path)
    assert stage.chain_file_written("echo x > alias") == team
    assert stage.chain_file_written("echo x > alias-not") is None


# ── the demo ──────────────────────────────────────────────────────────────

@pytest.mark.parametrize("stage_name", ["s11_config_chain",             # later stages: own demo
                                        "hardened/s11_config_chain"])
def test_the_demo_walks_through_the_chain(stage_name, tmp_path, monkeypatch):
    stage = load_stage(stage_name)
    monkeypatch.setattr(stage, "DEFAULT_MANAGED_FILE", tmp_path / "etc" / "config.yaml")
    result = run_main(stage, "--demo")
    assert result.returncode == 0
    out = result.stdout
    hardened = stage_name.startswith("hardened/")       # only it shows the mistakes (step 2)
    mistakes = [
        "2. Mistakes in config.yaml are named with their line; a bad value refuses the "
        "start, never a silent default:",
        "  approvals: timeout: soon",
        "approvals.timeout: expected whole seconds, got 'soon'",
        "  approvals.mode = 'off' (YAML itself would read off as false)",
        "unknown key 'aprovals.mode' (did you mean 'approvals.mode'?); ignored",
        "  approvals.mode = 'manual'\n",
    ] if hardened else []
    step = 3 if hardened else 2
    expected = [
        "1. One key, four layers. Each step adds a layer that sets approvals.timeout; the "
        "strongest one wins:" if hardened else
        "1. Each step adds a layer that sets approvals.timeout; the strongest wins:",
        "  + nothing set                            approvals.timeout = 60  from default",
        "  + config.yaml: approvals: timeout: 45    approvals.timeout = 45  from "
        "config.yaml:approvals.timeout",
        "  + HERMES_APPROVAL_TIMEOUT=30             approvals.timeout = 30  from "
        "HERMES_APPROVAL_TIMEOUT",
        "  + --approval-timeout 20                  approvals.timeout = 20  from "
        "--approval-timeout",
        "  + the managed file: timeout: 10          approvals.timeout = 10  from "
        "managed:approvals.timeout",
        "  warning: config.yaml:approvals.timeout is ignored: approvals.timeout is locked",
        "  warning: HERMES_APPROVAL_TIMEOUT is ignored:",
        "  warning: --approval-timeout is ignored:",
        *mistakes,
        f"{step}. A deny rule beats YOLO. config.yaml: approvals: "
        "{yolo: true, deny: ['rm -rf *']}",
        "s11> $ rm -rf build\n",
        "    BLOCKED (deny rule): the user's rule 'rm -rf *' (approvals.deny)",
        "s11> $ rm -r build\n",
        "    stub rm: -r build",
    ]
    protected = [           # the hardened demo only ("Under attack" tests both editions)
        f"{step + 1}. The agent cannot change its own configuration, with any tool:",
        "s11> write ../state/config.yaml approvals: {mode: off}\n",
        "config.yaml is a policy file of this agent: only the user changes it.",
        "s11> $ echo 'approvals: {mode: off}' >> $LEARN_HERMES_HOME/config.yaml\n",
        "    BLOCKED (self-protection): this command may write ",
    ] if hardened else []
    expected += protected
    told = [                                            # the config verb: the hardened demo
        f"{step + 2}. The model can be told what the settings are, never change them",
        "s11> config\n",
        "Who decides a setting? Strongest first: the managed file",
        "  approvals.yolo = true   (config.yaml:approvals.yolo)",
        "  approvals.deny = rm -rf *   (config.yaml:approvals.deny)",
    ] if hardened else []
    expected += told
    position = 0
    for line in expected:
        found = out.find(line, position)
        assert found >= 0, f"missing after position {position}: {line!r}\n{out}"
        position = found + len(line)
    assert out.count("s11> ") == (5 if hardened else 2)
    if hardened:
        assert "approvals.mode = 'manual'" not in out.split("approvals: mode: off")[1].split(
            "aprovals")[0]
    else:
        assert "Mistakes in config.yaml" not in out


@pytest.mark.hardening
def test_the_agents_home_variable_names_the_first_policy_file(stage, home, work):
    """A command that names $LEARN_HERMES_HOME could reach any policy file: it is refused
    as naming the first one; a command that names a file is refused for that file."""
    policies = [path.resolve() for path in stage.policy_files()]
    assert stage.policy_named('sed -i s/a/b/ "$LEARN_HERMES_HOME/x"', policies) == policies[0]
    assert stage.policy_named("cat allowlist.json", policies) == policies[0]
    assert stage.policy_named("echo build", policies) is None


@pytest.mark.hardening
def test_an_allowlist_changed_behind_the_agents_back_is_named_once(stage, home, capsys):
    """s11's Permissions (the config chain's) keeps s09's warning: said once, then the
    file is not trusted for the rest of the run."""
    path = home / "allowlist.json"
    path.write_text('{"version": 1, "keys": []}')
    permissions = stage.Permissions()
    assert permissions.allowlist_unchanged(path)
    path.write_text('{"version": 1, "keys": ["rm_recursive"]}')
    assert not permissions.allowlist_unchanged(path)
    assert not permissions.allowlist_unchanged(path)
    assert capsys.readouterr().err.count("allowlist.json changed while the agent") == 1
