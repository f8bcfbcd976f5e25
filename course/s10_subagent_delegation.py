# s10_subagent_delegation: what this stage adds, changes and removes. course/build.py writes the stage files.

#: docstring
"""s10 · Sub-agent delegation — children with their own context, fewer tools, one budget.

What this stage adds
    delegate_task hands a task to a child agent, or up to 3 to children in parallel. A
    child starts with a fresh message list, gets the tools it asked for that the parent
    has, minus DELEGATE_BLOCKED_TOOLS, and makes at most 15 model calls, each also paid
    from the parent's budget (shared mode). Its dangerous commands are denied.

    parent ──delegate_task(tasks=[a, b])──▶ build_child_agent() × 2
        budget: IterationBudget(--max-iterations)        │ fresh messages: [prompt, goal]
              ▲                                          │ tools: asked ∩ parent's − blocked
              │ ChildBudget.consume(): 15 own, and       ▼
              └──────── one of the parent's each ── [1] child ─┐ threads, depth 1:
                                                    [2] child ─┤ approvals: deny (no human)
        tool result  ◀── [{status, answer ≤ 24,000 chars}] ────┘

Reading guide
    "[s10] Sub-agent delegation" is the lesson, from delegate_task() down; the progress
    tree and /delegation are plumbing. agents/hardened/ adds the details.
    {changed elsewhere}
Run
    python agents/s10_subagent_delegation.py --demo   # the walk-through
Chapter
    docs/en/s10-subagent-delegation.md
"""

#: docstring | hardened
"""s10 · Sub-agent delegation — children with their own context, fewer tools, one budget.

What this stage adds
    The delegate_task tool hands a self-contained task to a child agent, or up to 3
    tasks to children that run in parallel. A child starts with a fresh message list (a
    task prompt, then the goal), never the parent's SOUL, memory or conversation, and
    gets the toolsets it asked for that the parent has, minus DELEGATE_BLOCKED_TOOLS.
    It makes at most 15 model calls; with the shared budget (the default) each is also
    paid from the parent's. Its dangerous commands are denied: nobody can approve them.

    parent ──delegate_task(tasks=[a, b])──▶ build_child_agent() × 2
        budget: IterationBudget(--max-iterations)        │ fresh messages: [prompt, goal]
              ▲                                          │ tools: asked ∩ parent's − blocked
              │ ChildBudget.consume(): 15 own, and       ▼
              └──────── one of the parent's each ── [1] child ─┐ threads, depth 1:
                                                    [2] child ─┤ approvals: deny (no human)
        tool result  ◀── [{status, answer ≤ 24,000 chars}] ────┘ heartbeat every 30 s

Reading guide
    Start right below the imports: "[s10] Sub-agent delegation" is this stage's lesson:
    delegate_task(), then build_child_agent() (what a child gets), ChildBudget (how it
    pays), run_child() and run_children() (threads, statuses, Ctrl-C). "[s10] Delegation
    details" is the hardening: checking tasks and toolsets, ChildApprovals, progress
    events, the heartbeat, stopping children. Earlier stages follow, newest first, then
    the plumbing (the progress tree and /delegation are under "[s10] Delegation
    commands"); the wiring at the very end registers delegate_task.
    {changed elsewhere}
Run
    python agents/s10_subagent_delegation.py          # REPL (offline model without a key)
    python agents/s10_subagent_delegation.py --demo   # the walk-through
    python agents/s10_subagent_delegation.py -p 'delegate $ ls | $ pwd'
    python agents/s10_subagent_delegation.py --max-iterations 4 --child-budget independent
Chapter
    docs/en/s10-subagent-delegation.md
"""

#: imports
import argparse
import base64
import binascii
import bisect
import codecs
import contextvars
import copy
import datetime
import email.utils
import fnmatch
import functools
import glob
import hashlib
import html
import itertools
import json
import os
import platform
import posixpath
import random
import re
import select
import shutil
import signal
import sqlite3
import stat
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
import yaml
from rich.console import Console
from rich.panel import Panel
from rich.text import Text
from typing import Callable, NamedTuple

#: section Sub-agent delegation

MAX_CHILD_ITERATIONS = 15               # model calls one child may make, whatever the budget
MAX_PARALLEL_CHILDREN = 3               # tasks in one delegate_task call; more is an error
MAX_CHILD_DEPTH = 1                     # the parent is depth 0, a child 1: a child never delegates
MAX_CHILD_ANSWER_CHARS = 24_000         # of a child's answer, the parent receives this much
DEFAULT_CHILD_TOOLSETS = ("terminal", "file")   # when the task names none
# A child does not delegate, and does not touch the agent's long-term state: what it
# remembers (memory), which skills it has (skill_manage), or its earlier conversations
# (session_search: the parent's history, and a SQLite connection only its thread may use).
DELEGATE_BLOCKED_TOOLS = frozenset({"delegate_task", "memory", "skill_manage",
                                    "session_search"})
PARENT_RESERVE = 1                      # shared budget: calls children leave for the parent
CHILD_BUDGET_MODES = ("shared", "independent")  # --child-budget
CHILD_APPROVALS = ("deny", "once")      # --child-approvals: a child's dangerous commands
CHILD_STATUSES = ("completed", "failed", "iteration_limit", "budget_exhausted", "error",
                  "interrupted")
HEARTBEAT_INTERVAL = 30.0               # seconds between heartbeats (--heartbeat-interval)
HEARTBEAT_STALE_BEATS = 15              # beats without progress before the heartbeat stops
PREVIEW_CHARS = 60                      # of a goal or a tool call, the progress tree shows this
CHILD_SYSTEM_PROMPT = (
    "You are a sub-agent. Another agent gave you one task: the user message. Do it with "
    "your tools, then answer with what you found or did, briefly and completely; only "
    "your final answer reaches the other agent. Nobody can answer questions from you, "
    "and commands that need a person's approval are refused.")


#: teaching
# The Delegator calling delegate_task: like s09's APPROVAL_CONTEXT, each thread sets its own.
DELEGATION: contextvars.ContextVar = contextvars.ContextVar("delegation", default=None)
#: hardened
# What delegate_task needs from the agent calling it; DELEGATION holds it for the code
# running now. A ContextVar like s09's APPROVAL_CONTEXT: each child's thread sets its own.
DELEGATION: contextvars.ContextVar = contextvars.ContextVar("delegation", default=None)
#: hardened
# Set in a child's thread: the event its parent sets to stop it (Ctrl-C).
STOP_REQUESTED: contextvars.ContextVar = contextvars.ContextVar("stop_requested", default=None)

#: teaching
# Held while a child reports and while Ctrl-C stops the children: no line after the tree ends.
PROGRESS_LOCK = threading.Lock()


#: teaching
def delegate_task(goal: str | None = None, context: str | None = None,
                  toolsets: list | None = None, tasks: list | None = None) -> str:
    """The tool: one task, or up to 3 in `tasks` run in parallel; returns each child's result."""
    parent = DELEGATION.get()
    if parent is None:
        return error_result("delegate_task runs only inside an agent's turn")
    if parent.depth >= MAX_CHILD_DEPTH:
        return error_result(f"delegation depth limit reached: a sub-agent (depth "
                            f"{parent.depth}) cannot delegate. Do the task yourself.")
    specs, problem = task_specs(goal, context, toolsets, tasks)
    empty = [spec for spec in specs if not child_tools(parent.session.tools, spec["toolsets"])]
    if empty:                                   # unknown, not the parent's, or only blocked ones
        problem = (f"no tools left in {', '.join(map(str, empty[0]['toolsets']))} once the "
                   f"tools a sub-agent never gets ({', '.join(sorted(DELEGATE_BLOCKED_TOOLS))}) "
                   f"are removed.")
    if problem is not None:
        return error_result(problem + " Nothing was delegated.")
    children = [build_child_agent(parent, spec, index, len(specs))
                for index, spec in enumerate(specs, start=1)]
    results = run_children(parent, children)
    mode, counted = parent.session.delegation.budget_mode, parent.budget.used
    budget = (f"{counted} of {parent.budget.max_total} model calls of this turn used ({mode} "
              f"budget: children's calls {'count' if mode == 'shared' else 'do not count'})")
    return json.dumps({"children": results, "budget": budget}, ensure_ascii=False)

#: hardened
def delegate_task(goal: str | None = None, context: str | None = None,
                  toolsets: list | None = None, tasks: list | None = None) -> str:
    """The tool: one task (goal, context, toolsets) or up to MAX_PARALLEL_CHILDREN in
    `tasks`, run in parallel. The parent gets each child's final answer and status."""
    parent = DELEGATION.get()
    if parent is None:
        return error_result("delegate_task runs only inside an agent's turn")
    if parent.depth >= MAX_CHILD_DEPTH:
        return error_result(f"delegation depth limit reached: a sub-agent (depth "
                            f"{parent.depth}) cannot delegate. Do the task yourself.")
    specs, problem = task_specs(goal, context, toolsets, tasks)
    if problem is None:
        children, problem = build_children(parent, specs)
    if problem is not None:
        return error_result(problem + " Nothing was delegated.")
    results = run_children(parent, children)
    return json.dumps({"children": results, "budget": parent.budget_line()},
                      ensure_ascii=False)


