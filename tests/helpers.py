"""Shared test helpers: find and load stage files, run them, check message pairing."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "agents"
STAGE_FILE = re.compile(r"^s(\d\d)_[a-z0-9_]+\.py$")


def all_stages() -> list[str]:
    """Stage names present in agents/, in order: ['s01_loop', ...]."""
    return sorted(p.stem for p in AGENTS.glob("s*.py") if STAGE_FILE.match(p.name))


def stage_number(stage: str) -> int:
    return int(stage[1:3])


def stages_from(first: str) -> list[str]:
    """Every present stage that carries the feature introduced by stage `first`."""
    return [s for s in all_stages() if stage_number(s) >= stage_number(first)]


_loaded: dict[str, object] = {}


def load_stage(stage: str):
    """Import agents/<stage>.py by path (stages are not a package), once per test run."""
    if stage not in _loaded:
        spec = importlib.util.spec_from_file_location(f"stage_{stage}", AGENTS / f"{stage}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[stage] = module
    return _loaded[stage]


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
