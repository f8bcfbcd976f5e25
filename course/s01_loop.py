# s01_loop: what this stage adds, changes and removes. course/build.py writes the stage files.

#: docstring | teaching
"""s01 · The agent loop — a model, one terminal tool, and a loop that knows when to stop.

Send the conversation to a chat model, run the tool calls it asks for, send back one result
per call (even on Ctrl-C); repeat until it answers without one. POSIX (process groups).
Reading guide: "[s01] The agent loop" is the lesson; the REPL and offline model are plumbing.
Run: python agents/s01_loop.py [--demo | -p '$ uname -a'] · chapter: docs/en/s01-loop.md
"""

#: docstring | hardened
"""s01 · The agent loop — a model, one terminal tool, and a loop that knows when to stop.

What this stage adds
    The smallest working agent: send the conversation to a chat model, run every tool
    call it asks for, send the results back, and repeat until the model answers
    without asking for a tool. Every tool call gets exactly one tool result, so the
    message list is always valid, even after an error or Ctrl-C. A limit on model calls
    (--max-iterations, default 30) ends a turn that never stops.

    user ──▶ messages ──▶ model ──▶ tool calls? ──no──▶ answer
                ▲                       │ yes
                │                       ▼
                └──── tool results ◀── terminal (timeout, truncation)
                      (one per call)

Reading guide
    Start right below the imports: "[s01] Settings" holds the defaults and limits, then
    "[s01] The agent loop" is the lesson: run_conversation() is the whole idea, then
    run_tool_calls() and execute_tool_call(). Next "[s01] The terminal tool"
    (run_terminal()) and "[s01] Talking to an endpoint" (make_client()). The "details"
    sections after them are the hardening (odd server answers, process groups, bounded
    output): read them once the core is clear. Last come "[s01] Command line and REPL"
    and the offline model: plumbing, not the lesson.
Run
    python agents/s01_loop.py                 # REPL (offline model without a key)
    python agents/s01_loop.py --demo          # the walk-through
    python agents/s01_loop.py -p '$ uname -a' # one question, then exit
Chapter
    docs/en/s01-loop.md
"""

#: imports
import argparse
import codecs
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import openai
from rich.console import Console
from rich.text import Text

#: section Settings

STAGE = "s01"
STAGE_TITLE = "the agent loop with one terminal tool"
DEFAULT_MODEL = "gpt-4o-mini"
MODEL_ENV_VAR = "OPENAI_MODEL"          # the one documented model variable
MAX_ITERATIONS = 30                     # model calls per turn before we give up
TERMINAL_TIMEOUT = 60                   # seconds, default for one command
MAX_TERMINAL_TIMEOUT = 600              # the model may not ask for more than this
MAX_OUTPUT_CHARS = 12_000               # longer output keeps its head and tail
API_TIMEOUT = 120                       # seconds to wait for one model response
TOOL_CHOICE_VAR = "HERMES_TOOL_CHOICE"  # "omit": send no tool_choice (see tool_fields())
#: hardened
DRAIN_AFTER_KILL = 2                    # seconds to collect output after a kill
MAX_SHOWN_ARGUMENT_CHARS = 300          # the REPL shows this much of a call's arguments
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
#: teaching
MAX_SHOWN_ARGUMENT_CHARS = 300          # of a call's arguments the REPL shows (a 2 MB write_file)
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: section The agent loop


#: teaching
def run_conversation(client, model: str, messages: list,
                     max_iterations: int = MAX_ITERATIONS, on_event=None) -> str:
    """The agent loop: it ends on a message without tool calls (finish_reason can lie)."""
    on_event = on_event or (lambda kind, data: None)
    for _ in range(max_iterations):
        response = client.chat.completions.create(
            model=model, messages=messages, **tool_fields(TOOL_SCHEMAS))
        message = first_message(response)
        messages.append(assistant_message_to_dict(message))
        if not message.tool_calls:
            return messages[-1]["content"]      # the stored text: safe to print
        run_tool_calls(message.tool_calls, messages, on_event)
    return (f"[stopped: this turn reached its limit of {max_iterations} model call(s) "
            f"(--max-iterations). Ask again to continue.]")


#: hardened
def run_conversation(client, model: str, messages: list,
                     max_iterations: int = MAX_ITERATIONS, on_event=None) -> str:
    """The agent loop. Returns the final answer text.

    The loop ends when the assistant message has no tool calls: we trust the
    message itself, not finish_reason, which some servers report wrongly.
    """
    on_event = on_event or (lambda kind, data: None)
    for _ in range(max_iterations):
        response = client.chat.completions.create(
            model=model, messages=messages, **tool_fields(TOOL_SCHEMAS))
        message = first_message(response)
        messages.append(assistant_message_to_dict(message))
        if not message.tool_calls:
            return messages[-1]["content"]      # the stored text: safe to print
        run_tool_calls(message.tool_calls, messages, on_event)
    return (f"[stopped: this turn reached its limit of {max_iterations} model call(s) "
            f"(--max-iterations). Ask again to continue.]")


#: teaching
def run_tool_calls(tool_calls: list, messages: list, on_event) -> None:
    """Run the calls in order, one tool message each; on Ctrl-C the open calls get one too."""
    try:
        for call_id, name, arguments in map(call_parts, tool_calls):
            on_event("tool_call", {"name": name, "arguments": arguments})
            result = safe_text(execute_tool_call(name, arguments))
            messages.append(tool_message(call_id, result))
            on_event("tool_result", {"name": name, "result": result})
    except KeyboardInterrupt:
        answer_open_tool_calls(messages, "interrupted by the user")
        raise


