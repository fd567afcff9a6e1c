"""`ln_jax_sitedocs`: the docstrings of every installed package, a local corpus of 20+ MB.

The embedded `ln_jax_pydocs` (~2 MB) is enough for the quick main job; the studies need more
text. Every Python environment with a scientific stack carries tens of MB of English prose in
its packages' docstrings. This builder reads them with `ast` (nothing is imported), from every
distribution that `importlib.metadata` finds in the interpreter's site-packages (the `.py`
files of its RECORD, without `test`/`tests` folders), plus the standard library's docstrings
and pydoc topics of `ln_jax_pydocs`. Nothing is downloaded.

What the corpus holds depends on what is installed, so

* the builder config's name is `p` + a hash of the Python version and of every distribution's
  name and version: two installations never share one prepared dataset under one name;
* the dataset's metadata (`builder.info.metadata`, `metadata.json` beside the data) records
  the Python version, every distribution with its version, and the size of each split.

Exact-duplicate documents (vendored copies of the same library, one docstring copied into
many places) are kept once, the first in (stdlib, then distributions by name, files by path)
order, so the validation split never holds a training document verbatim. Documents go to
validation by `corpus.is_validation` with a modulus chosen from the corpus's size so that the
validation split holds about `VALIDATION_TARGET_WORDS` words (1 in 200, the pydocs rate,
would give only ~24k words here).

More folders: `LN_JAX_SITEDOCS_ROOTS=DIR1:DIR2` (os.pathsep-separated) adds the
distributions installed in other site-packages folders (e.g. another virtual environment's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import pathlib
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence

import tensorflow_datasets as tfds

from ln_jax.data import corpus
from ln_jax.validate import UserError

ROOTS_ENV = "LN_JAX_SITEDOCS_ROOTS"
# The corpus must hold at least this much text (UTF-8 bytes of the `text` fields).
MIN_TEXT_BYTES = 20_000_000
# The validation modulus gives about this many words to validation (>= 200k with margin).
VALIDATION_TARGET_WORDS = 300_000
# Folders of a distribution whose files are tests or caches, not documentation.
_SKIP_PARTS = frozenset({"test", "tests", "__pycache__"})

Documents = list[tuple[str, list[str]]]


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One installed distribution: its name, version, folder and documentation files."""

    name: str
    version: str
    root: str = dataclasses.field(repr=False)
    files: tuple[str, ...] = dataclasses.field(repr=False)  # .py paths under `root`, sorted


@dataclasses.dataclass(eq=False)
class SitedocsConfig(tfds.core.BuilderConfig):
    """The builder config: what is read, and the size the corpus must reach.

    Attributes:
      roots: site-packages folders searched for distributions (in order: the first of two
        distributions with one name wins, as on `sys.path`).
      distributions: the distributions found there.
      stdlib: also the standard library's docstrings and pydoc topics.
      min_text_bytes: a smaller corpus is an error (`CorpusTooSmallError`).
    """

    roots: tuple[str, ...] = ()
    distributions: tuple[Distribution, ...] = dataclasses.field(default=(), repr=False)
    stdlib: bool = True
    min_text_bytes: int = MIN_TEXT_BYTES


class CorpusTooSmallError(UserError):
    """The installed packages hold less documentation text than the corpus needs."""


def default_roots() -> tuple[str, ...]:
    """The interpreter's site-packages folders, then those of `$LN_JAX_SITEDOCS_ROOTS`."""
    paths = sysconfig.get_paths()
    extra = [p for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p]
    roots = [paths["purelib"], paths["platlib"], *extra]
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots if os.path.isdir(r)))


def _doc_files(dist: importlib.metadata.Distribution) -> tuple[str, ...]:
    """The `.py` files a distribution installed (its RECORD), without tests, sorted."""
    files = dist.files or ()
    keep = (
        f.as_posix()
        for f in files
        if f.suffix == ".py" and ".." not in f.parts and not _SKIP_PARTS.intersection(f.parts)
    )
    return tuple(sorted(set(keep)))


def find_distributions(roots: Sequence[str]) -> tuple[Distribution, ...]:
    """Every distribution installed in `roots` that has `.py` files, sorted by name."""
    found: dict[str, Distribution] = {}
    for root in roots:
        for dist in importlib.metadata.distributions(path=[root]):
            name = (dist.metadata["Name"] or "").strip()
            key = name.lower().replace("_", "-")
            files = _doc_files(dist)
            if name and files and key not in found:
                found[key] = Distribution(name, dist.version, root, files)
    return tuple(found[k] for k in sorted(found))


def sitedocs_config(
    roots: Sequence[str] | None = None, *, stdlib: bool = True, min_text_bytes: int | None = None
) -> SitedocsConfig:
    """The builder config of the distributions installed in `roots` (None = `default_roots()`).

    Its name hashes the Python version, `stdlib` and every distribution's name and version.
    """
    roots = tuple(os.path.realpath(r) for r in (default_roots() if roots is None else roots))
    dists = find_distributions(roots)
    spec = [sys.version.split()[0], str(stdlib), *(f"{d.name}=={d.version}" for d in dists)]
    digest = hashlib.md5("\n".join(spec).encode()).hexdigest()[:12]
    return SitedocsConfig(
        name=f"p{digest}",
        description=(
            f"{len(dists)} distributions of {', '.join(roots)}"
            + (" and the standard library" if stdlib else "")
        ),
        roots=roots,
        distributions=dists,
        stdlib=stdlib,
        min_text_bytes=MIN_TEXT_BYTES if min_text_bytes is None else min_text_bytes,
    )


