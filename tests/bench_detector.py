"""Benchmark of the s09 dangerous-command detector.

    python tests/bench_detector.py

Times what the gate does for every command, normalize_command + detect_hardline_command +
detect_dangerous_command, over every row of the public table (tests/permission_commands.jsonl)
for several rounds, then a few 100,000-character commands and the inputs an adversarial review
found slow (long globs, a variable doubling at each level, a huge array). Targets (issue 9): at most 100 µs
per command on average, and nothing over 50 ms. Then the outcome check (issue 22, principle 2):
what checked_run() adds to a command, with 20 skills, memories, allowlist.json, config.yaml and
5 checkpoint stores of 20 checkpoints each: at most 1 ms. Like timeit, the verdict uses the best round
(and each command's best time): other processes on a shared machine only ever add time; the
mean of all rounds is printed too. The detector is pure: nothing is run.
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

from helpers import load_stage  # noqa: E402

ROUNDS = 5
AVERAGE_TARGET_US = 100
SINGLE_TARGET_MS = 50
OUTCOME_TARGET_MS = 1.0
OUTCOME_ROUNDS = 2_000

BIG_COMMANDS = {                       # each about 100,000 characters
    "a huge quoted argument": "echo '" + "x" * 99_985 + "' > notes.txt",
    "a heredoc body": "cat > notes.txt <<'EOF'\n" + "some text\n" * 9_995 + "EOF",
    "a long pipeline": " | ".join(["grep x"] * 11_112),
    "20,000 commands (a;)": "a;" * 50_000,
    "many words": "echo " + "word " * 19_999,
    "many substitutions": "echo " + "$(a) " * 20_000,
}


def _doubling(levels: int) -> str:
    """a=xxxxxxxxxx; b=$a$a…(10×); c=$b$b…: each level ten times longer."""
    names = "abcdefghij"
    return "; ".join(["a=xxxxxxxxxx"] + [f"{names[k]}=" + f"${names[k - 1]}" * 10
                                         for k in range(1, levels)]) + f"; ${names[levels - 1]}"


REVIEW_COMMANDS = {                    # an adversarial review found these slow (seconds)
    "glob rm -rf /*[*[… (6,000)": "rm -rf /" + "*[" * 6000,
    "glob echo > /dev/[[… (8,000)": "echo > /dev/" + "[" * 8000,
    "glob dd of=/dev/*a*a… (50,000)": "dd of=/dev/" + "*a" * 50000,
    "glob rm -rf /?[!x]*… (8,000)": "rm -rf /" + "?[!x]*" * 8000,
    "variable doubling, 8 levels": _doubling(8),
    "variable doubling, 8 levels + rm -rf /": _doubling(8) + "; rm -rf /",
    "array a=(x x …) (40,000)": "a=(" + "x " * 40000 + ")",
}


def gate_checks(stage, command: str, fresh: bool = False) -> float:
    """Seconds for the three questions the gate asks about one command (fresh: with the
    detector's cache emptied first, so that the command is really analysed)."""
    if fresh:
        stage._analyse_cached.cache_clear()
    start = time.perf_counter()
    stage.normalize_command(command)
    stage.detect_hardline_command(command)
    stage.detect_dangerous_command(command)
    return time.perf_counter() - start


def main() -> int:
    stage = load_stage("hardened/s09_permission_system")   # the teaching edition has no parser
    rows = [json.loads(line)["cmd"] for line in
            (TESTS / "permission_commands.jsonl").read_text(encoding="utf-8").splitlines()]
    best = [float("inf")] * len(rows)
    worst_seen, round_averages = 0.0, []
    for _ in range(ROUNDS):
        stage._analyse_cached.cache_clear()       # every round analyses every command anew
        start = time.perf_counter()
        for i, command in enumerate(rows):
            seconds = gate_checks(stage, command)
            best[i] = min(best[i], seconds)
            worst_seen = max(worst_seen, seconds)
        round_averages.append((time.perf_counter() - start) / len(rows))
    average_us = min(round_averages) * 1e6
    slowest = max(range(len(rows)), key=best.__getitem__)

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          f"{len(rows)} commands x {ROUNDS} rounds")
    print(f"average: {average_us:.1f} µs per command in the best round "
          f"(rounds: {', '.join(f'{t * 1e6:.0f}' for t in round_averages)} µs; "
          f"mean of all rounds {sum(round_averages) / len(round_averages) * 1e6:.1f} µs)")
    print(f"slowest command: {best[slowest] * 1e3:.2f} ms (its best of {ROUNDS}) "
          f"{rows[slowest][:60]!r}; slowest single call seen: {worst_seen * 1e3:.2f} ms")
    big_ms = {}
    for name, command in {**BIG_COMMANDS, **REVIEW_COMMANDS}.items():
        seconds = min(gate_checks(stage, command, fresh=True) for _ in range(3))
        finding = [f.key for f in stage.detect_dangerous_command(command)]
        big_ms[name] = seconds * 1e3
        print(f"{len(command):,} characters, {name}: {seconds * 1e3:.1f} ms "
              f"(best of 3) -> {finding or 'safe'}")

    average_met = average_us <= AVERAGE_TARGET_US
    single_met = max([best[slowest] * 1e3, *big_ms.values()]) <= SINGLE_TARGET_MS
    outcome_ms = outcome_check_ms()
    outcome_met = outcome_ms <= OUTCOME_TARGET_MS
    print(f"target ≤ {AVERAGE_TARGET_US} µs average: {'met' if average_met else 'NOT met'}")
    print(f"target nothing over {SINGLE_TARGET_MS} ms (table, big and review commands): "
          f"{'met' if single_met else 'NOT met'}")
    print(f"target outcome check ≤ {OUTCOME_TARGET_MS} ms per command: "
          f"{'met' if outcome_met else 'NOT met'}")
    return 0 if average_met and single_met and outcome_met else 1


