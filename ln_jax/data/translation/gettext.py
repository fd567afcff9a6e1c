"""`ln_jax_gettext`: a parallel corpus from the gettext catalogues installed on this machine.

Software ships human translations of its messages as gettext catalogues: the Debian packages'
`/usr/share/locale/<lang>/LC_MESSAGES/*.mo` and Python packages' `locale/<lang>/LC_MESSAGES/
*.mo|*.po` folders in site-packages. This builder reads them with the standard library (nothing
is downloaded) into sentence pairs, configs `de-en` and `fr-en`:

* direction: source = the German/French translation (msgstr), target = the English original
  (msgid): De->En, the direction of the papers' IWSLT14 experiments;
* kept: translated, non-fuzzy entries whose msgstr differs from the msgid; plural entries give
  their first form; message contexts are dropped;
* filtered out (the pair is dropped, never rewritten): printf/format placeholders (`%s`,
  `%(x)s`, `%1$s`, `{}`, `{name}`, `$VAR`), markup (`<b>`, `&amp;`), identifiers with `_`;
* stripped: keyboard accelerators at a word start (`_File`, `&File` -> `File`); whitespace is
  collapsed to single spaces;
* 3-40 words a side; exact duplicate pairs kept once;
* split by a hash of the source sentence, so no source is in two splits: `validation` and
  `test` each get max(1%, 300 pairs' worth) of the sources (at most 10%), the rest `train`.

What the corpus holds depends on what is installed, so the builder config's name is the pair
plus a hash of every catalogue's path and content (`de-en-<md5 prefix>`), and the metadata
(`builder.info.metadata`) lists the catalogues (path, bytes, md5, pairs each gave) and the
pairs each filter dropped. Fewer than `MIN_PAIRS` clean pairs is a one-line error naming what
to install. The catalogues are GPL/LGPL/BSD-licensed: nothing of them is stored in ln_jax.

Where to look: `$LN_JAX_GETTEXT_PATH` (os.pathsep-separated folders) replaces the default
folders (`/usr/share/locale` and the interpreter's site-packages); each folder is searched for
`<lang>/LC_MESSAGES/` and `**/locale/<lang>/LC_MESSAGES/` (also `<lang>_<REGION>`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
import struct
import sysconfig
from collections.abc import Iterable, Iterator, Sequence

import tensorflow_datasets as tfds

from ln_jax.data import corpus
from ln_jax.validate import UserError, check_choice

NAME = "ln_jax_gettext"
PAIRS = {"de-en": "de", "fr-en": "fr"}
LANGUAGE_NAMES = {"de": "German", "fr": "French"}
SEARCH_PATH_ENV = "LN_JAX_GETTEXT_PATH"
DEFAULT_LOCALE_DIR = "/usr/share/locale"
MIN_PAIRS = 2_000
MIN_WORDS, MAX_WORDS = 3, 40
HELD_OUT_FRACTION = 0.01  # validation and test each
MIN_HELD_OUT = 300  # ... but at least this many pairs' worth each (at most 10%)
MAX_HELD_OUT_FRACTION = 0.1
_MO_MAGIC = 0x950412DE

_PLACEHOLDER = re.compile(r"%\S|\{[^{}]*\}|\$\{?\w")
_MARKUP = re.compile(r"<[^<>]*>|&#?\w+;")
_ACCELERATOR = re.compile(r"(?<![\w&])[_&](?=\w)")
_LEFTOVER = re.compile(r"_|&\w")


@dataclasses.dataclass(frozen=True)
class Message:
    """One catalogue entry: the English msgid, its translation (first plural form), fuzzy."""

    msgid: str
    msgstr: str
    fuzzy: bool = False


class CatalogueError(UserError):
    """Too few clean pairs in the installed catalogues (the message says what to install)."""


# --------------------------------------------------------------------------------------------
# Reading .mo and .po files
# --------------------------------------------------------------------------------------------


def _charset(header: str) -> str:
    found = re.search(r"charset=([\w.-]+)", header)
    return found.group(1) if found and found.group(1).upper() != "CHARSET" else "utf-8"


def read_mo(data: bytes) -> list[Message]:
    """Entries of a compiled catalogue (the GNU .mo format; compiled catalogues hold no fuzzy
    entries). Returns [] for a file that is not a .mo catalogue."""
    if len(data) < 20:
        return []
    for order in ("<", ">"):
        magic, _, count, originals, translations = struct.unpack(order + "5I", data[:20])
        if magic == _MO_MAGIC:
            break
    else:
        return []
    raw = []
    for n in range(count):
        entries = []
        for table in (originals, translations):
            length, offset = struct.unpack(order + "2I", data[table + 8 * n : table + 8 * n + 8])
            entries.append(data[offset : offset + length])
        raw.append(entries)
    header = next((s for i, s in raw if i == b""), b"").decode("ascii", "replace")
    charset = _charset(header)
    messages = []
    for msgid, msgstr in raw:
        try:
            text = msgid.decode(charset), msgstr.decode(charset)
        except (UnicodeDecodeError, LookupError):
            continue
        messages.append(_message(text[0], text[1].split("\x00")[0]))
    return messages


def _message(msgid: str, msgstr: str, fuzzy: bool = False) -> Message:
    """Drops a context (`ctx\\x04msgid`) and a plural msgid (`one\\x00many`)."""
    msgid = msgid.split("\x04", 1)[-1].split("\x00")[0]
    return Message(msgid, msgstr, fuzzy)


_PO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "", "b": "", "f": ""}


def _po_string(line: str) -> str:
    body = line[line.index('"') + 1 : line.rindex('"')]
    return re.sub(r"\\(.)", lambda m: _PO_ESCAPES.get(m.group(1), m.group(1)), body)


def read_po(text: str) -> list[Message]:
    """Entries of a source catalogue (.po): msgctxt, msgid(_plural), msgstr / msgstr[0], the
    `#, fuzzy` flag; obsolete `#~` entries are skipped."""
    messages, fields, fuzzy, current = [], {}, False, None

    def flush():
        if "msgid" in fields:
            messages.append(_message(fields["msgid"], fields.get("msgstr", ""), fuzzy))

    # Lines end at "\n" only: a U+2028 (or form feed, ...) inside a quoted string is text, where
    # str.splitlines() would cut the string in two.
    for line in [*text.split("\n"), ""]:
        line = line.strip()
        if not line or line.startswith("#~"):
            continue
        if line.startswith("#"):
            if line.startswith("#,") and "fuzzy" in line:
                flush()
                fields, fuzzy, current = {}, True, None
            continue
        keyword = line.split(None, 1)[0]
        if keyword in ("msgctxt", "msgid") and "msgstr" in fields:
            flush()
            fields, fuzzy = {}, False
        if line.startswith('"') and current:
            fields[current] += _po_string(line)
        elif keyword in ("msgctxt", "msgid", "msgid_plural", "msgstr", "msgstr[0]"):
            current = "msgstr" if keyword == "msgstr[0]" else keyword
            fields[current] = _po_string(line)
        else:
            current = None  # msgstr[1], ...: later plural forms are not used
    flush()
    return messages


def read_catalogue(path: str) -> list[Message]:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".po"):
        return read_po(data.decode("utf-8", "replace"))
    return read_mo(data)


# --------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------


def clean_text(text: str) -> tuple[str | None, str]:
    """(cleaned text, "") or (None, the filter that rejected it)."""
    if _PLACEHOLDER.search(text):
        return None, "placeholder"
    if _MARKUP.search(text):
        return None, "markup"
    text = _ACCELERATOR.sub("", text)
    if _LEFTOVER.search(text):
        return None, "identifier"
    text = " ".join(text.split())
    if not MIN_WORDS <= len(text.split()) <= MAX_WORDS:
        return None, "length"
    return text, ""


def clean_pair(message: Message) -> tuple[tuple[str, str] | None, str]:
    """((source, target), "") for a usable entry, else (None, why it was dropped)."""
    if message.fuzzy:
        return None, "fuzzy"
    if not message.msgid or not message.msgstr:
        return None, "untranslated"
    if message.msgstr == message.msgid:
        return None, "identical"
    target, why = clean_text(message.msgid)
    source, why_source = clean_text(message.msgstr) if target else (None, why)
    if source is None or target is None:
        return None, why or why_source
    if source == target:
        return None, "identical"
    return (source, target), ""


# --------------------------------------------------------------------------------------------
# Finding the catalogues
# --------------------------------------------------------------------------------------------


def search_roots() -> tuple[str, ...]:
    """`$LN_JAX_GETTEXT_PATH`'s folders if set, else /usr/share/locale and site-packages."""
    env = os.environ.get(SEARCH_PATH_ENV)
    if env is not None:
        roots = [p for p in env.split(os.pathsep) if p]
    else:
        paths = sysconfig.get_paths()
        roots = [DEFAULT_LOCALE_DIR, paths["purelib"], paths["platlib"]]
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots if os.path.isdir(r)))


