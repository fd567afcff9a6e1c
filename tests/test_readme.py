"""The README: one screen or so, its Python blocks run as written on the tests' 8 devices and
on a plain machine's one, and every local link of the README and the docs pages points at a
file that exists."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 250  # issue 32: what, the two commands, the main job, the library, the results


def python_blocks() -> list[str]:
    """Every ```python block of the README, in order."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    assert len(blocks) == text.count("```python"), "a ```python block the pattern misses"
    return blocks


def expected_shapes(devices: int) -> list[str]:
    """What the library snippet prints: MLM logits (batch = device count, P = 2, vocabulary)
    and the per-layer records (2 layers of BERT-tiny, batch, 16 tokens, width 128)."""
    return [f"({devices}, 2, 1000)", f"(2, {devices}, 16, 128)"]


def test_the_readme_is_about_one_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_readme_python_blocks_run_as_written():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in python_blocks():
            exec(compile(block, "README.md", "exec"), {})  # noqa: S102
    assert printed.getvalue().splitlines() == expected_shapes(8)  # the tests' 8 fake devices


def test_the_readme_python_blocks_run_on_one_device(tmp_path):
    """As a user runs them: a fresh interpreter, no XLA_FLAGS (one CPU device), elsewhere
    than the checkout (ln_jax from the path the tests import it from)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    printed = []
    for block in python_blocks():
        out = subprocess.run(
            [sys.executable, "-c", block],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        printed += out.stdout.splitlines()
    assert printed == expected_shapes(1)


def test_local_links_of_the_readme_and_docs_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if not target.startswith("http") and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
