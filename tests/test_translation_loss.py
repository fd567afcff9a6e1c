"""The label-smoothed cross-entropy (ln_jax/models/translation/loss.py) against fairseq's formula
computed in float64 from log-probabilities, with padded vocabulary rows that must be ignored,
and its gradient against the closed form."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ln_jax.models.translation.loss import label_smoothed_nll

V, PADDED, EPS = 50, 56, 0.1


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (3, 7, PADDED)).astype(np.float32)
    logits[..., V:] = 40.0  # padding rows: large, so a loss that read them would change
    targets = rng.integers(0, V, (3, 7))
    weights = (rng.random((3, 7)) > 0.3).astype(np.float32)
    return logits, targets, weights


def _reference(logits, targets, weights):
    """fairseq: (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v), eps_i = eps / (V - 1)."""
    x = logits[..., :V].astype(np.float64)
    top = x.max(-1, keepdims=True)
    logp = x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    eps_i = EPS / (V - 1)
    loss = (1 - EPS - eps_i) * nll + eps_i * (-logp.sum(-1))
    p = np.exp(logp)
    onehot = np.eye(V)[targets]
    grad = weights[..., None] * ((1 - EPS - eps_i) * (p - onehot) + eps_i * (V * p - 1))
    grad = np.concatenate([grad, np.zeros(logits.shape[:-1] + (PADDED - V,))], -1)
    return (loss * weights).sum(), (nll * weights).sum(), grad


@pytest.mark.parametrize("seed", [0, 1])
def test_the_loss_and_its_gradient_are_fairseqs(seed):
    logits, targets, weights = _inputs(seed)
    want_loss, want_nll, want_grad = _reference(logits, targets, weights)
    loss, nll = label_smoothed_nll(logits, targets, weights, EPS, V)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    np.testing.assert_allclose(float(nll), want_nll, rtol=1e-5)
    grad = jax.grad(lambda x: label_smoothed_nll(x, targets, weights, EPS, V)[0])(logits)
    np.testing.assert_allclose(np.asarray(grad), want_grad, atol=2e-6)


def test_without_smoothing_it_is_the_weighted_nll():
    logits, targets, weights = _inputs(2)
    loss, nll = label_smoothed_nll(logits, targets, weights, 0.0, V)
    np.testing.assert_allclose(float(loss), float(nll), rtol=1e-6)
    assert float(nll) == pytest.approx(_reference(logits, targets, weights)[1], rel=1e-5)
