"""Parallel text (source, target sentence pairs) behind `DataConfig.dataset`, for translation.

Names `data.dataset` may hold for a translation run:

* `ln_jax_gettext/de-en`, `ln_jax_gettext/fr-en` (the offline default): human translations of
  the gettext catalogues installed on this machine, German/French -> English
  (`ln_jax.data.translation.gettext`), built locally as a TFDS dataset on first use.
* `wmt14_translate/de-en`, `wmt_t2t_translate/de-en`, `wmt16_translate/de-en`: TFDS's WMT
  builders, read German -> English. They must be prepared as array_record first (preparing them
  imports TensorFlow); a dataset that is not prepared is a one-line error with the command.
* `paralleltext:PREFIX`: prepared files `PREFIX.{train,valid,test}.{src,tgt}`, one sentence a
  line, aligned (how IWSLT14 prepared by fairseq's recipe comes in).
* `synthetic:copy`, `synthetic:reverse`: random symbol sequences (`w0 w5 w17 ...`, 3-12 symbols)
  whose target is the source or the source reversed; a fixed corpus drawn from `data.seed`,
  with its own symbol vocabulary (`SymbolTokenizer`), for tests and CI.

Every source gives `pairs(split) -> list of (source, target)` strings for the splits "train",
"validation" and "test" (TFDS slicing works for TFDS sources) and a `key` naming exactly the
data (caches and iterator states are keyed by it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

from etils import epath

from ln_jax.data import corpus, sources
from ln_jax.data.config import TRANSLATION_PREFIXES
from ln_jax.data.translation import gettext
from ln_jax.validate import ConfigError, UserError, check_choice, unknown_choice

GETTEXT_PREFIX, PARALLELTEXT_PREFIX, SYNTHETIC_PREFIX = TRANSLATION_PREFIXES
SYNTHETIC_TASKS = ("copy", "reverse")
WMT_DATASETS = ("wmt14_translate/de-en", "wmt_t2t_translate/de-en", "wmt16_translate/de-en")
GETTEXT_DATASETS = (f"{GETTEXT_PREFIX}/de-en", f"{GETTEXT_PREFIX}/fr-en")
KNOWN_DATASETS = (
    *GETTEXT_DATASETS,
    *WMT_DATASETS,
    *(f"{SYNTHETIC_PREFIX}{t}" for t in SYNTHETIC_TASKS),
    f"{PARALLELTEXT_PREFIX}PREFIX",
)
SPLITS = ("train", "validation", "test")
# paralleltext file infix of each split ("valid" as fairseq's recipes write it).
_FILE_SPLITS = {"train": "train", "validation": "valid", "valid": "valid", "test": "test"}

# The synthetic corpus: symbols w0..w{n-1} (ids 4..), 3-12 of them a sentence.
SYNTHETIC_SYMBOLS = 32
SYNTHETIC_LENGTHS = (3, 12)
SYNTHETIC_SIZES = {"train": 20_000, "validation": 256, "test": 256}

Pairs = list[tuple[str, str]]


class ParallelDataError(UserError):
    """Parallel-text files that cannot be read as aligned sentence pairs."""


@dataclasses.dataclass
class ParallelSource:
    """One opened parallel dataset.

    Attributes:
      name: the name as given in `data.dataset`.
      key: file-name-safe identity of exactly this data (builder config and version, a hash of
        files, ...): caches and iterator states are keyed by it.
      read: split name -> [(source sentence, target sentence), ...] in stored order.
      cache_dir: where the joint tokenizer and the token ids are cached; None for the synthetic
        source (no sentencepiece, nothing cached).
      metadata: what the data was made from (for gettext: the catalogues), for the run's records.
    """

    name: str
    key: str
    read: Callable[[str], Pairs]
    cache_dir: epath.Path | None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def pairs(self, split: str) -> Pairs:
        return self.read(split)

    @property
    def synthetic(self) -> bool:
        return self.name.startswith(SYNTHETIC_PREFIX)


def is_translation_dataset(name: str) -> bool:
    """True for the names `open_parallel` knows (translation sources), false for text corpora."""
    return (
        name in KNOWN_DATASETS
        or name.startswith((PARALLELTEXT_PREFIX, SYNTHETIC_PREFIX, GETTEXT_PREFIX))
        or name.split(":")[0] in WMT_DATASETS
    )


def open_parallel(cfg: Any) -> ParallelSource:
    """Opens the parallel dataset of a DataConfig (`cfg.dataset`: one name, no mix).

    Raises:
      ConfigError: a mix, or a name that is no parallel dataset (naming the closest one).
      DatasetNotPreparedError: a TFDS dataset that is not prepared (with the command).
      ParallelDataError: paralleltext files missing or not aligned.
    """
    if not isinstance(cfg.dataset, str) or "," in cfg.dataset:
        raise ConfigError(f"data.dataset={cfg.dataset!r}: translation reads one dataset, not a mix")
    name = cfg.dataset
    if name.startswith(SYNTHETIC_PREFIX):
        return synthetic_source(name, cfg.seed, cfg.vocab_size)
    if name.startswith(PARALLELTEXT_PREFIX):
        return paralleltext_source(name, cfg.cache_dir)
    if name.startswith(GETTEXT_PREFIX):
        return gettext_source(name, cfg.data_dir)
    if name.split(":")[0] in WMT_DATASETS:
        return wmt_source(name, cfg.data_dir, cfg.download)
    raise unknown_choice(
        "data.dataset", name, KNOWN_DATASETS, config_field="data.dataset", shown=KNOWN_DATASETS
    )


def gettext_source(name: str, data_dir: str | None = None):
    """`ln_jax_gettext/<pair>` as a `parallel.ParallelSource`, prepared on first use.

    Raises:
      ConfigError: an unknown pair (naming the closest one).
      CatalogueError: fewer clean pairs than `gettext.MIN_PAIRS`.
    """
    prefix = GETTEXT_PREFIX + "/"
    pair = name[len(prefix) :] if name.startswith(prefix) else ""
    root = sources.default_data_dir(data_dir)
    builder = corpus.prepare(gettext.gettext_builder(pair, root))
    text = sources.TextSource(name, builder)

    def read(split: str) -> list[tuple[str, str]]:
        records = text.data_source(split)
        rows = records.__getitems__(list(range(len(records)))) if len(records) else []
        return [(_text(r["source"]), _text(r["target"])) for r in rows]

    metadata = {"catalogues": len(builder.builder_config.catalogues), "config": builder.info.name}
    return ParallelSource(name, text.key, read, text.dataset_dir, metadata)


# --------------------------------------------------------------------------------------------
# The synthetic copy / reverse task
# --------------------------------------------------------------------------------------------


def synthetic_symbols(vocab_size: int) -> int:
    """Symbols of the synthetic vocabulary: SYNTHETIC_SYMBOLS, fewer if `vocab_size` is small."""
    return max(2, min(SYNTHETIC_SYMBOLS, vocab_size - 4))


def synthetic_pairs(task: str, split: str, seed: int, num_symbols: int) -> Pairs:
    """The fixed synthetic corpus of one split: a pure function of (task, split, seed).

    Sources are 3-12 symbols `w<k>` drawn uniformly; the target is the same sequence (copy) or
    reversed (reverse).
    """
    import numpy as np

    if split not in SYNTHETIC_SIZES:
        raise ValueError(f"synthetic split {split!r}; use one of {tuple(SYNTHETIC_SIZES)}")
    tag = int(hashlib.md5(f"{task}/{split}".encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng([seed, tag])
    low, high = SYNTHETIC_LENGTHS
    pairs = []
    for _ in range(SYNTHETIC_SIZES[split]):
        symbols = [f"w{k}" for k in rng.integers(0, num_symbols, rng.integers(low, high + 1))]
        target = symbols if task == "copy" else symbols[::-1]
        pairs.append((" ".join(symbols), " ".join(target)))
    return pairs


def synthetic_source(name: str, seed: int, vocab_size: int) -> ParallelSource:
    task = name[len(SYNTHETIC_PREFIX) :]
    check_choice(
        "data.dataset",
        name,
        [SYNTHETIC_PREFIX + t for t in SYNTHETIC_TASKS],
        config_field="data.dataset",
    )
    n = synthetic_symbols(vocab_size)
    read = lambda split: synthetic_pairs(task, _canonical_split(split), seed, n)  # noqa: E731
    return ParallelSource(name, f"synthetic-{task}-s{seed}-v{n}", read, None, {"symbols": n})


def _canonical_split(split: str) -> str:
    return "validation" if split == "valid" else split


# --------------------------------------------------------------------------------------------
# paralleltext:PREFIX
# --------------------------------------------------------------------------------------------


READER = "lines-at-newline-only"  # how `read_lines` splits, part of the cache key


def paralleltext_files(prefix: str, split: str) -> tuple[str, str]:
    """(source file, target file) of a split: `PREFIX.<train|valid|test>.<src|tgt>`."""
    if split not in _FILE_SPLITS:
        raise ValueError(f"paralleltext split {split!r}; use one of {SPLITS}")
    infix = _FILE_SPLITS[split]
    return f"{prefix}.{infix}.src", f"{prefix}.{infix}.tgt"


def read_paralleltext(prefix: str, split: str) -> Pairs:
    """The aligned lines of a split's two files (`read_lines`: split on "\\n" only).

    Raises:
      ParallelDataError: a file is missing, not UTF-8 (naming the line), the two files' line
        counts differ, or the split holds no pair.
    """
    src_path, tgt_path = paralleltext_files(prefix, split)
    sides = []
    for path in (src_path, tgt_path):
        if not os.path.isfile(path):
            raise ParallelDataError(
                f"paralleltext:{prefix}: {path} does not exist; prepare "
                f"{prefix}.{{train,valid,test}}.{{src,tgt}}, one sentence a line, aligned."
            )
        sides.append(read_lines(path))
    if len(sides[0]) != len(sides[1]):
        raise ParallelDataError(_misaligned(prefix, (src_path, tgt_path), sides))
    if not sides[0]:
        raise ParallelDataError(
            f"paralleltext:{prefix}: {src_path} and {tgt_path} hold no lines: the {split} "
            "split needs sentence pairs, one sentence a line in each file."
        )
    return list(zip(sides[0], sides[1], strict=True))


# Characters `str.splitlines()` (and tools built on it) break lines at, besides "\n" and "\r":
# inside a sentence they are text here, but a file written by such a tool may have lost the
# alignment at the first one.
OTHER_LINE_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file (`split_lines`).

    Raises:
      ParallelDataError: a line that is not UTF-8, naming the file, the line and the fix.
    """
    with open(path, "rb") as f:
        data = f.read()
    convert = f"iconv -f latin1 -t utf-8 {path} > {path}.utf8`, then move it over the file"
    return split_lines(data, path, f"convert the file to UTF-8 (e.g. `{convert}) or fix the line")


