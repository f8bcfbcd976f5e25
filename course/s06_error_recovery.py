# s06_error_recovery: what this stage adds, changes and removes. course/build.py writes the stage files.

#: docstring
"""s06 · Error recovery — when the endpoint fails, and when the model goes in circles.

What this stage adds
    Every model call goes through call_model(); each turn gets an IterationBudget, and
    ToolCallGuardrails stop tool-call loops.

    call_model() ─ ok ────────────────────────────────────────────────▶ the answer
        │ error: classify_api_error()
        ├─ rate_limit, server, timeout, connection ─▶ wait (Retry-After, or 2 s, 4 s,
        │      8 s … + jitter) and retry; used up ─▶ fallback, once
        └─ auth, billing, model_not_found, context_overflow, bad_request ─▶ one line
    tool call ─▶ before_call(): failed 5× exactly so ─▶ not run
                 after_call(): again? ─▶ a warning; one tool failed 8× in a row ─▶ halt

Reading guide
    This stage's sections come first ("[s06] Recovery details" holds their helpers);
    earlier stages follow, newest first, then the plumbing and the wiring.
    {changed elsewhere}
Run
    python agents/s06_error_recovery.py                 # REPL (offline model without a key)
    python agents/s06_error_recovery.py --demo          # the walk-through
Chapter
    docs/en/s06-error-recovery.md
"""

#: docstring | hardened
"""s06 · Error recovery — when the endpoint fails, and when the model goes in circles.

What this stage adds
    Every model call of the loop goes through call_model(); classify_api_error() sorts
    a failure. What may work later (429, 5xx, a timeout, a dropped connection) is
    retried with a growing, jittered wait or after Retry-After, then an optional
    fallback model gets one try. A bad key, no credit, an unknown model or a bad request
    is not retried; a conversation too long for the model is compressed and sent again.
    Each turn gets an IterationBudget, and ToolCallGuardrails watch for tool-call loops.

    call_model() ─ ok ────────────────────────────────────────────────▶ the answer
        │ error: classify_api_error()
        ├─ rate_limit, server, timeout, connection ─▶ wait (Retry-After, or 2 s, 4 s,
        │      8 s … + jitter) and retry; used up ─▶ fallback, once
        ├─ context_overflow ─▶ compress, retry once
        └─ auth, billing, model_not_found, bad_request ─▶ one line
    tool call ─▶ before_call(): failed 5× exactly so, or same result 5× ─▶ not run
                 after_call(): again? ─▶ a warning; one tool failed 8× in a row ─▶ halt

Reading guide
    Start right below the imports: "[s06] Error recovery" is this stage's lesson:
    call_model() and classify_api_error(), then "[s06] Iteration budget" (IterationBudget)
    and "[s06] Tool-call guardrails" (ToolCallGuardrails). "[s06] Recovery details" is
    the hardening (Retry-After, the error words, the guardrails' messages). Earlier
    stages follow, newest first (the loop's changes are in "[s01] The agent loop"), then
    the plumbing (/recovery is under "[s06] Error recovery commands") and the wiring.
    {changed elsewhere}
Run
    python agents/s06_error_recovery.py                 # REPL (offline model without a key)
    python agents/s06_error_recovery.py --demo          # the walk-through
    printf 'fail rate_limit\nretry $ ls nothing-here\n' |
        python agents/s06_error_recovery.py
Chapter
    docs/en/s06-error-recovery.md
"""

#: imports
import argparse
import codecs
import datetime
import email.utils
import fnmatch
import hashlib
import html
import json
import math
import os
import platform
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from markdown_it import MarkdownIt
import openai
from rich.console import Console
from rich.text import Text
from typing import Callable, NamedTuple

#: section Error recovery

API_MAX_RETRIES = 3                     # retries of one failed model call (--max-retries)
RETRY_BASE_DELAY = 2.0                  # seconds before the first retry; doubled for each next one
RETRY_MAX_DELAY = 30.0                  # the doubling stops here
RETRY_JITTER = 0.5                      # up to 50 % more, at random: clients that failed together
                                        # do not all come back at the same moment
MAX_RETRY_AFTER = 60.0                  # the longest wait an endpoint's Retry-After gets from us

# Every category, and whether the same request may work if we simply send it again.
API_ERROR_RETRYABLE = {"rate_limit": True, "server": True, "timeout": True, "connection": True,
                       "auth": False, "billing": False, "model_not_found": False,
                       "context_overflow": False, "tool_choice": False, "bad_request": False,
                       "unknown": False}   # unknown: we cannot tell, so do not hammer


class ApiErrorClass(NamedTuple):
    category: str                       # a key of API_ERROR_RETRYABLE
    retryable: bool
    status: int | None                  # the HTTP status, if the endpoint answered at all
    retry_after: float | None           # seconds the endpoint asked us to wait, if it did


#: teaching
# An HTTP error's category by its status (other 5xx: "server", 4xx: "bad_request"), unless
# its code says more: OpenAI answers "slow down" and "your credit is gone" both with 429.
STATUS_CATEGORIES = {401: "auth", 402: "billing", 403: "auth", 404: "model_not_found",
                     408: "timeout", 413: "context_overflow", 429: "rate_limit",
                     501: "bad_request"}    # 501: the server has no such API at all
ERROR_CODES = {"insufficient_quota": "billing", "context_length_exceeded": "context_overflow"}


#: teaching
def classify_api_error(exc: Exception) -> ApiErrorClass:
    """What went wrong with a model call, and whether sending it again can help."""
    status = getattr(exc, "status_code", None)
    if isinstance(exc, openai.APITimeoutError):         # a kind of APIConnectionError
        category = "timeout"
    elif isinstance(exc, openai.APIConnectionError):
        category = "connection"
    elif refuses_tool_choice(exc):
        category = "tool_choice"
    elif isinstance(exc, openai.APIStatusError):
        category = ERROR_CODES.get(str(exc.code)) or STATUS_CATEGORIES.get(
            status, "server" if status >= 500 else "bad_request")
    else:                                               # not even an HTTP error
        category = "unknown"
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    return ApiErrorClass(category, API_ERROR_RETRYABLE[category], status,
                         retry_after_seconds(headers))


#: hardened
def classify_api_error(exc: Exception) -> ApiErrorClass:
    """What went wrong with a model call, and whether sending it again can help.
    The exception's class says whether there was an answer; the status and the
    error's words say what the answer meant (see status_category())."""
    status = None
    if isinstance(exc, openai.APITimeoutError):         # a kind of APIConnectionError
        category = "timeout"
    elif isinstance(exc, openai.APIConnectionError):
        category = "connection"
    elif isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        category = status_category(status, error_text(exc))
    else:                                               # not even an HTTP error
        category = "unknown"
    return ApiErrorClass(category, API_ERROR_RETRYABLE[category], status,
                         retry_after_seconds(response_headers(exc)))


#: hardened
def show_recovery_note(line: str) -> None:
    err_console.print(Text(line, style="yellow"))


#: teaching
class RetryPolicy(NamedTuple):
    """How hard one model call tries. Tests pass their own `sleep` and `jitter`: no real wait."""
    max_retries: int = API_MAX_RETRIES
    base_delay: float = RETRY_BASE_DELAY
    max_delay: float = RETRY_MAX_DELAY
    fallback_client: object = None                  # None: no fallback
    fallback_model: str | None = None               # None: the same model name
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random     # a fraction from 0 to 1
    notify: Callable[[str], None] = lambda line: err_console.print(Text(line, style="yellow"))


