"""Where a profiled step's device time goes, by kernel class: matmul, attention, elementwise,
reduction, copy, collective, other.

  python bench/speed/bench_accel.py --size=base --batch=256 --arm=default \
      --profile_arm=default --profile_dir=/tmp/trace --profile_steps=3
  python bench/gpu/profile_summary.py /tmp/trace --steps=3 --out=/tmp/profile.json

Reads the newest `*.xplane.pb` under the folder with `jax.profiler.ProfileData`. On a GPU the
kernels are the events of the `/device:GPU:N` planes' stream lines; on a CPU (where XLA runs
its thunks on the host) the events of the XLA client threads, minus the thread pool's own
bookkeeping. Each kernel is classed by its name (XLA's fusion names say their emitter:
`input_*reduce*` a reduction, `*transpose*` / `copy` a data movement, `loop_*` elementwise;
cuBLAS `nvjet*` / `*gemm*` / Triton `gemm_fusion_dot*` matmuls; cuDNN `*fmha*` / `cudnn*`
attention). Figures are per step: the total over the trace divided by `--steps`.

With `--hlo_dir` (XLA's dump of the step, `--xla_dump_to`; the accelerator suite passes it),
the module whose fusion names the profile holds is read by `ln_jax.xla.kernel_census`: kernels
are classed as the HLO says (a Triton fusion named `fusion_12` holding a reduction is a
reduction), and each class's bytes (matmuls: FLOPs) over its measured time give the rate it
ran at, as a share of the chip's bandwidth (bf16 peak) ("achieved").
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ln_jax.xla.kernel_census import kernel_class  # noqa: E402  (one classifier: HLO and profiles)

HOST_BOOKKEEPING = re.compile(r"^(ThreadpoolListener|ThunkExecutor|end: |Thunk::|Rendezvous|Wait:)")


def newest_trace(folder: str) -> str:
    paths = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise SystemExit(f"no *.xplane.pb under {folder}: run bench_accel.py with --profile_dir")
    return max(paths, key=os.path.getmtime)


def kernel_events(path: str) -> tuple[list[tuple[str, float]], str]:
    """[(kernel name, ms)] of the device's kernels in the trace, and where they came from."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    gpu = [p for p in data.planes if p.name.startswith("/device:GPU")]
    events: list[tuple[str, float]] = []
    if gpu:
        for plane in gpu:
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    events += [(e.name, e.duration_ns / 1e6) for e in line.events]
        return events, f"{len(gpu)} GPU plane(s), stream lines"
    for plane in data.planes:
        for line in plane.lines:
            if line.name.startswith("tf_XLA"):
                events += [
                    (e.name, e.duration_ns / 1e6)
                    for e in line.events
                    if not HOST_BOOKKEEPING.match(e.name)
                ]
    return events, "host XLA threads (no GPU plane)"


def summarize(
    events: list[tuple[str, float]],
    steps: int,
    top: int = 25,
    classes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """ms per step by class and for the `top` kernels (with their calls per step). `classes`:
    a class per kernel name where the program's HLO says it (`hlo_classes`), else the name's."""
    classes = classes or {}
    cls_of = lambda name: classes.get(name) or kernel_class(name)  # noqa: E731
    by_class: dict[str, float] = collections.defaultdict(float)
    by_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for name, ms in events:
        by_class[cls_of(name)] += ms / steps
        by_kernel[name].append(ms)
    total = sum(by_class.values())
    kernels = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "steps": steps,
        "kernel_ms_per_step": total,
        "kernels_per_step": len(events) / steps,
        "by_duration": by_duration(events, steps),
        "classes": {
            c: {"ms_per_step": ms, "share": ms / total if total else 0.0}
            for c, ms in sorted(by_class.items(), key=lambda kv: -kv[1])
        },
        "top": [
            {
                "name": name,
                "class": cls_of(name),
                "ms_per_step": sum(times) / steps,
                "calls_per_step": len(times) / steps,
            }
            for name, times in kernels
        ],
    }


DURATION_EDGES_US = (5.0, 20.0, 100.0)


def by_duration(events: list[tuple[str, float]], steps: int) -> list[dict[str, Any]]:
    """Kernels and their ms per step by duration: under 5 us, 5-20, 20-100, 100 us and over.
    How much a step's many small kernels (per-parameter optimizer updates and norms, bias
    sums) cost in all, which a top-N list by name does not show."""
    edges = (0.0, *DURATION_EDGES_US, float("inf"))
    rows = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        inside = [ms for _, ms in events if lo <= ms * 1e3 < hi]
        rows.append(
            {
                "from_us": lo,
                "to_us": hi if hi != float("inf") else None,
                "kernels_per_step": len(inside) / steps,
                "ms_per_step": sum(inside) / steps,
            }
        )
    return rows


def profile_name(hlo_name: str) -> str:
    """The name a GPU profile gives the kernel of an HLO instruction: '.' becomes '_'."""
    return hlo_name.replace(".", "_")