def build_child_agent(parent: Delegator, spec: dict, index: int, count: int) -> Child:
    """A child: a short prompt with the context (never the parent's SOUL, memory or
    conversation), then the goal; the tools of its toolsets, minus the blocked ones."""
    tools = child_tools(parent.session.tools, spec["toolsets"])
    prompt = CHILD_SYSTEM_PROMPT + f"\n\nWorking directory: {current_directory()}"
    if spec["context"]:
        prompt += f"\n\nContext from the agent that delegated:\n{spec['context']}"
    messages = [{"role": "system", "content": prompt}, {"role": "user", "content": spec["goal"]}]
    return Child(parent, index, count, spec["goal"], tools, messages)


#: teaching
class Child:
    """One sub-agent: its own messages, tools, session id, stop event and budget."""

    def __init__(self, parent: Delegator, index: int, count: int, goal: str, tools: list,
                 messages: list):
        self.parent, self.index, self.count, self.goal = parent, index, count, goal
        self.tools, self.messages = tools, messages
        self.session_id = new_session_id()      # its own: approvals never reach the parent
        self.permissions = approval_context().permissions   # the parent's policy object
        self.client, self.model = parent.session.client, parent.session.model
        self.stop, self.finished = threading.Event(), threading.Event()  # stop: Ctrl-C
        shared = parent.budget if parent.session.delegation.budget_mode == "shared" else None
        self.budget = ChildBudget(shared, self.stop)
        self.tool_calls, self.succeeded, self.result = 0, 0, None

    def emit(self, event: str, **data) -> None:
        with PROGRESS_LOCK:                     # a line is printed before Ctrl-C or not at all
            if not self.stop.is_set():          # after Ctrl-C the parent has moved on
                self.parent.on_progress({"event": event, "index": self.index,
                                         "count": self.count, **data})

#: hardened
class Child:
    """One sub-agent: its own messages, tools, session id and budget; its parent's
    endpoint and model. In shared mode each of its model calls is also paid from the
    parent's budget."""

    def __init__(self, parent: Delegator, index: int, count: int, goal: str, tools: list,
                 messages: list):
        self.parent, self.index, self.count, self.goal = parent, index, count, goal
        self.tools, self.messages = tools, messages
        self.session_id = new_session_id()      # its own: approvals never reach the parent
        self.permissions = approval_context().permissions   # the parent's policy object
        self.client, self.model = parent.session.client, parent.session.model
        self.stop = threading.Event()           # set by the parent: Ctrl-C
        self.finished = threading.Event()
        self.lock = threading.RLock()           # its reports, or the parent giving up
        shared = parent.budget if parent.session.delegation.budget_mode == "shared" else None
        self.budget = ChildBudget(shared, self.stop)
        self.tool_calls, self.succeeded, self.current_tool = 0, 0, None
        self.abandoned = False                  # the parent stopped waiting for it
        self.result: dict | None = None
        self.crash = "its thread ended without a result"

    def emit(self, event: str, **data) -> None:
        with self.lock:                         # once abandoned, no line after the tree's end
            if not self.abandoned:
                self.parent.on_progress({"event": event, "index": self.index,
                                         "count": self.count, **data})


#: teaching
class ChildBudget:
    """A child's model calls: at most MAX_CHILD_ITERATIONS, in shared mode each also paid
    from the parent's budget, which keeps PARENT_RESERVE calls. None once it is stopped."""

    def __init__(self, shared: IterationBudget | None, stop: threading.Event):
        self.shared, self.stop = shared, stop
        self.used, self.parent_ran_out = 0, False

    def consume(self, keep: int = 0) -> bool:
        if self.stop.is_set() or self.used >= MAX_CHILD_ITERATIONS:
            return False
        if self.shared is not None and not self.shared.consume(keep=PARENT_RESERVE):
            self.parent_ran_out = True
            return False
        self.used += 1
        return True

#: hardened
class ChildBudget:
    """A child's model calls: at most MAX_CHILD_ITERATIONS of its own, and in shared
    mode each one also taken from the parent's budget, leaving PARENT_RESERVE calls for
    the parent's own answer. A stopped child gets no more calls. The loop uses it as it
    uses an IterationBudget (consume, used, max_total); it holds one for its own calls
    rather than being one."""

    def __init__(self, shared: IterationBudget | None, stop: threading.Event):
        self.own = IterationBudget(MAX_CHILD_ITERATIONS)
        self.shared, self.stop = shared, stop
        self.parent_ran_out = False

    def consume(self, keep: int = 0) -> bool:
        if self.stop.is_set() or not self.own.consume():
            return False
        if self.shared is None or self.shared.consume(keep=PARENT_RESERVE):
            return True
        self.own.refund()                       # not made: it does not count as the child's
        self.parent_ran_out = True
        return False

    @property
    def max_total(self) -> int:
        return self.own.max_total

    @property
    def used(self) -> int:
        return self.own.used


#: teaching
def run_child(child: Child) -> None:
    """A child's thread, with its own approvals and depth. A crash is the child's error."""
    APPROVAL_CONTEXT.set(ChildApprovals(child))
    DELEGATION.set(Delegator(child, child.budget, child.parent.depth + 1))
    outcome = ("error", "", "the sub-agent failed")
    try:
        child.emit("started", goal=child.goal)
        outcome = child_loop(child)
        child.emit("finished", status=outcome[0], model_calls=child.budget.used,
                   answer=first_line(outcome[1] or outcome[2], 100))
    except Exception as exc:                    # a crash, or a failing progress callback
        outcome = ("error", "", f"the sub-agent failed: {type(exc).__name__}: {first_line(exc)}")
    finally:
        child.result = child_result(child, *outcome)
        child.finished.set()

#: hardened
def run_child(child: Child) -> None:
    """A child's thread. Its context is its own: approvals with no human to ask, depth
    parent + 1, and the stop event that a running command watches."""
    APPROVAL_CONTEXT.set(ChildApprovals(child))
    DELEGATION.set(Delegator(child, child.budget, child.parent.depth + 1))
    STOP_REQUESTED.set(child.stop)
    start_heartbeat(child)
    try:
        child.emit("started", goal=child.goal)
        status, answer, note = child_loop(child)
        with child.lock:                        # the parent may be giving up on it just now
            child.result = child_result(child, status, answer, note)
            child.emit("finished", status=status, model_calls=child.budget.used,
                       answer=first_line(answer or note, 100))
            child.finished.set()
    except Exception as exc:                    # a failing progress callback, say:
        child.crash = f"{type(exc).__name__}: {first_line(exc)}"    # run_children() says so
    finally:
        child.finished.set()                    # also after an error: the heartbeat ends


#: teaching
def child_loop(child: Child) -> tuple[str, str, str]:
    """The child's loop (with s05's compression, s06's retries): (status, answer, note)."""
    try:
        stopped = run_conversation(child.client, child.model, child.messages,
                                   MAX_CHILD_ITERATIONS, child_event_handler(child),
                                   child.tools, child.parent.session.context_length,
                                   child.parent.session.recovery, budget=child.budget)
    except KeyboardInterrupt:                   # child_event_handler(): the parent's Ctrl-C
        return "interrupted", "", "stopped by the user (Ctrl-C)"
    except (openai.OpenAIError, json.JSONDecodeError) as exc:
        return "error", "", explain_api_failure(exc, str(child.client.base_url), child.model)
    return child_outcome(child, stopped)

#: hardened
def child_loop(child: Child) -> tuple[str, str, str]:
    """The child's own agent loop (with s05's compression and s06's retries and
    guardrails), and its (status, answer, note). Nothing a child does raises into its
    parent: an endpoint error or a crash becomes the status "error"."""
    try:
        stopped = run_conversation(child.client, child.model, child.messages,
                                   MAX_CHILD_ITERATIONS, child_event_handler(child),
                                   child.tools, child.parent.session.context_length,
                                   child_recovery(child), budget=child.budget)
        return child_outcome(child, stopped)
    except KeyboardInterrupt:                   # the parent's Ctrl-C, seen in this thread
        return "interrupted", partial_answer(child), "stopped by the user (Ctrl-C)"
    except (openai.OpenAIError, json.JSONDecodeError) as exc:
        return "error", partial_answer(child), explain_api_failure(
            exc, str(child.client.base_url), child.model)
    except Exception as exc:
        return "error", partial_answer(child), (f"the sub-agent failed: {type(exc).__name__}: "
                                                f"{first_line(exc)}")


#: teaching
def run_children(parent: Delegator, children: list) -> list[dict]:
    """Start every child in its own thread and wait for all of them, touching the parent
    (the heartbeat) while they work. Ctrl-C stops them: no more model or tool calls."""
    try:
        for child in children:
            threading.Thread(target=contextvars.Context().run, args=(run_child, child),
                             daemon=True).start()   # a new, empty context for run_child()
        for child in children:                  # Ctrl-C interrupts the wait
            while not child.finished.wait(parent.session.delegation.heartbeat_interval):
                parent.touch(f"{len(children)} sub-agent(s) working, "
                             f"{sum(c.budget.used for c in children)} model call(s) so far")
    finally:                                    # also after Ctrl-C or a failed start:
        with PROGRESS_LOCK:                     # stop the children that still run (their
            for child in children:              # command ends on its own), then close the
                child.stop.set()                # tree: no child's line comes after that
        done = sum(bool(c.result) and c.result["status"] == "completed" for c in children)
        parent.on_progress({"event": "closed", "count": len(children), "completed": done,
                            "stopped": not all(c.finished.is_set() for c in children)})
    return [child.result for child in children]     # run_child() always sets it