#: hardened
class RetryPolicy:
    """How hard one model call tries. `sleep` and `jitter` are parameters so that
    tests never wait for real; `notify` shows what happens (a line per retry)."""

    def __init__(self, max_retries: int = API_MAX_RETRIES, base_delay: float = RETRY_BASE_DELAY,
                 max_delay: float = RETRY_MAX_DELAY, fallback_client=None,
                 fallback_model: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 jitter: Callable[[], float] = random.random,
                 notify: Callable[[str], None] = show_recovery_note):
        self.max_retries = max_retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.fallback_client = fallback_client      # None: no fallback
        self.fallback_model = fallback_model        # None: the same model name
        self.sleep = sleep
        self.jitter = jitter                        # a fraction from 0 to 1
        self.notify = notify


def backoff_delay(retry: int, retry_after: float | None, policy: RetryPolicy) -> float:
    """Seconds to wait before retry number `retry` (1, 2, 3, …). The endpoint's own
    Retry-After wins, capped; otherwise base × 2^(retry-1), capped, plus jitter."""
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_AFTER)
    delay = min(policy.base_delay * 2 ** min(retry - 1, 30), policy.max_delay)
    return delay * (1 + RETRY_JITTER * policy.jitter())


#: teaching
def call_model(client, model: str, messages: list, tools: list,
               policy: RetryPolicy | None = None):
    """One model call of the agent loop: retry what may work later with a growing wait, then
    the fallback once. Any other error goes up to run_turn(), which prints one line."""
    policy, retries = policy or RetryPolicy(), 0
    while True:
        try:
            return client.chat.completions.create(
                model=model, messages=messages, **tool_fields(tools))
        except openai.OpenAIError as exc:
            error = classify_api_error(exc)
            if not error.retryable:
                raise
            if retries >= policy.max_retries:
                return call_fallback(client, model, messages, tools, policy, exc)
            retries += 1
            delay = backoff_delay(retries, error.retry_after, policy)
            asked = ", as Retry-After asks" if error.retry_after is not None else ""
            answer = f"HTTP {error.status}" if error.status else "no answer"
            cancel = "; Ctrl-C cancels" if retries == 1 else ""   # no need to sit it out
            policy.notify(f"[{error.category} ({answer}): retry {retries} of "
                          f"{policy.max_retries} in {delay:.2f} s{asked}{cancel}]")
            policy.sleep(delay)


#: hardened
def call_model(client, model: str, messages: list, tools: list,
               policy: RetryPolicy | None = None):
    """One model call of the agent loop, and what to do if it fails: compress a
    conversation that no longer fits (once), retry what may work later with a
    growing wait, and when the retries are used up try the fallback once. An error
    that retrying cannot fix goes straight up to run_turn(), which prints one line."""
    policy = policy or RetryPolicy()
    retries, compressed = 0, False
    while True:
        try:
            return client.chat.completions.create(
                model=model, messages=messages, **tool_fields(tools))
        except openai.OpenAIError as exc:
            error = classify_api_error(exc)
            if error.category == "context_overflow" and not compressed:
                compressed = True
                if compress_for_overflow(client, model, messages):
                    policy.notify("[context_overflow: the conversation was compressed; "
                                  "sending it once more]")
                    continue
            if not error.retryable:
                raise
            if retries >= policy.max_retries:
                return call_fallback(client, model, messages, tools, policy, exc)
            retries += 1
            delay = backoff_delay(retries, error.retry_after, policy)
            asked = ", as Retry-After asks" if error.retry_after is not None else ""
            answer = f"HTTP {error.status}" if error.status else "no answer"
            cancel = "; Ctrl-C cancels" if retries == 1 else ""   # no need to sit it out
            policy.notify(f"[{error.category} ({answer}): retry {retries} of "
                          f"{policy.max_retries} in {delay:.2f} s{asked}{cancel}]")
            policy.sleep(delay)


#: teaching
def call_fallback(client, model: str, messages: list, tools: list, policy: RetryPolicy,
                  failure: Exception):
    """Retries used up: the fallback once, if any; if that fails, your endpoint's error goes up."""
    if policy.fallback_client is None:
        raise failure
    model = policy.fallback_model or model
    policy.notify(f"[{policy.max_retries} retries used up: trying the fallback, {model} at "
                  f"{policy.fallback_client.base_url}, once]")
    try:
        return policy.fallback_client.chat.completions.create(
            model=model, messages=messages, **tool_fields(tools))
    except openai.OpenAIError as exc:
        policy.notify(f"[the fallback failed too: {classify_api_error(exc).category}]")
        raise failure from exc


#: hardened
def call_fallback(client, model: str, messages: list, tools: list, policy: RetryPolicy,
                  failure: Exception):
    """The retries are used up: one try with the fallback, if there is one. If that
    fails too, the first error goes up, because it names the endpoint you chose."""
    if policy.fallback_client is None:
        raise failure
    model = policy.fallback_model or model
    used_up = {0: "no retries allowed", 1: "1 retry used up"}.get(
        policy.max_retries, f"{policy.max_retries} retries used up")
    policy.notify(f"[{used_up}: trying the fallback, {model} at "
                  f"{policy.fallback_client.base_url}, once]")
    try:
        return policy.fallback_client.chat.completions.create(
            model=model, messages=messages, **tool_fields(tools))
    except openai.OpenAIError as exc:
        policy.notify(f"[the fallback failed too: {classify_api_error(exc).category}]")
        raise failure from exc


#: hardened
def compress_for_overflow(client, model: str, messages: list) -> bool:
    """Shorten `messages` in place so that they fit the model; False if that is
    impossible. call_model() uses it once, when the endpoint says "too long"."""
    report = compress_context(client, model, messages, force=True)
    return bool(report["pruned"] or report["summarised"])

#: section Iteration budget


#: teaching
class IterationBudget:
    """How many model calls one user turn may make (--max-iterations). The lock: later stages
    share one budget between threads, and two that both read "1 left" must not both get it."""

    def __init__(self, max_total: int):
        self.max_total = max_total
        self.used = 0
        self._lock = threading.Lock()

    def consume(self) -> bool:
        """Take one unit; False (and nothing taken) once the budget is spent."""
        with self._lock:
            if self.used >= self.max_total:
                return False
            self.used += 1
            return True

    def refund(self) -> None:
        """Give one unit back, for a call that should not count; never below zero."""
        with self._lock:
            self.used = max(0, self.used - 1)


#: hardened
class IterationBudget:
    """How many model calls the agent loop may make. One budget per user turn, sized
    by --max-iterations; each call of the loop consumes one unit, auxiliary calls
    (a summary, a title) none. Thread-safe: later stages share one budget between
    threads, and two threads that both read "1 left" must not both get it."""

    def __init__(self, max_total: int):
        self.max_total = max_total
        self._used = 0
        self._lock = threading.Lock()

    def consume(self) -> bool:
        """Take one unit; False (and nothing taken) once the budget is spent."""
        with self._lock:
            if self._used >= self.max_total:
                return False
            self._used += 1
            return True

    def refund(self) -> None:
        """Give one unit back, for a call that should not count; never below zero."""
        with self._lock:
            if self._used > 0:
                self._used -= 1

    @property
    def used(self) -> int:
        with self._lock:
            return self._used

    @property
    def remaining(self) -> int:
        with self._lock:
            return max(0, self.max_total - self._used)

#: section Tool-call guardrails

#: teaching
# (warn from, stop from) per user turn. exact_failure: the same call (tool and arguments)
# failed again, stop = block the next one; same_tool_failure: any arguments, stop = halt.
GUARDRAIL_THRESHOLDS = {"exact_failure": (2, 5), "same_tool_failure": (3, 8)}


