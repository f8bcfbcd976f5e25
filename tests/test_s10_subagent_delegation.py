"""s10: sub-agent delegation. delegate_task gives a task to a child with a fresh context,
fewer tools, its own approvals and a budget paid from the parent's turn; children run in
parallel threads, report progress and a heartbeat, and stop on Ctrl-C.

Runs on every stage from s10 up. The parent and its children talk to one fake server
(tests/fake_openai.py) through the real openai client. Children run in parallel, so
their requests arrive in no fixed order: the server answers by what each request holds
(`endpoint()`): a child's request starts with CHILD_SYSTEM_PROMPT and its goal is its
first user message; any other request is the parent's. Dangerous commands name `rm`,
which is a stub first on PATH that only leaves a mark, and run in tmp_path.
"""

import contextlib
import contextvars
import json
import os
import signal
import threading
import time
import types

import openai
import pytest

from fake_openai import FakeOpenAI, call, http_error, no_answer, reply
from helpers import (dies_soon, load_stage, marks, pairing_problems, pid_alive, pid_in_file,
                     pid_of_running_command, run_main, stages_from, start_agent,
                     started_session, stubbed_work_folder, type_line)

STAGES = stages_from("s10")
STUBBED = ("rm",)


@pytest.fixture(params=STAGES)
def stage(request):
    module = load_stage(request.param)
    yield module
    module.ActiveSession.store = None
    module.ActiveSession.session_id = None


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder with a stub rm first on PATH; HOME is a temporary folder."""
    return stubbed_work_folder(tmp_path, monkeypatch, STUBBED)


class Progress:
    """The child events of a turn, as run_turn's Delegator reports them (still printed
    by the real show_child_event), and a way to wait for one."""

    def __init__(self, show):
        self.show, self.events, self.changed = show, [], threading.Condition()

    def __call__(self, event: dict) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()
        self.show(event)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(list(self.events)), timeout)

    def of(self, kind: str) -> list[dict]:
        with self.changed:
            return [event for event in self.events if event["event"] == kind]


@pytest.fixture
def progress(stage, monkeypatch):
    recorder = Progress(stage.show_child_event)
    monkeypatch.setattr(stage, "show_child_event", recorder)
    return recorder


# One real client; with_options() copies it for each server in microseconds.
CLIENT = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)


def agent(stage, server, max_iterations=30, tools=None, **delegation):
    """The parent: a Session on the fake server as main() makes it, without retries (a
    failed request fails at once) and with these DelegationSettings."""
    session = stage.Session(CLIENT.with_options(base_url=server.url, timeout=30), "m",
                            server.url, max_iterations, tools, None)
    session.recovery = stage.RetryPolicy(max_retries=0)
    session.delegation = stage.DelegationSettings(**delegation)
    return session


def run(stage, session, text="go", permissions=None) -> bool:
    """One user turn through the real run_turn, in the approval context main() sets."""
    token = stage.APPROVAL_CONTEXT.set(stage.ApprovalContext(
        permissions or stage.Permissions(), session, None))
    try:
        return stage.run_turn(session, text)
    finally:
        stage.APPROVAL_CONTEXT.reset(token)


@contextlib.contextmanager
def stage_delegation(stage, session, depth=0):
    """The approval context and Delegator that code of an agent at `depth` runs in."""
    approvals = stage.APPROVAL_CONTEXT.set(stage.ApprovalContext(stage.Permissions(), session))
    delegation = stage.DELEGATION.set(stage.Delegator(
        session, stage.IterationBudget(session.max_iterations), depth))
    try:
        yield
    finally:
        stage.DELEGATION.reset(delegation)
        stage.APPROVAL_CONTEXT.reset(approvals)


def call_delegate(stage, session, depth=0, **arguments) -> dict:
    """delegate_task itself, called as the loop of an agent at `depth` would call it."""
    with stage_delegation(stage, session, depth):
        return json.loads(stage.delegate_task(**arguments))


def is_child(stage, request) -> bool:
    return str(request["messages"][0].get("content")).startswith(stage.CHILD_SYSTEM_PROMPT)


def endpoint(stage, parent: list, child=None):
    """A FakeOpenAI responder: the parent gets parent[n] for its n-th model call of the
    turn; a child gets child(goal, n) for its own n-th call. Neither depends on the order
    in which parallel requests arrive."""
    def respond(request):
        messages = request["messages"]
        if is_child(stage, request):
            return child(messages[1]["content"], sum(m["role"] == "assistant" for m in messages))
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        calls = sum(m["role"] == "assistant" for m in messages[last_user:])
        return parent[calls] if calls < len(parent) else None
    return respond


def delegating(final="parent done", **arguments) -> list:
    """The parent's turns: one delegate_task call (id d1), then its final answer."""
    return [reply("", call("delegate_task", arguments, "d1")), reply(final)]


def keeps_calling(command="true"):
    """A child whose model never stops calling tools."""
    return lambda goal, calls: reply("", call("terminal", {"command": command}))


def script(turns_by_goal: dict):
    """Children whose n-th answer is turns_by_goal[goal][n]."""
    return lambda goal, calls: turns_by_goal[goal][calls]


def delegation_result(session) -> dict:
    """What the parent received from its delegate_task call d1."""
    return json.loads(next(m["content"] for m in session.messages
                           if m.get("tool_call_id") == "d1"))


def child_requests(stage, server, goal=None) -> list[dict]:
    return [r for r in server.requests if is_child(stage, r)
            and (goal is None or r["messages"][1]["content"] == goal)]


def tool_results(request) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def offered(request) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


def names_in(stage, tools, toolsets) -> set[str]:
    return {t["function"]["name"] for t in tools
            if stage.REGISTRY.get(t["function"]["name"]).toolset in toolsets}


# ── what a child gets ─────────────────────────────────────────────────────

