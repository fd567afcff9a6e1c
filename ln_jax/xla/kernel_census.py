"""What a compiled GPU program launches: its kernels by class, with the bytes each moves and
the FLOPs each multiplies, read from XLA's optimised HLO.

A GPU step's time is its matmuls at the chip's matmul rate plus everything else at its
memory bandwidth (`../shared/gpu` profiles: on an H100 about 60% of BERT-base's step was not
matmul). This census reads both from the program XLA would run, so a change to the step
(a layout pin, a fused backward) can be judged before a GPU is at hand: how many kernels of
each class, how many bytes they move, and the floor they set (`Census.floor_ms`). It is a
reading of the compiler's output, not a timing: kernels run below their floor's rate, and
the compiler of a host without the GPU does not autotune (`ln_jax.xla.deviceless`).

    census = kernel_census.read(compiled.as_text())
    print(census.format(kernel_census.SPECS["h100"]))
    census.kernels_of("copy")          # the transposes and copies, largest first

Classes (`kernel_class`, shared with `bench/gpu/profile_summary.py`, which classes a profile's
kernels by the same names): matmul, attention, reduction, copy, elementwise, collective.
Bytes of a kernel: its output plus each operand once (a kernel that re-reads an operand
moves more; one that writes in place, less). A loop body (`scan_layers`, accumulation) counts
as many times as XLA knows it runs.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
from collections.abc import Iterator
from typing import Any

CLASSES: tuple[tuple[str, str], ...] = (
    # (class, pattern on the lower-cased kernel name); the first match wins
    ("collective", r"all-reduce|all-gather|reduce-scatter|all-to-all|collective|nccl"),
    ("attention", r"fmha|cudnn|flash|attention"),
    ("matmul", r"nvjet|gemm|cublas|cutlass|xmma|matmul|gemv|\bdot\b|dot_|convolution|ynn_dot"),
    ("reduction", r"reduce|softmax|norm|argmax"),
    ("copy", r"transpose|copy|memcpy|memset|concatenate|dynamic.update.slice|slice"),
    ("elementwise", r"fusion|loop_|convert|multiply|add|select|compare|rng|random|ynn"),
)
ORDER = ("matmul", "attention", "reduction", "copy", "elementwise", "collective", "other")


def kernel_class(name: str) -> str:
    """The class of a kernel, from its name (`CLASSES`); "other" if none matches."""
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU model's published figures, per device: what a floor needs (dense bf16 matmul
    FLOP/s, memory bytes/s) and what XLA's compiler needs to compile for it without one
    (`ln_jax.xla.deviceless` writes them as its target config).

    Attributes:
      name: the CUDA device name.
      bf16_flops: dense bf16 tensor-core FLOP/s.
      memory_bandwidth: bytes/s.
      memory_bytes: memory per device as the driver reports it.
      compute_capability: (major, minor).
      sms: streaming multiprocessors.
      shared_memory_per_sm, shared_memory_per_block_optin, l2_bytes: bytes.
      fp32_lanes_per_sm: FP32 units per SM.
      clock_ghz: boost clock.
    """

    name: str
    bf16_flops: float
    memory_bandwidth: float
    memory_bytes: int
    compute_capability: tuple[int, int]
    sms: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    l2_bytes: int
    fp32_lanes_per_sm: int
    clock_ghz: float


KIB, MIB = 1024, 1024**2
SPECS = {
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", 989.4e12, 3.35e12, 81559 * MIB, (9, 0), 132,
                    228 * KIB, 227 * KIB, 50 * MIB, 128, 1.98),
    "h200": GpuSpec("NVIDIA H200", 989.4e12, 4.8e12, 143771 * MIB, (9, 0), 132, 228 * KIB,
                    227 * KIB, 50 * MIB, 128, 1.98),
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12, 81920 * MIB, (8, 0), 108,
                    164 * KIB, 163 * KIB, 40 * MIB, 64, 1.41),
}  # fmt: skip


