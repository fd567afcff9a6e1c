"""Text corpora as TFDS datasets that are generated locally: no download, no TensorFlow.

Two builders live here:

* `LnJaxPydocs` (`ln_jax_pydocs`): English prose that every CPython installation carries, the
  standard library's docstrings (read with `ast`, never imported) and the help topics of
  `pydoc_data.topics`. About 2 MB of text, generated from the running interpreter; nothing of it
  is stored in this repository.
* `LnJaxTextdir` (`ln_jax_textdir`): a user's folder of `.txt` files, one document per file.

Both store one example per document, `{"doc_id": str, "text": str}`, where `text` holds one
sentence per line. Documents go to the `train` or `validation` split by a stable hash of their
key, 1 document in 200 to validation (the 199:1 split of Xiong et al., 2020). The prepared files
are array_record, readable with `tfds.data_source` / `builder.as_data_source()`.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import logging
import os
import pathlib
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterator

import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.utils import py_utils

from ln_jax.validate import ConfigError

# Documents per validation document: 1 in VALIDATION_MODULUS goes to validation.
VALIDATION_MODULUS = 200
# Documents shorter than this carry too little context for sentence pairs.
MIN_DOC_SENTENCES = 2
MIN_DOC_WORDS = 20

# Standard-library folders that hold tests, demos, vendored code or non-prose tables.
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "turtledemo",
        "__pycache__",
        "ensurepip",
        "encodings",
        "pydoc_data",
        "__phello__",
    }
)

# Tokens ending in "." that rarely end a sentence; a split after them is undone.
_ABBREVIATIONS = frozenset(
    {"e.g.", "i.e.", "cf.", "vs.", "etc.)", "viz.", "mr.", "mrs.", "dr.", "st.", "no.", "approx."}
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_NOT_LETTER = re.compile(r"[^A-Za-z ]")
_DOCTEST_PROMPT = re.compile(r"^\s*(>>>|\.\.\.)( |$)")


# --------------------------------------------------------------------------------------------
# Text cleaning and sentence splitting
# --------------------------------------------------------------------------------------------


def _drop_doctests(lines: list[str]) -> list[str]:
    """Removes interactive examples: `>>>` lines, continuations and their printed output."""
    kept, in_example = [], False
    for line in lines:
        if _DOCTEST_PROMPT.match(line):
            in_example = True
        elif not line.strip():
            in_example = False
        if not in_example:
            kept.append(line)
    return kept


def _is_prose(paragraph: str) -> bool:
    # Code, tables and signatures are mostly punctuation and digits; prose is mostly letters.
    other = len(_NOT_LETTER.findall(paragraph))
    return other <= 0.2 * len(paragraph) and paragraph.count(" ") >= 2


def paragraphs(text: str) -> list[str]:
    """Splits text at blank lines into whitespace-normalised prose paragraphs."""
    blocks, current = [], []
    for line in [*_drop_doctests(text.splitlines()), ""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            blocks.append(" ".join(" ".join(current).split()))
            current = []
    return [b for b in blocks if _is_prose(b)]


def split_sentences(text: str) -> list[str]:
    """Splits English text into sentences (rule-based: `.`, `!`, `?` before a capital).

    Args:
      text: raw text; blank lines separate paragraphs, single newlines are spaces.

    Returns:
      The sentences in order, whitespace-normalised, none empty.
    """
    sentences: list[str] = []
    for para in paragraphs(text):
        pieces = _SENTENCE_BREAK.split(para)
        merged = [pieces[0]]
        for piece in pieces[1:]:
            last_word = merged[-1].rsplit(" ", 1)[-1].lower()
            if last_word in _ABBREVIATIONS or re.fullmatch(r"[a-z]\.", last_word):
                merged[-1] = f"{merged[-1]} {piece}"
            else:
                merged.append(piece)
        sentences.extend(s for s in merged if s)
    return sentences


def is_validation(key: str, modulus: int = VALIDATION_MODULUS) -> bool:
    """Deterministic document split: md5 of the key, 1 in `modulus` -> validation."""
    digest = hashlib.md5(key.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % modulus == 0


def validation_keys(keys: list[str]) -> set[str]:
    """The keys `is_validation` picks; for small collections at least one (lowest hash).

    A folder of a few files would otherwise often get an empty validation split.
    """
    held_out = {k for k in keys if is_validation(k)}
    if not held_out and len(keys) >= 2:
        held_out = {min(keys, key=lambda k: hashlib.md5(k.encode("utf-8")).hexdigest())}
    return held_out


def _keep_document(sentences: list[str]) -> bool:
    words = sum(len(s.split()) for s in sentences)
    return len(sentences) >= MIN_DOC_SENTENCES and words >= MIN_DOC_WORDS


# --------------------------------------------------------------------------------------------
# The embedded CPython documentation corpus
# --------------------------------------------------------------------------------------------


def stdlib_files(root: str | os.PathLike | None = None) -> list[pathlib.Path]:
    """The standard library's `.py` files, sorted, without tests, demos and vendored code."""
    base = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(base):
        # Prune while walking: site-packages alone can hold far more files than the stdlib.
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        files.extend(pathlib.Path(folder, n) for n in names if n.endswith(".py"))
    return sorted(files)


