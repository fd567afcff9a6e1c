"""The vocabulary of a HuggingFace Marian folder, read without transformers.

A Marian folder (e.g. a downloaded `Helsinki-NLP/opus-mt-de-en`) holds `vocab.json` (piece ->
id, one table for both languages), `source.spm` and `target.spm` (sentencepiece models that
split each language into pieces). Sources are split by `source.spm`, targets by `target.spm`,
pieces looked up in `vocab.json` (unknown pieces -> `<unk>`); a leading language code such as
`>>fr<<` is one piece. Decoding maps ids to pieces and joins them with `target.spm`. The
special ids come from the vocabulary: `</s>` (eos, 0 in opus-mt), `<unk>`, `<pad>` (the last
id, also the decoder's start). This is the tokenizer interface of
`ln_jax.data.translation.joint_tokenizer` (`encode`, `encode_batch`, `encode_target_batch`,
`decode`, `vocab_size`, `fingerprint`, `pad_id`/`unk_id`/`bos_id`/`eos_id`), so Marian models
train and translate on ln_jax's data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from ln_jax.validate import ConfigError

FILES = ("vocab.json", "source.spm", "target.spm")


class MarianVocab:
    """A Marian folder's tokenizer (module docstring)."""

    def __init__(self, folder: str | Path, decoder_start: int | None = None):
        import sentencepiece as spm

        folder = Path(folder)
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise ConfigError(
                f"hf:{folder} lacks {', '.join(missing)}: a Marian folder holds vocab.json, "
                "source.spm and target.spm (MarianTokenizer.save_pretrained writes them)."
            )
        self.vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text("utf-8"))
        self.pieces = {i: p for p, i in self.vocab.items()}
        for piece in ("</s>", "<unk>", "<pad>"):
            if piece not in self.vocab:
                raise ConfigError(f"hf:{folder}: vocab.json has no {piece!r} entry.")
        self.eos_id, self.unk_id = self.vocab["</s>"], self.vocab["<unk>"]
        self.pad_id = self.vocab["<pad>"]
        self.bos_id = self.pad_id if decoder_start is None else decoder_start
        self.vocab_size = len(self.vocab)
        self.source = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(folder / "target.spm"))
        digest = hashlib.md5()
        for f in FILES:
            digest.update((folder / f).read_bytes())
        self.fingerprint = f"marian-{digest.hexdigest()}"

    def _ids(self, pieces: Iterable[str]) -> list[int]:
        return [self.vocab.get(p, self.unk_id) for p in pieces]

    def _split(self, text: str, model) -> list[str]:
        """A leading `>>xx<<` language code is one piece; the rest goes to `model`."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return code + model.encode(text, out_type=str)

    def encode(self, text: str) -> list[int]:
        """A source sentence's ids, without EOS."""
        return self._ids(self._split(text, self.source))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_target(self, text: str) -> list[int]:
        """A target sentence's ids (split by target.spm), without EOS."""
        return self._ids(self._split(text, self.target))

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode_target(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ids up to the first EOS, pad / start / unknown ids dropped."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id, self.unk_id) and i in self.pieces:
                pieces.append(self.pieces[i])
        return self.target.decode_pieces(pieces).replace("\u2581", " ").strip()
