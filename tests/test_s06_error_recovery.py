"""s06: error recovery (classification, backoff, Retry-After, fallback), the iteration
budget and the tool-call loop guardrails.

Runs on every stage from s06 up. Errors come from the real openai client talking to
tests/fake_openai.py. Nothing waits for real: RetryPolicy's sleep and jitter are
injected, and the runs of main() use Retry-After: 0.
"""

import datetime
import email.utils
import hashlib
import json
import re
import threading

import openai
import pytest

from fake_openai import (FakeOpenAI, call, dropped_connection, http_error, no_answer,
                         reply)
from helpers import (short, clean_env, edition_of, load_stage, pairing_problems, repl_output,
                     run_main, stages_from, started_retry_policy)

STAGES = stages_from("s06")
NOW = 1_700_000_000.0                   # a fixed "now" for HTTP dates


@pytest.fixture(params=STAGES)
def stage(request):
    return load_stage(request.param)


@pytest.fixture(params=STAGES)
def stage_name(request):
    return request.param


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# One real client; with_options() copies it for each server in microseconds (a new
# client costs ~50 ms: it builds an SSL context).
CLIENT = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)


def client_for(server, timeout=10.0):
    return CLIENT.with_options(base_url=server.url, timeout=timeout)


def failure_of(turn, timeout=10.0):
    """The exception the real client raises for one scripted answer."""
    with FakeOpenAI([turn]) as server:
        with pytest.raises(openai.OpenAIError) as caught:
            client_for(server, timeout).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
    return caught.value


def recording_policy(stage, **changes):
    """A RetryPolicy that records its waits and notes instead of sleeping and printing."""
    sleeps, notes = [], []
    settings = {"sleep": sleeps.append, "jitter": lambda: 0.0, "notify": notes.append}
    policy = stage.RetryPolicy(**{**settings, **changes})
    return policy, sleeps, notes


def ask(stage, server, policy, messages=None):
    messages = messages or [{"role": "user", "content": "hi"}]
    response = stage.call_model(client_for(server), "m", messages, [], policy)
    return response.choices[0].message.content


def against(stage_name, server, *argv, stdin="", cwd=None):
    """main(argv) of a fresh copy of the stage, talking to `server` with a key."""
    return run_main(stage_name, *argv, stdin=stdin, cwd=cwd,
                    env=clean_env(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="k"))


def error_lines(run):
    return [line for line in run.stderr.splitlines() if line.strip()]


# ── classify_api_error(): every category, from real exceptions ────────────

def hardening(*case):
    """A case only the hardened edition gets right: it reads `retry-after-ms` and an
    error's words; the teaching edition reads `Retry-After` and the error's code."""
    return pytest.param(*case, marks=pytest.mark.hardening)


CATEGORIES = [
    (http_error(429, "Rate limit reached", {"Retry-After": "7"}), "rate_limit", True, 429, 7.0),
    hardening(http_error(429, "Slow down", {"retry-after-ms": "250"}), "rate_limit", True, 429,
              0.25),
    hardening(http_error(429, "You exceeded your current quota, please check your plan and "
                              "billing details."), "billing", False, 429, None),
    (http_error(429, "No credit", code="insufficient_quota"), "billing", False, 429, None),
    (http_error(402, "Payment Required"), "billing", False, 402, None),
    hardening(http_error(403, "Insufficient balance on this account"), "billing", False, 403,
              None),
    (http_error(400, "Insufficient funds", code="insufficient_quota"), "billing", False, 400,
     None),
    (http_error(401, "Incorrect API key provided"), "auth", False, 401, None),
    (http_error(403, "Forbidden"), "auth", False, 403, None),
    (http_error(404, "The model `nope` does not exist"), "model_not_found", False, 404, None),
    hardening(http_error(400, "This model's maximum context length is 8192 tokens"),
              "context_overflow", False, 400, None),
    (http_error(400, "Too long", code="context_length_exceeded"),
     "context_overflow", False, 400, None),
    hardening(http_error(400, "prompt is too long: 210000 tokens > 200000 maximum"),
              "context_overflow", False, 400, None),
    (http_error(413, "Request Entity Too Large"), "context_overflow", False, 413, None),
    (http_error(400, "Invalid value for 'messages'"), "bad_request", False, 400, None),
    (http_error(422, "Unprocessable Entity"), "bad_request", False, 422, None),
    (http_error(499, "Client Closed Request"), "bad_request", False, 499, None),
    (http_error(501, "Unsupported method ('POST')"), "bad_request", False, 501, None),
    (http_error(500, "The server had an error"), "server", True, 500, None),
    (http_error(502, "Bad gateway"), "server", True, 502, None),
    (http_error(503, "Overloaded", {"Retry-After": "2"}), "server", True, 503, 2.0),
    (http_error(529, "Overloaded"), "server", True, 529, None),
    (http_error(408, "Request Timeout"), "timeout", True, 408, None),
    (dropped_connection(), "connection", True, None, None),
]


@pytest.mark.parametrize("turn,category,retryable,status,retry_after", CATEGORIES)
def test_classify_api_error(stage, turn, category, retryable, status, retry_after):
    found = stage.classify_api_error(failure_of(turn))
    assert found == (category, retryable, status, retry_after)
    assert stage.API_ERROR_RETRYABLE[category] is retryable


def test_no_answer_in_time_is_a_timeout(stage):
    error = failure_of(no_answer(), timeout=0.3)
    assert isinstance(error, openai.APITimeoutError)
    assert stage.classify_api_error(error) == ("timeout", True, None, None)


def test_the_teaching_edition_reads_the_code_not_the_words(stage_name):
    """An error whose words say more than its status and code: the hardened edition
    reads the words, the teaching edition the status (the chapter's "Under attack")."""
    stage = load_stage(stage_name)
    hardened = edition_of(stage_name) == "hardened"
    quota = failure_of(http_error(429, "You exceeded your current quota"))
    assert stage.classify_api_error(quota).category == ("billing" if hardened else "rate_limit")
    long = failure_of(http_error(400, "This model's maximum context length is 8192 tokens"))
    assert stage.classify_api_error(long).category == \
        ("context_overflow" if hardened else "bad_request")
    slow = failure_of(http_error(429, "Slow down", {"retry-after-ms": "250"}))
    assert stage.classify_api_error(slow).retry_after == (0.25 if hardened else None)


