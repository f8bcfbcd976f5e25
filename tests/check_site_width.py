"""Is a 100-character line of code shown whole on the site at 1280 px? (curriculum §6)

    python tests/check_site_width.py                # builds the site, then measures
    python tests/check_site_width.py --site site/   # measures an already built site

It adds a page with a 100-character code line, at the top level and inside an admonition,
builds the site with mkdocs, opens the page in headless Chromium (Debian's `chromium`) at
1280 × 900 and reads each code block's scrollWidth and clientWidth: a block whose content is
wider than its box would scroll, and the check fails. Not collected by pytest (no test_
prefix): it needs a browser, which CI does not install.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = "x = " + "'" + "a" * 94 + "'"          # 100 characters, like the longest stage line
PAGE = f"""# Width check

```python
{LINE}
```

??? note "Inside an admonition"

    ```python
    {LINE}
    ```
"""
MEASURE = """<script>
window.addEventListener('load', () => {
  document.title = 'WIDTHS ' + [...document.querySelectorAll('pre > code')]
    .map(c => c.scrollWidth + '/' + c.clientWidth).join(' ');
});
</script>"""


def build_site(folder: Path) -> Path:
    """A copy of the docs with the width page added, built into folder/site."""
    docs = folder / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "en" / "width-check.md").write_text(PAGE, encoding="utf-8")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    (folder / "mkdocs.yml").write_text(config, encoding="utf-8")
    shutil.copy(ROOT / "docs_hooks.py", folder / "docs_hooks.py")
    for name in ("agents", "course"):
        (folder / name).symlink_to(ROOT / name)
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(folder / "mkdocs.yml"),
                    "--site-dir", str(folder / "site")], check=True)
    return folder / "site"


def widths(page: Path, browser: str) -> list[tuple[int, int]]:
    measured = page.with_name("measured.html")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"),
                        encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,900",
             "--virtual-time-budget=3000", "--dump-dom", measured.as_uri()],
            capture_output=True, text=True, timeout=120).stdout
    found = re.search(r"<title>WIDTHS ([^<]*)</title>", dom)
    if not found:
        sys.exit("check_site_width: the browser did not report the widths")
    return [tuple(map(int, pair.split("/"))) for pair in found.group(1).split()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    if not shutil.which(args.browser):
        sys.exit("check_site_width: no chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as folder:
        site = build_site(Path(folder))
        found = widths(site / "width-check" / "index.html", args.browser)
    for (scroll, client), where in zip(found, ("top level", "in an admonition")):
        verdict = "whole" if scroll <= client else "cut"
        print(f"100-character line, {where}: content {scroll} px, box {client} px: {verdict}")
    return 0 if found and all(scroll <= client for scroll, client in found) else 1


if __name__ == "__main__":
    sys.exit(main())