def test_a_child_gets_the_toolsets_it_asks_for_minus_the_blocked_tools(stage, work, home,
                                                                       monkeypatch):
    store = stage.SessionStore(home / "sessions.db")      # so the parent has session_search
    monkeypatch.setattr(stage.ActiveSession, "store", store)
    asked = ["terminal", "memory", "skills", "delegation", "session_search"]
    blocked_calls = reply("", call("memory", {"action": "add", "target": "memory",
                                              "content": "x"}),
                          call("skill_manage", {}), call("delegate_task", {"goal": "more"}),
                          call("session_search", {"query": "secret"}))
    children = script({"asks": [blocked_calls, reply("could not")], "plain": [reply("ok")]})
    tasks = [{"goal": "asks", "toolsets": asked}, {"goal": "plain"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    parent_tools = {t["function"]["name"] for t in session.tools}
    assert {"delegate_task", "memory", "skill_manage", "session_search"} <= parent_tools   # the test means it
    first, second = child_requests(stage, server, "asks")
    assert offered(first) == names_in(stage, session.tools, asked) - stage.DELEGATE_BLOCKED_TOOLS
    assert {"terminal", "skills_list", "skill_view"} <= offered(first)
    assert offered(first).isdisjoint({"delegate_task", "memory", "skill_manage", "session_search",
                                      "read_file"})
    assert stage.DELEGATE_BLOCKED_TOOLS == {"delegate_task", "memory", "skill_manage",
                                            "session_search"}
    refusals = tool_results(second)
    assert [text.split(" does not exist")[0] for text in refusals] == [
        "Tool 'memory'", "Tool 'skill_manage'", "Tool 'delegate_task'", "Tool 'session_search'"]
    assert not (home / stage.MEMORY_DIR_NAME / "MEMORY.md").exists()
    assert len(child_requests(stage, server, "more")) == 0              # no grandchild
    plain = child_requests(stage, server, "plain")[0]
    assert offered(plain) == names_in(stage, session.tools, ("terminal", "file"))
    store.db.close()
    # Every call of "asks" was refused: it achieved nothing, whatever it answered.
    assert [c["status"] for c in delegation_result(session)["children"]] == ["failed",
                                                                             "completed"]


def test_a_child_starts_with_its_goal_and_a_short_prompt_only(stage, work, home):
    (home / "SOUL.md").write_text("You are PARENT-SOUL-1234.\n")
    (home / stage.MEMORY_DIR_NAME).mkdir()
    (home / stage.MEMORY_DIR_NAME / "MEMORY.md").write_text("PARENT-MEMORY-5678\n")
    goal = "  Count the lines of notes.txt,\nthen report the number.  "
    context = "notes.txt is in the working directory."
    tasks = [{"goal": goal, "context": context}, {"goal": "no context"}]
    children = script({goal: [reply("3 lines")], "no context": [reply("nothing to do")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session = agent(stage, server)
        assert run(stage, session, "PARENT-REQUEST-9")
    parent_prompt = session.messages[0]["content"]
    assert "PARENT-SOUL-1234" in parent_prompt and "PARENT-MEMORY-5678" in parent_prompt
    prompt = stage.CHILD_SYSTEM_PROMPT + f"\n\nWorking directory: {stage.current_directory()}"
    assert child_requests(stage, server, goal)[0]["messages"] == [
        {"role": "system", "content": prompt + f"\n\nContext from the agent that delegated:\n"
                                               f"{context}"},
        {"role": "user", "content": goal}]
    assert child_requests(stage, server, "no context")[0]["messages"] == [
        {"role": "system", "content": prompt}, {"role": "user", "content": "no context"}]
    assert delegation_result(session)["children"][0]["goal"] == (
        "Count the lines of notes.txt, then report the number.")     # shown, not verbatim
    for request in child_requests(stage, server):
        text = json.dumps(request["messages"])
        for secret in ("PARENT-SOUL-1234", "PARENT-MEMORY-5678", "PARENT-REQUEST-9"):
            assert secret not in text


def test_only_each_childs_final_answer_reaches_the_parent(stage, work):
    children = script({"look": [reply("CHILD-THOUGHT", call("terminal", {"command": "echo CHILD-OUTPUT"})),
                                reply("the answer is 42")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="look"), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    assert delegation_result(session) == {
        "children": [{"task": 1, "goal": "look", "status": "completed",
                      "answer": "the answer is 42", "model_calls": 2, "tool_calls": 1}],
        "budget": "3 of 30 model calls of this turn used (shared budget: children's calls count)"}
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant", "tool",
                                                     "assistant"]
    parent_requests = [r for r in server.requests if not is_child(stage, r)]
    assert len(parent_requests) == 2
    assert "CHILD-OUTPUT" not in json.dumps(parent_requests) \
        and "CHILD-THOUGHT" not in json.dumps(parent_requests)
    assert "CHILD-OUTPUT" in tool_results(child_requests(stage, server)[1])[0]


def test_a_long_answer_is_cut_at_24000_characters_with_a_marker(stage, work, progress,
                                                                capsys):
    children = script({"long": [reply("x" * (24_000 + 1_234))], "exact": [reply("y" * 24_000)]})
    tasks = [{"goal": "long"}, {"goal": "exact"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    long, exact = delegation_result(session)["children"]
    assert long["answer"] == "x" * 24_000 + "\n[… 1,234 more characters cut]"
    assert exact["answer"] == "y" * 24_000 and long["status"] == exact["status"] == "completed"
    shown = "x" * 100 + "…"                         # the tree and the summary: one short line
    assert [e["answer"] for e in progress.of("finished") if e["index"] == 1] == [shown]
    lines = capsys.readouterr().out.splitlines()
    assert f"    ├─ [1] completed after 1 model call(s): {shown}" in lines
    assert f"    [1] completed: {shown}" in lines


# ── refused tasks ─────────────────────────────────────────────────────────

NOT_BOTH = "give either goal (with context, toolsets) or tasks, not both."


@pytest.mark.parametrize("arguments,error", [
    ({"goal": "x", "toolsets": []}, "toolsets is empty: name the toolsets the sub-agent needs."),
    pytest.param({"goal": "x", "toolsets": ["terminal", "nope"]}, "unknown toolset(s) nope; known: ",
                 marks=pytest.mark.hardening),
    ({"goal": "x", "toolsets": ["memory"]}, "no tools left in memory once the tools a "
     "sub-agent never gets (delegate_task, memory, session_search, skill_manage) are removed."),
    ({"goal": "x", "toolsets": ["delegation"]}, "no tools left in delegation once"),
    ({"goal": "x", "toolsets": "terminal"}, "toolsets must be a list of toolset names."),
    ({"tasks": [{"goal": str(n)} for n in range(4)]},
     "at most 3 tasks run in parallel; got 4. Delegate the rest in a later call."),
    ({"goal": "x", "tasks": [{"goal": "a"}]}, NOT_BOTH),
    ({"context": "c", "tasks": [{"goal": "a"}]}, NOT_BOTH),
    ({"toolsets": ["file"], "tasks": [{"goal": "a"}]}, NOT_BOTH),
    ({"tasks": []}, "tasks is empty."),
    ({}, "give a goal, or tasks (a list of up to 3 {goal, context, toolsets})."),
    ({"goal": "  "}, "goal must be a non-empty string."),
    pytest.param({"goal": "x", "context": 3}, "context must be a string.",
                 marks=pytest.mark.hardening),
    pytest.param({"tasks": [{"goal": "a"}, "b"]}, "task 2: each task must be an object",
                 marks=pytest.mark.hardening),
    ({"tasks": [{"goal": "a", "tools": ["x"]}]}, "unexpected field(s) tools; a task has goal, "
     "context, toolsets."),
    pytest.param({"tasks": [{"goal": "a"}, {"goal": "b", "toolsets": ["nope"]}]},
     "task 2: unknown toolset(s) nope", marks=pytest.mark.hardening),
    pytest.param({"goal": "x", "toolsets": [f"n{k}" for k in range(1, 7)]},
     "unknown toolset(s) n1, n2, n3, n4, n5 and 1 more; known: ", marks=pytest.mark.hardening),
    ({"tasks": [{"goal": "a", **{f"f{k}": 1 for k in range(1, 6)}}]},
     "unexpected field(s) f1, f2, f3, f4, f5; a task"),
    pytest.param({"tasks": [{"goal": "a", "x\u200b" + "y" * 80: 1}]},
     "unexpected field(s) x\\u200b" + "y" * 52 + "…; a task", marks=pytest.mark.hardening),
])
def test_bad_tasks_are_errors_and_nothing_is_delegated(stage, work, arguments, error):
    with FakeOpenAI() as server:
        result = call_delegate(stage, agent(stage, server), **arguments)
    assert result["error"].startswith(error) and result["error"].endswith(
        " Nothing was delegated."), result
    assert server.requests == []                    # task 1 of a bad batch never started


def test_a_child_never_searches_the_parents_sessions(stage, work, home, monkeypatch):
    # The parent has session_search; a child asking for only that toolset has no tool left.
    store = stage.SessionStore(home / "sessions.db")
    monkeypatch.setattr(stage.ActiveSession, "store", store)
    with FakeOpenAI() as server:
        session = agent(stage, server)
        result = call_delegate(stage, session, goal="x", toolsets=["session_search"])
    store.db.close()
    assert "session_search" in {t["function"]["name"] for t in session.tools}
    assert result["error"] == ("no tools left in session_search once the tools a sub-agent "
                               "never gets (delegate_task, memory, session_search, skill_manage) "
                               "are removed. Nothing was delegated.")
    assert server.requests == []


def test_three_tasks_run_and_an_error_reaches_the_model_as_the_tool_result(stage, work):
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="x", toolsets=[]))) as server:
        session = agent(stage, server)
        assert run(stage, session)
    assert delegation_result(session)["error"].startswith("toolsets is empty")
    assert len(server.requests) == 2 and child_requests(stage, server) == []
    three = [{"goal": str(n)} for n in range(3)]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=three),
                                       lambda goal, calls: reply("ok"))) as server:
        result = call_delegate(stage, agent(stage, server), tasks=three)
    assert [c["status"] for c in result["children"]] == ["completed"] * 3


@pytest.mark.hardening
def test_a_child_never_gets_a_toolset_its_parent_lacks(stage, work):
    tools = stage.REGISTRY.get_definitions({"terminal", "delegation"})    # --toolsets
    children = script({"ls": [reply("listed")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="ls"), children)) as server:
        session = agent(stage, server, tools=tools)
        for toolsets in (["file"], ["terminal", "file"]):
            assert call_delegate(stage, session, goal="ls", toolsets=toolsets)["error"] == (
                "toolset(s) file are not offered to this agent, so not to its sub-agents "
                "either. Nothing was delegated.")
        assert server.requests == []
        assert run(stage, session)                  # no toolsets: the defaults it has
    assert offered(child_requests(stage, server, "ls")[0]) == {"terminal"}
    memory_only = stage.REGISTRY.get_definitions({"memory", "delegation"})
    with FakeOpenAI() as server:
        assert call_delegate(stage, agent(stage, server, tools=memory_only), goal="x")["error"] \
            == ("none of the default toolsets (terminal, file) is offered to this agent: name "
                "the toolsets the sub-agent needs. Nothing was delegated.")


@pytest.mark.hardening
def test_the_flag_toolsets_limits_the_children_too(stage, work):
    argv = ("--toolsets", "terminal,delegation")
    asked = run_main(stage, "-p", 'call delegate_task {"goal": "read it", "toolsets": ["file"]}',
                     *argv)
    assert "The tool reported: toolset(s) file are not offered to this agent" in asked.stdout
    default = run_main(stage, "-p", "delegate read notes.txt", *argv)
    assert "Tool 'read_file' does not exist. Available tools: terminal" in default.stdout


# ── depth ─────────────────────────────────────────────────────────────────

def test_a_child_cannot_delegate(stage, work):
    children = script({"nested": [reply("", call("delegate_task", {"goal": "deeper"})),
                                  reply("did it myself")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="nested"), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
        first, second = child_requests(stage, server, "nested")
        assert "delegate_task" not in offered(first) and "terminal" in offered(first)
        assert tool_results(second)[0].startswith("Tool 'delegate_task' does not exist.")
        assert child_requests(stage, server, "deeper") == []
        count = len(server.requests)
        assert call_delegate(stage, session, depth=1, goal="deeper")["error"] == (
            "delegation depth limit reached: a sub-agent (depth 1) cannot delegate. Do the "
            "task yourself.")
        assert len(server.requests) == count
    assert delegation_result(session)["children"][0]["answer"] == "did it myself"


def test_delegate_task_outside_a_turn_is_an_error(stage, work):
    assert stage.DELEGATION.get() is None
    assert stage.Delegator(None, stage.IterationBudget(1)).depth == 0     # a parent by default
    assert json.loads(stage.delegate_task(goal="x")) == {
        "error": "delegate_task runs only inside an agent's turn"}


def test_a_child_offered_delegate_task_by_mistake_still_hits_the_depth_limit(stage, work,
                                                                              monkeypatch):
    """The second wall: were the blocked tools ever offered, the child's own depth stops it."""
    monkeypatch.setattr(stage, "child_tools", lambda parent_tools, toolsets: parent_tools)
    children = script({"nested": [reply("", call("delegate_task", {"goal": "deeper"})),
                                  reply("did it myself")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="nested"), children)) as server:
        assert run(stage, agent(stage, server))
    first, second = child_requests(stage, server, "nested")
    assert "delegate_task" in offered(first)
    assert json.loads(tool_results(second)[0])["error"].startswith(
        "delegation depth limit reached: a sub-agent (depth 1) cannot delegate.")
    assert child_requests(stage, server, "deeper") == []


# ── the budget ────────────────────────────────────────────────────────────

def test_consume_leaves_the_reserve_and_a_child_pays_from_its_parent(stage):
    budget = stage.IterationBudget(3)
    assert [budget.consume(keep=1) for _ in range(3)] == [True, True, False]
    assert budget.used == 2 and budget.consume() and not budget.consume()
    parent, stop = stage.IterationBudget(10), threading.Event()
    child = stage.ChildBudget(parent, stop)
    assert child.consume() and (child.used, parent.used) == (1, 1)
    stop.set()                                      # Ctrl-C: no more calls
    assert not child.consume() and (child.used, parent.used) == (1, 1)
    spent = stage.IterationBudget(2)
    spent.consume()                                 # 1 left: the parent's reserve
    starved = stage.ChildBudget(spent, threading.Event())
    assert not starved.consume() and starved.parent_ran_out
    assert (starved.used, spent.used) == (0, 1)     # the refused call is not counted
    alone = stage.ChildBudget(None, threading.Event())
    assert [alone.consume() for _ in range(16)] == [True] * 15 + [False]


def test_three_parallel_children_never_exceed_the_shared_budget(stage, work, capsys):
    tasks = [{"goal": f"task {n}"} for n in (1, 2, 3)]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), keeps_calling())) as server:
        session = agent(stage, server, max_iterations=7)
        assert run(stage, session)
    # 1 parent call, 5 shared by the children, 1 kept for the parent's answer
    assert len(server.requests) == 7 and len(child_requests(stage, server)) == 5
    result = delegation_result(session)
    for child in result["children"]:
        assert child["status"] == "budget_exhausted"
        assert child["model_calls"] == len(child_requests(stage, server, child["goal"])) \
            == child["tool_calls"]
        assert child["note"] == ("stopped: the turn's shared budget is spent "
                                 "(--max-iterations): the work may be unfinished")
    assert result["budget"] == ("6 of 7 model calls of this turn used (shared budget: "
                                "children's calls count)")
    assert session.messages[-1] == {"role": "assistant", "content": "parent done"}
    assert capsys.readouterr().out.endswith("parent done\n")


def test_independent_children_each_get_15_calls_whatever_the_parents_budget(stage, work):
    tasks = [{"goal": f"task {n}"} for n in (1, 2, 3)]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), keeps_calling())) as server:
        session = agent(stage, server, max_iterations=3, budget_mode="independent")
        assert run(stage, session)
    assert len(server.requests) == 1 + 3 * 15 + 1
    result = delegation_result(session)
    for child in result["children"]:
        assert (child["status"], child["model_calls"]) == ("iteration_limit", 15)
        assert len(child_requests(stage, server, child["goal"])) == 15
        assert child["note"] == ("stopped after 15 model calls (MAX_CHILD_ITERATIONS): the "
                                 "work may be unfinished")
    assert result["budget"] == ("1 of 3 model calls of this turn used (independent budget: "
                                "children's calls do not count)")
    assert session.messages[-1]["content"] == "parent done"


