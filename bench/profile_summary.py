"""Where a profiled step's device time goes, by kernel class: matmul, attention, elementwise,
reduction, copy, collective, other.

  python bench/bench_accel.py --size=base --batch=256 --arm=default \
      --profile_arm=default --profile_dir=/tmp/trace --profile_steps=3
  python bench/profile_summary.py /tmp/trace --steps=3 --out=/tmp/profile.json

Reads the newest `*.xplane.pb` under the folder with `jax.profiler.ProfileData`. On a GPU the
kernels are the events of the `/device:GPU:N` planes' stream lines; on a CPU (where XLA runs
its thunks on the host) the events of the XLA client threads, minus the thread pool's own
bookkeeping. Each kernel is classed by its name (XLA's fusion names say their emitter:
`input_*reduce*` a reduction, `*transpose*` / `copy` a data movement, `loop_*` elementwise;
cuBLAS `nvjet*` / `*gemm*` / Triton `gemm_fusion_dot*` matmuls; cuDNN `*fmha*` / `cudnn*`
attention). Figures are per step: the total over the trace divided by `--steps`.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ln_jax.kernel_census import kernel_class  # noqa: E402  (one classifier: HLO and profiles)

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


def summarize(events: list[tuple[str, float]], steps: int, top: int = 25) -> dict[str, Any]:
    """ms per step by class and for the `top` kernels (with their calls per step)."""
    by_class: dict[str, float] = collections.defaultdict(float)
    by_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for name, ms in events:
        by_class[kernel_class(name)] += ms / steps
        by_kernel[name].append(ms)
    total = sum(by_class.values())
    kernels = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "steps": steps,
        "kernel_ms_per_step": total,
        "classes": {
            c: {"ms_per_step": ms, "share": ms / total if total else 0.0}
            for c, ms in sorted(by_class.items(), key=lambda kv: -kv[1])
        },
        "top": [
            {
                "name": name,
                "class": kernel_class(name),
                "ms_per_step": sum(times) / steps,
                "calls_per_step": len(times) / steps,
            }
            for name, times in kernels
        ],
    }


def print_summary(s: dict[str, Any], source: str) -> None:
    print(f"kernel time per step: {s['kernel_ms_per_step']:.2f} ms ({source}, {s['steps']} steps)")
    for cls, x in s["classes"].items():
        print(f"  {cls:<12s}{x['ms_per_step']:9.2f} ms {100 * x['share']:6.1f}%")
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
    args = p.parse_args(argv)
    path = newest_trace(args.folder)
    events, source = kernel_events(path)
    if not events:
        raise SystemExit(f"{path} holds no kernel events")
    summary = summarize(events, args.steps, args.top)
    summary.update(trace=path, source=source)
    print_summary(summary, source)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