def _docstrings(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Yields (qualified name, docstring) of a module and its classes and functions."""
    doc = ast.get_docstring(tree, clean=True) if hasattr(tree, "body") else None
    if doc:
        yield prefix or "<module>", doc
    # Only module, class and function bodies hold docstrings: no need for a full ast.walk.
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}" if prefix else node.name
            yield from _docstrings(node, name)


def stdlib_documents(root: str | os.PathLike | None = None) -> Iterator[tuple[str, list[str]]]:
    """Yields (key, sentences) for each substantial docstring of the standard library."""
    base = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    for path in stdlib_files(base):
        yield from module_documents(path, f"stdlib/{path.relative_to(base).as_posix()}")


def module_documents(path: pathlib.Path, key: str) -> Iterator[tuple[str, list[str]]]:
    """Yields (`key::qualified name`, sentences) for each substantial docstring of a `.py` file.

    The file is parsed with `ast`, never imported; files that do not parse are skipped.
    """
    try:
        with warnings.catch_warnings():  # old files' invalid escapes warn at parse time
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_bytes(), filename=key)
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, OSError):
        return  # a few files target other Python versions; they are not needed
    for name, doc in _docstrings(tree):
        sentences = split_sentences(doc)
        if _keep_document(sentences):
            yield f"{key}::{name}", sentences


def topic_documents() -> Iterator[tuple[str, list[str]]]:
    """Yields (key, sentences) for each help topic of `pydoc_data.topics`."""
    from pydoc_data import topics  # the text of `help('TOPIC')`, part of every CPython

    for name in sorted(topics.topics):
        sentences = split_sentences(topics.topics[name])
        if _keep_document(sentences):
            yield f"topics/{name}", sentences


class _LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the local builders: array_record files, nothing to download."""

    def __init__(self, **kwargs):
        kwargs.setdefault("file_format", "array_record")  # readable without TensorFlow
        super().__init__(**kwargs)

    # TFDS locates a checksums file next to the builder's code by asking importlib for the top
    # package's resources; for a namespace package (no ln_jax/__init__.py) that needs the
    # `importlib_resources` backport. Point it at this file directly: there are no checksums.
    @py_utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)


def _text_features() -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
        {"doc_id": tfds.features.Text(), "text": tfds.features.Text()}
    )


