"""Models and batches of the measurements, through the task: the theory model, fresh seeds,
checkpoints.

An arm's models are built by its task (`ln_jax.task.make_task` of the arm's config; the theory
setting's own `TheoryTask`), its loss is the task's, its batches the task's `random_batch` /
`host_batches`, and its layers are read through the model's stacks (`ln_jax.nn.stack.Stacked`):
nothing here names a model family. Every model-level function is jitted once per model
structure (`jit_model_fn`) and then applied to the state of each seed, so a seed costs one
initialisation, not a compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax.analysis.settings import Arm, Settings, make_arms
from ln_jax.config.run import CheckpointConfig, ModelConfig, TrainConfig
from ln_jax.nn.blocks import EncoderLayer, Record
from ln_jax.nn.placement_setup import setup_placements
from ln_jax.nn.stack import Encoder, Stack, Stacked, StackView, stack_output, stacks
from ln_jax.task import Task, make_task

log = logging.getLogger(__name__)
Array = jax.Array
Batch = dict[str, Any]
AnyModel = Stacked


class TheoryModel(nnx.Module):
    """Xiong et al.'s theoretical setting (section 3.3) around an ln_jax `Encoder`.

    The inputs x [batch, length, d] ~ N(0, I) go straight into the encoder (no embeddings).
    W^Q and W^K are zero, so attention is uniform; the config gives one head, d x d FFN
    matrices, ReLU and Xavier weights (see `settings.arm_model`). The loss is the mean over
    positions of -log softmax(W^emb y)_label, W^emb [vocab, d] ~ N(0, 1/d) a fixed buffer.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder = Encoder(cfg, rngs=rngs)
        layers = [self.encoder.layers] if cfg.scan_layers else list(self.encoder.layers)
        for layer in layers:
            for name in ("query", "key"):
                kernel = getattr(layer.attention.branch, name).kernel
                kernel[...] = jnp.zeros_like(kernel[...])
        d = cfg.hidden_size
        self.embedding = nnx.Variable(
            jax.random.normal(rngs.params(), (cfg.vocab_size, d)) * d**-0.5
        )

    def __call__(self, inputs: Array, *, record: bool = False) -> tuple[Array, Record]:
        """inputs [batch, length, d] -> (encoder output [batch, length, d], intermediates)."""
        return self.encoder(inputs, record=record)

    def loss(self, batch: Batch) -> Array:
        """Mean cross-entropy of batch["labels"] [batch, length] under softmax(W^emb y)."""
        hidden, _ = self(batch["inputs"])
        logits = jnp.einsum("btd,vd->btv", hidden, self.embedding[...])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1).mean()

    def stack_views(self) -> list[StackView]:
        """Its one stack (`ln_jax.nn.stack.Stacked`)."""
        return [StackView.of(self.cfg, EncoderLayer, ("encoder", "layers"))]

    def stack_records(self, batch: Batch, dropout_key: Array | None) -> dict[str, Record]:
        """The encoder's records, with "embeddings": the Gaussian inputs it reads."""
        _, rec = self.encoder(batch["inputs"], dropout_key=dropout_key, record=True)
        return {"encoder": {**rec, "embeddings": batch["inputs"]}}


class TheoryTask:
    """The theory setting as the analyses see a task: its model, loss and Gaussian batches."""

    name = "theory"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def build(self, rngs: nnx.Rngs) -> TheoryModel:
        return TheoryModel(self.cfg.model, rngs=rngs)

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        return {}

    def loss(self, model: TheoryModel, batch: Batch, key, normalizers, record: bool = False):
        loss = model.loss(batch)
        return loss, {"loss": loss}, {}

    def random_batch(self, rng: np.random.Generator) -> Batch:
        """{"inputs": [B, T, d] N(0, 1) float32, "labels": [B, T] uniform in the vocabulary}."""
        data, cfg = self.cfg.data, self.cfg.model
        shape = (data.global_batch_size, data.max_seq_length)
        return {
            "inputs": rng.standard_normal((*shape, cfg.hidden_size), dtype=np.float32),
            "labels": rng.integers(0, cfg.vocab_size, shape, dtype=np.int32),
        }


def analysis_task(cfg: TrainConfig, theory: bool) -> Task:
    """The task of `cfg`: the theory setting's, or `make_task(cfg)`."""
    return TheoryTask(cfg) if theory else make_task(cfg)


def arm_config(settings: Settings, arm: Arm) -> TrainConfig:
    """The run config of the arm: the checkpoint's own or the settings' config, with the
    arm's model and data."""
    base = load_checkpoint(arm.checkpoint)[0] if arm.checkpoint else settings.config
    data = arm.data
    if data.vocab_size != arm.model.vocab_size:  # the theory setting's own softmax
        data = dataclasses.replace(data, vocab_size=arm.model.vocab_size)
    options = base.options if arm.options is None else arm.options
    return dataclasses.replace(base, model=arm.model, data=data, options=options)


