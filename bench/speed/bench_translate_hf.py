"""Translation speed against HuggingFace Marian (PyTorch): the train step and beam search.

  taskset -c 0 python bench/speed/bench_translate_hf.py --mode=train --rounds=12 --out=/tmp/t.json
  taskset -c 0 python bench/speed/bench_translate_hf.py --mode=decode --rounds=5 --out=/tmp/d.json

Not a test. Both arms run in ONE process on one pinned core (torch with one thread), alternating
(A B A B ...) so that machine noise hits them alike; medians and their ratio are printed.

* `--mode=train`, the `configs/mt.py:small` shape (3-3 layers, d 256, FFN 1024, 4 heads, an
  8,000-piece vocabulary, dropout 0.1 on hidden states and attention, Post-LN, ReLU), float32,
  on one batch of its middle length bucket (64 sentences x 32 source x 32 target tokens, real
  padding: lengths drawn from 8..32). ln_jax: the trainer's own step (`ln_jax.train.steps`:
  init_state + jit_steps, the label-smoothed loss, AdamW (0.9, 0.98), no clipping as the
  config; on the CPU `translation.skip_padding` resolves to on: the feed-forward layers and
  the output projection skip the padded positions, `--skip_padding=off` computes them).
  HuggingFace: `MarianMTModel` of the same shape in eager PyTorch, `train()`, the
  logits' cross-entropy with label smoothing 0.1 over the target tokens, `backward`,
  `AdamW.step`, `zero_grad` (a constant learning rate: the schedule is not part of the cost).
  Rate: target tokens per second (source tokens are the same for both).
* `--mode=skip`: ln_jax's train step (as `--mode=train`) with `translation.skip_padding` on
  against the same step with it off, no torch: the ratio is the skipped step's time over the
  unskipped one's.
* `--mode=decode`: one randomly initialised `MarianMTModel` (the `small` shape, Marian's ids,
  swish) and the same model imported into ln_jax (`ln_jax.models.translation.convert`), the
  same sources (`--sentences` x up to `--src_len` tokens, padded), beam 5: `generate(
  num_beams=5, early_stopping=True, length_penalty=1.0, bad_words_ids=[[pad]])` against
  ln_jax's cached beam search with the same stopping rule (`stop="first"`); the outputs are
  checked equal (the same work). Rate: sentences per second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.speed.measure import run_alternating, write_result  # noqa: E402

SHAPE = {"layers": 3, "width": 256, "ffn": 1024, "heads": 4, "vocab": 8000}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("train", "decode", "skip"), default="train")
    p.add_argument("--rounds", type=int, default=10, help="timed calls of each arm")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rows", type=int, default=64, help="train: sentences in the batch")
    p.add_argument("--length", type=int, default=32, help="train: the bucket's S = T")
    p.add_argument("--sentences", type=int, default=32, help="decode: sources")
    p.add_argument("--src_len", type=int, default=24, help="decode: longest source")
    p.add_argument("--max_length", type=int, default=32, help="decode: tokens generated")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="train: ln_jax's model.dtype; torch runs under bf16 autocast for bfloat16",
    )
    p.add_argument(
        "--dropout_rng", help="train: the ln_jax arm's dropout_rng (default: the config's)"
    )
    p.add_argument(
        "--skip_padding",
        choices=("auto", "on", "off"),
        help="train: the ln_jax arm's translation.skip_padding (default: the config's)",
    )
    p.add_argument("--out", help="write the result (JSON) here")
    return p.parse_args(argv)


def hf_config(
    pad: int, activation: str, dropout: float, shape: dict | None = None,
    attention_dropout: float | None = None,
):  # fmt: skip
    """A MarianConfig of `shape` (default SHAPE; "decoder_layers" and "positions" optional),
    Marian's ids (pad = vocab - 1, EOS 0) when `pad` is non-zero, else ln_jax's (pad 0, BOS 2,
    EOS 3)."""
    from transformers import MarianConfig

    s = {**SHAPE, **(shape or {})}
    v = s["vocab"]
    attention_dropout = dropout if attention_dropout is None else attention_dropout
    return MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=s["width"],
        encoder_layers=s["layers"], decoder_layers=s.get("decoder_layers", s["layers"]),
        encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"],
        encoder_ffn_dim=s["ffn"], decoder_ffn_dim=s["ffn"],
        max_position_embeddings=s.get("positions", 256),
        pad_token_id=pad, eos_token_id=0 if pad else 3, decoder_start_token_id=pad if pad else 2,
        activation_function=activation, scale_embedding=True, dropout=dropout,
        attention_dropout=attention_dropout,
    )  # fmt: skip


# --------------------------------------------------------------------------- train


def train_batch(
    rows: int, length: int, seed: int = 0, vocab: int = SHAPE["vocab"]
) -> dict[str, np.ndarray]:
    """One batch of the translation task's layout (ids PAD 0, BOS 2, EOS 3) with real padding."""
    rng = np.random.default_rng(seed)
    src = np.zeros((rows, length), np.int32)
    tgt_in, tgt_out = np.zeros_like(src), np.zeros_like(src)
    tgt_mask = np.zeros((rows, length), np.float32)
    for r in range(rows):
        s, t = rng.integers(8, length, 2)
        src[r, : s - 1], src[r, s - 1] = rng.integers(4, vocab, s - 1), 3
        words = rng.integers(4, vocab, t - 1)
        tgt_in[r, 0], tgt_in[r, 1:t] = 2, words
        tgt_out[r, : t - 1], tgt_out[r, t - 1] = words, 3
        tgt_mask[r, :t] = 1.0
    return {"src": src, "src_mask": (src != 0).astype(np.int32), "tgt_in": tgt_in,
            "tgt_out": tgt_out, "tgt_mask": tgt_mask}  # fmt: skip


