"""A model family defined outside ln_jax: a two-sub-layer Pre-LN regressor with its own
weighted squared-error loss, data, evaluation and measurements, reached only through the
public task protocol (`ln_jax.task`) as `--config.task=tests.toy_task:ToyRegression`, with its
own config section "toy" (`ToyOptions`: `--config.toy.length=6`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ln_jax import sharding
from ln_jax.nn.blocks import ResidualSublayer
from ln_jax.nn.init import init_scheme
from ln_jax.nn.layers import Dense, FeedForward
from ln_jax.nn.placements import PLACEMENTS
from ln_jax.task import Task

EVAL_BATCHES = 2


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    """The toy family's own fields: the config section "toy".

    Attributes:
      length: positions per example (each a `model.hidden_size` input vector).
    """

    length: int = 4

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"toy.length={self.length} must be positive.")


class ToyNet(nnx.Module):
    """x [batch, length, d] -> two Pre-LN feed-forward sub-layers -> a scalar per position."""

    def __init__(self, cfg: Any, *, rngs: nnx.Rngs):
        rule = PLACEMENTS["pre"]
        self.sublayers = nnx.List(
            [ResidualSublayer(FeedForward(cfg, rngs=rngs), cfg, rule) for _ in range(2)]
        )
        kw = dict(init=init_scheme(cfg), dtype=cfg.compute_dtype, rngs=rngs)
        self.head = Dense((cfg.hidden_size,), (1,), ("embed", None), **kw)

    def __call__(self, x: jax.Array, record: bool = False) -> tuple[jax.Array, list]:
        records = []
        for sublayer in self.sublayers:
            x, rec = sublayer(x, record=record)
            records.append(rec)
        return self.head(x)[..., 0], records


def target_of(x: np.ndarray) -> np.ndarray:
    """What the toy learns: a fixed nonlinear function of the inputs [batch, length]."""
    w = np.linspace(-1.0, 1.0, x.shape[-1]) / np.sqrt(x.shape[-1])
    return np.tanh(x @ w)


class ToyData:
    """A keyed synthetic stream: batch i is a pure function of (seed, i); state {"index"}."""

    def __init__(self, cfg: Any, mesh: Any, seed: int, start: int = 0):
        self.cfg, self.mesh, self.seed, self.index = cfg, mesh, seed, start

    def batch(self, index: int) -> dict[str, jax.Array]:
        rng = np.random.default_rng([self.seed, index])
        cfg = self.cfg
        b, t, d = cfg.data.global_batch_size, cfg.options.length, cfg.model.hidden_size
        x = rng.normal(size=(b, t, d)).astype(np.float32)
        weight = (rng.random((b, t)) < 0.75).astype(np.float32)  # uneven micro-batch weights
        local = {"x": x, "y": target_of(x).astype(np.float32), "weight": weight}
        sh = sharding.batch_sharding(self.mesh)
        return {k: jax.device_put(v, sh) for k, v in local.items()}

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, jax.Array]:
        self.index += 1
        return self.batch(self.index)

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state: Mapping) -> None:
        self.index = int(state["index"])

    def close(self) -> None:
        pass


class ToyRegression(Task):
    """The toy family's task: weighted mean squared error over positions."""

    name = "toy_regression"
    options_section = "toy"
    options_class = ToyOptions

    def build(self, rngs: nnx.Rngs) -> ToyNet:
        return ToyNet(self.cfg.model, rngs=rngs)

    def abstract_batch(self, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
        b, d = self.cfg.data.global_batch_size, self.cfg.model.hidden_size
        t = self.cfg.options.length
        spec = sharding.batch_struct(mesh)
        return {
            "x": spec((b, t, d), jnp.float32),
            "y": spec((b, t), jnp.float32),
            "weight": spec((b, t), jnp.float32),
        }

    def normalizers(self, batch: dict) -> dict[str, jax.Array]:
        return {"weight": jnp.maximum(batch["weight"].sum(), 1.0)}

    def loss(self, model: ToyNet, batch: dict, key: Any, normalizers: Mapping, record=False):
        pred, records = model(batch["x"], record=record)
        sse = (batch["weight"] * jnp.square(pred - batch["y"])).sum()
        loss = sse / normalizers["weight"]
        return loss, {"loss": loss, "mse": loss}, records

    def eval_batch(self, model: ToyNet, batch: dict) -> dict[str, jax.Array]:
        """The batch's predictions, targets and weights (reduced on the host)."""
        pred, _ = model(batch["x"])
        return {"pred": pred, "y": batch["y"], "weight": batch["weight"]}

    def eval_metrics(self, outputs: list) -> dict[str, float]:
        """Weighted MSE and the weighted correlation of predictions and targets."""
        pred, y, w = (np.concatenate([o[k] for o in outputs]) for k in ("pred", "y", "weight"))
        mse = float((w * np.square(pred - y)).sum() / w.sum())
        corr = float(np.corrcoef(pred[w > 0], y[w > 0])[0, 1])
        return {"loss": mse, "mse": mse, "correlation": corr}

    def pipelines(self, mesh: Any) -> tuple[ToyData, list]:
        evaluation = ToyData(self.cfg, mesh, seed=10_000 + self.cfg.data.seed)
        return ToyData(self.cfg, mesh, self.cfg.data.seed), [
            evaluation.batch(i) for i in range(EVAL_BATCHES)
        ]

    def forward_measures(self, model: ToyNet, outputs: list, batch: dict) -> dict:
        """The mean square of each sub-layer's output: "stream_ms" [2]."""
        ms = [jnp.mean(jnp.square(rec["output"])) for rec in outputs]
        return {"stream_ms": jnp.stack(ms)}

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict:
        """Each sub-layer's gradient norm: "grad_norm" [2]."""
        norms = [
            jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads["sublayers"][i])))
            for i in range(2)
        ]
        return {"grad_norm": jnp.stack(norms)}
