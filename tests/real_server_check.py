"""Run each stage's key prompts against a real OpenAI-compatible server (not run by CI).

    python tests/real_server_check.py --base-url http://127.0.0.1:8000/v1
    python tests/real_server_check.py --base-url http://127.0.0.1:8000/v1 \\
        --context-length 2048 --stages s01 s09 --edition hardened

Each prompt runs as `python agents/<stage>.py -p PROMPT --base-url URL` in a fresh
temporary folder with its own LEARN_HERMES_HOME, so nothing outside it is touched; a
dangerous command is denied there, since -p has no terminal to ask on. The requests go
through a small recording proxy on 127.0.0.1, which counts what the server answered.
The table shows, per prompt: the exit code, the requests made, how many offered tools,
the HTTP errors, and the first error line the stage printed.

What to expect from a very small model (e.g. SmolLM2-135M): calls that are valid JSON
and poor judgement. Exit 0 with tool calls counted means the loop works end to end.
The README's "Local models" section says how to start such a server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# stage: prompts that exercise what the stage adds (the first stage that has a feature
# is enough: later stages carry it).
KEY_PROMPTS = {
    "s01_loop": ["Run the command `echo hello` with the terminal tool and tell me its output."],
    "s02_tool_registry": ["Read the file notes.txt and tell me its first line."],
    "s03_session_store": ["Search earlier sessions for the word 'hello'."],
    "s04_prompt_builder": ["Which folder are you working in?"],
    "s05_context_compression": ["Read notes.txt, then summarise it in one sentence."],
    "s06_error_recovery": ["Read the file missing.txt."],
    "s07_memory": ["Remember that my favourite editor is vim."],
    "s08_skills": ["List the skills you have."],
    "s09_permission_system": ["Delete the folder build with `rm -rf build`."],
    "s10_subagent_delegation": ["Delegate this to a sub-agent: count the lines of notes.txt."],
    "s11_config_chain": ["Run `echo configured` with the terminal tool."],
    "s12_checkpoints": ["Write 'draft' into the file draft.txt."],
}


class Recorder:
    """What the proxy saw: one row per request (tools offered?, HTTP status)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: list[tuple[bool, int]] = []

    def take(self) -> list[tuple[bool, int]]:
        with self.lock:
            rows, self.rows = self.rows, []
        return rows


def start_proxy(target: str, recorder: Recorder) -> ThreadingHTTPServer:
    """A loopback proxy that forwards each request to `target` and records its status."""

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def forward(self, body: bytes | None) -> None:
            url = target.rstrip("/") + self.path.removeprefix("/v1")
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("content-type", "authorization")}
            request = urllib.request.Request(url, data=body, headers=headers,
                                             method=self.command)
            try:
                with urllib.request.urlopen(request, timeout=600) as answer:
                    status, data = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, data = error.code, error.read()
            except OSError as error:            # the server is down: a 502 of our own
                status, data = 502, json.dumps({"error": {"message": str(error)}}).encode()
            if body is not None:
                offered = bool(json.loads(body or b"{}").get("tools"))
                with recorder.lock:
                    recorder.rows.append((offered, status))
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:                     # the stage was stopped (--timeout) meanwhile
                pass

        def do_GET(self):
            self.forward(None)

        def do_POST(self):
            self.forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_prompt(stage_file: Path, prompt: str, proxy_url: str, args) -> tuple[int, str]:
    """Run one prompt in a fresh folder; (exit code, first error line)."""
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "notes.txt").write_text("hello\nfrom the real-server check\n")
        Path(folder, "build").mkdir()
        env = dict(os.environ, LEARN_HERMES_HOME=str(Path(folder, ".home")),
                   OPENAI_API_KEY=os.environ.get("OPENAI_API_KEY", "local"))
        command = [sys.executable, str(stage_file), "-p", prompt, "--base-url", proxy_url]
        if args.model:
            command += ["--model", args.model]
        if args.context_length and stage_file.stem >= "s05":
            command += ["--context-length", str(args.context_length)]
        try:
            done = subprocess.run(command, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {args.timeout}s"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    return done.returncode, (errors[0] if errors else "")[:70]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="model name to send (default: each stage's default)")
    parser.add_argument("--context-length", type=int,
                        help="the server's context window, passed to s05 and later")
    parser.add_argument("--stages", nargs="*", help="stage prefixes, e.g. s01 s09 (default: all)")
    parser.add_argument("--edition", choices=("teaching", "hardened"), default="teaching")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per prompt")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = ROOT / ("agents" if args.edition == "teaching" else "agents/hardened")
    recorder = Recorder()
    proxy = start_proxy(args.base_url, recorder)
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
    print(f"{'stage':24} {'exit':>4} {'requests':>8} {'tools':>5} {'HTTP errors':12} "
          f"prompt / first error")
    failures = 0
    for stage, prompts in KEY_PROMPTS.items():
        if args.stages and not any(stage.startswith(s) for s in args.stages):
            continue
        for prompt in prompts:
            code, error = run_prompt(folder / f"{stage}.py", prompt, proxy_url, args)
            rows = recorder.take()
            http_errors = sorted({status for _, status in rows if status >= 400})
            failures += code != 0
            print(f"{stage:24} {code:>4} {len(rows):>8} {sum(o for o, _ in rows):>5} "
                  f"{','.join(map(str, http_errors)) or '-':12} {prompt[:50]}")
            if error:
                print(f"{'':58} {error}")
    proxy.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
