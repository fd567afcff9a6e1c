"""An independent NumPy (float64) reference of BERT with Xiong et al.'s Table 1 layers.

Written from the paper's equations, not from ln_jax's code: it reads the parameters by name from
a flat {path: array} dict and recomputes the forward pass.
"""

from __future__ import annotations

import math

import numpy as np


def layer_norm(x, scale, bias, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def act(name, x):
    return np.maximum(x, 0.0) if name == "relu" else gelu(x)


def attention(x, mask, p, prefix, num_heads):
    """Multi-head self-attention; x [T, D], mask [T] of 0/1."""
    t, d = x.shape
    h = d // num_heads
    q = x @ p[prefix + "query.kernel"].reshape(d, d) + p[prefix + "query.bias"].reshape(d)
    k = x @ p[prefix + "key.kernel"].reshape(d, d) + p[prefix + "key.bias"].reshape(d)
    v = x @ p[prefix + "value.kernel"].reshape(d, d) + p[prefix + "value.bias"].reshape(d)
    out = np.zeros((t, d))
    for n in range(num_heads):
        sl = slice(n * h, (n + 1) * h)
        logits = q[:, sl] @ k[:, sl].T / math.sqrt(h)
        logits = np.where(mask[None, :] > 0, logits, -1e30)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[:, sl] = w @ v[:, sl]
    return out @ p[prefix + "out.kernel"].reshape(d, d) + p[prefix + "out.bias"]


def ffn(x, p, prefix, activation):
    hidden = act(activation, x @ p[prefix + "wi.kernel"] + p[prefix + "wi.bias"])
    return hidden @ p[prefix + "wo.kernel"] + p[prefix + "wo.bias"]


def ln(p, prefix, x, eps):
    return layer_norm(x, p[prefix + ".scale"], p[prefix + ".bias"], eps)


def encoder_layer(x, mask, p, i, cfg):
    """Table 1: Post-LN (left) or Pre-LN (right) for layer i."""
    pre = f"bert.encoder.layers.{i}."
    att = lambda z: attention(z, mask, p, pre + "attention.branch.", cfg.num_heads)
    ff = lambda z: ffn(z, p, pre + "ffn.branch.", cfg.activation)
    eps = cfg.layer_norm_eps
    if cfg.placement == "post":
        x3 = ln(p, pre + "attention.post_norm", x + att(x), eps)  # x^{post,3}
        return ln(p, pre + "ffn.post_norm", x3 + ff(x3), eps)  # LN(x^{post,5})
    x3 = x + att(ln(p, pre + "attention.pre_norm", x, eps))  # x^{pre,3}
    return x3 + ff(ln(p, pre + "ffn.pre_norm", x3, eps))


def bert_forward(p, cfg, ids, segments, mask, positions):
    """Returns (sequence output [B, T, D], mlm logits [B, P, V], nsp logits [B, 2])."""
    eps = cfg.layer_norm_eps
    seqs, mlm, nsp = [], [], []
    for b in range(ids.shape[0]):
        t = ids.shape[1]
        x = p["bert.embeddings.word"][ids[b]] + p["bert.embeddings.position"][:t]
        x = x + p["bert.embeddings.segment"][segments[b]]
        x = ln(p, "bert.embeddings.norm", x, eps)
        for i in range(cfg.num_layers):
            x = encoder_layer(x, mask[b], p, i, cfg)
        if cfg.placement == "pre":
            x = ln(p, "bert.encoder.final_norm", x, eps)
        seqs.append(x)
        h = act(
            cfg.activation, x[positions[b]] @ p["mlm.transform.kernel"] + p["mlm.transform.bias"]
        )
        h = ln(p, "mlm.norm", h, eps)
        mlm.append(h @ p["bert.embeddings.word"].T + p["mlm.bias"])
        pooled = np.tanh(x[0] @ p["nsp.pooler.kernel"] + p["nsp.pooler.bias"])
        nsp.append(pooled @ p["nsp.classifier.kernel"] + p["nsp.classifier.bias"])
    return np.stack(seqs), np.stack(mlm), np.stack(nsp)