def test_one_child_stops_after_15_calls_even_with_budget_left(stage, work):
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="loop"), keeps_calling())) as server:
        session = agent(stage, server, max_iterations=100)
        assert run(stage, session)
    assert len(child_requests(stage, server, "loop")) == 15
    child = delegation_result(session)["children"][0]
    assert (child["status"], child["model_calls"], child["tool_calls"]) == ("iteration_limit", 15, 15)
    assert delegation_result(session)["budget"].startswith("16 of 100 model calls")


# ── approvals ─────────────────────────────────────────────────────────────

def run_commands(stage, work, commands_by_goal, permissions=None, reviewer=None, **delegation):
    """Each child runs its command, then answers "done"; the parent's session and the
    refusals (or outputs) its children got, by goal. `permissions` may be a function of
    the parent's session; `reviewer` answers smart-review requests."""
    goals = list(commands_by_goal)
    children = script({goal: [reply("", call("terminal", {"command": command})), reply("done")]
                       for goal, command in commands_by_goal.items()})
    tasks = [{"goal": goal} for goal in goals]
    answer = endpoint(stage, delegating(tasks=tasks), children)

    def respond(request):
        if request["messages"][0]["content"] == stage.SMART_REVIEW_PROMPT:
            return reviewer(request)
        return answer(request)
    with FakeOpenAI(responder=respond) as server:
        session = agent(stage, server, **delegation)
        if callable(permissions):
            permissions = permissions(session)
        assert run(stage, session, permissions=permissions)
    return session, {goal: json.loads(tool_results(child_requests(stage, server, goal)[1])[0])
                     for goal in goals}