def test_errors_that_are_not_http_errors_are_unknown_and_not_retried(stage):
    for error in (ValueError("odd"), openai.OpenAIError("odd")):
        assert stage.classify_api_error(error) == ("unknown", False, None, None)


def test_the_categories_and_what_is_retried(stage):
    assert {k for k, v in stage.API_ERROR_RETRYABLE.items() if v} == {
        "rate_limit", "server", "timeout", "connection"}
    assert set(stage.API_ERROR_RETRYABLE) == {
        "rate_limit", "server", "timeout", "connection", "auth", "billing",
        "model_not_found", "context_overflow", "tool_choice", "bad_request", "unknown"}


# ── Retry-After and the backoff ──────────────────────────────────────────

def http_date(seconds_from_now: float) -> str:
    when = datetime.datetime.fromtimestamp(NOW + seconds_from_now, datetime.timezone.utc)
    return email.utils.format_datetime(when, usegmt=True)


@pytest.mark.parametrize("headers,expected", [
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "0.5"}, 0.5),
    ({"retry-after": "0"}, 0.0),
    ({"retry-after": "-4"}, 0.0),
    # an HTTP date: only the hardened edition reads it (the teaching edition ignores it)
    pytest.param({"retry-after": http_date(30)}, 30.0, marks=pytest.mark.hardening),
    pytest.param({"retry-after": http_date(-30)}, 0.0, marks=pytest.mark.hardening),
    pytest.param({"retry-after": "Tue, 14 Nov 2023 23:13:50 +0100"}, 30.0,   # NOW + 30 s,
                 marks=pytest.mark.hardening),                                   # an hour east
    # OpenAI's retry-after-ms: only the hardened edition reads it
    pytest.param({"retry-after-ms": "1500"}, 1.5, marks=pytest.mark.hardening),
    pytest.param({"retry-after-ms": "250", "retry-after": "9"}, 0.25,   # the precise one wins
                 marks=pytest.mark.hardening),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "nan"}, None),
    ({"retry-after": "inf"}, None),
    ({"retry-after-ms": "lots"}, None),
    ({}, None),
])
def test_retry_after_seconds(stage, headers, expected):
    assert stage.retry_after_seconds(headers, now=NOW) == expected


@pytest.mark.hardening
def test_an_http_date_without_a_zone_is_read_as_gmt(stage):
    naive = http_date(45).removesuffix(" GMT")
    assert stage.retry_after_seconds({"retry-after": naive}, now=NOW) == 45.0


