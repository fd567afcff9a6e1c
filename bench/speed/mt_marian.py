"""HuggingFace Marian (PyTorch) at a translation config's shape: the anchor of
`bench_mt_accel.py --marian` (issue 67 item 4), timed in the same process as ln_jax's arms.

* `train_step(cfg, batch, mode)`: `MarianMTModel` of the config's shape (encoder and decoder
  depth, width, FFN, heads, vocabulary, its dropout on hidden states and attention
  probabilities, ReLU, sinusoidal positions, scaled embeddings: fairseq's IWSLT recipe as
  `configs/mt.py` has it) with ln_jax's ids (pad 0), `train()`; forward, the label-smoothed
  cross-entropy over the target tokens (the config's epsilon), backward, AdamW (betas and eps
  of the config, fused on CUDA; a constant learning rate: the schedule is not part of the
  cost), zero_grad. Mode "eager", or "compile" (`torch.compile` of the forward and loss,
  compiled by the first call). bf16 autocast on CUDA, float32 on a CPU.
* `decode_pair(cfg, args, folder)`: one randomly initialised `MarianMTModel` of the shape
  (Marian's ids, swish, no dropout) and the same weights imported into ln_jax
  (`ln_jax.models.translation.convert.load_marian`, in the config's dtype, attention and
  layers' layout), on the same sources: `generate(num_beams, early_stopping=True)` against
  ln_jax's cached beam search with the same stopping rule (`stop="first"`), as
  `bench_translate_hf.py --mode=decode` does on a CPU. On CUDA the Marian model runs in bf16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.speed.bench_translate_hf import _same_outputs, hf_config, sources


def torch_device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def shape(cfg: Any) -> dict[str, int]:
    """The Marian shape of a translation TrainConfig (`bench_translate_hf.hf_config`'s keys)."""
    m = cfg.model
    options = cfg.options.resolved(m)
    return {"layers": m.num_layers, "decoder_layers": options.decoder_layers,
            "width": m.hidden_size, "ffn": m.mlp_dim, "heads": m.num_heads,
            "vocab": m.vocab_size, "positions": m.max_position_embeddings}  # fmt: skip


def train_step(cfg: Any, batch: dict[str, np.ndarray], mode: str) -> Any:
    """A callable running one Marian train step on `batch` (`step(wait=True)`: waits for the
    device and returns the loss; `wait=False` only launches it), its first call done."""
    import torch
    from transformers import MarianMTModel

    dev = torch_device()
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    m, o = cfg.model, cfg.optim
    config = hf_config(0, "relu", m.hidden_dropout, shape(cfg), m.attention_dropout)
    model = MarianMTModel(config).to(dev).train()  # ln_jax's ids: pad 0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(o.b1, o.b2), eps=o.eps,
                            weight_decay=o.weight_decay, fused=cuda)  # fmt: skip
    smoothing = float(cfg.options.label_smoothing)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=smoothing)
    labels = np.where(batch["tgt_mask"] > 0, batch["tgt_out"], -100)
    inputs = {
        "input_ids": torch.from_numpy(batch["src"]).long().to(dev),
        "attention_mask": torch.from_numpy(batch["src_mask"]).long().to(dev),
        "decoder_input_ids": torch.from_numpy(batch["tgt_in"]).long().to(dev),
    }
    target = torch.from_numpy(labels).long().to(dev).reshape(-1)

    def forward(model, inputs):
        logits = model(**inputs).logits
        return loss_fn(logits.reshape(-1, logits.shape[-1]).float(), target)

    forward = torch.compile(forward) if mode == "compile" else forward

    def step(wait: bool = True) -> float | None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = forward(model, inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not wait:
            return None
        if cuda:
            torch.cuda.synchronize()
        return float(loss.detach())

    step.first_loss = step()  # compiles a "compile" step
    return step


def decode_pair(cfg: Any, args: Any, folder: str) -> tuple[dict[str, Any], int]:
    """({"ln_jax": search, "hf_generate": generate}, pad): the same random Marian weights in
    both, the same sources; each callable returns the tokens [sentences, max_length] on the
    host."""
    import jax
    import jax.numpy as jnp
    import torch
    from transformers import MarianMTModel

    from ln_jax import sharding
    from ln_jax.models.translation import convert
    from ln_jax.models.translation.search import Search, translate

    dev = torch_device()
    torch.manual_seed(0)
    hf = MarianMTModel(hf_config(cfg.model.vocab_size - 1, "swish", 0.0, shape(cfg))).eval()
    hf.save_pretrained(folder)
    if dev.type == "cuda":
        hf = hf.to(dev, dtype=torch.bfloat16)
    m = cfg.model
    layout = {"dtype": m.dtype, "attention_impl": m.attention_impl,
              "scan_layers": m.scan_layers, "scan_unroll": m.scan_unroll}  # fmt: skip
    mesh = sharding.single_device_mesh()
    model = convert.load_marian(folder, mesh=mesh, **layout)
    pad = hf.config.pad_token_id
    src, mask = sources(args, pad)
    search = Search(beam=args.beam, max_length=args.max_length, max_len_a=0.0,
                    max_len_b=args.max_length, stop="first")  # fmt: skip
    t_src = torch.from_numpy(src).long().to(dev)
    t_mask = torch.from_numpy(mask).long().to(dev)

    def hf_generate() -> np.ndarray:
        with torch.no_grad():
            out = hf.generate(
                input_ids=t_src, attention_mask=t_mask, num_beams=args.beam,
                max_length=args.max_length + 1, early_stopping=True, length_penalty=1.0,
                bad_words_ids=[[pad]], do_sample=False,
            )  # fmt: skip
        return out.cpu().numpy()[:, 1:]

    src_j, mask_j = jnp.asarray(src), jnp.asarray(mask)

    def ln_jax_search() -> np.ndarray:
        with sharding.use_mesh(mesh):
            out = translate(model, src_j, mask_j, search)["tokens"]
        return np.asarray(jax.block_until_ready(out))

    return {"ln_jax": ln_jax_search, "hf_generate": hf_generate}, pad


def same_tokens(ours: np.ndarray, theirs: np.ndarray, pad: int) -> dict[str, Any]:
    """How far the two searches' outputs agree: all equal up to EOS, the fraction of sentences
    equal (bf16 on a GPU rounds differently in each, so ties can break apart), mean length."""
    rows = [_same_outputs(a[None], b[None], pad)[0] for a, b in zip(ours, theirs, strict=True)]
    same, length = _same_outputs(ours, theirs, pad)
    return {"same_tokens": same, "same_fraction": float(np.mean(rows)),
            "mean_output_tokens": length}  # fmt: skip
