"""s02: the tool registry, the validation door, file tools and result classification.

Runs on every stage from s02 up.
"""

import json
import os
import re
import stat
import threading

import pytest

from fake_openai import FakeOpenAI, call, reply
from helpers import (short, clean_env, has_config_chain, load_stage, pairing_problems, run_main,
                     stages_from)

STAGES = stages_from("s02")


@pytest.fixture(params=STAGES)
def stage(request):
    return load_stage(request.param)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def names(definitions):
    return sorted(d["function"]["name"] for d in definitions)


def loop(stage, turns, tools=None, max_iterations=30):
    with FakeOpenAI(turns) as server:
        client = stage.make_client(server.url, "k")
        messages = [{"role": "user", "content": "go"}]
        answer = stage.run_conversation(client, "m", messages, max_iterations=max_iterations,
                                        tools=tools)
    return answer, messages, server


def results(messages):
    return [m["content"] for m in messages if m["role"] == "tool"]


# ── the registry ──────────────────────────────────────────────────────────

def make_entry(stage, name, toolset="demo", check_fn=None, handler=None):
    schema = stage.function_schema(name, "test tool", {"x": {"type": "string"}}, [])
    return stage.ToolEntry(name, toolset, schema, handler or (lambda x="": f"ran {x}"),
                           check_fn=check_fn)


def test_check_fn_false_or_raising_hides_the_tool_and_dispatch_refuses_it(stage):
    registry = stage.ToolRegistry()
    registry.register(make_entry(stage, "visible"))
    registry.register(make_entry(stage, "unavailable", check_fn=lambda: False))
    registry.register(make_entry(stage, "broken_check", check_fn=lambda: 1 / 0))
    assert names(registry.get_definitions()) == ["visible"]
    for hidden in ("unavailable", "broken_check"):
        assert registry.dispatch(hidden, {}) == \
            f"Tool '{hidden}' does not exist. Available tools: visible"
    assert registry.dispatch("visible", {"x": "1"}) == "ran 1"
    assert stage.ToolRegistry().dispatch("x", {}) == \
        "Tool 'x' does not exist. Available tools: (none)"


def test_toolsets_choose_what_is_offered(stage):
    registry = stage.ToolRegistry()
    registry.register(make_entry(stage, "a", "one"))
    registry.register(make_entry(stage, "b", "two"))
    assert names(registry.get_definitions(enabled_toolsets={"one"})) == ["a"]
    assert names(registry.get_definitions(disabled_toolsets={"one"})) == ["b"]
    assert names(registry.get_definitions({"one", "two"}, {"two"})) == ["a"]
    assert registry.toolsets() == ["one", "two"]


def test_duplicate_registration_is_an_error(stage):
    registry = stage.ToolRegistry()
    registry.register(make_entry(stage, "a"))
    with pytest.raises(ValueError):
        registry.register(make_entry(stage, "a"))


def test_handler_exception_becomes_an_error_result(stage):
    registry = stage.ToolRegistry()
    registry.register(make_entry(stage, "boom", handler=lambda x="": 1 / 0))
    assert registry.dispatch("boom", {}).startswith("Error: boom failed: ZeroDivisionError")


def test_default_registry_has_the_file_and_terminal_tools(stage):
    offered = set(names(stage.REGISTRY.get_definitions()))
    assert {"patch", "read_file", "search_files", "terminal", "write_file"} <= offered
    assert stage.REGISTRY.get("read_file").toolset == "file"
    assert stage.REGISTRY.get("terminal").toolset == "terminal"


# ── the validation door ───────────────────────────────────────────────────

def test_unknown_tool_gets_the_exact_message_with_the_offered_tools(stage, workdir):
    tools = stage.REGISTRY.get_definitions(enabled_toolsets={"terminal", "file"})
    answer, messages, _ = loop(stage, [reply("", call("Terminal", {"command": "echo x"})),
                                       reply("ok")], tools=tools)
    expected = ("Tool 'Terminal' does not exist. Available tools: "
                "patch, read_file, search_files, terminal, write_file")
    assert results(messages) == [expected]