def arm_task(settings: Settings, arm: Arm) -> Task:
    """The task that builds, trains and feeds the arm's models."""
    return analysis_task(arm_config(settings, arm), settings.setting == "theory")


def first_stack(model: Stacked) -> tuple[StackView, Stack]:
    """(view, module) of the model's first stack (the encoder: what the measurements read)."""
    return stacks(model)[0]


def encode(model: Stacked, batch: Batch, record: bool = False) -> tuple[Array, Record]:
    """Deterministic pass of the model's first stack: (output [batch, length, d],
    intermediates).

    With `record`, the intermediates also hold "embeddings" [batch, length, d], the stack's
    input (the Gaussian inputs in the theory setting).
    """
    view = model.stack_views()[0]
    rec = model.stack_records(batch, None)[view.attribute]
    return stack_output(rec, view), (rec if record else {})


def model_loss(task: Task, model: AnyModel, batch: Batch) -> Array:
    """The task's training loss at a deterministic forward pass (dropout off)."""
    return task.loss(model, batch, None, task.normalizers(batch))[0]


def real_tokens(batch: Batch) -> Array:
    """[batch, length] bool: the positions that hold tokens (not padding)."""
    if "attention_mask" in batch:
        return batch["attention_mask"] > 0
    return jnp.ones(next(iter(batch.values())).shape[:2], bool)


