"""The suite's step arms compiled for a GPU on this host, without one: kernels, bytes and floors.

  pip install -e ".[gpu-compile]"           # JAX's CUDA plugin: XLA's GPU compiler, ~430 MB
  python bench/probes/gpu_compile_arms.py --gpu=h100 --size=base --batch=256 \\
      --arm=default --arm=row_major:model.activation_layout=row_major \\
      --out=docs/results/gpu/deviceless/arms.json --hlo_dir=/tmp/hlo
  # as a GPU whose autotuner kept XLA's Triton GEMMs (at their default tiling): what they fuse
  python bench/probes/gpu_compile_arms.py --gpu=h200 --size=base --batch=256 --arm=default \
      --arm=triton:xla.xla_gpu_enable_triton_gemm=true,xla.xla_gpu_autotune_level=0

Each `--arm` (the syntax of `bench/speed/bench_accel.py`, whose config the arms share: BERT-base,
bf16, dropout 0.1 everywhere) is built as on a GPU ("auto" fields), compiled for `--gpu`
(`ln_jax.xla.deviceless`) by `ln_jax.xla.aot.gpu_report`, and read by
`ln_jax.xla.kernel_census`: kernels, bytes moved and FLOPs per class, and each class's floor on
that GPU (matmuls at its bf16 rate, the rest at its memory bandwidth). An arm's `xla.OPTION=VALUE`
is a compiler option of its compile (over `ln_jax.xla.deviceless.COMPILER_OPTIONS`, which asks for
cuBLAS); with Triton GEMMs on, the Triton GEMMs that compute on an operand are listed
(`kernel_census.gemm_prologues`). Side by side, a change's
effect on what the GPU would run shows before a GPU is at hand; whether its time follows its
bytes is for the accelerator suite to measure (`bench/gpu/accelerator_suite.sh`). Not a timing.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.speed.accel_step import split_xla_options, train_config  # noqa: E402
from bench.speed.bench_accel import parse_args  # noqa: E402
from ln_jax.xla import aot, deviceless, kernel_census  # noqa: E402

DEFAULT_ARMS = ("default",)


def compile_arm(
    args: Any, argv: list[str], gpu: str, name: str, overrides: dict[str, str], hlo_dir: str
) -> dict:
    """One arm's compile report for one `gpu` (its census summarised); its optimised HLO
    written to `hlo_dir`/NAME.hlo.txt if `hlo_dir`."""
    fields, options = split_xla_options(overrides)
    build = lambda: train_config(args, argv, fields)  # noqa: E731
    report = aot.gpu_report(build, gpu, options=options)
    census = report.pop("kernel_census")
    hlo = report.pop("hlo_text")
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
            f.write(hlo)
    report["kernels"] = census.summary(deviceless.spec(gpu))
    report["gemm_prologues"] = kernel_census.gemm_prologues(hlo)
    report["largest_copies"] = [
        {"name": k.name, "shape": k.shape, "bytes": k.bytes, "count": k.count}
        for k in census.kernels_of("copy")[:10]
    ]
    return report


def print_arms(results: dict[str, dict], gpu: str) -> None:
    """Per arm: kernels, GB moved and floor ms by class; the total floor against the first."""
    classes = []
    for r in results.values():
        classes += [c for c in r["kernels"] if c not in classes]
    print(f"compiled for {deviceless.spec(gpu).name} on this host (no GPU): per step")
    head = f"{'class':<12s}" + "".join(f"{name:>26s}" for name in results)
    print(head + "\n" + f"{'':<12s}" + "   kernels    GB  floor ms" * len(results))
    for cls in classes:
        cells = ""
        for r in results.values():
            row = r["kernels"].get(cls, {"kernels": 0, "bytes": 0.0, "floor_ms": 0.0})
            cells += f"{row['kernels']:10d}{row['bytes'] / 1e9:6.1f}{row['floor_ms']:10.2f}"
        print(f"{cls:<12s}{cells}")
    first = next(iter(results.values()))["kernels"]["total"]["floor_ms"]
    for name, r in results.items():
        total = r["kernels"]["total"]["floor_ms"]
        print(
            f"{name}: floor {total:.2f} ms ({total / first:.3f}x the first arm), temporaries "
            f"{r['temp_bytes'] / 2**30:.2f} GiB, compiled in {r['compile_seconds']:.0f} s"
        )
        prologues = r["gemm_prologues"]
        if prologues:
            ops = sorted({op for p in prologues for op in p["ops"]})
            print(
                f"{name}: {len(prologues)} Triton GEMM fusions compute on an operand "
                f"({', '.join(ops)}): where a GPU's autotuner picks cuBLAS for one, that "
                "computation becomes a kernel of its own, once for each GEMM that reads it"
            )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    gpu, hlo_dir, rest = "h100", "", []
    for arg in argv:
        if arg.startswith("--gpu="):
            gpu = arg.split("=", 1)[1]
        elif arg.startswith("--hlo_dir="):
            hlo_dir = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    deviceless.spec(gpu)
    args = parse_args(rest)
    arms = args.arms or {name: {} for name in DEFAULT_ARMS}
    results = {}
    for name, overrides in arms.items():
        start = time.perf_counter()
        results[name] = compile_arm(args, rest, gpu, name, overrides, hlo_dir)
        results[name]["overrides"] = overrides
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", flush=True)
    print_arms(results, gpu)
    out = {
        "command": ["python", "bench/probes/gpu_compile_arms.py", *argv],
        "gpu": gpu,
        "spec": deviceless.spec(gpu).__dict__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "plugin": deviceless.plugin(),
        "arms": results,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


if __name__ == "__main__":
    main()
