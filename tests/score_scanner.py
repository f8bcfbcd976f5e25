"""Score the s04 context-file scanner on the public tables, for both editions.

    python tests/score_scanner.py                   the figures for every table
    python tests/score_scanner.py --list tuned      also name each wrong judgement on the
                                                    tuned cases (use this while you work)
    python tests/score_scanner.py --list held_out   … and on the held-out ones (at the end)

The tables:

- MALICIOUS and BENIGN in tests/test_s04_prompt_builder.py: one-line samples. A
  MALICIOUS row counts as caught when the finding it names is reported.
- tests/context_files/: whole project files written as real projects write them.
- tests/scanner_cases/: whole AGENTS.md-style files, hard benign ones (phrases a pattern
  matcher trips on) and poisoned ones (the attacks a pattern matcher misses), in two
  splits. "tuned" is what the rules were improved against; "held_out" was written at
  the same time and only scored at the end. A file counts as caught or blocked when
  find_injection() reports anything.

Recall is caught / poisoned; "blocked" on a benign table is the share of files the
agent would lose.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from helpers import HARDENED, load_stage

TESTS = Path(__file__).resolve().parent
CASES = TESTS / "scanner_cases"
SPLITS = ("tuned", "held_out")
STAGE = "s04_prompt_builder"


def case_files(split: str, kind: str) -> list[Path]:
    """The files of one split ("tuned", "held_out") and kind ("benign", "poisoned")."""
    return sorted((CASES / split / kind).glob("*.md"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def one_line_tables():
    """MALICIOUS and BENIGN from the s04 tests (imported, so there is one copy)."""
    sys.path.insert(0, str(TESTS))
    import test_s04_prompt_builder as s04_tests
    return s04_tests.MALICIOUS, s04_tests.BENIGN


def score(stage, split_to_list: str | None = None) -> list[tuple[str, str, str]]:
    """(table, poisoned caught, benign blocked) rows for one edition's scanner; prints
    the wrong judgements of `split_to_list` as it goes."""
    malicious, benign = one_line_tables()
    rows = []
    caught = sum(finding in stage.find_injection(text) for text, finding in malicious)
    blocked = sum(bool(stage.find_injection(text)) for text in benign)
    rows.append(("MALICIOUS (one-line rows)", ratio(caught, len(malicious)), ""))
    rows.append(("BENIGN (one-line rows)", "", f"{blocked}/{len(benign)}"))
    project = sorted((TESTS / "context_files").iterdir())
    blocked = sum(bool(stage.find_injection(read(path))) for path in project)
    rows.append(("context_files/", "", f"{blocked}/{len(project)}"))
    for split in SPLITS:
        wrong = []
        poisoned, benign_files = case_files(split, "poisoned"), case_files(split, "benign")
        missed = [path for path in poisoned if not stage.find_injection(read(path))]
        flagged = [(path, stage.find_injection(read(path))) for path in benign_files]
        flagged = [(path, found) for path, found in flagged if found]
        wrong += [f"    missed   {path.name}" for path in missed]
        wrong += [f"    blocked  {path.name}: {', '.join(found)}" for path, found in flagged]
        rows.append((f"scanner_cases/{split}",
                     ratio(len(poisoned) - len(missed), len(poisoned)),
                     f"{len(flagged)}/{len(benign_files)}"))
        if split == split_to_list and wrong:
            rows.append(("\n".join(wrong), "", ""))
    return rows


def ratio(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.2f})" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", choices=SPLITS, help="name the wrong judgements on a split")
    args = parser.parse_args()
    print(f"{'edition':10}{'table':28}{'poisoned caught':>20}{'benign blocked':>17}")
    for edition, prefix in (("teaching", ""), ("hardened", HARDENED)):
        stage = load_stage(prefix + STAGE)
        for table, caught, blocked in score(stage, args.list):
            if "\n" in table or table.startswith("    "):
                print(table)
                continue
            print(f"{edition:10}{table:28}{caught:>20}{blocked:>17}")


if __name__ == "__main__":
    main()