@pytest.mark.parametrize("raw,fragment", [
    ('{"path": "a.txt", "content": ', "Invalid JSON"),
    ('["a.txt", "hi"]', "must be a JSON object"),
    ('"a.txt"', "must be a JSON object"),
    ('{"path": "a.txt"}', "missing required argument 'content'"),
    ('{"path": "a.txt", "content": "hi", "mode": "w"}', "unexpected argument 'mode'"),
    ('{"path": "a.txt", "content": 5}', "argument 'content' must be of type string"),
])
def test_bad_arguments_never_reach_the_handler(stage, workdir, raw, fragment):
    answer, messages, _ = loop(stage, [reply("", call("write_file", raw)), reply("ok")])
    assert fragment in results(messages)[0]
    assert not (workdir / "a.txt").exists()
    assert pairing_problems(messages) == []


def test_booleans_are_not_integers_and_empty_arguments_mean_none(stage):
    offered = {"t": stage.function_schema("t", "", {"n": {"type": "integer"}}, [])}
    assert stage.validate_tool_call("t", "", offered) == ({}, None)
    assert stage.validate_tool_call("t", '{"n": 3}', offered) == ({"n": 3}, None)
    args, error = stage.validate_tool_call("t", '{"n": true}', offered)
    assert args is None and "must be of type integer" in error


def test_three_all_invalid_turns_end_the_turn(stage, workdir):
    bad = [reply("", call("nope", {})) for _ in range(5)]
    answer, messages, server = loop(stage, bad)
    assert len(server.requests) == 3
    assert "3 turns in a row" in answer and "nope" in answer
    assert pairing_problems(messages) == []


def test_a_turn_with_any_valid_call_resets_the_strikes(stage, workdir):
    mixed = reply("", call("nope", {}), call("terminal", {"command": "echo valid"}))
    turns = [reply("", call("nope", {})), reply("", call("nope", {})), mixed,
             reply("", call("nope", {})), reply("", call("nope", {})), reply("finished")]
    answer, messages, server = loop(stage, turns)
    assert answer == "finished" and len(server.requests) == 6
    mixed_results = results(messages)[2:4]
    assert mixed_results[0].startswith("Tool 'nope' does not exist")
    assert "valid" in json.loads(mixed_results[1])["output"]


def test_a_disabled_toolset_is_not_offered_and_cannot_be_called(stage, workdir):
    tools = stage.REGISTRY.get_definitions(enabled_toolsets={"terminal"})
    turns = [reply("", call("write_file", {"path": "x.txt", "content": "hi"})), reply("ok")]
    answer, messages, server = loop(stage, turns, tools=tools)
    assert names(server.requests[0]["tools"]) == ["terminal"]
    assert results(messages)[0] == "Tool 'write_file' does not exist. Available tools: terminal"
    assert not (workdir / "x.txt").exists()


def test_cli_toolset_flags(stage, monkeypatch, capsys):
    with FakeOpenAI([reply("a")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "hi", "--toolsets", "file,terminal",
                           "--disable-toolsets", "file"]) == 0
    assert names(server.requests[0]["tools"]) == ["terminal"]