#: hardened
# (warn from, stop from) for each way a model goes in circles. "Stop" blocks the
# next such call (it is not run) for exact_failure and no_progress, and halts the
# whole turn for same_tool_failure. Counts start at zero every user turn.
GUARDRAIL_THRESHOLDS = {
    "exact_failure": (2, 5),            # the same call (tool and arguments) failed again
    "same_tool_failure": (3, 8),        # one tool failed again, whatever the arguments
    "no_progress": (2, 5),              # a read-only call gave the same result again
}


def call_signature(name: str, args: dict) -> tuple[str, str]:
    """A call's identity: the tool's name and a SHA-256 of its arguments as canonical JSON, so
    {"b": 2, "a": 1} is {"a":1,"b":2}. Only the hash is shown: arguments may hold a secret."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, default=str)
    return name, hashlib.sha256(canonical.encode("utf-8", "replace")).hexdigest()


def tool_call_failed(name: str, result: str) -> bool:
    """s02's classify_tool_result() says "error", or a terminal command exited with a code
    other than 0. A refusal, or "error" printed by a command that exited 0, is no failure."""
    if classify_tool_result(name, result) == "error":
        return True
    data = parse_result(result) if name == "terminal" else None
    return data is not None and data.get("exit_code") not in (0, None)


#: teaching
class GuardrailDecision(NamedTuple):
    action: str                         # "warn", "block" or "halt"
    code: str                           # a key of GUARDRAIL_MESSAGES
    tool_name: str
    count: int                          # the count that crossed the threshold


#: hardened
class GuardrailDecision(NamedTuple):
    action: str                         # "warn", "block" or "halt"
    code: str                           # a key of GUARDRAIL_MESSAGES
    tool_name: str
    count: int                          # the count that crossed the threshold
    signature: tuple[str, str]          # call_signature() of the call


#: teaching
class ToolCallGuardrails:
    """One user turn's watch over tool calls that go in circles: before_call() may block a
    call, after_call() warn about it or halt the turn. A block changes no count."""

    def __init__(self, thresholds: dict | None = None):
        self.thresholds = {**GUARDRAIL_THRESHOLDS, **(thresholds or {})}
        self.exact_failures: dict[tuple, int] = {}      # signature -> failures so far
        self.tool_failures: dict[str, int] = {}         # tool name -> failures so far
        self.halted: GuardrailDecision | None = None    # set once the turn must end

    def run(self, name: str, args: dict) -> tuple[str, str]:
        """Run one valid call under guard: (its result, a note to append for the model)."""
        block = self.before_call(name, args)
        if block is not None:           # not run: an error, and the decision (no arguments)
            return json.dumps({"error": guardrail_message(block), "guardrail": block._asdict()},
                              ensure_ascii=False), ""
        result = REGISTRY.dispatch(name, args)
        decision = self.after_call(name, args, result)
        if decision is None:
            return result, ""
        label = "Tool loop hard stop" if decision.action == "halt" else "Tool loop warning"
        return result, (f"\n\n[{label}: {decision.code}; count={decision.count}; "
                        f"{guardrail_message(decision)}]")

    def before_call(self, name: str, args: dict) -> GuardrailDecision | None:
        if self.halted is not None:                     # later calls of the halted batch
            return GuardrailDecision("block", "turn_halted", name, self.halted.count)
        failures = self.exact_failures.get(call_signature(name, args), 0)
        if failures >= self.thresholds["exact_failure"][1]:
            return GuardrailDecision("block", "repeated_exact_failure_block", name, failures)
        return None

    def after_call(self, name: str, args: dict, result: str) -> GuardrailDecision | None:
        signature = call_signature(name, args)
        if not tool_call_failed(name, result):
            if tool_may_have_side_effect(name):     # something may have changed: retrying
                self.exact_failures.clear()         # an old failure is a new experiment now
                self.tool_failures.clear()
            self.exact_failures.pop(signature, None)
            self.tool_failures.pop(name, None)
            return None
        exact = self.exact_failures[signature] = self.exact_failures.get(signature, 0) + 1
        same = self.tool_failures[name] = self.tool_failures.get(name, 0) + 1
        if same >= self.thresholds["same_tool_failure"][1]:
            self.halted = GuardrailDecision("halt", "same_tool_failure_halt", name, same)
            return self.halted
        if exact >= self.thresholds["exact_failure"][0]:
            return GuardrailDecision("warn", "repeated_exact_failure_warning", name, exact)
        if same >= self.thresholds["same_tool_failure"][0]:
            return GuardrailDecision("warn", "same_tool_failure_warning", name, same)
        return None


#: hardened
class ToolCallGuardrails:
    """One user turn's watch over tool calls that go in circles. before_call() may
    block a call; after_call() may warn about it or halt the turn. Only calls that
    passed s02's door come here; a block is not a failure and changes no count."""

    def __init__(self, thresholds: dict | None = None):
        self.thresholds = {**GUARDRAIL_THRESHOLDS, **(thresholds or {})}
        self.exact_failures: dict[tuple, int] = {}      # signature -> failures so far
        self.tool_failures: dict[str, int] = {}         # tool name -> failures so far
        self.same_results: dict[tuple, tuple] = {}      # signature -> (result hash, times)
        self.halted: GuardrailDecision | None = None    # set once the turn must end

    def run(self, name: str, args: dict) -> tuple[str, str]:
        """Run one valid call under guard: (its result, a note to append for the model)."""
        block = self.before_call(name, args)
        if block is not None:
            return guardrail_refusal(block), ""
        result = REGISTRY.dispatch(name, args)
        decision = self.after_call(name, args, result)
        return result, guardrail_note(decision) if decision is not None else ""

    def before_call(self, name: str, args: dict) -> GuardrailDecision | None:
        signature = call_signature(name, args)
        if self.halted is not None:                     # later calls of the halted batch
            return GuardrailDecision("block", "turn_halted", name, self.halted.count, signature)
        failures = self.exact_failures.get(signature, 0)
        if failures >= self.thresholds["exact_failure"][1]:
            return GuardrailDecision("block", "repeated_exact_failure_block", name, failures,
                                     signature)
        repeats = self.same_results.get(signature, ("", 0))[1]
        if repeats >= self.thresholds["no_progress"][1]:
            return GuardrailDecision("block", "idempotent_no_progress_block", name, repeats,
                                     signature)
        return None

    def after_call(self, name: str, args: dict, result: str) -> GuardrailDecision | None:
        signature = call_signature(name, args)
        if tool_call_failed(name, result):
            return self.count_failure(name, signature)
        if tool_may_have_side_effect(name):     # something may have changed: retrying an
            self.exact_failures.clear()         # old failure or rereading a file is a new
            self.tool_failures.clear()          # experiment now
            self.same_results.clear()
            return None
        self.exact_failures.pop(signature, None)
        self.tool_failures.pop(name, None)
        return self.count_same_result(name, signature, result)

    def count_failure(self, name: str, signature: tuple) -> GuardrailDecision | None:
        exact = self.exact_failures[signature] = self.exact_failures.get(signature, 0) + 1
        same = self.tool_failures[name] = self.tool_failures.get(name, 0) + 1
        self.same_results.pop(signature, None)
        if same >= self.thresholds["same_tool_failure"][1]:
            self.halted = GuardrailDecision("halt", "same_tool_failure_halt", name, same,
                                            signature)
            return self.halted
        if exact >= self.thresholds["exact_failure"][0]:
            return GuardrailDecision("warn", "repeated_exact_failure_warning", name, exact,
                                     signature)
        if same >= self.thresholds["same_tool_failure"][0]:
            return GuardrailDecision("warn", "same_tool_failure_warning", name, same, signature)
        return None

    def count_same_result(self, name: str, signature: tuple, result: str):
        """A read-only call: the same result as last time is no progress."""
        digest = hashlib.sha256(result.encode("utf-8", "replace")).hexdigest()
        previous = self.same_results.get(signature)
        repeats = previous[1] + 1 if previous is not None and previous[0] == digest else 1
        self.same_results[signature] = (digest, repeats)
        if repeats >= self.thresholds["no_progress"][0]:
            return GuardrailDecision("warn", "idempotent_no_progress_warning", name, repeats,
                                     signature)
        return None

