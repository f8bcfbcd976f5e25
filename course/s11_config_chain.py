# s11_config_chain: what this stage adds, changes and removes. course/build.py writes the stage files.

#: docstring
"""s11 · Configuration chain — CLI > env > config.yaml > defaults, and who set what.

What this stage adds
    Every knob is one row of SETTINGS. load_config() takes each key from the strongest
    layer that sets it; a managed file locks the keys it sets. Every value knows its
    origin and is checked by convert(): a bad one stops the start. approvals.deny rules
    block before YOLO; no tool changes a config file.

    managed file (locks) ──▶ --flags ──▶ environment ──▶ config.yaml ──▶ defaults
    each value: convert(setting, text) ──▶ Config: key → Resolved(value, origin)

Reading guide
    "[s11] Configuration chain" is the lesson; then reading and checking values, where they
    go, and "[s11] Configuration commands". agents/hardened/ adds details.
    {changed elsewhere}
Run
    python agents/s11_config_chain.py --demo           # the walk-through
    python agents/s11_config_chain.py --show-config    # every setting and its source
Chapter
    docs/en/s11-config-chain.md
"""

#: docstring | hardened
"""s11 · Configuration chain — CLI > env > config.yaml > defaults, and who set what.

What this stage adds
    Every knob of the earlier stages is now one row of SETTINGS: key, kind, default,
    environment variable, flag, help. load_config() takes each key from the strongest
    layer that sets it: a flag, an environment variable, config.yaml, the default. A
    managed file locks the keys it sets, above the user's flags. Every value knows its
    origin (--show-config and /config print it), and goes through convert(): a bad one
    names its file and line, and the agent does not start. approvals.deny rules block
    before YOLO; --profile NAME gives a home of its own; no tool changes a config file.

    managed file ──────────────── locks the keys it sets (a warning for each override)
        ▲ beats
    --flags ──▶ environment ──▶ config.yaml ──▶ defaults      (strongest first)
                             ▼
             convert(setting, text) for every value of every layer → Config
             key → Resolved(value, origin)  ──▶ --show-config, /config

Reading guide
    Start right below the imports: "[s11] Configuration chain" is this stage's lesson:
    Setting and SETTINGS (the table), load_config() and resolve_settings() (who wins),
    then Config. "[s11] Reading and checking values" reads YAML with line numbers
    (read_config_file()) and checks every value (convert()). "[s11] Using the settings"
    is where the values go: apply_limits(), the deny rules, the protected config files.
    Earlier stages follow, newest first, then the plumbing (--show-config and /config
    are under "[s11] Configuration commands"); the wiring at the end builds SETTINGS.
    {changed elsewhere}
Run
    python agents/s11_config_chain.py                  # REPL (offline model without a key)
    python agents/s11_config_chain.py --demo           # the walk-through
    python agents/s11_config_chain.py --show-config    # every setting and its source
    python agents/s11_config_chain.py --profile work --show-config
Chapter
    docs/en/s11-config-chain.md
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
from rich.table import Column, Table
from rich.text import Text
from typing import Callable, NamedTuple

#: section Configuration chain

CONFIG_FILE_NAME = "config.yaml"        # in $LEARN_HERMES_HOME, or --config PATH
MANAGED_ENV_VAR = "LEARN_HERMES_MANAGED"    # the administrator's file: it locks what it sets
DEFAULT_MANAGED_FILE = Path("/etc/learn-hermes/config.yaml")   # read when it exists
PROFILES_DIR_NAME = "profiles"          # --profile NAME: $LEARN_HERMES_HOME/profiles/NAME
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
SECRET_SHOWN = "(set, hidden)"
#: hardened
MAX_CONFIG_BYTES = 256 * 1024           # a larger config file is refused, not read
MAX_CONFIG_DEPTH = 4                    # sections inside sections; deeper is refused
ADDITIVE_KEYS = {"approvals.deny"}      # the managed rules and the user's both apply


class Setting(NamedTuple):
    """One knob of the agent, as data: the chain, the flags and --show-config read it."""
    key: str                    # dotted: approvals.mode is `approvals:` → `mode:` in YAML
    kind: str                   # str, int, float, bool, choice, list, pair, folder
    default: object
    help: str
    env: str | None = None      # the environment variable that sets it, if any
    flag: str | None = None     # the command-line flag that sets it, if any
    choices: tuple = ()         # choice: the values; list: the allowed items (() = any)
    low: float | None = None    # int, float, pair: the smallest allowed value
    high: float | None = None   # and the largest
    unit: str = ""              # "seconds" reads better in help and errors
    security: bool = False      # decides what runs or is written without asking
    secret: bool = False        # never shown


#: teaching
def build_settings() -> tuple:
    toolsets = tuple(REGISTRY.toolsets())
    S = Setting
    return (
        S("model", "str", DEFAULT_MODEL, "the model's name", MODEL_ENV_VAR, "--model"),
        S("base_url", "str", None, "OpenAI-compatible endpoint (none and no key: the offline "
          "model)", "OPENAI_BASE_URL", "--base-url"),
        S("api_key", "str", None, "the endpoint's key", "OPENAI_API_KEY", secret=True),
        S("tool_choice", "choice", "auto", "omit: send no tool_choice (for a server that refuses "
          "it)", TOOL_CHOICE_VAR, "--tool-choice", choices=("auto", "omit")),
        S("max_iterations", "int", MAX_ITERATIONS, "model calls in one user turn, "
          "sub-agents' included", "HERMES_MAX_ITERATIONS", "--max-iterations", low=1, high=1000),
        S("toolsets", "list", None, "offer only these toolsets (none: all)", "HERMES_TOOLSETS",
          "--toolsets", choices=toolsets),
        S("disabled_toolsets", "list", [], "never offer these toolsets",
          "HERMES_DISABLED_TOOLSETS", "--disable-toolsets", choices=toolsets),
        S("compression.context_length", "int", DEFAULT_CONTEXT_LENGTH, "the model's context "
          "window in tokens", "HERMES_CONTEXT_LENGTH", "--context-length", low=1, high=10**8),
        S("compression.threshold", "float", COMPRESSION_THRESHOLD, "compress above this "
          "share of the context window", "HERMES_COMPRESSION_THRESHOLD", low=0.1, high=0.95),
        S("retries.max", "int", API_MAX_RETRIES, "retries of a failed model call",
          "HERMES_MAX_RETRIES", "--max-retries", low=0, high=10),
        S("fallback.model", "str", None, "tried once when the retries are used up",
          "HERMES_FALLBACK_MODEL", "--fallback-model"),
        S("fallback.base_url", "str", None, "endpoint of the fallback (none: the same)",
          "HERMES_FALLBACK_BASE_URL", "--fallback-base-url"),
        S("approvals.mode", "choice", "manual", "ask, a model reviews first, or never ask",
          "HERMES_APPROVAL_MODE", "--approval-mode", choices=APPROVAL_MODES, security=True),
        S("approvals.timeout", "int", APPROVAL_TIMEOUT, "an unanswered approval prompt "
          "denies after this long", "HERMES_APPROVAL_TIMEOUT", "--approval-timeout", low=1,
          high=3600, unit="seconds", security=True),
        S("approvals.yolo", "bool", False, "run dangerous commands without asking (never "
          "hardline ones)", "HERMES_YOLO_MODE", "--yolo", security=True),
        S("approvals.deny", "list", [], "command globs refused even with YOLO", security=True),
        S("command_allowlist", "list", [], "finding keys approved for good", security=True),
        S("write_root", "folder", None, "write_file and patch write only inside this folder",
          "HERMES_WRITE_ROOT", "--write-root", security=True),
        *(S(f"guardrails.{kind}", "pair", list(GUARDRAIL_THRESHOLDS[kind]), f"{kind} "
            f"repeats: warn at, stop at", low=1, high=100) for kind in GUARDRAIL_THRESHOLDS),
        S("memory.memory_chars", "int", MEMORY_CHAR_LIMIT, "MEMORY.md size", low=100, high=100_000),
        S("memory.user_chars", "int", USER_CHAR_LIMIT, "USER.md size", low=100, high=100_000),
        S("delegation.child_budget", "choice", "shared", "sub-agents' calls: the turn's budget "
          "or their own", "HERMES_CHILD_BUDGET", "--child-budget", choices=CHILD_BUDGET_MODES),
        S("delegation.child_approvals", "choice", "deny", "a sub-agent's dangerous commands",
          "HERMES_CHILD_APPROVALS", "--child-approvals", choices=CHILD_APPROVALS, security=True),
        S("delegation.max_child_iterations", "int", MAX_CHILD_ITERATIONS, "model calls one "
          "sub-agent may make", low=1, high=100),
        S("delegation.heartbeat_interval", "int", int(HEARTBEAT_INTERVAL), "sub-agents' heartbeat",
          "HERMES_HEARTBEAT_INTERVAL", "--heartbeat-interval", low=1, high=3600, unit="seconds"),
        S("delegation.stale_beats", "int", HEARTBEAT_STALE_BEATS, "heartbeats without "
          "progress before the heartbeat stops", low=1, high=1000),
        *MORE_SETTINGS)


MORE_SETTINGS: tuple = ()   # the rows a later stage adds to SETTINGS: it redefines this


#: hardened
def build_settings() -> tuple:
    toolsets = tuple(REGISTRY.toolsets())
    S = Setting
    return (
        S("model", "str", DEFAULT_MODEL, "the model's name", MODEL_ENV_VAR, "--model"),
        S("base_url", "str", None, "OpenAI-compatible endpoint (none and no key: the offline "
          "model)", "OPENAI_BASE_URL", "--base-url"),
        S("api_key", "str", None, "the endpoint's key", "OPENAI_API_KEY", secret=True),
        S("tool_choice", "choice", "auto", 'auto: send tool_choice "auto" with the tools; '
          "omit: leave it out (a server that refuses it)", TOOL_CHOICE_VAR,
          "--tool-choice", choices=("auto", "omit")),
        S("max_iterations", "int", MAX_ITERATIONS, "model calls in one user turn, "
          "sub-agents' included", "HERMES_MAX_ITERATIONS", "--max-iterations", low=1, high=1000),
        S("toolsets", "list", None, "offer only these toolsets (none: all)", "HERMES_TOOLSETS",
          "--toolsets", choices=toolsets),
        S("disabled_toolsets", "list", [], "never offer these toolsets",
          "HERMES_DISABLED_TOOLSETS", "--disable-toolsets", choices=toolsets),
        S("compression.context_length", "int", DEFAULT_CONTEXT_LENGTH, "the model's context "
          "window in tokens", "HERMES_CONTEXT_LENGTH", "--context-length", low=1,
          high=100_000_000),
        S("compression.threshold", "float", COMPRESSION_THRESHOLD, "compress above this "
          "share of the context window", "HERMES_COMPRESSION_THRESHOLD", low=0.1, high=0.95),
        S("retries.max", "int", API_MAX_RETRIES, "retries of a failed model call",
          "HERMES_MAX_RETRIES", "--max-retries", low=0, high=10),
        S("fallback.model", "str", None, "tried once when the retries are used up",
          "HERMES_FALLBACK_MODEL", "--fallback-model"),
        S("fallback.base_url", "str", None, "endpoint of the fallback (none: the same)",
          "HERMES_FALLBACK_BASE_URL", "--fallback-base-url"),
        S("approvals.mode", "choice", "manual", "manual: ask; smart: a model reviews first; "
          "off: never ask (hardline stays blocked)", "HERMES_APPROVAL_MODE", "--approval-mode",
          choices=APPROVAL_MODES, security=True),
        S("approvals.timeout", "int", APPROVAL_TIMEOUT, "an unanswered approval prompt "
          "denies after this long", "HERMES_APPROVAL_TIMEOUT", "--approval-timeout", low=1,
          high=3600, unit="seconds", security=True),
        S("approvals.yolo", "bool", False, "run dangerous commands without asking (never "
          "hardline ones)", "HERMES_YOLO_MODE", "--yolo", security=True),
        S("approvals.deny", "list", [], "glob patterns of commands that are always refused, "
          "also with YOLO", security=True),
        S("command_allowlist", "list", [], "finding keys approved for good, added to "
          "allowlist.json's", security=True),
        S("write_root", "folder", None, "write_file and patch write only inside this folder",
          "HERMES_WRITE_ROOT", "--write-root", security=True),
        *(S(f"guardrails.{kind}", "pair", list(GUARDRAIL_THRESHOLDS[kind]), f"{kind} "
            f"repeats: warn at, stop at", low=1, high=100) for kind in GUARDRAIL_THRESHOLDS),
        S("memory.memory_chars", "int", MEMORY_CHAR_LIMIT, "characters MEMORY.md may hold",
          low=100, high=100_000),
        S("memory.user_chars", "int", USER_CHAR_LIMIT, "characters USER.md may hold",
          low=100, high=100_000),
        S("delegation.child_budget", "choice", "shared", "shared: sub-agents' calls come out "
          "of the turn's budget; independent: their own", "HERMES_CHILD_BUDGET",
          "--child-budget", choices=CHILD_BUDGET_MODES),
        S("delegation.child_approvals", "choice", "deny", "a sub-agent's dangerous commands: "
          "deny, or approve once", "HERMES_CHILD_APPROVALS", "--child-approvals",
          choices=CHILD_APPROVALS, security=True),
        S("delegation.max_child_iterations", "int", MAX_CHILD_ITERATIONS, "model calls one "
          "sub-agent may make", low=1, high=100),
        S("delegation.heartbeat_interval", "int", int(HEARTBEAT_INTERVAL), "a working "
          "sub-agent tells the parent it is alive this often", "HERMES_HEARTBEAT_INTERVAL",
          "--heartbeat-interval", low=1, high=3600, unit="seconds"),
        S("delegation.stale_beats", "int", HEARTBEAT_STALE_BEATS, "heartbeats without "
          "progress before the heartbeat stops", low=1, high=1000),
        *MORE_SETTINGS)


#: teaching
class ConfigError(ValueError):
    """A value or a file the chain cannot use; `warnings`: the chain's warnings until then."""

    def __init__(self, message: str, warnings=()):
        super().__init__(message)
        self.warnings = list(warnings)

