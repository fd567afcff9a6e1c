"""BERT pretraining (masked LM + next-sentence prediction) as a `ln_jax.task.Task`.

Everything the trainer knows of BERT pretraining goes through this class: the model, the
batch's keys, the MLM/NSP loss with its token-weighted denominators, the evaluation sums, the
data pipelines and the monitor's measurements.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ln_jax import sharding
from ln_jax.models.bert.model import BertForPreTraining, encoder_view, pretraining_loss
from ln_jax.models.bert.options import SECTION, BertOptions
from ln_jax.task import Task
from ln_jax.train import monitor
from ln_jax.validate import ConfigError

Array = jax.Array
Batch = dict[str, Array]
FIRST_ORDINARY_TOKEN = 5  # ids 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK]


class BertPretraining(Task):
    """The task of `configs/bert_preln.py` and `configs/bert_postln.py`.

    Batch keys ([batch, length] / [batch, P] / [batch] int32, weights float32): input_ids,
    segment_ids, attention_mask, masked_positions, masked_ids, masked_weights, nsp_label.
    """

    name = "bert_pretraining"
    options_section = SECTION
    options_class = BertOptions

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.use_nsp = bool(cfg.options.nsp and cfg.options.nsp_head)

    @staticmethod
    def check_data(cfg: Any) -> None:
        """The datasets are prepared (`ln_jax.data.sources.check_datasets`)."""
        from ln_jax.data import sources

        sources.check_datasets(cfg.data)

    def build(self, rngs: Any) -> BertForPreTraining:
        return BertForPreTraining(self.cfg.model, rngs=rngs, options=self.cfg.options)

    def abstract_batch(self, mesh: jax.sharding.Mesh) -> dict[str, jax.ShapeDtypeStruct]:
        d, p = self.cfg.data, self.cfg.options.max_predictions_per_seq
        b, t = d.global_batch_size, d.max_seq_length
        spec = sharding.batch_struct(mesh)
        return {
            "input_ids": spec((b, t)),
            "segment_ids": spec((b, t)),
            "attention_mask": spec((b, t)),
            "masked_positions": spec((b, p)),
            "masked_ids": spec((b, p)),
            "masked_weights": spec((b, p), jnp.float32),
            "nsp_label": spec((b,)),
        }

    def normalizers(self, batch: Batch) -> dict[str, Array]:
        """The MLM loss divides by the batch's masked-token weight, NSP by its sequences."""
        weight = jnp.maximum(batch["masked_weights"].astype(jnp.float32).sum(), 1.0)
        return {"mlm_weight": weight, "num_sequences": batch["input_ids"].shape[0]}

    def loss(
        self,
        model: BertForPreTraining,
        batch: Batch,
        key: Array | None,
        normalizers: Mapping[str, Array],
        record: bool = False,
    ) -> tuple[Array, dict[str, Array], dict]:
        outputs = self._outputs(model, batch, key, record)
        loss, metrics = pretraining_loss(
            outputs, batch, self.use_nsp, normalizers["mlm_weight"], normalizers["num_sequences"]
        )
        return loss, metrics, outputs

    def eval_batch(self, model: BertForPreTraining, batch: Batch) -> dict[str, Array]:
        """The batch's summed losses and accuracies with their counts."""
        _, metrics = pretraining_loss(self._outputs(model, batch, None, False), batch, self.use_nsp)
        n_pred = jnp.maximum(batch["masked_weights"].sum(), 1.0)
        n_seq = batch["input_ids"].shape[0]
        sums = {
            "mlm_loss": metrics["mlm_loss"] * n_pred,
            "mlm_accuracy": metrics["mlm_accuracy"] * n_pred,
            "n_pred": n_pred,
        }
        if self.use_nsp:
            sums.update(
                nsp_loss=metrics["nsp_loss"] * n_seq,
                nsp_accuracy=metrics["nsp_accuracy"] * n_seq,
                n_seq=n_seq * 1.0,
            )
        return sums

    def eval_metrics(self, outputs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Exact averages over every batch: sums over counts."""
        totals = {k: sum(float(o[k]) for o in outputs) for k in outputs[0]}
        out = {k: totals[k] / totals["n_pred"] for k in ("mlm_loss", "mlm_accuracy")}
        if "n_seq" in totals:
            out.update({k: totals[k] / totals["n_seq"] for k in ("nsp_loss", "nsp_accuracy")})
        out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0)
        return out

    def pipelines(self, mesh: jax.sharding.Mesh) -> tuple[Any, Any]:
        from ln_jax.data import make_pipeline

        cfg = self.cfg
        train_iter, tokenizer = make_pipeline(
            cfg.data, examples=cfg.options, split="train", seed=cfg.data.seed, mesh=mesh
        )
        if tokenizer.vocab_size != cfg.model.vocab_size:
            train_iter.close()
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} pieces but model.vocab_size="
                f"{cfg.model.vocab_size}; set them equal (data.vocab_size sets both)."
            )
        eval_batches, _ = make_pipeline(
            cfg.data,
            examples=cfg.options,
            split="eval",
            seed=cfg.data.seed,
            mesh=mesh,
            num_batches=cfg.eval_batches,
        )
        return train_iter, eval_batches

    # ----------------------------------------------------------------- the analyses' batches

    def random_batch(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A batch of uniformly random ordinary tokens, masked positions and labels: the
        sentence-pair halves as segments, no padding; "nsp_label" only with `bert.nsp`."""
        d, p = self.cfg.data, self.cfg.options.max_predictions_per_seq
        b, t = d.global_batch_size, d.max_seq_length
        vocab = self.cfg.model.vocab_size
        positions = np.sort(
            np.stack([rng.choice(np.arange(1, t), p, replace=False) for _ in range(b)]), axis=1
        )
        ids = rng.integers(FIRST_ORDINARY_TOKEN, vocab, (b, t), dtype=np.int32)
        batch = {
            "input_ids": ids,
            "segment_ids": (np.arange(t)[None, :] >= t // 2).repeat(b, 0).astype(np.int32),
            "attention_mask": np.ones((b, t), np.int32),
            "masked_positions": positions.astype(np.int32),
            "masked_ids": rng.integers(FIRST_ORDINARY_TOKEN, vocab, (b, p), dtype=np.int32),
            "masked_weights": np.ones((b, p), np.float32),
            "nsp_label": rng.integers(0, 2, (b,), dtype=np.int32),
        }
        return self._without_unused_labels(batch)

    def host_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The training split's batches from `data`, on the host, without loader threads."""
        from ln_jax.data import make_host_pipeline

        data = self.cfg.data
        iterator, _ = make_host_pipeline(
            data, examples=self.cfg.options, split="train", seed=data.seed, threads=0
        )
        return (self._without_unused_labels(b) for b in iterator)

    def _without_unused_labels(self, batch: dict) -> dict:
        """Drops "nsp_label" when the data has no sentence pairs (the loss skips NSP then)."""
        return (
            batch if self.cfg.options.nsp else {k: v for k, v in batch.items() if k != "nsp_label"}
        )

    # ----------------------------------------------------------------- measurements

    def forward_measures(self, model: BertForPreTraining, outputs: dict, batch: Batch) -> dict:
        rec = outputs["intermediates"]
        hidden = rec.get("final_norm_out", rec["ffn/output"][-1])  # what the heads read
        encoder, mask = model.bert.encoder, batch["attention_mask"]
        return monitor.forward_stats(rec, hidden, encoder, mask, encoder_view(self.cfg.model))

    def parameter_measures(self, grads: Any, updates: Any, params: Any) -> dict:
        return monitor.parameter_stats(grads, updates, params, encoder_view(self.cfg.model))

    def _outputs(self, model, batch: Batch, key: Array | None, record: bool) -> dict:
        return model(
            batch["input_ids"],
            batch["segment_ids"],
            batch["attention_mask"],
            batch["masked_positions"],
            dropout_key=key,
            record=record,
        )