#: hardened
def run_children(parent: Delegator, children: list) -> list[dict]:
    """Start every child in its own thread and wait for all of them. Ctrl-C stops them:
    each one's running command is killed and it makes no more model calls."""
    try:
        for child in children:
            # A new, empty context: the thread sets its own approvals, depth and stop event.
            threading.Thread(target=contextvars.Context().run, args=(run_child, child),
                             daemon=True).start()
        for child in children:
            while not child.finished.wait(0.1):     # a Ctrl-C arrives between two waits
                pass
    except BaseException:                       # Ctrl-C, or a thread that could not start
        try:
            parent.on_progress({"event": "stopping", "count": len(children)})
        finally:
            stop_children(children)
        close_tree(parent, children, stopped=True)
        raise
    close_tree(parent, children)
    return [child.result or child_result(child, "error", "", f"the sub-agent failed: "
                                                             f"{child.crash}")
            for child in children]


#: hardened
def close_tree(parent: Delegator, children: list, stopped: bool = False) -> None:
    """The progress tree's one closing line, last: no child reports any more."""
    done = sum(bool(child.result) and child.result["status"] == "completed"
               for child in children)
    parent.on_progress({"event": "closed", "count": len(children), "completed": done,
                        "stopped": stopped})


#: teaching
class DelegationSettings:
    """How this agent delegates, fixed at start-up (stale_beats: the hardened heartbeat's)."""

    def __init__(self, budget_mode="shared", child_approvals="deny",
                 heartbeat_interval=HEARTBEAT_INTERVAL, stale_beats=HEARTBEAT_STALE_BEATS):
        self.budget_mode, self.child_approvals = budget_mode, child_approvals
        self.heartbeat_interval, self.stale_beats = heartbeat_interval, stale_beats

#: hardened
class DelegationSettings:
    """How this agent delegates, fixed by main() at start-up."""

    def __init__(self, budget_mode: str = "shared", child_approvals: str = "deny",
                 heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 stale_beats: int = HEARTBEAT_STALE_BEATS):
        self.budget_mode = budget_mode          # one of CHILD_BUDGET_MODES
        self.child_approvals = child_approvals  # one of CHILD_APPROVALS
        self.heartbeat_interval = heartbeat_interval
        self.stale_beats = stale_beats


#: teaching
class Delegator:
    """Who calls delegate_task this turn: its session, budget and depth; where progress goes."""

    def __init__(self, session, budget: IterationBudget, depth: int = 0, on_progress=None):
        self.session, self.budget, self.depth = session, budget, depth
        self.on_progress = on_progress or (lambda event: None)

    def touch(self, activity: str) -> None:     # the heartbeat: /delegation shows it
        self.session.last_activity = (time.monotonic(), activity)

#: hardened
class Delegator:
    """The agent that calls delegate_task, during one turn: its session (endpoint, model,
    tools, settings), the turn's budget, its depth and where child progress goes."""

    def __init__(self, session, budget: IterationBudget, depth: int = 0, on_progress=None):
        self.session, self.budget, self.depth = session, budget, depth
        self.on_progress = on_progress or (lambda event: None)

    def touch(self, activity: str) -> None:
        """The heartbeat: the parent is alive, and this is what it waits for."""
        self.session.last_activity = (time.monotonic(), activity)

    def budget_line(self) -> str:
        mode = self.session.delegation.budget_mode
        counted = "count" if mode == "shared" else "do not count"
        return (f"{self.budget.used} of {self.budget.max_total} model calls of this turn used "
                f"({mode} budget: children's calls {counted})")


#: teaching
def child_state_problem(real: Path) -> str | None:
    """Why a child may not write `real`: the agent's state (memory, skills, sessions) is not its."""
    delegation, home = DELEGATION.get(), Path(os.path.realpath(hermes_home()))
    if not delegation or not delegation.depth or (real != home and home not in real.parents):
        return None                             # the parent's own writes, or another folder
    return (f"is in the agent's state folder {tilde(home)}: a sub-agent never changes the "
            f"agent's memory, skills or sessions")


#: hardened
def child_state_problem(real: Path) -> str | None:
    """A sub-agent has no memory or skill_manage tool, and write_file and patch do not
    reach the same files either: nothing in the agent's state folder. Its terminal
    commands pass s09's gate like the parent's: in the teaching edition a command that
    writes there (echo >> …/MEMORY.md) is not refused; the hardened edition refuses a
    command that names the folder."""
    delegation = DELEGATION.get()
    if delegation is None or delegation.depth == 0:     # the parent's own writes
        return None
    home = Path(os.path.realpath(hermes_home()))
    if real != home and home not in real.parents:
        return None
    return (f"is in the agent's state folder {tilde(home)}: a sub-agent never changes the "
            f"agent's memory, skills or sessions")


#: hardened
def stop_if_requested() -> None:
    """In a child's thread, once its parent has stopped it: raise what Ctrl-C raises in
    the main thread, so the same clean-up runs: every open tool call is answered."""
    stop = STOP_REQUESTED.get()
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt


#: teaching
def task_specs(goal, context, toolsets, tasks) -> tuple[list, str | None]:
    """The model's arguments as a list of {goal, context, toolsets}, or what is wrong."""
    if tasks is None and goal is None:
        return [], "give a goal, or tasks (a list of up to 3 {goal, context, toolsets})."
    if tasks is not None and (goal, context, toolsets) != (None, None, None):
        return [], "give either goal (with context, toolsets) or tasks, not both."
    tasks = [{"goal": goal, "context": context, "toolsets": toolsets}] if tasks is None else tasks
    if not tasks:
        return [], "tasks is empty."
    if len(tasks) > MAX_PARALLEL_CHILDREN:
        return [], (f"at most {MAX_PARALLEL_CHILDREN} tasks run in parallel; got "
                    f"{len(tasks)}. Delegate the rest in a later call.")
    specs = []
    for task in tasks:
        task = task if isinstance(task, dict) else {}
        unknown = sorted(set(task) - {"goal", "context", "toolsets"})
        names = list(DEFAULT_CHILD_TOOLSETS) if task.get("toolsets") is None else task["toolsets"]
        if unknown:
            return [], (f"unexpected field(s) {', '.join(unknown)}; a task has goal, "
                        f"context, toolsets.")
        if not isinstance(task.get("goal"), str) or not task["goal"].strip():
            return [], "goal must be a non-empty string."
        if not isinstance(names, list):
            return [], "toolsets must be a list of toolset names."
        if not names:                           # never "no toolsets, so every tool"
            return [], "toolsets is empty: name the toolsets the sub-agent needs."
        specs.append({"goal": task["goal"], "context": str(task.get("context") or ""),
                      "toolsets": names})
    return specs, None

#: hardened
def task_specs(goal, context, toolsets, tasks) -> tuple[list, str | None]:
    """The model's arguments as a list of {goal, context, toolsets}, or an error."""
    if tasks is None:
        if goal is None:
            return [], "give a goal, or tasks (a list of up to 3 {goal, context, toolsets})."
        tasks = [{"goal": goal, "context": context, "toolsets": toolsets}]
    elif goal is not None or context is not None or toolsets is not None:
        return [], "give either goal (with context, toolsets) or tasks, not both."
    if not tasks:
        return [], "tasks is empty."
    if len(tasks) > MAX_PARALLEL_CHILDREN:
        return [], (f"at most {MAX_PARALLEL_CHILDREN} tasks run in parallel; got "
                    f"{len(tasks)}. Delegate the rest in a later call.")
    specs = []
    for number, task in enumerate(tasks, start=1):
        spec, problem = task_spec(task)
        if problem:
            return [], f"task {number}: {problem}" if len(tasks) > 1 else problem
        specs.append(spec)
    return specs, None


#: hardened
def toolset_of(tool: dict) -> str | None:
    entry = REGISTRY.get(tool["function"]["name"])
    return entry.toolset if entry is not None else None


#: teaching
def child_tools(parent_tools: list, toolsets: list) -> list:
    """The parent's offered tools whose toolset was asked for, minus the blocked ones."""
    return [tool for tool in parent_tools
            if (name := tool["function"]["name"]) not in DELEGATE_BLOCKED_TOOLS
            and REGISTRY.get(name).toolset in toolsets]

#: hardened
def child_tools(parent_tools: list, toolsets: list) -> list:
    """The parent's offered tools whose toolset was asked for, minus the blocked ones."""
    return [tool for tool in parent_tools
            if tool["function"]["name"] not in DELEGATE_BLOCKED_TOOLS
            and toolset_of(tool) in toolsets]


#: teaching
class ChildApprovals:
    """A child's ApprovalContext: the parent's policy, its own session id, nobody to ask."""

    def __init__(self, child: Child):
        self.permissions, self.session_id, self.child = child.permissions, child.session_id, child
        self.last_denial = "not approved"       # approve_command() says why it denied

    def yolo_source(self) -> None:
        return None

    def uses_smart_review(self) -> bool:
        return False                            # a model's verdict is no person's answer

    def ask(self, command: str, findings: list[Finding], choices: tuple) -> tuple[str, str]:
        once = self.child.parent.session.delegation.child_approvals == "once" \
            and "session" in choices            # never a finding only a person may approve
        said = "approved once without asking (--child-approvals once)" if once else "denied"
        show_approval_note(f"[sub-agent {self.child.index}] {said}: {described(findings)}")
        return ("once", "") if once else ("deny", "a sub-agent has nobody to ask, and its "
                                          "dangerous commands are denied (--child-approvals deny)")

