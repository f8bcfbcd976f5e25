"""Every stage present: imports with an empty environment, and its --help and --demo
work offline and show what this stage is about (not just exit 0).

In-process (`run_main`) except for what only a real process shows: the import check
(one process for all stages) and one real `--demo` exit code.
"""

import re
import subprocess
import sys

import pytest

from helpers import (AGENTS, all_stages, base_stage, clean_env, edition_of, every_stage,
                     load_stage, run_main, run_stage, short)

STAGES = every_stage()

# The command-line flags each stage adds (curriculum §4.5). A stage's --help lists its
# own and every earlier stage's. A new stage adds its row, even an empty one.
STAGE_FLAGS = {
    "s01_loop": ["--prompt", "--demo", "--offline", "--model", "--base-url",
                 "--max-iterations"],
    "s02_tool_registry": ["--toolsets", "--disable-toolsets"],
    "s03_session_store": ["--resume", "--continue"],
    "s04_prompt_builder": [],
    "s05_context_compression": ["--context-length"],
    "s06_error_recovery": ["--max-retries", "--fallback-model", "--fallback-base-url"],
    "s07_memory": [],
    "s08_skills": [],
    "s09_permission_system": ["--yolo", "--approval-mode", "--approval-timeout", "--write-root"],
    "s10_subagent_delegation": ["--child-budget", "--child-approvals", "--heartbeat-interval"],
    "s11_config_chain": ["--config", "--profile", "--show-config", "--tool-choice"],
    "s12_checkpoints": ["--checkpoints", "--no-checkpoints"],
}

