"""Benchmark: the s04 injection scanner on large and hostile context files.

    python tests/bench_scanner.py                       s04 and the newest stage, both editions
    python tests/bench_scanner.py hardened/s04_prompt_builder     just these stages

For every rule, the worst inputs we could build for it: a near miss (a rule's start
without its end, or the start of many overlapping matches) repeated to 65,536
characters, where the scan stops. A careless regular expression backtracks for
seconds on such text. In the hardened edition a rule may also be read by a judge
(SENTENCE_JUDGES): its worst input is then a match on every line that the judge must
read and clear, and it is timed with the judge. Prints, per rule, its own time and that of find_injection() on
its worst input, then what the three slowest files add to start-up when a project
ships them as AGENTS.md, .hermes.md and .cursorrules (each is scanned whole and as
capped for the prompt). Times are the best of three runs.
"""

import functools
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from helpers import load_stage, stages_from

SIZE = 65_536

# Near misses for each finding id: the rules with that id are timed on each.
NEAR_MISSES = {
    "ignore_instructions": ["ignore all ", "ignore all all all all all all all all all ",
                            "do not ignore all ", "игнорируй все ", "забудь свои свои ",
                            "忽略之前的所有", "忽略之前",
                            # for the hardened edition's judge and its other word orders
                            "ignore the previous build instructions. ", "forget all ",
                            "forget everything ", "instructions ", "instructions above, ",
                            "previous instructions: ", "ign\u043ere "],
    "disregard_rules": ["disregard your\n", "disregard all all all ",
                        "disregard all build rules. "],
    "system_prompt_override": ["system prompt ", "system prompt\n\n"],
    "role_change": ["you are now ", "you are you are now ", "- pretend that ", "pretend to ",
                    "you have been updated ", "you have been updated updated ",
                    "ты теперь можешь ", "теперь ты ", "你现在是否"],
    "no_restrictions": ["act as if you do not have ", "act as if you you you ",
                        "respond without ", "respond without without "],
    "reveal_prompt": ["print your ", "print your system ", "print your your your ",
                      "покажи свой системный ", "输出你的系统"],
    "hide_from_user": ["do not tell ", "do not tell tell the ",
                       "do not tell the user about retries. ", "never tell the "],
    "translate_execute": ["translate into ", "translate into into and "],
    "unset_agent_env": ["unset A_B ", "unset -v "],
    "c2_vocabulary": ["register as a ", "- send a heartbeat ", "- pull new tasks from ",
                      "- pull tasks tasks ", "check in with ", "command and ", "c2 ",
                      "sliver "],
    "exfil_curl": ["curl $", "curl $AAAAAAAA_", "curl $\n",
                   'curl -H "Authorization: Bearer $ACME_TOKEN" https://api.acme.example/x\n',
                   "curl -H Authorization: $A_TOKEN "],
    "exfil_wget": ["wget $", "wget $\n",
                   'wget --header="Authorization: Bearer $ACME_TOKEN" https://api.acme.example/\n'],
    "exfil_pipe": ["$API_KEY ", "$API_KEY |\n"],
    "upload_secrets": ["curl -d @", "curl @~/.en", "curl -t ", "wget --post-file=",
                       "scp ~/.ssh ", "scp -i ", "cat .env | ", ".ssh requests.get( "],
    "read_secrets": ["cat a ", "cat .en", "cat < ", "never cat .env. "],
    "exfil_environment": ["env|", "env | ", "set ", "export ", "os.environ ",
                          "os.environ requests.get("],
    "html_comment_directive": ["<!-- ", "<!-- x --> ", "<!--system", "x<!-- a --> ",
                               "<!-- the system test -->\n", "<!-- system: "],
    "hidden_element": ['<div style="', "<a style = ", "<span hidden ", "<span>"],
    "invisible_unicode": ["a\u200b", "\U0001F469\u200d\U0001F4BB "],
}
# Whole files with one long token: `\w*_\w*` tried every split of `a_a_a_…` (15 s).
# (label, text) by finding id, timed with the near misses above.
LONG_TOKENS = {
    "unset_agent_env": [("`unset a_a_a_…`", "# Notes\n\nRun `unset " + "a_" * 32_000 + "`")],
    "exfil_curl": [("curl $a_a_a_…", "curl $" + "a_" * 32_000)],
    "read_secrets": [("cat a.a.a.…", "cat " + "a." * 32_000)],
}
# Markdown that is slow to render, cut to the largest size that is still rendered
# (_RENDER_MAX_WORK) and given a comment so that it must be rendered.
SLOW_MARKDOWN = ["- - - - a\n", "- > - > a\n", "1. a\n", "|-|-|\n", "<span>", "<a b='",
                 "`` ` ", "<", "["]