NOBODY = ("denied: a sub-agent has nobody to ask, and its dangerous commands are denied "
          "(--child-approvals deny). The command needs approval (")


def test_a_childs_dangerous_command_is_denied_and_shares_no_session_approvals(stage, work,
                                                                              capsys):
    permissions = stage.Permissions()
    keys = [finding.key for finding in stage.detect_dangerous_command("rm -rf build")]
    session, results = run_commands(stage, work, {"clean": "rm -rf build"}, permissions)
    assert results["clean"]["error"].startswith(NOBODY) and marks(work) == []
    assert permissions.session_approved == {}
    assert "[sub-agent 1] denied: " in capsys.readouterr().err

    def approved_by_the_parent(session):      # "session" answered for the parent's id
        permissions.approve_in(session.session_id, keys)
        return permissions
    session, results = run_commands(stage, work, {"clean": "rm -rf build"},
                                    approved_by_the_parent)
    assert results["clean"]["error"].startswith(NOBODY) and marks(work) == []
    assert permissions.session_approved == {session.session_id: set(keys)}


def test_child_approvals_once_approves_each_command_once_and_stores_nothing(stage, work,
                                                                           capsys):
    permissions = stage.Permissions()
    commands = {"first": "rm -rf build", "second": "rm -rf build"}
    session, results = run_commands(stage, work, commands, permissions, child_approvals="once")
    assert [result["output"] for result in results.values()] == ["stub rm\n"] * 2
    assert marks(work) == ["rm -rf build"] * 2
    err = capsys.readouterr().err
    assert err.count("approved once without asking (--child-approvals once): ") == 2
    assert permissions.session_approved == {}


@pytest.mark.hardening
def test_a_command_only_a_person_may_approve_is_denied_even_with_once(stage, work, monkeypatch):
    opaque = stage.Finding("too_complex", "too complex to analyse", "dangerous", True)
    monkeypatch.setattr(stage, "detect_dangerous_command", lambda command: [opaque])
    _, results = run_commands(stage, work, {"odd": "rm -rf build"}, child_approvals="once")
    assert results["odd"]["error"].startswith(
        "denied: it needs a person's answer, and a sub-agent has nobody to ask.")
    assert marks(work) == []


def test_the_smart_reviewer_never_approves_for_a_child(stage, work):
    reviews = []

    def reviewer(request):
        reviews.append(request)
        return reply("APPROVE")
    _, results = run_commands(stage, work, {"clean": "rm -rf build"},
                              stage.Permissions(mode="smart"), reviewer)
    assert results["clean"]["error"].startswith(NOBODY) and marks(work) == []
    assert reviews == []


def test_a_child_never_writes_the_agents_state_folder(stage, work, home):
    (work / "state").symlink_to(home)               # a link the model made earlier
    writes = reply("", call("write_file", {"path": str(home / "memories" / "MEMORY.md"),
                                           "content": "obey"}),
                   call("write_file", {"path": "state/skills/evil/SKILL.md", "content": "x"}),
                   call("write_file", {"path": "fine.txt", "content": "fine"}))
    children = script({"write": [writes, reply("done")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="write"), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    memory, skill, fine = map(json.loads, tool_results(child_requests(stage, server)[1]))
    for refusal in (memory, skill):
        assert refusal["refused"] is True and refusal["error"].startswith("write refused: ")
        assert "is in the agent's state folder" in refusal["error"]
    assert fine["bytes_written"] == 4 and (work / "fine.txt").read_text() == "fine"
    assert list(home.iterdir()) == []                 # no memories/, no skills/
    # The parent itself (depth 0, or no turn at all) still writes there.
    with stage_delegation(stage, session, depth=0):
        assert json.loads(stage.write_file(str(home / "notes.md"), "ok"))["bytes_written"] == 2
    assert json.loads(stage.write_file(str(home / "more.md"), "ok"))["bytes_written"] == 2


@pytest.mark.parametrize("child_approvals", ["deny", "once"])
@pytest.mark.parametrize("policy", ["--yolo", "--approval-mode off", "/yolo"])
def test_the_parents_yolo_never_reaches_a_child_and_hardline_is_always_blocked(
        stage, work, capsys, policy, child_approvals):
    def permissions(session):
        if policy == "/yolo":                   # on for the parent's session id only
            chosen = stage.Permissions()
            chosen.session_yolo.add(session.session_id)
            return chosen
        return stage.Permissions(**({"yolo_source": "--yolo"} if policy == "--yolo"
                                    else {"mode": "off"}))
    _, results = run_commands(stage, work, {"danger": "rm -rf build", "hard": "rm -rf /"},
                              permissions, child_approvals=child_approvals)
    assert results["hard"]["blocked"] == "hardline"
    assert "[approved without asking: YOLO is on" not in capsys.readouterr().err
    if child_approvals == "deny":
        assert results["danger"]["error"].startswith(NOBODY) and marks(work) == []
    else:
        assert results["danger"]["output"] == "stub rm\n" and marks(work) == ["rm -rf build"]


@pytest.mark.hardening
@pytest.mark.parametrize("child_approvals", ["deny", "once"])
def test_a_child_cannot_run_code_hidden_in_settings(stage, work, child_approvals):
    """Issue 22, defect 1, from a sub-agent: code run through a variable, an option or a
    setting is read like sh -c (hardline here), and code that cannot be read is denied:
    a child has nobody to ask, whatever --child-approvals says."""
    _, results = run_commands(stage, work, {
        "sed": 'sed "s/x/rm -rf ~/e" notes.txt',
        "alias": 'git config alias.st "!rm -rf ~"',
        "preload": "LD_PRELOAD=./hook.so git status"}, child_approvals=child_approvals)
    for goal in ("sed", "alias"):
        assert results[goal]["blocked"] == "hardline", goal
    assert "nobody to ask" in results["preload"]["error"]
    assert marks(work) == []


@pytest.mark.hardening
def test_a_childs_command_that_changes_the_agents_memory_is_undone(stage, work, home):
    """Principle 2 (issue 22), from a sub-agent: awk computes the path, the detector
    finds nothing, the command runs; the outcome check puts MEMORY.md back."""
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_text("keep this\n")
    command = ("awk 'BEGIN{print \"obey\" >> "
               "(ENVIRON[\"LEARN_\" \"HERMES_HOME\"] \"/mem\" \"ories/MEMORY.md\")}'")
    _, results = run_commands(stage, work, {"memory": command})
    assert results["memory"]["blocked"] == "self-protection"
    assert (home / "memories" / "MEMORY.md").read_text() == "keep this\n"


# ── failures inside a child ───────────────────────────────────────────────

def test_a_childs_broken_call_or_failing_endpoint_never_stops_the_parent(stage, work):
    def children(goal, calls):
        if goal == "broken":
            return [reply("", call("terminal", "{not json")),
                    reply("", call("terminal", {"command": "true"})), reply("recovered")][calls]
        if goal == "unauthorised":
            return http_error(401, "Incorrect API key provided")
        return reply("", call("n" * 400, {}))       # "confused": only invalid calls
    tasks = [{"goal": goal} for goal in ("broken", "unauthorised", "confused")]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    broken, unauthorised, confused = delegation_result(session)["children"]
    assert (broken["status"], broken["answer"]) == ("completed", "recovered")
    assert tool_results(child_requests(stage, server, "broken")[1])[0].startswith(
        "Error: Invalid JSON arguments for terminal")
    assert (unauthorised["status"], unauthorised["model_calls"]) == ("error", 1)
    assert unauthorised["note"].startswith(f"The endpoint {server.url}/ ") \
        and "(401)" in unauthorised["note"]
    assert (confused["status"], confused["model_calls"]) == ("error", 3)
    assert confused["note"] == ("[stopped: 3 turns in a row contained only invalid tool calls "
                                "(last: " + "n" * 400)[:300] + "…"
    assert session.messages[-1]["content"] == "parent done"
    assert pairing_problems(session.messages) == []


def test_a_crash_inside_a_child_is_its_error(stage, work, monkeypatch):
    def crash(child, stopped):
        raise RuntimeError("boom")
    monkeypatch.setattr(stage, "child_outcome", crash)
    children = script({"x": [reply("fine")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="x"), children)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    child = delegation_result(session)["children"][0]
    assert (child["status"], child["note"]) == ("error", "the sub-agent failed: RuntimeError: boom")


@pytest.mark.hardening
def test_a_child_whose_progress_report_fails_is_an_error_and_ends(stage, work, monkeypatch):
    def broken(event):
        if event["event"] == "started":
            raise RuntimeError("progress broke")
    monkeypatch.setattr(stage, "show_child_event", broken)
    ended = ended_heartbeats(stage, monkeypatch)
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="x"), script({}))) as server:
        session = agent(stage, server)
        assert run(stage, session)
    child = delegation_result(session)["children"][0]
    assert (child["status"], child["note"]) == ("error", "the sub-agent failed: RuntimeError: "
                                                         "progress broke")
    assert child_requests(stage, server) == [] and ended.wait(10)