#: hardened
def run_tool_calls(tool_calls: list, messages: list, on_event) -> None:
    """Run the calls in order; each one gets exactly one tool message.

    If Ctrl-C arrives, the interrupted call and every call after it still get a
    result ("interrupted"), so the conversation stays valid; then we re-raise.
    """
    try:
        for call_id, name, arguments in map(call_parts, tool_calls):
            on_event("tool_call", {"name": name, "arguments": arguments})
            result = safe_text(execute_tool_call(name, arguments))
            messages.append(tool_message(call_id, result))
            on_event("tool_result", {"name": name, "result": result})
    except KeyboardInterrupt:
        answer_open_tool_calls(messages, "interrupted by the user")
        raise


#: teaching
def execute_tool_call(name: str, arguments: str) -> str:
    """Run one tool call and always return a string result, even on failure."""
    if name not in TOOL_HANDLERS:
        return json.dumps({"error": f"unknown tool '{name}'"})
    try:
        return TOOL_HANDLERS[name](**json.loads(arguments or "{}"))
    except Exception as exc:    # bad JSON, wrong arguments, a broken tool: the loop goes on
        return json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})


#: hardened
def execute_tool_call(name: str, arguments: str) -> str:
    """Run one tool call and always return a string result, even on failure."""
    handler = TOOL_HANDLERS.get(name)
    if handler is None:
        return json.dumps({"error": f"unknown tool '{name}'"})
    try:
        args = json.loads(arguments or "{}")
    except (ValueError, RecursionError) as exc:     # bad, huge or absurdly nested JSON
        return json.dumps({"error": f"arguments are not valid JSON: {first_line(exc)}"})
    if not isinstance(args, dict):
        return json.dumps({"error": "arguments must be a JSON object"})
    try:
        return handler(**args)
    except Exception as exc:                    # a broken tool must not break the loop
        return json.dumps({"error": f"{name} failed: {type(exc).__name__}: {exc}"})


def assistant_message_to_dict(message) -> dict:
    """Turn the SDK's message object into the plain dict we send back next time."""
    entry = {"role": "assistant", "content": safe_text(message.content or "")}
    if message.tool_calls:
        entry["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in map(call_parts, message.tool_calls)
        ]
    return entry


def tool_message(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}

#: section The terminal tool

#: teaching
TERMINAL_SCHEMA = {"type": "function", "function": {
    "name": "terminal", "description": "Run a shell command in the working directory and "
                                       "return its combined stdout/stderr and exit code.",
    "parameters": {"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string", "description": "The shell command to run."},
        "timeout": {"type": "integer", "description": f"Seconds before the command is killed "
                    f"(default {TERMINAL_TIMEOUT}, max {MAX_TERMINAL_TIMEOUT})."}}}}}


#: hardened
TERMINAL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command in the working directory and return its "
                       "combined stdout/stderr and exit code.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command to run."},
                "timeout": {"type": "integer",
                            "description": f"Seconds before the command is killed "
                                           f"(default {TERMINAL_TIMEOUT}, "
                                           f"max {MAX_TERMINAL_TIMEOUT})."},
            },
            "required": ["command"],
        },
    },
}


#: teaching
def run_terminal(command: str, timeout: int | None = None) -> str:
    """Run one shell command; return JSON {"output": ..., "exit_code": ...}."""
    timeout = TERMINAL_TIMEOUT if timeout is None else timeout
    if not (command.strip() and type(timeout) is int and 1 <= timeout <= MAX_TERMINAL_TIMEOUT):
        return json.dumps({"error": f"need a command and a timeout of 1-{MAX_TERMINAL_TIMEOUT} s"})
    with start_command(command) as proc:
        try:
            raw, code, note = proc.communicate(timeout=timeout)[0], proc.returncode, ""
        except subprocess.TimeoutExpired as timed_out:
            os.killpg(proc.pid, signal.SIGKILL)     # the whole group: what it started, too
            raw, code = timed_out.output or b"", 124        # 124: GNU timeout's exit code
            note = f"\n[command timed out after {timeout}s; its process group was killed]"
        except BaseException:                   # Ctrl-C: never leave the command running
            with contextlib.suppress(ProcessLookupError):   # unless it has just ended
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    output, half = raw.decode("utf-8", errors="replace"), MAX_OUTPUT_CHARS // 2  # not UTF-8: �
    if (cut := len(output) - MAX_OUTPUT_CHARS) > 0:     # keep the head, and the tail (errors)
        output = f"{output[:half]}\n... [{cut} characters truncated] ...\n{output[half + cut:]}"
    return json.dumps({"output": output + note, "exit_code": code}, ensure_ascii=False)


