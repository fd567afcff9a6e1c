"""The README's Python blocks run as written (here on the tests' 8 devices), and every local
link of the README and the docs pages points at a file that exists."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_python_blocks_run_as_written():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})  # noqa: S102
    assert "(8, 2, 1000)" in printed.getvalue()  # batch = device count, P = 2, vocabulary


def test_local_links_of_the_readme_and_docs_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if not target.startswith("http") and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