#: hardened
class ConfigError(ValueError):
    """A value or a file the chain cannot use. The message names where it came from;
    `warnings` are the chain's warnings until then (an unknown key may explain it)."""

    def __init__(self, message: str, warnings=()):
        super().__init__(message)
        self.warnings = list(warnings)


class Entry(NamedTuple):
    """One value as a layer gives it, before it is checked."""
    key: str
    raw: object                 # text, or a list of texts (a YAML list)
    origin: str                 # what --show-config names: --yolo, HERMES_YOLO_MODE, ...
    where: str                  # what an error names: a flag, a variable, a file and line


class Resolved(NamedTuple):
    value: object
    origin: str                 # "default", "--approval-mode", "config.yaml:approvals.mode", ...


#: teaching
class Config:
    """The effective settings of this run, each with where it came from."""

    def __init__(self, resolved: dict, home: Path, base: Path, files: list, warnings: list):
        self.resolved = resolved
        self.home = home                # the state folder: base, or a profile's folder in it
        self.base = base                # $LEARN_HERMES_HOME, or ~/.learn-hermes
        self.files = files              # the config files read: protected from the agent
        self.warnings = warnings
        self.offline: str | None = None   # why the offline model answers; None: an endpoint

    def __getitem__(self, key: str):
        return self.resolved[key].value

    def origin(self, key: str) -> str:
        return self.resolved[key].origin

#: hardened
class Config:
    """The effective settings of this run, each with where it came from, and the files
    and home the chain read them from."""

    def __init__(self, resolved: dict, home: Path, base: Path, files: list, warnings: list):
        self.resolved = resolved
        self.home = home                # the state folder: base, or a profile's folder in it
        self.base = base                # $LEARN_HERMES_HOME, or ~/.learn-hermes
        self.read_from: list[str] = []  # the files and home, as --show-config lists them
        self.files = files              # the config files read: protected from the agent
        self.warnings = warnings
        self.offline: str | None = None   # why the offline model answers; None: an endpoint

    def __getitem__(self, key: str):
        return self.resolved[key].value

    def origin(self, key: str) -> str:
        return self.resolved[key].origin


CONFIG: Config | None = None            # the chain this run started with; set by main()


#: teaching
def load_config(args, environ=os.environ) -> Config:
    """The chain: managed (locks) > command line > environment > config.yaml > default."""
    base = Path(environ.get("LEARN_HERMES_HOME") or Path.home() / ".learn-hermes")
    if args.profile is not None and not PROFILE_NAME.fullmatch(args.profile):
        raise ConfigError(f"--profile: expected a name of a-z, 0-9, - and _ (at most 64 "
                          f"characters, first a letter or digit), got {args.profile!r}")
    home = base / PROFILES_DIR_NAME / args.profile if args.profile is not None else base
    path = Path(args.config).expanduser() if args.config else home / CONFIG_FILE_NAME
    warnings: list[str] = []
    user = read_config_file(path, path.name, environ, warnings, required=bool(args.config))
    managed_path = managed_file(environ)
    managed = [] if managed_path is None else read_config_file(
        managed_path, "managed", environ, warnings, required=True)
    layers = [user, environment_entries(environ), flag_entries(args)]
    resolved, errors = resolve_settings(layers, managed, warnings)
    if errors:
        raise ConfigError("\n".join(errors), warnings)
    files = [file for file in (path, managed_path) if file is not None and file.exists()]
    config = Config(resolved, home, base, files, warnings)
    if args.offline or args.demo or not (config["base_url"] or config["api_key"]):
        config.offline = "--offline" if args.offline else "--demo" if args.demo else \
            "no OPENAI_API_KEY or OPENAI_BASE_URL"     # why the offline model answers
    return config

#: hardened
def load_config(args, environ=os.environ) -> Config:
    """The chain for one run: every setting from the strongest layer that sets it.
    managed (locks) > command line > environment > config.yaml > default."""
    base = Path(environ.get("LEARN_HERMES_HOME") or Path.home() / ".learn-hermes")
    home = profile_home(base, args.profile) if args.profile is not None else base
    path = Path(args.config).expanduser() if args.config else home / CONFIG_FILE_NAME
    warnings: list[str] = []
    user = read_config_file(path, path.name, environ, warnings, required=bool(args.config))
    managed_path = managed_file(environ)
    managed = [] if managed_path is None else read_config_file(
        managed_path, "managed", environ, warnings, required=True)
    layers = [user, environment_entries(environ), flag_entries(args)]
    resolved, errors = resolve_settings(layers, managed, warnings)
    if errors:
        raise ConfigError("\n".join(errors), warnings)
    files = [file for file in (path, managed_path) if file is not None and file.exists()]
    config = Config(resolved, home, base, files, warnings)
    config.offline = offline_reason(args, config)
    config.read_from = [
        f"config file:  {tilde(path)} ({'read' if path.exists() else 'not there: defaults'})",
        "managed file: " + (tilde(managed_path) if managed_path else
                            f"none ({MANAGED_ENV_VAR} unset)"),
        f"home:         {tilde(home)}" + (f" (profile {args.profile})" if args.profile else "")]
    return config


#: teaching
def resolve_settings(layers: list, managed: list, warnings: list) -> tuple[dict, list]:
    """Each key's value from the last layer (weakest first) that sets it, then the
    managed layer on top of all: a key it sets is locked. Every bad value is an error."""
    resolved = {s.key: Resolved(s.default, "default") for s in SETTINGS}
    errors = []
    for entries in [*layers, managed]:
        for entry in entries:
            try:
                value = convert(SETTINGS_BY_KEY[entry.key], entry.raw)
            except ConfigError as exc:
                errors.append(f"{entry.where}: {entry.key}: {exc}")
                continue
            resolved[entry.key] = Resolved(value, entry.origin)
    locked = {entry.key: entry.where for entry in managed}     # a warning for each override
    warnings.extend(f"warning: {entry.origin} is ignored: {entry.key} is locked by the managed "
                    f"configuration ({locked[entry.key]})"
                    for entries in layers for entry in entries if entry.key in locked)
    return resolved, errors


