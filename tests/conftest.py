"""Make every test run offline and away from the learner's real state."""

import itertools
import os
import re
import signal
import ssl
import tempfile

import pytest

from helpers import stop_offline_servers

TEACHING_STAGE = re.compile(r"^s\d\d_[a-z0-9_]+$")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    # Parallel by default (`-n auto`: one worker per core) when pytest-xdist is installed
    # and the command line did not choose: `pytest -n 0` and `pytest -p no:xdist` still
    # run serially. Set here rather than in pyproject's addopts, where `-p no:xdist` would
    # make `-n` an unknown option. (A spare worker, to use the time tests spend waiting,
    # made no difference in CI: the suite is bound by the CPU.)
    # A worker (which has `workerinput`) must not start workers of its own.
    if (config.pluginmanager.has_plugin("xdist") and not hasattr(config, "workerinput")
            and config.getoption("numprocesses", None) is None):
        config.option.numprocesses = "auto"


def pytest_configure(config):
    config.addinivalue_line("markers", "hardening: tests a guard or detail of the hardened "
                                       "edition only; its teaching-edition cases are left out")
    # Notebook kernels inherit this process's environment when they start, so
    # clear it here (not in a fixture) to keep them offline too.
    for name in [n for n in os.environ if n.startswith("OPENAI_")]:
        del os.environ[name]
    os.environ["LEARN_HERMES_HOME"] = tempfile.mkdtemp(prefix="learn-hermes-tests-")
    os.environ["NO_COLOR"] = "1"
    use_one_certificate()


def pytest_collection_modifyitems(config, items):
    # A test of hardening runs on the hardened edition only: its teaching-edition cases
    # (a parameter naming a teaching stage) are left out.
    teaching_cases = [item for item in items if hasattr(item, "get_closest_marker")
                      and item.get_closest_marker("hardening") and teaching_stage_parameter(item)]
    if teaching_cases:
        config.hook.pytest_deselected(items=teaching_cases)
        left_out = {id(item) for item in teaching_cases}
        items[:] = [item for item in items if id(item) not in left_out]


def teaching_stage_parameter(item) -> bool:
    parameters = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(value, str) and TEACHING_STAGE.match(value)
               for value in parameters.values())


def use_one_certificate() -> None:
    """Every openai client loads the machine's whole CA bundle when it is made (about 140
    certificates, 50 ms), and the suite makes thousands of clients. The tests talk plain
    http to loopback servers, never TLS, so one certificate of that bundle is enough to
    build the context (0.5 ms). Tests only: a learner's run uses the whole bundle."""
    bundle = os.environ.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().openssl_cafile
    try:
        with open(bundle, encoding="ascii", errors="replace") as file:
            text = file.read()
    except (OSError, TypeError):
        return                              # no bundle to shorten: leave it as it is
    end = "-----END CERTIFICATE-----"
    start = text.find("-----BEGIN CERTIFICATE-----")
    if start < 0 or end not in text[start:]:
        return
    first = text[start:text.index(end, start) + len(end)] + "\n"
    handle, path = tempfile.mkstemp(prefix="learn-hermes-tests-", suffix=".pem")
    with os.fdopen(handle, "w", encoding="ascii") as file:
        file.write(first)
    os.environ["SSL_CERT_FILE"] = path


_tests = itertools.count()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """Each test gets its own state directory (not created yet) in a folder of its own,
    and no OPENAI_* variables. That folder is made with one mkdir, not by `tmp_path`,
    which costs about 2 ms: most of the suite's 12,000 tests never ask for it."""
    for name in [n for n in os.environ if n.startswith("OPENAI_")]:
        monkeypatch.delenv(name)
    folder = tmp_path_factory.getbasetemp() / "homes" / str(next(_tests))
    folder.mkdir(parents=True)
    home = folder / "learn-hermes-home"
    monkeypatch.setenv("LEARN_HERMES_HOME", str(home))
    return home


@pytest.fixture
def home(isolated_home):
    """$LEARN_HERMES_HOME of this test, created."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    return isolated_home


@pytest.fixture(autouse=True)
def offline_servers_stopped():
    """The offline servers a test's main() or open_session() started: stopped after it."""
    yield
    stop_offline_servers()


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """A test that calls a stage's main() in-process must not leave its Ctrl-C,
    SIGTERM or SIGHUP handler behind for the tests after it. Nor may an asyncio loop
    (nbclient's, when a kernel fails to start) leave its wakeup file descriptor: a later
    signal would write a byte into whatever file reuses that number."""
    names = [name for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names}
    wakeup_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    yield
    for name, handler in saved.items():
        signal.signal(getattr(signal, name), handler)
    signal.set_wakeup_fd(wakeup_fd)


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler, whatever an earlier main() installed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