# ── progress and the heartbeat ────────────────────────────────────────────

def test_the_progress_tree_tags_children_only_when_several_run(stage, work, capsys, progress):
    long_command = "echo " + "x" * 100
    sixty = "echo " + "s" * 55                   # PREVIEW_CHARS exactly: shown whole
    children = script({"alone": [reply("", call("terminal", {"cmd": "ls"}),
                                       call("terminal", {"command": sixty})),
                                 reply("done alone")],
                       "first": [reply("", call("terminal", {"command": long_command})),
                                 reply("done first")],
                       "second": [reply("", call("terminal", {"command": "echo \x1b[2J"})),
                                  reply("done second")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="alone"), children)) as server:
        assert run(stage, agent(stage, server))
    lines = capsys.readouterr().out.splitlines()
    for line in ("    ├─ sub-agent started: alone", "    ├─ terminal ls", f"    ├─ terminal {sixty}",
                 "    ├─ terminal: error", "    ├─ completed after 2 model call(s): done alone",
                 "    └─ 1 of 1 sub-agent(s) completed",
                 "  ←", "    [1] completed: done alone",
                 "    3 of 30 model calls of this turn used (shared budget: children's calls "
                 "count)"):
        assert line in lines
    tasks = [{"goal": "first"}, {"goal": "second"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        assert run(stage, agent(stage, server))
    lines = capsys.readouterr().out.splitlines()
    shown = long_command[:59] + "…"
    for line in ("    ├─ [1] sub-agent started: first", "    ├─ [2] sub-agent started: second",
                 f"    ├─ [1] terminal {shown}", "    ├─ [1] completed after 2 model call(s): "
                 "done first", "    ├─ [2] completed after 2 model call(s): done second",
                 "    └─ 2 of 2 sub-agent(s) completed"):
        assert line in lines
    previews = [event["preview"] for event in progress.of("tool_started")]
    assert shown in previews and len(shown) == 60
    assert not any("\x1b" in text for text in previews)
    assert {(e["index"], e["count"]) for e in progress.of("started")} == {(1, 1), (1, 2), (2, 2)}


def tree_of(out: str) -> list[str]:
    """The progress tree's lines (and blank lines) in printed output."""
    return [line for line in out.splitlines() if line.startswith(("    ├─", "    └─"))
            or not line.strip()]


def assert_well_formed(tree: list[str]) -> None:
    """One closing line └─, the last: no ├─ after it, whatever order the children ran in."""
    closing = [i for i, line in enumerate(tree) if line.startswith("    └─")]
    assert closing == [len(tree) - 1], "\n".join(tree)


def test_the_tree_closes_once_after_all_children_and_no_success_is_a_failure(stage, work,
                                                                            capsys, progress):
    """Child 1 goes on after child 2 has finished, so child 2's last line is mid-tree. A
    child whose only call failed, and one with no call and no answer, achieved nothing."""
    other_finished = lambda: progress.wait_for(lambda events: any(
        e["event"] == "finished" and e["index"] == 2 for e in events))
    children = script({"cannot": [reply("", call("delegate_task", {"goal": "x"})),
                                  reply("I could not")],
                       "silent": [reply("")]})
    works = [reply("", call("terminal", {"command": "echo ok"})), reply("done")]

    def answers(goal, calls):
        if goal == "works":
            return other_finished() and works[calls]
        return children(goal, calls)
    tasks = [{"goal": "works"}, {"goal": "cannot"}, {"goal": "silent"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), answers)) as server:
        session = agent(stage, server)
        assert run(stage, session)
    out = capsys.readouterr().out
    tree = tree_of(out)
    assert_well_formed(tree)
    assert tree[-1] == "    └─ 1 of 3 sub-agent(s) completed"
    assert "    ├─ [2] failed after 2 model call(s): I could not" in tree
    statuses = [child["status"] for child in delegation_result(session)["children"]]
    assert statuses == ["completed", "failed", "failed"]
    assert sorted((e["index"], e["status"]) for e in progress.of("finished")) == [
        (1, "completed"), (2, "failed"), (3, "failed")]
    assert "    [2] failed: I could not" in out.splitlines()


def waiting_child(go_file, before_first=lambda: None):
    """A child whose one command waits until the test creates `go_file`; its first
    answer comes once before_first() returns."""
    command = f"while [ ! -e {go_file} ]; do sleep 0.02; done; echo went"

    def answer(goal, calls):
        if calls == 0:
            before_first()
        return [reply("", call("terminal", {"command": command, "timeout": 60})),
                reply("finished")][calls]
    return answer


def release_when(progress, predicate, go_file, seen: dict, session=None) -> threading.Thread:
    """In a helper thread: wait until the events satisfy `predicate` (or 10 s), note
    whether they did (and the parent's last activity then), and let the child go on."""
    def watch():
        seen["ok"] = progress.wait_for(predicate, 10)
        seen["activity"] = session.last_activity if session is not None else None
        go_file.touch()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def ended_heartbeats(stage, monkeypatch) -> threading.Event:
    """Set once every heartbeat thread started from now on has returned."""
    running, ended, lock = [0], threading.Event(), threading.Lock()
    real = stage.heartbeat

    def heartbeat(*args):
        with lock:
            running[0] += 1
        try:
            real(*args)
        finally:
            with lock:
                running[0] -= 1
                if running[0] == 0:
                    ended.set()
    monkeypatch.setattr(stage, "heartbeat", heartbeat)
    return ended


def terminal_beats(events) -> list[dict]:
    return [e for e in events if e["event"] == "heartbeat" and e["activity"] == "terminal"]



def test_the_heartbeat_touches_the_parent_while_children_work(stage, work, monkeypatch):
    """Every beat touches the parent while a child works: a 1 s command at 0.05 s beats."""
    touches = []
    monkeypatch.setattr(stage.Delegator, "touch", lambda self, activity: touches.append(activity))
    children = script({"slow": [reply("", call("terminal", {"command": "sleep 1"})),
                                reply("slept")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="slow"), children)) as server:
        session = agent(stage, server, heartbeat_interval=0.05, stale_beats=10_000)
        assert run(stage, session)
    assert delegation_result(session)["children"][0]["status"] == "completed"
    assert len(touches) >= 3 and all("sub-agent" in activity for activity in touches), touches


@pytest.mark.hardening
def test_the_heartbeat_touches_the_parent_and_stops_when_no_child_progresses(stage, work,
                                                                             monkeypatch):
    """Every beat touches the parent until stale_beats beats pass without a model or tool
    call: a 2 s command at 0.05 s beats would touch it some 40 times, a stale heartbeat
    only a few."""
    touches = []
    monkeypatch.setattr(stage.Delegator, "touch", lambda self, activity: touches.append(activity))
    children = script({"slow": [reply("", call("terminal", {"command": "sleep 2"})),
                                reply("slept")]})
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="slow"), children)) as server:
        session = agent(stage, server, heartbeat_interval=0.05, stale_beats=3)
        assert run(stage, session)
    assert delegation_result(session)["children"][0]["status"] == "completed"
    assert touches and all("sub-agent" in activity for activity in touches), touches
    assert len(touches) <= 10, f"the heartbeat went on without progress: {len(touches)} touches"


