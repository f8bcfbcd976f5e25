# Generated from course/ by course/build.py: edit there, then rebuild.
"""s01 · The agent loop — a model, one terminal tool, and a loop that knows when to stop.

Send the conversation to a chat model, run the tool calls it asks for, send back one result
per call (even on Ctrl-C); repeat until it answers without one. POSIX (process groups).
Reading guide: "[s01] The agent loop" is the lesson; the REPL and offline model are plumbing.
Run: python agents/s01_loop.py [--demo | -p '$ uname -a'] · chapter: docs/en/s01-loop.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
from rich.console import Console
from rich.text import Text

# ── [s01] Settings ──────────────────────────────────────────────────────────

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
MAX_SHOWN_ARGUMENT_CHARS = 300          # of a call's arguments the REPL shows (a 2 MB write_file)
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# ── [s01] The agent loop ────────────────────────────────────────────────────

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

def execute_tool_call(name: str, arguments: str) -> str:
    """Run one tool call and always return a string result, even on failure."""
    if name not in TOOL_HANDLERS:
        return json.dumps({"error": f"unknown tool '{name}'"})
    try:
        return TOOL_HANDLERS[name](**json.loads(arguments or "{}"))
    except Exception as exc:    # bad JSON, wrong arguments, a broken tool: the loop goes on
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

# ── [s01] The terminal tool ─────────────────────────────────────────────────

TERMINAL_SCHEMA = {"type": "function", "function": {
    "name": "terminal", "description": "Run a shell command in the working directory and "
                                       "return its combined stdout/stderr and exit code.",
    "parameters": {"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string", "description": "The shell command to run."},
        "timeout": {"type": "integer", "description": f"Seconds before the command is killed "
                    f"(default {TERMINAL_TIMEOUT}, max {MAX_TERMINAL_TIMEOUT})."}}}}}

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

def start_command(command: str) -> subprocess.Popen:
    """In a session (process group) of its own: a timeout or Ctrl-C kills its children too."""
    return subprocess.Popen(command, shell=True, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

TOOL_SCHEMAS = [TERMINAL_SCHEMA]
TOOL_HANDLERS = {"terminal": run_terminal}

# ── [s01] Talking to an endpoint ────────────────────────────────────────────

def make_client(base_url: str | None, api_key: str | None):
    """The real OpenAI client, without retries (s06's lesson); local servers need no key."""
    return openai.OpenAI(api_key=api_key or "no-key-set", base_url=base_url,
                         max_retries=0, timeout=API_TIMEOUT)

def tool_fields(tools: list) -> dict:
    """Tools with tool_choice "auto" said (llama-cpp-python needs it), unless told to omit it."""
    choice = {} if os.environ.get(TOOL_CHOICE_VAR) == "omit" else {"tool_choice": "auto"}
    return {"tools": tools, **choice} if tools else {}

TOOL_CHOICE_REFUSED = re.compile(r"tool[ _]choice", re.IGNORECASE)    # in a 400's words
TOOL_CHOICE_FIX = (f"start vLLM with --enable-auto-tool-choice --tool-call-parser <parser>, "
                   f"or set {TOOL_CHOICE_VAR}=omit to send no tool_choice")

def refuses_tool_choice(exc: Exception) -> bool:
    return getattr(exc, "status_code", None) == 400 and bool(TOOL_CHOICE_REFUSED.search(str(exc)))

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

def first_line(text: str, limit: int = 200) -> str:
    line = (str(text).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit] + "…"

# ── [s01] Loop details ──────────────────────────────────────────────────────

def first_message(response):
    """The assistant message of a chat completion, or a clear error (a wrong base URL)."""
    with contextlib.suppress(AttributeError, IndexError, TypeError):  # a web page: no .choices
        if isinstance((message := response.choices[0].message).content, (str, type(None))):
            return message
    raise openai.OpenAIError("the answer is not a chat completion; check OPENAI_BASE_URL, --model")

def safe_text(text: str) -> str:
    """Text that can be printed, stored and sent: lone surrogates become "?"."""
    return text.encode("utf-8", "replace").decode("utf-8")

def call_parts(call) -> tuple[str, str, str]:
    """(id, name, arguments) as safe text: a server may send null, or a lone surrogate."""
    function = getattr(call, "function", None)      # a "custom" call has none: no such tool
    parts = call.id, getattr(function, "name", ""), getattr(function, "arguments", "")
    return tuple(safe_text(str(part or "")) for part in parts)

def answer_open_tool_calls(messages: list, reason: str) -> None:
    """Answer each call of the last assistant message that has no result yet: `reason`."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    calls = messages[start - 1].get("tool_calls") if start > 0 else None
    for call in (calls if isinstance(calls, list) else [])[len(messages) - start:]:
        call_id = call.get("id") if isinstance(call, dict) else None  # a hand-edited session
        messages.append(tool_message(safe_text(str(call_id or "")), json.dumps({"error": reason})))

# ── [s01] Command line and REPL ─────────────────────────────────────────────

HELP_TEXT = """Commands:
  /help          this help
  /quit          leave (or Ctrl-D); Ctrl-C cancels the current turn
  $ <command>    the offline model runs it with the terminal tool"""

class Session:
    def __init__(self, client, model: str, base_url: str, max_iterations: int):
        self.client, self.model, self.base_url = client, model, base_url
        self.max_iterations, self.messages = max_iterations, []

def show_event(kind: str, data: dict) -> None:
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}", "cyan"))
    elif kind == "tool_result":
        console.print(Text(indent_result(data["result"]), style="dim"))

def indent_result(result: str, max_lines: int = 12) -> str:
    try:
        data = dict(json.loads(result))
    except (ValueError, TypeError):         # not JSON, or JSON that is not an object
        data = {"output": result}
    header = f"  ← exit {data['exit_code']}" if "exit_code" in data else "  ←"
    lines = str(data.get("output", data.get("error", result))).rstrip("\n").splitlines() or [""]
    more = [f"… ({len(lines) - max_lines} more lines)"] if len(lines) > max_lines else []
    return "\n".join([header] + [f"    {line}" for line in lines[:max_lines] + more])

def shown_arguments(arguments: str, limit: int = MAX_SHOWN_ARGUMENT_CHARS) -> str:
    more = len(arguments) - limit
    return arguments if more <= 0 else f"{arguments[:limit]}… ({more} more characters)"

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

COMMANDS = {"/help": lambda session, argument: console.print(Text(HELP_TEXT))}  # stages add more

def handle_command(session: Session, line: str) -> bool:
    name, _, argument = line.strip().partition(" ")
    if name not in COMMANDS:
        console.print(Text(f"unknown command {name}; /help lists the commands", style="yellow"))
        return False
    COMMANDS[name](session, argument.strip())
    return True

def undecodable_to_replacement(line: str) -> str:
    """Python keeps input bytes that are not UTF-8 as lone surrogates; show them as �."""
    return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

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

DEMO_INPUTS = ["$ echo hello from the terminal tool", "$ echo limited"]

def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    for text in DEMO_INPUTS:
        console.print(Text(f"\n{STAGE}> {text}", style="bold"))
        if not run_turn(session, text):
            return 1
        session.max_iterations = 1          # the next turn meets --max-iterations 1
    return 0

def positive_int(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return int(text)

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

def exit_on_signals() -> None:
    """SIGTERM or SIGHUP (a closed terminal) exits through Ctrl-C's clean-up: no orphans."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda signum, frame: sys.exit(128 + signum))

def run_prompt(session: Session, text: str) -> int:
    try:
        done = (handle_command if text.strip().startswith("/") else run_turn)(session, text)
    except KeyboardInterrupt:
        return 130
    return 0 if done else 1

def main(argv=None) -> int:
    exit_on_signals()
    CtrlC.install()
    args = parse_args(argv)
    session = open_session(args)
    if args.demo:
        return run_demo(session)
    return repl(session) if args.prompt is None else run_prompt(session, args.prompt)

# ── Offline model (not part of the lesson) ──────────────────────────────────

# A deterministic "model" behind a real HTTP server: the openai client talks to it as usual.
OFFLINE_VERBS = "'$ <command>'"

OFFLINE_HELP = (f"I am the offline model: try {OFFLINE_VERBS}; /help lists all I "
                "understand. For a real model, set OPENAI_API_KEY.")

def offline_plan(text: str):
    """Map learner input to (tool name, arguments), or None."""
    if text.startswith("$ "):
        return "terminal", {"command": text[2:]}
    return None

def offline_summary(messages: list) -> str:
    """Summarise the result of the last tool call (this model asks for one at a time)."""
    data = json.loads(messages[-1]["content"])
    if "exit_code" not in data:
        return f"The tool reported: {first_line(data.get('error', ''), 160)}"
    cut = re.search(r"\[(\d+) characters truncated\]", data["output"])
    return (f"The command exited with code {data['exit_code']}; first line of output: "
            f"{first_line(data['output'], 120) or '(no output)'}"
            + (f"\n{cut.group(1)} characters in the middle were cut." if cut else ""))

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

def completion_body(reply: dict, model: str) -> dict:
    finish = "tool_calls" if reply.get("tool_calls") else "stop"
    return {"id": "chatcmpl-offline", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", **reply},
                         "finish_reason": finish}]}

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

def start_offline_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), OfflineHandler)
    server.daemon_threads, server.counter = True, [0]
    server.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()  # 0.05 s poll
    return server


if __name__ == "__main__":
    sys.exit(main())
