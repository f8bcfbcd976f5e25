"""Make every test run offline and away from the learner's real state."""

import os
import tempfile

import pytest


def pytest_configure(config):
    # Notebook kernels inherit this process's environment when they start, so
    # clear it here (not in a fixture) to keep them offline too.
    for name in [n for n in os.environ if n.startswith("OPENAI_")]:
        del os.environ[name]
    os.environ["LEARN_HERMES_HOME"] = tempfile.mkdtemp(prefix="learn-hermes-tests-")
    os.environ["NO_COLOR"] = "1"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Each test gets its own state directory and no OPENAI_* variables."""
    for name in [n for n in os.environ if n.startswith("OPENAI_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "learn-hermes-home"
    monkeypatch.setenv("LEARN_HERMES_HOME", str(home))
    return home