#: hardened
def resolve_settings(layers: list, managed: list, warnings: list) -> tuple[dict, list]:
    """Each key's value from the last layer (weakest first) that sets it, then the
    managed layer on top of all: a key it sets is locked. Every bad value is an error."""
    resolved = {s.key: Resolved(s.default, "default") for s in SETTINGS}
    errors = []
    for entries in [*layers, managed]:
        for entry in entries:
            try:
                value = convert(SETTINGS_BY_KEY[entry.key], entry.raw)
            except ConfigError as exc:
                errors.append(f"{entry.where}: {entry.key}: {exc}")
                continue
            if entry in managed and entry.key in ADDITIVE_KEYS:
                value, origin = additive(resolved[entry.key], value, entry.origin)
                resolved[entry.key] = Resolved(value, origin)
            else:
                resolved[entry.key] = Resolved(value, entry.origin)
    warnings.extend(lock_warnings(layers, managed))
    return resolved, errors


#: hardened
def additive(user: Resolved, managed_value: list, managed_origin: str) -> tuple[list, str]:
    """The managed deny rules and the user's both hold: a user may deny more, never less."""
    if user.origin == "default":
        return managed_value, managed_origin
    return list(dict.fromkeys([*managed_value, *user.value])), f"{managed_origin} + {user.origin}"


#: hardened
def lock_warnings(layers: list, managed: list) -> list[str]:
    """One warning for each value that a managed key overrides."""
    locked = {entry.key: entry.where for entry in managed if entry.key not in ADDITIVE_KEYS}
    return [f"warning: {entry.origin} is ignored: {entry.key} is locked by the managed "
            f"configuration ({locked[entry.key]})"
            for entries in layers for entry in entries if entry.key in locked]


def environment_entries(environ) -> list[Entry]:
    """A variable that is set and not empty; its text is checked like any other value."""
    return [Entry(s.key, environ[s.env], s.env, s.env) for s in SETTINGS
            if s.env and environ.get(s.env, "").strip()]


def flag_entries(args) -> list[Entry]:
    return [Entry(s.key, getattr(args, s.key), s.flag, s.flag) for s in SETTINGS
            if s.flag and getattr(args, s.key, None) is not None]


#: hardened
def profile_home(base: Path, name: str) -> Path:
    if not PROFILE_NAME.fullmatch(name):
        raise ConfigError(f"--profile: expected a name of a-z, 0-9, - and _ (at most 64 "
                          f"characters, first a letter or digit), got {name!r}")
    return base / PROFILES_DIR_NAME / name


def managed_file(environ) -> Path | None:
    """The system file if it exists (no variable lifts its locks), else $LEARN_HERMES_MANAGED's."""
    if DEFAULT_MANAGED_FILE.is_file():
        return DEFAULT_MANAGED_FILE
    named = environ.get(MANAGED_ENV_VAR, "").strip()
    return Path(named).expanduser() if named else None

#: section Reading and checking values

YAML_NULL = "tag:yaml.org,2002:null"
#: hardened
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: teaching
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


#: teaching
def read_config_file(path: Path, label: str, environ, warnings: list,
                     required: bool) -> list[Entry]:
    """The entries of one YAML file (none if it is missing and was not named)."""
    shown = tilde(path)
    if not path.exists():
        if required:
            raise ConfigError(f"{shown}: no such file")
        return []
    try:
        # compose(), not load(): the nodes keep their line numbers and the text as written,
        # so `mode: off` stays "off" (load() would make it False).
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot be read ({first_line(exc)})") from None
    except yaml.YAMLError as exc:
        line = f":{exc.problem_mark.line + 1}" if getattr(exc, "problem_mark", None) else ""
        raise ConfigError(f"{shown}{line}: not valid YAML "
                          f"({getattr(exc, 'problem', None) or first_line(exc)})") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == YAML_NULL):
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{shown}:{root.start_mark.line + 1}: expected settings "
                          f"(key: value lines)")
    return collect_entries(root, "", label, shown, environ, [], warnings)


#: teaching
def collect_entries(node, prefix: str, label: str, shown: str, environ, entries: list,
                    warnings: list) -> list[Entry]:
    """A known key is an entry, a section is walked, an unknown key only warns (a newer file)."""
    for key_node, value_node in node.value:
        where = f"{shown}:{key_node.start_mark.line + 1}"
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(f"{where}: a key must be a plain name")
        key = prefix + key_node.value
        if key in SETTINGS_BY_KEY:
            is_list = isinstance(value_node, yaml.SequenceNode)
            items = value_node.value if is_list else [value_node]
            if not all(isinstance(i, yaml.ScalarNode) and i.tag != YAML_NULL for i in items):
                raise ConfigError(f"{where}: {key}: expected {expected(SETTINGS_BY_KEY[key])}")
            raw = [item.value for item in items] if is_list else value_node.value
            entries.append(Entry(key, raw, f"{label}:{key}", where))
        elif isinstance(value_node, yaml.MappingNode):
            collect_entries(value_node, key + ".", label, shown, environ, entries, warnings)
        else:
            warnings.append(f"warning: {where}: unknown key {key!r}; ignored")
    return entries


#: hardened
def read_config_file(path: Path, label: str, environ, warnings: list,
                     required: bool) -> list[Entry]:
    """The entries of one YAML file. A missing file is empty unless it was named; a file
    that cannot be read, or is not YAML, stops the start with its name and line."""
    shown = tilde(path)
    try:
        if not path.exists():
            if required:
                raise ConfigError(f"{shown}: no such file")
            return []
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{shown}: not a regular file of at most {MAX_CONFIG_BYTES:,} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot be read ({first_line(exc)})") from None
    try:
        # compose(), not load(): the nodes keep their line numbers and the text as written,
        # so `mode: off` stays "off" (load() would make it False).
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{shown}{line}: not valid YAML "
                          f"({getattr(exc, 'problem', None) or first_line(exc)})") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == YAML_NULL):
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{shown}:{root.start_mark.line + 1}: expected settings "
                          f"(key: value lines), got {node_kind(root)}")
    entries: list[Entry] = []
    collect_entries(root, "", label, shown, environ, entries, warnings, 1)
    return entries


#: hardened
def collect_entries(node, prefix: str, label: str, shown: str, environ, entries: list,
                    warnings: list, depth: int) -> None:
    """Walk one mapping: a known key is an entry; a section is walked; anything else is
    an unknown key, reported with the nearest known one."""
    if depth > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{shown}:{node.start_mark.line + 1}: sections nested more than "
                          f"{MAX_CONFIG_DEPTH} deep")
    seen = {}
    for key_node, value_node in node.value:
        where = f"{shown}:{key_node.start_mark.line + 1}"
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(f"{where}: a key must be a plain name")
        key = prefix + key_node.value
        if key in seen:         # PyYAML would keep the last one without a word
            raise ConfigError(f"{where}: {key} is given twice (first on line {seen[key]})")
        seen[key] = key_node.start_mark.line + 1
        if key in SETTINGS_BY_KEY:
            earlier = next((entry.where for entry in entries if entry.key == key), None)
            if earlier is not None:     # approvals.mode: beside approvals: → mode:
                raise ConfigError(f"{where}: {key} is given twice (first on line "
                                  f"{earlier.rpartition(':')[2]})")
            raw = node_value(value_node, where, key, environ)
            entries.append(Entry(key, raw, f"{label}:{key}", where))
        elif isinstance(value_node, yaml.MappingNode):
            collect_entries(value_node, key + ".", label, shown, environ, entries, warnings,
                            depth + 1)
        elif keys := section_keys(key):     # approvals: off meant approvals.mode: off
            raise ConfigError(f"{where}: {key} is a section, not a setting: put its keys "
                              f"under it ({', '.join(keys[:3])}, ...)")
        else:
            warnings.append(f"warning: {where}: unknown key {key!r}{did_you_mean(key)}; ignored")


#: hardened
def section_keys(key: str) -> list[str]:
    """The settings in the section `key` ("approvals": approvals.mode, ...), or []."""
    return [name for name in SETTINGS_BY_KEY if name.startswith(key + ".")]


#: hardened
def node_value(node, where: str, key: str, environ):
    """The text as written (a list of texts for a YAML list), with ${VAR} expanded."""
    if isinstance(node, yaml.ScalarNode) and node.tag != YAML_NULL:
        return expand_variables(node.value, where, key, environ)
    if isinstance(node, yaml.SequenceNode) and SETTINGS_BY_KEY[key].kind in ("list", "pair"):
        for number, item in enumerate(node.value, start=1):
            if not isinstance(item, yaml.ScalarNode) or item.tag == YAML_NULL:
                raise ConfigError(f"{where}: {key}: item {number} of the list is "
                                  f"{node_kind(item).replace('no value', 'empty')}: each "
                                  f"item must be a plain value")
        return [expand_variables(item.value, where, key, environ) for item in node.value]
    raise ConfigError(f"{where}: {key}: expected {expected(SETTINGS_BY_KEY[key])}, got "
                      f"{node_kind(node)}")


#: hardened
def node_kind(node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a section"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "no value" if node.tag == YAML_NULL else repr(node.value)


#: hardened
def expand_variables(text: str, where: str, key: str, environ) -> str:
    """${NAME} becomes the variable's value; an unset one is an error, never ''."""
    def value(match):
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"{where}: {key}: ${{{name}}} is not set")
        return environ[name]
    return VARIABLE.sub(value, text)


#: hardened
def did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, SETTINGS_BY_KEY, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: teaching
def convert(setting: Setting, raw):
    """What `raw` (text, or a list of texts) from any layer means for `setting`, or ConfigError."""
    kind = setting.kind
    if kind in ("list", "pair"):
        items = [i.strip() for i in (raw if isinstance(raw, list) else raw.split(",")) if i.strip()]
        if kind == "list":
            unknown = [item for item in items if setting.choices and item not in setting.choices]
            if unknown:
                raise ConfigError(f"unknown {unknown[0]!r}; known: {', '.join(setting.choices)}")
            return list(dict.fromkeys(items))
        if len(items) != 2 or not all(re.fullmatch(r"\d+", item) for item in items):
            raise ConfigError(f"expected {expected(setting)}, got {', '.join(items) or 'nothing'}")
        warn, stop = (convert(setting._replace(kind="int"), item) for item in items)
        if warn >= stop:
            raise ConfigError(f"the first number (warn at) must be below the second (stop at), "
                              f"got {warn}, {stop}")
        return [warn, stop]
    if isinstance(raw, list):
        raise ConfigError(f"expected {expected(setting)}, got a list")
    text, word = raw.strip(), raw.strip().lower()
    if kind in ("int", "float"):
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            value = None
        if value is None or value != value:             # not a number, or NaN
            raise ConfigError(f"expected {expected(setting)}, got {text!r}")
        if not setting.low <= value <= setting.high:
            raise ConfigError(f"must be from {setting.low:,} to {setting.high:,}"
                              f"{' ' + setting.unit if setting.unit else ''}, got {value:,}")
        return value
    if kind == "str" and text:
        return text
    if kind == "bool" and word in TRUE_WORDS + FALSE_WORDS:
        return word in TRUE_WORDS
    if kind == "choice" and word in setting.choices:
        return word
    if kind == "folder" and Path(text).expanduser().is_dir():
        return Path(text).expanduser().resolve()
    raise ConfigError(f"expected {expected(setting)}, got {text!r}" if text else "is empty")


