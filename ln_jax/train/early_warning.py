"""Early warning: a run that is becoming unstable, named by measurement and layer.

Each rule (`MonitorConfig`) is checked on every logged step against the values logged before,
and speaks at one of two levels: a **warning** (the run is likely failing: the trainer logs it
as a WARNING, split "warning/<rule>" in metrics.jsonl, and keeps the checkpoint before it) or a
**note** (a state healthy runs also pass through: logged at INFO, split "note/<rule>").

- loss spike (warning): loss > median + `loss_spike` x robust std of the last `window` logged
  losses (robust std = 1.4826 x median absolute deviation, at least 1% of the median, so a flat
  plateau does not make every wiggle a spike), or a non-finite loss;
- gradient-norm jump: the global gradient norm, or a sub-layer's (`grad_norm/layer_NN/...`),
  > `grad_jump` x its median over the window (the largest such jump is named). A warning when
  it is also above every value of the window (a new high); a note when the norm only returns
  to a level the window has seen (e.g. gradients coming back after a transient collapse);
- rank collapse: a mean cosine between positions (`collapse/layer_NN`, `collapse/output`)
  crossing `collapse` upwards is a note (healthy runs pass through it early in training); it
  becomes a warning when it has stayed at or above `collapse` in every record for at least
  `collapse_steps` steps and the loss fell by less than the fraction `collapse_loss_drop` over
  the last `collapse_steps` steps (the loss level: the median of the last 5 logged losses);
  once per episode, which ends when the measure falls below `collapse`.
At least 3 earlier values are needed before the spike rules speak. The thresholds and their
defaults were calibrated by replaying recorded runs (`ln_jax.train.warning_replay`,
docs/results/monitor/calibration.md).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import numpy as np

from ln_jax.config.run import MonitorConfig
from ln_jax.train.monitor import LAYER_NAME

MIN_HISTORY = 3
LOSS_LEVEL_RECORDS = 5  # the loss level of a step: median of its last 5 logged losses
LEVELS = ("note", "warning")
__all__ = ["LEVELS", "Alert", "EarlyWarning"]


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert: `rule` ("loss_spike", "grad_jump", "collapse"), the `measurement` named
    (e.g. "grad_norm/layer_03/ffn"), its `layer` (None for whole-model measures), its `value`
    and the `reference` it was compared with, a one-line `message`, and its `level`: "warning"
    (the run is likely failing) or "note" (a transient state healthy runs also show)."""

    step: int
    rule: str
    measurement: str
    layer: int | None
    value: float
    reference: float
    message: str
    level: str = "warning"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"Alert.level={self.level!r}: use one of {LEVELS}.")

    @property
    def split(self) -> str:
        """The metrics.jsonl split of the alert: "warning/<rule>" or "note/<rule>"."""
        return f"{self.level}/{self.rule}"

    def record(self) -> dict[str, Any]:
        """The fields metrics.jsonl holds (the split, `split`, names the level and the rule: one
        record per rule, level and step, as readers key records by split and step)."""
        drop = ("step", "rule", "level")
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in drop}


