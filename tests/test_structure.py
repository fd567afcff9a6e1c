"""The structure the issues ask for, checked on the source: no import cycle inside ln_jax, and a
trainer that names no placement (placements own their set-up)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ln_jax.nn.placements import PLACEMENTS

PACKAGE = Path(__file__).resolve().parents[1] / "ln_jax"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """ln_jax module -> the ln_jax modules it imports, anywhere in the file (function-level
    imports too: a cycle hidden in a function is still a cycle)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                targets |= submodules or {node.module}  # `from pkg import module` or a name
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*trail, node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_ln_jax():
    graph = import_graph()
    assert "ln_jax.config.run" in graph and "ln_jax.validate" in graph["ln_jax.config.optim"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


GENERIC = ("ln_jax.train", "ln_jax.compile_check", "ln_jax.xla", "ln_jax.nn", "ln_jax.analysis")


def test_the_generic_modules_import_no_model_family():
    """The trainer, its steps, the ahead-of-time check and the layers work through the task
    boundary (ln_jax/task.py) and import no model family."""
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith(GENERIC):
            families = {t for t in targets if t.startswith("ln_jax.models")}
            assert not families, f"{module} imports {families}"


DATA_FAMILIES = ("ln_jax.data.bert", "ln_jax.data.translation")


def test_the_generic_data_imports_no_family_s_data():
    """`ln_jax.data`'s shared modules (sources, tokenizer, stream, global batches) import no
    family's data package and no model family; a family's data imports no other family's."""
    graph = import_graph()
    generic = [m for m in graph if m.startswith("ln_jax.data") and not m.startswith(DATA_FAMILIES)]
    assert {"ln_jax.data.batches", "ln_jax.data.stream", "ln_jax.data.sources"} <= set(generic)
    for module in generic:
        bad = {t for t in graph[module] if t.startswith((*DATA_FAMILIES, "ln_jax.models"))}
        assert not bad, f"{module} imports {bad}"
    for family in DATA_FAMILIES:
        other = next(f for f in DATA_FAMILIES if f != family)
        for module in (m for m in graph if m.startswith(family)):
            assert not {t for t in graph[module] if t.startswith(other)}, module


def test_no_file_over_600_lines_and_no_function_over_80():
    """In ln_jax/, bench/ and tests/ (issue 66)."""
    files = [
        p for root in ("ln_jax", "bench", "tests") for p in (PACKAGE.parent / root).rglob("*.py")
    ]
    long_files = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in files
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long_files, long_files
    long_functions = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long_functions.append(f"{p.relative_to(PACKAGE.parent)}:{node.name} {length}")
    assert not long_functions, long_functions


@pytest.mark.parametrize("name", ["trainer.py", "setup.py", "loop.py"])
def test_the_trainer_names_no_placement(name):
    words = set()
    for node in ast.walk(ast.parse((PACKAGE / "train" / name).read_text())):
        if isinstance(node, ast.Name | ast.alias):
            words.add(getattr(node, "id", None) or node.name)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words |= set(node.value.replace(".", " ").replace("_", " ").split())
    named = {p for p in (*PLACEMENTS, "mixln", "omega") if p in words}
    assert not named, f"ln_jax/train/{name} names placements {named}"


def test_every_placement_row_has_a_colour_of_its_own():
    """Plots over all placements (analysis, studies) must not draw two rows alike."""
    from ln_jax.nn.placements import PLACEMENTS
    from ln_jax.results import arm_colour

    colours = [arm_colour(p, i) for i, p in enumerate(PLACEMENTS)]
    assert len(set(colours)) == len(PLACEMENTS), dict(zip(PLACEMENTS, colours, strict=True))


def test_the_depth_studys_arms_have_colours_of_their_own():
    """Recipe arms (admin_warmup, deepnorm_alpha_warmup, ...) take their row's colour, and
    admin_radam one apart from admin_warmup; none falls back to black."""
    from ln_jax.experiments import grids
    from ln_jax.results import arm_colour

    colours = {a: arm_colour(a) for a in grids.DEPTH_ARMS}
    assert len(set(colours.values())) == len(colours), colours
    assert "black" not in colours.values(), colours
    assert colours["deepnorm_alpha_warmup"] == arm_colour("deepnorm_alpha")


def test_the_warmup_studys_post_ln_cells_have_colours_of_their_own():
    from ln_jax.experiments import grids
    from ln_jax.results import arm_colour

    arms = sorted({cell[1] for cell in grids.warmup_cells()})
    assert len({arm_colour(a) for a in arms}) == len(arms), arms


def _top_level() -> tuple[set[str], set[str]]:
    """(ln_jax's top-level modules, its packages), as named in docs/layout.md: `task.py`,
    `nn/`."""
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    packages = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return modules, packages


def test_the_layout_map_names_every_top_level_module_and_package():
    """docs/layout.md, the map a newcomer reads first, matches ln_jax/'s top level: each module
    and package on a line of its own (two spaces in), and nothing that is not there."""
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text()
    named = {m.group(1) for m in re.finditer(r"^  ([a-z_]+(?:\.py|/))", layout, flags=re.M)}
    modules, packages = _top_level()
    assert named == modules | packages, {
        "missing from docs/layout.md": sorted((modules | packages) - named),
        "named but not in ln_jax/": sorted(named - modules - packages),
    }


def test_the_top_level_holds_at_most_8_modules():
    """The top level shows the architecture: its code lives in packages, and only a few
    modules (the base ones and the commands' thin modules) stand beside them."""
    modules, _ = _top_level()
    assert len(modules) <= 8, sorted(modules)


def test_the_bench_readme_names_every_file_by_its_path():
    """bench/README.md's table names every file under bench/ by its path (issue 66), and every
    bench/ path it names, in a table or a command, exists; docs/layout.md names each folder."""
    root = PACKAGE.parent
    files = {
        p.relative_to(root).as_posix()
        for p in (root / "bench").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    readme = (root / "bench" / "README.md").read_text()
    rows = set(re.findall(r"^\| `(bench/[^`]+)` \|", readme, flags=re.M))
    named = set(re.findall(r"(?<![\w./-])(bench/[\w/.-]+\.(?:py|sh|md))\b", readme))
    assert files and rows == files, {
        "not in bench/README.md's table": sorted(files - rows),
        "in the table but not in bench/": sorted(rows - files),
    }
    assert named <= files, sorted(named - files)
    layout = (root / "docs" / "layout.md").read_text()
    folders = {p.parent.relative_to(root).as_posix() + "/" for p in root.glob("bench/*/*")}
    assert folders and not [f for f in sorted(folders) if f not in layout]