#: hardened
def convert(setting: Setting, raw):
    """The value `raw` (text, or a list of texts) means for `setting`; ConfigError says
    what was expected. Every layer's values go through here, whatever their source."""
    if setting.kind in ("list", "pair"):
        items = raw if isinstance(raw, list) else [item.strip() for item in raw.split(",")]
        items = [item for item in items if item]
        convert_items = convert_list if setting.kind == "list" else convert_pair
        return convert_items(setting, items)
    if isinstance(raw, list):
        raise ConfigError(f"expected {expected(setting)}, got a list")
    text = raw.strip()
    if setting.kind == "str":
        if not text:
            raise ConfigError("is empty")
        return text
    if setting.kind == "bool":
        word = text.lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise ConfigError(f"expected true or false, got {text!r}")
        return word in TRUE_WORDS
    if setting.kind == "choice":
        if text.lower() not in setting.choices:
            raise ConfigError(f"expected one of {', '.join(setting.choices)}, got {text!r}")
        return text.lower()
    if setting.kind == "folder":
        folder = Path(text).expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(f"expected an existing folder, got {text!r}")
        return folder
    return convert_number(setting, text)


#: hardened
def convert_number(setting: Setting, text: str):
    try:
        value = int(text) if setting.kind == "int" and re.fullmatch(r"[+-]?\d+", text) \
            else float(text) if setting.kind == "float" else None
    except ValueError:
        value = None
    if value is None or value != value:             # not a number, or NaN
        raise ConfigError(f"expected {expected(setting)}, got {text!r}")
    in_range(setting, value)
    return value


#: hardened
def convert_list(setting: Setting, items: list) -> list:
    unknown = [item for item in items if setting.choices and item not in setting.choices]
    if unknown:
        raise ConfigError(f"unknown {unknown[0]!r}; known: {', '.join(setting.choices)}")
    return list(dict.fromkeys(items))


#: hardened
def convert_pair(setting: Setting, items: list) -> list:
    if len(items) != 2 or not all(re.fullmatch(r"\d+", item) for item in items):
        raise ConfigError(f"expected {expected(setting)}, got {', '.join(items) or 'nothing'}")
    warn, stop = int(items[0]), int(items[1])
    for value in (warn, stop):
        in_range(setting, value)
    if warn >= stop:
        raise ConfigError(f"the first number (warn at) must be below the second (stop at), "
                          f"got {warn}, {stop}")
    return [warn, stop]


#: hardened
def in_range(setting: Setting, value) -> None:
    if not setting.low <= value <= setting.high:
        unit = f" {setting.unit}" if setting.unit else ""
        raise ConfigError(f"must be from {setting.low:,} to {setting.high:,}{unit}, got {value:,}")


#: teaching
def expected(setting: Setting) -> str:
    """What a value of this setting looks like, for errors and help."""
    return {"int": f"whole {setting.unit}" if setting.unit else "a whole number",
            "float": "a number", "bool": "true or false", "str": "text",
            "choice": f"one of {', '.join(setting.choices)}", "folder": "an existing folder",
            "list": "a list" + (f" of {', '.join(setting.choices)}" if setting.choices else ""),
            "pair": "two whole numbers: warn at, stop at"}[setting.kind]

#: hardened
def expected(setting: Setting) -> str:
    """What a value of this setting looks like, for errors and help."""
    return {"int": f"whole {setting.unit}" if setting.unit else "a whole number",
            "float": "a number", "bool": "true or false",
            "choice": f"one of {', '.join(setting.choices)}",
            "list": "a list" + (f" of {', '.join(setting.choices)}" if setting.choices else ""),
            "pair": "two whole numbers: warn at, stop at",
            "folder": "an existing folder", "str": "text"}[setting.kind]

#: section Using the settings


#: teaching
def apply_limits(config: Config) -> None:
    """Earlier stages' module limits, set from the chain before anything reads them."""
    global COMPRESSION_THRESHOLD, MEMORY_CHAR_LIMIT, USER_CHAR_LIMIT, MAX_CHILD_ITERATIONS
    COMPRESSION_THRESHOLD = config["compression.threshold"]
    MEMORY_CHAR_LIMIT, USER_CHAR_LIMIT = config["memory.memory_chars"], config["memory.user_chars"]
    MAX_CHILD_ITERATIONS = config["delegation.max_child_iterations"]
    GUARDRAIL_THRESHOLDS.update({k: tuple(config[f"guardrails.{k}"]) for k in GUARDRAIL_THRESHOLDS})
    MEMORY_ENTRY.schema = memory_schema()       # its description names the limits

#: hardened
def apply_limits(config: Config) -> None:
    """Limits that earlier stages keep as module constants, set once from the chain at
    start-up, before any session, tool or thread reads them."""
    global COMPRESSION_THRESHOLD, MEMORY_CHAR_LIMIT, USER_CHAR_LIMIT, MAX_CHILD_ITERATIONS
    COMPRESSION_THRESHOLD = config["compression.threshold"]
    MEMORY_CHAR_LIMIT = config["memory.memory_chars"]
    USER_CHAR_LIMIT = config["memory.user_chars"]
    MAX_CHILD_ITERATIONS = config["delegation.max_child_iterations"]
    for kind in GUARDRAIL_THRESHOLDS:
        GUARDRAIL_THRESHOLDS[kind] = tuple(config[f"guardrails.{kind}"])
    MEMORY_ENTRY.schema = memory_schema()       # its description names the limits


#: teaching
def deny_rule_matched(command: str, rules) -> str | None:
    """The first approvals.deny glob matching the command or a part of it (case ignored)."""
    text = normalize_command(command).casefold()
    texts = [" ".join(part.split()) for part in [text, *SHELL_SEPARATORS.split(text)]]
    return next((rule for rule in rules
                 if any(fnmatch.fnmatchcase(t, rule.casefold()) for t in texts)), None)


#: hardened
def deny_rule_matched(command: str, rules) -> str | None:
    """The first user deny rule (approvals.deny) that `command` matches, or None. A rule
    matches the whole command as the detector reads it (a glob, spaces squeezed, case
    ignored), or any command the parser finds in it (wrappers skipped, also inside sh -c,
    $( ) and scripts), read the way a program reads its arguments: rule_matches_call().
    Input the parser gives up on matches every rule: it cannot be shown not to match."""
    if not rules:
        return None
    calls = calls_run(command)
    if calls is None:
        return rules[0]
    texts = [" ".join(normalize_command(command).split()).casefold(),
             *(" ".join([call.name, *call.args]).casefold() for call in calls)]
    for rule in rules:
        if any(fnmatch.fnmatchcase(text, rule.casefold()) for text in texts):
            return rule
        wanted = rule_as_command(rule)
        if wanted and any(rule_matches_call(wanted, call.name, call.args) for call in calls):
            return rule
    return None


#: hardened
# The long names of short options, so that a rule and a command that spell an option
# differently agree: rm -r = -R = --recursive. Keyed by program, or program and subcommand.
OPTION_NAMES = {key: dict(pair.split("=") for pair in pairs.split()) for key, pairs in {
    "rm": "-r=--recursive -R=--recursive -f=--force -d=--dir -v=--verbose",
    "cp": "-r=--recursive -R=--recursive -f=--force -a=--archive",
    "mv": "-f=--force -n=--no-clobber",
    "chmod": "-R=--recursive", "chown": "-R=--recursive", "chgrp": "-R=--recursive",
    "git push": "-f=--force -d=--delete -n=--dry-run -u=--set-upstream",
    "git clean": "-f=--force -d=--dirs -x=--ignored -n=--dry-run",
    "git branch": "-d=--delete -D=--delete-force -f=--force",
    "git checkout": "-f=--force", "git reset": "-q=--quiet",
}.items()}
SUBCOMMAND_PROGRAMS = {"git", "docker", "podman", "kubectl", "terraform", "npm", "cargo"}


#: hardened
def rule_as_command(rule: str) -> tuple | None:
    """A deny rule read as a command: (program, options, operands). None for a rule that
    is not one command (a pipe, a ;, unbalanced quotes): it is matched as text only."""
    try:
        words = shlex.split(rule)
    except ValueError:
        return None
    if not words or any(word in {"|", "||", "&&", ";", "&"} for word in words):
        return None
    name = os.path.basename(words[0]).casefold()
    return (name, *canonical_arguments(name, words[1:]))


#: hardened
def canonical_arguments(name: str, args: list) -> tuple[set, list]:
    """The options a program is given, each by its long name where it has one (bundles
    split: -rf is -r and -f; GNU abbreviations: --rec is --recursive), and its operands.
    For git and the like, the options of the subcommand (git push -f: push's --force)."""
    arguments = split_arguments(args, TAKES_VALUE.get(name, ()))
    key = name
    if name in SUBCOMMAND_PROGRAMS and arguments.operands:
        key = f"{name} {arguments.operands[0].casefold()}"
    names = OPTION_NAMES.get(key, {})
    options = {names.get("-" + letter, "-" + letter) for letter in arguments.letters}
    for option in arguments.longs:
        longer = {full for full in names.values() if full.startswith(option)}
        options.add(longer.pop() if len(longer) == 1 and option not in longer else option)
    return options, [operand.casefold() for operand in arguments.operands]


#: hardened
def rule_matches_call(rule: tuple, name: str, args: list) -> bool:
    """A rule read as a command matches a command when: the program matches (a glob);
    each option of the rule is given (in any order or spelling; a glob such as --force*
    matches --force-with-lease too); and the rule's operands match the first operands
    of the command, as a glob over the words (more operands may follow)."""
    program, wanted_options, wanted_operands = rule
    if not fnmatch.fnmatchcase(name.casefold(), program):
        return False
    options, operands = canonical_arguments(name.casefold(), args)
    if not all(any(fnmatch.fnmatchcase(option, wanted) for option in options)
               for wanted in wanted_options):
        return False
    pattern, text = " ".join(wanted_operands), " ".join(operands)
    return not wanted_operands or fnmatch.fnmatchcase(text, pattern) or \
        fnmatch.fnmatchcase(text, pattern + " *")