def test_unknown_toolset_is_a_one_line_error(stage):
    result = run_main(stage, "--toolsets", "nonsense", "-p", "hi")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    unknown = "unknown 'nonsense'; known: " if has_config_chain(stage) else \
        "unknown toolset(s) nonsense (known: "              # s11 checks every flag itself
    assert len(errors) == 1 and unknown in errors[0]
    assert "file, " in errors[0] and "terminal" in errors[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    disabled = run_main(stage, "--disable-toolsets", "fil", "-p", "hi")
    assert disabled.returncode == 2 and "fil" in disabled.stderr and disabled.stdout == ""


# ── file tools ────────────────────────────────────────────────────────────

def test_write_file_creates_parents_and_reports_bytes(stage, workdir):
    result = json.loads(stage.write_file("deep/er/notes.txt", "héllo\n"))
    assert result == {"bytes_written": 7, "path": str(workdir / "deep/er/notes.txt")}
    assert (workdir / "deep/er/notes.txt").read_text(encoding="utf-8") == "héllo\n"


def test_read_file_numbers_lines_and_respects_offset_and_limit(stage, workdir):
    (workdir / "f.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    result = json.loads(stage.read_file("f.txt", offset=3, limit=2))
    assert result["content"] == "     3|line 3\n     4|line 4"
    assert result["total_lines"] == 10 and result["shown"] == "3-4"
    assert "error" in json.loads(stage.read_file("missing.txt"))
    assert "error" in json.loads(stage.read_file("f.txt", limit=stage.MAX_READ_LINES + 1))


def test_read_file_says_a_missing_path_does_not_exist(stage, workdir):
    """`read nonexistent.txt` said "not a file" (issue 23): a missing path is no such file,
    a folder is still not a file."""
    (workdir / "folder").mkdir()
    assert json.loads(stage.read_file("nonexistent.txt")) == {
        "error": "no such file: nonexistent.txt"}
    assert json.loads(stage.read_file("folder"))["error"].startswith("not a file: folder")


def test_read_file_is_capped(stage, workdir):
    (workdir / "big.txt").write_text("x\n" * (stage.MAX_READ_LINES + 50))
    result = json.loads(stage.read_file("big.txt"))
    assert result["shown"] == f"1-{stage.MAX_READ_LINES}"
    assert result["content"].count("\n") == stage.MAX_READ_LINES - 1


def test_read_file_cuts_a_huge_line_without_reading_it_whole(stage, workdir):
    with open(workdir / "bundle.min.js", "w") as file:
        file.write("x" * 3_000_000 + "\nsecond line\n")
    result = json.loads(stage.read_file("bundle.min.js"))
    first, second = result["content"].split("\n")
    cut = 3_000_000 - stage.MAX_LINE_CHARS
    assert first == "     1|" + "x" * stage.MAX_LINE_CHARS + f" … [{cut} characters of this line cut]"
    assert second == "     2|second line" and result["total_lines"] == 2


def test_a_line_one_character_too_long_is_cut(stage, workdir):
    (workdir / "long.txt").write_text("y" * (stage.MAX_LINE_CHARS + 1) + "\nshort\n")
    first, second = json.loads(stage.read_file("long.txt"))["content"].split("\n")
    assert first == "     1|" + "y" * stage.MAX_LINE_CHARS + " … [1 characters of this line cut]"
    assert second == "     2|short"
    (workdir / "exact.txt").write_text("z" * stage.MAX_LINE_CHARS + "\n")
    assert json.loads(stage.read_file("exact.txt"))["content"] == \
        "     1|" + "z" * stage.MAX_LINE_CHARS


def test_patch_replaces_unique_text_and_refuses_missing_or_ambiguous(stage, workdir):
    target = workdir / "code.py"
    target.write_text("a = 1\nb = 1\n")
    assert "not found" in json.loads(stage.patch("code.py", "c = 1", "c = 2"))["error"]
    ambiguous = json.loads(stage.patch("code.py", "= 1", "= 2"))
    assert "appears 2 times" in ambiguous["error"]
    assert target.read_text() == "a = 1\nb = 1\n"
    assert json.loads(stage.patch("code.py", "a = 1", "a = 9")) == \
        {"success": True, "replacements": 1, "path": str(target)}
    assert json.loads(stage.patch("code.py", "= ", "== ", replace_all=True))["replacements"] == 2
    assert target.read_text() == "a == 9\nb == 1\n"


def test_search_files_formats_filters_and_caps(stage, workdir):
    (workdir / "src").mkdir()
    (workdir / "src/a.py").write_text("import os\nTODO: one\n")
    (workdir / "src/b.txt").write_text("TODO: two\n")
    (workdir / ".git").mkdir()
    (workdir / ".git/config").write_text("TODO: hidden\n")
    result = json.loads(stage.search_files("TODO", "src", "*.py"))
    assert result == {"matches": ["src/a.py:2: TODO: one"], "truncated": False}
    everything = json.loads(stage.search_files("TODO"))["matches"]
    assert len(everything) == 2 and not any(".git" in m for m in everything)
    (workdir / "many.txt").write_text("hit\n" * (stage.MAX_SEARCH_MATCHES + 5))
    capped = json.loads(stage.search_files("hit", "."))
    assert len(capped["matches"]) == stage.MAX_SEARCH_MATCHES and capped["truncated"]
    assert "invalid regular expression" in json.loads(stage.search_files("(unclosed"))["error"]
    (workdir / "huge.txt").write_text("hit\n" * (stage.MAX_SEARCH_FILE_BYTES // 4 + 1))
    assert "is larger than" in json.loads(stage.search_files("hit", "huge.txt"))["error"]
    assert "huge.txt" not in " ".join(json.loads(stage.search_files("hit", "."))["matches"])


def test_patch_keeps_windows_line_endings(stage, workdir):
    (workdir / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    assert json.loads(stage.patch("crlf.txt", "two", "2"))["success"] is True
    assert (workdir / "crlf.txt").read_bytes() == b"one\r\n2\r\nthree\r\n"


def test_search_files_skips_fifos_and_devices(stage, workdir):
    (workdir / "d").mkdir()
    (workdir / "d/real.txt").write_text("hello\n")
    os.mkfifo(workdir / "d/pipe")                       # reading it would block forever
    (workdir / "d/zero").symlink_to("/dev/zero")         # reading it would never end
    assert json.loads(stage.search_files("hello", "d"))["matches"] == ["d/real.txt:1: hello"]
    assert "error" in json.loads(stage.read_file("d/pipe"))


@pytest.mark.hardening
def test_write_file_and_patch_leave_a_fifo_alone(stage, workdir):
    # A FIFO stands in for /dev/null: the rename would have replaced it with a plain file.
    os.mkfifo(workdir / "pipe")
    (workdir / "link").symlink_to("pipe")
    for name in ("pipe", "link"):
        result = json.loads(stage.write_file(name, "x"))
        assert "not a regular file" in result.get("error", ""), result
        assert "error" in json.loads(stage.patch(name, "x", "y"))
    assert stat.S_ISFIFO(os.stat(workdir / "pipe").st_mode)
    assert folder_listing(workdir) == ["link", "pipe"]     # no temporary file left


def test_search_files_skips_a_file_it_may_not_read(stage, workdir):
    (workdir / "open.txt").write_text("needle\n")
    (workdir / "secret.txt").write_text("needle\n")
    (workdir / "secret.txt").chmod(0)
    if os.access(workdir / "secret.txt", os.R_OK):
        pytest.skip("this user may read every file (root)")
    assert json.loads(stage.search_files("needle", "."))["matches"] == ["open.txt:1: needle"]


def test_search_files_numbers_lines_as_read_file_does(stage, workdir):
    # Form feed, \x1c and \u2028 end a line for str.splitlines() but not for read_file.
    (workdir / "odd.py").write_text("a = 1\n\x0c\nb = 2\nc\x1cd\ne\u2028f\nTARGET = 3\n",
                                    encoding="utf-8")
    shown = json.loads(stage.read_file("odd.py"))["content"].split("\n")
    read_number = next(int(line.split("|")[0]) for line in shown if "TARGET" in line)
    assert json.loads(stage.search_files("TARGET", "."))["matches"] == \
        [f"odd.py:{read_number}: TARGET = 3"]


# ── file writes are atomic ────────────────────────────────────────────────

def folder_listing(folder):
    return sorted(os.listdir(folder))


UNENCODABLE = "caf\ud800"                     # a lone surrogate: no UTF-8 for it


def test_patch_with_unencodable_text_changes_nothing(stage, workdir):
    target = workdir / "notes.txt"
    target.write_bytes(b"one\r\ntwo\n")
    target.chmod(0o640)
    result = json.loads(stage.patch("notes.txt", "two", UNENCODABLE))
    assert result["error"].startswith("nothing written to notes.txt: 'utf-8' codec can't encode")
    assert target.read_bytes() == b"one\r\ntwo\n"
    assert target.stat().st_mode & 0o7777 == 0o640
    assert folder_listing(workdir) == ["notes.txt"]            # no temporary file left
    assert stage.classify_tool_result("patch", json.dumps(result)) == "error"


def test_write_file_with_unencodable_text_changes_nothing(stage, workdir):
    (workdir / "old.txt").write_text("keep me\n")
    assert "nothing written" in json.loads(stage.write_file("old.txt", UNENCODABLE))["error"]
    assert (workdir / "old.txt").read_text() == "keep me\n"
    assert "nothing written" in json.loads(stage.write_file("new/dir/x.txt", UNENCODABLE))["error"]
    assert folder_listing(workdir) == ["old.txt"]              # not even the folders


@pytest.mark.parametrize("mode", [0o600, 0o755])
def test_writes_keep_the_file_mode(stage, workdir, mode):
    target = workdir / "script.sh"
    target.write_text("echo one\n")
    target.chmod(mode)
    assert json.loads(stage.write_file("script.sh", "echo two\n"))["bytes_written"] == 9
    assert target.stat().st_mode & 0o7777 == mode
    assert json.loads(stage.patch("script.sh", "two", "three"))["success"] is True
    assert target.stat().st_mode & 0o7777 == mode
    assert target.read_text() == "echo three\n" and folder_listing(workdir) == ["script.sh"]


def test_a_new_file_gets_the_mode_the_umask_allows(stage, workdir):
    previous = os.umask(0o027)
    try:
        stage.write_file("fresh.txt", "x")
    finally:
        os.umask(previous)
    assert (workdir / "fresh.txt").stat().st_mode & 0o7777 == 0o640


def test_a_write_that_fails_midway_keeps_the_old_file(stage, workdir, monkeypatch):
    (workdir / "data.txt").write_text("old content\n")

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", disk_full)
    result = json.loads(stage.write_file("data.txt", "new content\n"))
    assert result["error"] == "nothing written to data.txt: [Errno 28] No space left on device"
    assert (workdir / "data.txt").read_text() == "old content\n"
    assert folder_listing(workdir) == ["data.txt"]


def test_a_write_through_a_symbolic_link_keeps_the_link(stage, workdir):
    (workdir / "real.txt").write_text("old\n")
    (workdir / "link.txt").symlink_to("real.txt")
    assert json.loads(stage.write_file("link.txt", "new\n"))["path"] == str(workdir / "real.txt")
    assert (workdir / "link.txt").is_symlink() and (workdir / "real.txt").read_text() == "new\n"


# ── a leading ~ is the home folder ────────────────────────────────────────

def test_file_tools_expand_a_leading_tilde(stage, workdir, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    (home / ".profile").write_text("export EDITOR=vi\n")
    monkeypatch.setenv("HOME", str(home))
    assert json.loads(stage.read_file("~/.profile"))["content"] == "     1|export EDITOR=vi"
    assert json.loads(stage.write_file("~/proj/x.txt", "hi\n"))["path"] == str(home / "proj/x.txt")
    assert json.loads(stage.patch("~/proj/x.txt", "hi", "ho"))["success"] is True
    assert (home / "proj/x.txt").read_text() == "ho\n"
    found = json.loads(stage.search_files("ho", "~/proj"))["matches"]
    assert found == [f"{home}/proj/x.txt:1: ho"]
    assert not (workdir / "~").exists()


# ── search_files: globs and a deadline ────────────────────────────────────

TREE = ["top.py", "src/a.py", "src/pkg/deep/b.py", "src/pkg/deep/notes.txt"]
GLOBS = [                   # (glob, the files of TREE that it matches)
    ("*.py", ["top.py", "src/a.py", "src/pkg/deep/b.py"]),
    ("b.py", ["src/pkg/deep/b.py"]),
    ("**/*.py", ["top.py", "src/a.py", "src/pkg/deep/b.py"]),
    ("src/**/*.py", ["src/a.py", "src/pkg/deep/b.py"]),
    ("src/*.py", ["src/a.py"]),
    ("**/deep/*.py", ["src/pkg/deep/b.py"]),
    ("src/**/deep/**", ["src/pkg/deep/b.py", "src/pkg/deep/notes.txt"]),
    ("./src/*/deep/b.py", ["src/pkg/deep/b.py"]),
    ("pkg/**/*.py", []),                   # path globs start at the search root
    ("*/a.py", ["src/a.py"]),
    ("src/**", ["src/a.py", "src/pkg/deep/b.py", "src/pkg/deep/notes.txt"]),
    ("**", TREE),
    ("src/**/**/*.py", ["src/a.py", "src/pkg/deep/b.py"]),     # the same as src/**/*.py
]


@pytest.mark.parametrize("glob,expected", GLOBS)
def test_glob_matches(stage, glob, expected):
    assert [name for name in TREE if stage.glob_matches(stage.Path(name), glob)] == expected


def test_search_files_uses_path_and_name_globs_below_the_root(stage, workdir):
    for name in TREE:
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text("needle\n")

    def found(path, glob):
        result = json.loads(stage.search_files("needle", path, glob))
        return [match.split(":")[0] for match in result["matches"]]
    assert found(".", "src/**/*.py") == ["src/a.py", "src/pkg/deep/b.py"]
    assert found("src", "pkg/**/*.py") == ["src/pkg/deep/b.py"]
    assert found("src", "*.txt") == ["src/pkg/deep/notes.txt"]


def call_with_deadline(function, *args, seconds=60):
    """function(*args) in a daemon thread; fail clearly if it has not returned in time."""
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(function(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"{function.__name__} did not return within {seconds} s"
    return outcome[0]


@pytest.mark.hardening
def test_many_double_stars_are_matched_without_backtracking(stage):
    # Trying each way to share 60 folders among 31 `**` would take longer than the universe.
    deep = stage.Path("/".join(["a"] * 60) + "/z.py")
    many = "/".join(["**", "a"] * 30)
    assert not call_with_deadline(stage.glob_matches, deep, many + "/**/b.py")
    assert call_with_deadline(stage.glob_matches, deep, many + "/**/*.py")


@pytest.mark.hardening
def test_a_run_of_double_stars_is_matched_as_one(stage):
    # Without folding them, each folder of the path costs (20,000 ** 2) / 2 steps: minutes.
    path = stage.Path("a/b/c.py")
    assert not call_with_deadline(stage.glob_matches, path, "**/" * 20_000 + "*.nomatch",
                                  seconds=30)
    assert call_with_deadline(stage.glob_matches, path, "a/" + "**/" * 20_000 + "*.py",
                              seconds=30)


@pytest.mark.hardening
def test_a_catastrophic_regex_is_stopped_at_the_deadline(stage, workdir, monkeypatch):
    # 2**27 ways to try: seconds of work, far beyond the deadline. (Not more: should the
    # deadline break, `re` holds the interpreter until it finishes and nothing can end it.)
    (workdir / "lines.txt").write_text("a" * 27 + "b\n")
    monkeypatch.setattr(stage, "SEARCH_TIMEOUT", 0.25)
    result = json.loads(stage.search_files("^(a+)+$", "."))
    assert "error" in result, f"the search ran to its end: {result}"
    assert result["error"].startswith("search_files stopped after 0.25 s: the pattern may")


@pytest.mark.hardening
def test_the_deadline_also_bounds_walking_the_folder(stage, workdir, monkeypatch):
    (workdir / "one.txt").write_text("x\n")
    monkeypatch.setattr(stage, "SEARCH_TIMEOUT", -1)           # already past while walking
    monkeypatch.setattr(stage, "run_search_worker", None)      # so no worker may start
    assert "stopped after -1 s" in json.loads(stage.search_files("x", "."))["error"]


@pytest.mark.hardening
def test_a_glob_that_matches_nothing_is_bounded_by_the_deadline(stage, workdir, monkeypatch):
    for name in TREE:                   # no file will ever be handed to search_files()
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text("x\n")
    monkeypatch.setattr(stage, "SEARCH_TIMEOUT", -1)           # already past while walking
    monkeypatch.setattr(stage, "run_search_worker", None)      # so no worker may start
    result = json.loads(stage.search_files("x", ".", "**/" * 3000 + "*.nomatch"))
    assert "stopped after -1 s" in result.get("error", ""), result


@pytest.mark.hardening
def test_search_files_with_nothing_to_search_starts_no_worker(stage, workdir, monkeypatch):
    monkeypatch.setattr(stage, "run_search_worker", None)      # calling it would raise
    assert json.loads(stage.search_files("x", ".")) == {"matches": [], "truncated": False}


# ── result classification ─────────────────────────────────────────────────

CLASSIFICATIONS = [
    ("write_file", '{"bytes_written": 3, "path": "/x"}', "landed"),
    ("patch", '{"success": true, "replacements": 1, "path": "/x"}', "landed"),
    ("patch", '{"error": "old_string not found in x"}', "error"),
    ("write_file", '{"error": "is a directory: x"}', "error"),
    ("write_file", '{"refused": true, "error": "protected path"}', "refused"),
    ("terminal", '{"output": "hi", "exit_code": 0}', "ok"),
    ("read_file", '{"path": "x", "content": "1|a"}', "ok"),
    ("nope", "Tool 'nope' does not exist. Available tools: terminal", "error"),
    ("write_file", "Error: Invalid JSON arguments for write_file: x", "error"),
    ("terminal", "plain text", "ok"),
    ("patch", '{"success": false}', "ok"),
]


@pytest.mark.parametrize("name,result,expected", CLASSIFICATIONS)
def test_classify_tool_result(stage, name, result, expected):
    assert stage.classify_tool_result(name, result) == expected


def test_side_effects_are_assumed_for_mutating_and_unknown_tools(stage):
    assert stage.tool_may_have_side_effect("terminal")
    assert stage.tool_may_have_side_effect("write_file")
    assert stage.tool_may_have_side_effect("patch")
    assert stage.tool_may_have_side_effect("some_unknown_tool")
    assert not stage.tool_may_have_side_effect("read_file")
    assert not stage.tool_may_have_side_effect("search_files")


# ── the REPL and the offline verbs ────────────────────────────────────────

def repl(stage_name, stdin, tmp_path, *argv):
    """The REPL of a fresh copy of the stage, in-process, fed `stdin` through a pipe."""
    env = clean_env(LEARN_HERMES_HOME=str(tmp_path / "home"))
    return run_main(stage_name, *argv, stdin=stdin, cwd=tmp_path, env=env)


def test_the_offline_model_summarises_a_plain_text_result_as_an_answer(stage):
    refused = "Tool 'nope' does not exist. Available tools: terminal"
    messages = [{"role": "user", "content": "call nope {}"},
                {"role": "assistant", "content": "", "tool_calls": []},
                {"role": "tool", "tool_call_id": "c1", "content": refused}]
    assert stage.offline_summary(messages) == f"The tool answered: {refused}"


@pytest.mark.parametrize("stage_name", STAGES)
def test_repl_shows_landed_changes_and_offline_file_verbs(stage_name, tmp_path):
    result = repl(stage_name, "write out/n.txt hello there\nread out/n.txt\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/n.txt").read_text() == "hello there"
    assert "[landed]" in result.stdout
    assert "Wrote 11 bytes" in result.stdout and "line 1 reads: hello there" in result.stdout


def outputs_by_command(stdout, stage_name, commands):
    """Split piped REPL output at the echoed prompt lines: what each command printed."""
    prompt = short(stage_name) + "> "
    parts = re.split("^" + re.escape(prompt) + r"(.*)$", stdout, flags=re.M)
    printed = dict(zip(parts[1::2], parts[2::2]))
    assert list(printed) == commands, stdout
    return printed


# Lines that only show_tools prints: each toolset, padded to 15, then its offered tools.
TOOLS_FILE_LINE = re.compile(r"^  file {12}patch, read_file, search_files, write_file$", re.M)
TOOLS_TERMINAL_LINE = re.compile(r"^  terminal {8}terminal$", re.M)
HELP_LINES = ["  /tools         the tools offered to the model, by toolset",
              "  read <path>            read a file with read_file",
              "  write <path> <text>    write a file with write_file"]


@pytest.mark.parametrize("stage_name", STAGES)
def test_tools_and_help_commands_print_their_own_text(stage_name, tmp_path):
    result = repl(stage_name, "/help\n/tools\n", tmp_path)
    printed = outputs_by_command(result.stdout, stage_name, ["/help", "/tools"])
    assert TOOLS_FILE_LINE.search(printed["/tools"]), printed["/tools"]
    assert TOOLS_TERMINAL_LINE.search(printed["/tools"]), printed["/tools"]
    assert all(line in printed["/help"].splitlines() for line in HELP_LINES), printed["/help"]
    assert not TOOLS_FILE_LINE.search(printed["/help"])
    assert not any(line in printed["/tools"] for line in HELP_LINES)


@pytest.mark.parametrize("stage_name", STAGES)
def test_tools_command_shows_a_disabled_toolset_as_not_offered(stage_name, tmp_path):
    result = repl(stage_name, "/tools\n", tmp_path, "--disable-toolsets", "file")
    assert re.search(r"^  file {12}\(not offered\)$", result.stdout, re.M), result.stdout
    assert TOOLS_TERMINAL_LINE.search(result.stdout), result.stdout


@pytest.mark.parametrize("stage_name", STAGES)
def test_offline_raw_call_is_stopped_after_three_strikes(stage_name, tmp_path):
    result = repl(stage_name, 'call write_file {"path": \n', tmp_path)
    assert result.stdout.count("Invalid JSON arguments for write_file") == 3
    assert "3 turns in a row" in result.stdout
