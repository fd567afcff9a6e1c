"""Translation as a `ln_jax.task.Task`: the encoder-decoder trained by the one trainer.

Batch keys (global arrays, leading axis the sentences): src, src_mask [batch, src_len] int32;
tgt_in, tgt_out [batch, tgt_len] int32 (BOS + target / target + EOS); tgt_mask [batch, tgt_len]
float32. The loss is fairseq's label-smoothed cross-entropy over the batch's target tokens
(token-weighted under accumulation); evaluation sums the smoothed and plain NLL over every
validation batch and decodes the same batches (greedy, or beam `translation.eval_beam`) for
corpus BLEU with sacrebleu against the raw references.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ln_jax import sharding
from ln_jax.data.translation import joint_tokenizer as tok_lib
from ln_jax.models import hf_io
from ln_jax.models.translation import convert
from ln_jax.models.translation.model import Translator, translator_views
from ln_jax.models.translation.options import SECTION, TranslationOptions
from ln_jax.models.translation.search import Search, translate
from ln_jax.nn.stack import StackView, relayout, stack_output
from ln_jax.task import Task
from ln_jax.train import monitor
from ln_jax.validate import ConfigError

Array = jax.Array
Batch = dict[str, Array]
log = logging.getLogger(__name__)


def bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a"):
    """sacrebleu's corpus BLEU -> (score, signature)."""
    import sacrebleu

    metric = sacrebleu.BLEU(tokenize=tokenize)
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())