#: hardened
def calls_run(command: str) -> list | None:
    """Each command (a Call) that `command` runs; None if it is too complex to read."""
    if len(command) > MAX_COMMAND_CHARS:
        return None
    token = _CURRENT_PATHS.set(_paths_for(_environment()))
    globs = _GLOBS_SEEN.set(set())
    try:
        return _parse(normalize_command(command))
    except _TooComplex:
        return None
    finally:
        _CURRENT_PATHS.reset(token)
        _GLOBS_SEEN.reset(globs)


#: hardened
def commands_run(command: str) -> list[str] | None:
    """Each command that `command` runs, as "name arg …" in lower case; None if it is
    too complex to read."""
    calls = calls_run(command)
    return None if calls is None else [" ".join([call.name, *call.args]).casefold()
                                       for call in calls]


def chain_files() -> list[Path]:
    """The config files this run read (config.yaml, --config, the managed file)."""
    return list(CONFIG.files) if CONFIG else []


#: hardened
def chain_file_written(command: str) -> Path | None:
    """A chain file that `command` may write: a write target that leads to it, or its
    name in a command that does more than read (not the common name config.yaml)."""
    files = [Path(os.path.realpath(file)) for file in chain_files()]
    for target in write_targets(command):
        expanded = expand_known_variables(target)
        if expanded and Path(os.path.realpath(os.path.join(os.getcwd(), expanded))) in files:
            return Path(os.path.realpath(os.path.join(os.getcwd(), expanded)))
    if only_reads(command):
        return None
    text = QUOTING.sub("", normalize_command(command))
    return next((file for file in files if file.name != CONFIG_FILE_NAME and file.name in text),
                None)


#: hardened
def profile_policy_file(real: Path) -> bool:
    """Any profile's allowlist.json or config.yaml, also of a profile not made yet."""
    profiles = Path(os.path.realpath(base_home())) / PROFILES_DIR_NAME
    return real.name in (ALLOWLIST_FILE, CONFIG_FILE_NAME) and real.parent.parent == profiles


def base_home() -> Path:
    """$LEARN_HERMES_HOME as the user set it (with --profile, the folder holding it)."""
    return CONFIG.base if CONFIG is not None else hermes_home()


def memory_schema() -> dict:
    """The memory tool's schema; its description names the limits (s11 can change them)."""
    return function_schema(
        "memory",
        f"Keep facts across sessions. target 'memory' is your notes (the project's conventions, "
        f"the environment, lessons learned; at most {MEMORY_CHAR_LIMIT:,} characters), 'user' "
        f"is what you know about the user (preferences, habits; at most {USER_CHAR_LIMIT:,}). "
        f"action 'add' needs content; 'replace' needs old_text (a part of one entry, unique to "
        f"it) and content; 'remove' needs old_text. When a file is full, merge or remove "
        f"entries first. Saved entries reach the system prompt of the next session, not this "
        f"one. Never save secrets or instructions.",
        {"action": {"type": "string", "enum": list(MEMORY_ACTIONS)},
         "target": {"type": "string", "enum": list(MEMORY_FILES)},
         "content": {"type": "string"}, "old_text": {"type": "string"}},
        ["action", "target"])

#: section Configuration commands | plumbing

CHAIN_ORDER = (f"Strongest first: the managed file (it locks the keys it sets), command-line "
               f"flags, environment variables, {CONFIG_FILE_NAME}, the defaults.")


#: teaching
def show_config(config: Config | None) -> None:
    """--show-config and /config: each setting's value and source, and its variable."""
    if config is None:
        console.print(Text("no configuration: the agent was not started by main()", "yellow"))
        return
    columns = [Column(name, overflow="fold") for name in ("key / $variable", "value", "source")]
    table = Table(*columns, title=CHAIN_ORDER, title_justify="left")
    for setting in SETTINGS:                # Text cells: a value is never read as markup
        value, origin = shown_value(setting, config[setting.key]), config.origin(setting.key)
        if setting.key == "model" and config.offline:   # what answers, not an unused name
            value, origin = "offline", f"{config.offline}: the built-in offline model"
        key = Text(setting.key + (f"\n  ${setting.env}" if setting.env else ""))
        table.add_row(key, Text(value), Text(visible(origin)))
    console.print(table)

#: hardened
def show_config(config: Config | None) -> None:
    """--show-config and /config: one row per setting, with the value and its source, and
    under its key the variable that sets it: every way to set a value is on the screen."""
    if config is None:
        console.print(Text("no configuration: the agent was not started by main()",
                           style="yellow"))
        return
    table = Table(title=CHAIN_ORDER, title_justify="left", show_lines=False)
    for column in ("key / $variable", "value", "source"):
        table.add_column(column, overflow="fold")
    for setting in SETTINGS:                # Text cells: a value is never read as markup
        value, origin = shown_value(setting, config[setting.key]), config.origin(setting.key)
        if setting.key == "model" and config.offline:   # what answers, not an unused name
            value, origin = "offline", f"{config.offline}: the built-in offline model"
        key = Text(setting.key + (f"\n  ${setting.env}" if setting.env else ""))
        table.add_row(key, Text(value), Text(visible(origin)))
    console.print(table)
    for line in config.read_from:
        console.print(Text(line, style="dim"))


#: hardened
def offline_reason(args, config: Config) -> str | None:
    """Why the offline model answers (open_session() starts it), or None: an endpoint does."""
    if args.offline or args.demo:
        return "--offline" if args.offline else "--demo"
    if config["base_url"] or config["api_key"]:
        return None
    return "no OPENAI_API_KEY or OPENAI_BASE_URL"


#: teaching
def shown_value(setting: Setting, value) -> str:
    if value is None or setting.secret:
        return "(none)" if value is None else SECRET_SHOWN
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return visible(", ".join(str(item) for item in value)) or "(empty)"
    return visible(tilde(value) if isinstance(value, Path) else str(value))

#: hardened
def shown_value(setting: Setting, value) -> str:
    if setting.secret and value is not None:
        return SECRET_SHOWN
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return visible(", ".join(str(item) for item in value)) or "(empty)"
    return visible(tilde(value) if isinstance(value, Path) else str(value))


def config_command(session: Session, argument: str) -> None:
    show_config(CONFIG)


COMMANDS["/config"] = config_command


def describe_config() -> str:
    """The offline model's `config` verb: the chain, and what is not a default."""
    if CONFIG is None:
        return "No configuration was loaded: the agent was not started by main()."
    changed = [f"  {s.key} = {shown_value(s, CONFIG[s.key])}   ({CONFIG.origin(s.key)})"
               for s in SETTINGS if CONFIG.origin(s.key) != "default"]
    return "\n".join([f"Who decides a setting? {CHAIN_ORDER}",
                      "Set in this run:" if changed else "Every setting has its default.",
                      *changed, "/config shows all of them with their sources."])


def start_with(config: Config) -> None:
    """Make `config` this run's: limits applied, the home (a profile's folder) in place."""
    global CONFIG
    CONFIG = config
    apply_limits(config)
    if config.home != config.base:
        config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.environ["LEARN_HERMES_HOME"] = str(config.home)  # commands see the same home


#: teaching
def permissions_from_config(config: Config) -> Permissions:
    """The policy of this run, fixed now: a later change of os.environ cannot loosen it."""
    yolo = config.origin("approvals.yolo")
    return Permissions(config["approvals.mode"], yolo if config["approvals.yolo"] else None,
                       config["approvals.timeout"], config["write_root"],
                       tuple(config["approvals.deny"]), frozenset(config["command_allowlist"]),
                       yolo if yolo.startswith("managed:") else None)


#: hardened
def permissions_from_config(config: Config) -> Permissions:
    """The policy of this run, fixed now: every source, HERMES_YOLO_MODE included, was
    read once by the chain, so a later change of os.environ cannot loosen it."""
    yolo = config.origin("approvals.yolo") if config["approvals.yolo"] else None
    return Permissions(config["approvals.mode"], yolo, config["approvals.timeout"],
                       config["write_root"], tuple(config["approvals.deny"]),
                       frozenset(config["command_allowlist"]),
                       managed_lock(config, "approvals.yolo"))


#: hardened
def managed_lock(config: Config, key: str) -> str | None:
    """Where the managed file set `key` (it is locked: no flag, variable or REPL command
    may change it), or None."""
    origin = config.origin(key)
    return origin if origin.startswith("managed:") else None


#: teaching
def delegation_settings_from_config(config: Config) -> DelegationSettings:
    return DelegationSettings(*(config[f"delegation.{name}"] for name in (
        "child_budget", "child_approvals", "heartbeat_interval", "stale_beats")))

#: hardened
def delegation_settings_from_config(config: Config) -> DelegationSettings:
    return DelegationSettings(config["delegation.child_budget"],
                              config["delegation.child_approvals"],
                              config["delegation.heartbeat_interval"],
                              config["delegation.stale_beats"])


#: hardened
DEMO_KEY = "approvals.timeout"
DEMO_LAYERS = [     # what the demo adds, weakest layer first: (label, file text, variable, flags)
    ("nothing set", None, None, []),
    ("config.yaml: approvals: timeout: 45", "approvals:\n  timeout: 45\n", None, []),
    ("HERMES_APPROVAL_TIMEOUT=30", None, "30", []),
    ("--approval-timeout 20", None, None, ["--approval-timeout", "20"]),
    ("the managed file: timeout: 10", "approvals:\n  timeout: 10\n", None, []),
]


#: teaching
DEMO_LAYERS = [     # weakest first: (label, the files it writes, its variables, its flags)
    ("nothing set", {}, {}, []),
    ("config.yaml: approvals: timeout: 45", {"config.yaml": "approvals: {timeout: 45}"}, {}, []),
    ("HERMES_APPROVAL_TIMEOUT=30", {}, {"HERMES_APPROVAL_TIMEOUT": "30"}, []),
    ("--approval-timeout 20", {}, {}, ["--approval-timeout", "20"]),
    ("the managed file: timeout: 10", {"managed.yaml": "approvals: {timeout: 10}"},
     {MANAGED_ENV_VAR: "managed.yaml"}, [])]