def matching_census(hlo_dir: str, names: set[str]) -> tuple[str, Any, float] | None:
    """Of the optimised HLO modules XLA dumped (`--xla_dump_to`, `*after_optimizations.txt`),
    the one whose kernel names the profile's `names` hold most of: (path, its census
    (`ln_jax.xla.kernel_census`), the share of its fusion kernels found, by the names they launch
    under). None if none matches. A module the census cannot read is named and left out: the
    profile by kernel time does not need it (the H200's of 2026-12-04 lost the whole profile to
    one unreadable module)."""
    from ln_jax.xla import kernel_census

    best = None
    for path in sorted(glob.glob(os.path.join(hlo_dir, "*after_optimizations.txt"))):
        with open(path) as f:
            text = f.read()
        try:
            census = kernel_census.read(text)
        except Exception as err:  # noqa: BLE001 - any parse failure: the profile goes on
            print(f"kernel census: {os.path.basename(path)} left out: {type(err).__name__}: {err}")
            continue
        fusions = {profile_name(k.launch_name) for k in census.kernels if k.opcode == "fusion"}
        share = len(fusions & names) / len(fusions) if fusions else 0.0
        if share and (best is None or share > best[2]):
            best = (path, census, share)
    return best


def achieved(summary: dict[str, Any], census: Any, spec: Any) -> dict[str, dict[str, float]]:
    """Per class: the HLO's bytes (and a matmul's FLOPs) per step over the profile's measured
    time: the rate each class ran at, and its share of the chip's bandwidth (or bf16 peak)."""
    out = {}
    for cls, row in census.by_class().items():
        ms = summary["classes"].get(cls, {}).get("ms_per_step", 0.0)
        if not ms:
            continue
        rate = (row["flops"] if cls == "matmul" else row["bytes"]) / (ms / 1e3)
        peak = spec.bf16_flops if cls == "matmul" else spec.memory_bandwidth
        out[cls] = {"ms_per_step": ms, "gb": row["bytes"] / 1e9, "tflop": row["flops"] / 1e12,
                    "rate": rate, "of_peak": rate / peak}  # fmt: skip
    return out


def _device_kind() -> str:
    import jax

    return jax.devices()[0].device_kind


def print_summary(s: dict[str, Any], source: str) -> None:
    print(f"kernel time per step: {s['kernel_ms_per_step']:.2f} ms ({source}, {s['steps']} steps)")
    for cls, x in s["classes"].items():
        print(f"  {cls:<12s}{x['ms_per_step']:9.2f} ms {100 * x['share']:6.1f}%")
    for cls, x in s.get("achieved", {}).items():
        unit = "TFLOP/s" if cls == "matmul" else "GB/s"
        print(f"  {cls:<12s} ran at {x['rate'] / 1e9 if unit == 'GB/s' else x['rate'] / 1e12:8.0f}"
              f" {unit} ({100 * x['of_peak']:.0f}% of the chip's)")  # fmt: skip
    for row in s.get("by_duration", []):
        lo, hi = row["from_us"], row["to_us"]
        span = f"{lo:g}-{hi:g} us" if hi else f">= {lo:g} us"
        n, ms = row["kernels_per_step"], row["ms_per_step"]
        print(f"  kernels {span:<12s}{n:8.1f} a step {ms:8.2f} ms")
    print("top kernels (ms/step, calls/step, class):")
    for k in s["top"]:
        print(
            f"  {k['ms_per_step']:8.3f} {k['calls_per_step']:6.1f}  {k['class']:<12s}"
            f"{k['name'][:90]}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="the --profile_dir of bench_accel.py")
    p.add_argument("--steps", type=int, default=3, help="steps the trace holds")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=None, help="write the summary as JSON here")
    p.add_argument(
        "--hlo_dir",
        default=None,
        help="XLA's dump of the step (--xla_dump_to): classes kernels by the HLO and gives each "
        "class's achieved bytes/s (ln_jax.xla.kernel_census)",
    )
    p.add_argument(
        "--gpu",
        default="auto",
        help="the chip's figures for --hlo_dir: h100|h200|a100, or auto (this host's GPU; "
        "none on a host without a known one)",
    )
    args = p.parse_args(argv)
    path = newest_trace(args.folder)
    events, source = kernel_events(path)
    if not events:
        raise SystemExit(f"{path} holds no kernel events")
    found = matching_census(args.hlo_dir, {n for n, _ in events}) if args.hlo_dir else None
    classes = {}
    if found:
        classes = {profile_name(k.launch_name): k.cls for k in found[1].kernels}
    summary = summarize(events, args.steps, args.top, classes)
    summary.update(trace=path, source=source)
    if found:
        from ln_jax.xla import kernel_census

        gpu = args.gpu if args.gpu != "auto" else kernel_census.spec_for(_device_kind())
        summary.update(hlo=found[0], hlo_match=found[2])
        if gpu:
            summary.update(gpu=gpu, achieved=achieved(summary, found[1], kernel_census.SPECS[gpu]))
        else:
            print("no achieved rates: this host's device is not a known GPU; pass --gpu=h100|...")
    print_summary(summary, source)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