#: section Recovery details


#: teaching
def retry_after_seconds(headers, now: float | None = None) -> float | None:
    """The seconds the endpoint's `Retry-After` asks for; None if absent, a date or no number."""
    try:
        seconds = float(headers.get("retry-after"))
    except (ValueError, TypeError):                     # absent, a date, or no number
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


#: hardened
def retry_after_seconds(headers, now: float | None = None) -> float | None:
    """The wait an endpoint asked for: `retry-after-ms` (OpenAI's), or `Retry-After`
    in seconds ("2", "0.5") or as an HTTP date. None when absent or unreadable."""
    try:
        if headers.get("retry-after-ms") is not None:
            seconds = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after") is not None:
            seconds = seconds_until(headers["retry-after"], now)
        else:
            return None
    except (ValueError, TypeError, OverflowError):
        return None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):   # NaN, infinity
        return None
    return max(0.0, seconds)


#: hardened
def seconds_until(value: str, now: float | None) -> float:
    """A Retry-After value: seconds, or an HTTP date such as
    "Wed, 21 Oct 2015 07:28:00 GMT" (then the seconds from `now` until it)."""
    try:
        return float(value)
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)   # ValueError if it is no date
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp() - (time.time() if now is None else now)


#: hardened
def response_headers(exc: Exception):
    """The headers of the endpoint's answer (an httpx Headers: any letter case), or {}."""
    response = getattr(exc, "response", None)
    return getattr(response, "headers", None) or {}


#: hardened
def error_text(exc: Exception) -> str:
    """Everything an error says, in lower case: its message and the code in its body."""
    parts = [str(exc), getattr(exc, "code", None), getattr(exc, "type", None)]
    return " ".join(str(part) for part in parts if part).lower()


#: hardened
# Words in an error that change its meaning. OpenAI answers both "slow down" and
# "your credit is gone" with 429; only the words tell them apart.
_CONTEXT_OVERFLOW = re.compile(r"context_length_exceeded|context length|context window"
                               r"|maximum context|prompt is too long|too many tokens"
                               r"|reduce the length|max_model_len")
_BILLING = re.compile(r"insufficient_quota|exceeded your current quota|insufficient (?:credit"
                      r"|balance|funds)|payment required|credit balance|billing hard limit")


#: hardened
def status_category(status: int, text: str) -> str:
    """The category of an HTTP error: the status, refined by the error's words
    where one status means two things."""
    if status == 400 and TOOL_CHOICE_REFUSED.search(text):
        return "tool_choice"
    if status == 413 or (status == 400 and _CONTEXT_OVERFLOW.search(text)):
        return "context_overflow"
    if status == 402 or (status in (400, 403, 429) and _BILLING.search(text)):
        return "billing"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "model_not_found"
    if status == 408:
        return "timeout"
    if status >= 500 and status != 501:       # 501: the server has no such API at all
        return "server"
    return "bad_request"


#: teaching
def explain_api_failure(exc: Exception, base_url: str, model: str) -> str:
    """s01's describe_api_error(), plus two categories it takes for a 429 or a 400."""
    category = classify_api_error(exc).category
    if category == "billing":
        return (f"The endpoint {base_url} says this account has no quota or credit left. "
                f"Check the plan and billing; retrying cannot fix this.")
    if category == "context_overflow":
        return (f"The conversation no longer fits the context window of '{model}'. Try "
                f"/compress, a new session, or a model with a longer context.")
    return describe_api_error(exc, base_url, model)


#: hardened
def explain_api_failure(exc: Exception, base_url: str, model: str) -> str:
    """The one line for a failed turn: s01's describe_api_error(), plus the two
    categories it cannot tell from a rate limit or a bad request."""
    category = classify_api_error(exc).category
    if category == "billing":
        return (f"The endpoint {base_url} says this account has no quota or credit left "
                f"({first_line(getattr(exc, 'message', exc), 120)}). Check the plan and "
                f"billing; retrying cannot fix this.")
    if category == "context_overflow":
        return (f"The conversation no longer fits the context window of '{model}', and it "
                f"could not be compressed. Start a new session, or choose a model with a "
                f"longer context.")
    return describe_api_error(exc, base_url, model)


#: teaching
GUARDRAIL_MESSAGES = {
    "repeated_exact_failure_warning": "{tool} failed {count} times with exactly these "
        "arguments. Read the error and change something before you call it again.",
    "same_tool_failure_warning": "{tool} failed {count} times in a row this turn. Check your "
        "assumptions (for terminal: which folder, which files?) before the next try.",
    "repeated_exact_failure_block": "Not run: {tool} already failed {count} times with "
        "exactly these arguments. Change them or the approach, or tell the user what blocks you.",
    "same_tool_failure_halt": "{tool} failed {count} times in a row this turn, so it ends here.",
    "turn_halted": "Not run: the tool-call guardrail stopped this turn before this call.",
}


#: hardened
GUARDRAIL_MESSAGES = {
    "repeated_exact_failure_warning": "{tool} failed {count} times with exactly these "
        "arguments. Read the error and change something before you call it again.",
    "same_tool_failure_warning": "{tool} failed {count} times in a row this turn. Check your "
        "assumptions (for terminal: which folder, which files?) before the next try.",
    "idempotent_no_progress_warning": "{tool} returned the same result {count} times. Use "
        "the result you already have.",
    "repeated_exact_failure_block": "Not run: {tool} already failed {count} times with "
        "exactly these arguments. Change the arguments or the approach, or tell the user "
        "what is in the way.",
    "idempotent_no_progress_block": "Not run: {tool} already returned the same result "
        "{count} times for these arguments. Use that result.",
    "same_tool_failure_halt": "{tool} failed {count} times in a row this turn, so the turn "
        "ends here.",
    "turn_halted": "Not run: the tool-call guardrail stopped this turn before this call.",
}


def guardrail_message(decision: GuardrailDecision) -> str:
    return GUARDRAIL_MESSAGES[decision.code].format(tool=decision.tool_name,
                                                    count=decision.count)


#: hardened
def guardrail_refusal(decision: GuardrailDecision) -> str:
    """The result of a call that was not run: an error for the model, and the
    decision as data. The arguments appear only as their hash."""
    tool_name, args_hash = decision.signature
    return json.dumps({"error": guardrail_message(decision), "guardrail": {
        "action": decision.action, "code": decision.code, "message": guardrail_message(decision),
        "tool_name": decision.tool_name, "count": decision.count,
        "signature": {"tool_name": tool_name, "args_hash": args_hash}}}, ensure_ascii=False)


#: hardened
def guardrail_note(decision: GuardrailDecision) -> str:
    """What after_call() appends to a real result: the model reads it with the result."""
    label = "Tool loop hard stop" if decision.action == "halt" else "Tool loop warning"
    return (f"\n\n[{label}: {decision.code}; count={decision.count}; "
            f"{guardrail_message(decision)}]")


