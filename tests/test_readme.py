"""The README's quick start, as a newcomer copies it (issue 23, item 9)."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def quick_start() -> str:
    return README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_the_quick_start_block_makes_its_own_virtual_environment_first():
    """Copying the block must never install into whatever Python happens to be active."""
    block = re.search(r"```bash\n(.*?)```", quick_start(), re.DOTALL).group(1)
    first, *rest = block.splitlines()
    assert first == "python3 -m venv .venv && . .venv/bin/activate"
    assert rest and rest[0].startswith("pip install")


def test_the_quick_start_says_what_the_test_line_costs():
    """How many packages the last line installs, and how long the suite takes."""
    text = " ".join(quick_start().split())
    assert re.search(r"about \d+ packages", text)
    assert re.search(r"some \d+ minutes", text)
