"""Models and batches of the measurements: the theory model, fresh seeds, checkpoints.

Every model-level function is jitted once per model structure (`jit_model_fn`) and then
applied to the state of each seed, so a seed costs one initialisation, not a compilation.
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
from ln_jax.config import CheckpointConfig, ModelConfig, TrainConfig
from ln_jax.data.config import DataConfig
from ln_jax.models.bert.model import BertForPreTraining, pretraining_loss
from ln_jax.nn.blocks import Record
from ln_jax.nn.placement_setup import setup_placements
from ln_jax.nn.stack import Encoder

log = logging.getLogger(__name__)
Array = jax.Array
Batch = dict[str, Any]
FIRST_ORDINARY_TOKEN = 5  # ids 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK]


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


AnyModel = BertForPreTraining | TheoryModel


def encoder_of(model: AnyModel) -> Encoder:
    return model.encoder if isinstance(model, TheoryModel) else model.bert.encoder


def encode(model: AnyModel, batch: Batch, record: bool = False) -> tuple[Array, Record]:
    """Deterministic encoder pass: (output [batch, length, d], intermediates).

    With `record`, the intermediates also hold "embeddings" [batch, length, d], the encoder's
    input (the Gaussian inputs in the theory setting).
    """
    if isinstance(model, TheoryModel):
        hidden, rec = model(batch["inputs"], record=record)
        if record:
            rec["embeddings"] = batch["inputs"]
        return hidden, rec
    return model.bert(
        batch["input_ids"], batch["segment_ids"], batch["attention_mask"], record=record
    )


def model_loss(model: AnyModel, batch: Batch) -> Array:
    """The training loss at a deterministic forward pass.

    MLM, plus NSP when the model has the head and the batch has labels (as the trainer:
    `data.nsp and model.nsp_head`; batches of a config without NSP carry no "nsp_label").
    """
    if isinstance(model, TheoryModel):
        return model.loss(batch)
    keys = ("input_ids", "segment_ids", "attention_mask", "masked_positions")
    outputs = model(*(batch[k] for k in keys))
    use_nsp = model.nsp is not None and "nsp_label" in batch
    return pretraining_loss(outputs, batch, use_nsp=use_nsp)[0]


def real_tokens(batch: Batch) -> Array:
    """[batch, length] bool: the positions that hold tokens (not padding)."""
    if "inputs" in batch:
        return jnp.ones(batch["inputs"].shape[:2], bool)
    return batch["attention_mask"] > 0


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


def _build(cfg: ModelConfig, theory: bool, seed: int) -> AnyModel:
    with nnx.use_eager_sharding(False):
        return (TheoryModel if theory else BertForPreTraining)(cfg, rngs=nnx.Rngs(params=seed))


@functools.cache
def _scanned_skeleton(cfg: ModelConfig, theory: bool) -> tuple[Any, nnx.State]:
    """(graphdef, abstract state) of the scanned model of `cfg`."""
    with nnx.use_eager_sharding(False):
        return nnx.split(nnx.eval_shape(lambda: _build(cfg, theory, 0)))


def _stack_layers(model: AnyModel, cfg: ModelConfig, theory: bool) -> AnyModel:
    """The same model with its layers' parameters stacked [num_layers, ...] (scan_layers)."""
    graphdef, abstract = _scanned_skeleton(cfg, theory)
    values = nnx.to_pure_dict(nnx.state(model))
    encoder = values["encoder"] if theory else values["bert"]["encoder"]
    layers = [encoder["layers"][i] for i in range(cfg.num_layers)]
    encoder["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    state = jax.tree.map(lambda x: x, abstract)  # a fresh copy of the cached skeleton
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def fresh_model(cfg: ModelConfig, theory: bool, seed: int, batch: Batch) -> AnyModel:
    """A fresh model: `create_model(cfg, seed=seed)` with the layers as a list.

    It is initialised eagerly (nothing to compile per config); with `cfg.scan_layers` its
    layers' parameters are then stacked for the scanned encoder, which compiles once whatever
    the depth. Admin's omega is profiled on `batch` when the config asks for it.
    """
    model = _build(cfg.replace(scan_layers=False), theory, seed)
    if cfg.scan_layers:
        model = _stack_layers(model, cfg, theory)
    setup_placements(model, lambda: batch, None)  # Admin: omega profiled on `batch`
    return model


def instances(settings: Settings, arm: Arm, batch: Batch) -> Iterator[tuple[str, AnyModel]]:
    """(label, model) for each model of the arm: one per seed, or the checkpoint's one."""
    start = time.perf_counter()
    if arm.checkpoint is not None:
        yield "checkpoint", nnx.clone(load_checkpoint(arm.checkpoint)[1])  # the cache stays
    else:
        theory = settings.setting == "theory"
        for seed in settings.seeds:
            yield f"seed {seed}", fresh_model(arm.model, theory, seed, batch)
    log.info(
        "%s setting, %s, %d layers: measured in %.0f s",
        settings.setting,
        arm.label,
        arm.model.num_layers,
        time.perf_counter() - start,
    )


# --------------------------------------------------------------------------- batches


def batch_stream(settings: Settings, arm: Arm) -> Iterator[Batch]:
    """Endless numpy batches for the arm, the same sequence for every model of it.

    theory: {"inputs": [B, T, d] N(0, 1), "labels": [B, T]}; bert: the pretraining batch keys
    (input_ids, segment_ids, attention_mask [B, T]; masked_positions/ids/weights [B, P];
    nsp_label [B]) from the corpus or drawn uniformly at random.
    """
    data = arm.data
    if settings.data == "corpus" and settings.setting == "bert":
        from ln_jax.data import make_host_pipeline

        iterator, _ = make_host_pipeline(data, split="train", seed=data.seed, threads=0)
        yield from (_without_unused_labels(b, data) for b in iterator)
        return
    rng = np.random.default_rng([data.seed, 0xA7A])
    make = _gaussian_batch if settings.setting == "theory" else _random_token_batch
    while True:
        yield make(rng, data, arm.model)


def take_batches(settings: Settings, arm: Arm, n: int) -> list[Batch]:
    """The first `n` batches of `batch_stream` (cached for the corpus: loading costs seconds)."""
    if settings.data == "corpus" and settings.setting == "bert":
        return list(_corpus_batches(arm.data, n))
    stream = batch_stream(settings, arm)
    return [next(stream) for _ in range(n)]


@functools.cache
def _corpus_batches(data: DataConfig, n: int) -> tuple[Batch, ...]:
    from ln_jax.data import make_host_pipeline

    iterator, _ = make_host_pipeline(data, split="train", seed=data.seed, threads=0)
    return tuple(_without_unused_labels(next(iterator), data) for _ in range(n))


def _without_unused_labels(batch: Batch, data: DataConfig) -> Batch:
    """Drops "nsp_label" when the data has no sentence pairs (the trainer skips NSP then)."""
    return batch if data.nsp else {k: v for k, v in batch.items() if k != "nsp_label"}


def _gaussian_batch(rng: np.random.Generator, data: DataConfig, cfg: ModelConfig) -> Batch:
    shape = (data.global_batch_size, data.max_seq_length)
    return {
        "inputs": rng.standard_normal((*shape, cfg.hidden_size), dtype=np.float32),
        "labels": rng.integers(0, cfg.vocab_size, shape, dtype=np.int32),
    }


def _random_token_batch(rng: np.random.Generator, data: DataConfig, cfg: ModelConfig) -> Batch:
    b, t, p = data.global_batch_size, data.max_seq_length, data.max_predictions_per_seq
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, t), p, replace=False) for _ in range(b)]), axis=1
    )
    ids = rng.integers(FIRST_ORDINARY_TOKEN, cfg.vocab_size, (b, t), dtype=np.int32)
    batch = {
        "input_ids": ids,
        "segment_ids": (np.arange(t)[None, :] >= t // 2).repeat(b, 0).astype(np.int32),
        "attention_mask": np.ones((b, t), np.int32),
        "masked_positions": positions.astype(np.int32),
        "masked_ids": rng.integers(FIRST_ORDINARY_TOKEN, cfg.vocab_size, (b, p), dtype=np.int32),
        "masked_weights": np.ones((b, p), np.float32),
        "nsp_label": rng.integers(0, 2, (b,), dtype=np.int32),
    }
    return _without_unused_labels(batch, data)


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
def load_checkpoint(path: str) -> tuple[TrainConfig, BertForPreTraining, int]:
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
        max_predictions_per_seq=shapes.max_predictions_per_seq,
        eval_batch_size=None,
    )
    return Arm("checkpoint", cfg.model, data, settings.checkpoint)


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