def spec_for(device_kind: str) -> str | None:
    """The `SPECS` key of a JAX device kind ("NVIDIA H100 80GB HBM3" -> "h100"), else None."""
    low = device_kind.lower()
    return next((key for key in SPECS if key in low), None)


# Opcodes that launch nothing: views, bookkeeping, control flow (its bodies are read instead),
# and the second halves of async pairs.
_FREE = {
    "parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call",
    "conditional", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency",
    "domain", "get-dimension-size", "iota",
}  # fmt: skip
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
          "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%(\S+) \(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = ")
_OPERAND = re.compile(r"%([\w.\-]+)")
# An operand as newer XLA prints it: "%fusion.3#1" is element 1 of fusion.3's tuple (older
# text reads it through a get-tuple-element instruction).
_TUPLE_OPERAND = re.compile(r"%([\w.\-]+)(?:#(\d+))?")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel launch of the program (times `count` where a loop repeats it).

    Attributes:
      name: the instruction's name (a fusion's says its emitter: `input_transpose_fusion.3`).
      opcode: "fusion", "custom-call", "copy", ...
      cls: its class (`kernel_class`).
      shape: its output type as the HLO prints it, without layouts.
      bytes: output + operand bytes, per launch.
      flops: 2 x output elements x contracted size of the matmuls it holds, per launch.
      count: launches per program run (a loop body's trip count; 1 outside loops).
      op_name: JAX's name of the op it came from ("" if none).
      launch_name: the kernel it launches: XLA:GPU compiles identical fusions once, under the
        first one's name (`deduplicated_name`), which is what a GPU profile shows.
    """

    name: str
    opcode: str
    cls: str
    shape: str
    bytes: float
    flops: float
    count: int
    op_name: str
    launch_name: str


@dataclasses.dataclass(frozen=True)
class Census:
    """The kernels of one compiled program (`read`)."""

    kernels: tuple[Kernel, ...]

    def by_class(self) -> dict[str, dict[str, float]]:
        """{class: {"kernels", "bytes", "flops"}} per program run, in `ORDER`."""
        out = {c: {"kernels": 0, "bytes": 0.0, "flops": 0.0} for c in ORDER}
        for k in self.kernels:
            row = out[k.cls]
            row["kernels"] += k.count
            row["bytes"] += k.bytes * k.count
            row["flops"] += k.flops * k.count
        return {c: row for c, row in out.items() if row["kernels"]}

    def kernels_of(self, cls: str) -> list[Kernel]:
        """The kernels of one class, the most bytes first."""
        return sorted((k for k in self.kernels if k.cls == cls), key=lambda k: -k.bytes * k.count)

    def floor_ms(self, spec: GpuSpec) -> dict[str, float]:
        """Per class, the milliseconds a run cannot go below on `spec`: matmuls at its bf16
        rate, every other class at its memory bandwidth."""
        return {
            cls: 1e3
            * (
                row["flops"] / spec.bf16_flops
                if cls == "matmul"
                else row["bytes"] / spec.memory_bandwidth
            )
            for cls, row in self.by_class().items()
        }

    def summary(self, spec: GpuSpec) -> dict[str, dict[str, float]]:
        """`by_class` with each class's floor ("floor_ms"), and a "total" row."""
        floors = self.floor_ms(spec)
        rows = {c: {**row, "floor_ms": floors[c]} for c, row in self.by_class().items()}
        rows["total"] = {
            key: sum(row[key] for row in rows.values())
            for key in ("kernels", "bytes", "flops", "floor_ms")
        }
        return rows

    def format(self, spec: GpuSpec, top: int = 8) -> str:
        """A table by class, then the largest copies (the transposes a layout costs)."""
        lines = [
            f"kernels per step, by class (floors on {spec.name}: matmuls at "
            f"{spec.bf16_flops / 1e12:.0f} TFLOP/s, the rest at {spec.memory_bandwidth / 1e12:.2f}"
            " TB/s)",
            f"  {'class':<12s}{'kernels':>8s}{'GB moved':>10s}{'TFLOP':>8s}{'floor ms':>10s}",
        ]
        for cls, row in self.summary(spec).items():
            lines.append(
                f"  {cls:<12s}{row['kernels']:8d}{row['bytes'] / 1e9:10.2f}"
                f"{row['flops'] / 1e12:8.2f}{row['floor_ms']:10.2f}"
            )
        copies = self.kernels_of("copy")[:top]
        if copies:
            lines.append("largest copies/transposes (per launch):")
            lines += [f"  {k.bytes / 1e6:8.1f} MB  x{k.count}  {k.name}  {k.shape}" for k in copies]
        return "\n".join(lines)

    def to_json(self, spec: GpuSpec) -> dict:
        """The summary and every kernel, for a results file."""
        return {
            "spec": dataclasses.asdict(spec),
            "summary": self.summary(spec),
            "kernels": [dataclasses.asdict(k) for k in self.kernels],
        }


def read(hlo_text: str) -> Census:
    """The census of an optimised HLO module's text (`compiled.as_text()`)."""
    comps, entry = _computations(hlo_text)
    kernels = []
    for comp, count in _kernel_computations(comps, entry):
        kernels += [k for k in _kernels(comps, comp, count)]
    return Census(tuple(kernels))


# What a GEMM fusion holds besides its dot that moves or views data without computing on it.
_LAYOUT_OPS = frozenset({"parameter", "dot", "bitcast", "broadcast", "constant", "transpose"})
_LAYOUT_OPS |= {"reshape", "copy", "tuple", "get-tuple-element"}


def gemm_prologues(hlo_text: str) -> list[dict[str, Any]]:
    """The Triton GEMM fusions (`gemm_fusion_*`) of a module that compute on their operands
    before the dot: [{"name", "shape", "ops" (the opcodes, sorted)}], in program order.

    Compiled without autotuning (deviceless, `xla_gpu_autotune_level=0`) XLA keeps every GEMM
    it can in Triton and fuses elementwise producers into it. On a GPU the autotuner may pick
    cuBLAS for such a GEMM instead; the fused ops then run as a kernel of their own, once per
    GEMM that had fused them (the H200's dropout-scale multiply of 2026-11-28,
    docs/results/gpu/journal.md).
    """
    comps, entry = _computations(hlo_text)
    found = []
    for comp, _ in _kernel_computations(comps, entry):
        for instr in comps[comp].values():
            if instr.opcode != "fusion" or not instr.name.startswith("gemm_fusion"):
                continue
            ops = sorted({i.opcode for i in _fused(comps, instr).values()} - _LAYOUT_OPS)
            if ops:
                shape = re.sub(r"\{[\d,]*\}", "", instr.type)
                found.append({"name": instr.name, "shape": shape, "ops": ops})
    return found


def array_bytes(hlo_type: str) -> float:
    """Bytes of every array in an HLO type ("bf16[8,4]{1,0}" or a tuple of them)."""
    return sum(
        _BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in _ARRAY.findall(hlo_type)
    )


def array_sizes(hlo_type: str) -> list[int]:
    """Elements of each array in an HLO type or a `Kernel.shape` ("(f32[4], bf16[4,8])")."""
    return [math.prod(int(d) for d in dims.split(",") if d) for _, dims in _ARRAY.findall(hlo_type)]


# --------------------------------------------------------------------------- parsing


@dataclasses.dataclass
class _Instr:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    args: str  # the text between the opcode's parentheses
    elements: list[int | None] = dataclasses.field(default_factory=list)  # "#i" of operands


def _computations(text: str) -> tuple[dict[str, dict[str, _Instr]], str]:
    """({computation: {instruction: _Instr}} in order, the entry computation's name)."""
    comps: dict[str, dict[str, _Instr]] = {}
    current, entry = None, ""
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            current = comps.setdefault(head.group(2), {})
            entry = head.group(2) if head.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and _INSTR.match(line):
            instr = _parse_instruction(line)
            current[instr.name] = instr
    if not entry:
        raise ValueError("no ENTRY computation: give the text of an optimised HLO module.")
    return comps, entry


def _parse_instruction(line: str) -> _Instr:
    name = _INSTR.match(line).group(1)
    rest = line[_INSTR.match(line).end() :]
    hlo_type, rest = _split_type(rest)
    opcode, _, rest = rest.partition("(")
    operands, attrs = _balanced(rest)
    found = _TUPLE_OPERAND.findall(operands)
    elements = [int(i) if i else None for _, i in found]
    return _Instr(name, hlo_type, opcode.strip(), [n for n, _ in found], attrs, operands, elements)


def _split_type(text: str) -> tuple[str, str]:
    """(the leading type, the rest) of "TYPE opcode(...)"; a tuple type is parenthesised."""
    if text.startswith("("):
        inner, rest = _balanced(text[1:])
        return f"({inner})", rest.lstrip()
    hlo_type, _, rest = text.partition(" ")
    return hlo_type, rest


def _balanced(text: str) -> tuple[str, str]:
    """(the text up to the parenthesis closing an already open one, the text after it)."""
    depth = 1
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[:i], text[i + 1 :]
    return text, ""


def _kernel_computations(
    comps: dict[str, dict[str, _Instr]], entry: str
) -> Iterator[tuple[str, int]]:
    """The computations whose instructions launch kernels, with how often each runs: the
    entry, and the bodies of its loops, branches and calls (recursively)."""
    stack = [(entry, 1)]
    while stack:
        comp, count = stack.pop()
        yield comp, count
        for instr in comps[comp].values():
            if instr.opcode == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr.attrs)
                n = int(trips.group(1)) if trips else 1
                stack += [(c, count * n) for c in _called(instr.attrs, ("body", "condition"))]
            elif instr.opcode in ("call", "conditional"):
                keys = ("to_apply", "branch_computations", "true_computation", "false_computation")
                stack += [(c, count) for c in _called(instr.attrs, keys)]


