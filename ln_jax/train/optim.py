"""Optimizers and learning-rate schedules as optax chains built from a config.

The schedules cover the recipes compared by Xiong et al. (2020): Post-LN with a
linear warm-up, Pre-LN without one (linear decay for BERT, "decay at a step, then
inverse square root" for machine translation), and the Vaswani warm-up +
inverse-square-root schedule. ``warmup_steps=0`` is an ordinary value everywhere.

The learning rate is a function of the trainer's step: update ``k`` (0-based) uses
``lr(k)``. The train step evaluates ``make_schedule(cfg, values)(step)`` and hands optax that
number, so an update dropped by ``nan_policy="skip"`` (which optax's own count does not see)
does not shift the schedule of the updates after it. The schedule's numbers
(``SCHEDULE_FIELDS``) may be traced: the train step takes them as inputs, so runs that differ
only in them share one compiled program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ln_jax.config.optim import SCHEDULE_FIELDS, OptimConfig


def _warmup_ramp(step: jax.Array, warmup_steps: Any) -> jax.Array:
    """Returns ``min(1, t / W)``, or 1 when ``W == 0`` (Xiong et al. eq. 1); `W` a number or
    a traced scalar."""
    ramp = jnp.minimum(step / jnp.maximum(warmup_steps, 1), 1.0)
    return jnp.where(jnp.asarray(warmup_steps) > 0, ramp, jnp.ones_like(step))


def _rsqrt_from(step: jax.Array, start: Any) -> jax.Array:
    """Returns ``sqrt(S / t)`` for ``t >= S`` with ``S = max(start, 1)``, else 1.

    ``S`` is floored at 1 so that a zero warm-up/decay step gives ``lr(0) = peak``
    and ``1/sqrt(t)`` afterwards instead of a zero or infinite rate.
    """
    s = jnp.maximum(start, 1)
    return jnp.sqrt(s / jnp.maximum(step, s))


def schedule_values(cfg: OptimConfig) -> dict[str, float]:
    """The schedule's numbers (``SCHEDULE_FIELDS``), which ``make_schedule`` also takes traced.

    The train step takes them as inputs, not constants (``ln_jax.train.steps.run_values``), so
    the runs of a learning-rate, warm-up or length grid share one compiled program.
    """
    return {name: float(getattr(cfg, name)) for name in SCHEDULE_FIELDS}


def make_schedule(cfg: OptimConfig, values: Mapping[str, Any] | None = None) -> optax.Schedule:
    """Returns the learning-rate schedule ``step -> lr`` (jit-traceable).

    With P = peak_lr, E = end_lr, W = warmup_steps, T = total_steps, D = decay_step,
    f = decay_factor, ramp(t) = min(1, t/W) (1 if W = 0) and t the 0-based step:

    * ``linear_decay``: ``P + (E - P) * min(t, T) / T`` (no warm-up).
    * ``warmup_linear_decay``: ``P * t / W`` for t < W, then
      ``P + (E - P) * min((t - W) / max(T - W, 1), 1)``; so E for t >= T (from
      t = T + 1 if W = T).
    * ``warmup_cosine``: ``P * t / W`` for t < W, then
      ``E + (P - E) * (1 + cos(pi * min((t - W) / max(T - W, 1), 1))) / 2`` (optax's
      ``warmup_cosine_decay_schedule`` from 0 with ``decay_steps=T``); W = 0: a cosine from P.
    * ``warmup_rsqrt`` (Vaswani): ``P * t / W`` for t < W, then ``P * sqrt(W' / t)``
      with W' = max(W, 1); so W = 0 gives P at t in {0, 1} and P/sqrt(t) after.
    * ``decay_rsqrt`` (Xiong's MT recipe): ``P * ramp(t)`` for t < D, then
      ``P * f * sqrt(D' / t)`` with D' = max(D, 1) for t >= D.
    * ``constant``: ``P * ramp(t)``.

    ``end_lr`` and ``total_steps`` only affect the two linear-decay schedules and the cosine.

    Args:
        cfg: The optimizer config (its ``schedule`` picks the formula).
        values: The numbers P, E, W, T, D, f by ``SCHEDULE_FIELDS`` name, numbers or traced
            float32 scalars (the train step's inputs); default ``schedule_values(cfg)``.

    Returns:
        A function mapping an integer step (scalar, possibly traced) to a float32 lr.
    """
    v = schedule_values(cfg) if values is None else values
    p, e, w, t_end = v["peak_lr"], v["end_lr"], v["warmup_steps"], v["total_steps"]

    def decayed(t: jax.Array) -> jax.Array:
        """The fraction of the decay done at t: 0 at W, 1 from T on."""
        return jnp.clip((t - w) / jnp.maximum(t_end - w, 1), 0.0, 1.0)

    def between(frac: jax.Array) -> jax.Array:
        # Convex combination (not p + (e - p) * frac): exact at both ends in float32.
        return p * (1.0 - frac) + e * frac

    def schedule(step: jax.Array | int) -> jax.Array:
        t = jnp.asarray(step, jnp.float32)
        if cfg.schedule in ("linear_decay", "warmup_linear_decay"):
            lr = jnp.where(t < w, p * _warmup_ramp(t, w), between(decayed(t)))
        elif cfg.schedule == "warmup_cosine":
            cosine = (1.0 - jnp.cos(jnp.pi * decayed(t))) / 2  # 0 at W, 1 from T on
            lr = jnp.where(t < w, p * _warmup_ramp(t, w), between(cosine))
        elif cfg.schedule == "warmup_rsqrt":
            lr = jnp.where(t < w, p * _warmup_ramp(t, w), p * _rsqrt_from(t, w))
        elif cfg.schedule == "decay_rsqrt":
            d = v["decay_step"]
            after = p * v["decay_factor"] * _rsqrt_from(t, d)
            lr = jnp.where(t < d, p * _warmup_ramp(t, w), after)
        else:  # constant
            lr = p * _warmup_ramp(t, w)
        return lr.astype(jnp.float32)

    return schedule


# Leaf names that are never decayed, whatever their rank: biases (attention's query/key/value
# biases are [heads, head_dim]) and norm scales.
NO_DECAY_NAMES = frozenset({"bias", "scale"})
# Modules none of whose parameters are decayed: DLCL's combination weights [L, L] are a mixing
# matrix initialised to averages (rows sum to 1), not a projection; decay would pull every
# layer's input towards zero.
NO_DECAY_MODULES = frozenset({"dlcl"})


def decay_mask(params: Any) -> Any:
    """Returns a bool pytree: True where weight decay applies.

    Rule: decay a weight matrix or embedding, i.e. a leaf not named ``bias`` or ``scale``
    with at least 2 axes besides a stacked ``layers`` axis. Under ``scan_layers`` every layer
    parameter carries a leading [num_layers] axis (a norm scale is [L, d]); it is recognised by
    its path (``.../layers/<name>`` rather than ``.../layers/<index>/...``) and not counted,
    so a model decays the same parameters with and without ``scan_layers``. Skipped: norm
    scales and biases (the q/k/v biases are 2-D), per-channel vectors such as Admin's omega,
    scalars such as ReZero's alpha, and DLCL's [L, L] combination weights. Works on plain
    dicts of arrays and on ``nnx.State`` (whose ``nnx.Param`` nodes are pytree nodes, so the
    map reaches the arrays inside).
    """
    return jax.tree_util.tree_map_with_path(_decays, params)


def _decays(path: Sequence[Any], leaf: Any) -> bool:
    """Whether the parameter at `path` (a key path of `decay_mask`'s tree) is decayed."""
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    names = [k for k in keys if isinstance(k, str)]
    stacked = any(
        k == "layers" and i + 1 < len(keys) and isinstance(keys[i + 1], str)
        for i, k in enumerate(keys)
    )
    rank = jnp.ndim(leaf) - int(stacked)
    if NO_DECAY_MODULES.intersection(names):
        return False
    return rank >= 2 and not (names and names[-1] in NO_DECAY_NAMES)


def _scaling(cfg: OptimConfig) -> optax.GradientTransformation:
    """The optimizer's update direction before the learning rate is applied."""
    if cfg.optimizer in ("adam", "adamw"):
        return optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    if cfg.optimizer == "radam":
        return optax.scale_by_radam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    if cfg.momentum == 0:
        return optax.identity()
    return optax.trace(decay=cfg.momentum)


def make_optimizer(
    cfg: OptimConfig, params: Any, schedule: optax.Schedule | None = None
) -> optax.GradientTransformation:
    """Builds the optax chain: clip -> scaling -> (adamw) decay -> -lr(t).

    The decay mask is computed by ``decay_mask`` on whatever tree optax hands
    ``update``, rather than frozen from ``params``: ``nnx.Optimizer`` initialises
    with a State of ``nnx.Param`` nodes but updates with pure arrays, and a
    mask with ``Param`` nodes would not match the latter's structure.

    Args:
        cfg: The optimizer config.
        params: Parameter pytree (dict of arrays or ``nnx.State``). Used only to
            check eagerly that the decay mask can be built for it.
        schedule: The learning rate by step; default ``make_schedule(cfg)``. The train step
            passes the schedule of its traced values: the state's structure is the same.

    Returns:
        The gradient transformation; call ``update(grads, state, params)``
        (params are required for adamw's weight decay).
    """
    decay_mask(params)  # fail here, not inside jit, if leaves are not arrays
    parts = []
    if cfg.clip_norm:
        parts.append(clip_by_global_norm(cfg.clip_norm))
    parts.append(_scaling(cfg))
    if cfg.optimizer == "adamw" and cfg.weight_decay > 0:
        # Decoupled (Loshchilov & Hutter): added after the adaptive scaling, so it
        # is scaled by the learning rate but not by Adam's preconditioner.
        parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask))
    parts.append(optax.scale_by_learning_rate(schedule or make_schedule(cfg)))
    return optax.chain(*parts)


def applied_updates(opt_state: Any) -> jax.Array:
    """How many updates the chain of `make_optimizer` has applied: the count of its last part
    (the learning rate's), which an update dropped with its state kept does not advance."""
    return opt_state[-1].count


def global_norm(grads: Any) -> jax.Array:
    """The global L2 norm of a gradient pytree, as `clip_by_global_norm` measures it.

    On a GPU the squares are summed one group at a time (`grouped_norm`: one reduction for the
    12 layers' copies of a parameter, not one each); elsewhere leaf by leaf in optax's order
    (`optax.tree.norm`), so CPU and TPU runs keep their values bit for bit."""
    return jax.lax.platform_dependent(
        grads, cuda=grouped_norm, rocm=grouped_norm, default=optax.tree.norm
    )


def grouped_norm(tree: Any) -> jax.Array:
    """The L2 norm of `tree` with its leaves summed by group: parameters (`nnx.Variable`s) of
    one shape, dtype and logical axes (so one sharding on any mesh) are stacked and reduced
    together; other leaves (plain arrays) one by one.

    Compiled for an H200, BERT-base's step (208 parameters) does 26 norm reductions instead of
    286 (`bench/probes/gpu_compile_arms.py`); XLA fuses the stacking into the reduction, so no
    copy is made and the bytes read are those of the per-leaf norm. Values equal optax's up to the
    order of float32 additions."""
    groups: dict[Any, list[jax.Array]] = {}
    for i, leaf in enumerate(jax.tree.leaves(tree, is_leaf=_is_variable)):
        if isinstance(leaf, nnx.Variable):
            value = leaf.get_value()
            names = leaf.get_metadata().get("out_sharding")
            key = (value.shape, value.dtype, None if names is None else tuple(names))
        else:
            value, key = leaf, i
        groups.setdefault(key, []).append(value)
    total = 0  # optax's initial value and dtype promotion, so both branches return one type
    for values in groups.values():
        stacked = values[0] if len(values) == 1 else jnp.stack(values)
        total = total + jnp.sum(jnp.square(stacked.real) + jnp.square(stacked.imag))
    return jnp.sqrt(jnp.asarray(total))


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` (the same state and arithmetic) measuring with
    `global_norm`, so the train step's reported norm and the clip's are one computation."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        small = norm < max_norm
        clip = lambda t: jax.lax.select(small, t, (t / norm.astype(t.dtype)) * max_norm)
        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)