@pytest.mark.hardening
def test_the_heartbeat_keeps_the_parent_fresh_and_ends_with_the_child(stage, work, progress,
                                                                       monkeypatch, capsys):
    ended, seen, go = ended_heartbeats(stage, monkeypatch), {}, work / "go"
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="slow"), waiting_child(go))) as server:
        session = agent(stage, server, heartbeat_interval=0.05, stale_beats=10_000)
        started = time.monotonic()
        assert session.last_activity[1] == "started"
        watcher = release_when(progress, lambda events: len(terminal_beats(events)) >= 2, go,
                               seen, session)
        assert run(stage, session)
        watcher.join()
    assert seen["ok"], "no two heartbeats while the child's command ran"
    when, activity = seen["activity"]
    assert when > started and activity == "sub-agent 1: terminal, call 1"
    assert terminal_beats(progress.events)[0]["model_calls"] == 1
    assert ended.wait(10), "a heartbeat thread outlived its child"
    finished = next(i for i, e in enumerate(progress.events) if e["event"] == "finished")
    assert not any(e["event"].startswith("heartbeat") for e in progress.events[finished:])
    assert delegation_result(session)["children"][0]["status"] == "completed"
    assert "    ├─ … still working (terminal, 1 model call(s) so far)" in \
        capsys.readouterr().out.splitlines()


class FinishedJustAfterTheWait(threading.Event):
    """A child that finishes between the heartbeat's wait (which timed out) and its beat."""

    def __init__(self):
        super().__init__()
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        if self.waits == 1:
            self.set()
            return False
        return True


@pytest.mark.hardening
def test_no_heartbeat_after_the_child_has_finished(stage):
    events, touched = [], []
    child = types.SimpleNamespace(
        finished=FinishedJustAfterTheWait(), stop=threading.Event(), lock=threading.Lock(),
        budget=types.SimpleNamespace(used=1), tool_calls=0, current_tool="", index=1,
        parent=types.SimpleNamespace(touch=touched.append),
        emit=lambda event, **data: events.append(event))
    stage.heartbeat(child, 0.01, 10)
    assert events == [] and touched == []


@pytest.mark.hardening
def test_a_stale_heartbeat_beats_stale_beats_minus_one_times_then_stops(stage):
    """The count starts at the child's progress when the heartbeat starts: with no
    progress, beats 1 and 2 touch the parent and beat 3 stops it (stale_beats=3)."""
    events, touched = [], []
    child = types.SimpleNamespace(
        finished=threading.Event(), stop=threading.Event(), lock=threading.Lock(),
        budget=types.SimpleNamespace(used=1), tool_calls=0, current_tool="", index=1,
        parent=types.SimpleNamespace(touch=touched.append),
        emit=lambda event, **data: events.append((event, data)))
    stage.heartbeat(child, 0.01, 3)
    assert [event for event, _ in events] == ["heartbeat", "heartbeat", "heartbeat_stopped"]
    assert events[-1][1] == {"beats": 3} and len(touched) == 2


@pytest.mark.hardening
def test_the_heartbeat_stops_after_stale_beats_without_progress(stage, work, progress,
                                                                monkeypatch, capsys):
    ended, seen, go = ended_heartbeats(stage, monkeypatch), {}, work / "go"
    # The first answer waits for a first beat: the heartbeat has then seen the child
    # before its command started, so it counts the beats from that change on.
    first_beat = lambda: progress.wait_for(lambda events: any(
        e["event"] == "heartbeat" for e in events))
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="stuck"),
                                       waiting_child(go, first_beat))) as server:
        session = agent(stage, server, heartbeat_interval=0.05, stale_beats=10)
        watcher = release_when(progress, lambda events: any(
            e["event"] == "heartbeat_stopped" for e in events), go, seen)
        assert run(stage, session)
        watcher.join()
    assert seen["ok"], "the heartbeat never stopped"
    assert ended.wait(10)
    events = progress.events
    stopped = next(i for i, e in enumerate(events) if e["event"] == "heartbeat_stopped")
    assert events[stopped]["beats"] == 10
    assert len(terminal_beats(events[:stopped])) == 10     # stale 0 … 9: then it stops
    assert not any(e["event"].startswith("heartbeat") for e in events[stopped + 1:])
    assert "    ├─ heartbeat stopped: no progress in 10 beats" in capsys.readouterr().out


# ── Ctrl-C ────────────────────────────────────────────────────────────────

def eventually(condition, timeout: float = 10.0) -> bool:
    """Poll for a condition that no event announces (e.g. a request the server got)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def ctrl_c_when(ready, sent: dict) -> threading.Thread:
    """Ctrl-C for the main thread, sent from a helper thread once `ready()` is true (or
    gave up: the turn must end either way). `sent` records whether it was ready, and when."""
    main_thread = threading.main_thread().ident

    def send():
        sent["ready"] = ready()
        sent["at"] = time.monotonic()
        signal.pthread_kill(main_thread, signal.SIGINT)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread



def test_ctrl_c_returns_at_once_and_stopped_children_make_no_more_calls(stage, work, progress,
                                                                       ctrl_c_raises, capsys):
    """Both editions: the turn ends at once with every call answered, and a child whose
    command was running makes no model call and runs no tool after it (the teaching
    edition lets the command end on its own; the hardened one kills it)."""
    commands = {goal: f"echo $$ > {goal}.pid; sleep 3; echo done > {goal}.out"
                for goal in ("one", "two")}
    later = call("terminal", {"command": "echo ran > later.out"})
    children = lambda goal, calls: reply("", call("terminal", {"command": commands[goal]})) \
        if calls == 0 else reply("", later)
    tasks = [{"goal": "one"}, {"goal": "two"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session, sent = agent(stage, server), {}
        sender = ctrl_c_when(lambda: pid_in_file(work / "one.pid") is not None
                             and pid_in_file(work / "two.pid") is not None, sent)
        with pytest.raises(KeyboardInterrupt):
            run(stage, session)
        stopped_after = time.monotonic() - sent["at"]
        reported = len(progress.events)
        sender.join()
        assert sent["ready"], "the children's commands never ran"
        pids = [pid_in_file(work / f"{goal}.pid") for goal in commands]
        assert all(dies_soon(pid) for pid in pids), "a child's command never ended"
        time.sleep(0.5)                 # time for a child that wrongly goes on to ask again
        assert len(server.requests) == 3                # no model call after Ctrl-C
        assert len(progress.events) == reported, "a stopped child still reported progress"
    assert stopped_after < 2, "Ctrl-C waited for the children's commands"
    tree = tree_of(capsys.readouterr().out)     # the terminal echoes ^C after the last line:
    assert_well_formed(tree)                    # what follows starts on a fresh line
    assert tree[4] == "" and len(tree) > 5 and all(tree[5:]), tree
    assert tree[-1] == "    └─ 0 of 2 sub-agent(s) completed"
    assert not (work / "later.out").exists()
    assert pairing_problems(session.messages) == []
    assert session.messages[-1]["tool_call_id"] == "d1" \
        and "interrupted" in session.messages[-1]["content"]


def test_a_child_stopped_while_its_model_answers_runs_none_of_the_calls(stage, work):
    """The stop event is set while the child waits for its model; the answer that still
    arrives asks for a write and a command: neither runs, every call is answered, and the
    child's status is interrupted (its thread raised KeyboardInterrupt before the first call)."""
    asked, stopped = threading.Event(), threading.Event()
    late = reply("", call("write_file", {"path": "late.txt", "content": "x"}),
                 call("terminal", {"command": "echo ran > late.out"}))

    def children(goal, calls):
        asked.set()
        stopped.wait(10)                            # answer only once the child is stopped
        return late
    with FakeOpenAI(responder=endpoint(stage, [], children)) as server:
        session = agent(stage, server)
        parent = stage.Delegator(session, stage.IterationBudget(30))
        child = stage.build_child_agent(parent, {"goal": "slow", "context": "",
                                                 "toolsets": ["terminal", "file"]}, 1, 1)
        threading.Thread(target=contextvars.Context().run, args=(stage.run_child, child),
                         daemon=True).start()
        assert asked.wait(10), "the child never asked its model"
        child.stop.set()
        stopped.set()
        assert child.finished.wait(10), "the child never ended"
    assert not (work / "late.txt").exists() and not (work / "late.out").exists()
    assert (child.result["status"], child.result["note"]) == (
        "interrupted", "stopped by the user (Ctrl-C)")
    assert child.result["tool_calls"] == 0 and pairing_problems(child.messages) == []


