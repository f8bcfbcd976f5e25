"""s01: the agent loop, the terminal tool, the command line and endpoint errors.

Every test runs on every stage from s01 up, because every stage carries the loop.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, call, http_error, raw_body, raw_call, reply
from helpers import clean_env, load_stage, pairing_problems, run_stage, stages_from

STAGES = stages_from("s01")


@pytest.fixture(params=STAGES)
def stage(request):
    return load_stage(request.param)


def run_loop(stage, server, user_text="go", **kwargs):
    client = stage.make_client(server.url, "test-key")
    messages = [{"role": "user", "content": user_text}]
    answer = stage.run_conversation(client, "fake-model", messages, **kwargs)
    return answer, messages


def assert_every_request_paired(server):
    for number, request in enumerate(server.requests):
        assert pairing_problems(request["messages"]) == [], f"request {number}"


# ── the loop ──────────────────────────────────────────────────────────────

def test_stops_without_tool_calls_even_if_finish_reason_says_tool_calls(stage):
    with FakeOpenAI([reply("all done", finish_reason="tool_calls")]) as server:
        answer, messages = run_loop(stage, server)
    assert answer == "all done"
    assert len(server.requests) == 1
    assert messages[-1] == {"role": "assistant", "content": "all done"}


def test_runs_tool_calls_even_if_finish_reason_says_stop(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    turns = [reply("", call("terminal", {"command": "echo ran > marker"}), finish_reason="stop"),
             reply("finished")]
    with FakeOpenAI(turns) as server:
        answer, _ = run_loop(stage, server)
    assert answer == "finished"
    assert (tmp_path / "marker").read_text().strip() == "ran"


def test_parallel_tool_calls_all_run_in_order_and_are_paired(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = [call("terminal", {"command": f"echo {word} >> order.log"}, f"call_{word}")
             for word in ("first", "second", "third")]
    with FakeOpenAI([reply("", *calls), reply("done")]) as server:
        run_loop(stage, server)
    assert (tmp_path / "order.log").read_text().split() == ["first", "second", "third"]
    sent = server.requests[1]["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == \
        ["call_first", "call_second", "call_third"]
    assert_every_request_paired(server)


def test_pairing_holds_through_errors(stage):
    """Unknown tools, broken JSON and a failing handler still get one result each."""
    bad = [call("no_such_tool", {}, "c1"), call("terminal", '{"command": ', "c2"),
           call("terminal", {"command": "echo ok", "bogus": 1}, "c3"),
           call("terminal", {"command": "echo fine"}, "c4")]
    with FakeOpenAI([reply("", *bad), reply("recovered")]) as server:
        answer, messages = run_loop(stage, server)
    assert answer == "recovered"
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert set(results) == {"c1", "c2", "c3", "c4"}
    assert "fine" in results["c4"]
    for failed in ("c1", "c2", "c3"):       # nothing ran: no exit code, an error instead
        assert "exit_code" not in results[failed]
        assert "error" in results[failed].lower() or "does not exist" in results[failed]
    assert_every_request_paired(server)


MALFORMED_CALLS = [
    raw_call({"id": "m1", "type": "function",
              "function": {"name": "terminal", "arguments": {"command": "echo dict-args"}}}),
    raw_call({"id": "m2", "type": "custom", "custom": {"name": "terminal", "input": "ls"}}),
    raw_call({"id": "m3", "type": "function", "function": {"name": None, "arguments": "{}"}}),
    raw_call({"id": "m4", "type": "function"}),
    raw_call({"id": "m5", "type": "function", "function": {"name": ["x"], "arguments": "{}"}}),
    call("terminal", '{"command": "echo", "timeout": 1' + "0" * 5000 + "}", "m6"),
    call("terminal", "[" * 100_000 + "]" * 100_000, "m7"),
    call("terminal", '{"command": "echo \\ud800 lone surrogate"}', "m8"),
    raw_call({"id": "m9\ud800", "type": "function",
              "function": {"name": "terminal", "arguments": '{"command": "echo id"}'}}),
]


def test_malformed_tool_calls_get_a_result_each_and_never_crash(stage):
    with FakeOpenAI([reply("", *MALFORMED_CALLS), reply("still here")]) as server:
        answer, messages = run_loop(stage, server)
    assert answer == "still here"
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == \
        [f"m{n}" for n in range(1, 9)] + ["m9?"]
    assert_every_request_paired(server)
    json.dumps(messages).encode("utf-8")       # everything is valid, encodable text


@pytest.mark.parametrize("event", ["tool_call", "tool_result"])
def test_ctrl_c_while_a_call_is_shown_still_answers_every_call(stage, event):
    """The REPL prints each call and result; Ctrl-C can land there, too."""
    def interrupt_on(kind, data):
        if kind == event:
            raise KeyboardInterrupt
    calls = [call("terminal", {"command": "echo a"}, "a"),
             call("terminal", {"command": "echo b"}, "b")]
    with FakeOpenAI([reply("", *calls)]) as server:
        client = stage.make_client(server.url, "k")
        messages = [{"role": "user", "content": "go"}]
        with pytest.raises(KeyboardInterrupt):
            stage.run_conversation(client, "m", messages, on_event=interrupt_on)
    assert pairing_problems(messages) == []
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["a", "b"]


NOT_A_COMPLETION = [
    raw_body('{"id": "x", "object": "chat.completion", "choices": []}'),
    raw_body('{"error": {"message": "quota exceeded"}}'),
    raw_body('{"choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}'),
    raw_body('{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": '
             '"assistant", "content": [{"type": "text", "text": "parts"}]}}]}'),
    raw_body("<html><body>Welcome to nginx!</body></html>", "text/html"),
]


@pytest.mark.parametrize("body", NOT_A_COMPLETION)
def test_an_answer_that_is_not_a_chat_completion_is_one_line(stage, body, monkeypatch, capsys):
    with FakeOpenAI([body]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "hi"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "not a chat completion" in lines[0], err


def test_iteration_limit_ends_the_turn_with_a_clear_message(stage):
    turns = [reply("", call("terminal", {"command": f"echo {n}"})) for n in range(5)]
    with FakeOpenAI(turns) as server:
        answer, messages = run_loop(stage, server, max_iterations=3)
    assert len(server.requests) == 3
    assert "limit of 3 model call" in answer and "--max-iterations" in answer
    assert pairing_problems(messages) == []


def test_default_iteration_limit_is_30(stage):
    assert stage.MAX_ITERATIONS == 30


def test_ctrl_c_during_a_tool_answers_every_call_and_kills_the_command(stage, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = [call("terminal", {"command": "echo $$ > shell.pid; exec sleep 30"}, "slow"),
             call("terminal", {"command": "echo never > never.txt"}, "later")]
    main_thread = threading.main_thread().ident
    timer = threading.Timer(1.0, signal.pthread_kill, (main_thread, signal.SIGINT))
    with FakeOpenAI([reply("", *calls)]) as server:
        client = stage.make_client(server.url, "k")
        messages = [{"role": "user", "content": "go"}]
        started = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            stage.run_conversation(client, "fake-model", messages)
    assert time.monotonic() - started < 10
    assert pairing_problems(messages) == []
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["slow", "later"]
    assert all("interrupted" in m["content"] for m in messages if m["role"] == "tool")
    assert not (tmp_path / "never.txt").exists()
    assert dies_soon(int((tmp_path / "shell.pid").read_text()))


# ── the terminal tool ─────────────────────────────────────────────────────

def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def dies_soon(pid: int, within: float = 3.0) -> bool:
    """SIGKILL is asynchronous: give the kernel a moment to finish the kill."""
    deadline = time.monotonic() + within
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_terminal_returns_output_and_exit_code(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = json.loads(stage.run_terminal("echo out; echo err >&2; pwd; exit 3"))
    assert result["exit_code"] == 3
    assert result["output"].split() == ["out", "err", str(tmp_path)]


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_timeout_kills_a_term_ignoring_child_and_its_grandchildren(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = ("trap '' TERM; "
              "(trap '' TERM; echo $$ > /dev/null; sh -c 'echo $$ > grandchild.pid; "
              "trap \"\" TERM; sleep 30; touch survived' ) & "
              "echo $$ > child.pid; sleep 30")
    started = time.monotonic()
    result = json.loads(stage.run_terminal(script, timeout=1))
    elapsed = time.monotonic() - started
    assert result["exit_code"] == 124
    assert "timed out after 1s" in result["output"]
    assert elapsed < 10
    for name in ("child.pid", "grandchild.pid"):
        assert dies_soon(int((tmp_path / name).read_text())), name
    assert not (tmp_path / "survived").exists()


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_timeout_returns_even_if_an_escaped_process_holds_the_pipe(stage, tmp_path,
                                                                   monkeypatch):
    """`setsid` leaves the process group; it must not hang the agent after a timeout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stage, "DRAIN_AFTER_KILL", 0.5)     # keep the test quick
    started = time.monotonic()
    result = json.loads(stage.run_terminal(
        "echo before; setsid sh -c 'echo $$ > escaped.pid; exec sleep 30' & sleep 30",
        timeout=1))
    escaped = int((tmp_path / "escaped.pid").read_text())
    os.kill(escaped, signal.SIGKILL)                     # clean up after ourselves
    assert result["exit_code"] == 124
    assert result["output"].startswith("before\n")
    assert "a process outside the group still holds the output" in result["output"]
    assert time.monotonic() - started < 15


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_a_writer_that_escaped_the_group_is_cut_off(stage, tmp_path, monkeypatch):
    """After a timeout the tool stops reading; closing the pipe ends an endless writer."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stage, "DRAIN_AFTER_KILL", 0.5)
    result = json.loads(stage.run_terminal(
        "setsid sh -c 'echo $$ > writer.pid; exec yes' & sleep 30", timeout=1))
    writer = int((tmp_path / "writer.pid").read_text())
    try:
        assert result["exit_code"] == 124
        assert dies_soon(writer, within=5)
    finally:
        if pid_alive(writer):
            os.kill(writer, signal.SIGKILL)


def test_long_output_keeps_head_and_tail_with_a_marker(stage):
    command = f"{sys.executable} -c \"print('START' + 'x' * 50000 + 'END')\""
    output = json.loads(stage.run_terminal(command))["output"]
    assert output.startswith("START") and output.rstrip().endswith("END")
    cut = 50000 + len("START") + len("END") + 1 - stage.MAX_OUTPUT_CHARS
    assert f"[{cut} characters truncated]" in output
    assert len(output) < stage.MAX_OUTPUT_CHARS + 100


@pytest.mark.parametrize("chunks", [["abcdefghijkl"], list("abcdefghijkl"), ["abc", "defghijkl"]])
def test_bounded_output_keeps_head_and_tail_however_it_arrives(stage, chunks):
    output = stage.BoundedOutput(limit=10)
    for chunk in chunks:
        output.add(chunk)
    assert output.text() == "abcde\n... [2 characters truncated] ...\nhijkl"
    assert len(output.head) + len(output.tail) == 10


def test_bounded_output_keeps_short_output_whole(stage):
    output = stage.BoundedOutput(limit=10)
    output.add("abcdefghij")
    assert output.text() == "abcdefghij"


def test_huge_output_is_counted_not_kept(stage):
    output = json.loads(stage.run_terminal("yes | head -c 20000000", timeout=60))["output"]
    cut = 20_000_000 - stage.MAX_OUTPUT_CHARS
    assert f"[{cut} characters truncated]" in output
    assert len(output) < stage.MAX_OUTPUT_CHARS + 100


def test_non_utf8_output_is_replaced_not_fatal(stage):
    result = json.loads(stage.run_terminal(r"printf 'caf\351 \377\376 ok\n'"))
    assert result["exit_code"] == 0
    assert result["output"] == "caf\ufffd \ufffd\ufffd ok\n"


@pytest.mark.parametrize("bad", [{"command": ""}, {"command": "echo", "timeout": 0},
                                 {"command": "echo", "timeout": "5"},
                                 {"command": "echo", "timeout": 10_000}])
def test_bad_terminal_arguments_get_an_error_and_run_nothing(stage, bad):
    assert "error" in json.loads(stage.run_terminal(**bad))


# ── endpoint errors: one line, never a traceback ──────────────────────────

def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ERROR_CASES = [
    (401, "test-key", "rejected OPENAI_API_KEY (401)"),
    (401, None, "needs a key (401): set OPENAI_API_KEY"),
    (429, "test-key", "Rate limited"),
    (404, "test-key", "Model 'fake-model' or its API was not found"),
    (500, "test-key", "server error (500)"),
    (503, "test-key", "server error (503)"),
]


@pytest.mark.parametrize("status,key,expected", ERROR_CASES)
def test_endpoint_error_gives_one_line_and_nonzero_exit(stage, status, key, expected,
                                                       monkeypatch, capsys):
    with FakeOpenAI([http_error(status)]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_MODEL", "fake-model")
        if key:
            monkeypatch.setenv("OPENAI_API_KEY", key)
        exit_code = stage.main(["-p", "hi"])
    out, err = capsys.readouterr()
    assert exit_code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("stage_name", STAGES)
def test_unreachable_endpoint_cli(stage_name):
    env = clean_env(OPENAI_BASE_URL=f"http://127.0.0.1:{unused_port()}/v1", OPENAI_API_KEY="x")
    result = run_stage(stage_name, "-p", "hi", env=env)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Cannot reach the endpoint" in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("stage_name", STAGES)
def test_repl_survives_an_endpoint_error(stage_name):
    with FakeOpenAI([http_error(500), reply("second answer")]) as server:
        env = clean_env(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="k")
        result = run_stage(stage_name, stdin="first\nsecond\n", env=env)
    assert result.returncode == 0
    assert f"[model gpt-4o-mini at {server.url}/; /help for commands]" in result.stderr
    assert "server error (500)" in result.stderr
    assert "second answer" in result.stdout


def test_model_variable_and_flag(stage, monkeypatch, capsys):
    with FakeOpenAI([reply("a"), reply("b")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_MODEL", "from-env")
        assert stage.main(["-p", "hi"]) == 0
        assert stage.main(["-p", "hi", "--model", "from-flag"]) == 0
    assert [r["model"] for r in server.requests] == ["from-env", "from-flag"]
    assert server.headers[0]["authorization"].startswith("Bearer ")


# ── the command line, offline ─────────────────────────────────────────────

@pytest.mark.parametrize("stage_name", STAGES)
def test_piped_repl_runs_a_command_and_exits_zero_at_eof(stage_name, tmp_path):
    result = run_stage(stage_name, stdin="$ echo hi\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\n    hi\n" in result.stdout
    assert "offline" in result.stderr.lower()
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("stage_name", STAGES)
def test_input_that_is_not_utf8_is_replaced_not_fatal(stage_name, tmp_path):
    result = subprocess.run([sys.executable, str(Path("agents") / f"{stage_name}.py")],
                            input=b"$ echo caf\xe9\n", capture_output=True, env=clean_env(),
                            cwd=Path(__file__).parent.parent, timeout=60)
    out = result.stdout.decode("utf-8")
    assert result.returncode == 0, result.stderr
    assert "caf\ufffd" in out and b"Traceback" not in result.stderr


def agent_running_a_long_command(stage_name, tmp_path) -> subprocess.Popen:
    """A REPL (stdin a pipe) busy with `sleep 30`, whose pid is in tmp_path/sleeper.pid."""
    proc = subprocess.Popen([sys.executable, str(Path("agents") / f"{stage_name}.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(LEARN_HERMES_HOME=str(tmp_path / "h")),
                            cwd=Path(__file__).parent.parent)
    proc.stdin.write(f"$ cd {tmp_path} && echo $$ > sleeper.pid && exec sleep 30\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 15
    while not (tmp_path / "sleeper.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    return proc


@pytest.mark.parametrize("stage_name", STAGES)
def test_sigterm_ends_the_agent_and_kills_the_running_command(stage_name, tmp_path):
    proc = agent_running_a_long_command(stage_name, tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert dies_soon(int((tmp_path / "sleeper.pid").read_text()))


@pytest.mark.parametrize("stage_name", STAGES)
def test_offline_model_says_when_output_was_cut(stage_name, tmp_path):
    result = run_stage(stage_name, "-p", "$ yes | head -c 100000", cwd=tmp_path,
                       env=clean_env(LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0
    assert f"{100_000 - 12_000} characters in the middle were cut" in result.stdout


@pytest.mark.parametrize("stage_name", STAGES)
def test_help_and_quit_commands(stage_name, tmp_path):
    result = run_stage(stage_name, stdin="/help\n/quit\n$ echo should-not-run\n", cwd=tmp_path)
    assert result.returncode == 0
    assert "/quit" in result.stdout and "$ <command>" in result.stdout
    assert "should-not-run\n" not in result.stdout.replace("$ echo should-not-run", "")


@pytest.mark.parametrize("stage_name", STAGES)
def test_ctrl_c_cancels_the_turn_and_keeps_the_repl(stage_name, tmp_path):
    proc = agent_running_a_long_command(stage_name, tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate("$ echo still-alive\n", timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "turn cancelled" in out
    assert "still-alive" in out.split("turn cancelled", 1)[1]
    assert dies_soon(int((tmp_path / "sleeper.pid").read_text()))


def test_offline_model_speaks_through_the_real_client(stage):
    """The offline model is an HTTP server; the real openai client parses its replies."""
    server = stage.start_offline_server()
    try:
        client = stage.make_client(server.url, "offline")
        messages = [{"role": "user", "content": "$ echo offline-ok"}]
        answer = stage.run_conversation(client, "offline", messages)
        other = stage.run_conversation(client, "offline",
                                       [{"role": "user", "content": "hello?"}])
    finally:
        server.shutdown()
    assert "offline-ok" in answer and "exited with code 0" in answer
    assert messages[1]["tool_calls"][0]["function"]["name"] == "terminal"
    assert "OPENAI_API_KEY" in other


def test_an_answer_with_a_lone_surrogate_is_printed_not_fatal(stage, monkeypatch, capsys):
    with FakeOpenAI([reply("broken \ud800 text")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "hi"]) == 0
    assert "broken ? text" in capsys.readouterr().out
