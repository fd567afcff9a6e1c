"""One process of the multi-host test: runs the real `train.py` CLI and records its data shares.

  python tests/multihost_worker.py --devices=4 --evidence=OUT.json -- <train.py flags...>

`--devices` fake CPU devices are made visible to this process (XLA_FLAGS, set before JAX is
imported); everything after `--` goes to `train.py` unchanged, so `--coordinator_address`,
`--num_processes` and `--process_id` take the user's multi-host path (gloo CPU collectives,
`jax.distributed.initialize`). `--sigterm_at_step=K` sends this process a SIGTERM after step K
(a preemption notice for one host of the job). While training, every batch the input pipeline
turns into global arrays is recorded: how many rows this process loaded, a digest of each of
those rows, which rows of the global batch this process's devices hold and whether they are all
local. The record is written to `--evidence` as JSON when the run ends (also when it fails).

Used by tests/test_multihost.py, which starts it as a subprocess.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        at = argv.index("--")
        own, rest = argv[:at], argv[at + 1 :]
    else:
        own, rest = argv, []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, required=True, help="fake CPU devices here")
    parser.add_argument("--evidence", required=True, help="JSON file of this process's shares")
    parser.add_argument(
        "--sigterm_at_step", type=int, default=None, help="SIGTERM this process after that step"
    )
    return parser.parse_args(own), rest


def _set_device_count(n: int) -> None:
    """Makes `n` CPU devices visible (replacing any device count already in XLA_FLAGS)."""
    flags = re.sub(
        r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", "")
    )
    os.environ["XLA_FLAGS"] = f"{flags.strip()} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _row_digests(batch: dict) -> list[str]:
    """md5 of each row over all fields (sorted by name): identifies a row across runs."""
    rows = len(next(iter(batch.values())))
    digests = []
    for r in range(rows):
        h = hashlib.md5()
        for key in sorted(batch):
            h.update(key.encode())
            h.update(batch[key][r].tobytes())
        digests.append(h.hexdigest())
    return digests


class Recorder:
    """Wraps the pipeline's `to_global` to record each batch this process contributes."""

    def __init__(self):
        self.batches: list[dict] = []
        self.split = "eval"  # GlobalBatchIterator (train) switches it while it converts

    def install(self) -> None:
        from ln_jax.data.bert import pipeline as loader

        original_to_global = loader.to_global
        original_next = loader.GlobalBatchIterator.__next__
        recorder = self

        def to_global(batch, mesh, global_batch_size):
            out = original_to_global(batch, mesh, global_batch_size)
            recorder.record(batch, out, global_batch_size)
            return out

        def train_next(self):
            recorder.split = "train"
            try:
                return original_next(self)
            finally:
                recorder.split = "eval"

        # GlobalBatchIterator.__next__ and the eval batches' converter look `to_global` up in
        # the module at call time, so both go through the wrapper.
        loader.to_global = to_global
        loader.GlobalBatchIterator.__next__ = train_next

    def record(self, local: dict, global_: dict, global_batch_size: int) -> None:
        import jax

        array = global_["input_ids"]
        spans = sorted(
            {s.index[0].indices(global_batch_size)[:2] for s in array.addressable_shards}
        )
        self.batches.append(
            {
                "split": self.split,
                "local_rows": {k: int(v.shape[0]) for k, v in local.items()},
                "global_rows": int(array.shape[0]),
                "row_digests": _row_digests(local),
                # The rows of the global batch held by this process's devices.
                "addressable_rows": [list(s) for s in spans],
                "shards_all_local": all(
                    s.device.process_index == jax.process_index() for s in array.addressable_shards
                ),
                "shard_devices": sorted(s.device.id for s in array.addressable_shards),
                "fully_addressable": bool(array.is_fully_addressable),
            }
        )


def _install_checkpoint_workaround() -> None:
    # Orbax's replica-parallel save compiles one slice per array on CPU the first time a run
    # saves (about 17 s for the tiny model's 148 arrays on 2 cores); writing replicated arrays
    # from one replica instead keeps this test fast. It does not change what is saved.
    import jax
    import orbax.checkpoint as ocp

    handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def _sigterm_at(step: int) -> None:
    """Makes the trainer's run SIGTERM this process after `step` (as a preemption would)."""
    import signal

    from ln_jax.train import trainer

    original = trainer.train_and_evaluate

    def preempt(at, run):
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)

    def train_and_evaluate(cfg, workdir, hooks=(), **kwargs):
        return original(cfg, workdir, hooks=[*hooks, preempt], **kwargs)

    trainer.train_and_evaluate = train_and_evaluate


def main(argv: list[str]) -> int:
    start = time.monotonic()
    args, train_argv = _parse(argv)
    _set_device_count(args.devices)
    sys.path.insert(0, REPO)

    recorder = Recorder()
    recorder.install()
    _install_checkpoint_workaround()
    if args.sigterm_at_step is not None:
        _sigterm_at(args.sigterm_at_step)
    import jax

    import train  # the repository's CLI (absl flags are defined on import)

    sys.argv = [os.path.join(REPO, "train.py"), *train_argv]
    code: int | str | None = 0
    try:
        train.run()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        evidence = {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(),
            "batches": recorder.batches,
            "exit_code": code,
            "wall_s": time.monotonic() - start,
            "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
        }
        with open(args.evidence, "w") as f:
            json.dump(evidence, f, indent=1)
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