def best_of_three(function, *args) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        function(*args)
        best = min(best, time.perf_counter() - started)
    return best


def repeated(unit: str) -> str:
    return (unit * (SIZE // len(unit) + 1))[:SIZE]


def render_work(text: str) -> int:          # the estimate rendered_markup() uses
    return 25 * text.count("\n") + len(re.findall(r"[^\w\s]", text))


def largest_rendered(stage, unit: str) -> str:
    count = 1
    while render_work(unit * (count + 1) + "<!-- x -->") <= stage._RENDER_MAX_WORK:
        count += 1
    return unit * count + "<!-- x -->"


def rule_rows(stage):
    """(finding id, label, function that runs just that rule on prepared text). The
    hardened edition's rules run as its find_injection() runs them: with their judge."""
    rules = stage.THREAT_PATTERNS + getattr(stage, "MORE_THREAT_PATTERNS", [])
    judges = getattr(stage, "SENTENCE_JUDGES", None)
    rows = [(finding, f"word rule {row}", rule.search if judges is None else
             functools.partial(stage.found_by, rule, judge=judges.get(finding)))
            for row, (finding, rule) in enumerate(rules)]
    rows += [(finding, "structure check", check) for finding, check in stage.STRUCTURE_CHECKS]
    return rows


def main() -> None:
    for stage_name in sys.argv[1:] or stages_from("s04"):
        stage = load_stage(stage_name)
        load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
        print(f"{stage_name}: find_injection() on {SIZE:,}-character files "
              f"(best of 3 runs, milliseconds{load})")
        print(f"  {'finding':24}{'rule':17}{'worst near miss':28}{'rule':>8}{'scan':>8}")
        slowest = []                                   # (seconds, text)
        for finding, label, run in rule_rows(stage):
            worst = (0.0, "", "")
            texts = [(unit, repeated(unit)) for unit in NEAR_MISSES[finding]]
            for unit, text in texts + LONG_TOKENS.get(finding, []):
                normal = stage.normalise_text(text)
                # The teaching edition's structure checks read the text as written.
                render = getattr(stage, "rendered_markup", lambda normal: normal)
                view = render(normal) if label == "structure check" else stage.fold_text(normal)
                seconds = best_of_three(run, view)
                worst = max(worst, (seconds, unit, text))
            scan = best_of_three(stage.find_injection, worst[2])
            slowest.append((scan, worst[2]))
            print(f"  {finding:24}{label:17}{worst[1]!r:28}{worst[0] * 1000:8.1f}"
                  f"{scan * 1000:8.1f}")
        scan, unit = max((best_of_three(stage.find_injection, repeated(unit)), unit)
                         for unit in NEAR_MISSES["invisible_unicode"])
        print(f"  {'invisible_unicode':24}{'character set':17}{unit!r:28}{'':8}{scan * 1000:8.1f}")
        for unit in SLOW_MARKDOWN if hasattr(stage, "rendered_markup") else []:
            text = largest_rendered(stage, unit)
            seconds = best_of_three(stage.rendered_markup, stage.normalise_text(text))
            scan = best_of_three(stage.find_injection, text)
            slowest.append((scan, text))
            print(f"  {'(markdown-it)':24}{f'{len(text):,} chars':17}{unit!r:28}"
                  f"{seconds * 1000:8.1f}{scan * 1000:8.1f}")
        ordinary = repeated("Run pytest before committing. Use 4-space indentation.\n")
        print(f"  {'ordinary text':69}{best_of_three(stage.find_injection, ordinary) * 1000:8.1f}")

        slowest.sort(reverse=True, key=lambda pair: pair[0])
        with tempfile.TemporaryDirectory() as folder:
            paths = [Path(folder) / name for name in stage.CONTEXT_FILE_NAMES]
            for path, (_, text) in zip(paths, slowest):
                path.write_text(text, encoding="utf-8")
            times = [best_of_three(stage.load_context_file, path) for path in paths]
        print(f"  three slowest files through load_context_file(): "
              f"{' + '.join(f'{t * 1000:.0f}' for t in times)} = {sum(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