class Translation(Task):
    """The task of `configs/mt.py` (`--config.task=translation`)."""

    name = "translation"
    options_section = SECTION
    options_class = TranslationOptions

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.options = cfg.options.resolved(cfg.model)
        self.tokenizer = None  # set by `pipelines`
        self.references: list[str] | None = None

    @staticmethod
    def check_config(cfg: Any) -> TranslationOptions:
        """Raises ValueError for options the model cannot run (called by TrainConfig); the
        options recorded have the platform's choice of an "auto" `skip_padding`."""
        options = cfg.options.resolved(cfg.model)
        return dataclasses.replace(cfg.options, skip_padding=options.skip_padding)

    # ----------------------------------------------------------------- model and loss

    @staticmethod
    def check_data(cfg: Any) -> None:
        """The parallel text files are aligned pairs (`ln_jax.data.translation.parallel`)."""
        from ln_jax.data.translation import parallel

        parallel.check_paralleltext(cfg.data)

    def build(self, rngs: Any) -> Translator:
        return Translator(self.cfg.model, self.options, rngs=rngs)

    def search(self) -> Search:
        """The decoding of the evaluations' BLEU."""
        o = self.options
        return Search(
            beam=o.eval_beam,
            max_length=o.max_target_length + 1,
            lenpen=o.eval_lenpen,
            max_len_a=1.2,
            max_len_b=10,
            greedy=o.eval_beam == 1,
        )

    def abstract_batch(self, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
        """The longest bucket's training batch (`ln_jax.data.translation.batches.Buckets`)."""
        from ln_jax.data.translation.batches import Buckets

        o = self.options
        buckets = Buckets.make(
            o.max_tokens,
            o.max_source_length,
            o.max_target_length,
            sharding.batch_divisor(mesh),
        )
        rows, s, t = buckets.shape(len(buckets.lengths) - 1)
        spec = sharding.batch_struct(mesh)
        return {
            "src": spec((rows, s)),
            "src_mask": spec((rows, s)),
            "tgt_in": spec((rows, t)),
            "tgt_out": spec((rows, t)),
            "tgt_mask": spec((rows, t), jnp.float32),
        }

    def tokens_per_step(self) -> int:
        """The token budget of a batch (`translation.max_tokens`; padded tokens count)."""
        return int(self.options.max_tokens)

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        """Losses divide by the whole batch's target tokens."""
        return {"tokens": jnp.maximum(batch["tgt_mask"].astype(jnp.float32).sum(), 1.0)}

    def loss(
        self,
        model: Translator,
        batch: Batch,
        key: Array | None,
        normalizers: Mapping[str, Array],
        record: bool = False,
    ) -> tuple[Array, dict[str, Array], dict]:
        outputs = model(
            batch["src"],
            batch["src_mask"],
            batch["tgt_in"],
            dropout_key=key,
            record=record,
            hidden=True,
        )
        smoothed, nll = self._sums(model, outputs["hidden"], batch)
        n = normalizers["tokens"]
        return smoothed / n, {"loss": smoothed / n, "nll_loss": nll / n}, outputs

    def _sums(self, model: Translator, hidden: Array, batch: Batch) -> tuple[Array, Array]:
        eps = self.options.label_smoothing
        return model.loss_sums(hidden, batch["tgt_out"], batch["tgt_mask"], eps)

    def initialize(self, model: Translator) -> bool:
        """A fresh run from `translation.init_from`: a translation workdir's latest parameters
        or a HuggingFace Marian folder ("hf:PATH"), in the model's shardings. False (the
        placements' own set-up runs) when it is not set."""
        source = self.options.init_from
        if not source:
            return False
        if source.startswith(convert.HF_PREFIX):
            arrays = self._marian_arrays(source[len(convert.HF_PREFIX) :], model)
        else:
            arrays = _workdir_arrays(source)
        _set_params(model, arrays, source)
        log.info("initial parameters from %s", source)
        return True

    def _marian_arrays(self, path: str, model: Translator) -> dict:
        hf_cfg, values = convert.marian_config(convert.read_hf_config(path))
        fields = ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "activation")
        theirs = {f: getattr(hf_cfg, f) for f in fields} | {
            k: values[k] for k in ("decoder_layers", "pad_id", "bos_id", "eos_id", "output_bias")
        }
        ours = {f: getattr(self.cfg.model, f) for f in fields} | {
            k: getattr(self.options, k) for k in theirs if k not in fields
        }
        if theirs != ours:
            differ = ", ".join(f"{k} {ours[k]} vs {v}" for k, v in theirs.items() if ours[k] != v)
            raise ConfigError(
                f"init_from=hf:{path} does not fit this config ({differ}); use "
                f"--config=configs/mt.py:hf:{path}, which takes the model's shape, ids and "
                "vocabulary from the folder."
            )
        state = convert.read_marian_state(path)
        return convert.marian_arrays(self.cfg.model, self.options, state, hf_io.param_shapes(model))

    # ----------------------------------------------------------------- evaluation

    def eval_batch(self, model: Translator, batch: Batch) -> dict[str, Array]:
        """Summed losses, the token count and (with BLEU) the batch's decoded hypotheses
        [batch, max_target_length + 1] with each row's position in the split (`index` [batch],
        -1 on padding rows)."""
        hidden = model(batch["src"], batch["src_mask"], batch["tgt_in"], hidden=True)["hidden"]
        smoothed, nll = self._sums(model, hidden, batch)
        out = {"loss": smoothed, "nll_loss": nll, "tokens": batch["tgt_mask"].sum()}
        if self.options.eval_bleu:
            decoded = translate(model, batch["src"], batch["src_mask"], self.search())
            out["hypotheses"] = decoded["tokens"]
            rows = batch["src"].shape[0]
            out["index"] = batch.get("index", jnp.arange(rows, dtype=jnp.int32))
        return out

    def eval_description(self) -> str | None:
        """What an evaluation decodes, for the line before it: scoring BLEU (35 s for
        `configs/mt.py:small`'s validation split on 2 CPU cores) printed nothing."""
        if not self.options.eval_bleu or self.references is None:
            return None
        beam = self.options.eval_beam
        search = "greedy" if beam == 1 else f"beam {beam}"
        return f"scoring validation BLEU: {len(self.references)} sentences, {search} decoding"

    def eval_metrics(self, outputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """loss and nll_loss per target token, perplexity exp(nll_loss), and BLEU (sacrebleu,
        13a) of the decoded batches against the raw references, in order."""
        tokens = max(sum(float(o["tokens"]) for o in outputs), 1.0)
        out = {k: sum(float(o[k]) for o in outputs) / tokens for k in ("loss", "nll_loss")}
        out["perplexity"] = math.exp(min(out["nll_loss"], 50.0))
        if self.options.eval_bleu and self.tokenizer is not None:
            found = {
                int(i): self.tokenizer.decode([int(t) for t in row])
                for o in outputs
                for row, i in zip(o["hypotheses"], o["index"], strict=True)
                if i >= 0
            }
            order = sorted(found)
            refs = [self.references[i] for i in order]
            out["bleu"], signature = bleu([found[i] for i in order], refs)
            log.info("BLEU %.2f on %d sentences (%s)", out["bleu"], len(order), signature)
        return out

    # ----------------------------------------------------------------- data

    def pipelines(self, mesh: Any) -> tuple[Any, Any]:
        from ln_jax.data import make_translation_pipeline

        cfg, o = self.cfg, self.options
        lengths = dict(
            max_tokens=o.max_tokens,
            max_source_length=o.max_source_length,
            max_target_length=o.max_target_length,
        )
        train, tokenizer = make_translation_pipeline(
            cfg.data, split="train", seed=cfg.data.seed, mesh=mesh, **lengths
        )
        if tokenizer.vocab_size != cfg.model.vocab_size:
            train.close()
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} pieces but model.vocab_size="
                f"{cfg.model.vocab_size}; set them equal (data.vocab_size sets both)."
            )
        if tok_lib.specials(tokenizer) != tuple(o.specials):
            train.close()
            raise ConfigError(
                f"the tokenizer's (pad, bos, eos) ids are {tok_lib.specials(tokenizer)} but "
                f"{SECTION} has {tuple(o.specials)}; set {SECTION}.pad_id/bos_id/eos_id "
                "to the tokenizer's."
            )
        evals, _ = make_translation_pipeline(
            cfg.data, split="eval", seed=cfg.data.seed, mesh=mesh, **lengths
        )
        self.tokenizer, self.references = tokenizer, evals.references
        return train, evals

    def host_batches(self) -> Any:
        """The training split's batches on the host (numpy, one process): an endless
        iterator with `close` (`ln_jax.analysis`' measurements)."""
        from ln_jax.data import make_host_translation_pipeline

        cfg, o = self.cfg, self.options
        lengths = dict(
            max_tokens=o.max_tokens,
            max_source_length=o.max_source_length,
            max_target_length=o.max_target_length,
        )
        iterator, _ = make_host_translation_pipeline(
            cfg.data, split="train", seed=cfg.data.seed, **lengths
        )
        return iterator

    # ----------------------------------------------------------------- measurements

    def views(self) -> list[StackView]:
        """The view of each stack (names encoder/..., decoder/...), as the model's own."""
        return translator_views(self.cfg.model, self.options)

    def forward_measures(self, model: Translator, outputs: dict, batch: Batch) -> dict:
        rec = outputs["intermediates"]
        enc, dec = self.views()
        memory, src_mask = outputs["memory"], batch["src_mask"]
        tgt_mask = batch["tgt_mask"]
        out = monitor.forward_stats(rec["encoder"], memory, model.encoder, src_mask, enc)
        hidden = stack_output(rec["decoder"], dec)
        out.update(
            monitor.forward_stats(
                rec["decoder"],
                hidden,
                model.decoder,
                tgt_mask,
                dec,
                memory=memory,
                memory_mask=src_mask,
            )
        )
        return out

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict:
        out = {}
        for view in self.views():
            out.update(monitor.parameter_stats(grads, updates, params, view))
        return out


