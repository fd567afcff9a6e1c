"""notebooks/colab_tpu.ipynb, executed end to end on CPU at a tiny size, and its outputs.

The parameters cell keeps the Colab defaults; a cell after it (as papermill injects one) sets
BERT-tiny, 6 steps, batch 8, float32 and a small theory-setting analysis. The kernel is a
child process: it inherits the 8 fake CPU devices and the persistent compilation cache of
tests/conftest.py through the environment, and the sizes are those other tests compile
(the Pre-LN run is tests/test_trainer.py's `tiny_config` at 6 steps; the analysis is
tests/test_analysis.py's theory setting), so in a whole-suite run most programs compile once.

The install cell, which the executed notebook skips (ln_jax is importable), is run here on its
own: without code it says how to upload an archive; a folder, an archive or a URL gives the
checkout (a clone there is updated, never cloned into), without a real clone or install; a
checkout folder named `ln_jax` in the working folder is not taken for the package.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import jax
import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")
KernelManager = pytest.importorskip("jupyter_client").KernelManager

pytest_plugins = ("tests.data_fixtures",)
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "colab_tpu.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny_parameters(workdir: Path, data_dir: str) -> dict:
    return {
        "SIZE": "tiny",
        "STEPS": 6,
        "BATCH": 8,
        "WARMUP": None,  # the recipe's 1% of the run: 1 step
        "DTYPE": "float32",
        "MESH": (2, 2, 2),  # tiny_config's mesh (the notebook's own choice would be 8 x 1 x 1)
        "EVAL_EVERY": 3,
        "EVAL_BATCHES": 1,
        "LOG_EVERY": 1,
        "WORKDIR": str(workdir),
        "DATA_DIR": data_dir,
        # tests/test_analysis.py's theory setting: d = 32, 8 sequences of 16 vectors.
        "ANALYSIS_OVERRIDES": {
            "model.hidden_size": 32,
            "data.global_batch_size": 8,
            "data.max_seq_length": 16,
        },
        "ANALYSIS_DEPTHS": (6, 14),
        "ANALYSIS_SEEDS": 1,
        "ANALYSIS_BATCHES": 1,
    }


def with_parameters(nb, values: dict):
    """`nb` with a cell setting `values` right after the cell tagged "parameters"."""
    (index,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    declared = set(re.findall(r"^([A-Z_]+) = ", nb.cells[index].source, re.M))
    assert set(values) <= declared, set(values) - declared  # no parameter the notebook lacks
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


def cell_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def cell_images(cell) -> list[str]:
    return [o for o in cell.outputs if "image/png" in o.get("data", {})]


def records(workdir: Path, split: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > min_bytes, (path, len(data))


@pytest.fixture(scope="module")
def executed(tmp_path_factory, data_dir):
    """(the executed notebook, its WORKDIR)."""
    workdir = tmp_path_factory.mktemp("notebook") / "runs"
    nb = with_parameters(nbformat.read(NOTEBOOK, as_version=4), tiny_parameters(workdir, data_dir))
    # The kernel on local sockets, not TCP (which made ipykernel warn of eavesdropping).
    kernel = KernelManager(
        kernel_name="python3",  # jupyter_client starts it with this interpreter
        transport="ipc",
        ip=str(workdir.parent / "kernel"),
    )
    client = nbclient.NotebookClient(
        nb, km=kernel, timeout=300, resources={"metadata": {"path": str(workdir.parent)}}
    )
    # ln_jax importable in the kernel even where it is not installed (pytest finds it from the
    # checkout's root): the install cell must skip, never clone.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    try:
        client.execute(env={**os.environ, "PYTHONPATH": path})
    finally:
        if kernel.has_kernel:  # the client shuts down only a kernel it started itself
            kernel.shutdown_kernel()
    return nb, workdir


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert [c for c in code if "parameters" in c.metadata.get("tags", [])]


def test_notebook_runs_both_recipes_and_draws_the_figures(executed):
    nb, workdir = executed
    code = [c for c in nb.cells if c.cell_type == "code"]
    text = "\n".join(cell_text(c) for c in code)
    n = jax.device_count()  # the kernel sees the same fake devices
    assert f"backend cpu, {n} devices:" in text and text.count("  cpu: ") == n
    assert f"mesh: data=2 fsdp=2 tensor=2 ({n} devices)" in text
    assert "TFLOP per step" in text

    pre, post = workdir / "bert_preln_tiny", workdir / "bert_postln_tiny"
    for run in (pre, post):
        evals = records(run, "eval")
        assert [r["step"] for r in evals] == [3, 6], run
        assert all(math.isfinite(r["mlm_loss"]) and math.isfinite(r["loss"]) for r in evals)
        assert [r["step"] for r in records(run, "train")] == list(range(1, 7))
        assert (run / "checkpoints" / "6").is_dir()
    # The recipes: Pre-LN starts at its peak (no warm-up); Post-LN warms up for 1 step.
    pre_lr = [r["learning_rate"] for r in records(pre, "train")]
    post_lr = [r["learning_rate"] for r in records(post, "train")]
    assert pre_lr[0] == pytest.approx(3e-4) and pre_lr[-1] < pre_lr[0]
    assert post_lr[0] < post_lr[1] == pytest.approx(1e-4, rel=0.25)
    pre_final, post_final = records(pre, "eval")[-1], records(post, "eval")[-1]
    assert pre_final["mlm_loss"] != post_final["mlm_loss"]
    assert "bert_preln_tiny: step 6 in" in text
    assert f"validation MLM loss {pre_final['mlm_loss']:.4f}" in text
    assert f"validation MLM loss {post_final['mlm_loss']:.4f}" in text

    # Figures: saved as PNGs and shown inline, one per figure cell.
    assert_png(workdir / "validation_curves.png")
    assert_png(workdir / "gradients_at_init.png")
    images = [c for c in code if cell_images(c)]
    assert len(images) == 2 and all(len(cell_images(c)) == 1 for c in images)
    assert f"last {post_final['mlm_loss']:.4f} at step 6" in text
    for placement in ("post", "pre"):
        norms = re.search(rf"^{placement}-LN \|\|dL/dW2\|\| at init: (.*)$", text, re.M)
        values = [float(v) for v in re.findall(r"L=\d+: ([0-9.]+)", norms.group(1))]
        assert len(values) == 2 and all(v > 0 for v in values), norms.group(0)


# --------------------------------------------------------------------------- the install cell


def install_cell_source() -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if "def find_checkout" in c.source]
    return cell.source


def install_cell() -> dict:
    """The install cell's functions and classes: its source run here (ln_jax is importable, so
    it installs nothing), `subprocess.run` recorded by the test that asks."""
    namespace: dict = {"REPO_URL": None}
    exec(compile(install_cell_source(), "install cell", "exec"), namespace)  # noqa: S102
    return namespace


def repo_url() -> str | None:
    """REPO_URL as committed."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    namespace: dict = {}
    line = re.search(r"^REPO_URL = .*$", params.source, re.M).group(0)
    exec(line, namespace)  # noqa: S102
    return namespace["REPO_URL"]