def ordinary_state(home: Path) -> int:
    """20 skills (SKILL.md and one script each), the two memory files, allowlist.json,
    config.yaml, and 5 checkpoint stores with 20 refs each, as git writes them."""
    for k in range(20):
        skill = home / "skills" / f"skill-{k:02d}"
        (skill / "scripts").mkdir(parents=True)
        (skill / "SKILL.md").write_text(f"---\nname: skill-{k:02d}\n---\n" + "Step.\n" * 40)
        (skill / "scripts" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (home / "memories").mkdir()
    for name in ("MEMORY.md", "USER.md"):
        (home / "memories" / name).write_text("A fact.\n§\n" * 30)
    (home / "allowlist.json").write_text('{"version": 1, "keys": ["rm_recursive_force"]}')
    (home / "config.yaml").write_text("approvals:\n  mode: manual\n")
    for k in range(5):
        store = home / "checkpoints" / f"project-{k}"
        (store / "refs" / "checkpoints").mkdir(parents=True)
        (store / "HEAD").write_text("ref: refs/heads/main\n")
        (store / "config").write_text("[core]\n\tbare = true\n")
        for n in range(1, 21):
            (store / "refs" / "checkpoints" / f"{n:010d}").write_text("0" * 40 + "\n")
    return sum(1 for _ in home.rglob("*"))


def outcome_check_ms() -> float:
    """What checked_run() adds to one command that changes nothing: OutcomeCheck() before
    it and finish() after it, in the hardened s12 (which watches every kind of state)."""
    stage = load_stage("hardened/s12_checkpoints")
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder) / "state"
        os.environ["LEARN_HERMES_HOME"] = str(home)
        entries = ordinary_state(home)
        stage.OutcomeCheck().finish()               # the first one reads every file once
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(OUTCOME_ROUNDS):
                stage.OutcomeCheck().finish()
            rounds.append((time.perf_counter() - start) / OUTCOME_ROUNDS)
        watched = len(stage.protected_state(stage.protected_roots()))
    ms = min(rounds) * 1e3
    print(f"outcome check: {ms:.3f} ms per command in the best of 5 rounds of "
          f"{OUTCOME_ROUNDS:,} ({watched} entries watched of {entries} in the state folder; "
          f"rounds: {', '.join(f'{r * 1e3:.3f}' for r in rounds)} ms)")
    return ms


if __name__ == "__main__":
    sys.exit(main())
