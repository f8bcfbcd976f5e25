"""s01: the agent loop, the terminal tool, the command line and endpoint errors.

Every test runs on every stage from s01 up, because every stage carries the loop.
"""

import io
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
from helpers import (HARDENED, base_stage, clean_env, dies_soon, edition_of, first_and_newest,
                     fresh_stage, load_stage, pairing_problems, pid_alive, pid_in_file,
                     pid_of_running_command, repl_output, run_main, short, stages_from,
                     start_agent, started_session, type_line)

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


def error_lines(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.strip()]


def run_against(stage, server, *argv, stdin="", **env):
    """main(argv) in this process, talking to the fake server (OPENAI_BASE_URL)."""
    return run_main(stage, *argv, stdin=stdin, env=clean_env(OPENAI_BASE_URL=server.url, **env))


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
    assert "unknown tool 'no_such_tool'" in results["c1"] or \
        "Tool 'no_such_tool' does not exist" in results["c1"]      # s02's validation door
    for failed in ("c1", "c2", "c3"):       # nothing ran: no exit code, an error instead
        assert "exit_code" not in results[failed]
        assert "error" in results[failed].lower() or "does not exist" in results[failed]
    assert_every_request_paired(server)


MALFORMED_CALLS = [
    raw_call({"id": "m1", "type": "function",
              "function": {"name": "terminal", "arguments": {"command": "echo dict-args"}}}),
    raw_call({"id": "m3", "type": "function", "function": {"name": None, "arguments": "{}"}}),
    raw_call({"id": "m2", "type": "custom", "custom": {"name": "terminal", "input": "ls"}}),
    raw_call({"id": "m4", "type": "function"}),
    raw_call({"id": "m5", "type": "function", "function": {"name": ["x"], "arguments": "{}"}}),
    call("terminal", '{"command": "echo", "timeout": 1' + "0" * 5000 + "}", "m6"),
    call("terminal", "[" * 100_000 + "]" * 100_000, "m7"),
    call("terminal", '{"command": "echo \\ud800 lone surrogate"}', "m8"),
    raw_call({"id": "m9\ud800", "type": "function",
              "function": {"name": "terminal", "arguments": '{"command": "echo id"}'}}),
]


def check_malformed_calls(stage, calls):
    with FakeOpenAI([reply("", *calls), reply("still here")]) as server:
        answer, messages = run_loop(stage, server)
    assert answer == "still here"
    asked = [call["raw"]["id"] if "raw" in call else call["id"] for call in calls]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == \
        [call_id.replace("\ud800", "?") for call_id in asked]
    assert_every_request_paired(server)
    json.dumps(messages).encode("utf-8")       # everything is valid, encodable text


def test_malformed_tool_calls_get_a_result_each_and_never_crash(stage):
    check_malformed_calls(stage, MALFORMED_CALLS)


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
]


@pytest.mark.parametrize("body", NOT_A_COMPLETION)
def test_an_answer_that_is_not_a_chat_completion_is_one_line(stage, body):
    with FakeOpenAI([body]) as server:
        result = run_against(stage, server, "-p", "hi")
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1 and "not a chat completion" in lines[0], result.stderr


@pytest.mark.parametrize("status", [501, 405])
def test_a_static_web_server_is_not_told_to_try_later(stage, status):
    """A POST to a static web server gets 501 or 405: no wait turns it into an API."""
    with FakeOpenAI([http_error(status)]) as server:
        result = run_against(stage, server, "-p", "hi", OPENAI_API_KEY="k")
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1 and f"HTTP {status}" in lines[0] and "later" not in lines[0], lines


def test_both_editions_offer_the_same_terminal_tool(stage):
    """The teaching edition is shorter, never a different interface."""
    hardened = load_stage(HARDENED + base_stage(stage.__stage__))
    assert stage.TERMINAL_SCHEMA == hardened.TERMINAL_SCHEMA
    function = stage.TERMINAL_SCHEMA["function"]
    assert function["name"] == "terminal" and function["parameters"]["required"] == ["command"]
    assert set(function["parameters"]["properties"]) == {"command", "timeout"}


NOT_AN_API = [            # what a static web server or a web page behind the URL answers
    http_error(501, "Unsupported method ('POST')"),
    http_error(405, "Method Not Allowed"),
    raw_body("<html><body>Welcome to nginx!</body></html>", "text/html"),
    raw_body("<html><body>Index of /</body></html>", "application/json"),
]


