"""s02: the tool registry, the validation door, file tools and result classification.

Runs on every stage from s02 up.
"""

import json
import os

import pytest

from fake_openai import FakeOpenAI, call, reply
from helpers import clean_env, load_stage, pairing_problems, run_stage, stages_from

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


@pytest.mark.parametrize("stage_name", STAGES)
def test_unknown_toolset_is_a_one_line_error(stage_name):
    result = run_stage(stage_name, "--toolsets", "nonsense", "-p", "hi")
    assert result.returncode == 2
    assert "unknown toolset(s) nonsense" in result.stderr
    assert "Traceback" not in result.stderr


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

@pytest.mark.parametrize("stage_name", STAGES)
def test_repl_shows_landed_changes_and_offline_file_verbs(stage_name, tmp_path):
    env = clean_env(LEARN_HERMES_HOME=str(tmp_path / "home"))
    result = run_stage(stage_name, stdin="write out/n.txt hello there\nread out/n.txt\n/tools\n",
                       cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out/n.txt").read_text() == "hello there"
    assert "[landed]" in result.stdout
    assert "Wrote 11 bytes" in result.stdout and "line 1 reads: hello there" in result.stdout
    assert "file" in result.stdout and "read_file" in result.stdout      # /tools


@pytest.mark.parametrize("stage_name", STAGES)
def test_offline_raw_call_is_stopped_after_three_strikes(stage_name, tmp_path):
    env = clean_env(LEARN_HERMES_HOME=str(tmp_path / "home"))
    result = run_stage(stage_name, stdin='call write_file {"path": \n', cwd=tmp_path, env=env)
    assert result.stdout.count("Invalid JSON arguments for write_file") == 3
    assert "3 turns in a row" in result.stdout