def split_lines(data: bytes, where: str, fix: str) -> list[str]:
    """UTF-8 `data` split into lines on "\\n" only: a CRLF line's "\\r" is removed, a
    byte-order mark at the start too, and a final newline ends the last line (it starts none).
    `str.splitlines()` would also split at U+2028, U+0085, form feeds, ... inside a sentence
    (`OTHER_LINE_BREAKS`), and two files of aligned lines would no longer be aligned.

    Raises:
      ParallelDataError: "`where`, line N: not UTF-8 (...); `fix`."
    """
    rows = data.split(b"\n")
    if rows[-1] == b"":
        rows.pop()
    lines = []
    for number, raw in enumerate(rows, 1):
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as err:
            raise ParallelDataError(
                f"{where}, line {number}: not UTF-8 (byte 0x{raw[err.start]:02x}, byte "
                f"{err.start + 1} of the line); {fix}."
            ) from None
        lines.append(line.removeprefix("\ufeff") if number == 1 else line)
    return lines


def _misaligned(prefix: str, files: tuple[str, str], sides: list[list[str]]) -> str:
    """The message of two files of different line counts: the counts and, where a line holds a
    character other tools break lines at (the likely cause), the first such line."""
    (src_path, tgt_path), (src, tgt) = files, sides
    message = (
        f"paralleltext:{prefix}: {src_path} has {len(src)} lines but {tgt_path} has "
        f"{len(tgt)} (lines end at \\n only); the files must be aligned line by line: "
        "nothing is trained on pairs that may be shifted."
    )
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        for number, line in enumerate(lines, 1):
            found = next((c for c in line if c in OTHER_LINE_BREAKS), None)
            if found is not None:
                return (
                    f"{message} {path} line {number} holds U+{ord(found):04X}, which other "
                    "tools split lines at: if the files were written by one, redo them "
                    "splitting on \\n only."
                )
    return f"{message} Find the first line whose two sides do not translate each other."