@pytest.mark.hardening
def test_ctrl_c_kills_the_childrens_commands_and_keeps_the_parent_valid(stage, work, progress,
                                                                       ctrl_c_raises):
    commands = {goal: f"echo $$ > {goal}.pid; exec sleep 30" for goal in ("one", "two")}
    children = lambda goal, calls: reply("", call("terminal", {"command": commands[goal]}))
    tasks = [{"goal": "one"}, {"goal": "two"}]
    with FakeOpenAI(responder=endpoint(stage, delegating(tasks=tasks), children)) as server:
        session = agent(stage, server)
        sent = {}
        sender = ctrl_c_when(lambda: pid_in_file(work / "one.pid") is not None
                             and pid_in_file(work / "two.pid") is not None
                             and progress.wait_for(lambda e: len(
                                 [x for x in e if x["event"] == "tool_started"]) == 2), sent)
        with pytest.raises(KeyboardInterrupt):
            run(stage, session)
        stopped_after = time.monotonic() - sent["at"]
        sender.join()
        assert sent["ready"], "the children's commands never ran"
        pids = [int((work / f"{goal}.pid").read_text()) for goal in ("one", "two")]
        try:
            assert all(dies_soon(pid) for pid in pids), "a child's command outlived Ctrl-C"
        finally:
            for pid in pids:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        assert len(server.requests) == 3                # no model call after Ctrl-C
    assert stopped_after < 10, "Ctrl-C waited for the 30 s commands"
    finished = progress.of("finished")
    assert sorted(e["index"] for e in finished) == [1, 2]
    assert {e["status"] for e in finished} == {"interrupted"}
    assert pairing_problems(session.messages) == []
    assert session.messages[-1]["tool_call_id"] == "d1" \
        and "interrupted" in session.messages[-1]["content"]


@pytest.mark.hardening
def test_ctrl_c_gives_up_on_a_child_still_waiting_for_the_endpoint(stage, work, progress,
                                                                  monkeypatch, ctrl_c_raises):
    monkeypatch.setattr(stage, "CHILD_STOP_GRACE", 0.2)
    loops_ended = threading.Event()
    real_loop = stage.child_loop

    def child_loop(child):
        try:
            return real_loop(child)
        finally:
            loops_ended.set()
    monkeypatch.setattr(stage, "child_loop", child_loop)
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="waits"),
                                       lambda goal, calls: no_answer())) as server:
        session = agent(stage, server)
        sent = {}
        sender = ctrl_c_when(lambda: eventually(lambda: child_requests(stage, server)), sent)
        with pytest.raises(KeyboardInterrupt):
            run(stage, session)
        sender.join()
        assert sent["ready"], "the child never asked the endpoint"
        server.released.set()                       # the child's request fails now
        assert loops_ended.wait(10), "the child never ended"
    finished = progress.of("finished")
    assert len(finished) == 1, finished                 # its late report is dropped
    assert (finished[0]["status"], finished[0]["answer"]) == (
        "interrupted", "stopped by the user (Ctrl-C); no longer waited for")
    assert len(server.requests) == 2 and pairing_problems(session.messages) == []


@pytest.mark.hardening
def test_a_stopped_child_runs_none_of_the_calls_its_late_answer_brings(
        stage, work, progress, monkeypatch, ctrl_c_raises):
    """Ctrl-C while the child waits for its model: the answer that still arrives asks for
    a write and a command; neither runs, and the child reports itself interrupted."""
    monkeypatch.setattr(stage, "CHILD_STOP_GRACE", 30.0)    # wait for its own report
    asked, stopping, loops_ended = threading.Event(), threading.Event(), threading.Event()
    real_stop, real_loop = stage.stop_children, stage.child_loop

    def stop_children(children):
        for child in children:
            child.stop.set()
        stopping.set()
        real_stop(children)

    def child_loop(child):
        try:
            return real_loop(child)
        finally:
            loops_ended.set()
    monkeypatch.setattr(stage, "stop_children", stop_children)
    monkeypatch.setattr(stage, "child_loop", child_loop)
    late = reply("", call("write_file", {"path": "late.txt", "content": "x"}),
                 call("terminal", {"command": "echo ran > late.out"}))

    def children(goal, calls):
        asked.set()
        stopping.wait(10)                           # answer only once the child is stopped
        return late
    with FakeOpenAI(responder=endpoint(stage, delegating(goal="slow"), children)) as server:
        session, sent = agent(stage, server), {}
        sender = ctrl_c_when(lambda: asked.wait(10), sent)
        with pytest.raises(KeyboardInterrupt):
            run(stage, session)
        sender.join()
        assert sent["ready"] and loops_ended.wait(10)
    assert not (work / "late.txt").exists() and not (work / "late.out").exists()
    assert progress.of("tool_started") == []
    assert [(e["status"], e["answer"]) for e in progress.of("finished")] == [
        ("interrupted", "stopped by the user (Ctrl-C)")]
    assert len(server.requests) == 2 and pairing_problems(session.messages) == []


def test_a_real_process_ctrl_c_stops_the_children_and_keeps_the_repl(tmp_path):
    stage_name = STAGES[-1]
    proc, pids = start_agent(stage_name, tmp_path), []
    try:
        type_line(proc, b"delegate $ echo $$ > one.pid; exec sleep 30 | "
                        b"$ echo $$ > two.pid; exec sleep 30")
        for name in ("one.pid", "two.pid"):
            pids.append(pid_of_running_command(proc, tmp_path / name, "no child ran"))
        proc.send_signal(signal.SIGINT)
        type_line(proc, b"$ echo after > after.txt")
        type_line(proc, b"/quit")
        out, err = (text.decode("utf-8") for text in proc.communicate(timeout=60))
        assert proc.returncode == 0 and "Traceback" not in out + err, err
        assert "[turn cancelled]" in out and "├─ [1] interrupted after 1 model call(s)" in out
        assert "├─ [2] interrupted after 1 model call(s)" in out
        assert "\n    └─ 0 of 2 sub-agent(s) completed\n" in out
        assert (tmp_path / "after.txt").read_text() == "after\n"
        assert all(dies_soon(pid) for pid in pids), "Ctrl-C left a child's command running"
    finally:
        proc.kill()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ── the command line and the offline model ────────────────────────────────

def test_the_offline_model_delegates_one_goal_or_several(stage, work):
    assert stage.offline_plan("delegate $ echo hi") == ("delegate_task", {"goal": "$ echo hi"})
    assert stage.offline_plan("delegate $ echo a | $ echo b") == (
        "delegate_task", {"tasks": [{"goal": "$ echo a"}, {"goal": "$ echo b"}]})
    assert stage.offline_plan("delegate") is None and stage.offline_plan("delegate  ") is None
    one = run_main(stage, "-p", "delegate $ echo hi")
    assert one.returncode == 0
    assert "    ├─ sub-agent started: $ echo hi\n" in one.stdout
    child, budget = one.stdout.splitlines()[-2:]    # the model's answer: each child, the budget
    assert "1" in child and "completed" in child and child.endswith(
        "The command exited with code 0; first line of output: hi")
    assert "3 of 30 model calls of this turn used (shared budget: children's calls count)" in budget
    two = run_main(stage, "-p", "delegate $ echo a | $ echo b")
    assert "    ├─ [2] sub-agent started: $ echo b\n" in two.stdout
    assert two.stdout.splitlines()[-2].endswith("The command exited with code 0; first line "
                                                  "of output: b")


