"""What a lowered program multiplies: every dot_general of its StableHLO, with its operand
dtypes, shapes, FLOPs and the name JAX gave it.

It reads the program as lowered for a platform (a `jax.stages.Lowered`), before XLA compiles
it, so a CPU host can audit what a GPU or TPU would run (`python -m ln_jax.compile_check
--platform=gpu` prints it). The first question it answers: does a bf16 step multiply
anything in float32? On a GPU a float32 GEMM runs as TF32 or float32, at half bf16's rate or
less, and reads twice the bytes.

    census = matmul_census.read(lowered)
    census.float32_gemms()          # [] for a clean bf16 step
    print(census.format())

FLOPs are 2 x output elements x contracted size, per op as written: the step's global shapes
(before SPMD partitioning), a shard's inside a `shard_map` body, and a loop body
(`scan_layers`, gradient accumulation) once.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

WIDE = ("f32", "f64")  # operand types that make a matmul a float32 (or wider) one
_LOC_NAME = re.compile(r'loc\("([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Matmul:
    """One dot_general.

    Attributes:
      lhs, rhs, out: element types as MLIR prints them ("bf16", "f32").
      lhs_shape, rhs_shape, out_shape: the shapes.
      flops: 2 x output elements x contracted size.
      gemm: both operands keep a free dimension of size > 1 (a matrix product; not a batched
        dot product such as the row sums of o * do).
      where: JAX's name for the op (transforms, einsum spec), "" if the lowering kept none.
    """

    lhs: str
    rhs: str
    out: str
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    flops: int
    gemm: bool
    where: str

    @property
    def operands(self) -> str:
        """The operand types, e.g. "bf16 x bf16"."""
        return f"{self.lhs} x {self.rhs}"

    @property
    def float32(self) -> bool:
        """Either operand is float32 or wider."""
        return self.lhs in WIDE or self.rhs in WIDE

    def describe(self) -> str:
        """One line: types, shapes, GFLOP and where."""
        shapes = f"{list(self.lhs_shape)} x {list(self.rhs_shape)} -> {list(self.out_shape)}"
        gflop = f"{self.flops / 1e9:.3f} GFLOP"
        return f"{self.operands} -> {self.out}  {shapes}  {gflop}  {self.where}"


@dataclasses.dataclass(frozen=True)
class Census:
    """The matmuls and custom calls of one lowered program.

    Attributes:
      matmuls: every dot_general, in program order.
      custom_calls: call target -> count (e.g. "__gpu$xla.gpu.triton" for Pallas on a GPU).
      platforms: the platforms the program was lowered for.
    """

    matmuls: tuple[Matmul, ...]
    custom_calls: dict[str, int]
    platforms: tuple[str, ...]

    def float32_gemms(self) -> list[Matmul]:
        """The matrix products with a float32 (or wider) operand."""
        return [m for m in self.matmuls if m.gemm and m.float32]

    def by_operands(self) -> dict[str, tuple[int, int]]:
        """ "lhs x rhs" -> (count, FLOPs), the most FLOPs first."""
        table: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for m in self.matmuls:
            table[m.operands][0] += 1
            table[m.operands][1] += m.flops
        return dict(sorted(((k, tuple(v)) for k, v in table.items()), key=lambda kv: -kv[1][1]))

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest: counts and FLOPs by operand types, the float32 GEMMs."""
        total = sum(m.flops for m in self.matmuls)
        wide = self.float32_gemms()
        return {
            "platforms": list(self.platforms),
            "matmuls": len(self.matmuls),
            "matmul_flops": total,
            "by_operands": {
                k: {"count": c, "flops": f} for k, (c, f) in self.by_operands().items()
            },
            "float32_gemms": len(wide),
            "float32_gemm_flops": sum(m.flops for m in wide),
            "custom_calls": dict(self.custom_calls),
        }

    def format(self, top: int = 8) -> str:
        """A small table: matmuls by operand types, the float32 GEMMs (largest `top`), the
        custom calls."""
        total = sum(m.flops for m in self.matmuls) or 1
        lines = [
            f"matmuls as lowered for {', '.join(self.platforms)}: {len(self.matmuls)} "
            f"dot_general, {total / 1e9:.3f} GFLOP (a loop body counted once)",
            f"  {'operands':<16s}{'count':>7s}{'GFLOP':>12s}{'share':>8s}",
        ]
        for operands, (count, flops) in self.by_operands().items():
            lines.append(
                f"  {operands:<16s}{count:>7d}{flops / 1e9:>12.3f}{100 * flops / total:>7.1f}%"
            )
        wide = sorted(self.float32_gemms(), key=lambda m: -m.flops)
        if not wide:
            lines.append("float32 matrix products: none")
        else:
            share = 100 * sum(m.flops for m in wide) / total
            lines.append(f"float32 matrix products: {len(wide)} ({share:.1f}% of matmul FLOPs)")
            lines += [f"  {m.describe()}" for m in wide[:top]]
            if len(wide) > top:
                lines.append(f"  ... and {len(wide) - top} more")
        calls = ", ".join(f"{k} x{v}" for k, v in sorted(self.custom_calls.items())) or "none"
        lines.append(f"custom calls: {calls}")
        return "\n".join(lines)


def read(lowered: Any, platforms: tuple[str, ...] = ()) -> Census:
    """The census of a `jax.stages.Lowered` (from `jitted.trace(...).lower(...)` or
    `jitted.lower(...)`); `platforms` names what it was lowered for (the report's label)."""
    module = lowered.compiler_ir("stablehlo")
    matmuls, calls = [], collections.Counter()
    with module.context:
        for op in _operations(module.operation):
            if op.name == "stablehlo.dot_general":
                matmuls.append(_matmul(op))
            elif op.name == "stablehlo.custom_call":
                calls[ir.StringAttr(op.attributes["call_target_name"]).value] += 1
    return Census(tuple(matmuls), dict(calls), tuple(platforms) or ("this backend",))


def _operations(op: ir.Operation) -> Iterator[ir.Operation]:
    """Every operation nested in `op`, depth first."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _operations(inner.operation)


def _tensor(value: ir.Value) -> tuple[tuple[int, ...], str]:
    t = ir.RankedTensorType(value.type)
    return tuple(t.shape), str(t.element_type)


def _matmul(op: ir.Operation) -> Matmul:
    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    (lhs_shape, lhs), (rhs_shape, rhs) = (_tensor(v) for v in op.operands)
    out_shape, out = _tensor(op.results[0])
    contracted = math.prod(lhs_shape[d] for d in dims.lhs_contracting_dimensions)
    lhs_free = _free(lhs_shape, dims.lhs_batching_dimensions, dims.lhs_contracting_dimensions)
    rhs_free = _free(rhs_shape, dims.rhs_batching_dimensions, dims.rhs_contracting_dimensions)
    found = _LOC_NAME.search(str(op.location))
    return Matmul(
        lhs=lhs,
        rhs=rhs,
        out=out,
        lhs_shape=lhs_shape,
        rhs_shape=rhs_shape,
        out_shape=out_shape,
        flops=2 * math.prod(out_shape) * contracted,
        gemm=lhs_free > 1 and rhs_free > 1,
        where=found.group(1) if found else "",
    )


def _free(shape: tuple[int, ...], batch: Any, contract: Any) -> int:
    """The product of an operand's dimensions that are neither batched nor contracted."""
    skip = set(batch) | set(contract)
    return math.prod(n for d, n in enumerate(shape) if d not in skip)
