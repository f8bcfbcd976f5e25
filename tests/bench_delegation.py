"""Benchmark of s10's parallel sub-agents.

    python tests/bench_delegation.py

One delegate_task call with one child, then one with three children, against a fake
endpoint that takes 300 ms to answer every request. Each child makes two model calls (a
terminal call of `true`, then its answer), so one child alone takes about 0.6 s. Run in
parallel, three children should take about as long as one: the target (issue 10) is
under 1.5 times the wall time of one child alone. Like timeit, the verdict uses the best
of a few rounds: other processes on a shared machine only ever add time.
Not collected by pytest: the name has no test_ prefix.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from fake_openai import FakeOpenAI, call, reply  # noqa: E402
from helpers import load_stage  # noqa: E402

ENDPOINT_DELAY = 0.3                    # seconds the fake endpoint takes per request
ROUNDS = 3
TARGET_RATIO = 1.5


def slow_endpoint(stage):
    """Every answer after ENDPOINT_DELAY: a child first runs `true`, then answers."""
    def respond(request):
        time.sleep(ENDPOINT_DELAY)
        messages = request["messages"]
        if not str(messages[0].get("content")).startswith(stage.CHILD_SYSTEM_PROMPT):
            return reply("unused: the benchmark calls delegate_task itself")
        if any(m["role"] == "tool" for m in messages):
            return reply(f"done: {messages[1]['content']}")
        return reply("", call("terminal", {"command": "true"}))
    return respond


def delegate(stage, session, children: int) -> tuple[float, list[dict]]:
    """Wall seconds of one delegate_task call with this many children, and its results."""
    tasks = [{"goal": f"task {n}", "toolsets": ["terminal"]} for n in range(1, children + 1)]
    approvals = stage.APPROVAL_CONTEXT.set(stage.ApprovalContext(stage.Permissions(), session))
    delegation = stage.DELEGATION.set(stage.Delegator(session, stage.IterationBudget(30)))
    try:
        start = time.perf_counter()
        result = json.loads(stage.delegate_task(tasks=tasks))
        return time.perf_counter() - start, result["children"]
    finally:
        stage.DELEGATION.reset(delegation)
        stage.APPROVAL_CONTEXT.reset(approvals)


def main() -> int:
    stage = load_stage("s10_subagent_delegation")
    with tempfile.TemporaryDirectory(prefix="bench-delegation-") as folder:
        os.environ["LEARN_HERMES_HOME"] = str(Path(folder) / "home")    # no real state
        os.chdir(folder)
        with FakeOpenAI(responder=slow_endpoint(stage)) as server:
            session = stage.Session(stage.make_client(server.url, "k"), "m", server.url, 30)
            delegate(stage, session, 1)                                 # warm up
            walls = {1: [], 3: []}
            for _ in range(ROUNDS):
                for children in (1, 3):
                    seconds, results = delegate(stage, session, children)
                    statuses = {child["status"] for child in results}
                    if statuses != {"completed"} or len(results) != children:
                        print(f"FAIL: a child did not complete: {results}")
                        return 1
                    walls[children].append(seconds)
            requests = len(server.requests)
    one, three = min(walls[1]), min(walls[3])
    ratio = three / one
    print(f"endpoint delay {ENDPOINT_DELAY * 1000:.0f} ms per request; each child makes 2 "
          f"model calls; best of {ROUNDS} rounds ({requests} requests in all)")
    print(f"one child alone:       {one:.3f} s  (rounds: "
          f"{', '.join(f'{s:.3f}' for s in walls[1])})")
    print(f"three children at once: {three:.3f} s  (rounds: "
          f"{', '.join(f'{s:.3f}' for s in walls[3])})")
    print(f"ratio: {ratio:.2f}x (target: under {TARGET_RATIO}x; three in a row would be 3x)")
    print("PASS" if ratio < TARGET_RATIO else "FAIL")
    return 0 if ratio < TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