def _called(attrs: str, keys: tuple[str, ...]) -> list[str]:
    found = []
    for key in keys:
        m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%[\w.\-]+)", attrs)
        if m:
            found += _OPERAND.findall(m.group(1))
    return found


def _kernels(comps: dict[str, dict[str, _Instr]], comp: str, count: int) -> Iterator[Kernel]:
    instrs = comps[comp]
    for instr in instrs.values():
        if instr.opcode in _FREE or instr.opcode.endswith("-done"):
            continue
        read = _read_bytes(comps, instr)
        written, updated = _in_place(comps, instrs, instr)
        operand_bytes = sum(
            read.get(i, array_bytes(_operand_type(instrs, instr, i)))
            for i, o in enumerate(instr.operands)
            if o in instrs and i not in updated
        )
        yield Kernel(
            name=instr.name,
            opcode=instr.opcode,
            cls=_class_of(comps, instr),
            shape=re.sub(r"\{[\d,]*\}", "", instr.type),
            bytes=written + operand_bytes,
            flops=_flops(comps, instr, instrs),
            count=count,
            op_name=_op_name(instr.attrs),
            launch_name=_attr(instr.attrs, "deduplicated_name") or instr.name,
        )


def _operand_type(instrs: dict[str, _Instr], instr: _Instr, index: int) -> str:
    """The type of `instr`'s operand `index`: the tuple element it names ("%x#1"), if any."""
    hlo_type = instrs[instr.operands[index]].type
    element = instr.elements[index] if index < len(instr.elements) else None
    if element is None or not hlo_type.startswith("("):
        return hlo_type
    return _tuple_elements(hlo_type)[element]