#: hardened
class ChildApprovals:
    """A child's approval context. It shares the parent's policy object (allowlist.json,
    write root) but has its own session id, so nothing it does lands in the parent's
    session approvals. YOLO and mode off do not reach it, and nobody can be asked: its
    dangerous commands are denied, or with --child-approvals once approved once; a
    command that needs a human is always denied. Only the user's own "always" answers
    (allowlist.json) approve for it, never the smart reviewer. Hardline is blocked
    before all this. It overrides three of ApprovalContext's methods and hands the rest
    to an ApprovalContext of its own (composition: no subclass of a later section)."""

    def __init__(self, child: Child):
        self.context = ApprovalContext(child.permissions, child, read_answer=None)
        self.child = child

    def __getattr__(self, name: str):
        return getattr(self.context, name)      # permissions, session_id, remember(), ...

    def yolo_source(self) -> str | None:
        return None

    def uses_smart_review(self) -> bool:
        return False                            # a model's verdict is no person's answer

    def ask(self, command: str, findings: list[Finding], choices: tuple) -> tuple[str, str]:
        label = f"[sub-agent {self.child.index}]"
        if "session" not in choices:            # a finding that only a person may approve
            return "deny", "it needs a person's answer, and a sub-agent has nobody to ask"
        if self.child.parent.session.delegation.child_approvals == "once":
            show_approval_note(f"{label} approved once without asking (--child-approvals "
                               f"once): {described(findings)}")
            return "once", ""
        show_approval_note(f"{label} denied: {described(findings)}")
        return "deny", ("a sub-agent has nobody to ask, and its dangerous commands are "
                        "denied (--child-approvals deny)")


#: teaching
def child_event_handler(child: Child):
    """The child's loop events as progress events for the parent's tree."""
    def on_event(kind: str, data: dict) -> None:
        if kind == "tool_call":
            if child.stop.is_set():             # Ctrl-C: raise what it raises in the main
                raise KeyboardInterrupt         # thread; the loop answers every open call
            child.tool_calls += 1
            arguments, _ = parse_arguments("", data["arguments"])   # the door's: never raises
            shown = next((value for value in (arguments or {}).values()
                          if isinstance(value, str)), data["arguments"])
            child.emit("tool_started", tool=data["name"], preview=preview(shown))
        elif kind == "tool_result":
            outcome = classify_tool_result(data["name"], data["result"])
            child.succeeded += outcome in ("ok", "landed")
            child.emit("tool_finished", tool=data["name"], outcome=outcome)
    return on_event


#: hardened
def child_event_handler(child: Child):
    """The child's loop events as progress events for the parent."""
    def on_event(kind: str, data: dict) -> None:
        if kind == "tool_call":
            child.tool_calls += 1
            child.current_tool = data["name"]
            child.emit("tool_started", tool=data["name"], preview=call_preview(data["arguments"]))
        elif kind == "tool_result":
            child.current_tool = None
            outcome = classify_tool_result(data["name"], data["result"])
            child.succeeded += outcome in ("ok", "landed")     # child_outcome() asks
            child.emit("tool_finished", tool=data["name"], outcome=outcome)
    return on_event


#: hardened
def call_preview(arguments: str) -> str:
    """The first text argument of a call (a command, a path), short and with hidden
    characters made visible: a child's arguments are the model's text."""
    data, _ = parse_arguments("", arguments)    # the door's parser: never raises
    text = next((value for value in (data or {}).values() if isinstance(value, str)), arguments)
    return preview(text)


def preview(text: str) -> str:
    text = visible(" ".join(str(text).split()))
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


#: teaching
def child_outcome(child: Child, stopped: str) -> tuple[str, str, str]:
    """(status, answer, note) once the child's loop has returned."""
    last = child.messages[-1] if child.messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        if not child.succeeded and (child.tool_calls or not stopped):   # achieved nothing
            return "failed", stopped, "no tool call succeeded" if child.tool_calls else "no answer"
        return "completed", stopped, ""
    if child.stop.is_set():
        return "interrupted", "", "stopped by the user (Ctrl-C)"
    if child.budget.used >= MAX_CHILD_ITERATIONS:
        return "iteration_limit", "", (f"stopped after {MAX_CHILD_ITERATIONS} model calls "
                                       f"(MAX_CHILD_ITERATIONS): the work may be unfinished")
    if child.budget.parent_ran_out:
        return "budget_exhausted", "", ("stopped: the turn's shared budget is spent "
                                        "(--max-iterations): the work may be unfinished")
    return "error", "", first_line(stopped, 300)   # a guardrail halt, invalid calls


#: hardened
def child_outcome(child: Child, stopped: str) -> tuple[str, str, str]:
    """(status, answer, note) once the child's loop has returned."""
    last = child.messages[-1] if child.messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        if not child.succeeded and (child.tool_calls or not stopped):   # achieved nothing
            return "failed", stopped, "no tool call succeeded" if child.tool_calls else "no answer"
        return "completed", stopped, ""
    partial = partial_answer(child)
    if child.stop.is_set():
        return "interrupted", partial, "stopped by the user (Ctrl-C)"
    if child.budget.used >= child.budget.max_total:
        return "iteration_limit", partial, (f"stopped after {MAX_CHILD_ITERATIONS} model calls "
                                            f"(MAX_CHILD_ITERATIONS): the work may be unfinished")
    if child.budget.parent_ran_out:
        return "budget_exhausted", partial, ("stopped: the turn's shared budget is spent "
                                             "(--max-iterations): the work may be unfinished")
    return "error", partial, first_line(stopped, 300)   # a guardrail halt, invalid calls


#: hardened
def partial_answer(child: Child) -> str:
    """The child's last words so far, for a child that did not finish."""
    return next((m["content"] for m in reversed(child.messages)
                 if m.get("role") == "assistant" and m.get("content")), "")


#: hardened
def child_result(child: Child, status: str, answer: str, note: str) -> dict:
    """What the parent receives: the final answer (capped), a status, a count. Never the
    child's messages."""
    answer = safe_text(answer or "")
    if len(answer) > MAX_CHILD_ANSWER_CHARS:
        cut = len(answer) - MAX_CHILD_ANSWER_CHARS
        answer = answer[:MAX_CHILD_ANSWER_CHARS] + f"\n[… {cut:,} more characters cut]"
    result = {"task": child.index, "goal": preview(child.goal), "status": status, "answer": answer,
              "model_calls": child.budget.used, "tool_calls": child.tool_calls}
    if note:
        result["note"] = note
    return result

#: teaching
def child_result(child: Child, status: str, answer: str, note: str) -> dict:
    """What the parent receives: status, answer (capped), counts, a note; never the messages."""
    answer = safe_text(answer or "")
    if len(answer) > MAX_CHILD_ANSWER_CHARS:
        cut = len(answer) - MAX_CHILD_ANSWER_CHARS
        answer = answer[:MAX_CHILD_ANSWER_CHARS] + f"\n[… {cut:,} more characters cut]"
    return {"task": child.index, "goal": preview(child.goal), "status": status, "answer": answer,
            "model_calls": child.budget.used, "tool_calls": child.tool_calls,
            **({"note": note} if note else {})}

#: section Delegation details | hardened

CHILD_STOP_GRACE = 2.0                  # seconds Ctrl-C waits for children to stop


def task_spec(task) -> tuple[dict | None, str | None]:
    if not isinstance(task, dict):
        return None, "each task must be an object {goal, context, toolsets}."
    unknown = sorted(set(task) - {"goal", "context", "toolsets"})
    if unknown:
        return None, (f"unexpected field(s) {shown_names(unknown)}; a task has goal, context, "
                      f"toolsets.")
    goal, context, toolsets = task.get("goal"), task.get("context"), task.get("toolsets")
    if not isinstance(goal, str) or not goal.strip():
        return None, "goal must be a non-empty string."
    if context is not None and not isinstance(context, str):
        return None, "context must be a string."
    if toolsets is not None and (not isinstance(toolsets, list)
                                 or not all(isinstance(name, str) for name in toolsets)):
        return None, "toolsets must be a list of toolset names."
    if toolsets == []:
        return None, "toolsets is empty: name the toolsets the sub-agent needs."
    return {"goal": goal, "context": context or "", "toolsets": toolsets}, None     # None: default


def build_children(parent: Delegator, specs: list) -> tuple[list, str | None]:
    """Every child of the batch, or the first task's problem: nothing starts unless all can."""
    children = []
    for index, spec in enumerate(specs, start=1):
        if spec["toolsets"] is None:            # the defaults that this agent has
            spec["toolsets"] = [name for name in DEFAULT_CHILD_TOOLSETS
                                if name in offered_toolsets(parent.session.tools)]
        problem = toolsets_problem(parent.session.tools, spec["toolsets"])
        if problem:
            return [], f"task {index}: {problem}" if len(specs) > 1 else problem
        children.append(build_child_agent(parent, spec, index, len(specs)))
    return children, None


def offered_toolsets(tools: list) -> set[str]:
    return {toolset_of(tool) for tool in tools} - {None}