def distribution_documents(dist: Distribution) -> Iterator[tuple[str, list[str]]]:
    """Yields (`name/path::qualified name`, sentences) for each docstring of a distribution."""
    for rel in dist.files:
        yield from corpus.module_documents(pathlib.Path(dist.root, rel), f"{dist.name}/{rel}")


def unique_documents(docs: Iterable[tuple[str, list[str]]]) -> tuple[Documents, int]:
    """(the documents whose text was not seen before, in order; how many were dropped).

    A key seen before (a name defined twice in one file, e.g. a property's getter and setter)
    gets `#2`, `#3`, ... appended: TFDS keys must be unique.
    """
    seen: set[bytes] = set()
    key_counts: dict[str, int] = {}
    kept, dropped = [], 0
    for key, sentences in docs:
        digest = hashlib.md5("\n".join(sentences).encode("utf-8")).digest()
        if digest in seen:
            dropped += 1
            continue
        seen.add(digest)
        key_counts[key] = key_counts.get(key, 0) + 1
        kept.append((key if key_counts[key] == 1 else f"{key}#{key_counts[key]}", sentences))
    return kept, dropped


def validation_modulus(total_words: int) -> int:
    """1 document in this many goes to validation: about `VALIDATION_TARGET_WORDS` words of
    validation, at most the pydocs rate of 1 in 200, at least 1 in 2."""
    return max(2, min(corpus.VALIDATION_MODULUS, total_words // VALIDATION_TARGET_WORDS))


def _split_sizes(docs: Documents) -> dict[str, int]:
    return {
        "documents": len(docs),
        "words": sum(len(s.split()) for _, sentences in docs for s in sentences),
        "text_bytes": sum(len("\n".join(sentences).encode("utf-8")) for _, sentences in docs),
    }


def _too_small_message(config: SitedocsConfig, text_bytes: int) -> str:
    return (
        f"ln_jax_sitedocs: the installed packages hold {text_bytes / 1e6:.1f} MB of docstring "
        f"text ({len(config.distributions)} distributions in {', '.join(config.roots)}), under "
        f"the {config.min_text_bytes / 1e6:.0f} MB the corpus needs. Install more documented "
        'packages (e.g. `pip install -e ".[test]"`, which adds torch and transformers), or add '
        f"another environment's site-packages with {ROOTS_ENV}=DIR, or use ln_jax_pydocs."
    )


class LnJaxSitedocs(corpus._LocalBuilder):
    """Docstrings of every installed distribution plus the stdlib docs, as a sentence corpus.

    Build it with `sitedocs_builder()`; the config names the installation it was made from.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Docstrings of installed distributions and of the stdlib."}

    def _info(self) -> tfds.core.DatasetInfo:
        config = self.builder_config
        dists = config.distributions if isinstance(config, SitedocsConfig) else ()
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Docstrings (read with ast) of installed Python distributions; one sentence "
                f"per line of `text`. Python {sys.version.split()[0]}; "
                f"{getattr(config, 'description', '')}."
            ),
            features=corpus._text_features(),
            metadata=tfds.core.MetadataDict(
                python=sys.version.split()[0],
                packages={d.name: d.version for d in dists},
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local
        config = self.builder_config
        docs, dropped = unique_documents(self._all_documents())
        total = _split_sizes(docs)
        if total["text_bytes"] < config.min_text_bytes:
            raise CorpusTooSmallError(_too_small_message(config, total["text_bytes"]))
        modulus = validation_modulus(total["words"])
        held_out = [corpus.is_validation(key, modulus) for key, _ in docs]
        splits = {
            "train": [d for d, v in zip(docs, held_out, strict=True) if not v],
            "validation": [d for d, v in zip(docs, held_out, strict=True) if v],
        }
        self.info.metadata.update(
            validation_modulus=modulus,
            duplicates_dropped=dropped,
            sizes={name: _split_sizes(split) for name, split in splits.items()},
        )
        return {name: self._generate_examples(split) for name, split in splits.items()}

    def _all_documents(self) -> Iterator[tuple[str, list[str]]]:
        config = self.builder_config
        if config.stdlib:
            yield from corpus.stdlib_documents()
            yield from corpus.topic_documents()
        for dist in config.distributions:
            yield from distribution_documents(dist)

    def _generate_examples(self, docs: Documents):
        for key, sentences in docs:
            yield key, {"doc_id": key, "text": "\n".join(sentences)}


def sitedocs_builder(
    data_dir: str | None = None, config: SitedocsConfig | None = None
) -> LnJaxSitedocs:
    """The (not necessarily prepared) builder of this installation's docstrings corpus."""
    config = config or sitedocs_config()
    with corpus.tfds_output_to_log():  # TFDS warns of a custom config: train.log, not the terminal
        return LnJaxSitedocs(data_dir=data_dir, config=config)