def halt_explanation(decision: GuardrailDecision) -> str:
    return (f"[stopped: {decision.tool_name} failed {decision.count} times in a row, so the "
            f"tool-call guardrail ended this turn ({decision.code}). Read the errors above, "
            f"then ask again with another approach.]")

#: section Error recovery commands | plumbing


#: teaching
def show_recovery(session: Session, argument: str) -> None:
    """/recovery: what this session does when a model call fails or loops."""
    policy = session.recovery
    fallback = "none" if policy.fallback_client is None \
        else f"{policy.fallback_model or session.model} at {policy.fallback_client.base_url}"
    console.print(Text(f"  retries     {policy.max_retries} per model call, waiting "
                       f"{policy.base_delay:g} s, doubling up to {policy.max_delay:g} s\n"
                       f"  fallback    {fallback}\n  budget      {session.max_iterations} model "
                       f"calls per turn\n  guardrails  (warn, stop) {GUARDRAIL_THRESHOLDS}"))


#: hardened
def show_recovery(session: Session, argument: str) -> None:
    """/recovery: what this session does when a model call fails or loops."""
    policy = session.recovery
    fallback = "none (--fallback-model, --fallback-base-url)" if policy.fallback_client is None \
        else f"{policy.fallback_model or session.model} at {policy.fallback_client.base_url}"
    limits = "; ".join(f"{kind} warn {warn}, stop {stop}"
                       for kind, (warn, stop) in GUARDRAIL_THRESHOLDS.items())
    for name, value in (
            ("retries", f"{policy.max_retries} per model call, waiting {policy.base_delay:g} s, "
                        f"doubling up to {policy.max_delay:g} s, plus up to "
                        f"{RETRY_JITTER:.0%} jitter; Retry-After honoured up to "
                        f"{MAX_RETRY_AFTER:g} s"),
            ("fallback", fallback),
            ("budget", f"{session.max_iterations} model calls per turn (--max-iterations)"),
            ("guardrails", limits)):
        console.print(Text(f"  {name:<11} {value}"))


COMMANDS["/recovery"] = show_recovery


#: teaching
def non_negative_int(text: str) -> int:
    if int(text) < 0:                   # argparse says so for a text that is no number
        raise argparse.ArgumentTypeError("must be 0 or more")
    return int(text)


#: hardened
def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


#: teaching
def retry_policy_from_args(args, session: Session) -> RetryPolicy:
    """--max-retries, and a fallback if a fallback flag is given. The key is OPENAI_API_KEY."""
    fallback_client = make_client(args.fallback_base_url, os.environ.get("OPENAI_API_KEY")) \
        if args.fallback_base_url else session.client if args.fallback_model else None
    return RetryPolicy(args.max_retries, fallback_client=fallback_client,
                       fallback_model=args.fallback_model)


#: hardened
def retry_policy_from_args(args, session: Session) -> RetryPolicy:
    """--max-retries, and a fallback if either fallback flag is given: a model on the
    same endpoint, the same model elsewhere, or both. The key is OPENAI_API_KEY."""
    fallback_client = None
    if args.fallback_base_url:
        fallback_client = make_client(args.fallback_base_url, os.environ.get("OPENAI_API_KEY"))
    elif args.fallback_model:
        fallback_client = session.client
    return RetryPolicy(max_retries=args.max_retries, fallback_client=fallback_client,
                       fallback_model=args.fallback_model)


#: hardened
def every_call_answered(messages: list) -> bool:
    """True if every tool call in `messages` has exactly one result."""
    calls = [call["id"] for m in messages for call in m.get("tool_calls") or []]
    results = [m.get("tool_call_id") for m in messages if m.get("role") == "tool"]
    return sorted(calls) == sorted(results)


#: hardened
DEMO_BASE_DELAY = 0.01                  # the demo waits 1/200 of the real backoff


#: hardened
DEMO_TITLES = {                         # what each of DEMO_INPUTS shows
    "fail rate_limit": "A 429 with Retry-After: wait as asked, then the same request again.",
    "fail connection": "A dropped connection: retried after a short, jittered wait.",
    "fail server 4": "An outage: three retries with growing waits, then the fallback, once.",
    "fail auth": "A 401: no retry can fix a key. One line, no second request.",
    "fail context_overflow": "Too long for the model: compressed (s05), then sent once "
                             "more.",
    "retry $ ls no-such-file": "A model stuck on a failing command: a warning from the 2nd "
                               "failure, a block after the 5th, a halt at the 8th.",
}


#: hardened
def recovery_demo_session(template: Session, max_iterations: int) -> Session:
    """A new session on the demo's endpoint with tiny waits and a fallback model."""
    session = Session(template.client, template.model, template.base_url, max_iterations,
                      template.tools, None)
    session.recovery = RetryPolicy(base_delay=DEMO_BASE_DELAY, fallback_client=template.client,
                                   fallback_model="offline-backup")
    return session

#: more for Offline model (not part of the lesson)


#: teaching
# 'fail <kind>': the (status, error code) answered instead; "connection" hangs up.
OFFLINE_FAILURES = {"rate_limit": (429, None), "billing": (429, "insufficient_quota"),
                    "auth": (401, None), "model_not_found": (404, None),
                    "context_overflow": (400, "context_length_exceeded"),
                    "bad_request": (400, None), "server": (500, None), "connection": None}


#: teaching
def failure_asked(text: str):
    """'fail <kind> [times]' as (kind, times); None if it is not one."""
    words = text.split() + ["1"]                        # once by default
    ok = len(words) in (3, 4) and words[0] == "fail" and words[1] in OFFLINE_FAILURES
    return (words[1], int(words[2])) if ok and words[2].isdecimal() and int(words[2]) else None


#: teaching
def offline_failure(request: dict, failures: dict):
    """(status, body, headers) or "connection" instead of an answer, `times` times for one
    request (its last message, and how often that was sent); offline-backup never fails."""
    messages = request.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    asked = failure_asked(str(last.get("content")))
    key = (last.get("content"), messages.count(last))
    if request.get("model") != "offline" or last.get("role") != "user" or asked is None \
            or failures.get(key, 0) >= asked[1]:
        return None
    failures[key] = failures.get(key, 0) + 1
    if OFFLINE_FAILURES[asked[0]] is None:
        return "connection"
    status, code = OFFLINE_FAILURES[asked[0]]
    return status, {"error": {"message": f"The offline endpoint failed as asked ({asked[0]}).",
                              "type": "offline_failure", "code": code}}, \
        {"Retry-After": "0.1"} if asked[0] == "rate_limit" else {}


#: teaching
def recovery_reply(text: str, counter: list) -> dict:
    """'fail …' answered at last, or the first call of 'retry <input>'."""
    if text.startswith("fail "):
        asked = failure_asked(text)
        return {"content": f"This answer got through: the endpoint failed ({asked[0]}) as "
                           f"asked, and the agent recovered." if asked else
                           f"fail what? Kinds: {', '.join(OFFLINE_FAILURES)}; times: 1 or more."}
    return stubborn_rerun([{"role": "user", "content": text}], counter) \
        or {"content": "retry what? Try: retry $ ls no-such-file"}


#: teaching
def stubborn_rerun(messages: list, counter: list):
    """After 'retry <input>', like a stuck model: make that call again and again. Once it
    is blocked, vary a terminal command (a comment): only the same-tool count stops it."""
    start = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    text = str(messages[start]["content"])
    plan = offline_plan(text.removeprefix("retry ").strip())
    blocked = any('"guardrail"' in str(m.get("content")) for m in messages[start + 1:])
    if not text.startswith("retry ") or plan is None or isinstance(plan[1], str) \
            or blocked and plan[0] != "terminal":       # a blocked read: give up, summarise
        return None
    name, args = plan
    if blocked:
        attempt = 1 + sum(m["role"] == "assistant" for m in messages[start:])  # this turn
        args = {"command": f"{args['command']} # attempt {attempt}"}
    counter[0] += 1
    call = {"name": name, "arguments": json.dumps(args)}
    return {"content": "", "tool_calls": [{"id": f"call_retry_{counter[0]}", "type": "function",
                                           "function": call}]}