#: hardened
def run_terminal(command: str, timeout: int | None = None) -> str:
    """Run one shell command; return JSON {"output": ..., "exit_code": ...}."""
    if not isinstance(command, str) or not command.strip():
        return json.dumps({"error": "command must be a non-empty string"})
    if timeout is None:
        timeout = TERMINAL_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int) \
            or not 1 <= timeout <= MAX_TERMINAL_TIMEOUT:
        return json.dumps({"error": f"timeout must be an integer from 1 to {MAX_TERMINAL_TIMEOUT}"})
    try:
        cwd = os.getcwd()
    except OSError as exc:                      # the folder was deleted while we ran
        return json.dumps({"error": f"cannot run commands: the working directory is gone or "
                                    f"unreadable ({exc.strerror}). Start the agent again "
                                    f"in an existing folder."})
    output, stop = BoundedOutput(), threading.Event()
    command_start = CommandStart(command, cwd)
    try:
        proc = command_start.started()
        reader = threading.Thread(target=copy_output, args=(proc.stdout, output, stop),
                                  daemon=True)
        reader.start()
        finished = wait_for_command(proc, reader, timeout)
    except BaseException:                       # Ctrl-C: never leave the command running
        command_start.kill()
        raise
    if finished:
        return json.dumps({"output": output.text(), "exit_code": proc.returncode},
                          ensure_ascii=False)
    kill_process_group(proc)
    proc.wait()
    reader.join(DRAIN_AFTER_KILL)               # the last output of the killed processes
    note = f"\n[command timed out after {timeout}s; its process group was killed]"
    if reader.is_alive():                       # `setsid` took a process out of the group
        stop.set()
        note += "\n[a process outside the group still holds the output; shown so far]"
    return json.dumps({"output": output.text() + note, "exit_code": 124},  # GNU timeout's code
                      ensure_ascii=False)


#: teaching
def start_command(command: str) -> subprocess.Popen:
    """In a session (process group) of its own: a timeout or Ctrl-C kills its children too."""
    return subprocess.Popen(command, shell=True, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


TOOL_SCHEMAS = [TERMINAL_SCHEMA]
TOOL_HANDLERS = {"terminal": run_terminal}

#: section Talking to an endpoint


def make_client(base_url: str | None, api_key: str | None):
    """The real OpenAI client, without retries (s06's lesson); local servers need no key."""
    return openai.OpenAI(api_key=api_key or "no-key-set", base_url=base_url,
                         max_retries=0, timeout=API_TIMEOUT)


#: teaching
def tool_fields(tools: list) -> dict:
    """Tools with tool_choice "auto" said (llama-cpp-python needs it), unless told to omit it."""
    choice = {} if os.environ.get(TOOL_CHOICE_VAR) == "omit" else {"tool_choice": "auto"}
    return {"tools": tools, **choice} if tools else {}


#: hardened
def tool_fields(tools: list) -> dict:
    """The tools of a request, and tool_choice "auto" said out loud: OpenAI assumes it,
    but llama-cpp-python's server leaves the tools out of the prompt without it. For a
    server that refuses the field (vLLM without --enable-auto-tool-choice): omit."""
    if not tools:
        return {}
    if os.environ.get(TOOL_CHOICE_VAR) == "omit":
        return {"tools": tools}
    return {"tools": tools, "tool_choice": "auto"}


TOOL_CHOICE_REFUSED = re.compile(r"tool[ _]choice", re.IGNORECASE)    # in a 400's words
TOOL_CHOICE_FIX = (f"start vLLM with --enable-auto-tool-choice --tool-call-parser <parser>, "
                   f"or set {TOOL_CHOICE_VAR}=omit to send no tool_choice")


def refuses_tool_choice(exc: Exception) -> bool:
    return getattr(exc, "status_code", None) == 400 and bool(TOOL_CHOICE_REFUSED.search(str(exc)))


#: teaching
def describe_api_error(exc: Exception, base_url: str, model: str) -> str:
    """One clear line for each way an endpoint can fail; never a traceback."""
    status = getattr(exc, "status_code", None)
    if isinstance(exc, openai.APIConnectionError):      # a timeout is one, too
        return f"Cannot reach the endpoint {base_url}. Check OPENAI_BASE_URL and your network."
    if status == 401:
        return (f"The endpoint {base_url} rejected OPENAI_API_KEY (401). Check the key."
                if os.environ.get("OPENAI_API_KEY") else
                f"The endpoint {base_url} needs a key (401): set OPENAI_API_KEY.")
    if status == 404:
        return (f"Model '{model}' or its API was not found at {base_url} (404). "
                f"Check --model / {MODEL_ENV_VAR} and OPENAI_BASE_URL.")
    if status == 429:
        return f"Rate limited by {base_url} (429). Wait a moment, or check your quota."
    if status in (500, 502, 503, 504):      # not 501: a static web server's answer to a POST
        return f"The endpoint {base_url} had a server error ({status}). Try again later."
    if refuses_tool_choice(exc):
        return f'The endpoint {base_url} refuses tool_choice "auto" (400): {TOOL_CHOICE_FIX}.'
    if status is not None:
        return f"The endpoint {base_url} answered HTTP {status}: {first_line(exc.message)}"
    return f"Model call failed: {type(exc).__name__}: {first_line(exc)}"


#: hardened
def describe_api_error(exc: Exception, base_url: str, model: str) -> str:
    """One clear line for each way an endpoint can fail; never a traceback."""
    reason = not_an_api_reason(exc)
    if reason:                              # checked first: a 501 is no server error to retry
        return f"{base_url} is not an OpenAI-compatible API ({reason}): check OPENAI_BASE_URL."
    if isinstance(exc, openai.APITimeoutError):
        return (f"The endpoint {base_url} did not answer in time. Try again, or check "
                f"OPENAI_BASE_URL.")
    if isinstance(exc, openai.APIConnectionError):
        return f"Cannot reach the endpoint {base_url}. Check OPENAI_BASE_URL and your network."
    if isinstance(exc, openai.AuthenticationError):
        if not os.environ.get("OPENAI_API_KEY"):
            return f"The endpoint {base_url} needs a key (401): set OPENAI_API_KEY."
        return f"The endpoint {base_url} rejected OPENAI_API_KEY (401). Check the key."
    if isinstance(exc, openai.RateLimitError):
        return f"Rate limited by {base_url} (429). Wait a moment, or check your quota."
    if isinstance(exc, openai.NotFoundError):
        return (f"Model '{model}' or its API was not found at {base_url} (404). "
                f"Check --model / {MODEL_ENV_VAR} and OPENAI_BASE_URL.")
    if isinstance(exc, openai.APIStatusError) and exc.status_code >= 500:
        return f"The endpoint {base_url} had a server error ({exc.status_code}). Try again later."
    if refuses_tool_choice(exc):
        return f'The endpoint {base_url} refuses tool_choice "auto" (400): {TOOL_CHOICE_FIX}.'
    if isinstance(exc, openai.APIStatusError):
        return f"The endpoint {base_url} answered HTTP {exc.status_code}: {first_line(exc.message)}"
    return f"Model call failed: {type(exc).__name__}: {first_line(exc)}"


#: hardened
def not_an_api_reason(exc: Exception) -> str | None:
    """Why the URL cannot be an OpenAI-compatible API at all, or None if it may be one."""
    if isinstance(exc, NotAnAPIError):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):   # the SDK could not parse a "JSON" body
        return "its answer is not valid JSON"
    if isinstance(exc, openai.APIStatusError) and exc.status_code in (405, 501):
        return f"HTTP {exc.status_code}: it does not accept POST requests"  # a static web server
    return None