def paralleltext_source(name: str, cache_dir: str | None) -> ParallelSource:
    """A `paralleltext:PREFIX` source; its key hashes the reader, the six files' paths, sizes
    and times, and its tokenizer and token ids are cached in
    `local_cache_root(cache_dir)/paralleltext-<key>`.

    Raises:
      ParallelDataError: a file is missing (checked here, before anything is trained).
    """
    prefix = os.path.abspath(os.path.expanduser(name[len(PARALLELTEXT_PREFIX) :]))
    # READER: caches made by the reader that split at U+2028 & co. (shifted pairs) are not reused.
    digest = hashlib.md5(f"{READER}|{prefix}".encode())
    for split in SPLITS:
        for path in paralleltext_files(prefix, split):
            if not os.path.isfile(path):
                read_paralleltext(prefix, split)  # raises the one-line error
            st = os.stat(path)
            digest.update(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode())
    key = f"paralleltext-{digest.hexdigest()[:12]}"
    folder = epath.Path(os.fspath(sources.local_cache_root(cache_dir) / key))
    read = lambda split: read_paralleltext(prefix, split)  # noqa: E731
    return ParallelSource(name, key, read, folder, {"prefix": prefix})


def check_paralleltext(cfg: Any) -> None:
    """Reads the training and evaluation splits of a `paralleltext:` dataset (DataConfig `cfg`;
    other names are left to the task), so that files that are no aligned pairs are a one-line
    error before anything is created or trained.

    Raises:
      ParallelDataError: as `read_paralleltext`.
    """
    name = cfg.dataset
    if not (isinstance(name, str) and name.startswith(PARALLELTEXT_PREFIX)):
        return
    source = paralleltext_source(name, cfg.cache_dir)
    for split in dict.fromkeys((cfg.train_split, cfg.eval_split)):
        if split in _FILE_SPLITS:
            source.pairs(split)