#: hardened
# 'fail <kind>': what the offline endpoint answers instead (status, error code, message,
# headers), as OpenAI words it. "connection" hangs up without any answer.
OFFLINE_FAILURES = {
    "rate_limit": (429, "rate_limit_exceeded", "Rate limit reached for requests. Please try "
                   "again in 0.1s.", {"Retry-After": "0.1"}),
    "billing": (429, "insufficient_quota", "You exceeded your current quota, please check "
                "your plan and billing details.", {}),
    "auth": (401, "invalid_api_key", "Incorrect API key provided.", {}),
    "model_not_found": (404, "model_not_found", "The model does not exist or you do not "
                        "have access to it.", {}),
    "context_overflow": (400, "context_length_exceeded", "This model's maximum context "
                         "length is 8192 tokens; your messages resulted in 9000 tokens.", {}),
    "bad_request": (400, None, "Invalid value for 'messages'.", {}),
    "server": (500, None, "The server had an error while processing your request.", {}),
    "connection": None,
}


#: hardened
def offline_failure(request: dict, failures: dict):
    """For 'fail <kind> [times]': the failure to send instead of an answer, until this
    request has failed `times` times (default 1). A request is known by its last
    message and how often that message was sent before, so a retry, even of a
    shortened conversation, is the same request. Only the model "offline" fails: a
    fallback model on the same server (the demo's offline-backup) is healthy."""
    messages = request.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    words = str(last.get("content") or "").split()
    if request.get("model") != "offline" or last.get("role") != "user" \
            or not 2 <= len(words) <= 3 or words[0] != "fail" or words[1] not in OFFLINE_FAILURES:
        return None
    times = 1 if len(words) == 2 else int(words[2]) if words[2].isdecimal() else 0  # 0: refused
    key = (last["content"], sum(1 for m in messages if m == last))
    done = failures.get(key, 0)
    if done >= times:
        return None
    failures[key] = done + 1
    if OFFLINE_FAILURES[words[1]] is None:
        return "connection"
    status, code, message, headers = OFFLINE_FAILURES[words[1]]
    return status, {"error": {"message": message, "type": "offline_failure", "code": code}}, \
        headers


#: hardened
def recovery_reply(text: str, counter: list) -> dict:
    """'fail …' answered at last, or the first call of 'retry <input>'."""
    verb, _, rest = text.partition(" ")
    if verb == "fail":
        words = rest.split()
        kind = words[0] if words else ""
        if kind not in OFFLINE_FAILURES:
            return {"content": f"fail what? Kinds: {', '.join(OFFLINE_FAILURES)}."}
        if words[1:] and not (len(words) == 2 and words[1].isdecimal() and int(words[1]) > 0):
            return {"content": f"fail {kind} how many times? A count of 1 or more, e.g. "
                               f"fail {kind} 3."}
        return {"content": f"This answer got through: the endpoint failed ({kind}) as "
                           f"asked, and the agent recovered."}
    plan = offline_plan(rest.strip())
    if plan is None or isinstance(plan[1], str):
        return {"content": "retry what? Try: retry $ ls no-such-file"}
    counter[0] += 1
    return {"content": "", "tool_calls": [{"id": f"call_retry_{counter[0]}", "type": "function",
                                           "function": {"name": plan[0],
                                                        "arguments": json.dumps(plan[1])}}]}


#: hardened
def stubborn_rerun(messages: list, counter: list):
    """After 'retry <input>', like a model stuck in a loop: send the same call again,
    whatever the result. Once a guardrail blocks it, change a terminal command a
    little each time (a comment), so only the same-tool count can stop it."""
    user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    assistant = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
    calls = assistant.get("tool_calls") or []
    if not str(user.get("content")).startswith("retry ") or len(calls) != 1 \
            or not calls[0]["id"].startswith("call_retry_"):
        return None
    function = dict(calls[0]["function"])
    command = str((parse_result(function["arguments"]) or {}).get("command"))
    change = " # attempt " in command or '"guardrail"' in str(messages[-1].get("content"))
    if change and function["name"] != "terminal":
        return None                             # a blocked read: give up and summarise
    counter[0] += 1
    if change:
        base = command.split(" # attempt ")[0]
        start = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        attempt = 1 + sum(m.get("role") == "assistant" for m in messages[start:])  # this turn
        function["arguments"] = json.dumps({"command": f"{base} # attempt {attempt}"})
    return {"content": "", "tool_calls": [{"id": f"call_retry_{counter[0]}", "type": "function",
                                           "function": function}]}

#: changes

STAGE = "s06"


STAGE_TITLE = "retries, a fallback, an iteration budget and tool-loop guardrails"


#: teaching
def run_conversation(client, model: str, messages: list,
                     max_iterations: int = MAX_ITERATIONS, on_event=None, tools=None,
                     context_length: int | None = None,
                     recovery: RetryPolicy | None = None) -> str:
    """The agent loop. Returns the final answer text.

    The loop ends when the assistant message has no tool calls: we trust the
    message itself, not finish_reason, which some servers report wrongly.
    `tools` is the list of definitions offered (default: every available tool).
    Before every model call, compress_context() keeps the messages inside the window.
    """
    on_event = on_event or (lambda kind, data: None)
    tools = REGISTRY.get_definitions() if tools is None else tools
    offered = {tool["function"]["name"]: tool for tool in tools}
    strikes = 0                         # consecutive turns whose calls were all invalid
    budget = IterationBudget(max_iterations)        # one of each per user turn
    guardrails = ToolCallGuardrails()
    while budget.consume():
        compress_context(client, model, messages, context_length, on_event=on_event,
                         tools=tools)
        response = call_model(client, model, messages, tools, recovery)
        message = first_message(response)
        messages.append(assistant_message_to_dict(message))
        if not message.tool_calls:
            return messages[-1]["content"]      # the stored text: safe to print
        if run_tool_calls(message.tool_calls, messages, on_event, offered, guardrails):
            strikes = 0
        else:
            strikes += 1
        if guardrails.halted is not None:       # every call of this batch has its result
            return halt_explanation(guardrails.halted)
        if strikes >= MAX_INVALID_TURNS:
            names = ", ".join(sorted({call_parts(call)[1] for call in message.tool_calls}))
            return (f"[stopped: {strikes} turns in a row contained only invalid tool calls "
                    f"(last: {names}). Ask again, or check the model's tool support.]")
    return (f"[stopped: this turn reached its limit of {max_iterations} model call(s) "
            f"(--max-iterations). Ask again to continue.]")