# What each stage's --demo promises to show (read its run_demo): evidence that the
# stage's own feature ran, not only that the demo exited 0.
DEMO_PROMISES = {
    "s01_loop": [
        "  → terminal {\"command\": \"echo hello from the terminal tool\"}",
        "    hello from the terminal tool",
        "[stopped: this turn reached its limit of 1 model call(s)",
        "The conversation now holds 13 messages: user assistant tool assistant user assistant "
        "tool assistant user assistant user assistant tool",
    ],
    "s02_tool_registry": [
        "With --disable-toolsets file: terminal",
        "[landed]",
        "    Goodbye from the tool registry",
        "Tool 'no_such_tool' does not exist",
        "[stopped: 3 turns in a row contained only invalid tool calls",
    ],
    "s03_session_store": [
        "→ session_search {\"query\": \"pineapple\"}",
        "[resumed session ",
        "same list as before: True",
        "    step one: buy pineapples",
        "warning: session store unavailable",
    ],
    "s04_prompt_builder": [
        "## Project instructions from AGENTS.md\n# Project notes",
        "Nothing was blocked.",
        "[BLOCKED: AGENTS.md contained potential prompt injection",
        "same prompt as before: True",
    ],
    "s05_context_compression": [
        "A context length of 1,872 tokens (1,000 for the messages, the rest for the tool "
        "schemas): compression starts above 936.",
        "(threshold 936): pruned 1 tool output(s), summarised 0 message(s)]",
        "(threshold 936): pruned 0 tool output(s), summarised 5 message(s)]",
        "One summary replaced the middle:\n- The user asked: $ seq -s ' ' 101 200",
        "- The user asked: $ seq -s ' ' 201 300\n- Called terminal",
        "the session store holds all 21, the full record",
        "the session store holds all 21, the full record; resuming loads them all:",
        ": 21 messages]",
    ],
    "s06_error_recovery": [
        "[rate_limit (HTTP 429): retry 1 of 3 in 0.10 s, as Retry-After asks; Ctrl-C cancels]",
        "[3 retries used up: trying the fallback, offline-backup at http://127.0.0.1:",
        "This answer got through: the endpoint failed (server) as asked",
        "(401)",
        "[Tool loop warning: repeated_exact_failure_warning; count=2;",
        "Not run: terminal already failed 5 times with exactly these arguments.",
        "[Tool loop hard stop: same_tool_failure_halt; count=8;",
        "every tool call has its result: True",
        "[stopped: this turn reached its limit of 3 model call(s)",
    ],
    "s07_memory": [
        "a memory section in its prompt: False",
        "The running prompt is unchanged: True",
        "### Your notes (MEMORY.md, 34/2,200 characters)\nThe tests run with: pytest -n 0 -q",
        "in the new session's prompt: True",
        "refused: this entry matches send_to_url. Nothing was saved.",
        "MEMORY.md would hold 3,000 characters, over its limit of 2,200. Nothing was saved. "
        "Consolidate first",
        "the memory files are unchanged: True",
    ],
    "s08_skills": [
        "Skill 'release-notes' created: 287 bytes in skills/release-notes/SKILL.md.",
        "- release-notes: Write release notes for a new version from the git log.",
        "the body is in the prompt: False; the first session's prompt is unchanged: True",
        "I loaded the skill 'release-notes' and will follow it:\n# Release notes\n"
        "1. List the changes: git log --oneline <last tag>..HEAD",
        "invalid skill name '../../.ssh'",
        "refused: the new skills/quick-fix/SKILL.md contains potential prompt injection",
        "skills/quick-fix exists: False",
        "- friendly-reviewer: [BLOCKED: the description contained potential prompt injection "
        "(role_change)]",
        "Not usable: skills/broken/SKILL.md: 'description' is missing or empty",
    ],
    "s09_permission_system": [
        "s09> $ mkdir -p build/cache && ls -F\n  → terminal {\"command\": \"mkdir -p build/cache "
        "&& ls -F\"}\n  ← exit 0\n    build/",
        "\ndenied: no terminal to ask on (input is not a TTY)",    # and no prompt (issue 23)
        "    denied: no terminal to ask on (input is not a TTY)",
        "build still exists: True",
        "[approved without asking: YOLO is on (--yolo);",
        "    stub rm: -rf ./build",
        "s09> $ rm -rf /\n  → terminal {\"command\": \"rm -rf /\"}\n  ←\n    BLOCKED (hardline): ",
        "s09> $ ｒｍ -rf /\n  → terminal {\"command\": \"\\uff52\\uff4d -rf /\"}\n  ←\n"
        "    BLOCKED (hardline): ",
        "    BLOCKED (self-protection): this command may write ",
        "    write refused: ~/.ssh/authorized_keys is under ~/.ssh (SSH keys and config). "
        "Nothing was written.",
        "~/.ssh/authorized_keys exists: False",
    ],
    "s10_subagent_delegation": [
        "s10> delegate $ ls -F | $ cat notes.txt\n  → delegate_task {\"tasks\": [{\"goal\": "
        "\"$ ls -F\"}, {\"goal\": \"$ cat notes.txt\"}]}\n",
        "    ├─ [1] sub-agent started: $ ls -F",
        "    ├─ [2] sub-agent started: $ cat notes.txt",
        "    ├─ [2] completed after 2 model call(s): The command exited with code 0; first line "
        "of output: Sub-agents start with nothing but their goal.",
        "    └─ 2 of 2 sub-agent(s) completed\n  ←",
        "failed after 2 model call(s): The tool answered: Tool 'delegate_task' does not exist.",
        "denied: a sub-agent has nobody to ask",
        "budget_exhausted after ",
        "1 of 4 model calls of this turn used (independent budget: children's calls do not count)",
        "The parent's conversation: system user assistant tool assistant. No child message is in it.",
        "├─ failed after 2 model call(s): The tool answered: Tool 'delegate_task' does not exist.",
        "    └─ 0 of 1 sub-agent(s) completed\n  ←",
        "BLOCKED (hardline): delete of ",
        "build still exists: True",
        "children completed: 3 of 3",
    ],
    "s11_config_chain": [
        "+ nothing set                            approvals.timeout = 60  from default",
        "approvals.timeout = 45  from config.yaml:approvals.timeout",
        "approvals.timeout = 30  from HERMES_APPROVAL_TIMEOUT",
        "approvals.timeout = 20  from --approval-timeout",
        "approvals.timeout = 10  from managed:approvals.timeout",
        "warning: --approval-timeout is ignored: approvals.timeout is locked by the managed "
        "configuration (",
        "BLOCKED (deny rule): the user's rule 'rm -rf *' (approvals.deny)",
        "stub rm: -r build",
        "config.yaml is a policy file of this agent",
        "BLOCKED (self-protection): this command may write ",
    ],                  # the hardened demo shows more: test_s11_config_chain.py checks it
    "s12_checkpoints": [
        "s12> write todo.txt buy milk\n  → write_file {\"path\": \"todo.txt\", \"content\": "
        "\"buy milk\"}\n  [checkpoint ",
        ": before write_file todo.txt]\n  ←",
        ": before terminal: truncate -s 0 notes.txt && mv app.py app.old && echo oops > "
        "scratch.txt]\n  ← exit 0",
        "the folder: notes.txt has 0 line(s); present: app.old, scratch.txt; .env unchanged: True",
        "newest first (files and lines: what restoring it would undo, the changes made "
        "after it):",
        "  4 file(s), +2 -3  before terminal: truncate -s 0 notes.txt",
        "  1 file(s), +1 -0  before write_file todo.txt",
        "  before terminal: truncate -s 0 notes.txt",      # the list, in both editions
        "  before write_file todo.txt",
        "-Every change can be taken back.\n-So the agent may act.",
        "+oops",
        "s12> /rollback 1\nrestored the project to checkpoint ",
        "the folder: notes.txt has 2 line(s); present: app.py; .env unchanged: True",
        "(before rollback to ",
        "4 checkpoint(s) of ",
        "Only you can roll back (I have no tool for it)",
    ],
}