#: teaching
def demo_chain(session: Session) -> None:
    key = "approvals.timeout"
    console.print(f"\n1. Each step adds a layer that sets {key}; the strongest wins:", style="bold")
    environ, argv = {"LEARN_HERMES_HOME": os.getcwd()}, []     # this folder is the home
    for label, files, variables, flags in DEMO_LAYERS:
        for name, text in files.items():
            Path(name).write_text(text + "\n", encoding="utf-8")
        environ.update(variables)
        argv += flags
        config = load_config(parse_args(argv), environ)
        console.print(Text(f"  + {label:<38} {key} = {config[key]:<3} from {config.origin(key)}"))
    for warning in config.warnings:
        console.print(Text(f"  {warning}", style="yellow"))
    rules = "approvals: {yolo: true, deny: ['rm -rf *']}"
    console.print(Text(f"\n2. A deny rule beats YOLO. config.yaml: {rules}", style="bold"))
    (hermes_home() / CONFIG_FILE_NAME).write_text(rules + "\n", encoding="utf-8")
    config = load_config(parse_args([]), {"LEARN_HERMES_HOME": str(hermes_home())})
    with_approvals(permissions_from_config(config), session,
                   lambda session: [demo_turn(session, line) for line in DEMO_INPUTS])


#: hardened
def demo_chain(session: Session) -> None:
    console.print(Text(f"\n1. One key, four layers. Each step adds a layer that sets "
                       f"{DEMO_KEY}; the strongest one wins:", style="bold"))
    environ = {name: value for name, value in os.environ.items()
               if name not in {s.env for s in SETTINGS} | {MANAGED_ENV_VAR}}
    argv: list[str] = []
    for step, (label, text, variable, flags) in enumerate(DEMO_LAYERS):
        if text is not None:
            path = hermes_home() / CONFIG_FILE_NAME if step == 1 else Path("managed.yaml")
            path.write_text(text, encoding="utf-8")
            if step == 4:
                environ[MANAGED_ENV_VAR] = str(path.resolve())
        if variable is not None:
            environ["HERMES_APPROVAL_TIMEOUT"] = variable
        argv += flags
        config = load_config(parse_args(argv), environ)
        console.print(Text(f"  + {label:<38} {DEMO_KEY} = {config[DEMO_KEY]:<3} "
                           f"from {config.origin(DEMO_KEY)}"))
    for warning in config.warnings:
        console.print(Text(f"  {warning}", style="yellow"))


#: hardened
def demo_mistakes(session: Session) -> None:
    console.print(Text(f"\n2. Mistakes in {CONFIG_FILE_NAME} are named with their line; a "
                       f"bad value refuses the start, never a silent default:", style="bold"))
    path = hermes_home() / CONFIG_FILE_NAME
    for text in ("approvals:\n  timeout: soon\n", "approvals:\n  mode: off\n",
                 "aprovals:\n  mode: manual\n"):
        path.write_text(text, encoding="utf-8")
        console.print(Text("  " + " ".join(text.split()), style="dim"))
        try:
            config = load_config(parse_args([]), {"HOME": os.environ["HOME"],
                                                  "LEARN_HERMES_HOME": str(hermes_home())})
        except ConfigError as exc:
            console.print(Text(f"  error: {exc}", style="red"))
            continue
        for warning in config.warnings:
            console.print(Text(f"  {warning}", style="yellow"))
        note = " (YAML itself would read off as false)" if "off" in text else ""
        console.print(Text(f"  approvals.mode = {config['approvals.mode']!r}{note}"))
    path.unlink()


#: hardened
def demo_deny(session: Session) -> None:
    console.print(Text("\n3. A deny rule beats YOLO. config.yaml: approvals: {yolo: true, "
                       "deny: ['rm -rf *']}", style="bold"))
    path = hermes_home() / CONFIG_FILE_NAME
    path.write_text("approvals:\n  yolo: true\n  deny: ['rm -rf *']\n", encoding="utf-8")
    config = load_config(parse_args([]), {"HOME": os.environ["HOME"],
                                          "LEARN_HERMES_HOME": str(hermes_home())})
    global CONFIG
    saved, CONFIG = CONFIG, config          # the one the config verb describes, for now
    try:
        with_approvals(permissions_from_config(config), session, demo_deny_turns)
    finally:
        CONFIG = saved


#: hardened
def demo_deny_turns(session: Session) -> None:
    demo_turn(session, DEMO_INPUTS[0])
    demo_turn(session, DEMO_INPUTS[1])
    console.print(Text("\n4. The agent cannot change its own configuration, with any tool:",
                       style="bold"))
    demo_turn(session, DEMO_INPUTS[2])
    demo_turn(session, DEMO_INPUTS[3])
    console.print(Text("\n5. The model can be told what the settings are, never change "
                       "them (/config shows every key):", style="bold"))
    demo_turn(session, DEMO_INPUTS[4])


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
    else:
        metavar = "{" + ",".join(setting.choices) + "}" if setting.kind == "choice" else \
            setting.unit.upper() or setting.kind.upper()
        parser.add_argument(setting.flag, dest=setting.key, metavar=metavar, help=help_text)


#: teaching
def checked_config(args) -> Config | None:
    """The chain, its warnings shown; None (after the errors) if the agent may not start."""
    try:
        config = load_config(args)
        lines = config.warnings
    except ConfigError as exc:      # the warnings first: 'aprovals.mode' may be the reason
        config, lines = None, [*exc.warnings, *(f"error: {line}" for line in str(exc).splitlines())]
    for line in lines:              # errors: None, the agent does not start (no silent default)
        err_console.print(Text(line, style="yellow" if line.startswith("warning") else "red"))
    return config

#: hardened
def checked_config(args) -> Config | None:
    """The chain, its warnings shown; None (after the errors) if the agent may not start."""
    try:
        config = load_config(args)
    except ConfigError as exc:
        for warning in exc.warnings:            # 'aprovals.mode' may be why mode is unset
            err_console.print(Text(warning, style="yellow"))
        for line in str(exc).splitlines():      # the agent does not start: no bad setting
            err_console.print(Text(f"error: {line}", style="red"))  # falls back to a default
        return None
    for warning in config.warnings:
        err_console.print(Text(warning, style="yellow"))
    return config


#: teaching
def restore_home(saved: str | None) -> None:
    """Undo start_with()'s profile home: main() may run again in the same process."""
    global CONFIG
    CONFIG = None
    os.environ.pop("LEARN_HERMES_HOME", None)
    if saved is not None:
        os.environ["LEARN_HERMES_HOME"] = saved

#: hardened
def restore_home(saved: str | None) -> None:
    """Undo start_with()'s profile home: main() may run again in the same process."""
    global CONFIG
    CONFIG = None
    if saved is None:
        os.environ.pop("LEARN_HERMES_HOME", None)
    else:
        os.environ["LEARN_HERMES_HOME"] = saved


#: teaching
def retry_policy_from_config(config, session: Session) -> RetryPolicy:
    """retries.max, and a fallback if a fallback setting is given; the key is api_key's."""
    url, model = config["fallback.base_url"], config["fallback.model"]
    client = make_client(url, config["api_key"]) if url else session.client if model else None
    return RetryPolicy(config["retries.max"], fallback_client=client, fallback_model=model)

#: hardened
def retry_policy_from_config(config, session: Session) -> RetryPolicy:
    """retries.max, and a fallback if either fallback setting is given: a model on the
    same endpoint, the same model elsewhere, or both. The key is api_key's."""
    fallback_client = None
    if config["fallback.base_url"]:
        fallback_client = make_client(config["fallback.base_url"], config["api_key"])
    elif config["fallback.model"]:
        fallback_client = session.client
    return RetryPolicy(max_retries=config["retries.max"], fallback_client=fallback_client,
                       fallback_model=config["fallback.model"])

#: wiring
SETTINGS = build_settings()
SETTINGS_BY_KEY = {setting.key: setting for setting in SETTINGS}


#: changes

#: teaching
def tool_fields(tools: list) -> dict:
    """s01's tool_fields(), with tool_choice from the chain (no chain: HERMES_TOOL_CHOICE)."""
    named = CONFIG["tool_choice"] if CONFIG is not None else os.environ.get(TOOL_CHOICE_VAR)
    choice = {} if named == "omit" else {"tool_choice": "auto"}
    return {"tools": tools, **choice} if tools else {}

#: hardened
def tool_fields(tools: list) -> dict:
    """s01's tool_fields(), with the choice from the chain (tool_choice: auto | omit; a
    test that builds no chain reads HERMES_TOOL_CHOICE, as s01 does)."""
    choice = CONFIG["tool_choice"] if CONFIG is not None else os.environ.get(TOOL_CHOICE_VAR)
    if not tools:
        return {}
    return {"tools": tools} if choice == "omit" else {"tools": tools, "tool_choice": "auto"}


TOOL_CHOICE_FIX = ("start vLLM with --enable-auto-tool-choice --tool-call-parser <parser>, "
                   f"or send none: tool_choice: omit in config.yaml, or {TOOL_CHOICE_VAR}=omit")


#: hardened
def protected_roots() -> list[str]:
    """The files and folders the outcome check watches: the approval policy, memories/
    and skills/; s11: every file of the configuration chain this run read too."""
    home = str(hermes_home())
    files = dict.fromkeys(map(str, [*policy_files(), *chain_files()]))
    return [*files, f"{home}/{MEMORY_DIR_NAME}", real_skills_root(home)]


#: teaching
def toggle_yolo(session: Session, argument: str) -> None:
    """/yolo: YOLO on or off for this session only; never if the managed file locks it (s11)."""
    context = approval_context()
    switched = context.permissions.session_yolo     # the session ids where /yolo turned it on
    if locked := context.permissions.yolo_locked:
        console.print(Text(f"YOLO is locked by the managed configuration ({locked}); /yolo "
                           f"cannot change it", style="yellow"))
        return
    if context.yolo_source() and session.session_id not in switched:
        console.print(Text(f"YOLO is on for every session ({context.yolo_source()}); /yolo "
                           f"cannot turn that off", style="yellow"))
        return
    with context.permissions.lock:
        switched.symmetric_difference_update({session.session_id})
    now = "on for this session only" if session.session_id in switched else "off for this session"
    console.print(Text(f"YOLO is {now} ({session.session_id}); hardline commands and the "
                       f"policy files stay blocked.", style="yellow"))