def _tuple_elements(hlo_type: str) -> list[str]:
    """The top-level element types of a tuple type "(f32[4]{0}, (s32[], bf16[2]))"."""
    inner, parts, depth, start = hlo_type[1:-1], [], 0, 0
    for i, ch in enumerate(inner):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    return [*parts, inner[start:].strip()] if inner.strip() else parts


def _written_type(instr: _Instr) -> str:
    """What a kernel writes: its output, less the scratch workspace (the trailing s8 array) a
    cuBLAS or cuDNN custom call lists among its outputs."""
    if instr.opcode == "custom-call" and instr.type.startswith("("):
        elements = _tuple_elements(instr.type)
        if len(elements) > 1 and elements[-1].startswith("s8["):
            return "(" + ", ".join(elements[:-1]) + ")"
    return instr.type


_SLICING = ("slice", "dynamic-slice", "gather")


def _in_place(
    comps: dict[str, dict[str, _Instr]], scope: dict[str, _Instr], instr: _Instr
) -> tuple[float, set[int]]:
    """(bytes the kernel writes, indices of the operands it updates in place, unread).

    A dynamic-update-slice (alone, or an output of a fusion) writes its update into the buffer
    of its operand 0, which XLA aliases to the output: the kernel writes the update's bytes
    and does not read that buffer (a scanned layer's stacked activations: one layer's slice a
    trip, not the whole stack). Any other output is written whole."""
    if instr.opcode == "dynamic-update-slice":
        return array_bytes(_operand_type(scope, instr, 1)), {0}
    body = _fused(comps, instr) if instr.opcode == "fusion" else {}
    if not body:
        return array_bytes(_written_type(instr)), set()
    root = list(body.values())[-1]
    outputs = [body[o] for o in root.operands] if root.opcode == "tuple" else [root]
    written, updated = 0.0, set()
    for out in outputs:
        buffer = (
            _through_views(body, out.operands[0]) if out.opcode == "dynamic-update-slice" else None
        )
        if buffer is None or buffer.opcode != "parameter":
            written += array_bytes(out.type)
            continue
        written += array_bytes(body[out.operands[1]].type)
        updated.add(int(buffer.args))
    return written, updated