@pytest.mark.hardening
@pytest.mark.parametrize("answer", NOT_AN_API)
def test_a_url_that_is_not_an_api_is_named_as_such(stage, answer):
    """Not "try again later": no retry turns a web server into a chat API."""
    with FakeOpenAI([answer]) as server:
        result = run_against(stage, server, "-p", "hi", OPENAI_API_KEY="k")
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert f"{server.url}/ is not an OpenAI-compatible API" in lines[0]
    assert lines[0].endswith("check OPENAI_BASE_URL.") and "later" not in lines[0]


@pytest.mark.parametrize("stage_name", STAGES)
def test_a_turn_cancelled_before_its_first_tool_still_answers_every_call(stage_name, tmp_path,
                                                                         monkeypatch):
    """Ctrl-C can land after the model's answer is appended and before run_tool_calls()
    starts: repl() answers the open calls itself, and the REPL goes on."""
    monkeypatch.chdir(tmp_path)
    stage = fresh_stage(stage_name)
    session = started_session(stage, "--offline")

    def cancelled_turn(session, text):
        session.messages.append({"role": "user", "content": text})
        session.messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "late", "type": "function",
             "function": {"name": "terminal", "arguments": "{}"}}]})
        raise KeyboardInterrupt
    stage.run_turn = cancelled_turn
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    assert stage.repl(session) == 0
    assert pairing_problems(session.messages) == []
    assert session.messages[-1]["tool_call_id"] == "late"


@pytest.mark.parametrize("stage_name", STAGES)
def test_a_second_ctrl_c_during_the_clean_up_is_ignored(stage_name):
    """A held key sends Ctrl-C again while the cancelled turn cleans up: CtrlC ignores it
    until the REPL is ready, so the clean-up is never cut in half."""
    stage = fresh_stage(stage_name)
    cleaned = []

    def turn():
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)                   # never reached: the handler raises first
        except KeyboardInterrupt:
            signal.raise_signal(signal.SIGINT)
            cleaned.append("clean-up finished")
            raise
    stage.CtrlC.install()
    with pytest.raises(KeyboardInterrupt):
        stage.CtrlC.allow(turn)
    assert cleaned == ["clean-up finished"]
    assert stage.CtrlC.armed is False       # until the REPL allows the next turn