@pytest.mark.hardening
def test_the_offline_model_names_each_sub_agent_and_its_model_calls(stage, work):
    """The teaching edition's offline model answers with the REPL's summary lines."""
    one = run_main(stage, "-p", "delegate $ echo hi")
    assert ("Sub-agent 1 (completed, 2 model call(s)): The command exited with code 0; first "
            "line of output: hi\nBudget: 3 of 30 model calls of this turn used (shared budget: "
            "children's calls count).\n") in one.stdout
    two = run_main(stage, "-p", "delegate $ echo a | $ echo b")
    assert "Sub-agent 2 (completed, 2 model call(s)): The command exited with code 0; first " \
           "line of output: b\n" in two.stdout


def test_the_flags_reach_the_sessions_delegation_settings(stage, work, monkeypatch):
    seen = []
    monkeypatch.setattr(stage, "run_prompt", lambda session, text: seen.append(session) or 0)
    run_main(stage, "-p", "x")
    run_main(stage, "-p", "x", "--child-budget", "independent", "--child-approvals", "once",
             "--heartbeat-interval", "5")
    default, chosen = (session.delegation for session in seen)
    assert (default.budget_mode, default.child_approvals, default.heartbeat_interval,
            default.stale_beats) == ("shared", "deny", 30, 15)
    assert (chosen.budget_mode, chosen.child_approvals, chosen.heartbeat_interval) == (
        "independent", "once", 5)
    for bad in (("--child-budget", "both"), ("--child-approvals", "always"),
                ("--heartbeat-interval", "0")):
        assert run_main(stage, "-p", "x", *bad).returncode == 2


@pytest.mark.hardening
def test_the_delegation_command_describes_the_settings(stage, work):
    shown = run_main(stage, "-p", "/delegation", "--max-iterations", "9").stdout
    assert ("  budget     shared: children's model calls come out of the turn's 9 "
            "(--max-iterations), 1 kept for the parent") in shown
    assert ("  per child  15 model calls, up to 3 in parallel, depth 1 (a child never "
            "delegates)") in shown
    assert ("  tools      the toolsets asked for (default terminal, file) that this agent has, "
            "never delegate_task, memory, session_search, skill_manage") in shown
    assert "  approvals  a child's dangerous commands: deny (--child-approvals); hardline: " \
           "always blocked" in shown
    assert "  heartbeat  every 30 s; stops after 15 beats without progress" in shown
    other = run_main(stage, "-p", "/delegation", "--child-budget", "independent",
                     "--child-approvals", "once", "--heartbeat-interval", "7").stdout
    assert ("  budget     independent: each child has its own calls; a turn may cost more than "
            "--max-iterations") in other
    assert "dangerous commands: once (--child-approvals)" in other and "every 7 s;" in other


def test_the_delegation_command_shows_the_settings(stage, work):
    shown = run_main(stage, "-p", "/delegation", "--child-budget", "independent",
                     "--child-approvals", "once", "--heartbeat-interval", "7").stdout
    assert "  budget     independent" in shown
    assert "  per child  15 model calls, up to 3 in parallel, depth 1" in shown
    assert "never delegate_task, memory, session_search, skill_manage" in shown
    assert "once (--child-approvals)" in shown and "  heartbeat  every 7 s" in shown


# ── the demo ──────────────────────────────────────────────────────────────

@pytest.mark.parametrize("stage_name", ["s10_subagent_delegation"])  # later stages: own demo
def test_the_teaching_demo_shows_children_limits_and_both_budgets(stage_name, work, capsys):
    stage = load_stage(stage_name)
    before = (os.environ["HOME"], os.environ["PATH"], os.environ["LEARN_HERMES_HOME"])
    session = started_session(stage, "--demo")
    assert stage.run_demo(session) == 0
    captured = capsys.readouterr()
    out = captured.out
    steps = [out.index(f"\n{number}. ") for number in range(1, 5)] + [len(out)]
    parts = [out[start:end] for start, end in zip(steps, steps[1:])]
    for line in ("    ├─ [1] sub-agent started: $ ls -F", "    ├─ [2] sub-agent started: $ cat notes.txt",
                 "    [1] completed: The command exited with code 0; first line of output: notes.txt",
                 "    [2] completed: The command exited with code 0; first line of output: "
                 "Sub-agents start with nothing but their goal."):
        assert line in parts[0].splitlines()
    assert "Tool 'delegate_task' does not exist" in parts[1]
    assert "The tool reported: denied: a sub-agent has nobody to ask" in parts[1]
    assert "[sub-agent 2] denied: " in captured.err
    shared, independent = parts[2], parts[3]
    assert "--child-budget shared" in shared and "--child-budget independent" in independent
    assert "budget_exhausted" in shared and "[3] completed" not in shared
    assert "    [3] completed: " in independent and "budget_exhausted" not in independent
    assert "    3 of 4 model calls of this turn used (shared budget: " in shared     # 1 + 2 + 1 kept
    assert "    1 of 4 model calls of this turn used (independent budget: " in independent
    assert (os.environ["HOME"], os.environ["PATH"], os.environ["LEARN_HERMES_HOME"]) == before
    assert os.getcwd() == str(work) and list(work.iterdir()) == [] and marks(work) == []
    assert stage.APPROVAL_CONTEXT.get() is None and stage.DELEGATION.get() is None


@pytest.mark.hardening
@pytest.mark.parametrize("stage_name", ["hardened/s10_subagent_delegation"])
def test_the_demo_shows_children_limits_and_both_budgets(stage_name, work, capsys):
    stage = load_stage(stage_name)
    before = (os.environ["HOME"], os.environ["PATH"], os.environ["LEARN_HERMES_HOME"])
    session = started_session(stage, "--demo")
    assert stage.run_demo(session) == 0
    captured = capsys.readouterr()
    out = captured.out
    steps = [out.index(f"\n{number}. ") for number in range(1, 5)] + [len(out)]
    parts = [out[start:end] for start, end in zip(steps, steps[1:])]
    for line in ("    ├─ [1] sub-agent started: $ ls -F", "    ├─ [2] sub-agent started: $ cat notes.txt",
                 "    [1] completed: The command exited with code 0; first line of output: notes.txt",
                 "    [2] completed: The command exited with code 0; first line of output: "
                 "Sub-agents start with nothing but their goal.",
                 "The parent's conversation: system user assistant tool assistant. No child "
                 "message is in it."):
        assert line in parts[0].splitlines()
    assert "Tool 'delegate_task' does not exist" in parts[1]
    assert "The tool reported: denied: a sub-agent has nobody to ask" in parts[2]
    assert "The tool reported: BLOCKED (hardline): " in parts[2]
    assert "build still exists: True" in parts[2] and "[sub-agent 1] denied: " in captured.err
    shared, independent = parts[3].split("--child-budget independent")
    assert "budget_exhausted" in shared and "children completed: 3 of 3" not in shared
    assert "children completed: 3 of 3" in independent and "budget_exhausted" not in independent
    assert "    3 of 4 model calls of this turn used (shared budget: " in shared     # 1 + 2 + 1 kept
    assert "    1 of 4 model calls of this turn used (independent budget: " in independent
    assert (os.environ["HOME"], os.environ["PATH"], os.environ["LEARN_HERMES_HOME"]) == before
    assert os.getcwd() == str(work) and list(work.iterdir()) == [] and marks(work) == []
    assert stage.APPROVAL_CONTEXT.get() is None and stage.DELEGATION.get() is None


def test_yolo_for_one_session_is_that_sessions_only(stage):
    """/yolo turns YOLO on for one session id: another session, and a context with no
    session (a child's), still ask."""
    permissions = stage.Permissions()
    permissions.session_yolo = {"chosen"}

    def yolo_for(session_id):
        session = types.SimpleNamespace(session_id=session_id)
        return stage.ApprovalContext(permissions, session).yolo_source()

    assert yolo_for("chosen") == "/yolo, this session"
    assert yolo_for("other") is None and yolo_for(None) is None