def first_line(text: str, limit: int = 200) -> str:
    line = (str(text).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit] + "…"

#: section Loop details


#: hardened
class NotAnAPIError(openai.OpenAIError):
    """The URL answered, but not the way an OpenAI-compatible API does (a web page, say)."""

#: teaching
def first_message(response):
    """The assistant message of a chat completion, or a clear error (a wrong base URL)."""
    with contextlib.suppress(AttributeError, IndexError, TypeError):  # a web page: no .choices
        if isinstance((message := response.choices[0].message).content, (str, type(None))):
            return message
    raise openai.OpenAIError("the answer is not a chat completion; check OPENAI_BASE_URL, --model")


#: hardened
def first_message(response):
    """The assistant message of a chat completion, or a clear error for anything else
    (an HTML page from a wrong base URL, an empty `choices`, an error body with 200)."""
    if isinstance(response, str):               # the SDK returns a body that is not JSON as text
        raise NotAnAPIError("it answered with text or a web page, not JSON")
    try:
        message = response.choices[0].message
        if isinstance(message.content, (str, type(None))) and \
                isinstance(message.tool_calls, (list, type(None))):
            return message
    except (AttributeError, IndexError, TypeError):
        pass
    raise openai.OpenAIError("the endpoint's answer is not a chat completion; "
                             "check OPENAI_BASE_URL and --model")


def safe_text(text: str) -> str:
    """Text that can be printed, stored and sent: lone surrogates become "?"."""
    return text.encode("utf-8", "replace").decode("utf-8")


#: teaching
def call_parts(call) -> tuple[str, str, str]:
    """(id, name, arguments) as safe text: a server may send null, or a lone surrogate."""
    function = getattr(call, "function", None)      # a "custom" call has none: no such tool
    parts = call.id, getattr(function, "name", ""), getattr(function, "arguments", "")
    return tuple(safe_text(str(part or "")) for part in parts)


#: hardened
def call_parts(call) -> tuple[str, str, str]:
    """(id, name, arguments text) of a tool call. Odd calls from a server (a 'custom'
    call without `function`, a name that is not text) get a name no tool has."""
    function = getattr(call, "function", None)
    name = getattr(function, "name", None)
    arguments = getattr(function, "arguments", None)
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments)
    return safe_text(str(getattr(call, "id", ""))), safe_text(str(name or "")), safe_text(arguments)


#: teaching
def answer_open_tool_calls(messages: list, reason: str) -> None:
    """Answer each call of the last assistant message that has no result yet: `reason`."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    calls = messages[start - 1].get("tool_calls") if start > 0 else None
    for call in (calls if isinstance(calls, list) else [])[len(messages) - start:]:
        call_id = call.get("id") if isinstance(call, dict) else None  # a hand-edited session
        messages.append(tool_message(safe_text(str(call_id or "")), json.dumps({"error": reason})))


#: hardened
def answer_open_tool_calls(messages: list, reason: str) -> None:
    """Give each call of the last assistant message that has no result yet a result
    saying why (Ctrl-C, a crash), so the conversation is valid again."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    calls = messages[start - 1].get("tool_calls") if start > 0 else None
    if not isinstance(calls, list):             # also a hand-edited session
        return
    for call in calls[len(messages) - start:]:
        call_id = call.get("id") if isinstance(call, dict) else None
        messages.append(tool_message(safe_text(str(call_id or "")), json.dumps({"error": reason})))

#: section Terminal details


#: hardened
class BoundedOutput:
    """A command's output in bounded memory: the first and the last part, and a count
    of everything in between. `yes` can print a gigabyte before any timeout."""

    def __init__(self, limit: int = MAX_OUTPUT_CHARS):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = ""
        self.tail = ""
        self.total = 0

    def add(self, chunk: str) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail = (self.tail + chunk)[-self.tail_limit:]

    def text(self) -> str:
        """Everything, or head and tail with a marker: errors tend to be at the end."""
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return self.head + self.tail
        return f"{self.head}\n... [{cut} characters truncated] ...\n{self.tail}"