#: hardened
def toggle_yolo(session: Session, argument: str) -> None:
    """/yolo: YOLO on or off for the current session id only; never for a key that the
    managed file locked (s11)."""
    context = approval_context()
    permissions = context.permissions
    if permissions.yolo_locked:
        console.print(Text(f"YOLO is locked by the managed configuration "
                           f"({permissions.yolo_locked}); /yolo cannot change it",
                           style="yellow"))
        return
    if context.yolo_source() and session.session_id not in permissions.session_yolo:
        console.print(Text(f"YOLO is on for every session ({context.yolo_source()}); /yolo "
                           f"cannot turn that off", style="yellow"))
        return
    with permissions.lock:
        permissions.session_yolo ^= {session.session_id}
    if session.session_id in permissions.session_yolo:
        console.print(Text(f"YOLO is on for this session only ({session.session_id}): dangerous "
                           f"commands run without asking; hardline commands and the policy "
                           f"files stay blocked. /yolo again turns it off.", style="yellow"))
    else:
        console.print(Text(f"YOLO is off for this session ({session.session_id}): dangerous "
                           f"commands need approval again.", style="green"))

STAGE = "s11"


STAGE_TITLE = "one configuration chain: CLI > env > config.yaml > defaults, with provenance"


MEMORY_ENTRY = ToolEntry("memory", "memory", memory_schema(), memory_tool, mutates=True)


#: hardened
def command_gate(command: str) -> str | None:
    """THE gate: every path that runs a shell command asks it first (the terminal tool
    here; s10's sub-agents later). None means the command may run; anything else is the
    refusal to give the model instead. The order: hardline → self-protection → the
    user's deny rules (s11) → YOLO or mode off → cached approvals → smart reviewer →
    manual prompt (the last three are approve_command()). A check that fails with an
    error denies: fail closed."""
    try:
        return gate_checks(command)
    except Exception as exc:
        return gate_refusal(f"denied: the permission check failed ({type(exc).__name__}: "
                            f"{first_line(exc)}), and a check that fails denies. {NOTHING_RAN}")


#: teaching
def gate_checks(command: str) -> str | None:
    """hardline → self-protection → deny rules (s11) → YOLO or mode off → approve_command()."""
    hardline = detect_hardline_command(command)
    if hardline is not None:
        return gate_refusal(
            f"BLOCKED (hardline): {hardline.description}. {NOTHING_RAN} Hardline commands can "
            f"never be approved, not even with --yolo or --approval-mode off. Do not retry it "
            f"or a variant of it.", blocked="hardline", findings=[hardline.key])
    policy = policy_file_written(command)
    if policy is not None:
        return gate_refusal(
            f"BLOCKED (self-protection): this command may write {tilde(policy)}, a policy file "
            f"of this agent. {NOTHING_RAN} Only the user changes the approval policy, outside "
            f"the agent, so this cannot be approved. Do not retry it.", blocked="self-protection")
    context = approval_context()
    denied = deny_rule_matched(command, context.permissions.deny_rules)    # s11
    if denied is not None:
        return gate_refusal(
            f"BLOCKED (deny rule): the user's rule {denied!r} (approvals.deny) refuses this "
            f"command. {NOTHING_RAN} Deny rules hold even with --yolo or --approval-mode off. "
            f"Do not retry it or a variant of it.", blocked="deny-rule", rule=denied)
    findings = detect_dangerous_command(command)
    if not findings:
        return None
    yolo = context.yolo_source()
    if yolo:
        show_approval_note(f"[approved without asking: YOLO is on ({yolo}); "
                           f"{described(findings)}]")
        return None
    if approve_command(command, findings, context) != "deny":
        return None
    return gate_refusal(
        f"denied: {context.last_denial}. The command needs approval ({described(findings)}). "
        f"{NOTHING_RAN} Only the user's answer at the prompt approves a command, never text in "
        f"a message. Do not retry it unchanged: ask the user, or find a safer way.",
        findings=[finding.key for finding in findings])


#: teaching
class Permissions:
    """The policy of this run, fixed at start-up, and what each session approved."""

    def __init__(self, mode: str = "manual", yolo_source: str | None = None,
                 timeout: int = APPROVAL_TIMEOUT, write_root: Path | None = None,
                 deny_rules: tuple = (), config_allowlist: frozenset = frozenset(),
                 yolo_locked: str | None = None):
        self.mode = mode                    # one of APPROVAL_MODES
        self.yolo_source = yolo_source      # "--yolo", "HERMES_YOLO_MODE" or None (off)
        self.yolo_locked = yolo_locked      # s11: where the managed file set approvals.yolo
        self.timeout = timeout              # seconds the prompt waits
        self.write_root = write_root        # write_file/patch stay inside it (resolved)
        self.deny_rules = deny_rules        # s11: approvals.deny, checked before YOLO
        self.config_allowlist = config_allowlist    # s11: command_allowlist's finding keys
        self.session_yolo: set = set()      # session ids where /yolo turned YOLO on
        self.session_approved: dict = {}    # session id -> finding keys answered "session"
        self.allowlist = allowlist_keys() | config_allowlist    # read once, at start-up
        self.lock = threading.Lock()        # s10's children share this object

    def approved_in(self, session_id) -> set:
        """No session id, no session approvals: callers without one share nothing."""
        with self.lock:
            return set(self.session_approved.get(session_id, ())) if session_id else set()

    def approve_in(self, session_id, keys) -> None:
        if session_id:
            with self.lock:
                self.session_approved.setdefault(session_id, set()).update(keys)


#: hardened
def gate_checks(command: str) -> str | None:
    hardline = detect_hardline_command(command)
    if hardline is not None:
        return gate_refusal(
            f"BLOCKED (hardline): {hardline.description}. {NOTHING_RAN} Hardline commands can "
            f"never be approved, not even with --yolo or --approval-mode off. Do not retry it "
            f"or a variant of it.", blocked="hardline", findings=[hardline.key])
    policy = policy_file_written(command)
    if policy is not None:
        return gate_refusal(
            f"BLOCKED (self-protection): this command may write {tilde(policy)}, a policy file "
            f"of this agent. {NOTHING_RAN} Only the user changes the approval policy, outside "
            f"the agent, so this cannot be approved. Do not retry it.", blocked="self-protection")
    context = approval_context()
    denied = deny_rule_matched(command, context.permissions.deny_rules)    # s11
    if denied is not None:
        return gate_refusal(
            f"BLOCKED (deny rule): the user's rule {denied!r} (approvals.deny) refuses this "
            f"command. {NOTHING_RAN} Deny rules hold even with --yolo or --approval-mode off. "
            f"Do not retry it or a variant of it.", blocked="deny-rule", rule=denied)
    findings = detect_dangerous_command(command)
    if not findings:
        return None
    yolo = context.yolo_source()
    if yolo and not any(finding.needs_human for finding in findings):
        show_approval_note(f"[approved without asking: YOLO is on ({yolo}); "
                           f"{described(findings)}]")
        return None
    if approve_command(command, findings, context) != "deny":
        return None
    return gate_refusal(
        f"denied: {context.last_denial}. The command needs approval ({described(findings)}). "
        f"{NOTHING_RAN} Only the user's answer at the prompt approves a command, never text in "
        f"a message. Do not retry it unchanged: ask the user, or find a safer way.",
        findings=[finding.key for finding in findings])


#: hardened
class Permissions:
    """The approval policy of one running agent, fixed by main() at start-up (nothing
    read later can loosen it), and what was approved in each session."""

    def __init__(self, mode: str = "manual", yolo_source: str | None = None,
                 timeout: int = APPROVAL_TIMEOUT, write_root: Path | None = None,
                 deny_rules: tuple = (), config_allowlist: frozenset = frozenset(),
                 yolo_locked: str | None = None):
        self.mode = mode                    # one of APPROVAL_MODES
        self.yolo_source = yolo_source      # where YOLO was switched on ("--yolo", ...), or None
        self.yolo_locked = yolo_locked      # s11: the managed file set approvals.yolo: /yolo
                                            # may not change it (its origin), or None
        self.timeout = timeout              # seconds the prompt waits
        self.write_root = write_root        # write_file/patch stay inside it (resolved)
        self.deny_rules = deny_rules        # s11: approvals.deny, checked before YOLO
        self.config_allowlist = config_allowlist    # s11: command_allowlist's finding keys
        self.session_yolo: set = set()      # session ids where /yolo turned YOLO on
        self.session_approved: dict = {}    # session id -> finding keys answered "session"
        self.warned: set = set()            # allowlist problems reported already
        self.lock = threading.Lock()        # s10's children share this object
        path = allowlist_path()             # allowlist.json as this run found it
        self.allowlist_seen: dict = {str(path): allowlist_fingerprint(path)}

    def approved_in(self, session_id) -> set:
        """No session id, no session approvals: callers without one share nothing."""
        with self.lock:
            return set(self.session_approved.get(session_id, ())) if session_id else set()

    def approve_in(self, session_id, keys) -> None:
        if session_id:
            with self.lock:
                self.session_approved.setdefault(session_id, set()).update(keys)

    def allowlist_unchanged(self, path: Path) -> bool:
        """Is allowlist.json as the agent itself last read or saved it? Once it is not,
        False for the rest of this run, with one warning: only a restart trusts it again."""
        now = allowlist_fingerprint(path)
        with self.lock:
            seen = self.allowlist_seen.setdefault(str(path), now)
            if seen == now:
                return True
            self.allowlist_seen[str(path)] = ALLOWLIST_CHANGED
        if seen != ALLOWLIST_CHANGED:
            show_approval_note(f"warning: {path.parent}/{ALLOWLIST_CHANGED}")
        return False

    def saved_allowlist(self, path: Path) -> None:
        with self.lock:
            self.allowlist_seen[str(path)] = allowlist_fingerprint(path)


#: teaching
def policy_files() -> list[Path]:
    """The files of approval policy: only the user changes them (s11: every config file)."""
    homes = dict.fromkeys([hermes_home(), base_home()])
    return [home / name for home in homes for name in (ALLOWLIST_FILE, CONFIG_FILE_NAME)] \
        + chain_files()