#: hardened
def run_conversation(client, model: str, messages: list,
                     max_iterations: int = MAX_ITERATIONS, on_event=None, tools=None,
                     context_length: int | None = None,
                     recovery: RetryPolicy | None = None) -> str:
    """The agent loop. Returns the final answer text.

    The loop ends when the assistant message has no tool calls: we trust the
    message itself, not finish_reason, which some servers report wrongly.
    `tools` is the list of definitions offered (default: every available tool).
    Before every model call, compress_context() keeps the messages inside the
    model's `context_length` (s05).
    `recovery` says how a failed model call is retried (see call_model()).
    """
    on_event = on_event or (lambda kind, data: None)
    tools = REGISTRY.get_definitions() if tools is None else tools
    offered = {tool["function"]["name"]: tool for tool in tools}
    strikes = 0                         # consecutive turns whose calls were all invalid
    budget = IterationBudget(max_iterations)        # one of each per user turn
    guardrails = ToolCallGuardrails()
    while budget.consume():
        compress_context(client, model, messages, context_length, on_event=on_event,
                         tools=tools)
        response = call_model(client, model, messages, tools, recovery)
        message = first_message(response)
        messages.append(assistant_message_to_dict(message))
        if not message.tool_calls:
            return messages[-1]["content"]      # the stored text: safe to print
        if run_tool_calls(message.tool_calls, messages, on_event, offered, guardrails):
            strikes = 0
        else:
            strikes += 1
        if guardrails.halted is not None:       # every call of this batch has its result
            return halt_explanation(guardrails.halted)
        if strikes >= MAX_INVALID_TURNS:
            names = ", ".join(sorted({call_parts(call)[1] for call in message.tool_calls}))
            return (f"[stopped: {strikes} turns in a row contained only invalid tool calls "
                    f"(last: {names}). Ask again, or check the model's tool support.]")
    return (f"[stopped: this turn reached its limit of {max_iterations} model call(s) "
            f"(--max-iterations). Ask again to continue.]")


#: teaching
def run_tool_calls(tool_calls: list, messages: list, on_event, offered: dict,
                   guardrails: ToolCallGuardrails | None = None) -> bool:
    """Check every call at the door, run the valid ones in order; each call gets
    exactly one tool message. Returns True if at least one call was valid.

    If Ctrl-C arrives, the interrupted call and every call after it still get a
    result ("interrupted"), so the conversation stays valid; then we re-raise.
    """
    guardrails = guardrails or ToolCallGuardrails()
    calls = [call_parts(call) for call in tool_calls]
    checked = [validate_tool_call(name, arguments, offered) for _, name, arguments in calls]
    try:
        for (call_id, name, arguments), (args, error) in zip(calls, checked):
            on_event("tool_call", {"name": name, "arguments": arguments})
            result, note = (error, "") if error is not None else guardrails.run(name, args)
            result = safe_text(result)
            messages.append(tool_message(call_id, result + note))
            on_event("tool_result", {"name": name, "result": result, "note": note})
    except KeyboardInterrupt:
        answer_open_tool_calls(messages, "interrupted by the user")
        raise
    return any(error is None for _, error in checked)


#: hardened
def run_tool_calls(tool_calls: list, messages: list, on_event, offered: dict,
                   guardrails: ToolCallGuardrails | None = None) -> bool:
    """Check every call at the door, run the valid ones in order; each call gets
    exactly one tool message. Returns True if at least one call was valid.
    Valid calls run through the turn's `guardrails`, which may add a note.

    If Ctrl-C arrives, the interrupted call and every call after it still get a
    result ("interrupted"), so the conversation stays valid; then we re-raise.
    """
    guardrails = guardrails or ToolCallGuardrails()
    calls = [call_parts(call) for call in tool_calls]
    checked = [validate_tool_call(name, arguments, offered) for _, name, arguments in calls]
    try:
        for (call_id, name, arguments), (args, error) in zip(calls, checked):
            on_event("tool_call", {"name": name, "arguments": arguments})
            result, note = (error, "") if error is not None else guardrails.run(name, args)
            result = safe_text(result)
            messages.append(tool_message(call_id, result + note))
            on_event("tool_result", {"name": name, "result": result, "note": note})
    except KeyboardInterrupt:
        answer_open_tool_calls(messages, "interrupted by the user")
        raise
    return any(error is None for _, error in checked)

#: teaching
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL.
The offline model understands:
  $ <command>            run a shell command with the terminal tool
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails first (once by default; 'fail ?' lists the kinds)
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)"""


#: hardened
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL.
The offline model understands:
  $ <command>            run a shell command with the terminal tool
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails this request (default once) before it
                         answers; kinds: rate_limit, billing, auth, model_not_found,
                         context_overflow, bad_request, server, connection
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)"""


class Session:
    """Everything one running agent needs: the client, the model, the messages."""

    def __init__(self, client, model: str, base_url: str, max_iterations: int, tools=None,
                 store: SessionStore | None = None,
                 context_length: int = DEFAULT_CONTEXT_LENGTH):
        self.client = client
        self.model = model
        self.base_url = base_url
        self.max_iterations = max_iterations
        self.context_length = context_length
        self.tools = REGISTRY.get_definitions() if tools is None else tools
        self.store = store
        self.recovery = RetryPolicy()        # main() sets it from the command line
        self.switch_to(new_session_id(), [])

    def switch_to(self, session_id: str, messages: list) -> None:
        """Make `session_id` the current conversation: a new one or a resumed one.
        A new one starts with the system prompt; a resumed one keeps its own."""
        self.session_id = session_id
        is_new = not messages
        if is_new:
            prompt = build_system_prompt(current_directory(), hermes_home())
            messages = [{"role": "system", "content": prompt}]
        self.messages = RecordedMessages(self.store, session_id, self.model, messages) \
            if self.store else list(messages)
        if is_new and self.store:
            self.messages.saved = 0         # the prompt is saved with the first real message
        ActiveSession.session_id = session_id


def show_event(kind: str, data: dict) -> None:
    """Print tool calls and results compactly."""
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}",
                           style="cyan"))
    elif kind == "tool_result":
        outcome = classify_tool_result(data["name"], data["result"])
        style = {"landed": "green", "error": "red", "refused": "yellow"}.get(outcome, "dim")
        console.print(Text(indent_result(data["result"]), style=style))
        if outcome != "ok":
            console.print(Text(f"    [{outcome}]", style=style))
        if data.get("note"):                # a guardrail's words, as the model gets them
            console.print(Text("    " + data["note"].strip(), style="yellow"))
    elif kind in ("compressed", "compression_failed"):
        show_compression_event(kind, data)


def run_turn(session: Session, user_text: str) -> bool:
    """One user turn. Returns False if the model call failed."""
    session.messages.append({"role": "user", "content": undecodable_to_replacement(user_text)})
    try:
        answer = run_conversation(session.client, session.model, session.messages,
                                  session.max_iterations, show_event, session.tools,
                                  session.context_length, session.recovery)
    except (openai.OpenAIError, json.JSONDecodeError) as exc:   # JSONDecodeError: not an API
        line = explain_api_failure(exc, session.base_url, session.model)
        err_console.print(Text("error: " + line, style="red"))
        return False
    console.print(Text(answer))
    return True


#: teaching
DEMO_INPUTS = ["fail rate_limit", "fail server 4", "fail auth", "retry $ ls no-such-file"]


#: hardened
DEMO_INPUTS = ["fail rate_limit", "fail connection", "fail server 4", "fail auth",
               "fail context_overflow", "retry $ ls no-such-file", "retry $ echo again"]


#: teaching
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}. Waits are 1/200 of the real ones; the "
                       f"fallback is the model offline-backup.", style="bold"))
    session.recovery = RetryPolicy(base_delay=0.01, fallback_client=session.client,
                                   fallback_model="offline-backup")     # --demo saves nothing
    for line in DEMO_INPUTS:
        console.print(Text(f"\n{STAGE}> {line}", style="bold"))
        run_turn(session, line)
    return 0