def _workdir_arrays(workdir: str) -> dict:
    """{path: array} of a translation workdir's latest parameters."""
    from flax import nnx

    from ln_jax.models.translation.load import load_translator

    model, _, _ = load_translator(workdir)
    return dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))


def _set_params(model: Translator, arrays: Mapping, source: str) -> None:
    """Every parameter of `model` from `arrays` ({path: array or Variable}), in its sharding,
    the layers restacked where the source has the other layout (a workdir trained with its
    layers as a list into a stacked model, or back: `stack.relayout`); a missing path or a
    shape that differs is a ConfigError naming it."""
    from flax import nnx

    state = nnx.state(model, nnx.Param)
    values = {p: v.get_value() if hasattr(v, "get_value") else v for p, v in arrays.items()}
    arrays = relayout(values, [path for path, _ in nnx.to_flat_state(state)])
    for path, var in nnx.to_flat_state(state):
        name = "/".join(map(str, path))
        if path not in arrays:
            raise ConfigError(f"init_from={source!r} has no parameter {name}: another model.")
        new = arrays[path]
        new = new.get_value() if hasattr(new, "get_value") else new
        old = var.get_value()
        if tuple(new.shape) != tuple(old.shape):
            raise ConfigError(
                f"init_from={source!r}: parameter {name} has shape {tuple(new.shape)}, this "
                f"config's {tuple(old.shape)}; give the source's shape fields."
            )
        host = np.asarray(jax.device_get(new), old.dtype)
        var.set_value(
            jax.make_array_from_callback(host.shape, old.sharding, lambda i, x=host: x[i])
        )
    nnx.update(model, state)