class LnJaxPydocs(_LocalBuilder):
    """CPython's own documentation (stdlib docstrings + pydoc topics) as a sentence corpus."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Docstrings and pydoc topics of the running interpreter."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Standard-library docstrings and pydoc_data.topics of CPython "
                f"{sys.version.split()[0]}; one sentence per line of `text`."
            ),
            features=_text_features(),
            homepage="https://docs.python.org/3/",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local
        docs = list(_all_pydocs())  # parse the stdlib once for both splits
        return {
            "train": self._generate_examples(docs, False),
            "validation": self._generate_examples(docs, True),
        }

    def _generate_examples(self, docs: list[tuple[str, list[str]]], validation: bool):
        for key, sentences in docs:
            if is_validation(key) == validation:
                yield key, {"doc_id": key, "text": "\n".join(sentences)}


def _all_pydocs() -> Iterator[tuple[str, list[str]]]:
    yield from stdlib_documents()
    yield from topic_documents()


# --------------------------------------------------------------------------------------------
# A user's folder of .txt files
# --------------------------------------------------------------------------------------------


def textdir_files(folder: str | os.PathLike) -> list[pathlib.Path]:
    """The `.txt` files under `folder` (recursively), sorted."""
    return sorted(p for p in pathlib.Path(folder).rglob("*.txt") if p.is_file())


def textdir_config(folder: str | os.PathLike) -> tfds.core.BuilderConfig:
    """A builder config named by a hash of the folder's path and file list (names, sizes, times).

    Changing, adding or removing a file gives a new name, so stale prepared data is never reused.
    """
    if "://" in os.fspath(folder):  # pathlib would turn gs://b/x into gs:/b/x
        raise ConfigError(
            f"textdir:{folder}: a folder of .txt files must be local; copy it first (e.g. "
            "`gcloud storage cp -r gs://BUCKET/texts .`), then give textdir:./texts."
        )
    folder = pathlib.Path(folder).expanduser().resolve()
    files = textdir_files(folder)
    if not files:
        raise FileNotFoundError(f"textdir: no .txt files found under {folder}")
    h = hashlib.md5(str(folder).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(folder)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return tfds.core.BuilderConfig(name=f"d{h.hexdigest()[:12]}", description=str(folder))


class LnJaxTextdir(_LocalBuilder):
    """A folder of `.txt` files (one document per file); build with `textdir_builder(path)`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "One document per .txt file, rule-based sentence splits."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"Text files under {self.builder_config.description}",
            features=_text_features(),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {
            "train": self._generate_examples(False),
            "validation": self._generate_examples(True),
        }

    def _generate_examples(self, validation: bool):
        folder = pathlib.Path(self.builder_config.description)
        files = {p.relative_to(folder).as_posix(): p for p in textdir_files(folder)}
        held_out = validation_keys(list(files))
        for key, path in files.items():
            if (key in held_out) != validation:
                continue
            sentences = split_sentences(path.read_text(encoding="utf-8", errors="replace"))
            if sentences:
                yield key, {"doc_id": key, "text": "\n".join(sentences)}


def textdir_builder(folder: str | os.PathLike, data_dir: str | None = None) -> LnJaxTextdir:
    """The (not necessarily prepared) builder for a folder of `.txt` files."""
    return LnJaxTextdir(data_dir=data_dir, config=textdir_config(folder))


def pydocs_builder(data_dir: str | None = None) -> LnJaxPydocs:
    """The (not necessarily prepared) builder of the embedded CPython-docs corpus."""
    return LnJaxPydocs(data_dir=data_dir)


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
    """Generates a local builder's data once; later calls find it prepared and return at once.

    Nothing is downloaded, so TFDS's own output (its "Downloading and preparing dataset
    Unknown size" and "prepared" lines, progress bars, and the warning about the empty
    version folder it has just made) goes to the log file instead; one line says what is
    being prepared, and where.
    """
    with tfds_output_to_log():  # is_prepared warns about the version folder it looks at
        if builder.is_prepared():
            return builder
        _log.info("preparing %s in %s (generated locally, once)", builder.name, builder.data_dir)
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False)
        )
    return builder


_log = logging.getLogger(__name__)
_tfds_log = logging.getLogger("tensorflow_datasets")  # another library: the log file only


class _LineLogger(io.TextIOBase):
    """A text stream whose lines go to `_tfds_log` at INFO (what TFDS prints)."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                _tfds_log.info("%s", line.strip())
        return len(text)


class _DemoteWarnings(logging.Filter):
    """Lowers TFDS's WARNING records to INFO (the log file, not the terminal)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


@contextlib.contextmanager
def tfds_output_to_log() -> Iterator[None]:
    """While a local corpus is made or generated: TFDS's printed lines to the log, its
    progress bars off, and its warnings (absl's logger, e.g. "Using custom data
    configuration") demoted to INFO."""
    from tensorflow_datasets.core.utils import tqdm_utils

    bars = tqdm_utils._active
    absl_logger, demote = logging.getLogger("absl"), _DemoteWarnings()
    tqdm_utils.display_progress_bar(False)
    absl_logger.addFilter(demote)
    try:
        with contextlib.redirect_stdout(_LineLogger()):
            yield
    finally:
        absl_logger.removeFilter(demote)
        tqdm_utils.display_progress_bar(bars)