def _through_views(body: dict[str, _Instr], name: str) -> _Instr:
    """The instruction behind `name`, looking back through bitcasts and reshapes."""
    instr = body[name]
    while instr.opcode in ("bitcast", "reshape") and instr.operands[0] in body:
        instr = body[instr.operands[0]]
    return instr


def _read_bytes(comps: dict[str, dict[str, _Instr]], instr: _Instr) -> dict[int, float]:
    """{operand index: bytes read} for the operands a kernel reads only a slice of (what its
    slicing ops output); other operands are read whole."""
    if instr.opcode in _SLICING:
        return {0: array_bytes(instr.type)}
    body = _fused(comps, instr) if instr.opcode == "fusion" else {}
    users = collections.defaultdict(list)
    for i in body.values():
        for o in i.operands:
            users[o].append(i)
    read = {}
    for name, p in body.items():
        if p.opcode != "parameter":
            continue
        uses = _uses_through_views(name, users)
        if uses and all(u.opcode in _SLICING and u.operands[0] == via for u, via in uses):
            read[int(p.args)] = sum(array_bytes(u.type) for u, _ in uses)
    return read


def _uses_through_views(name: str, users: dict[str, list[_Instr]]) -> list[tuple[_Instr, str]]:
    """The (user, the name it reads) pairs of a value, looking through bitcasts and reshapes
    (views that move no data)."""
    found = []
    for user in users[name]:
        if user.opcode in ("bitcast", "reshape"):
            found += _uses_through_views(user.name, users)
        else:
            found.append((user, name))
    return found


def _op_name(attrs: str) -> str:
    return _attr(attrs, "op_name")