def _language_folder(name: str, lang: str) -> bool:
    return name == lang or (name.startswith(lang + "_") and name[len(lang) + 1 :].isupper())


def find_catalogues(lang: str, roots: Sequence[str]) -> list[str]:
    """The catalogues of language `lang` under `roots`, sorted: `<lang>/LC_MESSAGES/*.mo|.po`
    at any depth; a .po beside a .mo of the same name is left out (the .mo is its build)."""
    found = set()
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            parent = os.path.basename(os.path.dirname(folder))
            if os.path.basename(folder) != "LC_MESSAGES" or not _language_folder(parent, lang):
                continue
            for name in files:
                stem, ext = os.path.splitext(name)
                if ext == ".mo" or (ext == ".po" and stem + ".mo" not in files):
                    found.add(os.path.join(folder, name))
    return sorted(found)


def _md5(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


# --------------------------------------------------------------------------------------------
# The TFDS builder
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class GettextConfig(tfds.core.BuilderConfig):
    """A language pair and the catalogues it is built from.

    Attributes:
      pair: "de-en" or "fr-en".
      catalogues: ((path, bytes, md5), ...) sorted by path.
      min_pairs: fewer clean pairs is a `CatalogueError`.
    """

    pair: str = "de-en"
    catalogues: tuple[tuple[str, int, str], ...] = dataclasses.field(default=(), repr=False)
    min_pairs: int = MIN_PAIRS


def gettext_config(
    pair: str, roots: Sequence[str] | None = None, min_pairs: int | None = None
) -> GettextConfig:
    """The config of `pair` from the catalogues under `roots` (None = `search_roots()`); its
    name hashes every catalogue's path and content. `min_pairs` None = `MIN_PAIRS`."""
    check_choice(
        "language pair",
        f"{NAME}/{pair}",
        [f"{NAME}/{p}" for p in PAIRS],
        config_field="data.dataset",
    )
    roots = search_roots() if roots is None else tuple(roots)
    files = find_catalogues(PAIRS[pair], roots)
    catalogues = tuple((p, os.path.getsize(p), _md5(p)) for p in files)
    digest = hashlib.md5("\n".join(f"{p}|{n}|{h}" for p, n, h in catalogues).encode())
    return GettextConfig(
        name=f"{pair}-{digest.hexdigest()[:10]}",
        description=f"{pair}: {len(files)} catalogues under {', '.join(roots)}",
        pair=pair,
        catalogues=catalogues,
        min_pairs=MIN_PAIRS if min_pairs is None else min_pairs,
    )


def collect_pairs(
    catalogues: Iterable[str],
) -> tuple[list[tuple[str, str]], dict[str, int], dict[str, int]]:
    """(unique clean pairs in catalogue order, {catalogue: pairs it added}, {filter: drops})."""
    seen, pairs = set(), []
    per_file: dict[str, int] = {}
    dropped: collections.Counter = collections.Counter()
    for path in catalogues:
        before = len(pairs)
        for message in read_catalogue(path):
            if not message.msgid:
                continue  # the header entry
            pair, why = clean_pair(message)
            if pair is None:
                dropped[why] += 1
            elif pair in seen:
                dropped["duplicate"] += 1
            else:
                seen.add(pair)
                pairs.append(pair)
        per_file[path] = len(pairs) - before
    return pairs, per_file, dict(sorted(dropped.items()))


def held_out_fraction(num_pairs: int) -> float:
    """Fraction of the sources each of validation and test gets."""
    wanted = max(HELD_OUT_FRACTION, MIN_HELD_OUT / max(num_pairs, 1))
    return min(MAX_HELD_OUT_FRACTION, wanted)


def split_of(source: str, fraction: float) -> str:
    """ "validation", "test" or "train", by the md5 of the source sentence."""
    u = int(hashlib.md5(source.encode("utf-8")).hexdigest()[:12], 16) / 16**12
    return "validation" if u < fraction else "test" if u < 2 * fraction else "train"


def _too_few_message(config: GettextConfig, count: int) -> str:
    lang = PAIRS[config.pair]
    return (
        f"{NAME}/{config.pair}: the {len(config.catalogues)} {LANGUAGE_NAMES[lang]} gettext "
        f"catalogues found under {SEARCH_PATH_ENV} or /usr/share/locale and site-packages give "
        f"{count} clean pairs, under the {config.min_pairs} needed. Install translated software "
        f"(e.g. `apt-get install git gnupg coreutils postgresql-client` without a dpkg "
        f"path-exclude of /usr/share/locale, or `pip install django`), or use another "
        "data.dataset (paralleltext:PREFIX, wmt14_translate/de-en, synthetic:copy)."
    )


class LnJaxGettext(corpus._LocalBuilder):
    """Sentence pairs of the installed gettext catalogues (see the module docstring); build it
    with `gettext_builder(pair)`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "msgstr -> msgid pairs of installed .mo/.po catalogues."}

    def _info(self) -> tfds.core.DatasetInfo:
        config = self.builder_config
        pair = getattr(config, "pair", "de-en")
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                f"{LANGUAGE_NAMES[PAIRS[pair]]} -> English sentence pairs (source = msgstr, "
                f"target = msgid) of installed gettext catalogues; {config.description}."
            ),
            features=tfds.features.FeaturesDict(
                {"source": tfds.features.Text(), "target": tfds.features.Text()}
            ),
            supervised_keys=("source", "target"),
            metadata=tfds.core.MetadataDict(pair=pair, direction=f"{PAIRS[pair]}->en"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local
        config = self.builder_config
        pairs, per_file, dropped = collect_pairs(p for p, _, _ in config.catalogues)
        if len(pairs) < config.min_pairs:
            raise CatalogueError(_too_few_message(config, len(pairs)))
        fraction = held_out_fraction(len(pairs))
        splits: dict[str, list[tuple[str, str]]] = {"train": [], "validation": [], "test": []}
        for pair in pairs:
            splits[split_of(pair[0], fraction)].append(pair)
        self.info.metadata.update(
            catalogues=[
                {"path": p, "bytes": n, "md5": h, "pairs": per_file[p]}
                for p, n, h in config.catalogues
            ],
            dropped=dropped,
            held_out_fraction=fraction,
            sizes={name: len(split) for name, split in splits.items()},
        )
        return {name: self._generate_examples(split) for name, split in splits.items()}

    def _generate_examples(self, pairs: list[tuple[str, str]]) -> Iterator:
        for source, target in pairs:
            key = hashlib.md5(f"{source}\t{target}".encode()).hexdigest()
            yield key, {"source": source, "target": target}


def gettext_builder(
    pair: str, data_dir: str | None = None, config: GettextConfig | None = None
) -> LnJaxGettext:
    """The (not necessarily prepared) builder of `pair` from this machine's catalogues."""
    config = config or gettext_config(pair)
    with corpus.tfds_output_to_log():  # TFDS warns of a custom config: train.log, not the terminal
        return LnJaxGettext(data_dir=data_dir, config=config)