# The promises that only the hardened edition's demo keeps: the teaching --demo may be
# shorter (issue 21), so it leaves out these parts.
HARDENED_DEMO_PROMISES = {
    "s09_permission_system": [
        "[approved without asking: YOLO is on (--yolo);",
        "    stub rm: -rf ./build",
    ],
    "s11_config_chain": [
        "config.yaml is a policy file of this agent",
        "BLOCKED (self-protection): this command may write ",
    ],
    "s10_subagent_delegation": [
        "The parent's conversation: system user assistant tool assistant. No child message is in it.",
        "├─ failed after 2 model call(s): The tool answered: Tool 'delegate_task' does not exist.",
        "    └─ 0 of 1 sub-agent(s) completed\n  ←",
        "BLOCKED (hardline): delete of ",
        "build still exists: True",
        "children completed: 3 of 3",
    ],
    "s01_loop": [
        "The conversation now holds 13 messages: user assistant tool assistant user assistant "
        "tool assistant user assistant user assistant tool",
    ],
    "s06_error_recovery": [
        "every tool call has its result: True",
        "[stopped: this turn reached its limit of 3 model call(s)",
    ],
    "s07_memory": [
        "a memory section in its prompt: False",
        "in the new session's prompt: True",
    ],
    "s03_session_store": ["warning: session store unavailable"],
    "s05_context_compression": ["the session store holds all 21, the full record; resuming loads "
                                "them all:", ": 21 messages]"],
    "s08_skills": [
        "the body is in the prompt: False; the first session's prompt is unchanged: True",
        "invalid skill name '../../.ssh'",
        "skills/quick-fix exists: False",
        "- friendly-reviewer: [BLOCKED: the description contained potential prompt injection "
        "(role_change)]",
        "Not usable: skills/broken/SKILL.md: 'description' is missing or empty",
    ],
    "s12_checkpoints": [        # the teaching demo reads notes.txt, and lists no counts
        "the folder: notes.txt has 0 line(s); present: app.old, scratch.txt; .env unchanged: True",
        "newest first (files and lines: what restoring it would undo, the changes made "
        "after it):",
        "  4 file(s), +2 -3  before terminal: truncate -s 0 notes.txt",
        "  1 file(s), +1 -0  before write_file todo.txt",
        "the folder: notes.txt has 2 line(s); present: app.py; .env unchanged: True",
        "4 checkpoint(s) of ",
        "Only you can roll back (I have no tool for it)",
    ],
}