def toolsets_problem(parent_tools: list, toolsets: list) -> str | None:
    """Why these toolsets cannot make a child: unknown, not the parent's, or no tool
    left once the blocked ones are gone. Never "no toolsets, so every tool"."""
    if not toolsets:
        return (f"none of the default toolsets ({', '.join(DEFAULT_CHILD_TOOLSETS)}) is "
                f"offered to this agent: name the toolsets the sub-agent needs.")
    unknown = sorted(set(toolsets) - set(REGISTRY.toolsets()))
    if unknown:
        known = ", ".join(REGISTRY.toolsets())
        return f"unknown toolset(s) {shown_names(unknown)}; known: {known}."
    missing = sorted(set(toolsets) - offered_toolsets(parent_tools))
    if missing:
        return (f"toolset(s) {', '.join(missing)} are not offered to this agent, so not to "
                f"its sub-agents either.")
    if not child_tools(parent_tools, toolsets):
        return (f"no tools left in {', '.join(sorted(set(toolsets)))} once the tools a "
                f"sub-agent never gets ({', '.join(sorted(DELEGATE_BLOCKED_TOOLS))}) are removed.")
    return None


def shown_names(names: list) -> str:
    """Names from the model in an error message: visible, short, at most five."""
    shown = ", ".join(preview(name) for name in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def child_recovery(child: Child) -> RetryPolicy:
    """The parent's retries and fallback, with waits that end when the child is stopped."""
    policy = copy.copy(child.parent.session.recovery)
    notify = policy.notify

    def interruptible_sleep(seconds: float) -> None:
        if child.stop.wait(seconds):
            raise KeyboardInterrupt             # what Ctrl-C is in the main thread
    policy.sleep = interruptible_sleep
    policy.notify = lambda line: notify(f"[sub-agent {child.index}] {line}")
    return policy


def start_heartbeat(child: Child) -> None:
    settings = child.parent.session.delegation
    threading.Thread(target=heartbeat, args=(child, settings.heartbeat_interval,
                                             settings.stale_beats), daemon=True).start()


def heartbeat(child: Child, interval: float, stale_beats: int) -> None:
    """While the child works: every `interval` seconds, touch the parent (it is alive).
    Stop when the child finishes, or after `stale_beats` beats without progress (no new
    model call, no new tool): a stuck child must not keep the parent looking busy."""
    def progress():
        return child.budget.used, child.tool_calls, child.current_tool
    last, stale = progress(), 0
    while not child.finished.wait(interval) and not child.stop.is_set():
        now = progress()
        stale = stale + 1 if now == last else 0
        last = now
        with child.lock:    # run_child() reports "finished" under it: no beat after that
            if child.finished.is_set():
                return
            if stale >= stale_beats:
                child.emit("heartbeat_stopped", beats=stale)
                return
            activity = preview(child.current_tool) if child.current_tool else \
                "waiting for the model"
            child.parent.touch(f"sub-agent {child.index}: {activity}, call {child.budget.used}")
            child.emit("heartbeat", activity=activity, model_calls=child.budget.used)


def stop_children(children: list) -> None:
    """Ctrl-C: stop every child, give them CHILD_STOP_GRACE seconds to end (a running
    command is killed at once), and report the rest as interrupted without waiting.
    Events, not Thread.join(): a join cut short by Ctrl-C can mark a running thread done."""
    for child in children:
        child.stop.set()
    deadline = time.monotonic() + CHILD_STOP_GRACE
    for child in children:
        child.finished.wait(max(0.0, deadline - time.monotonic()))
    for child in children:
        with child.lock:
            if not child.finished.is_set():     # e.g. still waiting for the endpoint
                child.emit("finished", status="interrupted", model_calls=child.budget.used,
                           answer="stopped by the user (Ctrl-C); no longer waited for")
                child.abandoned = True          # whatever it reports later is dropped


#: section Delegation commands | plumbing


#: teaching
def show_child_event(event: dict) -> None:
    """A child's progress as a tree line, [1], [2], [3] when several run; the last, └─, ends it."""
    tag, kind = f"[{event.get('index')}] " if event["count"] > 1 else "", event["event"]
    if kind == "started":
        line = f"├─ {tag}sub-agent started: {preview(event['goal'])}"
    elif kind == "tool_started":
        line = f"├─ {tag}{preview(event['tool'])} {event['preview']}"
    elif kind == "tool_finished" and event["outcome"] not in ("ok", "landed"):
        line = f"├─ {tag}{preview(event['tool'])}: {event['outcome']}"
    elif kind == "finished":
        line = (f"├─ {tag}{event['status']} after {event['model_calls']} model call(s): "
                f"{visible(first_line(event['answer'], 100))}")
    elif kind == "closed":
        if event["stopped"]:                    # the terminal echoed ^C: start a fresh line
            console.print()
        line = f"└─ {event['completed']} of {event['count']} sub-agent(s) completed"
    else:
        return
    console.print(Text("    " + line, style="magenta"))

#: hardened
def show_child_event(event: dict) -> None:
    """A child's progress as a tree under the parent's delegate_task line, prefixed
    [1], [2], [3] when several children run at once. Children finish in any order, so
    every line is a branch ├─ but the one that run_children() closes the tree with."""
    tag = f"[{event['index']}] " if "index" in event and event["count"] > 1 else ""
    kind, style = event["event"], "magenta"
    if kind == "started":
        line = f"├─ {tag}sub-agent started: {preview(event['goal'])}"
    elif kind == "tool_started":
        line = f"├─ {tag}{preview(event['tool'])} {event['preview']}"
    elif kind == "tool_finished":
        if event["outcome"] in ("ok", "landed"):
            return                              # the next line shows the child went on
        line, style = f"├─ {tag}{preview(event['tool'])}: {event['outcome']}", "yellow"
    elif kind == "heartbeat":
        line, style = (f"├─ {tag}… still working ({event['activity']}, "
                       f"{event['model_calls']} model call(s) so far)"), "dim"
    elif kind == "heartbeat_stopped":
        line, style = (f"├─ {tag}heartbeat stopped: no progress in {event['beats']} "
                       f"beats"), "yellow"
    elif kind == "finished":
        style = "green" if event["status"] == "completed" else "yellow"
        line = (f"├─ {tag}{event['status']} after {event['model_calls']} model call(s): "
                f"{preview_line(event['answer'])}")
    elif kind == "stopping":                    # Ctrl-C: the terminal echoed ^C after the
        console.print()                         # last line, so the rest starts on a new one
        line, style = f"├─ stopping {event['count']} sub-agent(s)", "yellow"
    elif kind == "closed":                      # once, after every child's last line
        line = f"└─ {event['completed']} of {event['count']} sub-agent(s) completed"
    else:
        return
    console.print(Text("    " + line, style=style))


#: hardened
def preview_line(text: str, limit: int = 100) -> str:
    return visible(first_line(text, limit))


#: teaching
def delegation_summary(data: dict, limit: int = 100) -> str | None:
    """One line per child of a delegate_task result, then the budget; None for other results."""
    if not isinstance(data.get("children"), list):
        return None
    return "\n".join([*(f"[{child['task']}] {child['status']}: " + visible(first_line(
        child["answer"] or child.get("note", ""), limit)) for child in data["children"]),
                      data.get("budget", "")])

#: hardened
def delegation_summary(result: str) -> str | None:
    """The parent's view of a delegate_task result: one line per child (the tree above
    showed their work), or None when the result is an error."""
    data = parse_result(result) or {}
    children = data.get("children")
    if not isinstance(children, list):
        return None
    lines = ["  ←"] + [f"    [{child['task']}] {child['status']}: "
                       f"{preview_line(child['answer'] or child.get('note', ''))}"
                       for child in children]
    return "\n".join(lines + [f"    {data.get('budget', '')}"])


#: teaching
def show_delegation(session: Session, argument: str) -> None:
    """/delegation: how sub-agents run in this session."""
    settings = session.delegation
    console.print(Text(
        f"  budget     {settings.budget_mode} (--child-budget)\n"
        f"  per child  {MAX_CHILD_ITERATIONS} model calls, up to {MAX_PARALLEL_CHILDREN} in "
        f"parallel, depth {MAX_CHILD_DEPTH}\n"
        f"  tools      never {', '.join(sorted(DELEGATE_BLOCKED_TOOLS))}\n"
        f"  approvals  {settings.child_approvals} (--child-approvals)\n"
        f"  heartbeat  every {settings.heartbeat_interval:g} s, last: {session.last_activity[1]}"))

#: hardened
def show_delegation(session: Session, argument: str) -> None:
    """/delegation: how sub-agents run in this session."""
    settings = session.delegation
    shared = settings.budget_mode == "shared"
    for name, value in (
            ("budget", f"{settings.budget_mode}: " + (
                f"children's model calls come out of the turn's {session.max_iterations} "
                f"(--max-iterations), {PARENT_RESERVE} kept for the parent" if shared else
                "each child has its own calls; a turn may cost more than --max-iterations")),
            ("per child", f"{MAX_CHILD_ITERATIONS} model calls, up to {MAX_PARALLEL_CHILDREN} "
                          f"in parallel, depth {MAX_CHILD_DEPTH} (a child never delegates)"),
            ("tools", f"the toolsets asked for (default {', '.join(DEFAULT_CHILD_TOOLSETS)}) "
                      f"that this agent has, never {', '.join(sorted(DELEGATE_BLOCKED_TOOLS))}"),
            ("approvals", f"a child's dangerous commands: {settings.child_approvals} "
                          f"(--child-approvals); hardline: always blocked"),
            ("heartbeat", f"every {settings.heartbeat_interval:g} s; stops after "
                          f"{settings.stale_beats} beats without progress"),
            ("activity", f"{time.monotonic() - session.last_activity[0]:.0f} s ago: "
                         f"{session.last_activity[1]}")):
        console.print(Text(f"  {name:<10} {value}"))


COMMANDS["/delegation"] = show_delegation


def delegation_settings_from_args(args) -> DelegationSettings:
    return DelegationSettings(args.child_budget, args.child_approvals, args.heartbeat_interval)


#: hardened
DEMO_NOTES = "Sub-agents start with nothing but their goal.\n"


#: hardened
def demo_parallel(session: Session) -> None:
    console.print(Text("\n1. Two sub-agents at once, each with a fresh context and only the "
                       "terminal and file tools. The tree shows their progress; the parent "
                       "receives only their answers.", style="bold"))
    Path("notes.txt").write_text(DEMO_NOTES, encoding="utf-8")
    demo_turn(session, DEMO_INPUTS[0])
    roles = " ".join(message["role"] for message in session.messages)
    console.print(Text(f"The parent's conversation: {roles}. No child message is in it.",
                       style="dim"))


#: hardened
def demo_limits(session: Session) -> None:
    console.print(Text("\n2. A sub-agent cannot delegate: delegate_task is not among its "
                       "tools, so its door refuses the call.", style="bold"))
    demo_turn(session, DEMO_INPUTS[1])
    console.print(Text("\n3. Nobody can approve a sub-agent's dangerous command: denied "
                       "(the demo's rm is a stub anyway). A hardline one is blocked.",
                       style="bold"))
    Path("build").mkdir(exist_ok=True)
    demo_turn(session, DEMO_INPUTS[2])
    console.print(Text(f"build still exists: {Path('build').is_dir()}", style="dim"))


#: hardened
def demo_budget(template: Session) -> None:
    console.print(Text("\n4. One shared budget: --max-iterations 4 for the whole turn. The "
                       "parent uses 1 and keeps 1, so three children share 2 calls and "
                       "some starve:", style="bold"))
    for mode in CHILD_BUDGET_MODES:
        session = restarted_session(template)
        session.max_iterations = 4
        session.delegation = DelegationSettings(budget_mode=mode)
        if mode == "independent":
            console.print(Text("\n   The same with --child-budget independent: each child "
                               "has its own calls, and the turn costs more than 4.",
                               style="bold"))
        demo_turn(session, DEMO_INPUTS[3])
        console.print(Text(f"children completed: {completed_children(session)} of 3",
                           style="dim"))


#: teaching
def demo_delegation(template: Session) -> None:
    """Two children at once, what a child may not do, then the two budgets."""
    Path("notes.txt").write_text("Sub-agents start with nothing but their goal.\n")
    for number, (title, limit, mode) in enumerate([
            ("Two sub-agents at once; the parent receives only their answers.", None, "shared"),
            ("A sub-agent cannot delegate, and its dangerous command is denied.", None, "shared"),
            ("--max-iterations 4, --child-budget shared: 3 children, 2 calls each.", 4, "shared"),
            ("The same with --child-budget independent.", 4, "independent")], start=1):
        console.print(Text(f"\n{number}. {title}", style="bold"))
        session = restarted_session(template)
        session.max_iterations = limit or template.max_iterations
        session.delegation = DelegationSettings(budget_mode=mode)
        demo_turn(session, DEMO_INPUTS[number - 1])


#: hardened
def completed_children(session: Session) -> int:
    """How many children of the session's last delegate_task call completed."""
    last = next((parse_result(m["content"]) for m in reversed(session.messages)
                 if m.get("role") == "tool"), None) or {}
    return sum(child.get("status") == "completed" for child in last.get("children", []))

#: more for Offline model (not part of the lesson)


#: hardened
def delegation_words(data: dict) -> str | None:
    """The offline model's words about a delegate_task result; None for other tools."""
    children = data.get("children")
    if not isinstance(children, list):
        return None
    lines = [f"Sub-agent {child['task']} ({child['status']}, {child['model_calls']} model "
             f"call(s)): {first_line(child['answer'] or child.get('note', ''), 160)}"
             for child in children]
    return "\n".join(lines + [f"Budget: {data.get('budget', '')}."])

#: wiring
DELEGATE_TASK_SCHEMA = function_schema(
    "delegate_task",
    f"Give a self-contained task to a sub-agent with a fresh context and only the toolsets "
    f"it needs; get back its final answer and a status. Either `goal` (with optional "
    f"`context` and `toolsets`) or `tasks`: up to {MAX_PARALLEL_CHILDREN} such objects, "
    f"run in parallel. Sub-agents cannot delegate, use memory or manage skills, and cannot "
    f"ask the user anything.",
    {"goal": {"type": "string", "description": "the task, complete in itself"},
     "context": {"type": "string", "description": "facts the sub-agent needs"},
     "toolsets": {"type": "array", "items": {"type": "string"},
                  "description": f"default: {', '.join(DEFAULT_CHILD_TOOLSETS)}"},
     "tasks": {"type": "array", "items": {"type": "object"},
               "description": f"up to {MAX_PARALLEL_CHILDREN} tasks {{goal, context, toolsets}}"}},
    [])
DELEGATE_TASK_ENTRY = ToolEntry("delegate_task", "delegation", DELEGATE_TASK_SCHEMA,
                                delegate_task, mutates=True)     # its children may change files
REGISTRY.register(DELEGATE_TASK_ENTRY)


#: changes

STAGE = "s10"


STAGE_TITLE = "sub-agents with their own context, fewer tools and one shared budget"


#: teaching
def run_conversation(client, model: str, messages: list,
                     max_iterations: int = MAX_ITERATIONS, on_event=None, tools=None,
                     context_length: int | None = None,
                     recovery: RetryPolicy | None = None,
                     budget: IterationBudget | None = None) -> str:
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
    budget = budget or IterationBudget(max_iterations)  # one of each per user turn (s10:
    guardrails = ToolCallGuardrails()                   # run_turn() passes the budget)
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
                     recovery: RetryPolicy | None = None,
                     budget: IterationBudget | None = None) -> str:
    """The agent loop. Returns the final answer text.

    The loop ends when the assistant message has no tool calls: we trust the
    message itself, not finish_reason, which some servers report wrongly.
    `tools` is the list of definitions offered (default: every available tool).
    Before every model call, compress_context() keeps the messages inside the
    model's `context_length` (s05).
    `recovery` says how a failed model call is retried (see call_model()).
    `budget` is the turn's IterationBudget; s10's sub-agents pass one that also pays
    from their parent's.
    """
    on_event = on_event or (lambda kind, data: None)
    tools = REGISTRY.get_definitions() if tools is None else tools
    offered = {tool["function"]["name"]: tool for tool in tools}
    strikes = 0                         # consecutive turns whose calls were all invalid
    if budget is None:
        budget = IterationBudget(max_iterations)    # one of each per user turn
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
            stop_if_requested()                 # s10: a stopped child runs no more calls
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
def wait_for_command(proc: subprocess.Popen, reader: threading.Thread, timeout: int) -> bool:
    """True if the command exited and closed its output within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    in_child = STOP_REQUESTED.get() is not None     # s10: a sub-agent's thread
    while reader.is_alive() and time.monotonic() < deadline:   # a background child may
        reader.join(0.05 if in_child else deadline - time.monotonic())  # keep the pipe open
        stop_if_requested()                     # the caller kills the process group
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return False
    return not reader.is_alive()


#: teaching
class IterationBudget:
    """How many model calls one user turn may make (--max-iterations). The lock: s10's
    children share one budget between threads, and two that read "1 left" must not both get it."""

    def __init__(self, max_total: int):
        self.max_total = max_total
        self.used = 0
        self._lock = threading.Lock()

    def consume(self, keep: int = 0) -> bool:
        """Take one unit, leaving at least `keep` (s10: the parent's reserve); else False."""
        with self._lock:
            if self.used + keep >= self.max_total:
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

    def consume(self, keep: int = 0) -> bool:
        """Take one unit; False (and nothing taken) once the budget is spent, or when
        taking it would leave fewer than `keep` units (s10: the parent's reserve)."""
        with self._lock:
            if self._used + keep >= self.max_total:
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


#: hardened
def approve_command(command: str, findings: list[Finding],
                    context: ApprovalContext | None = None) -> str:
    """The approval decision for the dangerous tier: "once", "session", "always" or
    "deny". Cached approvals first, then the smart reviewer (mode smart), then the person
    at the terminal. "once" stores nothing (also a cache hit or the reviewer's APPROVE);
    "session" and "always" remember every finding's key. A finding that needs a human
    skips the cache and the reviewer, and can only be approved once."""
    context = context or approval_context()
    human_only = any(finding.needs_human for finding in findings)
    cached = None if human_only else context.cached_approval(findings)
    if cached:                      # said, like YOLO's and the smart reviewer's approvals
        show_approval_note(f"[approved without asking: {cached}]")
        return "once"
    if not human_only and context.uses_smart_review():
        verdict = smart_review(context, command, findings)
        if verdict == "APPROVE":
            show_approval_note("[approved by the smart reviewer, this once]")
            return "once"
        if verdict == "DENY":
            context.last_denial = "the smart reviewer judged it dangerous"
            return "deny"
        show_approval_note("[the smart reviewer was not sure: asking you]")
    choices = ("once", "deny") if human_only else APPROVAL_CHOICES
    choice, context.last_denial = context.ask(command, findings, choices)
    return context.remember(choice, findings)


#: hardened
class ApprovalContext:
    """Who asks for approval: the policy, the session (its id keys the session approvals;
    its client and model serve the smart reviewer) and how to reach a human:
    read_answer(deadline) returns a typed line, or None when nobody can be asked."""

    def __init__(self, permissions: Permissions, session=None, read_answer=None):
        self.permissions = permissions
        self.session = session
        self.read_answer = read_answer
        self.last_denial = "not approved"   # why approve_command() said "deny", for the model

    @property
    def session_id(self) -> str | None:
        return getattr(self.session, "session_id", None)

    def yolo_source(self) -> str | None:
        """Why the dangerous tier runs without asking in this session, or None."""
        if self.permissions.mode == "off":
            return "--approval-mode off"
        if self.permissions.yolo_source:
            return self.permissions.yolo_source
        on = self.session_id is not None and self.session_id in self.permissions.session_yolo
        return "/yolo, this session" if on else None

    def ask(self, command: str, findings: list[Finding], choices: tuple) -> tuple[str, str]:
        """(choice, why denied): the person at the terminal (s10's sub-agents differ)."""
        return ask_human(self, command, findings, choices)

    def uses_smart_review(self) -> bool:
        return self.permissions.mode == "smart"

    def cached_approval(self, findings: list[Finding]) -> str | None:
        """Where each finding was approved before, for the note ("allowlist.json: KEY;
        this session: KEY"), or None if one of them was not."""
        session, allowlist = self.permissions.approved_in(self.session_id), \
            allowlist_keys(self.permissions)
        where = [f"{allowlist_holding(self.permissions, key)}: {key}" if key in allowlist
                 else f"this session: {key}" if key in session else None
                 for key in dict.fromkeys(finding.key for finding in findings)]
        return None if None in where else "; ".join(where)

    def remember(self, choice: str, findings: list[Finding]) -> str:
        """Store a "session" or "always" answer; returns what was stored in the end (an
        "always" that cannot be saved becomes "session")."""
        keys = [finding.key for finding in findings if not finding.needs_human]
        if choice == "always":
            path = allowlist_path()
            problem = save_to_allowlist(keys) if self.permissions.allowlist_unchanged(path) \
                else f"{path}: it changed while the agent was running"
            if problem is None:
                self.permissions.saved_allowlist(path)
            else:
                show_approval_note(f"error: not saved to the allowlist ({problem}); approved "
                                   f"for this session only", style="red")
                choice = "session"
        if choice == "session" and not self.session_id:
            # No session id (a script, a sub-agent set up without one): nothing to
            # remember it under, and a shared "no id" bucket would leak approvals.
            show_approval_note("[no session id here: approved this once only]")
            return "once"
        if choice in ("session", "always"):
            self.permissions.approve_in(self.session_id, keys)
        return choice


def write_refusal(target: Path) -> str | None:
    """Why write_file or patch may not write `target`, as the tool's refusal; None if it
    may. The resolved path counts: links are followed, also to a file not there yet."""
    real = Path(os.path.realpath(target))
    problem = protected_path_problem(real) or write_root_problem(real) or child_state_problem(real)
    if problem is None:
        return None
    return refusal(f"write refused: {tilde(real)} {problem}. Nothing was written.")

#: teaching
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /memory        the memory files as they are on disk, and how full they are
  /skills        the skills a new session's index lists, and any that are not usable
  /permissions   the approval mode, YOLO, timeout, write root and what is approved
  /yolo          YOLO on or off for this session only (never for hardline commands)
  /delegation    how sub-agents run: budget, limits, approvals, heartbeat
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL (at an approval prompt: deny).
The offline model understands:
  $ <command>            run a shell command with the terminal tool (through the gate)
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails first (rate_limit, billing, auth, server, connection,
                         model_not_found, context_overflow, bad_request); default: once
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)
  remember <fact>        save a note with the memory tool (MEMORY.md)
  remember about me: <fact>   save it to the user profile (USER.md)
  skills                 list the skills with skills_list
  skill <name>           load a skill with skill_view
  delegate <goal>        a sub-agent does it (delegate_task); <goal> | <goal>: up to 3 at once"""

#: hardened
HELP_TEXT = """Commands:
  /help          this help
  /tools         the tools offered to the model, by toolset
  /sessions      saved sessions, newest first (* = this one)
  /resume ID     continue a saved session
  /prompt        the system prompt of this session
  /compress      prune old tool outputs and summarise the middle of the conversation now
  /recovery      retries, fallback, budget and guardrails of this session
  /memory        the memory files as they are on disk, and how full they are
  /skills        the skills a new session's index lists, and any that are not usable
  /permissions   the approval mode, YOLO, timeout, write root and what is approved
  /yolo          YOLO on or off for this session only (never for hardline commands)
  /delegation    how sub-agents run: budget, limits, approvals, heartbeat
  /quit          leave (Ctrl-D works too)