def _attr(attrs: str, key: str) -> str:
    m = re.search(rf'\b{key}="([^"]*)"', attrs)
    return m.group(1) if m else ""


def _fused(comps: dict[str, dict[str, _Instr]], instr: _Instr) -> dict[str, _Instr]:
    called = _called(instr.attrs, ("calls",))
    return comps.get(called[0], {}) if called else {}


# What a fusion named for a join or a cut ("loop_concatenate_fusion", "loop_slice_fusion") may
# hold and still only move data; any other op (a multiply, a select, a convert) computes.
_MOVE_OPS = frozenset({"parameter", "constant", "bitcast", "broadcast", "reshape", "copy", "pad"})
_MOVE_OPS |= {"transpose", "tuple", "get-tuple-element", "concatenate", "slice", "iota"}
_MOVE_OPS |= {"dynamic-slice", "dynamic-update-slice"}
# Fusions named for joining or cutting arrays; a transpose that also converts stays a copy (a
# layout change: what the copy class is read for).
_JOINS = re.compile(r"concatenate|slice")


def _class_of(comps: dict[str, dict[str, _Instr]], instr: _Instr) -> str:
    """By the name XLA gave the kernel; a custom call by its target and JAX's op name; a
    fusion with a generic name ("fusion.12") by the ops it holds; a fusion named for a
    concatenation or a slice that computes is elementwise (XLA names a fusion by its root: an
    AdamW update of stacked layers that concatenates their 12 gradients is a
    "loop_concatenate_fusion")."""
    if instr.opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]*)"', instr.attrs)
        return kernel_class(f"{target.group(1) if target else ''} {_op_name(instr.attrs)}")
    if instr.opcode == "fusion" and re.fullmatch(r"fusion(\.\d+)?", instr.name):
        ops = {i.opcode for i in _fused(comps, instr).values()}
        for opcode, cls in (("dot", "matmul"), ("reduce", "reduction"), ("transpose", "copy")):
            if opcode in ops:
                return cls
        return "elementwise"
    cls = kernel_class(instr.name if instr.opcode == "fusion" else instr.opcode)
    joins = cls == "copy" and instr.opcode == "fusion" and _JOINS.search(instr.name)
    if joins and {i.opcode for i in _fused(comps, instr).values()} - _MOVE_OPS:
        return "elementwise"
    return cls


def _flops(comps: dict[str, dict[str, _Instr]], instr: _Instr, scope: dict[str, _Instr]) -> float:
    """2 x output elements x contracted size of each matmul the kernel runs.

    The left operand's shape is the element it names: a cuBLAS GEMM of the H200's step of
    2026-12-04 read `%input_multiply_reduce_fusion#1`, the second array of a multi-output
    fusion (the first, `bf16[768]`, has no contracting dimension 1)."""
    if instr.opcode == "custom-call" and "gemm_backend_config" in instr.attrs:
        config = json.loads(re.search(r"backend_config=(\{.*\})", instr.attrs).group(1))
        dims = config["gemm_backend_config"]["dot_dimension_numbers"]
        lhs = _dims(_operand_type(scope, instr, 0))
        out = _dims(instr.type)
        contracted = math.prod(lhs[int(d)] for d in dims["lhs_contracting_dimensions"])
        return 2.0 * math.prod(out) * contracted
    if instr.opcode == "dot":
        lhs = _dims(_operand_type(scope, instr, 0))
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.attrs)
        contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 1
        return 2.0 * math.prod(_dims(instr.type)) * contracted
    if instr.opcode == "fusion":
        body = _fused(comps, instr)
        return sum(_flops(comps, i, body) for i in body.values() if i.opcode in ("dot", "fusion"))
    return 0.0


def _dims(hlo_type: str) -> list[int]:
    """The dimensions of the first array in an HLO type."""
    _, dims = _ARRAY.search(hlo_type).groups()
    return [int(d) for d in dims.split(",") if d]