#: hardened
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    console.print(Text(f"The offline endpoint fails on request ('fail <kind> [times]'). The demo "
                       f"waits {DEMO_BASE_DELAY:g} s where a session waits {RETRY_BASE_DELAY:g} s, "
                       f"and its fallback is the model offline-backup.", style="dim"))
    start = current_directory()             # None if it was deleted: then there is no way back
    with tempfile.TemporaryDirectory(prefix="s06-demo-") as folder:
        os.chdir(folder)                    # the demo's commands run here
        try:
            current = recovery_demo_session(session, MAX_ITERATIONS)
            for line in DEMO_INPUTS[:-1]:
                console.print(Text(f"\n{DEMO_TITLES[line]}", style="bold"))
                console.print(Text(f"{STAGE}> {line}", style="bold"))
                run_turn(current, line)
            console.print(Text(f"every tool call has its result: "
                               f"{every_call_answered(current.messages)}", style="dim"))
            console.print(Text("\nWith --max-iterations 3, a loop that never fails still ends:",
                               style="bold"))
            short = recovery_demo_session(session, 3)
            console.print(Text(f"{STAGE}> {DEMO_INPUTS[-1]}", style="bold"))
            run_turn(short, DEMO_INPUTS[-1])
            requests = sum(1 for m in short.messages if m.get("role") == "assistant")
            console.print(Text(f"model calls in that turn: {requests}; every tool call has its "
                               f"result: {every_call_answered(short.messages)}", style="dim"))
        finally:
            if start is not None:
                os.chdir(start)
    return 0


#: teaching
def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=STAGE, description=f"{STAGE}: {STAGE_TITLE}.")
    parser.add_argument("-p", "--prompt", help="ask one question, print the answer, exit")
    parser.add_argument("--demo", action="store_true", help="scripted walk-through (offline)")
    parser.add_argument("--offline", action="store_true", help="use the built-in offline model")
    parser.add_argument("--model", help=f"default: ${MODEL_ENV_VAR} or {DEFAULT_MODEL}")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    parser.add_argument("--max-iterations", type=positive_int, default=MAX_ITERATIONS)
    parser.add_argument("--max-retries", type=non_negative_int, default=API_MAX_RETRIES)
    parser.add_argument("--fallback-model", help="tried once when the retries are used up")
    parser.add_argument("--fallback-base-url", help="endpoint for the fallback")
    parser.add_argument("--toolsets", type=toolset_list, help="offer only these toolsets")
    parser.add_argument("--disable-toolsets", type=toolset_list, help="never offer these")
    parser.add_argument("--context-length", type=positive_int, default=DEFAULT_CONTEXT_LENGTH,
                        metavar="TOKENS", help="the model's context window")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="ID", help="continue the session with this id")
    resume.add_argument("--continue", dest="continue_session", action="store_true",
                        help="continue the most recent session")
    return parser.parse_args(argv)


#: hardened
def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog=STAGE, description=f"{STAGE}: {STAGE_TITLE}.",
        epilog="Without OPENAI_API_KEY or OPENAI_BASE_URL the built-in offline model is used.")
    parser.add_argument("-p", "--prompt", help="ask one question, print the answer, exit")
    parser.add_argument("--demo", action="store_true", help="scripted walk-through (offline)")
    parser.add_argument("--offline", action="store_true", help="use the built-in offline model")
    parser.add_argument("--model",
                        help=f"model name (default: ${MODEL_ENV_VAR} or {DEFAULT_MODEL})")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)")
    parser.add_argument("--max-iterations", type=positive_int, default=MAX_ITERATIONS,
                        help=f"model calls per turn (default {MAX_ITERATIONS})")
    parser.add_argument("--max-retries", type=non_negative_int, default=API_MAX_RETRIES,
                        help=f"retries of a failed model call (default {API_MAX_RETRIES})")
    parser.add_argument("--fallback-model", help="tried once when the retries are used up")
    parser.add_argument("--fallback-base-url",
                        help="endpoint for the fallback (default: the same endpoint)")
    known = ", ".join(REGISTRY.toolsets())
    parser.add_argument("--toolsets", type=toolset_list, help=f"offer only these ({known})")
    parser.add_argument("--disable-toolsets", type=toolset_list, help="never offer these")
    parser.add_argument("--context-length", type=positive_int, default=DEFAULT_CONTEXT_LENGTH,
                        metavar="TOKENS", help=f"the model's context window (default "
                        f"{DEFAULT_CONTEXT_LENGTH}); compression starts above "
                        f"{COMPRESSION_THRESHOLD * 100:.0f}%% of it")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="ID", help="continue the session with this id")
    resume.add_argument("--continue", dest="continue_session", action="store_true",
                        help="continue the most recent session")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    exit_on_signals()
    CtrlC.install()
    args = parse_args(argv)
    session = open_session(args)
    session.recovery = retry_policy_from_args(args, session)
    if args.demo:
        return run_demo(session)
    try:
        wanted = args.resume or ("latest" if args.continue_session else None)
        if wanted and not resume_session(session, wanted):
            return 1
        if args.prompt is not None:
            return run_prompt(session, args.prompt)
        return repl(session)
    finally:
        close_session(session)

# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'fail <kind> [times]', 'retry <input>' or '$ <command>'"


def offline_reply(messages: list, counter: list) -> dict:
    """The next assistant message, as plain data."""
    last = messages[-1] if messages else {}
    if messages and messages[0].get("content") == SUMMARY_INSTRUCTIONS:    # the summariser
        return {"content": offline_compression_summary(str(last.get("content")))}
    if last.get("role") == "tool":
        return stubborn_retry(messages) or stubborn_rerun(messages, counter) \
            or {"content": offline_summary(messages)}
    text = str(last.get("content") or "").strip()
    if text == "prompt":
        return {"content": describe_system_prompt(messages)}
    if text == "context":
        return {"content": describe_context(messages)}
    if text.startswith(("fail ", "retry ")):
        return recovery_reply(text, counter)
    plan = offline_plan(text)
    if plan is None:
        return {"content": OFFLINE_HELP}
    counter[0] += 1
    name, args = plan
    raw = isinstance(args, str)
    call_id = f"call_{'raw' if raw else 'offline'}_{counter[0]}"
    arguments = args if raw else json.dumps(args)
    return {"content": "", "tool_calls": [{"id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": arguments}}]}


#: teaching
class OfflineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):              # keep the learner's screen clean
        pass

    def do_POST(self):
        headers = {}
        try:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            failure = offline_failure(request, self.server.failures)
            if failure == "connection":         # hang up without an answer
                self.close_connection = True
                return
            status, body, headers = failure or (200, completion_body(
                offline_reply(request["messages"], self.server.counter), request["model"]), {})
        except Exception as exc:               # one line for the learner, not a traceback
            status, body = 500, {"error": {"message": f"offline model failed: {exc}"}}
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():     # Retry-After
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


#: hardened
class OfflineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):              # keep the learner's screen clean
        pass

    def send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send_json(200, {"object": "list", "data": [{"id": "offline", "object": "model"}]})

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            failure = offline_failure(request, self.server.failures)
            if failure == "connection":         # hang up without an answer
                self.close_connection = True
                return
            if failure is not None:
                self.send_json(*failure)
                return
            reply = offline_reply(request.get("messages", []), self.server.counter)
            self.send_json(200, completion_body(reply, request.get("model", "offline")))
        except Exception as exc:
            self.send_json(500, {"error": {"message": f"offline model failed: {exc}"}})


#: teaching
def start_offline_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfflineHandler)
    server.daemon_threads, server.counter, server.failures = True, [0], {}   # see offline_failure()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server


#: hardened
def start_offline_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfflineHandler)
    server.daemon_threads = True
    server.counter = [0]
    server.failures = {}                    # how often each 'fail' request has failed
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server