Ctrl-C cancels the current turn and keeps the REPL (at an approval prompt: deny).
The offline model understands:
  $ <command>            run a shell command with the terminal tool (a dangerous one
                         only after your approval; a hardline one never)
  read <path>            read a file with read_file
  write <path> <text>    write a file with write_file
  call <tool> <json>     send a raw tool call, exactly as written (try a broken one)
  search <words>         search earlier sessions with session_search
  prompt                 the model says what system prompt it received
  context                the model says what conversation it received (summary, pruned)
  fail <kind> [times]    the endpoint fails this request (default once) before it
                         answers; kinds: rate_limit, billing, auth, model_not_found,
                         context_overflow, bad_request, server, connection
  retry <input>          like a stuck model, repeat the call <input> makes (retry $ false)
  remember <fact>        save a note with the memory tool (MEMORY.md)
  remember about me: <fact>   save it to the user profile (USER.md)
  skills                 list the skills with skills_list
  skill <name>           load a skill with skill_view
  delegate <goal>        give the goal to a sub-agent with delegate_task (try
                         delegate $ ls); delegate <goal> | <goal> runs up to 3 at once"""


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
        self.delegation = DelegationSettings()  # and this (s10)
        self.last_activity = (time.monotonic(), "started")  # s10's heartbeat renews it
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


#: teaching
def show_event(kind: str, data: dict) -> None:
    """Print tool calls and results compactly."""
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}",
                           style="cyan"))
    elif kind == "tool_result":
        outcome = classify_tool_result(data["name"], data["result"])
        style = {"landed": "green", "error": "red", "refused": "yellow"}.get(outcome, "dim")
        shown = delegation_summary(parse_result(data["result"]) or {})     # s10: delegate_task
        console.print(Text(indent_result(shown or data["result"]), style=style))
        if outcome != "ok":
            console.print(Text(f"    [{outcome}]", style=style))
        if data.get("note"):                # a guardrail's words, as the model gets them
            console.print(Text("    " + data["note"].strip(), style="yellow"))
    elif kind in ("compressed", "compression_failed"):
        show_compression_event(kind, data)

#: hardened
def show_event(kind: str, data: dict) -> None:
    """Print tool calls and results compactly."""
    if kind == "tool_call":
        console.print(Text(f"  → {data['name']} {shown_arguments(data['arguments'])}",
                           style="cyan"))
    elif kind == "tool_result":
        outcome = classify_tool_result(data["name"], data["result"])
        style = {"landed": "green", "error": "red", "refused": "yellow"}.get(outcome, "dim")
        shown = delegation_summary(data["result"]) if data["name"] == "delegate_task" else None
        console.print(Text(shown or indent_result(data["result"]), style=style))
        if outcome != "ok":
            console.print(Text(f"    [{outcome}]", style=style))
        if data.get("note"):                # a guardrail's words, as the model gets them
            console.print(Text("    " + data["note"].strip(), style="yellow"))
    elif kind in ("compressed", "compression_failed"):
        show_compression_event(kind, data)


def run_turn(session: Session, user_text: str) -> bool:
    """One user turn. Returns False if the model call failed. s10: the turn's budget."""
    session.messages.append({"role": "user", "content": undecodable_to_replacement(user_text)})
    budget = IterationBudget(session.max_iterations)
    delegation = DELEGATION.set(Delegator(session, budget, 0, show_child_event))
    try:
        answer = run_conversation(session.client, session.model, session.messages,
                                  session.max_iterations, show_event, session.tools,
                                  session.context_length, session.recovery, budget)
    except (openai.OpenAIError, json.JSONDecodeError) as exc:   # JSONDecodeError: not an API
        line = explain_api_failure(exc, session.base_url, session.model)
        err_console.print(Text("error: " + line, style="red"))
        return False
    finally:
        DELEGATION.reset(delegation)
    console.print(Text(answer))
    return True