def test_max_iterations_flag_limits_the_turn(stage, tmp_path):
    result = run_main(stage, "--max-iterations", "1", "-p", "$ echo once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "    once\n" in result.stdout
    assert "[stopped: this turn reached its limit of 1 model call(s)" in result.stdout


def test_iteration_limit_ends_the_turn_with_a_clear_message(stage):
    turns = [reply("", call("terminal", {"command": f"echo {n}"})) for n in range(5)]
    with FakeOpenAI(turns) as server:
        answer, messages = run_loop(stage, server, max_iterations=3)
    assert len(server.requests) == 3
    assert "limit of 3 model call" in answer and "--max-iterations" in answer
    assert pairing_problems(messages) == []


def test_default_iteration_limit_is_30(stage):
    assert stage.MAX_ITERATIONS == 30


WAITING_FOR_A_COMMAND = {"communicate", "wait_for_command"}    # teaching, hardened


def waits_for_the_command(thread_id: int, within: float = 60.0) -> bool:
    """True once the thread waits for a running command (run_terminal() is past Popen).
    A Ctrl-C just as the command starts is test_ctrl_c_just_as_the_command_starts_...:
    the teaching edition leaves that window open (its chapter says so)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        frame, names = sys._current_frames().get(thread_id), set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if names & WAITING_FOR_A_COMMAND:
            return True
        time.sleep(0.01)
    return False


def interrupt_once_running(pid_file: Path) -> threading.Thread:
    """Ctrl-C for this process, sent once the command has written its pid (it runs) and
    the agent waits for it."""
    main_thread = threading.main_thread().ident

    def send():
        if pid_in_file(pid_file) is not None and waits_for_the_command(main_thread):
            signal.pthread_kill(main_thread, signal.SIGINT)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_during_a_tool_answers_every_call_and_kills_the_command(stage, tmp_path,
                                                                       monkeypatch, ctrl_c_raises):
    monkeypatch.chdir(tmp_path)
    calls = [call("terminal", {"command": "echo $$ > shell.pid; exec sleep 30"}, "slow"),
             call("terminal", {"command": "echo never > never.txt"}, "later")]
    with FakeOpenAI([reply("", *calls)]) as server:
        client = stage.make_client(server.url, "k")
        messages = [{"role": "user", "content": "go"}]
        sender = interrupt_once_running(tmp_path / "shell.pid")
        try:
            stage.run_conversation(client, "fake-model", messages)
        except KeyboardInterrupt:
            pass
        else:
            pytest.fail("no Ctrl-C arrived: the command never wrote shell.pid")
        sender.join()
    assert pairing_problems(messages) == []
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["slow", "later"]
    assert all("interrupted" in m["content"] for m in messages if m["role"] == "tool")
    assert not (tmp_path / "never.txt").exists()
    assert dies_soon(int((tmp_path / "shell.pid").read_text()))


@pytest.mark.hardening
def test_ctrl_c_just_as_the_command_starts_still_kills_it(stage, tmp_path, monkeypatch,
                                                         ctrl_c_raises):
    """A signal that lands right after Popen created the process, before the agent holds
    its handle, must not leave the command running (it has its own session, so the
    terminal's Ctrl-C never reaches it). The teaching edition calls Popen in the main
    thread: this window is open there (the chapter's "Under attack" names it)."""
    monkeypatch.chdir(tmp_path)
    real_popen, main_thread = subprocess.Popen, threading.main_thread().ident

    def popen_then_ctrl_c(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        signal.pthread_kill(main_thread, signal.SIGINT)
        time.sleep(0.05)            # in the main thread, the handler runs here
        return proc
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(subprocess, "Popen", popen_then_ctrl_c)
        stage.run_terminal("echo $$ > shell.pid; exec sleep 30")
    pid = pid_in_file(tmp_path / "shell.pid")
    assert pid is not None, "the command never started"
    try:
        assert dies_soon(pid), "the command outlived the Ctrl-C"
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


# ── the terminal tool ─────────────────────────────────────────────────────

def test_terminal_returns_output_and_exit_code(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = json.loads(stage.run_terminal("echo out; echo err >&2; pwd; exit 3"))
    assert result["exit_code"] == 3
    assert result["output"].split() == ["out", "err", str(tmp_path)]


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_timeout_kills_a_term_ignoring_child_and_its_grandchildren(stage_name, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    stage = load_stage(stage_name)
    script = ("trap '' TERM; "
              "(trap '' TERM; echo $$ > /dev/null; sh -c 'echo $$ > grandchild.pid; "
              "trap \"\" TERM; sleep 30; touch survived' ) & "
              "echo $$ > child.pid; sleep 30")
    result = json.loads(stage.run_terminal(script, timeout=1))
    assert result["exit_code"] == 124
    assert "timed out after 1s" in result["output"]
    for name in ("child.pid", "grandchild.pid"):
        assert dies_soon(int((tmp_path / name).read_text())), name
    assert not (tmp_path / "survived").exists()


def run_with_escapees(stage_name, tmp_path) -> dict:
    """A command whose two `setsid` escapees hold its output pipe after a 1 s timeout:
    one silently, one writing without end. Returns the result; the writer must be cut
    off by the closed pipe, and both escapees are killed afterwards in any case."""
    stage = fresh_stage(stage_name)
    stage.DRAIN_AFTER_KILL = 0.1                # the escapees would hold the pipe for 30 s
    result = json.loads(stage.run_terminal(
        "echo before; setsid sh -c 'echo $$ > holder.pid; exec sleep 30' & "
        "setsid sh -c 'echo $$ > writer.pid; exec yes' & sleep 30", timeout=1))
    escapees = [pid_in_file(tmp_path / name, within=1) for name in ("holder.pid", "writer.pid")]
    try:
        assert result["exit_code"] == 124
        assert result["output"].startswith("before\n")
        assert dies_soon(escapees[1]), "the escaped writer was not cut off"
    finally:
        for pid in escapees:
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    return result


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_a_timeout_is_not_held_up_by_processes_that_escaped_the_group(stage_name, tmp_path,
                                                                      monkeypatch):
    """`setsid` takes a process out of the command's group, so the kill misses it. One
    escapee holds the output pipe silently, one writes to it without end: the tool still
    returns after the timeout, and closing the pipe ends the writer."""
    monkeypatch.chdir(tmp_path)
    run_with_escapees(stage_name, tmp_path)


@pytest.mark.hardening
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_the_output_says_a_process_outside_the_group_held_it(stage_name, tmp_path,
                                                              monkeypatch):
    """The hardened edition reads while it waits, and says why the output stopped."""
    monkeypatch.chdir(tmp_path)
    result = run_with_escapees(stage_name, tmp_path)
    assert "a process outside the group still holds the output" in result["output"]


def test_long_output_keeps_head_and_tail_with_a_marker(stage):
    command = f"{sys.executable} -c \"print('START' + 'x' * 50000 + 'END')\""
    output = json.loads(stage.run_terminal(command))["output"]
    assert output.startswith("START") and output.rstrip().endswith("END")
    cut = 50000 + len("START") + len("END") + 1 - stage.MAX_OUTPUT_CHARS
    assert f"[{cut} characters truncated]" in output
    assert len(output) < stage.MAX_OUTPUT_CHARS + 100


@pytest.mark.parametrize("size", [12_000, 12_001, 24_000])     # the limit, one over, twice
def test_output_at_the_limit_is_whole_or_cut_to_head_and_tail(stage, size, tmp_path):
    """The teaching edition cuts the output once the command has ended; the hardened one
    keeps head and tail while it runs (BoundedOutput, below): the same text either way."""
    text = "".join(chr(65 + n % 26) for n in range(size))
    (tmp_path / "out.txt").write_text(text)
    output = json.loads(stage.run_terminal(f"cat {tmp_path / 'out.txt'}"))["output"]
    cut, half = size - stage.MAX_OUTPUT_CHARS, stage.MAX_OUTPUT_CHARS // 2
    assert output == (text if cut <= 0 else
                      f"{text[:half]}\n... [{cut} characters truncated] ...\n{text[half + cut:]}")


@pytest.mark.hardening
@pytest.mark.parametrize("chunks", [["abcdefghijkl"], list("abcdefghijkl"), ["abc", "defghijkl"]])
def test_bounded_output_keeps_head_and_tail_however_it_arrives(stage, chunks):
    output = stage.BoundedOutput(limit=10)
    for chunk in chunks:
        output.add(chunk)
    assert output.text() == "abcde\n... [2 characters truncated] ...\nhijkl"


@pytest.mark.hardening
@pytest.mark.parametrize("chunks", [["abcdefghijkl"], list("abcdefghijkl"), ["abc", "defghijkl"]])
def test_bounded_output_holds_only_head_and_tail_in_memory(stage, chunks):
    """The hardened edition reads output while the command runs: the middle is counted,
    never kept (the teaching edition keeps a command's whole output until it ends)."""
    output = stage.BoundedOutput(limit=10)
    for chunk in chunks:
        output.add(chunk)
    assert len(output.head) + len(output.tail) == 10


@pytest.mark.hardening
def test_bounded_output_keeps_short_output_whole(stage):
    output = stage.BoundedOutput(limit=10)
    output.add("abcdefghij")
    assert output.text() == "abcdefghij"


@pytest.mark.parametrize("size,expected", [
    (10, "0123456789"),                                              # exactly the limit
    (11, "01234\n... [1 characters truncated] ...\n6789a"),           # one over: never lost
    (20, "01234\n... [10 characters truncated] ...\nfghij"),          # twice the limit
])
@pytest.mark.hardening
def test_bounded_output_at_the_limit(stage, size, expected):
    for chunks in (["0123456789abcdefghij"[:size]], list("0123456789abcdefghij"[:size])):
        output = stage.BoundedOutput(limit=10)
        for chunk in chunks:
            output.add(chunk)
        assert output.text() == expected, chunks


def test_huge_output_is_counted_not_kept(stage):
    output = json.loads(stage.run_terminal("yes | head -c 20000000", timeout=60))["output"]
    cut = 20_000_000 - stage.MAX_OUTPUT_CHARS
    assert f"[{cut} characters truncated]" in output
    assert len(output) < stage.MAX_OUTPUT_CHARS + 100


def test_non_utf8_output_is_replaced_not_fatal(stage):
    result = json.loads(stage.run_terminal(r"printf 'caf\351 \377\376 ok\n'"))
    assert result["exit_code"] == 0
    assert result["output"] == "caf\ufffd \ufffd\ufffd ok\n"


@pytest.mark.parametrize("bad", [{"command": ""}, {"command": "touch ran", "timeout": 0},
                                 {"command": "touch ran", "timeout": "5"},
                                 {"command": "touch ran", "timeout": True},
                                 {"command": "touch ran", "timeout": 10_000},
                                 {"command": "touch ran", "timeout": 601}])
def test_bad_terminal_arguments_get_an_error_and_run_nothing(stage, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "error" in json.loads(stage.run_terminal(**bad))
    assert not (tmp_path / "ran").exists()


def test_the_longest_timeout_the_model_may_ask_for_is_allowed(stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = json.loads(stage.run_terminal("echo ok", timeout=stage.MAX_TERMINAL_TIMEOUT))
    assert (result["output"], result["exit_code"], stage.MAX_TERMINAL_TIMEOUT) == ("ok\n", 0, 600)


@pytest.mark.hardening
def test_terminal_in_a_deleted_folder_gives_a_clear_error(stage, tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    result = json.loads(stage.run_terminal("echo hi"))
    assert set(result) == {"error"}
    assert "working directory is gone" in result["error"]


def test_a_deleted_folder_does_not_crash_the_agent(stage, tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    result = run_main(stage, "-p", "$ echo hi")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    if edition_of(stage.__stage__) == "hardened":
        assert "working directory is gone" in result.stdout
    else:                                   # the teaching edition runs it: the shell complains
        assert "\n    hi\n" in result.stdout


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


def no_retries(stage) -> list[str]:
    """From s06 on, a 429, a 5xx or a dead endpoint is retried with real waits: the s01
    behaviour (one error, one line) is what is left once the retries are used up."""
    return ["--max-retries", "0"] if hasattr(stage, "API_MAX_RETRIES") else []


@pytest.mark.parametrize("status,key,expected", ERROR_CASES)
def test_endpoint_error_gives_one_line_and_nonzero_exit(stage, status, key, expected):
    with FakeOpenAI([http_error(status)]) as server:
        keys = {"OPENAI_API_KEY": key} if key else {}
        result = run_against(stage, server, "-p", "hi", *no_retries(stage),
                             OPENAI_MODEL="fake-model", **keys)
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_unreachable_endpoint_cli(stage):
    env = clean_env(OPENAI_BASE_URL=f"http://127.0.0.1:{unused_port()}/v1", OPENAI_API_KEY="x")
    result = run_main(stage, "-p", "hi", *no_retries(stage), env=env)
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1 and "Cannot reach the endpoint" in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_repl_survives_an_endpoint_error(stage):
    with FakeOpenAI([http_error(500), reply("second answer")]) as server:
        result = run_against(stage, server, *no_retries(stage), stdin="first\nsecond\n",
                             OPENAI_API_KEY="k")
    assert result.returncode == 0
    assert f"[model gpt-4o-mini at {server.url}/; /help for commands]" in result.stderr
    assert "server error (500)" in result.stderr
    assert "second answer" in repl_output(result.stdout, f"{stage.STAGE}> ", "second")


def test_model_variable_and_flag(stage):
    with FakeOpenAI([reply("a"), reply("b")]) as server:
        assert run_against(stage, server, "-p", "hi", OPENAI_MODEL="from-env").returncode == 0
        assert run_against(stage, server, "-p", "hi", "--model", "from-flag",
                           OPENAI_MODEL="from-env").returncode == 0
    assert [r["model"] for r in server.requests] == ["from-env", "from-flag"]
    assert server.headers[0]["authorization"].startswith("Bearer ")


# ── the command line, offline ─────────────────────────────────────────────

def test_piped_repl_runs_a_command_and_exits_zero_at_eof(stage, tmp_path):
    result = run_main(stage, stdin="$ echo hi\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\n    hi\n" in repl_output(result.stdout, f"{stage.STAGE}> ", "$ echo hi")
    assert "Traceback" not in result.stderr


def offline_announcement(run) -> str:
    """The one stderr line that names the offline model."""
    lines = [line for line in error_lines(run) if "offline model" in line]
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("argv", [[], ["-p", "hi"], ["--demo"]], ids=["repl", "prompt", "demo"])
def test_the_typing_hint_appears_only_where_the_learner_can_type(stage, argv, tmp_path):
    result = run_main(stage, *argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = offline_announcement(result)
    assert line.startswith("[offline model at http://127.0.0.1:") and "no API key needed" in line
    assert ("Type '$ <command>' or /help" in line) == (argv == []), line


def test_the_repl_shows_a_long_argument_in_short(stage, tmp_path):
    """A 2 MB write_file must not print 2 MB: the REPL shows the start and a count."""
    arguments = json.dumps({"command": "echo shown", "padding": "x" * 2_000_000})
    with FakeOpenAI([reply("", call("terminal", arguments)), reply("done")]) as server:
        result = run_against(stage, server, "-p", "go", OPENAI_API_KEY="k")
    assert result.returncode == 0, result.stderr
    limit = stage.MAX_SHOWN_ARGUMENT_CHARS
    shown = f"  → terminal {arguments[:limit]}… ({len(arguments) - limit} more characters)"
    assert shown in result.stdout.splitlines()
    assert len(result.stdout) < 5_000


@pytest.mark.parametrize("extra", [0, 1])
def test_shown_arguments_at_the_limit(stage, extra):
    limit = stage.MAX_SHOWN_ARGUMENT_CHARS
    arguments = "a" * (limit + extra)
    expected = arguments if not extra else f"{'a' * limit}… (1 more characters)"
    assert stage.shown_arguments(arguments) == expected


@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_a_real_process_survives_ctrl_c_and_raw_bytes_and_ends_on_sigterm(stage_name, tmp_path):
    """What only a real process shows, as one learner's session: Ctrl-C cancels a running
    command and keeps the REPL; input bytes that are not UTF-8 become �; SIGTERM (a
    closed terminal) ends the agent and kills the command it was running."""
    proc, pids = start_agent(stage_name, tmp_path), []
    try:
        # Each pid comes a second after the start: the teaching edition's window for a
        # signal just as a command starts (test_ctrl_c_just_as_the_command_starts_...) is over.
        type_line(proc, b"$ sleep 1; echo $$ > first.pid; exec sleep 30")
        pids.append(pid_of_running_command(proc, tmp_path / "first.pid", "no command ran"))
        proc.send_signal(signal.SIGINT)
        type_line(proc, b"$ echo caf\xe9 > second.out; sleep 1; echo $$ > second.pid; "
                        b"exec sleep 30")
        pids.append(pid_of_running_command(proc, tmp_path / "second.pid",
                                           "after Ctrl-C the REPL ran nothing more"))
        proc.send_signal(signal.SIGTERM)
        out, err = (text.decode("utf-8") for text in proc.communicate(timeout=60))
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "Traceback" not in out + err
        after_cancel = out.split("[turn cancelled]", 1)[-1]
        assert "[turn cancelled]" in out and "$ echo caf\ufffd > second.out" in after_cancel, out
        assert (tmp_path / "second.out").read_text(encoding="utf-8") == "caf\ufffd\n"
        assert dies_soon(pids[0]), "Ctrl-C left the first command running"
        assert dies_soon(pids[1]), "SIGTERM left the second command running"
    finally:
        proc.kill()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_offline_model_says_when_output_was_cut(stage, tmp_path):
    result = run_main(stage, "-p", "$ yes | head -c 100000", cwd=tmp_path)
    assert result.returncode == 0
    assert f"{100_000 - 12_000} characters in the middle were cut" in result.stdout


def test_quit_ends_the_repl(stage, tmp_path):
    result = run_main(stage, stdin="/quit\n$ touch should-not-run\n", cwd=tmp_path)
    assert result.returncode == 0
    assert f"{stage.STAGE}> /quit" in result.stdout and "should-not-run" not in result.stdout
    assert not (tmp_path / "should-not-run").exists()


def test_slash_commands_work_with_prompt_too(stage, tmp_path):
    result = run_main(stage, "-p", "/help", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, stage.HELP_TEXT + "\n"), result.stderr
    unknown = run_main(stage, "-p", "/no-such-command", cwd=tmp_path)
    assert unknown.returncode == 1
    assert "unknown command /no-such-command" in unknown.stdout


def test_every_slash_command_answers_with_prompt(stage, tmp_path):
    """-p /tools (s02), -p /sessions (s03), ...: each command prints something, exits 0."""
    for name in stage.COMMANDS:
        result = run_main(stage, "-p", name, cwd=tmp_path)
        assert result.returncode == 0, (name, result.stderr)
        assert result.stdout.strip(), f"-p {name} printed nothing"
        assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("stage_name", STAGES)
def test_help_prints_the_help_text_where_it_was_asked(stage_name, tmp_path):
    help_text = load_stage(stage_name).HELP_TEXT
    assert "/help          this help" in help_text and "/quit" in help_text
    result = run_main(stage_name, stdin="/help\n$ echo after-help\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    prompt = f"{short(stage_name)}> "
    assert repl_output(result.stdout, prompt, "/help") == help_text
    assert "after-help" in repl_output(result.stdout, prompt, "$ echo after-help")


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


def test_an_answer_with_a_lone_surrogate_is_printed_not_fatal(stage):
    with FakeOpenAI([reply("broken \ud800 text")]) as server:
        result = run_against(stage, server, "-p", "hi")
    assert result.returncode == 0
    assert "broken ? text" in result.stdout
