"""Every stage present: imports with an empty environment, --help and --demo work offline."""

import subprocess
import sys

import pytest

from helpers import AGENTS, all_stages, clean_env, run_stage

STAGES = all_stages()

IMPORT_CHECK = """
import importlib.util, os, sys, threading
spec = importlib.util.spec_from_file_location("stage", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert threading.active_count() == 1, "a thread was started at import"
assert os.listdir(".") == [], "a file was created at import: %s" % os.listdir(".")
print("imported", module.STAGE)
"""


def test_there_is_at_least_one_stage():
    assert STAGES and STAGES[0] == "s01_loop"


@pytest.mark.parametrize("stage", STAGES)
def test_imports_with_an_empty_environment(stage, tmp_path):
    """No client, no files, no env reads that can fail: import must just work."""
    empty_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK, str(AGENTS / f"{stage}.py")],
                            capture_output=True, text=True, env=empty_env, cwd=tmp_path,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"imported {stage[:3]}"


@pytest.mark.parametrize("stage", STAGES)
def test_help_exits_zero(stage):
    result = run_stage(stage, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--prompt", "--demo", "--offline", "--model", "--base-url", "--max-iterations"):
        assert flag in result.stdout


@pytest.mark.parametrize("stage", STAGES)
def test_demo_exits_zero_offline_and_shows_a_tool_call(stage, tmp_path):
    result = run_stage(stage, "--demo", cwd=tmp_path,
                       env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0, result.stderr
    assert "→ terminal" in result.stdout and "← exit 0" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("stage", STAGES)
def test_demo_ignores_a_configured_endpoint(stage, tmp_path):
    """--demo is scripted: it always uses the offline model, even with a key set."""
    env = clean_env(OPENAI_API_KEY="sk-not-used", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    result = run_stage(stage, "--demo", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