# --------------------------------------------------------------------------------------------
# TFDS WMT builders
# --------------------------------------------------------------------------------------------


def wmt_source(name: str, data_dir: str | None, download: bool) -> ParallelSource:
    """A prepared TFDS WMT dataset read German -> English (features `de`, `en`).

    Raises:
      DatasetNotPreparedError: not prepared under the data dir (the message gives the command
        and says that preparing needs TensorFlow).
    """
    root = sources.default_data_dir(data_dir)
    try:
        builder = sources._prepared_tfds_builder(name, root, download)
    except sources.DatasetNotPreparedError as e:
        raise sources.DatasetNotPreparedError(
            f"{e}\nThe WMT builders import TensorFlow to prepare (`pip install tensorflow`) and "
            "download several GB; ln_jax then reads them without TensorFlow."
        ) from None
    sources.check_random_access(name, builder)
    text = sources.TextSource(name, builder)
    src_lang, tgt_lang = "de", "en"

    def read(split: str) -> Pairs:
        records = text.data_source(split)
        rows = records.__getitems__(list(range(len(records)))) if len(records) else []
        return [(_text(r[src_lang]), _text(r[tgt_lang])) for r in rows]

    return ParallelSource(name, text.key, read, text.dataset_dir, {"tfds": name})


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