@pytest.fixture
def commands(monkeypatch, tmp_path) -> list[list[str]]:
    """The commands the install cell runs (none really), from `tmp_path` as the cwd."""
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(list(cmd)))
    monkeypatch.chdir(tmp_path)
    return ran


def fake_checkout(folder: Path) -> Path:
    """A folder that looks like the repository to the install cell."""
    (folder / "ln_jax").mkdir(parents=True)
    (folder / "pyproject.toml").write_text('[project]\nname = "ln_jax"\n')
    (folder / "ln_jax" / "__init__.py").write_text('WHERE = "the fake checkout"\n')
    return folder


def test_no_placeholder_address_and_without_code_it_says_how_to_upload_it(commands, tmp_path):
    """The badge and REPO_URL said OWNER; until there is a public address, the notebook says
    how to bring the code: an archive made with git archive, uploaded."""
    text = NOTEBOOK.read_text()
    assert "OWNER" not in text and "github.com/" not in text
    assert (
        "git archive --format=tar.gz -o ln_jax.tar.gz HEAD"
        in nbformat.read(NOTEBOOK, as_version=4).cells[0].source
    )
    assert repo_url() is None
    cell = install_cell()
    with pytest.raises(cell["SetRepoUrl"]) as err:
        cell["find_checkout"](None)
    shown = err.value._render_traceback_()  # what the notebook shows: these lines, no traceback
    assert shown[0].startswith(f"ln_jax's code is not in {tmp_path} yet. In a checkout of")
    assert shown[1] == "  git archive --format=tar.gz -o ln_jax.tar.gz HEAD"
    assert shown[2].startswith(f"upload ln_jax.tar.gz to {tmp_path} (the Files pane)")
    assert commands == []  # no git clone


