"""Early warning: a run that is becoming unstable, named by measurement and layer.

Three rules (`MonitorConfig`), checked on every logged step against the values logged before:
- loss spike: loss > median + `loss_spike` x robust std of the last `window` logged losses
  (robust std = 1.4826 x median absolute deviation, at least 1% of the median, so a flat
  plateau does not make every wiggle a spike);
- gradient-norm jump: the global gradient norm, or a sub-layer's (`grad_norm/layer_NN/...`),
  > `grad_jump` x its median over the window (the largest such jump is named);
- rank collapse: a layer's mean cosine between positions (`collapse/layer_NN`) crosses
  `collapse` upwards (the lowest such layer is named; once per crossing).
At least 3 earlier values are needed before the spike rules speak.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import numpy as np

from ln_jax.config import MonitorConfig
from ln_jax.train.monitor import LAYER_NAME

MIN_HISTORY = 3
__all__ = ["Alert", "EarlyWarning"]


@dataclasses.dataclass(frozen=True)
class Alert:
    """One warning: `rule` ("loss_spike", "grad_jump", "collapse"), the `measurement` named
    (e.g. "grad_norm/layer_03/ffn"), its `layer` (None for whole-model measures), its `value`
    and the `reference` it was compared with, and a one-line `message`."""

    step: int
    rule: str
    measurement: str
    layer: int | None
    value: float
    reference: float
    message: str

    def record(self) -> dict[str, Any]:
        """The fields metrics.jsonl holds (split "warning/<rule>": one record per rule and step,
        as readers key records by split and step)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("step", "rule")}


def _layer(name: str) -> int | None:
    match = LAYER_NAME.match(name)
    return int(match["layer"]) if match else None


class EarlyWarning:
    """Keeps the recent history of the logged measurements and applies the rules to each new
    logged step (`check`)."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self._history: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=cfg.window)
        )
        self._collapsed: set[str] = set()  # layers above the collapse threshold
        # True when the last check warned and the one before did not: an episode starts.
        self.episode_start = False
        self._warned = False

    def check(self, step: int, values: dict[str, float]) -> list[Alert]:
        """The warnings of `step`, from its train metrics and monitor measurements
        (`ln_jax.train.monitor.named`); then remembers the values."""
        found = [
            w
            for w in (
                self._loss_spike(step, values),
                self._grad_jump(step, values),
                self._collapse(step, values),
            )
            if w is not None
        ]
        for name, value in values.items():
            if _watched(name) and math.isfinite(value):
                self._history[name].append(value)
        self.episode_start = bool(found) and not self._warned
        self._warned = bool(found)
        return found

    def _loss_spike(self, step: int, values: dict[str, float]) -> Alert | None:
        past, loss = self._history["loss"], values.get("loss")
        if not self.cfg.loss_spike or loss is None or len(past) < MIN_HISTORY:
            return None
        median = float(np.median(past))
        spread = max(1.4826 * float(np.median(np.abs(np.asarray(past) - median))), 0.01 * median)
        limit = median + self.cfg.loss_spike * spread
        if loss <= limit and math.isfinite(loss):
            return None
        message = (
            f"loss spike at step {step}: loss {loss:.4g} against a median of {median:.4g} over "
            f"the last {len(past)} logged steps (limit {limit:.4g})"
        )
        return Alert(step, "loss_spike", "loss", None, loss, median, message)

    def _grad_jump(self, step: int, values: dict[str, float]) -> Alert | None:
        if not self.cfg.grad_jump:
            return None
        worst = None
        for name, value in values.items():
            past = self._history.get(name)
            if not _is_grad(name) or past is None or len(past) < MIN_HISTORY:
                continue
            median = float(np.median(past))
            ratio = value / max(median, 1e-30) if math.isfinite(value) else math.inf
            if ratio > self.cfg.grad_jump and (worst is None or ratio > worst[0]):
                worst = (ratio, name, value, median)
        if worst is None:
            return None
        ratio, name, value, median = worst
        where = f" in layer {_layer(name)}" if _layer(name) is not None else ""
        message = (
            f"gradient-norm jump at step {step}{where}: {name} = {value:.4g}, {ratio:.1f}x its "
            f"median {median:.4g} over the last {len(self._history[name])} logged steps"
        )
        return Alert(step, "grad_jump", name, _layer(name), value, median, message)

    def _collapse(self, step: int, values: dict[str, float]) -> Alert | None:
        threshold = self.cfg.collapse
        if not threshold:
            return None
        above = sorted(
            (n for n, v in values.items() if n.startswith("collapse/layer_") and v >= threshold),
            key=lambda n: _layer(n),
        )
        new = [n for n in above if n not in self._collapsed]
        self._collapsed = set(above)
        if not new:
            return None
        name = new[0]
        message = (
            f"rank collapse at step {step} in layer {_layer(name)}: {name} = "
            f"{values[name]:.5f}, the token representations of a sequence are nearly collinear "
            f"(mean cosine between positions >= {threshold})"
            + (f"; also layers {', '.join(str(_layer(n)) for n in new[1:])}" if new[1:] else "")
        )
        return Alert(step, "collapse", name, _layer(name), values[name], threshold, message)


def _is_grad(name: str) -> bool:
    return name == "grad_norm" or name.startswith("grad_norm/")


def _watched(name: str) -> bool:
    return name == "loss" or _is_grad(name)