#: hardened
class CommandStart:
    """A shell command that a helper thread starts, and the Popen it got.

    Python runs signal handlers in the main thread, between any two steps. Had the main
    thread called Popen, Ctrl-C or SIGTERM could strike after the command started but
    before we held its Popen: the command would run on and nobody could kill it. Signals
    never interrupt the helper thread, so the Popen is always recorded here for kill().
    """

    def __init__(self, command: str, cwd: str):
        self.proc: subprocess.Popen | None = None
        self.error: Exception | None = None
        self.go, self.done = threading.Event(), threading.Event()
        # The thread waits for `go`: if we are interrupted before that, nothing starts.
        threading.Thread(target=self.start, args=(command, cwd), daemon=True).start()

    def start(self, command: str, cwd: str) -> None:
        self.go.wait()
        try:
            # A new session makes the command the leader of its own process group, so
            # a timeout or Ctrl-C can kill the grandchildren too, not just the shell.
            self.proc = subprocess.Popen(
                command, shell=True, cwd=cwd, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except Exception as exc:                # e.g. a command longer than the system allows
            self.error = exc
        finally:
            self.done.set()

    def started(self) -> subprocess.Popen:
        self.go.set()
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.proc

    def kill(self) -> None:
        """Kill the command and its process group, if it was allowed to start."""
        if self.go.is_set():
            self.done.wait()
            if self.proc is not None:
                kill_process_group(self.proc)
                self.proc.wait()


#: hardened
def wait_for_command(proc: subprocess.Popen, reader: threading.Thread, timeout: int) -> bool:
    """True if the command exited and closed its output within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    reader.join(timeout)                        # a background child may keep the pipe open
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return False
    return not reader.is_alive()


#: hardened
def copy_output(stream, output: BoundedOutput, stop: threading.Event) -> None:
    """Read a command's output as it arrives, until every process has closed the pipe
    or `stop` is set. Bytes are decoded as UTF-8; anything else becomes �."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with stream:                                # closing it stops a leftover writer (SIGPIPE)
        for chunk in iter(lambda: stream.read1(65536), b""):
            if stop.is_set():
                return
            output.add(decoder.decode(chunk))
        output.add(decoder.decode(b"", final=True))


#: hardened
def kill_process_group(proc: subprocess.Popen) -> None:
    """Kill the command and everything it started (its whole process group)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:                                   # Windows: no process groups here
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass                                    # already gone

#: section Command line and REPL | plumbing

#: teaching
HELP_TEXT = """Commands:
  /help          this help
  /quit          leave (or Ctrl-D); Ctrl-C cancels the current turn
  $ <command>    the offline model runs it with the terminal tool"""


#: hardened
HELP_TEXT = """Commands:
  /help          this help
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL.
The offline model understands:
  $ <command>    run a shell command with the terminal tool"""


#: teaching
class Session:
    def __init__(self, client, model: str, base_url: str, max_iterations: int):
        self.client, self.model, self.base_url = client, model, base_url
        self.max_iterations, self.messages = max_iterations, []


#: hardened
class Session:
    """Everything one running agent needs: the client, the model, the messages."""

    def __init__(self, client, model: str, base_url: str, max_iterations: int):
        self.client = client
        self.model = model
        self.base_url = base_url
        self.max_iterations = max_iterations
        self.messages: list = []


#: teaching
def show_event(kind: str, data: dict) -> None:
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}", "cyan"))
    elif kind == "tool_result":
        console.print(Text(indent_result(data["result"]), style="dim"))


#: hardened
def show_event(kind: str, data: dict) -> None:
    """Print tool calls and results compactly."""
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}",
                           style="cyan"))
    elif kind == "tool_result":
        console.print(Text(indent_result(data["result"]), style="dim"))


#: teaching
def indent_result(result: str, max_lines: int = 12) -> str:
    try:
        data = dict(json.loads(result))
    except (ValueError, TypeError):         # not JSON, or JSON that is not an object
        data = {"output": result}
    header = f"  ← exit {data['exit_code']}" if "exit_code" in data else "  ←"
    lines = str(data.get("output", data.get("error", result))).rstrip("\n").splitlines() or [""]
    more = [f"… ({len(lines) - max_lines} more lines)"] if len(lines) > max_lines else []
    return "\n".join([header] + [f"    {line}" for line in lines[:max_lines] + more])


#: hardened
def indent_result(result: str, max_lines: int = 12) -> str:
    """A tool result as a short indented block: a status line, then the output."""
    try:
        data = json.loads(result)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        data = {"output": result}
    header = f"  ← exit {data['exit_code']}" if "exit_code" in data else "  ←"
    lines = str(data.get("output", data.get("error", result))).rstrip("\n").splitlines() or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"… ({len(lines) - max_lines} more lines)"]
    return "\n".join([header] + [f"    {line}" for line in lines])


#: teaching
def shown_arguments(arguments: str, limit: int = MAX_SHOWN_ARGUMENT_CHARS) -> str:
    more = len(arguments) - limit
    return arguments if more <= 0 else f"{arguments[:limit]}… ({more} more characters)"


#: hardened
def shown_arguments(arguments: str, limit: int = MAX_SHOWN_ARGUMENT_CHARS) -> str:
    """A call's arguments as the REPL shows them: a 2 MB write_file must not fill the screen."""
    if len(arguments) <= limit:
        return arguments
    return f"{arguments[:limit]}… ({len(arguments) - limit} more characters)"


def run_turn(session: Session, user_text: str) -> bool:
    session.messages.append({"role": "user", "content": undecodable_to_replacement(user_text)})
    try:
        answer = run_conversation(session.client, session.model, session.messages,
                                  session.max_iterations, show_event)
    except (openai.OpenAIError, json.JSONDecodeError) as exc:   # JSONDecodeError: not an API
        err_console.print(Text("error: " + describe_api_error(exc, session.base_url, session.model),
                               style="red"))
        return False
    console.print(Text(answer))
    return True


#: hardened
def show_help(session: Session, argument: str) -> None:
    console.print(Text(HELP_TEXT))


#: teaching
COMMANDS = {"/help": lambda session, argument: console.print(Text(HELP_TEXT))}  # stages add more


#: hardened
COMMANDS = {"/help": show_help}         # later stages add their own slash commands


#: teaching
def handle_command(session: Session, line: str) -> bool:
    name, _, argument = line.strip().partition(" ")
    if name not in COMMANDS:
        console.print(Text(f"unknown command {name}; /help lists the commands", style="yellow"))
        return False
    COMMANDS[name](session, argument.strip())
    return True


#: hardened
def handle_command(session: Session, line: str) -> bool:
    """Run one slash command; False if there is no such command."""
    name, _, argument = line.strip().partition(" ")
    command = COMMANDS.get(name)
    if command is None:
        console.print(Text(f"unknown command {name}; /help lists the commands", style="yellow"))
        return False
    command(session, argument.strip())
    return True


#: teaching
def undecodable_to_replacement(line: str) -> str:
    """Python keeps input bytes that are not UTF-8 as lone surrogates; show them as �."""
    return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


#: hardened
def undecodable_to_replacement(line: str) -> str:
    """Python keeps input bytes that are not UTF-8 as lone surrogates; show them as �."""
    try:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:              # a surrogate that did not come from a byte
        return safe_text(line)


#: teaching
def read_line(prompt: str, interactive: bool) -> str | None:
    """Read one line; None at EOF. A pipe is read line by line, without a prompt."""
    if interactive:
        try:
            return undecodable_to_replacement(input(prompt))
        except EOFError:                    # Ctrl-D: end the prompt line before leaving
            console.print()
            return None
    if not (line := sys.stdin.readline() if sys.stdin else ""):
        return None
    line = undecodable_to_replacement(line.rstrip("\n"))
    console.print(Text(prompt + line, style="bold"))
    return line


#: hardened
def read_line(prompt: str, interactive: bool) -> str | None:
    """Read one line; None at EOF. A pipe is read line by line, without a prompt."""
    if interactive:
        try:
            return undecodable_to_replacement(input(prompt))
        except EOFError:                    # Ctrl-D: end the prompt line before leaving
            console.print()
            return None
    line = sys.stdin.readline() if sys.stdin else ""
    if not line:
        return None
    line = undecodable_to_replacement(line.rstrip("\n"))
    console.print(Text(prompt + line, style="bold"))
    return line


#: teaching
def repl(session: Session) -> int:
    interactive = bool(sys.stdin) and sys.stdin.isatty()
    if session.model != "offline":          # the offline model announces itself already
        err_console.print(Text(f"[model {session.model} at {session.base_url}; /help for "
                               f"commands]", style="yellow"))
    while True:
        try:                                # Ctrl-C at the prompt clears the line
            line = CtrlC.allow(read_line, f"{STAGE}> ", interactive)
        except KeyboardInterrupt:
            console.print("\n(Ctrl-C: nothing to cancel; /quit or Ctrl-D to leave)")
            continue
        if line is None or line.strip() == "/quit":
            return 0
        if line.strip().startswith("/"):
            handle_command(session, line)
        elif line.strip():
            try:
                CtrlC.allow(run_turn, session, line)
            except KeyboardInterrupt:       # the turn's open tool calls still get a result
                answer_open_tool_calls(session.messages, "interrupted by the user")
                console.print(Text("\n[turn cancelled]", style="yellow"))


#: hardened
def repl(session: Session) -> int:
    interactive = bool(sys.stdin) and sys.stdin.isatty()
    if session.model != "offline":          # the offline model announces itself already
        err_console.print(Text(f"[model {session.model} at {session.base_url}; /help for "
                               f"commands]", style="yellow"))
    if interactive:
        try:
            import readline  # noqa: F401  (line editing where available)
        except ImportError:
            pass
    while True:
        try:
            if interactive:                 # Ctrl-C at the prompt clears the line
                line = CtrlC.allow(read_line, f"{STAGE}> ", True)
            else:                           # a late Ctrl-C must not throw away a piped line
                line = read_line(f"{STAGE}> ", False)
        except KeyboardInterrupt:
            console.print("\n(Ctrl-C: nothing to cancel; /quit or Ctrl-D to leave)")
            continue
        if line is None or line.strip() == "/quit":
            return 0
        if not line.strip():
            continue
        if line.strip().startswith("/"):
            handle_command(session, line)
            continue
        try:
            CtrlC.allow(run_turn, session, line)
        except KeyboardInterrupt:
            answer_open_tool_calls(session.messages, "interrupted by the user")
            console.print(Text("\n[turn cancelled]", style="yellow"))


#: teaching
DEMO_INPUTS = ["$ echo hello from the terminal tool", "$ echo limited"]


#: hardened
DEMO_INPUTS = [
    "$ echo hello from the terminal tool",
    "$ printf 'one\\ntwo\\nthree\\n' | wc -l",
    "What can you do?",
]


#: teaching
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    for text in DEMO_INPUTS:
        console.print(Text(f"\n{STAGE}> {text}", style="bold"))
        if not run_turn(session, text):
            return 1
        session.max_iterations = 1          # the next turn meets --max-iterations 1
    return 0


#: hardened
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    for text in DEMO_INPUTS:
        console.print(Text(f"\n{STAGE}> {text}", style="bold"))
        if not run_turn(session, text):
            return 1
    console.print(Text("\nThe same request with --max-iterations 1: the loop stops after "
                       "one model call, and every tool call still has its result.", style="bold"))
    session.max_iterations = 1
    console.print(Text(f"{STAGE}> $ echo limited", style="bold"))
    run_turn(session, "$ echo limited")
    roles = [m["role"] for m in session.messages]
    console.print(Text(f"\nThe conversation now holds {len(roles)} messages: "
                       + " ".join(roles), style="dim"))
    return 0


#: teaching
def positive_int(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return int(text)


#: hardened
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


#: teaching
def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=STAGE, description=f"{STAGE}: {STAGE_TITLE}.")
    parser.add_argument("-p", "--prompt", help="ask one question, print the answer, exit")
    parser.add_argument("--demo", action="store_true", help="scripted walk-through (offline)")
    parser.add_argument("--offline", action="store_true", help="use the built-in offline model")
    parser.add_argument("--model", help=f"default: ${MODEL_ENV_VAR} or {DEFAULT_MODEL}")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint ($OPENAI_BASE_URL)")
    parser.add_argument("--max-iterations", type=positive_int, default=MAX_ITERATIONS,
                        help=f"model calls per turn (default {MAX_ITERATIONS})")
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
    return parser.parse_args(argv)


#: teaching
def open_session(args) -> Session:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    model = args.model or os.environ.get(MODEL_ENV_VAR) or DEFAULT_MODEL
    if args.offline or args.demo or not (base_url or api_key):     # the offline model
        base_url, api_key, model = start_offline_server().url, "offline", "offline"
        hint = "" if args.demo or args.prompt is not None else " Type '$ <command>' or /help."
        err_console.print(Text(f"[offline model at {base_url}: no API key needed.{hint}]",
                               style="yellow"))
    client = make_client(base_url, api_key)
    return Session(client, model, str(client.base_url), args.max_iterations)


#: hardened
def open_session(args) -> Session:
    """Real endpoint if configured, otherwise the offline model on a loopback port."""
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    if args.offline or args.demo or not (base_url or api_key):
        server = start_offline_server()
        # How to start is a hint for the REPL: with --demo or -p nobody types anything.
        hint = "" if args.demo or args.prompt is not None else " Type '$ <command>' or /help."
        err_console.print(Text(f"[offline model at {server.url}: no API key needed.{hint}]",
                               style="yellow"))
        return Session(make_client(server.url, "offline"), "offline", server.url,
                       args.max_iterations)
    model = args.model or os.environ.get(MODEL_ENV_VAR) or DEFAULT_MODEL
    client = make_client(base_url, api_key)
    return Session(client, model, str(client.base_url), args.max_iterations)


#: teaching
class CtrlC:
    """Ctrl-C cancels once; more presses wait for the REPL, so no clean-up is cut short."""
    armed = True

    @classmethod
    def install(cls) -> None:
        cls.armed = True
        signal.signal(signal.SIGINT, cls.on_sigint)

    @classmethod
    def on_sigint(cls, signum, frame) -> None:
        if cls.armed:
            cls.armed = False
            raise KeyboardInterrupt

    @classmethod
    def allow(cls, function, *args):            # function(*args), which Ctrl-C may cancel
        cls.armed = True
        try:
            return function(*args)
        finally:
            cls.armed = False


#: hardened
class CtrlC:
    """Ctrl-C cancels what is running, once.

    The first SIGINT raises KeyboardInterrupt. Any more (a held key, an impatient
    learner) are ignored until the REPL is ready again, so the clean-up of the
    cancelled turn (killing the command, answering its tool calls) is never cut
    in half and never ends the REPL with a traceback.
    """
    armed = True

    @classmethod
    def install(cls) -> None:
        cls.armed = True
        signal.signal(signal.SIGINT, cls.on_sigint)

    @classmethod
    def on_sigint(cls, signum, frame) -> None:
        if cls.armed:
            cls.armed = False
            raise KeyboardInterrupt

    @classmethod
    def allow(cls, function, *args):
        """Run function(*args) with Ctrl-C armed; disarm it again afterwards."""
        cls.armed = True
        try:
            return function(*args)
        finally:
            cls.armed = False


#: teaching
def exit_on_signals() -> None:
    """SIGTERM or SIGHUP (a closed terminal) exits through Ctrl-C's clean-up: no orphans."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda signum, frame: sys.exit(128 + signum))


#: hardened
def exit_on_signals() -> None:
    """SIGTERM, or SIGHUP from a closed terminal, ends the agent cleanly: the exit runs
    through the same `finally` and `except BaseException` blocks as Ctrl-C does, so
    a running command's process group is killed on the way out."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), stop)


#: teaching
def run_prompt(session: Session, text: str) -> int:
    try:
        done = (handle_command if text.strip().startswith("/") else run_turn)(session, text)
    except KeyboardInterrupt:
        return 130
    return 0 if done else 1


#: hardened
def run_prompt(session: Session, text: str) -> int:
    """-p: one question or one slash command, then the exit code."""
    if text.strip().startswith("/"):
        return 0 if handle_command(session, text) else 1
    try:
        return 0 if run_turn(session, text) else 1
    except KeyboardInterrupt:
        return 130


#: teaching
def main(argv=None) -> int:
    exit_on_signals()
    CtrlC.install()
    args = parse_args(argv)
    session = open_session(args)
    if args.demo:
        return run_demo(session)
    return repl(session) if args.prompt is None else run_prompt(session, args.prompt)


#: hardened
def main(argv=None) -> int:
    exit_on_signals()
    CtrlC.install()
    args = parse_args(argv)
    session = open_session(args)
    if args.demo:
        return run_demo(session)
    if args.prompt is not None:
        return run_prompt(session, args.prompt)
    return repl(session)

#: section Offline model (not part of the lesson) | plumbing, untagged

#: teaching
# A deterministic "model" behind a real HTTP server: the openai client talks to it as usual.
OFFLINE_VERBS = "'$ <command>'"


#: hardened
# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'$ <command>'"

OFFLINE_HELP = (f"I am the offline model: try {OFFLINE_VERBS}; /help lists all I "
                "understand. For a real model, set OPENAI_API_KEY.")


def offline_plan(text: str):
    """Map learner input to (tool name, arguments), or None."""
    if text.startswith("$ "):
        return "terminal", {"command": text[2:]}
    return None


#: teaching
def offline_summary(messages: list) -> str:
    """Summarise the result of the last tool call (this model asks for one at a time)."""
    data = json.loads(messages[-1]["content"])
    if "exit_code" not in data:
        return f"The tool reported: {first_line(data.get('error', ''), 160)}"
    cut = re.search(r"\[(\d+) characters truncated\]", data["output"])
    return (f"The command exited with code {data['exit_code']}; first line of output: "
            f"{first_line(data['output'], 120) or '(no output)'}"
            + (f"\n{cut.group(1)} characters in the middle were cut." if cut else ""))


#: hardened
def offline_summary(messages: list) -> str:
    """Summarise the tool results that follow the last assistant message."""
    results = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.insert(0, message.get("content") or "")
    lines = []
    for result in results:
        try:
            data = json.loads(result)
        except json.JSONDecodeError:
            data = {"output": result}
        if "exit_code" in data:
            output = first_line(data.get("output", ""), 120) or "(no output)"
            lines.append(f"The command exited with code {data['exit_code']}; "
                         f"first line of output: {output}")
            cut = re.search(r"\[(\d+) characters truncated\]", data.get("output", ""))
            if cut:
                lines.append(f"The output was long: I received its start and end, "
                             f"{cut.group(1)} characters in the middle were cut.")
        else:
            lines.append(f"The tool reported: {first_line(data.get('error', result), 160)}")
    return "\n".join(lines) or "Done."


#: teaching
def offline_reply(messages: list, counter: list) -> dict:
    if messages[-1]["role"] == "tool":
        return {"content": offline_summary(messages)}
    plan = offline_plan(str(messages[-1].get("content") or "").strip())
    if plan is None:
        return {"content": OFFLINE_HELP}
    counter[0] += 1
    function = {"name": plan[0], "arguments": json.dumps(plan[1])}
    return {"content": "", "tool_calls": [{"id": f"call_offline_{counter[0]}",
                                           "type": "function", "function": function}]}


#: hardened
def offline_reply(messages: list, counter: list) -> dict:
    """The next assistant message, as plain data."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"content": offline_summary(messages)}
    plan = offline_plan(str(last.get("content") or "").strip())
    if plan is None:
        return {"content": OFFLINE_HELP}
    counter[0] += 1
    name, args = plan
    return {"content": "", "tool_calls": [{"id": f"call_offline_{counter[0]}", "type": "function",
                                           "function": {"name": name,
                                                        "arguments": json.dumps(args)}}]}


#: teaching
def completion_body(reply: dict, model: str) -> dict:
    finish = "tool_calls" if reply.get("tool_calls") else "stop"
    return {"id": "chatcmpl-offline", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", **reply},
                         "finish_reason": finish}]}


#: hardened
def completion_body(reply: dict, model: str) -> dict:
    message = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        message["tool_calls"] = reply["tool_calls"]
    return {"id": "chatcmpl-offline", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


#: teaching
class OfflineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):              # keep the learner's screen clean
        pass

    def do_POST(self):
        try:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = offline_reply(request["messages"], self.server.counter)
            status, body = 200, completion_body(reply, request["model"])
        except Exception as exc:               # one line for the learner, not a traceback
            status, body = 500, {"error": {"message": f"offline model failed: {exc}"}}
        self.send_response(status)              # HTTP/1.0: the body ends where the connection does
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode("utf-8"))


#: hardened
class OfflineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):              # keep the learner's screen clean
        pass

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send_json(200, {"object": "list", "data": [{"id": "offline", "object": "model"}]})

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            reply = offline_reply(request.get("messages", []), self.server.counter)
            self.send_json(200, completion_body(reply, request.get("model", "offline")))
        except Exception as exc:
            self.send_json(500, {"error": {"message": f"offline model failed: {exc}"}})


#: teaching
def start_offline_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfflineHandler)
    server.daemon_threads, server.counter = True, [0]
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()  # 0.05 s poll
    return server


#: hardened
def start_offline_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfflineHandler)
    server.daemon_threads = True
    server.counter = [0]
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server

#: wiring


if __name__ == "__main__":
    sys.exit(main())