def test_a_folder_or_an_archive_is_the_checkout_and_a_url_is_cloned_once(commands, tmp_path):
    cell = install_cell()
    find = cell["find_checkout"]
    assert find(str(ROOT)) == str(ROOT)
    source = fake_checkout(tmp_path / "src" / "ln_jax-main")
    with zipfile.ZipFile(tmp_path / "ln_jax-main.zip", "w") as z:  # GitHub's "Download ZIP"
        for path in source.rglob("*"):
            z.write(path, path.relative_to(source.parent))
    with tarfile.open(tmp_path / "code.tar.gz", "w:gz") as t:
        t.add(source, arcname="ln_jax-main")
    unpacked = Path(find(str(tmp_path / "code.tar.gz")))
    assert (unpacked / "pyproject.toml").is_file() and unpacked.name == "ln_jax-main"
    assert find(None) == str(unpacked)  # unpacked before: used again, not unpacked twice
    shutil.rmtree(unpacked.parent)
    # REPO_URL = None: an uploaded ln_jax*.zip (or the .tar.gz git archive makes) is used.
    unpacked = Path(find(None))
    assert (unpacked / "ln_jax" / "__init__.py").is_file(), unpacked
    assert commands == []
    with pytest.raises(cell["SetRepoUrl"], match="no such folder or archive"):
        find(str(tmp_path / "ln_jx"))
    url = "https://github.com/someone/ln_jax"
    assert find(url) == str(tmp_path / "ln_jax")
    assert commands == [["git", "clone", "--depth=1", url, str(tmp_path / "ln_jax")]]
    # The clone is there (a second run of the cell, after a restart): updated, not re-cloned.
    fake_checkout(tmp_path / "ln_jax")
    (tmp_path / "ln_jax" / ".git").mkdir()
    assert find(url) == str(tmp_path / "ln_jax") == find(None)
    assert commands[1] == ["git", "-C", str(tmp_path / "ln_jax"), "pull", "--ff-only", "--quiet"]
    assert len(commands) == 2


def test_a_checkout_folder_named_ln_jax_in_the_working_folder_is_used_not_imported_empty(
    tmp_path,
):
    """The cell's own clone goes to ./ln_jax, which Python then took for an empty namespace
    package `ln_jax` (`ln_jax.__file__` None: TypeError) and skipped the install. Now the
    checkout there is used and its package imported. A fresh interpreter in that folder, as
    after Colab's *Restart session*; pip recorded, not run."""
    fake_checkout(tmp_path / "ln_jax")
    prelude = (
        "import subprocess\n"
        "subprocess.run = lambda cmd, **kw: print('ran', cmd[:4])\n"
        "REPO_URL = 'https://github.com/someone/ln_jax'\n"
        # What the old cell imported: the folder as an empty package (where pip's editable
        # install is a finder, as here and on Colab; not where it is a path in a .pth file).
        "import ln_jax as first\n"
        "print('shadowed' if first.__file__ is None else 'installed', flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", prelude + install_cell_source()],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]  # was: TypeError ... NoneType
    assert "'clone'" not in out.stdout  # never cloned into itself
    if "shadowed" in out.stdout:
        assert f"ln_jax from {tmp_path / 'ln_jax'}\n" in out.stdout, out.stdout


def test_the_install_command_is_editable_and_names_jax_tpu_on_a_tpu(monkeypatch):
    cell = install_cell()
    command = cell["install_command"]
    monkeypatch.setitem(cell, "glob", type("NoDevices", (), {"glob": staticmethod(lambda p: [])}))
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    assert command("/content/ln_jax")[-2:] == ["--editable", "/content/ln_jax"]
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    assert command("/content/ln_jax")[-3:] == ["--editable", "/content/ln_jax", "jax[tpu]"]
