"""A loopback OpenAI-compatible server for tests.

It replays a script of assistant turns, one per request, and records every request
body, so a test can assert on exactly what the agent sent (messages, tools offered,
tool-call pairing). A turn can also be an HTTP error.

    with FakeOpenAI([reply("hi")]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)
        ...
        server.requests[0]["messages"]

Turn formats:
    {"content": str, "tool_calls": [{"id", "name", "arguments"}], "finish_reason": str}
    a tool call may also be {"raw": {...}}: sent exactly as given, malformed or not
    {"status": 429, "message": "slow down", "headers": {"Retry-After": "1"}}
    {"body": "<html>…</html>", "content_type": "text/html"}   (status 200, sent as is)
    {"drop": True}     hang up without an answer (the client sees a connection error)
    {"hang": True}     answer nothing until the server stops (the client's timeout fires)

Requests that arrive from several threads at once (s10's sub-agents) come in no fixed
order; `responder` then answers each one by what it contains instead of the script:

    FakeOpenAI(responder=lambda request: reply("hi"))   # request: the JSON body

Three modes behave like local model servers (issue 24), each off by default:

    FakeOpenAI(turns, tools_need_choice=True)   # llama-cpp-python: without tool_choice the
                                                # model never sees the tools (calls dropped)
    FakeOpenAI(turns, refuses_auto=True)        # vLLM without --enable-auto-tool-choice:
                                                # "auto" is an HTTP 400
    FakeOpenAI(turns, window=2000)              # a small context window: past it, a 400
                                                # context_length_exceeded (request_tokens())

Run it standalone to serve a JSON script:  python tests/fake_openai.py script.json 8765
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply(content: str = "", *calls: dict, finish_reason: str | None = None) -> dict:
    """A scripted assistant turn: text and optional tool calls."""
    turn = {"content": content, "tool_calls": list(calls)}
    if finish_reason:
        turn["finish_reason"] = finish_reason
    return turn


def call(name: str, arguments, call_id: str | None = None) -> dict:
    """A scripted tool call. `arguments` may be a dict or a raw (possibly broken) string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": call_id, "name": name, "arguments": arguments}


def raw_call(payload: dict) -> dict:
    """A tool call sent exactly as given, even if it is malformed."""
    return {"raw": payload}


def raw_body(body: str, content_type: str = "application/json") -> dict:
    """An HTTP 200 answer with exactly this body, e.g. one that is not a chat completion."""
    return {"body": body, "content_type": content_type}


def http_error(status: int, message: str = "scripted error", headers: dict | None = None,
               code: str | None = None) -> dict:
    """An HTTP error; `code` goes into the error body, as OpenAI's "insufficient_quota"."""
    return {"status": status, "message": message, "headers": headers or {}, "code": code}


def dropped_connection() -> dict:
    """The server closes the connection without answering."""
    return {"drop": True}


def no_answer() -> dict:
    """The server keeps the request open and never answers (until it stops)."""
    return {"hang": True}


VLLM_AUTO_REFUSAL = ('"auto" tool choice requires --enable-auto-tool-choice and '
                     '--tool-call-parser to be set')
CHARS_PER_TOKEN = 4


def request_tokens(body: dict) -> int:
    """The fake server's token count of a request: every character of its JSON body
    (system prompt, messages, tool calls, tool schemas) over CHARS_PER_TOKEN."""
    return -(-len(json.dumps(body, ensure_ascii=False)) // CHARS_PER_TOKEN)


def server_quirk(fake: "FakeOpenAI", body: dict) -> dict | None:
    """The answer a local server's quirk gives instead of the script, if any."""
    if fake.refuses_auto and body.get("tool_choice") == "auto":
        return {"raw_error": (400, {"object": "error", "message": VLLM_AUTO_REFUSAL,
                                    "type": "BadRequestError", "param": None, "code": 400})}
    tokens = request_tokens(body)
    if fake.window is not None and tokens > fake.window:
        return http_error(400, f"This model's maximum context length is {fake.window} tokens. "
                               f"However, your messages resulted in {tokens} tokens.",
                          code="context_length_exceeded")
    return None


def without_tools(turn: dict) -> dict:
    """What a server answers when it rendered the prompt without the tools: text only."""
    if "status" in turn or not turn.get("tool_calls"):
        return turn
    return {"content": turn.get("content") or "I have no tools to run that.", "tool_calls": []}


def completion(turn: dict, model: str, number: int) -> dict:
    message = {"role": "assistant", "content": turn.get("content")}
    calls = turn.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            c["raw"] if "raw" in c else
            {"id": c.get("id") or f"call_{number}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)
        ]
    finish = turn.get("finish_reason") or ("tool_calls" if calls else "stop")
    return {"id": f"chatcmpl-fake-{number}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        self._send_raw(json.dumps(body), "application/json", status, headers)

    def _send_raw(self, body: str, content_type: str, status: int = 200,
                  headers: dict | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self):
        fake: FakeOpenAI = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with fake.lock:
            fake.requests.append(body)
            fake.headers.append({k.lower(): v for k, v in self.headers.items()})
            turn = None if fake.responder else fake.turns.pop(0) if fake.turns else None
            number = len(fake.requests)
        if fake.responder is not None:          # outside the lock: it may wait
            try:
                turn = fake.responder(body)
            except Exception as exc:            # a broken test shows as an HTTP 500
                turn = {"status": 500, "message": f"fake server: responder failed: {exc!r}"}
        turn = server_quirk(fake, body) or turn
        if turn is not None and fake.tools_need_choice and body.get("tools") \
                and "tool_choice" not in body:
            turn = without_tools(turn)
        if turn is None:
            self._send(500, {"error": {"message": "fake server: script exhausted"}})
        elif turn.get("drop"):
            self.close_connection = True
        elif turn.get("hang"):
            fake.released.wait(60)
            self.close_connection = True
        elif "body" in turn:
            self._send_raw(turn["body"], turn.get("content_type", "application/json"))
        elif "raw_error" in turn:
            self._send(*turn["raw_error"])
        elif "status" in turn:
            self._send(turn["status"], {"error": {"message": turn["message"], "type": "scripted",
                                                  "code": turn.get("code")}}, turn.get("headers"))
        else:
            self._send(200, completion(turn, body.get("model", "fake-model"), number))


class FakeOpenAI:
    """Context manager: a scripted Chat Completions server on 127.0.0.1:<port>."""

    def __init__(self, turns=(), port: int = 0, responder=None, *,
                 tools_need_choice: bool = False, refuses_auto: bool = False,
                 window: int | None = None):
        self.turns = list(turns)
        self.tools_need_choice = tools_need_choice
        self.refuses_auto = refuses_auto
        self.window = window                   # context window in request_tokens()
        self.responder = responder             # request body -> turn; replaces the script
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        self.released = threading.Event()      # ends every {"hang": True} request
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def add(self, *turns: dict) -> None:
        with self.lock:
            self.turns.extend(turns)

    def __enter__(self):
        # shutdown() waits for the server's next poll, and the suite starts thousands of
        # servers: a 50 ms poll cost a fifth of the in-process tests' time, and 10 ms
        # still 5 ms a server. A 2 ms poll costs a live server about 2 % of a core.
        threading.Thread(target=self._server.serve_forever,
                         kwargs={"poll_interval": 0.002}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


if __name__ == "__main__":
    script = json.loads(open(sys.argv[1], encoding="utf-8").read())
    with FakeOpenAI(script, port=int(sys.argv[2]) if len(sys.argv) > 2 else 0) as server:
        print(server.url, flush=True)
        threading.Event().wait()
