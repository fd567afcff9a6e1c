"""Opening text datasets by name: the embedded corpus, a `.txt` folder, any TFDS text dataset.

Every source reads through `builder.as_data_source(split)` (array_record files, random access,
no TensorFlow) and yields documents as lists of sentences. Local builders (`ln_jax_pydocs`,
`ln_jax_sitedocs`, `textdir:`) are prepared on first use; a named TFDS dataset must already be
prepared, or `download=True` lets TFDS prepare it, as array_record. When it is neither,
`DatasetNotPreparedError` says which dataset, where it looked and the command that prepares it;
a dataset prepared as TFRecord (what `tfds build` writes by default) is an error at open time
too, giving the command that converts it.

The data dir may be a URL (gs://...): it is handled with `etils.epath`, never `pathlib`. The
tokenizer is stored beside the prepared dataset even then, but the token-id and pair-index caches,
which are memory-mapped, go to a local folder of each host (`TextSource.cache_dir`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

from ln_jax import paths
from ln_jax.data import corpus, sitedocs
from ln_jax.data.config import TRANSLATION_PREFIXES
from ln_jax.validate import ConfigError, Fix, UserError, close_names, did_you_mean

TEXTDIR_PREFIX = "textdir:"
ARRAY_RECORD = "array_record"  # the random-access format ln_jax reads
_READ_CHUNK = 1024
# TFDS imports its dataset catalogue lazily, by category; text datasets live in these.
_TFDS_CATEGORIES = ("text", "summarization", "question_answering", "translate")
CACHE_DIR_ENV = "LN_JAX_CACHE_DIR"  # the per-host cache folder of URL data dirs
DEFAULT_CACHE_ROOT = "~/.cache/ln_jax"
# ln_jax's own corpora, prepared here from this installation
_FIELD = "--config.data.dataset"
LOCAL_DATASETS = (corpus.LnJaxPydocs.name, sitedocs.LnJaxSitedocs.name)


class DatasetNotPreparedError(UserError, FileNotFoundError):
    """A named dataset is neither prepared in the data dir nor obtainable from here."""


class UnknownDatasetError(DatasetNotPreparedError):
    """A dataset name that neither ln_jax nor this installation's TFDS knows (a misspelling):
    the message suggests the closest known names."""


class DatasetFormatError(UserError):
    """A dataset is prepared in a file format that cannot be read by random access (TFRecord)."""


@dataclasses.dataclass
class TextSource:
    """One prepared dataset, read as documents of sentences.

    Attributes:
      name: the name as given in the config (cache keys and messages use it).
      builder: the prepared TFDS builder.
      text_feature: feature holding the text.
      presplit: True when `text` already holds one sentence per line (ln_jax's own builders).
      cache_root: `DataConfig.cache_dir`: the per-host cache folder of a URL data dir (None =
        `local_cache_root`'s default).
    """

    name: str
    builder: tfds.core.DatasetBuilder
    text_feature: str = "text"
    presplit: bool = False
    cache_root: str | None = None

    @property
    def dataset_dir(self) -> epath.Path:
        """The prepared dataset's folder (a URL if the data dir is one); its tokenizer is
        stored there."""
        return epath.Path(self.builder.data_dir)

    @property
    def per_host_cache(self) -> bool:
        """True when `cache_dir` is a folder of this host only (the data dir is a URL): every
        process then builds its own caches instead of reading those of process 0."""
        return paths.is_url(self.builder.data_dir)

    @property
    def cache_dir(self) -> epath.Path:
        """Where the token ids and pair indexes are cached (always a local folder, since they
        are memory-mapped): beside the prepared data for a local data dir; for a URL data dir
        `local_cache_root(cache_root)/<md5 of the dataset folder's URL, 12 digits>`."""
        if not self.per_host_cache:
            return self.dataset_dir
        digest = hashlib.md5(os.fspath(self.builder.data_dir).encode()).hexdigest()[:12]
        return epath.Path(os.fspath(local_cache_root(self.cache_root) / digest))

    @property
    def key(self) -> str:
        """A file-name-safe identity: builder name, config and version."""
        b = self.builder
        config = f"-{b.builder_config.name}" if b.builder_config else ""
        return f"{b.name}{config}-{b.version}"

    def data_source(self, split: str) -> Sequence[dict[str, Any]]:
        """Random-access records of a split (TFDS slicing such as `train[:99%]` works)."""
        try:
            return self.builder.as_data_source(split=split)
        except (KeyError, ValueError) as e:
            known = ", ".join(self.builder.info.splits.keys())
            raise ValueError(
                f"dataset {self.name!r} has no split {split!r} (its splits: {known}); set "
                "--config.data.train_split and --config.data.eval_split, e.g. 'train[:99.5%]' "
                "and 'train[99.5%:]'."
            ) from e

    def num_documents(self, split: str) -> int:
        return len(self.data_source(split))

    def documents(self, split: str, max_documents: int | None = None) -> Iterator[list[str]]:
        """Yields each document of `split` as its list of sentences (in stored order).

        Args:
          split: TFDS split name or slice.
          max_documents: if set, at most this many documents, evenly strided over the split.
        """
        records = self.data_source(split)
        stride = 1
        if max_documents is not None and len(records) > max_documents:
            stride = -(-len(records) // max_documents)
        indices = list(range(0, len(records), stride))
        # Batched reads: one call per chunk is several times faster than one per record.
        read_many = getattr(records, "__getitems__", lambda idx: [records[i] for i in idx])
        for start in range(0, len(indices), _READ_CHUNK):
            for record in read_many(indices[start : start + _READ_CHUNK]):
                sentences = self._sentences(record)
                if sentences:
                    yield sentences

    def _sentences(self, record: dict[str, Any]) -> list[str]:
        if self.text_feature not in record:
            raise KeyError(
                f"dataset {self.name!r} has no feature {self.text_feature!r}; its features are "
                f"{sorted(record)}: set --config.data.text_feature."
            )
        text = record[self.text_feature]
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        if self.presplit:
            return [s for s in text.split("\n") if s]
        return corpus.split_sentences(text)


def local_cache_root(cache_dir: str | None = None) -> pathlib.Path:
    """The local folder of per-host caches: `cache_dir` (`DataConfig.cache_dir`), else
    $LN_JAX_CACHE_DIR, else ~/.cache/ln_jax.

    Raises:
      ConfigError: if the folder given is a URL (the caches are memory-mapped).
    """
    folder = cache_dir or os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_ROOT
    if paths.is_url(folder):
        what = "data.cache_dir" if cache_dir else f"${CACHE_DIR_ENV}"
        raise ConfigError(
            f"{what}={folder!r} is a URL; the token and pair-index caches are memory-mapped, so "
            "give a local folder."
        )
    return pathlib.Path(os.path.expanduser(folder))


def default_data_dir(data_dir: str | os.PathLike | None) -> str:
    """The data dir TFDS uses: the given one (a URL stays one), else $TFDS_DATA_DIR, else
    ~/tensorflow_datasets."""
    if data_dir:
        return os.fspath(paths.as_path(data_dir))
    return tfds.core.constants.get_default_data_dir()


def open_source(
    name: str,
    *,
    data_dir: str | None = None,
    text_feature: str = "text",
    download: bool = False,
    cache_dir: str | None = None,
) -> TextSource:
    """Opens one dataset by name, preparing local builders on first use.

    Args:
      name: `ln_jax_pydocs`, `ln_jax_sitedocs`, `textdir:/folder` or a TFDS
        `name[/config][:version]`.
      data_dir: TFDS data dir (None = TFDS default).
      text_feature: text feature of a TFDS dataset.
      download: let TFDS download and prepare a named dataset that is not prepared.
      cache_dir: per-host cache folder if `data_dir` is a URL (see `local_cache_root`).

    Raises:
      DatasetNotPreparedError: a named dataset is not prepared (and could not be prepared).
      DatasetFormatError: it is prepared as TFRecord (the message gives the conversion).
    """
    _reject_parallel(name)
    root = default_data_dir(data_dir)
    if name == corpus.LnJaxPydocs.name:
        builder, presplit = corpus.prepare(corpus.pydocs_builder(root)), True
    elif name == sitedocs.LnJaxSitedocs.name:  # this installation's config: see sitedocs.py
        builder, presplit = corpus.prepare(sitedocs.sitedocs_builder(root)), True
    elif name.startswith(TEXTDIR_PREFIX):
        folder = name[len(TEXTDIR_PREFIX) :]
        _check_textdir(folder)
        builder, presplit = corpus.prepare(corpus.textdir_builder(folder, root)), True
    else:
        builder, presplit = _prepared_tfds_builder(name, root, download), False
    feature = "text" if presplit else text_feature
    source = TextSource(name, builder, feature, presplit, cache_dir)
    check_random_access(name, source.builder)
    return source


def _reject_parallel(name: str) -> None:
    """Raises ConfigError for ln_jax's parallel-text names, which are no text corpora."""
    if name.startswith(TRANSLATION_PREFIXES):
        raise ConfigError(
            f"data.dataset={name!r} is parallel text for the translation task "
            "(`ln_jax.data.translation.batches`), not a text corpus; pretraining reads "
            "ln_jax_pydocs, ln_jax_sitedocs, textdir:FOLDER or a TFDS text dataset."
        )


def _prepared_tfds_builder(name: str, root: str, download: bool) -> tfds.core.DatasetBuilder:
    """The builder of TFDS dataset `name`, prepared (as array_record) if `download`.

    A dataset prepared earlier is checked by the caller; one prepared here is array_record, so
    nothing fails after hours of preparation.
    """
    builder = _tfds_builder(name, root)
    if is_prepared(builder):
        return builder
    if not download:
        raise DatasetNotPreparedError(not_prepared_message(name, root, builder))
    try:
        builder.download_and_prepare(file_format=ARRAY_RECORD)
    except Exception as e:  # network, apache-beam, manual download: all end the same way
        raise DatasetNotPreparedError(not_prepared_message(name, root, builder, e)) from e
    return builder


def is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
    """`builder.is_prepared()` without TFDS's warning about the version folder it looked in
    ("Variant folder ... has no dataset_info.json": of a dataset not prepared), which came on
    the terminal before the error that says so."""
    with corpus.tfds_output_to_log():
        return builder.is_prepared()


def check_random_access(name: str, builder: tfds.core.DatasetBuilder) -> None:
    """Raises DatasetFormatError, with the command that converts the dataset in place, if the
    prepared `builder` has no random-access file format (`as_data_source` would raise
    NotImplementedError). Reads only the prepared dataset's info: no data file is opened."""
    formats = builder.info.available_file_formats()
    random_access = set(tfds.core.FileFormat.with_random_access())
    if not formats or formats & random_access:
        return
    stored = ", ".join(sorted(f.value for f in formats))
    raise DatasetFormatError(
        f"dataset {name!r} is prepared in {builder.data_dir} as {stored}, which ln_jax cannot "
        f"read (it reads {ARRAY_RECORD} by random access, without TensorFlow). Convert it once, "
        "in place (the tfds command needs `pip install tensorflow`):\n"
        f"  tfds convert_format --dataset_version_dir={builder.data_dir} "
        f"--out_file_format={ARRAY_RECORD}\n"
        f"or prepare it again as {ARRAY_RECORD} under another data_dir:\n"
        f"  tfds build {name} --data_dir=NEW_DIR --file_format={ARRAY_RECORD}"
    )


def _tfds_builder(name: str, root: str) -> tfds.core.DatasetBuilder:
    """`tfds.builder` without any network access (no GCS look-up)."""
    try:
        return _builder_or_config_error(name, root)
    except tfds.core.registered.DatasetNotFoundError:
        pass
    for category in _TFDS_CATEGORIES:  # register the lazily imported catalogue, then retry
        try:
            importlib.import_module(f"tensorflow_datasets.{category}")
        except Exception:  # some categories need TensorFlow; text datasets do not
            continue
    try:
        return _builder_or_config_error(name, root)
    except tfds.core.registered.DatasetNotFoundError:
        raise unknown_dataset(name, root) from None


def known_datasets() -> list[str]:
    """Every dataset name `open_source` knows: ln_jax's own corpora, then the TFDS datasets
    this installation registers (their text categories imported)."""
    registered = tfds.list_builders(with_community_datasets=False)
    # ln_jax's own builders are named by their specs (textdir:FOLDER, the parallel names).
    return [*LOCAL_DATASETS, *(n for n in registered if not n.startswith("ln_jax"))]


def unknown_dataset(name: str, root: str) -> UnknownDatasetError:
    """The error of a dataset name nobody knows: the closest names that run here (ln_jax's
    own corpora, TFDS datasets prepared under `root`: a misspelling is the usual cause), as
    its fix; TFDS names close to it that are not prepared, which need preparing first; where
    it looked."""
    base = name.split("/")[0].split(":")[0]
    runnable = [*LOCAL_DATASETS, *prepared_datasets(root)]
    near = close_names(name, runnable) or close_names(base, runnable)
    unprepared = [n for n in close_names(base, known_datasets()) if n not in runnable]
    message = f"unknown data.dataset {name!r}" + (f"; {did_you_mean(near)}" if near else ".")
    message += (
        f" It is neither ln_jax's ({', '.join(LOCAL_DATASETS)}, {TEXTDIR_PREFIX}FOLDER) nor a "
        f"TFDS dataset this installation knows, nor prepared under data_dir={root!r} (looked "
        f"for {os.path.join(root, name)})."
    )
    if unprepared:
        listed = ", ".join(repr(n) for n in unprepared)
        message += (
            f" TFDS has {listed}, not prepared under that data_dir: prepare it first "
            "(docs/usage.md, or --config.data.download=True)."
        )
    return UnknownDatasetError(message, fix=Fix(set={_FIELD: near[0]}) if near else None)


def prepared_datasets(root: str) -> list[str]:
    """The TFDS datasets prepared as array_record under the local data dir `root`, as
    `name[/config]` (ln_jax's own builders left out); none for a URL."""
    if paths.is_url(root) or not os.path.isdir(root):
        return []
    found = set()
    infos = [*pathlib.Path(root).glob("*/*/dataset_info.json")]  # NAME/VERSION/
    infos += pathlib.Path(root).glob("*/*/*/dataset_info.json")  # NAME/CONFIG/VERSION/
    for info in infos:
        parts = info.relative_to(root).parts[:-2]  # without the version folder and the file
        if parts and not parts[0].startswith("ln_jax") and any(info.parent.glob("*.array_record*")):
            found.add("/".join(parts))
    return sorted(found)


def check_datasets(cfg: Any) -> None:
    """Checks, before anything is created or prepared, that every dataset of DataConfig `cfg`
    can be opened: a known name (ln_jax's corpora, a TFDS dataset), a `textdir:` folder that
    exists, a TFDS dataset prepared (or `cfg.download`). Parallel-text names are left to the
    translation task.

    Raises:
      UnknownDatasetError: a misspelt name (suggesting the closest known ones).
      DatasetNotPreparedError: a TFDS dataset not prepared (with the command that prepares it).
      ConfigError: a `textdir:` folder that does not exist.
    """
    root = default_data_dir(cfg.data_dir)
    single = len(cfg.sources) == 1
    for name, _ in cfg.sources:
        if name in LOCAL_DATASETS or name.startswith(TRANSLATION_PREFIXES):
            continue
        if name.startswith(TEXTDIR_PREFIX):
            _check_textdir(name[len(TEXTDIR_PREFIX) :])
            continue
        try:
            builder = _tfds_builder(name, root)
        except UnknownDatasetError as err:
            if not single:  # a mix: the fix of one entry is not the whole field's value
                err.fix = None
            raise
        if not is_prepared(builder) and not cfg.download:
            raise DatasetNotPreparedError(not_prepared_message(name, root, builder))


def _check_textdir(folder: str) -> None:
    """Raises ConfigError unless `folder` is a local folder holding .txt files."""
    if not paths.is_url(folder) and not os.path.isdir(os.path.expanduser(folder)):
        raise ConfigError(
            f"data.dataset='{TEXTDIR_PREFIX}{folder}': no such folder; give a folder of .txt "
            f"files (--config.data.dataset={TEXTDIR_PREFIX}/path/to/folder)."
        )
    try:
        corpus.textdir_config(folder)  # lists the files (no reading): a URL is refused here
    except FileNotFoundError:
        raise ConfigError(
            f"data.dataset='{TEXTDIR_PREFIX}{folder}': the folder holds no .txt files (one "
            "document per file, searched recursively); put the texts there or give another "
            "folder."
        ) from None


def _builder_or_config_error(name: str, root: str) -> tfds.core.DatasetBuilder:
    """`tfds.builder`; a dataset that exists without the named config or version is a
    DatasetNotPreparedError listing the ones it has."""
    try:
        return tfds.builder(name, data_dir=root, try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError:
        raise
    except ValueError as e:  # TFDS: "BuilderConfig x not found", "version x not found", ...
        base = name.split("/")[0].split(":")[0]
        known = _known_configs(base, root)
        raise DatasetNotPreparedError(
            f"dataset {name!r}: {str(e).splitlines()[0]}"
            + (f" Configs of {base!r}: {known}." if known else "")
            + " Fix data.dataset (name[/config][:version])."
        ) from None


def _known_configs(base: str, root: str) -> str:
    """A few of the builder configs of TFDS dataset `base` (empty if it has none)."""
    try:
        configs = tfds.builder_cls(base).BUILDER_CONFIGS
    except Exception:  # unknown name, or a builder that cannot be imported
        return ""
    names = [c.name for c in configs]
    return ", ".join(names[:8]) + (f" ... ({len(names)} in all)" if len(names) > 8 else "")


def _needs_beam(builder: tfds.core.DatasetBuilder) -> bool:
    try:
        return "apache_beam" in inspect.getsource(inspect.getmodule(type(builder)))
    except (OSError, TypeError):
        return False


def not_prepared_message(
    name: str,
    data_dir: str,
    builder: tfds.core.DatasetBuilder | None,
    cause: Exception | None = None,
) -> str:
    """The error text for a dataset that cannot be read: which, where, and how to prepare it."""
    if builder is None:
        head = (
            f"dataset {name!r} is neither a TFDS dataset this installation knows nor prepared "
            f"under data_dir={data_dir!r} (looked for {os.path.join(data_dir, name)})."
        )
    else:
        head = (
            f"dataset {name!r} is not prepared under data_dir={data_dir!r} "
            f"(looked in {builder.data_dir})."
        )
    cmd = (
        f"Prepare it once, as {ARRAY_RECORD} (what ln_jax reads), with:\n"
        f"  python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', "
        f"data_dir='{data_dir}').download_and_prepare(file_format='{ARRAY_RECORD}')\"\n"
        "or, where TensorFlow is installed (the tfds command needs it):\n"
        f"  tfds build {name} --data_dir={data_dir} --file_format={ARRAY_RECORD}"
    )
    notes = []
    if builder is not None and _needs_beam(builder):
        notes.append(
            "This dataset is generated with Apache Beam: `pip install apache-beam` first "
            "(and expect hours for Wikipedia; see https://www.tensorflow.org/datasets/beam_datasets)."
        )
    if cause is not None:
        notes.append(f"Preparing it here failed: {type(cause).__name__}: {cause}")
    else:
        notes.append("Or add --config.data.download=True to let TFDS try from this process.")
    return "\n".join([head, cmd, *notes])


def open_sources(cfg: Any) -> list[tuple[TextSource, float]]:
    """Opens every dataset of `cfg.dataset` (a DataConfig), with its normalised mix weight."""
    return [
        (
            open_source(
                name,
                data_dir=cfg.data_dir,
                text_feature=cfg.text_feature,
                download=cfg.download,
                cache_dir=cfg.cache_dir,
            ),
            weight,
        )
        for name, weight in cfg.sources
    ]