def build_ln_jax_train(
    batch: dict,
    dropout_rng: str | None = None,
    dtype: str = "float32",
    skip_padding: str | None = None,
):
    """The trainer's step of `configs/mt.py:small` on a one-device mesh, compiled."""
    from configs import mt
    from ln_jax import sharding
    from ln_jax.config.load import build_config
    from ln_jax.task import make_task
    from ln_jax.train import steps

    values = mt.get_config("small").to_dict()
    values["data"]["vocab_size"] = SHAPE["vocab"]
    values["mesh"] = {"data": 1, "fsdp": 1, "tensor": 1}
    if dropout_rng:
        values["dropout_rng"] = dropout_rng
    if skip_padding:
        values["translation"]["skip_padding"] = skip_padding
    values["model"]["dtype"] = dtype
    cfg = build_config(values)
    mesh = sharding.single_device_mesh()
    task = make_task(cfg)
    pieces = steps.init_state(task, mesh)
    train = steps.in_mesh(steps.jit_steps(cfg, task, mesh, pieces)[0], mesh)
    device_batch = jax.device_put(batch, sharding.batch_sharding(mesh))
    box = {"state": pieces.state}

    def step():
        box["state"], metrics = train(box["state"], pieces.rest, device_batch)
        return jax.block_until_ready(metrics)

    step()
    return step


def build_hf_train(batch: dict, dtype: str = "float32"):
    """MarianMTModel (eager PyTorch) forward, label-smoothed loss, backward, AdamW step."""
    import torch
    from transformers import MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(hf_config(0, "relu", 0.1)).train()  # ln_jax's ids: pad 0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8,
                            weight_decay=0.0)  # fmt: skip
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1)
    labels = np.where(batch["tgt_mask"] > 0, batch["tgt_out"], -100)
    inputs = {
        "input_ids": torch.from_numpy(batch["src"]).long(),
        "attention_mask": torch.from_numpy(batch["src_mask"]).long(),
        "decoder_input_ids": torch.from_numpy(batch["tgt_in"]).long(),
    }
    target = torch.from_numpy(labels).long()

    autocast = dtype == "bfloat16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(**inputs).logits
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step()
    return step


def run_train(args) -> dict:
    batch = train_batch(args.rows, args.length)
    arms = {
        "ln_jax": build_ln_jax_train(batch, args.dropout_rng, args.dtype, args.skip_padding),
        "hf_torch": build_hf_train(batch, args.dtype),
    }
    times = run_alternating(arms, args.warmup, args.rounds)
    tokens = float(batch["tgt_mask"].sum())
    rate = {n: tokens / statistics.median(t) for n, t in times.items()}
    return {"target_tokens_per_step": tokens, "tokens_per_s": rate, "seconds": times,
            "ratio": rate["ln_jax"] / rate["hf_torch"]}  # fmt: skip