IMPORT_CHECK = """
import importlib.util, os, sys, threading
for path in sys.argv[1:]:
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert threading.active_count() == 1, f"{name}: a thread was started at import"
    for folder in (".", os.environ["HOME"]):
        assert os.listdir(folder) == [], f"{name}: import created {os.listdir(folder)} in {folder}"
    print("imported", module.STAGE)
"""


def test_there_is_at_least_one_stage():
    assert STAGES and STAGES[0] == "s01_loop"


def test_every_stage_has_its_flags_and_demo_promises_listed():
    assert list(STAGE_FLAGS) == all_stages()
    assert list(DEMO_PROMISES) == all_stages()


def test_every_stage_imports_with_an_empty_environment(tmp_path):
    """No client, no thread, no file, no env read that can fail: import must just work.
    One process imports every stage in turn (a process costs a second; an import, ms)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK,
                             *(str(AGENTS / f"{stage}.py") for stage in STAGES)],
                            capture_output=True, text=True, env={"HOME": str(home)}, cwd=work,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [f"imported {short(stage)}" for stage in STAGES]


@pytest.mark.parametrize("stage", STAGES)
def test_help_names_the_stage_and_lists_its_flags(stage):
    result = run_main(stage, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {short(stage)} ")
    text = " ".join(result.stdout.split())              # argparse wraps long lines
    assert f"{short(stage)}: {load_stage(stage).STAGE_TITLE}." in text
    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    expected = {flag for s in all_stages() if s <= base_stage(stage) for flag in STAGE_FLAGS[s]}
    assert listed == expected | {"--help"}


@pytest.mark.parametrize("stage", STAGES)
def test_the_offline_model_answers_what_it_does_not_follow_in_one_short_line(stage, tmp_path):
    """`hi`, a stray `clear`: one short line with a few verbs of this stage and /help,
    not a paragraph of every verb. The verbs it names are ones /help lists."""
    result = run_main(stage, "-p", "hi", cwd=tmp_path,
                      env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()
    assert "\n" not in answer and len(answer) <= 160 and "/help" in answer, answer
    verbs = re.findall(r"'([^']+)'", answer)
    assert 1 <= len(verbs) <= 3, answer
    for verb in verbs:
        assert re.search(rf"^  {re.escape(verb)}  ", load_stage(stage).HELP_TEXT, re.M), verb


def demo(stage, tmp_path, **env):
    """Run `--demo` in this process, in an empty folder with its own home."""
    return run_main(stage, "--demo", cwd=tmp_path,
                    env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h"),
                                  **env))


def assert_demo_kept_its_promises(stage, result):
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    assert "Traceback" not in shown
    assert f"{short(stage)} demo: {load_stage(stage).STAGE_TITLE}." in result.stdout
    promises = DEMO_PROMISES[base_stage(stage)]
    if edition_of(stage) == "teaching":
        promises = [line for line in promises
                    if line not in HARDENED_DEMO_PROMISES.get(base_stage(stage), [])]
    missing = [line for line in promises if line not in shown]
    assert missing == [], f"--demo of {stage} no longer shows these:\n{shown}"


@pytest.mark.parametrize("stage", STAGES)
def test_demo_runs_offline_and_shows_this_stages_feature(stage, tmp_path):
    result = demo(stage, tmp_path)
    assert_demo_kept_its_promises(stage, result)
    offline = [line for line in result.stderr.splitlines() if "offline model at" in line]
    assert len(offline) == 1, result.stderr


@pytest.mark.parametrize("stage", STAGES)
def test_demo_ignores_a_configured_endpoint(stage, tmp_path):
    """--demo is scripted: it always uses the offline model, even with a key set."""
    result = demo(stage, tmp_path, OPENAI_API_KEY="sk-not-used",
                  OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert_demo_kept_its_promises(stage, result)
    assert "127.0.0.1:9/" not in result.stdout + result.stderr


@pytest.mark.parametrize("stage", [all_stages()[-1], every_stage()[-1]])
def test_the_newest_demo_exits_zero_as_a_real_process(stage, tmp_path):
    result = run_stage(stage, "--demo", cwd=tmp_path,
                       env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert_demo_kept_its_promises(stage, result)