def test_backoff_doubles_from_the_base_up_to_the_cap(stage):
    policy, _, _ = recording_policy(stage)
    delays = [stage.backoff_delay(retry, None, policy) for retry in range(1, 8)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert stage.backoff_delay(10_000, None, policy) == 30.0      # no overflow


def test_jitter_adds_up_to_half_and_is_bounded(stage):
    policy, _, _ = recording_policy(stage, jitter=lambda: 1.0)
    assert stage.backoff_delay(1, None, policy) == 3.0
    assert stage.backoff_delay(9, None, policy) == 45.0
    policy = stage.RetryPolicy()                                  # the real random jitter
    delays = [stage.backoff_delay(2, None, policy) for _ in range(300)]
    assert all(4.0 <= delay <= 6.0 for delay in delays)
    assert len(set(delays)) > 100                                 # it does vary


def test_retry_after_wins_over_the_backoff_and_is_capped(stage):
    policy, _, _ = recording_policy(stage, jitter=lambda: 1.0)
    assert stage.backoff_delay(3, 7.0, policy) == 7.0
    assert stage.backoff_delay(1, 0.0, policy) == 0.0
    assert stage.backoff_delay(1, 3600.0, policy) == stage.MAX_RETRY_AFTER == 60.0


def test_the_recovery_constants(stage):
    assert (stage.API_MAX_RETRIES, stage.RETRY_BASE_DELAY, stage.RETRY_MAX_DELAY,
            stage.RETRY_JITTER) == (3, 2.0, 30.0, 0.5)
    policy = stage.RetryPolicy()
    assert (policy.max_retries, policy.base_delay, policy.max_delay) == (3, 2.0, 30.0)
    assert policy.fallback_client is None and policy.fallback_model is None


# ── call_model(): retries, limits, fallback ──────────────────────────────

def test_retries_what_may_work_later_then_answers(stage):
    turns = [http_error(429, "slow down", {"Retry-After": "1"}), http_error(500),
             dropped_connection(), reply("at last")]
    policy, sleeps, notes = recording_policy(stage)
    with FakeOpenAI(turns) as server:
        assert ask(stage, server, policy) == "at last"
    assert len(server.requests) == 4
    assert sleeps == [1.0, 4.0, 8.0]            # Retry-After, then the backoff's 2nd and 3rd
    assert notes == ["[rate_limit (HTTP 429): retry 1 of 3 in 1.00 s, as Retry-After asks; "
                     "Ctrl-C cancels]",                 # the first wait says how to stop it
                     "[server (HTTP 500): retry 2 of 3 in 4.00 s]",
                     "[connection (no answer): retry 3 of 3 in 8.00 s]"]


def test_max_retries_then_the_error_goes_up(stage):
    policy, sleeps, notes = recording_policy(stage, max_retries=2)
    with FakeOpenAI([http_error(503, "down")] * 5) as server:
        with pytest.raises(openai.InternalServerError):
            ask(stage, server, policy)
    assert len(server.requests) == 3
    assert sleeps == [2.0, 4.0]
    assert len(notes) == 2


def test_no_retries_at_all(stage):
    policy, sleeps, _ = recording_policy(stage, max_retries=0)
    with FakeOpenAI([http_error(429), reply("never")]) as server:
        with pytest.raises(openai.RateLimitError):
            ask(stage, server, policy)
    assert len(server.requests) == 1 and sleeps == []


def test_a_huge_retry_after_is_capped(stage):
    policy, sleeps, _ = recording_policy(stage)
    with FakeOpenAI([http_error(429, "later", {"Retry-After": "86400"}), reply("ok")]) as server:
        assert ask(stage, server, policy) == "ok"
    assert sleeps == [60.0]


NOT_RETRYABLE = [http_error(401), http_error(403), http_error(404), http_error(400),
                 http_error(402), http_error(429, "x", code="insufficient_quota"),
                 http_error(422), http_error(501)]


@pytest.mark.parametrize("turn", NOT_RETRYABLE, ids=lambda t: f"{t['status']}-{t['code']}")
def test_what_retrying_cannot_fix_is_sent_once_not_even_to_the_fallback(stage, turn):
    with FakeOpenAI([turn, reply("never")]) as server, FakeOpenAI([reply("never")]) as spare:
        policy, sleeps, notes = recording_policy(stage, fallback_client=client_for(spare),
                                                 fallback_model="backup")
        with pytest.raises(openai.APIStatusError):
            ask(stage, server, policy)
    assert len(server.requests) == 1 and spare.requests == []
    assert sleeps == [] and notes == []


def test_the_fallback_is_tried_once_when_the_retries_are_used_up(stage):
    with FakeOpenAI([http_error(503)] * 4 + [reply("never")]) as server, \
            FakeOpenAI([reply("from the fallback"), reply("never")]) as spare:
        policy, sleeps, notes = recording_policy(stage, fallback_client=client_for(spare),
                                                 fallback_model="backup")
        assert ask(stage, server, policy) == "from the fallback"
    assert len(server.requests) == 4 and len(spare.requests) == 1
    assert spare.requests[0]["model"] == "backup"
    assert spare.requests[0]["messages"] == server.requests[0]["messages"]
    assert len(sleeps) == 3
    assert notes[-1] == f"[3 retries used up: trying the fallback, backup at {spare.url}/, once]"


@pytest.mark.hardening
@pytest.mark.parametrize("max_retries, used_up", [(1, "1 retry used up"),
                                                  (0, "no retries allowed")])
def test_the_fallback_note_counts_in_words(stage, max_retries, used_up):
    with FakeOpenAI([http_error(503)] * 2) as server, FakeOpenAI([reply("ok")]) as spare:
        policy, _, notes = recording_policy(stage, max_retries=max_retries,
                                            fallback_client=client_for(spare),
                                            fallback_model="backup")
        assert ask(stage, server, policy) == "ok"
    assert notes[-1] == f"[{used_up}: trying the fallback, backup at {spare.url}/, once]"


def test_a_fallback_model_on_the_same_endpoint(stage):
    with FakeOpenAI([http_error(500), http_error(500), reply("backup here")]) as server:
        client = client_for(server)
        policy, _, _ = recording_policy(stage, max_retries=1, fallback_client=client,
                                        fallback_model="backup")
        assert stage.call_model(client, "m", [{"role": "user", "content": "hi"}], [],
                                policy).choices[0].message.content == "backup here"
    assert [r["model"] for r in server.requests] == ["m", "m", "backup"]


def test_the_same_model_at_a_fallback_endpoint(stage):
    with FakeOpenAI([http_error(500)]) as server, FakeOpenAI([reply("elsewhere")]) as spare:
        policy, _, _ = recording_policy(stage, max_retries=0, fallback_client=client_for(spare))
        assert ask(stage, server, policy) == "elsewhere"
    assert spare.requests[0]["model"] == "m"


def test_when_the_fallback_fails_too_the_first_error_goes_up(stage):
    with FakeOpenAI([http_error(503, "primary down")]) as server, \
            FakeOpenAI([http_error(401), reply("never")]) as spare:
        policy, _, notes = recording_policy(stage, max_retries=0,
                                            fallback_client=client_for(spare))
        with pytest.raises(openai.InternalServerError) as caught:
            ask(stage, server, policy)
    assert caught.value.status_code == 503 and len(spare.requests) == 1
    assert notes[-1] == "[the fallback failed too: auth]"


TOOLS = [{"type": "function", "function": {"name": "t", "description": "a tool",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_tools_go_to_the_model_and_the_fallback_and_none_means_none(stage):
    with FakeOpenAI([http_error(500), reply("a"), reply("b")]) as server:
        client = client_for(server)
        policy, _, _ = recording_policy(stage, max_retries=0, fallback_client=client,
                                        fallback_model="backup")
        hi = [{"role": "user", "content": "hi"}]
        stage.call_model(client, "m", hi, TOOLS, policy)
        stage.call_model(client, "m", hi, [], policy)
    assert [r.get("tools") for r in server.requests] == [TOOLS, TOOLS, None]


def test_without_a_fallback_the_error_goes_up_after_the_retries(stage):
    policy, _, notes = recording_policy(stage, max_retries=1)
    with FakeOpenAI([http_error(500), http_error(502)]) as server:
        with pytest.raises(openai.InternalServerError) as caught:
            ask(stage, server, policy)
    assert caught.value.status_code == 502
    assert not any("fallback" in note for note in notes)


OVERFLOW = http_error(400, "This model's maximum context length is 8192 tokens",
                      code="context_length_exceeded")


def test_context_overflow_without_compression_is_sent_once(stage):
    policy, sleeps, _ = recording_policy(stage)
    with FakeOpenAI([OVERFLOW, reply("never")]) as server:
        with pytest.raises(openai.BadRequestError):
            ask(stage, server, policy)
    assert len(server.requests) == 1 and sleeps == []


@pytest.mark.hardening
def test_context_overflow_compresses_and_retries_once(stage, monkeypatch):
    calls = []

    def compress(client, model, messages):
        calls.append(len(messages))
        del messages[1:-1]                          # keep the first and the last
        return True

    monkeypatch.setattr(stage, "compress_for_overflow", compress)
    messages = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    policy, sleeps, notes = recording_policy(stage)
    with FakeOpenAI([OVERFLOW, reply("fits now")]) as server:
        assert ask(stage, server, policy, messages) == "fits now"
    assert calls == [5] and sleeps == []
    assert [len(r["messages"]) for r in server.requests] == [5, 2]
    assert "compressed" in notes[0]
    with FakeOpenAI([OVERFLOW, OVERFLOW, reply("never")]) as server:
        with pytest.raises(openai.BadRequestError):
            ask(stage, server, policy, [{"role": "user", "content": "still too long"}])
    assert calls == [5, 1] and len(server.requests) == 2          # compressed only once


def test_explain_api_failure_names_billing_and_overflow(stage):
    """The words differ (only the hardened edition compresses on an overflow); the
    categories that s01's describe_api_error() cannot tell apart get their own line."""
    billing = failure_of(http_error(429, "quota", code="insufficient_quota"))
    line = stage.explain_api_failure(billing, "http://x/v1", "m")
    assert "no quota or credit left" in line and "retrying cannot fix" in line
    line = stage.explain_api_failure(failure_of(OVERFLOW), "http://x/v1", "m")
    assert line.startswith("The conversation no longer fits the context window of 'm'")
    auth = failure_of(http_error(401))
    assert stage.explain_api_failure(auth, "http://x/v1", "m") == \
        stage.describe_api_error(auth, "http://x/v1", "m")


# ── through main(): one line, exit codes, flags ──────────────────────────

# What each edition says when the conversation is too long: only the hardened edition
# tries to compress it first.
OVERFLOW_LINE = {"teaching": "Try /compress, a new session, or a model with a longer context.",
                 "hardened": "could not be compressed"}


@pytest.mark.parametrize("turn,expected", [
    (http_error(401), "rejected OPENAI_API_KEY (401)"),
    (http_error(404), "was not found"),
    (http_error(400, "Invalid value"), "answered HTTP 400"),
    (http_error(429, "quota", code="insufficient_quota"), "no quota or credit left"),
    (OVERFLOW, OVERFLOW_LINE),
])
def test_p_with_an_error_retrying_cannot_fix_exits_1_after_one_request(stage_name, turn, expected):
    if isinstance(expected, dict):
        expected = expected[edition_of(stage_name)]
    with FakeOpenAI([turn, reply("never")]) as server:
        result = against(stage_name, server, "-p", "hi")
    assert result.returncode == 1
    lines = error_lines(result)
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert len(server.requests) == 1


def test_p_retries_and_answers(stage_name):
    with FakeOpenAI([http_error(429, "slow", {"Retry-After": "0"}), reply("fine")]) as server:
        result = against(stage_name, server, "-p", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fine"
    assert error_lines(result) == [
        "[rate_limit (HTTP 429): retry 1 of 3 in 0.00 s, as Retry-After asks; Ctrl-C cancels]"]


def test_max_retries_flag(stage_name):
    with FakeOpenAI([http_error(429, "slow", {"Retry-After": "0"}), reply("never")]) as server:
        result = against(stage_name, server, "-p", "hi", "--max-retries", "0")
    assert result.returncode == 1 and len(server.requests) == 1
    assert "Rate limited" in result.stderr
    assert run_main(stage_name, "--max-retries", "-1").returncode == 2
    assert run_main(stage_name, "--max-retries", "x").returncode == 2


def test_fallback_flags(stage_name):
    down = http_error(503, "down", {"Retry-After": "0"})
    with FakeOpenAI([down, down, reply("backup")]) as server:
        result = against(stage_name, server, "-p", "hi", "--max-retries", "1",
                         "--fallback-model", "b")
    assert result.returncode == 0 and result.stdout.strip() == "backup"
    assert [r["model"] for r in server.requests] == ["gpt-4o-mini", "gpt-4o-mini", "b"]
    with FakeOpenAI([down]) as server, FakeOpenAI([reply("elsewhere")]) as spare:
        result = against(stage_name, server, "-p", "hi", "--max-retries", "0",
                         "--fallback-base-url", spare.url)
    assert result.stdout.strip() == "elsewhere"
    assert spare.requests[0]["model"] == "gpt-4o-mini"
    assert spare.headers[0]["authorization"] == "Bearer k"


def test_recovery_command_shows_the_settings(stage_name, tmp_path):
    result = run_main(stage_name, "-p", "/recovery", "--max-retries", "5",
                      "--max-iterations", "7", "--fallback-model", "b", cwd=tmp_path)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[1].startswith("  fallback    b at http://127.0.0.1:")
    plain = run_main(stage_name, "-p", "/recovery", cwd=tmp_path)
    if edition_of(stage_name) == "teaching":
        assert lines[0] == "  retries     5 per model call, waiting 2 s, doubling up to 30 s"
        assert lines[2] == "  budget      7 model calls per turn"
        assert lines[3] == ("  guardrails  (warn, stop) {'exact_failure': (2, 5), "
                            "'same_tool_failure': (3, 8)}")
        assert "  fallback    none\n" in plain.stdout
        return
    assert lines[0].startswith("  retries     5 per model call, waiting 2 s, doubling up to "
                               "30 s, plus up to 50% jitter; Retry-After honoured up to 60 s")
    assert lines[2] == "  budget      7 model calls per turn (--max-iterations)"
    assert lines[3] == ("  guardrails  exact_failure warn 2, stop 5; same_tool_failure warn 3, "
                        "stop 8; no_progress warn 2, stop 5")
    assert "  fallback    none (--fallback-model, --fallback-base-url)" in plain.stdout


def test_the_retry_policy_comes_from_the_command_line(stage):
    session = type("S", (), {"client": "primary"})()
    policy = started_retry_policy(stage, session)
    assert (policy.max_retries, policy.fallback_client, policy.fallback_model) == (3, None, None)
    policy = started_retry_policy(stage, session, "--fallback-model", "b", "--max-retries", "4")
    assert (policy.max_retries, policy.fallback_client, policy.fallback_model) == (4, "primary",
                                                                                   "b")
    policy = started_retry_policy(stage, session, "--fallback-base-url", "http://127.0.0.1:9/v1")
    assert str(policy.fallback_client.base_url) == "http://127.0.0.1:9/v1/"
    assert policy.fallback_model is None


# ── IterationBudget ──────────────────────────────────────────────────────

def test_budget_consume_refund_used(stage):
    budget = stage.IterationBudget(3)
    assert (budget.max_total, budget.used) == (3, 0)
    assert [budget.consume() for _ in range(4)] == [True, True, True, False]
    assert budget.used == 3
    budget.refund()
    assert budget.used == 2
    assert budget.consume() and not budget.consume()
    single = stage.IterationBudget(1)
    single.consume()
    single.refund()
    assert single.used == 0 and single.consume()
    empty = stage.IterationBudget(0)
    assert not empty.consume()
    empty.refund()
    assert empty.used == 0                                       # never below zero
    assert not stage.IterationBudget(-1).consume()


@pytest.mark.hardening
def test_budget_remaining(stage):
    """`remaining`: the hardened edition's (and Hermes's) view of what is left."""
    budget = stage.IterationBudget(3)
    assert budget.remaining == 3
    assert [budget.consume() for _ in range(4)] == [True, True, True, False]
    assert budget.remaining == 0
    budget.refund()
    assert budget.remaining == 1
    empty = stage.IterationBudget(0)
    empty.refund()
    assert empty.remaining == 0                                  # never below zero
    assert stage.IterationBudget(-1).remaining == 0


def test_budget_consume_is_thread_safe(stage):
    budget = stage.IterationBudget(1000)
    granted, start = [], threading.Barrier(8)

    def worker():
        start.wait()
        granted.append(sum(budget.consume() for _ in range(300)))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 1000 and budget.used == 1000 and not budget.consume()


def endless_tool_calls(count=12):
    return [reply("", call("terminal", {"command": f"echo {n}"})) for n in range(count)]


def test_max_iterations_4_means_exactly_4_model_calls(stage_name, workdir):
    with FakeOpenAI(endless_tool_calls()) as server:
        result = against(stage_name, server, "-p", "go", "--max-iterations", "4", cwd=workdir)
    assert len(server.requests) == 4
    assert "[stopped: this turn reached its limit of 4 model call(s)" in result.stdout


def test_the_budget_stop_leaves_a_valid_message_list(stage, workdir):
    messages = [{"role": "user", "content": "go"}]
    with FakeOpenAI(endless_tool_calls()) as server:
        answer = stage.run_conversation(client_for(server), "m", messages, max_iterations=2)
    assert len(server.requests) == 2 and "limit of 2 model call(s)" in answer
    assert pairing_problems(messages) == [] and messages[-1]["role"] == "tool"


def test_a_retry_does_not_use_up_the_budget(stage, workdir):
    turns = [reply("", call("terminal", {"command": "true"})),
             http_error(500, "blip", {"Retry-After": "0"}), reply("done")]
    with FakeOpenAI(turns) as server:
        answer = stage.run_conversation(client_for(server), "m",
                                        [{"role": "user", "content": "go"}], max_iterations=2)
    assert answer == "done" and len(server.requests) == 3


def test_every_turn_gets_a_new_budget(stage_name, workdir):
    turns = endless_tool_calls(2) + [reply("first done")] + endless_tool_calls(2) + \
        [reply("second done")]
    with FakeOpenAI(turns) as server:
        result = against(stage_name, server, "--max-iterations", "3", stdin="one\ntwo\n",
                         cwd=workdir)
    assert "first done" in result.stdout and "second done" in result.stdout
    assert len(server.requests) == 6


# ── the tool-call guardrails ─────────────────────────────────────────────

def test_call_signature_is_the_name_and_a_hash_of_canonical_json(stage):
    expected = hashlib.sha256(b'{"a":1,"b":[2,3]}').hexdigest()
    assert stage.call_signature("t", {"b": [2, 3], "a": 1}) == ("t", expected)
    assert stage.call_signature("t", {"a": 1, "b": [2, 3]}) == ("t", expected)
    assert stage.call_signature("t", {"a": 2, "b": [2, 3]})[1] != expected
    assert stage.call_signature("u", {"a": 1, "b": [2, 3]}) == ("u", expected)
    assert stage.call_signature("t", {"é": "ü"})[1] == \
        hashlib.sha256('{"é":"ü"}'.encode()).hexdigest()


@pytest.mark.parametrize("name,result,failed", [
    ("terminal", '{"output": "", "exit_code": 1}', True),
    ("terminal", '{"output": "timed out", "exit_code": 124}', True),
    ("terminal", '{"output": "0 errors", "exit_code": 0}', False),
    ("terminal", '{"error": "command must be a non-empty string"}', True),
    ("read_file", '{"error": "not a file: x"}', True),
    ("write_file", '{"bytes_written": 3, "path": "/tmp/x"}', False),
    ("terminal", '{"refused": true, "error": "denied by the user"}', False),
    ("patch", "Error: patch failed: ValueError: x", True),
    ("search_files", '{"matches": [], "truncated": false}', False),
    ("terminal", "no JSON at all", False),
    ("read_file", '{"content": "x", "exit_code": 2}', False),   # only the terminal's counts
])
def test_what_counts_as_a_failure(stage, name, result, failed):
    assert stage.tool_call_failed(name, result) is failed


def test_the_thresholds(stage):
    thresholds = dict(stage.GUARDRAIL_THRESHOLDS)
    thresholds.pop("no_progress", None)                 # the hardened edition's own
    assert thresholds == {"exact_failure": (2, 5), "same_tool_failure": (3, 8)}


@pytest.mark.hardening
def test_the_no_progress_threshold(stage):
    assert stage.GUARDRAIL_THRESHOLDS == {"exact_failure": (2, 5), "same_tool_failure": (3, 8),
                                          "no_progress": (2, 5)}


def runs(path):
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_exact_failure_warns_from_2_and_blocks_after_5_without_running(stage, workdir):
    guard = stage.ToolCallGuardrails()
    args = {"command": "echo run >> log; test -e armed && touch created; exit 3"}
    notes = [guard.run("terminal", args)[1] for _ in range(5)]
    assert notes[0] == "" and runs(workdir / "log") == 5
    assert [n.startswith("\n\n[Tool loop warning: repeated_exact_failure_warning; "
                         f"count={i + 1}; terminal failed {i + 1} times")
            for i, n in enumerate(notes)] == [False, True, True, True, True]
    (workdir / "armed").touch()                     # a sixth run would create the file
    result, note = guard.run("terminal", args)
    assert note == "" and runs(workdir / "log") == 5
    assert not (workdir / "created").exists()
    data = json.loads(result)
    assert data["error"].startswith("Not run: terminal already failed 5 times")
    record = {"action": "block", "code": "repeated_exact_failure_block", "tool_name": "terminal",
              "count": 5}
    if hasattr(stage, "seconds_until"):             # the hardened edition: Hermes's record
        record.update(message=data["error"], signature={
            "tool_name": "terminal", "args_hash": stage.call_signature("terminal", args)[1]})
    assert data["guardrail"] == record
    assert "armed" not in result                    # never the raw arguments
    assert json.loads(guard.run("terminal", args)[0])["guardrail"]["count"] == 5   # not counted
    other = {"command": "test -e armed && touch created"}
    assert guard.run("terminal", other)[1] == "" and (workdir / "created").exists()


def test_same_tool_failures_warn_from_3_and_halt_at_8(stage, workdir):
    guard = stage.ToolCallGuardrails()
    notes = [guard.run("terminal", {"command": f"exit 1 # {n}"})[1] for n in range(1, 8)]
    assert notes[:2] == ["", ""] and guard.halted is None
    assert all(f"same_tool_failure_warning; count={n}; terminal failed {n} times in a row"
               in notes[n - 1] for n in range(3, 8))
    note = guard.run("terminal", {"command": "exit 1 # 8"})[1]
    assert note.startswith("\n\n[Tool loop hard stop: same_tool_failure_halt; count=8; ")
    assert guard.halted[:4] == ("halt", "same_tool_failure_halt", "terminal", 8)
    if hasattr(stage, "seconds_until"):             # the hardened edition keeps the signature
        assert guard.halted.signature == stage.call_signature("terminal", {"command": "exit 1 # 8"})
    result, note = guard.run("terminal", {"command": "touch created"})
    assert note == "" and not (workdir / "created").exists()
    assert json.loads(result)["guardrail"]["code"] == "turn_halted"


@pytest.mark.hardening
def test_read_only_no_progress_warns_from_2_and_blocks_after_5(stage, workdir):
    (workdir / "notes.txt").write_text("same\n")
    guard = stage.ToolCallGuardrails()
    outcomes = [guard.run("read_file", {"path": "notes.txt"}) for _ in range(5)]
    assert outcomes[0][1] == "" and json.loads(outcomes[0][0])["total_lines"] == 1
    assert all(f"idempotent_no_progress_warning; count={n}; read_file returned the same "
               f"result {n} times" in outcomes[n - 1][1] for n in range(2, 6))
    result, note = guard.run("read_file", {"path": "notes.txt"})
    assert note == "" and json.loads(result)["guardrail"]["code"] == \
        "idempotent_no_progress_block"
    assert json.loads(result)["guardrail"]["count"] == 5
    assert guard.run("read_file", {"path": "notes.txt", "limit": 5})[1] == ""  # other args


@pytest.mark.hardening
def test_a_different_result_is_progress(stage, workdir):
    path = workdir / "notes.txt"
    path.write_text("one\n")
    guard = stage.ToolCallGuardrails()
    assert guard.run("read_file", {"path": "notes.txt"})[1] == ""
    assert "count=2" in guard.run("read_file", {"path": "notes.txt"})[1]
    path.write_text("two\n")
    assert guard.run("read_file", {"path": "notes.txt"})[1] == ""
    assert "count=2" in guard.run("read_file", {"path": "notes.txt"})[1]


def test_a_successful_change_resets_every_count(stage, workdir):
    guard = stage.ToolCallGuardrails()
    (workdir / "notes.txt").write_text("x\n")
    for _ in range(5):
        guard.run("read_file", {"path": "notes.txt"})
        guard.run("terminal", {"command": "exit 1"})
    assert guard.run("write_file", {"path": "other.txt", "content": "y"})[1] == ""
    result, note = guard.run("read_file", {"path": "notes.txt"})
    assert note == "" and json.loads(result)["total_lines"] == 1          # runs again
    result, note = guard.run("terminal", {"command": "exit 1"})
    assert note == "" and json.loads(result)["exit_code"] == 1            # counts from 1


def test_success_resets_the_failure_counts(stage, workdir):
    guard = stage.ToolCallGuardrails()
    args = {"command": "test -e ok"}
    notes = [guard.run("terminal", args)[1] for _ in range(4)]
    assert "count=4" in notes[-1]
    (workdir / "ok").touch()
    assert guard.run("terminal", args)[1] == ""
    (workdir / "ok").unlink()
    assert guard.run("terminal", args)[1] == ""                           # 1 again
    missing = {"path": "missing.txt"}
    for _ in range(4):
        guard.run("read_file", missing)
    (workdir / "missing.txt").write_text("here\n")
    assert guard.run("read_file", missing)[1] == ""
    (workdir / "missing.txt").unlink()
    assert guard.run("read_file", missing)[1] == ""
    assert guard.exact_failures == {stage.call_signature("read_file", missing): 1,
                                    stage.call_signature("terminal", args): 1}
    assert guard.tool_failures == {"read_file": 1, "terminal": 1}


@pytest.mark.hardening
def test_a_failure_ends_a_no_progress_run(stage, workdir):
    path = workdir / "notes.txt"
    path.write_text("x\n")
    guard = stage.ToolCallGuardrails()
    guard.run("read_file", {"path": "notes.txt"})
    path.unlink()
    guard.run("read_file", {"path": "notes.txt"})                         # a failure
    path.write_text("x\n")
    assert guard.run("read_file", {"path": "notes.txt"})[1] == ""


def test_thresholds_can_be_changed(stage, workdir):
    guard = stage.ToolCallGuardrails({"exact_failure": (1, 2)})
    assert guard.thresholds["same_tool_failure"] == (3, 8)
    args = {"command": "exit 1"}
    assert "count=1" in guard.run("terminal", args)[1]
    guard.run("terminal", args)
    assert json.loads(guard.run("terminal", args)[0])["guardrail"]["count"] == 2


def test_a_call_that_never_failed_is_never_blocked(stage, workdir):
    (workdir / "notes.txt").write_text("x\n")
    guard = stage.ToolCallGuardrails({"exact_failure": (1, 1), "no_progress": (1, 1)})
    assert json.loads(guard.run("terminal", {"command": "exit 1"})[0])["exit_code"] == 1
    assert json.loads(guard.run("read_file", {"path": "notes.txt"})[0])["total_lines"] == 1
    assert "guardrail" in guard.run("terminal", {"command": "exit 1"})[0]


def conversation(stage, turns, messages=None, **kwargs):
    messages = messages if messages is not None else [{"role": "user", "content": "go"}]
    with FakeOpenAI(turns) as server:
        answer = stage.run_conversation(client_for(server), "m", messages, **kwargs)
    return answer, messages, server


def tool_results(messages):
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_a_warning_is_appended_to_the_real_result_the_model_gets(stage, workdir):
    failing = call("terminal", {"command": "echo oops; exit 1"})
    answer, messages, server = conversation(stage, [reply("", failing), reply("", failing),
                                                    reply("done")])
    first, second = tool_results(messages)
    assert answer == "done" and pairing_problems(messages) == []
    assert json.loads(first) == {"output": "oops\n", "exit_code": 1}
    real, _, note = second.partition("\n\n[Tool loop warning: ")
    assert json.loads(real) == {"output": "oops\n", "exit_code": 1}
    assert note.startswith("repeated_exact_failure_warning; count=2; ") and note.endswith("]")
    assert server.requests[2]["messages"][-1]["content"] == second


def test_counters_start_again_every_turn(stage, workdir):
    failing = call("terminal", {"command": "exit 1"})
    messages = [{"role": "user", "content": "one"}]
    conversation(stage, [reply("", failing), reply("", failing), reply("done")], messages)
    messages.append({"role": "user", "content": "two"})
    conversation(stage, [reply("", failing), reply("done")], messages)
    results = tool_results(messages)
    assert ["Tool loop warning" in result for result in results] == [False, True, False]


def test_a_block_does_not_end_the_turn(stage, workdir):
    failing = call("terminal", {"command": "echo ran >> log; exit 1"})
    answer, messages, server = conversation(stage, [reply("", failing)] * 6 + [reply("done")])
    assert answer == "done" and len(server.requests) == 7 and runs(workdir / "log") == 5
    assert json.loads(tool_results(messages)[-1])["guardrail"]["action"] == "block"
    assert pairing_problems(messages) == []


def test_a_halt_ends_the_turn_with_an_explanation(stage, workdir):
    turns = [reply("", call("terminal", {"command": f"exit 1 # {n}"})) for n in range(10)]
    answer, messages, server = conversation(stage, turns)
    assert len(server.requests) == 8
    assert answer == ("[stopped: terminal failed 8 times in a row, so the tool-call guardrail "
                      "ended this turn (same_tool_failure_halt). Read the errors above, then "
                      "ask again with another approach.]")
    assert pairing_problems(messages) == [] and messages[-1]["role"] == "tool"
    assert "[Tool loop hard stop: same_tool_failure_halt; count=8;" in messages[-1]["content"]


def test_a_halt_answers_the_rest_of_its_batch_without_running_it(stage, workdir):
    calls = [call("terminal", {"command": f"exit 1 # {n}"}) for n in range(8)]
    calls.append(call("terminal", {"command": "touch created"}))
    answer, messages, server = conversation(stage, [reply("", *calls), reply("never")])
    assert len(server.requests) == 1 and answer.startswith("[stopped: terminal failed 8 times")
    assert pairing_problems(messages) == [] and len(tool_results(messages)) == 9
    assert json.loads(tool_results(messages)[-1])["guardrail"]["code"] == "turn_halted"
    assert not (workdir / "created").exists()


def test_calls_the_door_rejects_are_not_counted(stage, workdir):
    guard = stage.ToolCallGuardrails()
    offered = {t["function"]["name"]: t for t in stage.REGISTRY.get_definitions()}
    broken = [type("Call", (), {"id": f"c{n}", "function": type(
        "F", (), {"name": "terminal", "arguments": "{bad json"})()})() for n in range(3)]
    messages = []
    stage.run_tool_calls(broken, messages, lambda kind, data: None, offered, guard)
    assert len(messages) == 3 and guard.exact_failures == {} and guard.tool_failures == {}


# ── the offline model: fail and retry ────────────────────────────────────

def test_offline_fail_verb_retries_and_answers(stage_name, tmp_path):
    result = run_main(stage_name, stdin="fail rate_limit\nfail bogus\n", cwd=tmp_path)
    assert result.returncode == 0
    assert "[rate_limit (HTTP 429): retry 1 of 3 in 0.10 s, as Retry-After asks; Ctrl-C " \
        "cancels]" in result.stderr
    answer = repl_output(result.stdout, f"{short(stage_name)}> ", "fail rate_limit")
    assert answer == ("This answer got through: the endpoint failed (rate_limit) as asked, "
                      "and the agent recovered.")
    assert "fail what? Kinds: rate_limit, billing, auth" in result.stdout


# The offline model's refusal of a bad count: the teaching edition has one line for any
# 'fail' it cannot read, the hardened edition says what is wrong with the count.
COUNT_REFUSAL = {
    "teaching": "fail what? Kinds: rate_limit, billing, auth, model_not_found, "
                "context_overflow, bad_request, server, connection; times: 1 or more.",
    "hardened": "fail server how many times? A count of 1 or more, e.g. fail server 3."}


def test_offline_fail_verb_refuses_a_count_below_one(stage_name, tmp_path):
    counts = ("0", "-1", "x", "2 3")
    result = run_main(stage_name, stdin="".join(f"fail server {n}\n" for n in counts),
                      cwd=tmp_path)
    assert result.returncode == 0
    for n in counts:                                # nothing failed, so nothing recovered
        assert repl_output(result.stdout, f"{short(stage_name)}> ", f"fail server {n}") == \
            COUNT_REFUSAL[edition_of(stage_name)]
    assert "retry" not in result.stderr                 # -1 is not "once"


def test_offline_failures_retrying_cannot_fix(stage_name, tmp_path):
    kinds = {"auth": "needs a key (401)", "billing": "no quota or credit left",
             "model_not_found": "(404)", "bad_request": "answered HTTP 400",
             "context_overflow": OVERFLOW_LINE[edition_of(stage_name)]}
    result = run_main(stage_name, stdin="".join(f"fail {kind}\n" for kind in kinds),
                      cwd=tmp_path)
    lines = [line for line in error_lines(result) if "offline model at" not in line]
    assert len(lines) == len(kinds), result.stderr              # one line each, no retry
    assert all(expected in line for expected, line in zip(kinds.values(), lines))
    assert "This answer got through" not in result.stdout


def test_offline_failure_counts_per_request(stage_name):
    stage = load_stage(stage_name)
    failures = {}
    hi = {"role": "user", "content": "fail server 2"}
    request = {"model": "offline", "messages": [hi]}
    first = stage.offline_failure(request, failures)
    message = {"teaching": "The offline endpoint failed as asked (server).",
               "hardened": "The server had an error while processing your request."}
    assert first == (500, {"error": {"message": message[edition_of(stage_name)],
                                     "type": "offline_failure", "code": None}}, {})
    assert stage.offline_failure(request, failures) == first
    assert stage.offline_failure(request, failures) is None                   # twice is all
    assert failures == {("fail server 2", 1): 2}
    once = {"model": "offline", "messages": [{"role": "user", "content": "fail server"}]}
    assert stage.offline_failure(once, failures) == first
    assert stage.offline_failure(once, failures) is None                      # once by default
    again = {"model": "offline", "messages": [hi, {"role": "assistant", "content": "ok"}, hi]}
    assert stage.offline_failure(again, failures) == first                    # typed again
    assert stage.offline_failure({"model": "offline-backup", "messages": [hi]}, {}) is None
    for last in ({"role": "assistant", "content": "fail server"}, "fail server"):
        assert stage.offline_failure({"model": "offline", "messages": [hi, last]}, {}) is None
    for text in ("fail", "fail nothing", "fail server 2 3", "say fail server", "fail server 0",
                 "fail server -1"):
        message = {"role": "user", "content": text}
        assert stage.offline_failure({"model": "offline", "messages": [message]}, {}) is None
    drop = {"model": "offline", "messages": [{"role": "user", "content": "fail connection"}]}
    assert stage.offline_failure(drop, {}) == "connection"
    limited = {"model": "offline", "messages": [{"role": "user", "content": "fail rate_limit"}]}
    assert stage.offline_failure(limited, {})[2] == {"Retry-After": "0.1"}


def test_offline_retry_verb_loops_until_the_guardrail_halts(stage_name, tmp_path):
    result = run_main(stage_name, "-p", "retry $ ls no-such-file", cwd=tmp_path)
    assert result.returncode == 0
    out = result.stdout
    assert out.count('→ terminal {"command": "ls no-such-file"}') == 6
    assert "Not run: terminal already failed 5 times" in out
    assert re.findall(r'"ls no-such-file # attempt \d+"', out) == [
        f'"ls no-such-file # attempt {n}"' for n in (7, 8, 9)]
    assert "same_tool_failure_warning; count=6" in out
    assert out.rstrip().endswith("ended this turn (same_tool_failure_halt). Read the errors "
                                 "above, then ask again with another approach.]")


def test_offline_retry_counts_attempts_per_turn(stage_name, tmp_path):
    result = run_main(stage_name, stdin="retry $ ls no-such-file\n" * 2, cwd=tmp_path)
    assert re.findall(r"# attempt (\d+)", result.stdout) == ["7", "8", "9"] * 2


@pytest.mark.hardening
def test_offline_retry_of_a_read_stops_at_the_block(stage_name, tmp_path):
    (tmp_path / "notes.txt").write_text("same\n")
    result = run_main(stage_name, "-p", "retry read notes.txt", cwd=tmp_path)
    out = result.stdout
    assert out.count("→ read_file") == 6 and "count=5" in out
    assert out.rstrip().endswith("The tool reported: Not run: read_file already returned the "
                                 "same result 5 times for these arguments. Use that result.")


def test_offline_retry_of_nothing_says_what_to_try(stage_name, tmp_path):
    bad = run_main(stage_name, "-p", "retry nothing", cwd=tmp_path)
    assert "retry what? Try: retry $ ls no-such-file" in bad.stdout


def test_offline_retry_respects_the_budget(stage_name, tmp_path):
    result = run_main(stage_name, "-p", "retry $ echo again", "--max-iterations", "3",
                      cwd=tmp_path)
    assert result.stdout.count("→ terminal") == 3
    assert "[stopped: this turn reached its limit of 3 model call(s)" in result.stdout


DEMO_SHOWS = ["[rate_limit (HTTP 429): retry 1 of 3 in 0.10 s, as Retry-After asks; "
              "Ctrl-C cancels]",
              "[server (HTTP 500): retry 3 of 3 in 0.0",
              "[3 retries used up: trying the fallback, offline-backup at http://127.0.0.1:",
              "needs a key (401)",
              "[Tool loop hard stop: same_tool_failure_halt; count=8;"]
HARDENED_DEMO_SHOWS = [
    "[connection (no answer): retry 1 of 3 in 0.01 s; Ctrl-C cancels]",
    "[context_overflow: the conversation was compressed; sending it once more]",
    "every tool call has its result: True",
    "model calls in that turn: 3; every tool call has its result: True"]


# Later stages' demos differ; the teaching demo is the shorter one.
@pytest.mark.parametrize("stage_name", ["s06_error_recovery", "hardened/s06_error_recovery"])
def test_the_demo_shows_recovery_guardrails_and_the_budget(stage_name, tmp_path):
    result = run_main(stage_name, "--demo", cwd=tmp_path,
                      env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    hardened = edition_of(stage_name) == "hardened"
    for line in DEMO_SHOWS + (HARDENED_DEMO_SHOWS if hardened else []):
        assert line in shown, line
    # 429 and fallback; the hardened demo also a dropped connection and an overflow
    assert shown.count("This answer got through") == (4 if hardened else 2)
    assert shown.count("Not run: terminal already failed 5 times") == 1
    assert "Traceback" not in shown


@pytest.mark.hardening
def test_every_call_answered(stage):
    assistant = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}
    assert stage.every_call_answered([assistant, {"role": "tool", "tool_call_id": "a"},
                                      {"role": "tool", "tool_call_id": "b"}])
    assert not stage.every_call_answered([assistant, {"role": "tool", "tool_call_id": "a"}])
    assert stage.every_call_answered([{"role": "user", "content": "x"}])


def test_the_chapters_under_attack_table_holds_in_each_edition(stage, workdir):
    """docs/*/s06-error-recovery.md, "Under attack": the teaching and the hardened column."""
    hardened = hasattr(stage, "seconds_until")
    (workdir / "notes.txt").write_text("same\n")
    guard = stage.ToolCallGuardrails()
    results = [guard.run("read_file", {"path": "notes.txt"})[0] for _ in range(6)]
    assert all(json.loads(result).get("total_lines") == 1 for result in results[:5])
    assert ("guardrail" in json.loads(results[5])) == hardened
    date = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    assert stage.retry_after_seconds(date) == (0.0 if hardened else None)