def jit_model_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(model, *args)` -> the same call, jitted over the model's state.

    Compiled once per model structure and argument shapes: seeds of one arm share it.
    """

    @functools.partial(jax.jit, static_argnums=0)
    def run(graphdef, params, rest, *args):
        return fn(nnx.merge(graphdef, params, rest), *args)

    def call(model: nnx.Module, *args: Any) -> Any:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        return run(graphdef, params, rest, *args)

    return call


# --------------------------------------------------------------------------- fresh models


def _build(task: Task, seed: int) -> AnyModel:
    with nnx.use_eager_sharding(False):
        return task.build(nnx.Rngs(params=seed))


@functools.cache
def _scanned_skeleton(cfg: TrainConfig, theory: bool) -> tuple[Any, nnx.State]:
    """(graphdef, abstract state) of the scanned model of `cfg`."""
    task = analysis_task(cfg, theory)
    with nnx.use_eager_sharding(False):
        return nnx.split(nnx.eval_shape(lambda: _build(task, 0)))


def _stack_layers(model: AnyModel, task: Task) -> AnyModel:
    """The same model with each stack's layers' parameters stacked [num_layers, ...]
    (scan_layers)."""
    graphdef, abstract = _scanned_skeleton(task.cfg, isinstance(task, TheoryTask))
    values = nnx.to_pure_dict(nnx.state(model))
    for view in model.stack_views():
        parent = functools.reduce(lambda tree, part: tree[part], view.path[:-1], values)
        layers = parent[view.path[-1]]
        layers = [layers[i] for i in range(view.num_layers)]
        parent[view.path[-1]] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    state = jax.tree.map(lambda x: x, abstract)  # a fresh copy of the cached skeleton
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def _with_list_layers(task: Task) -> Task:
    """The task of the same config with the layers as a list."""
    cfg = task.cfg
    listed = dataclasses.replace(cfg, model=cfg.model.replace(scan_layers=False))
    return analysis_task(listed, isinstance(task, TheoryTask))


def fresh_model(task: Task, seed: int, batch: Batch) -> AnyModel:
    """A fresh model: the task's model of seed `seed`, built with its layers as a list.

    It is initialised eagerly (nothing to compile per config); with `scan_layers` its layers'
    parameters are then stacked for the scanned stacks, which compile once whatever the depth.
    Admin's omega is profiled on `batch` when the config asks for it.
    """
    scanned = task.cfg.model.scan_layers
    model = _build(_with_list_layers(task) if scanned else task, seed)
    if scanned:
        model = _stack_layers(model, task)
    setup_placements(model, lambda: batch, None)  # Admin: omega profiled on `batch`
    return model


def instances(settings: Settings, arm: Arm, batch: Batch) -> Iterator[tuple[str, AnyModel]]:
    """(label, model) for each model of the arm: one per seed, or the checkpoint's one."""
    start = time.perf_counter()
    if arm.checkpoint is not None:
        yield "checkpoint", nnx.clone(load_checkpoint(arm.checkpoint)[1])  # the cache stays
    else:
        task = arm_task(settings, arm)
        for seed in settings.seeds:
            yield f"seed {seed}", fresh_model(task, seed, batch)
    log.info(
        "%s setting, %s, %d layers: measured in %.0f s",
        settings.setting,
        arm.label,
        arm.model.num_layers,
        time.perf_counter() - start,
    )


# --------------------------------------------------------------------------- batches


def _from_corpus(settings: Settings) -> bool:
    return settings.data == "corpus" and settings.setting != "theory"


def batch_stream(settings: Settings, arm: Arm) -> Iterator[Batch]:
    """Endless numpy batches for the arm, the same sequence for every model of it.

    The task's corpus batches (`host_batches`), or its `random_batch`es (theory: Gaussian
    inputs; BERT: uniformly random tokens) from a generator seeded by the data seed.
    """
    task = arm_task(settings, arm)
    if _from_corpus(settings):
        yield from task.host_batches()
        return
    rng = np.random.default_rng([arm.data.seed, 0xA7A])
    while True:
        yield task.random_batch(rng)


def take_batches(settings: Settings, arm: Arm, n: int) -> list[Batch]:
    """The first `n` batches of `batch_stream` (cached for the corpus: loading costs seconds)."""
    if _from_corpus(settings):
        return list(_corpus_batches(arm_config(settings, arm), n))
    stream = batch_stream(settings, arm)
    return [next(stream) for _ in range(n)]


_CORPUS_BATCHES: dict[tuple, tuple[Batch, ...]] = {}


def _corpus_batches(cfg: TrainConfig, n: int) -> tuple[Batch, ...]:
    """The first `n` corpus batches of `cfg`'s task, kept per (task, data): every arm of one
    data config reads the same batches."""
    key = (cfg.task, cfg.data, cfg.options, n)
    if key not in _CORPUS_BATCHES:
        iterator = make_task(cfg).host_batches()
        _CORPUS_BATCHES[key] = tuple(next(iterator) for _ in range(n))
    return _CORPUS_BATCHES[key]


# --------------------------------------------------------------------------- checkpoints


def checkpoint_dir(path: str) -> str:
    """The orbax directory of a run: `path/checkpoints` if it exists, else `path` itself."""
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"--checkpoint={path!r} does not exist; give the workdir of a training run "
            "(the folder train.py wrote) or the checkpoints/ folder inside it."
        )
    nested = os.path.join(path, "checkpoints")
    return nested if os.path.isdir(nested) else path


@functools.cache
def load_checkpoint(path: str) -> tuple[TrainConfig, Any, int]:
    """(the run's config, its model with the latest saved parameters, the step) of a run.

    The config comes from the checkpoint itself; the parameters are restored onto one device.
    """
    from ln_jax import sharding
    from ln_jax.task import make_task
    from ln_jax.train import steps
    from ln_jax.train.checkpoint import Checkpointer

    directory = checkpoint_dir(path)
    ckpt = Checkpointer(directory, CheckpointConfig(async_save=False))
    try:
        step = ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(
                f"no checkpoint in {directory!r}; train with checkpoint_every > 0 or to the end "
                "(train.py saves at the last step), then point --checkpoint at the workdir."
            )
        cfg = TrainConfig.from_mapping(ckpt.restore_config(step))
        mesh = sharding.single_device_mesh()
        graphdef, rest, state, _ = steps.init_state(make_task(cfg), mesh)
        step, state, _ = ckpt.restore(state)
    finally:
        ckpt.close()
    return cfg, nnx.merge(graphdef, state["params"], rest), int(step)


def checkpoint_arm(settings: Settings) -> Arm | None:
    """The arm of `settings.checkpoint` (its model; the analysis's batch shapes), or None."""
    if not settings.checkpoint:
        return None
    cfg, _, _ = load_checkpoint(settings.checkpoint)
    shapes = settings.config.data
    data = dataclasses.replace(
        cfg.data,
        global_batch_size=shapes.global_batch_size,
        max_seq_length=min(shapes.max_seq_length, cfg.model.max_position_embeddings),
        eval_batch_size=None,
    )
    masked = settings.config.options.max_predictions_per_seq  # the analysis's, as its shapes
    options = dataclasses.replace(cfg.options, max_predictions_per_seq=masked)
    return Arm("checkpoint", cfg.model, data, settings.checkpoint, options)


def all_arms(settings: Settings, placements: Sequence[str], num_layers: int) -> list[Arm]:
    """One arm per placement at `num_layers` layers, then the checkpoint's arm if any."""
    ckpt = checkpoint_arm(settings)
    return make_arms(settings, placements, num_layers) + ([ckpt] if ckpt else [])


def checkpoint_info(settings: Settings) -> dict[str, Any] | None:
    """What the results record about the checkpoint arm."""
    if not settings.checkpoint:
        return None
    cfg, _, step = load_checkpoint(settings.checkpoint)
    return {
        "path": settings.checkpoint,
        "step": step,
        "placement": cfg.model.placement,
        "num_layers": cfg.model.num_layers,
        "hidden_size": cfg.model.hidden_size,
        "init": cfg.model.init,
    }