@dataclasses.dataclass
class _Episode:
    """A collapse measure at or above the threshold since `start` (its first record there);
    `warned` once the episode has warned."""

    start: int
    warned: bool = False


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
        self._episodes: dict[str, _Episode] = {}  # collapse measures above the threshold
        self._levels: collections.deque = collections.deque()  # (step, loss level), recent
        # True when the last check warned and the one before did not: an episode starts.
        self.episode_start = False
        self._warned = False

    def check(self, step: int, values: dict[str, float]) -> list[Alert]:
        """The alerts (warnings and notes) of `step`, from its train metrics and monitor
        measurements (`ln_jax.train.monitor.named`); then remembers the values."""
        self._remember_level(step, values)
        found = [
            a
            for a in (
                self._loss_spike(step, values),
                self._grad_jump(step, values),
                *self._collapse(step, values),
            )
            if a is not None
        ]
        for name, value in values.items():
            if _watched(name) and math.isfinite(value):
                self._history[name].append(value)
        warned = any(a.level == "warning" for a in found)
        self.episode_start = warned and not self._warned
        self._warned = warned
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
        past = self._history[name]
        new_high = not math.isfinite(value) or value > max(past)
        where = f" in layer {_layer(name)}" if _layer(name) is not None else ""
        message = (
            f"gradient-norm jump at step {step}{where}: {name} = {value:.4g}, {ratio:.1f}x its "
            f"median {median:.4g} over the last {len(past)} logged steps"
        )
        if not new_high:
            message += f" (below the window's high of {max(past):.4g}: a return, not a new high)"
        level = "warning" if new_high else "note"
        return Alert(step, "grad_jump", name, _layer(name), value, median, message, level)

    def _collapse(self, step: int, values: dict[str, float]) -> list[Alert | None]:
        """The collapse rule: a note for the measures that crossed the threshold at `step`, a
        warning for those whose episode now meets the persistence and loss conditions."""
        threshold = self.cfg.collapse
        if not threshold:
            return []
        above = sorted(
            (n for n, v in values.items() if _is_collapse(n) and v >= threshold), key=_order
        )
        measured = {n for n in values if _is_collapse(n)}
        for name in measured - set(above):
            self._episodes.pop(name, None)  # the episode ends
        new = [n for n in above if n not in self._episodes]
        for name in new:
            self._episodes[name] = _Episode(step)
        persistent = [n for n in above if self._persists(self._episodes[n], step)]
        for name in persistent:
            self._episodes[name].warned = True
        return [
            self._collapse_alert(step, values, new, "note"),
            self._collapse_alert(step, values, persistent, "warning"),
        ]

    def _persists(self, episode: _Episode, step: int) -> bool:
        """Whether a collapse episode warns now: not yet warned, `collapse_steps` long, and
        the loss level fell by less than `collapse_loss_drop` over the last `collapse_steps`."""
        if episode.warned or step - episode.start < self.cfg.collapse_steps:
            return False
        before, now = self._level_change(step)
        if before is None or now is None:
            return True
        return now > before * (1.0 - self.cfg.collapse_loss_drop)

    def _remember_level(self, step: int, values: dict[str, float]) -> None:
        """Records the loss level of `step` (the median of the last `LOSS_LEVEL_RECORDS`
        logged losses, this step's included); forgets those older than `collapse_steps` but
        the latest of them."""
        loss = values.get("loss")
        if loss is None or not math.isfinite(loss):
            return
        losses = [*list(self._history["loss"])[-(LOSS_LEVEL_RECORDS - 1) :], loss]
        self._levels.append((step, float(np.median(losses))))
        horizon = step - self.cfg.collapse_steps
        while len(self._levels) > 1 and self._levels[1][0] <= horizon:
            self._levels.popleft()

    def _level_change(self, step: int) -> tuple[float | None, float | None]:
        """(the loss level `collapse_steps` before `step`, the level at `step`); None where
        no loss was logged then."""
        now = self._levels[-1][1] if self._levels and self._levels[-1][0] == step else None
        first = self._levels[0] if self._levels else None
        before = first[1] if first and first[0] <= step - self.cfg.collapse_steps else None
        return before, now

    def _collapse_alert(
        self, step: int, values: dict[str, float], names: list[str], level: str
    ) -> Alert | None:
        if not names:
            return None
        name, threshold = names[0], self.cfg.collapse
        if level == "note":
            what = (
                f"rank collapse begins at step {step} {_where(name)}: {name} = "
                f"{values[name]:.5f} >= {threshold} (the token representations of a sequence "
                f"are nearly collinear); common early in training, a warning if it lasts "
                f"{self.cfg.collapse_steps} steps while the loss stalls"
            )
        else:
            what = (
                f"rank collapse persists at step {step} {_where(name)}: {name} = "
                f"{values[name]:.5f}, at or above {threshold} since step "
                f"{self._episodes[name].start}"
                + _loss_change(*self._level_change(step), self.cfg.collapse_steps)
            )
        also = f"; also {_places(names[1:])}" if names[1:] else ""
        return Alert(
            step, "collapse", name, _layer(name), values[name], threshold, what + also, level
        )


def _loss_change(before: float | None, now: float | None, steps: int) -> str:
    if before is None or now is None:
        return ""
    return f", and the loss stalls: {before:.4g} -> {now:.4g} over the last {steps} steps"


def _places(names: list[str]) -> str:
    """ "layers 2-5, 7 and the output" for measures in layer order (`_order`)."""
    layers = [_layer(n) for n in names if _layer(n) is not None]
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    spans = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    parts = [("layers " if len(layers) > 1 else "layer ") + ", ".join(spans)] if spans else []
    parts += [f"the {n.split('/', 1)[1]}" for n in names if _layer(n) is None]
    return " and ".join(parts)


def _where(name: str) -> str:
    layer = _layer(name)
    return f"in layer {layer}" if layer is not None else f"at the {name.split('/', 1)[1]}"


def _order(name: str) -> tuple[int, str]:
    """Layers first, from the lowest; whole-model measures (collapse/output) after them."""
    layer = _layer(name)
    return (layer if layer is not None else 1 << 30, name)


def _is_collapse(name: str) -> bool:
    return name.startswith("collapse/")


def _is_grad(name: str) -> bool:
    return name == "grad_norm" or name.startswith("grad_norm/")


def _watched(name: str) -> bool:
    return name == "loss" or _is_grad(name)