def run_skip(args) -> dict:
    batch = train_batch(args.rows, args.length)
    arms = {
        name: build_ln_jax_train(batch, args.dropout_rng, args.dtype, name.split("_")[1])
        for name in ("skip_on", "skip_off")
    }
    times = run_alternating(arms, args.warmup, args.rounds)
    tokens = float(batch["tgt_mask"].sum())
    rate = {n: tokens / statistics.median(t) for n, t in times.items()}
    return {"target_tokens_per_step": tokens, "tokens_per_s": rate, "seconds": times,
            "time_ratio": rate["skip_off"] / rate["skip_on"]}  # fmt: skip


# --------------------------------------------------------------------------- decode


def twins(folder: str):
    """(HF MarianMTModel in eval mode, the same model imported into ln_jax)."""
    import torch
    from transformers import MarianMTModel

    from ln_jax import sharding
    from ln_jax.models.translation import convert

    torch.manual_seed(0)
    hf = MarianMTModel(hf_config(SHAPE["vocab"] - 1, "swish", 0.0)).eval()
    hf.save_pretrained(folder)
    return hf, convert.load_marian(folder, mesh=sharding.single_device_mesh())


def sources(args, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Sources of lengths drawn from src_len/2..src_len with EOS (0), right-padded with pad."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.src_len // 2, args.src_len + 1, args.sentences)
    mask = (np.arange(args.src_len)[None] < lengths[:, None]).astype(np.int32)
    src = np.where(mask == 1, rng.integers(2, pad, (args.sentences, args.src_len)), pad)
    src[np.arange(args.sentences), lengths - 1] = 0
    return src.astype(np.int32), mask


def run_decode(args) -> dict:
    import torch

    from ln_jax import sharding
    from ln_jax.models.translation.search import Search, translate

    with tempfile.TemporaryDirectory() as folder, sharding.use_mesh(sharding.single_device_mesh()):
        hf, model = twins(folder)
        pad = hf.config.pad_token_id
        src, mask = sources(args, pad)
        search = Search(beam=args.beam, max_length=args.max_length, max_len_a=0.0,
                        max_len_b=args.max_length, stop="first")  # fmt: skip
        t_src, t_mask = torch.from_numpy(src).long(), torch.from_numpy(mask).long()

        def hf_generate():
            with torch.no_grad():
                return hf.generate(input_ids=t_src, attention_mask=t_mask, num_beams=args.beam,
                                   max_length=args.max_length + 1, early_stopping=True,
                                   length_penalty=1.0, bad_words_ids=[[pad]],
                                   do_sample=False).numpy()[:, 1:]  # fmt: skip

        def ln_jax_search():
            out = translate(model, jnp.asarray(src), jnp.asarray(mask), search)["tokens"]
            return np.asarray(jax.block_until_ready(out))

        outputs = {"ln_jax": ln_jax_search(), "hf_generate": hf_generate()}
        times = run_alternating({"ln_jax": ln_jax_search, "hf_generate": hf_generate},
                                args.warmup, args.rounds)  # fmt: skip
    same, lengths = _same_outputs(outputs["ln_jax"], outputs["hf_generate"], pad)
    rate = {n: args.sentences / statistics.median(t) for n, t in times.items()}
    ratio = rate["ln_jax"] / rate["hf_generate"]
    return {"sentences_per_s": rate, "seconds": times, "same_tokens": same,
            "mean_output_tokens": lengths, "ratio": ratio}  # fmt: skip


def _same_outputs(ours: np.ndarray, theirs: np.ndarray, pad: int) -> tuple[bool, float]:
    """Whether every hypothesis is equal up to its EOS (0), and their mean length."""
    same, lengths = True, []
    for a, b in zip(ours, theirs, strict=True):
        a, b = list(a), [t for t in b if t != pad]
        end = a.index(0) + 1 if 0 in a else len(a)
        lengths.append(end)
        same &= a[:end] == b[:end]
    return bool(same), float(np.mean(lengths))


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)
    run = {"train": run_train, "skip": run_skip, "decode": run_decode}[args.mode]
    result = run(args)
    result.update(args=vars(args), device=jax.devices()[0].device_kind, torch=torch.__version__)
    rates = result.get("tokens_per_s") or result["sentences_per_s"]
    unit = "sentences/s" if args.mode == "decode" else "target tokens/s"
    for name, r in rates.items():
        print(f"{name:12s} {r:10.1f} {unit} (median of {args.rounds})")
    if args.mode == "skip":
        print(f"skipped step / unskipped step = {result['time_ratio']:.2f} of the time")
    else:
        print(f"ln_jax / HuggingFace = {result['ratio']:.2f}x")
    if args.mode == "decode":
        print(f"same tokens: {result['same_tokens']}; mean output {result['mean_output_tokens']}")
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
