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


def attention(x, mask, p, prefix, num_heads, cfg=None):
    """Multi-head self-attention; x [T, D], mask [T] of 0/1. With cfg.qk_norm, each head's
    queries and keys are normalised over head_dim (one norm for all heads) before q.k."""
    t, d = x.shape
    h = d // num_heads
    qk_norm = getattr(cfg, "qk_norm", False)
    q = x @ p[prefix + "query.kernel"].reshape(d, d) + p[prefix + "query.bias"].reshape(d)
    k = x @ p[prefix + "key.kernel"].reshape(d, d) + p[prefix + "key.bias"].reshape(d)
    v = x @ p[prefix + "value.kernel"].reshape(d, d) + p[prefix + "value.bias"].reshape(d)
    out = np.zeros((t, d))
    for n in range(num_heads):
        sl = slice(n * h, (n + 1) * h)
        qh, kh = q[:, sl], k[:, sl]
        if qk_norm:
            qh, kh = norm(p, prefix + "query_norm", qh, cfg), norm(p, prefix + "key_norm", kh, cfg)
        logits = qh @ kh.T / math.sqrt(h)
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


def rms_norm(x, scale, eps):
    """Zhang & Sennrich 2019: x / RMS(x) * g (no centring, no bias)."""
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def norm(p, prefix, x, cfg):
    """The encoder's normaliser: LayerNorm, or RMSNorm with model.norm="rmsnorm"."""
    if getattr(cfg, "norm", "layernorm") == "rmsnorm":
        return rms_norm(x, p[prefix + ".scale"], cfg.layer_norm_eps)
    return ln(p, prefix, x, cfg.layer_norm_eps)


def dyt(p, prefix, x):
    """Dynamic Tanh: gamma * tanh(alpha x) + beta."""
    return np.tanh(p[prefix + ".alpha"] * x) * p[prefix + ".scale"] + p[prefix + ".bias"]


def layer_names(cfg):
    names = getattr(cfg, "layer_placements", None)
    return names if names is not None else (cfg.placement,) * cfg.num_layers


def sublayer(x, branch, p, pre, placement, cfg, depth):
    """One residual sub-layer, as the papers write it; `pre` is the sub-layer's path prefix,
    `depth` the layer's 1-based index."""
    nrm = lambda name, z: norm(p, pre + name, z, cfg)
    if placement == "post":  # Xiong et al. Table 1: LN(x + F(x))
        return nrm("post_norm", x + branch(x))
    if placement == "pre":  # x + F(LN(x))
        return x + branch(nrm("pre_norm", x))
    if placement == "admin":  # Liu et al. eq. (5): LN(x * omega + F(x))
        return nrm("post_norm", x * p[pre + "omega"] + branch(x))
    if placement == "deepnorm_beta":  # DeepNet's beta init only: the forward pass is Post-LN
        return nrm("post_norm", x + branch(x))
    # Wang et al. 2022: LN(alpha x + G(x)), alpha = (2N)^(1/4); deepnorm_alpha's forward is the same
    if placement in ("deepnorm", "deepnorm_alpha"):
        return nrm("post_norm", (2 * cfg.num_layers) ** 0.25 * x + branch(x))
    if placement == "sandwich":  # Peri-LN: x + LN(F(LN(x)))
        return x + nrm("branch_norm", branch(nrm("pre_norm", x)))
    if placement == "rezero":  # Bachlechner et al.: x + alpha F(x)
        return x + p[pre + "gate"] * branch(x)
    if placement == "olmo2":  # OLMo 2: x + LN(F(x)), the branch output normalised
        return x + nrm("branch_norm", branch(x))
    if placement == "dyt":  # Zhu et al. 2025: Pre-LN, each LN replaced by DyT
        return x + branch(dyt(p, pre + "pre_norm", x))
    if placement == "lns":  # LayerNorm Scaling: x + F(LN(x) / sqrt(l)) in layer l
        return x + branch(nrm("pre_norm", x) / math.sqrt(depth))
    raise ValueError(placement)


def encoder_layer(x, mask, p, i, cfg):
    """Table 1 (Post-LN, Pre-LN) and the later placements, for layer i."""
    pre = f"bert.encoder.layers.{i}."
    att = lambda z: attention(z, mask, p, pre + "attention.branch.", cfg.num_heads, cfg)
    ff = lambda z: ffn(z, p, pre + "ffn.branch.", cfg.activation)
    placement = layer_names(cfg)[i]
    x3 = sublayer(x, att, p, pre + "attention.", placement, cfg, i + 1)
    return sublayer(x3, ff, p, pre + "ffn.", placement, cfg, i + 1)


def encoder(x, mask, p, cfg):
    """All layers; with DLCL (Wang et al. 2019) layer l reads sum_{k<=l} W[l,k] LN_k(y_k)."""
    if not getattr(cfg, "dlcl", False):
        for i in range(cfg.num_layers):
            x = encoder_layer(x, mask, p, i, cfg)
        return x
    outputs = [x]  # y_0 = the embedding output
    w = p["bert.encoder.dlcl.weights"]
    for i in range(cfg.num_layers):
        normed = [norm(p, f"bert.encoder.dlcl.norms.{k}", y, cfg) for k, y in enumerate(outputs)]
        layer_in = sum(w[i, k] * h for k, h in enumerate(normed))
        outputs.append(encoder_layer(layer_in, mask, p, i, cfg))
    return outputs[-1]


# The placements whose residual stream is unnormalised, so the encoder ends with a norm.
FINAL_NORM = ("pre", "sandwich", "olmo2", "lns", "dyt")


def bert_forward(p, cfg, ids, segments, mask, positions):
    """Returns (sequence output [B, T, D], mlm logits [B, P, V], nsp logits [B, 2])."""
    eps = cfg.layer_norm_eps
    seqs, mlm, nsp = [], [], []
    for b in range(ids.shape[0]):
        t = ids.shape[1]
        x = p["bert.embeddings.word"][ids[b]] + p["bert.embeddings.position"][:t]
        x = x + p["bert.embeddings.segment"][segments[b]]
        x = ln(p, "bert.embeddings.norm", x, eps)
        x = encoder(x, mask[b], p, cfg)
        if layer_names(cfg)[-1] == "dyt":
            x = dyt(p, "bert.encoder.final_norm", x)
        elif layer_names(cfg)[-1] in FINAL_NORM:  # an unnormalised residual stream
            x = norm(p, "bert.encoder.final_norm", x, cfg)
        seqs.append(x)
        h = act(
            cfg.activation, x[positions[b]] @ p["mlm.transform.kernel"] + p["mlm.transform.bias"]
        )
        h = ln(p, "mlm.norm", h, eps)
        mlm.append(h @ p["bert.embeddings.word"].T + p["mlm.bias"])
        pooled = np.tanh(x[0] @ p["nsp.pooler.kernel"] + p["nsp.pooler.bias"])
        nsp.append(pooled @ p["nsp.classifier.kernel"] + p["nsp.classifier.bias"])
    return np.stack(seqs), np.stack(mlm), np.stack(nsp)