#: teaching
DEMO_INPUTS = ["delegate $ ls -F | $ cat notes.txt", "delegate delegate $ ls | $ rm -rf build",
               "delegate $ ls | $ ls | $ ls", "delegate $ ls | $ ls | $ ls"]
#: hardened
DEMO_INPUTS = ["delegate $ ls -F | $ cat notes.txt", "delegate delegate $ ls",
               "delegate $ rm -rf build | $ rm -rf /", "delegate $ ls | $ ls | $ ls"]


#: teaching
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    saved_environment, saved_folder = os.environ.copy(), current_directory()
    with tempfile.TemporaryDirectory(prefix="s10-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            with_approvals(Permissions(), session, demo_delegation)
        finally:
            os.environ.clear()
            os.environ.update(saved_environment)    # HOME, PATH, LEARN_HERMES_HOME as before
            if saved_folder is not None:
                os.chdir(saved_folder)
    return 0


#: hardened
def run_demo(session: Session) -> int:
    console.print(Text(f"{STAGE} demo: {STAGE_TITLE}.", style="bold"))
    saved = {name: os.environ.get(name) for name in ("HOME", "LEARN_HERMES_HOME", "PATH")}
    saved_folder = current_directory()
    with tempfile.TemporaryDirectory(prefix="s10-demo-") as folder:
        try:
            enter_demo_folder(Path(folder))
            console.print(Text(f"The demo works in {folder}: a temporary folder, home and "
                               f"state folder, and an rm that only prints.", style="dim"))
            with_approvals(Permissions(), restarted_session(session), demo_parallel)
            with_approvals(Permissions(), restarted_session(session), demo_limits)
            with_approvals(Permissions(), session, demo_budget)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if saved_folder is not None:
                os.chdir(saved_folder)
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
    parser.add_argument("--yolo", action="store_true", help="dangerous commands run unasked")
    parser.add_argument("--approval-mode", choices=APPROVAL_MODES, default="manual")
    parser.add_argument("--approval-timeout", type=positive_int, default=APPROVAL_TIMEOUT)
    parser.add_argument("--write-root", type=existing_folder, metavar="DIR")
    parser.add_argument("--child-budget", choices=CHILD_BUDGET_MODES, default="shared")
    parser.add_argument("--child-approvals", choices=CHILD_APPROVALS, default="deny")
    parser.add_argument("--heartbeat-interval", type=positive_int, default=int(HEARTBEAT_INTERVAL))
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
    parser.add_argument("--yolo", action="store_true", help="run dangerous commands without "
                        "asking (never hardline ones); HERMES_YOLO_MODE=1 does the same")
    parser.add_argument("--approval-mode", choices=APPROVAL_MODES, default="manual",
                        help="manual: ask (default); smart: a model reviews first; off: "
                             "like --yolo for every session")
    parser.add_argument("--approval-timeout", type=positive_int, default=APPROVAL_TIMEOUT,
                        metavar="SECONDS", help=f"an approval prompt with no answer denies "
                        f"after this long (default {APPROVAL_TIMEOUT})")
    parser.add_argument("--write-root", type=existing_folder, metavar="DIR",
                        help="write_file and patch write only inside DIR")
    parser.add_argument("--child-budget", choices=CHILD_BUDGET_MODES, default="shared",
                        help="shared: sub-agents' model calls come out of the turn's "
                             "budget (default); independent: each sub-agent has its own "
                             f"{MAX_CHILD_ITERATIONS}")
    parser.add_argument("--child-approvals", choices=CHILD_APPROVALS, default="deny",
                        help="a sub-agent's dangerous commands: deny (default) or approve "
                             "once; hardline ones are always blocked")
    parser.add_argument("--heartbeat-interval", type=positive_int, default=int(HEARTBEAT_INTERVAL),
                        metavar="SECONDS", help=f"a working sub-agent tells the parent it is "
                        f"alive this often (default {HEARTBEAT_INTERVAL:g})")
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
    session.delegation = delegation_settings_from_args(args)
    approvals = APPROVAL_CONTEXT.set(ApprovalContext(permissions_from_args(args), session,
                                                     terminal_reader()))
    try:
        if args.demo:
            return run_demo(session)
        wanted = args.resume or ("latest" if args.continue_session else None)
        if wanted and not resume_session(session, wanted):
            return 1
        if args.prompt is not None:
            return run_prompt(session, args.prompt)
        return repl(session)
    finally:
        APPROVAL_CONTEXT.reset(approvals)
        close_session(session)

# A tiny deterministic "model" behind a real HTTP server on 127.0.0.1, so the real
# openai client builds requests and parses answers as it does with a real endpoint.

# The verbs it names when it does not understand: the ones that fit this stage best.
OFFLINE_VERBS = "'delegate <goal>', '$ <command>' or 'read <path>'"


#: teaching
def offline_plan(text: str):
    """Map learner input to (tool name, arguments), or None. `call` keeps the raw text."""
    if text.startswith("$ "):
        return "terminal", {"command": text[2:]}
    verb, _, rest = text.partition(" ")
    if verb == "read" and rest.strip():
        return "read_file", {"path": rest.strip()}
    if verb == "write" and " " in rest.strip():
        path, _, content = rest.strip().partition(" ")
        return "write_file", {"path": path, "content": content}
    if verb == "call" and rest.strip():
        name, _, raw_arguments = rest.strip().partition(" ")
        return name, raw_arguments
    if verb == "search" and rest.strip():
        return "session_search", {"query": rest.strip()}
    if verb == "remember" and rest.strip():
        fact = rest.strip()
        target = "user" if fact.startswith("about me:") else "memory"
        return "memory", {"action": "add", "target": target,
                          "content": fact.removeprefix("about me:").strip()}
    if text == "skills":
        return "skills_list", {}
    if verb == "skill" and rest.strip():
        return "skill_view", {"name": rest.strip()}
    if verb == "delegate" and rest.strip():
        tasks = [{"goal": goal.strip()} for goal in rest.split(" | ")]
        return "delegate_task", tasks[0] if len(tasks) == 1 else {"tasks": tasks}
    return None

#: hardened
def offline_plan(text: str):
    """Map learner input to (tool name, arguments), or None. `call` keeps the raw text."""
    if text.startswith("$ "):
        return "terminal", {"command": text[2:]}
    verb, _, rest = text.partition(" ")
    if verb == "read" and rest.strip():
        return "read_file", {"path": rest.strip()}
    if verb == "write" and " " in rest.strip():
        path, _, content = rest.strip().partition(" ")
        return "write_file", {"path": path, "content": content}
    if verb == "call" and rest.strip():
        name, _, raw_arguments = rest.strip().partition(" ")
        return name, raw_arguments
    if verb == "search" and rest.strip():
        return "session_search", {"query": rest.strip()}
    if verb == "remember" and rest.strip():
        fact = rest.strip()
        target = "user" if fact.startswith("about me:") else "memory"
        return "memory", {"action": "add", "target": target,
                          "content": fact.removeprefix("about me:").strip()}
    if text == "skills":
        return "skills_list", {}
    if verb == "skill" and rest.strip():
        return "skill_view", {"name": rest.strip()}
    if verb == "delegate" and rest.strip():
        goals = [goal.strip() for goal in rest.split(" | ")]
        if len(goals) == 1:
            return "delegate_task", {"goal": goals[0]}
        return "delegate_task", {"tasks": [{"goal": goal} for goal in goals]}
    return None


#: teaching
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
        if not isinstance(data, dict):
            data = {"output": result}
        if summary := skill_summary(data) or delegation_summary(data, 160):
            lines.append(summary)
        elif "exit_code" in data:
            output = first_line(data.get("output", ""), 120) or "(no output)"
            lines.append(f"The command exited with code {data['exit_code']}; "
                         f"first line of output: {output}")
            cut = re.search(r"\[(\d+) characters truncated\]", data.get("output", ""))
            if cut:
                lines.append(f"The output was long: I received its start and end, "
                             f"{cut.group(1)} characters in the middle were cut.")
        elif "bytes_written" in data:
            lines.append(f"Wrote {data['bytes_written']} bytes to {data['path']}.")
        elif "replacements" in data:
            lines.append(f"Patched {data['path']}: {data['replacements']} replacement(s).")
        elif "content" in data:
            lines.append(f"{data['path']} has {data['total_lines']} line(s); line 1 reads: "
                         f"{first_line(data['content'].partition('|')[2], 120)}")
        elif "results" in data:
            found = data["results"]
            lines.append(f"Found {len(found)} earlier message(s)" + (
                f"; best match in session {found[0]['session_id']}: {found[0]['snippet']}"
                if found else "."))
        elif "error" in data:
            lines.append(f"The tool reported: {first_line(data['error'], 160)}")
        elif "usage" in data:
            lines.append(f"Saved in {data['file']}, now {data['usage']}. My system prompt "
                         f"still holds the memory as it was when this session started; "
                         f"the next session will see it.")
        else:
            lines.append(f"The tool answered: {first_line(result, 160)}")
    return "\n".join(lines) or "Done."

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
        if not isinstance(data, dict):
            data = {"output": result}
        if summary := skill_summary(data) or delegation_words(data):
            lines.append(summary)
        elif "exit_code" in data:
            output = first_line(data.get("output", ""), 120) or "(no output)"
            lines.append(f"The command exited with code {data['exit_code']}; "
                         f"first line of output: {output}")
            cut = re.search(r"\[(\d+) characters truncated\]", data.get("output", ""))
            if cut:
                lines.append(f"The output was long: I received its start and end, "
                             f"{cut.group(1)} characters in the middle were cut.")
        elif "bytes_written" in data:
            lines.append(f"Wrote {data['bytes_written']} bytes to {data['path']}.")
        elif "replacements" in data:
            lines.append(f"Patched {data['path']}: {data['replacements']} replacement(s).")
        elif "content" in data:
            lines.append(f"{data['path']} has {data['total_lines']} line(s); line 1 reads: "
                         f"{first_line(data['content'].partition('|')[2], 120)}")
        elif "results" in data:
            found = data["results"]
            lines.append(f"Found {len(found)} earlier message(s)" + (
                f"; best match in session {found[0]['session_id']}: {found[0]['snippet']}"
                if found else "."))
        elif "error" in data:
            lines.append(f"The tool reported: {first_line(data['error'], 160)}")
        elif "usage" in data:
            lines.append(f"Saved in {data['file']}, now {data['usage']}. My system prompt "
                         f"still holds the memory as it was when this session started; "
                         f"the next session will see it.")
        else:
            lines.append(f"The tool answered: {first_line(result, 160)}")
    return "\n".join(lines) or "Done."