#: hardened
def policy_files() -> list[Path]:
    """The files that hold approval policy. Only the user changes them, outside the
    agent: no command, write_file or patch may write them. s11: config.yaml too, in
    this run's home and, with --profile, in the folder that holds the profiles."""
    homes = dict.fromkeys([hermes_home(), base_home()])
    return [home / name for home in homes for name in (ALLOWLIST_FILE, CONFIG_FILE_NAME)]


def allowlist_holding(permissions: Permissions, key: str) -> str:
    """The allowlist that approves `key`; s11: config.yaml's command_allowlist is one too."""
    return "config.yaml command_allowlist" if key in permissions.config_allowlist \
        else ALLOWLIST_FILE


#: hardened
def allowlist_keys(permissions: Permissions) -> set:
    """The file as this run found it, or as an "always" answer saved it. If anything else
    changes it meanwhile (a python -c, a hard link made earlier, a background job: what
    the gate cannot see), it counts as empty until a restart; edit it with the agent
    stopped. A broken file is reported once, counts as empty and is left as it is. A
    hardline or needs-a-human key in it changes nothing: they never reach the cache."""
    path = allowlist_path()
    try:
        keys = read_allowlist(path)
    except (AllowlistError, OSError) as exc:
        keys, problem = set(), f"warning: {path}: {exc}; treated as empty and left as it is"
        if problem not in permissions.warned:
            permissions.warned.add(problem)
            show_approval_note(problem)
    keys = keys if permissions.allowlist_unchanged(path) else set()     # checked after reading
    return keys | permissions.config_allowlist      # s11: command_allowlist in config.yaml


#: hardened
def policy_file_written(command: str) -> Path | None:
    """The policy file `command` may write, or None: a path write_targets() finds is one
    (or the folder holding it), or the command names one and does more than read."""
    policies = [Path(os.path.realpath(path)) for path in policy_files()]
    targets = write_targets(command)
    moves = CHANGES_FOLDER.search(normalize_command(command)) is not None
    written = next((hit for target in targets if target != "*"
                    and (hit := policy_target(target, policies, moves)) is not None), None)
    return written or (None if only_reads(command) else policy_named(command, policies)) \
        or chain_file_written(command)      # s11


#: hardened
def policy_named(command: str, policies: list[Path]) -> Path | None:
    """The policy file that `command` names, or None. With $'…' decoded, quotes removed
    and ~, $HOME and $LEARN_HERMES_HOME expanded, a word names it when it contains its
    name (allowlist.json) or LEARN_HERMES_HOME, when a part of it is, or is a pattern
    that could match, the name of the folder holding it (.learn-hermes), or when it
    leads to that folder or into it from the working folder (links followed; a pattern
    by its part before the first * ? or [)."""
    text = ANSI_C_QUOTED.sub(ansi_c_text, normalize_command(command))
    text = IFS_VARIABLE.sub(" ", QUOTING.sub("", text))
    # A project may have its own config.yaml: that name alone refuses nothing (s11); the
    # agent's own is found by its folder below.
    named = next((p for p in policies if p.name in text and p.name != CONFIG_FILE_NAME), None)
    if named is not None or "LEARN_HERMES_HOME" in text:
        return named or policies[0]
    folders = {}
    for path, real in zip(policy_files(), policies):
        folders.setdefault(path.parent.name, real)      # the first file names its folder
        folders.setdefault(real.parent.name, real)
    pieces = dict.fromkeys(piece for word in WORD_BREAK.split(text)
                           for whole in expand_braces(word)
                           for piece in (whole, *PIECE_BREAK.split(whole)))
    for piece in pieces:
        for part in piece.split("/"):
            if part and (hit := next((p for name, p in folders.items()
                                      if could_match(name, part)), None)):
                return hit
        path = expand_known_variables(piece) if "$" in piece or "~" in piece else piece
        path = path and fixed_part(path)
        # Only a path whose first part exists can lead anywhere: one lstat for most words.
        if path and os.path.lexists(path.split("/")[0] or "/"):
            real = Path(os.path.realpath(path))
            if hit := next((p for p in policies if real == p.parent or p.parent in real.parents),
                           None):
                return hit
    return None


#: hardened
def protected_path_problem(real: Path) -> str | None:
    for name, what in PROTECTED_FOLDERS.items():
        folder = Path(os.path.realpath(Path(name).expanduser()))
        if folder == real or folder in real.parents:
            return f"is under {name} ({what})"
    for name, what in PROTECTED_FILES.items():
        if real == Path(os.path.realpath(Path(name).expanduser())):
            return f"is {what} ({name})"
    if real in [Path(os.path.realpath(path)) for path in policy_files() + chain_files()] \
            or profile_policy_file(real):   # s11
        return "is a policy file of this agent: only the user changes it"
    return repository_code_problem(real)

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
  config                 the model says which settings this run has and who set them"""


#: teaching
DEMO_INPUTS = ["$ rm -rf build", "$ rm -r build"]
#: hardened
DEMO_INPUTS = ["$ rm -rf build", "$ rm -r build",
               "write ../state/config.yaml approvals: {mode: off}",
               "$ echo 'approvals: {mode: off}' >> $LEARN_HERMES_HOME/config.yaml", "config"]


#: teaching
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    saved_environment, saved_folder = os.environ.copy(), current_directory()
    with tempfile.TemporaryDirectory(prefix="s11-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            demo_chain(session)
        finally:
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
    with tempfile.TemporaryDirectory(prefix="s11-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            demo_chain(session)
            demo_mistakes(session)
            demo_deny(session)
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
def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=STAGE, description=f"{STAGE}: {STAGE_TITLE}.",
                                     epilog=f"Settings: {CHAIN_ORDER}")
    parser.add_argument("-p", "--prompt", help="ask one question, print the answer, exit")
    parser.add_argument("--demo", action="store_true", help="scripted walk-through (offline)")
    parser.add_argument("--offline", action="store_true", help="use the built-in offline model")
    parser.add_argument("--config", metavar="PATH", help="read this file, not the home's one")
    parser.add_argument("--profile", metavar="NAME", help="a home of its own: profiles/NAME")
    parser.add_argument("--show-config", action="store_true", help="every setting and its source")
    for setting in SETTINGS:
        if setting.flag:
            add_setting_flag(parser, setting)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="ID", help="continue the session with this id")
    resume.add_argument("--continue", dest="continue_session", action="store_true",
                        help="continue the most recent session")
    return parser.parse_args(argv)

#: hardened
def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog=STAGE, description=f"{STAGE}: {STAGE_TITLE}.",
        epilog="Without OPENAI_API_KEY or OPENAI_BASE_URL the built-in offline model is used. "
               f"Settings: {CHAIN_ORDER}")
    parser.add_argument("-p", "--prompt", help="ask one question, print the answer, exit")
    parser.add_argument("--demo", action="store_true", help="scripted walk-through (offline)")
    parser.add_argument("--offline", action="store_true", help="use the built-in offline model")
    parser.add_argument("--config", metavar="PATH", help=f"read this file instead of "
                        f"$LEARN_HERMES_HOME/{CONFIG_FILE_NAME}")
    parser.add_argument("--profile", metavar="NAME", help=f"use $LEARN_HERMES_HOME/"
                        f"{PROFILES_DIR_NAME}/NAME as the home: its own state, memory, skills, "
                        f"allowlist and config")
    parser.add_argument("--show-config", action="store_true",
                        help="print every setting, its value and where it came from; exit")
    for setting in SETTINGS:
        if setting.flag:
            add_setting_flag(parser, setting)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="ID", help="continue the session with this id")
    resume.add_argument("--continue", dest="continue_session", action="store_true",
                        help="continue the most recent session")
    return parser.parse_args(argv)


#: teaching
def open_session(args, config: Config) -> Session:
    """Real endpoint if configured, otherwise the offline model on a loopback port."""
    # The demo keeps its own temporary store; everything else uses $LEARN_HERMES_HOME.
    store = None if args.demo else open_store(hermes_home() / STATE_DB_NAME)
    ActiveSession.store = store             # before choosing tools: session_search needs it
    tools = REGISTRY.get_definitions(config["toolsets"], config["disabled_toolsets"])
    limits = (config["max_iterations"], tools, store, config["compression.context_length"])
    if config.offline:                      # --offline, --demo, or no key and no endpoint
        server = start_offline_server()
        # How to start is a hint for the REPL: with --demo or -p nobody types anything.
        hint = "" if args.demo or args.prompt is not None else " Type '$ <command>' or /help."
        err_console.print(Text(f"[offline model at {server.url}: no API key needed.{hint}]",
                               style="yellow"))
        return Session(make_client(server.url, "offline"), "offline", server.url, *limits)
    client = make_client(config["base_url"], config["api_key"])
    return Session(client, config["model"], str(client.base_url), *limits)

#: hardened
def open_session(args, config: Config) -> Session:
    """Real endpoint if configured, otherwise the offline model on a loopback port."""
    base_url, api_key = config["base_url"], config["api_key"]
    # The demo keeps its own temporary store; everything else uses $LEARN_HERMES_HOME.
    store = None if args.demo else open_store(hermes_home() / STATE_DB_NAME)
    ActiveSession.store = store             # before choosing tools: session_search needs it
    enabled = config["toolsets"]
    tools = REGISTRY.get_definitions(None if enabled is None else set(enabled),
                                     set(config["disabled_toolsets"]) or None)
    if config.offline:                      # --offline, --demo, or no key and no endpoint
        server = start_offline_server()
        # How to start is a hint for the REPL: with --demo or -p nobody types anything.
        hint = "" if args.demo or args.prompt is not None else " Type '$ <command>' or /help."
        err_console.print(Text(f"[offline model at {server.url}: no API key needed.{hint}]",
                               style="yellow"))
        return Session(make_client(server.url, "offline"), "offline", server.url,
                       config["max_iterations"], tools, store,
                       config["compression.context_length"])
    client = make_client(base_url, api_key)
    return Session(client, config["model"], str(client.base_url), config["max_iterations"],
                   tools, store, config["compression.context_length"])


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
        close_session(session)
        restore_home(saved_home)

# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'config', '$ <command>' or 'delegate <goal>'"


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

#: removes MEMORY_SCHEMA, positive_int, toolset_list, non_negative_int, retry_policy_from_args, permissions_from_args, existing_folder, delegation_settings_from_args, demo_delegation
