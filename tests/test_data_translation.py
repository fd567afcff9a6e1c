"""Translation data: ln_jax_gettext from catalogues the tests write, paralleltext, the
synthetic source, token-budget buckets, exact resume, per-host shares, eval coverage, tokenizers.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (the suite's conftest sets it).
"""

from __future__ import annotations

import itertools
import struct

import jax
import numpy as np
import pytest

from ln_jax import sharding
from ln_jax.data.config import DataConfig
from ln_jax.data.translation import batches as translation
from ln_jax.data.translation import gettext, parallel
from ln_jax.data.translation import joint_tokenizer as tok_lib
from ln_jax.validate import ConfigError

# 18 words a language; word k of one translates word k of the other.
EN_WORDS = "open close read write the a red blue file folder disk user now later new old big small"
DE_WORDS = "öffne schließe lies schreib der die rote blaue datei ordner platte nutzer jetzt später "
EN, DE = EN_WORDS.split(" "), (DE_WORDS + "neue alte große kleine").split(" ")


def write_mo(path, messages: dict[str, str]) -> None:
    """A GNU .mo catalogue (little-endian, no hash table) of {msgid: msgstr}."""
    entries = sorted({"": "Content-Type: text/plain; charset=UTF-8\n", **messages}.items())
    n = len(entries)
    originals, translations = 28, 28 + 8 * n
    blob, tables = b"", [[], []]
    data_start = 28 + 16 * n
    for side in (0, 1):
        for entry in entries:
            raw = entry[side].encode()
            tables[side].append(struct.pack("<2I", len(raw), data_start + len(blob)))
            blob += raw + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, originals, translations, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + b"".join(tables[0]) + b"".join(tables[1]) + blob)


def sentence_pair(i: int, words: int = 4) -> tuple[str, str]:
    """(English, German) sentences: the digits of i in base 18 pick the words."""
    digits = [(i // 18**k) % 18 for k in range(words)]
    return " ".join(EN[d] for d in digits), " ".join(DE[d] for d in digits)


def write_catalogues(root, count: int, start: int = 0) -> None:
    """`count` clean pairs in a Debian-style .mo and a package-style .po (the latter with a
    fuzzy entry and a multi-line string)."""
    pairs = [sentence_pair(i) for i in range(start, start + count)]
    half = len(pairs) // 2
    write_mo(root / "de" / "LC_MESSAGES" / "app.mo", dict(pairs[:half]))
    lines = ['msgid ""', 'msgstr "Content-Type: text/plain; charset=UTF-8\\n"', ""]
    # A source with two targets: 100 German sentences also translate a longer English one.
    pairs += [(f"{en} later", de) for en, de in pairs[: min(100, count)]]
    for en, de in pairs[half:]:
        lines += [f'msgid "{en}"', 'msgstr ""', f'"{de}"', ""]
    lines += ["#, fuzzy", 'msgid "a fuzzy old entry here"', 'msgstr "ein unscharfer eintrag"']
    po = root / "site" / "pkg" / "locale" / "de" / "LC_MESSAGES" / "django.po"
    po.parent.mkdir(parents=True)
    po.write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture
def catalogues(tmp_path, monkeypatch):
    root = tmp_path / "locale"
    write_catalogues(root, 600)
    monkeypatch.setenv(gettext.SEARCH_PATH_ENV, str(root))
    monkeypatch.setattr(gettext, "MIN_PAIRS", 100)
    return root


def _all_pairs(source) -> dict[str, list[tuple[str, str]]]:
    return {split: sorted(source.pairs(split)) for split in parallel.SPLITS}


def test_gettext_same_pairs_twice_and_splits_disjoint_by_source(catalogues, tmp_path):
    first = parallel.gettext_source("ln_jax_gettext/de-en", str(tmp_path / "a"))
    second = parallel.gettext_source("ln_jax_gettext/de-en", str(tmp_path / "b"))
    pairs = _all_pairs(first)
    assert pairs == _all_pairs(second) and first.key == second.key
    assert sum(map(len, pairs.values())) == 700  # the fuzzy entry is left out
    sources = {split: {s for s, _ in p} for split, p in pairs.items()}
    for a, b in itertools.combinations(parallel.SPLITS, 2):
        assert not sources[a] & sources[b]
    assert min(len(p) for p in pairs.values()) > 0
    every = pairs["train"] + pairs["validation"] + pairs["test"]
    assert tuple(reversed(sentence_pair(5))) in every  # (German source, English target)


def test_gettext_filters_and_strips():
    messages = [
        gettext.Message("Open the %s file now", "Öffne die Datei %s jetzt"),
        gettext.Message("Open {name} file now", "Öffne {name} Datei jetzt"),
        gettext.Message("Open the <b>red</b> file", "Öffne die <b>rote</b> Datei"),
        gettext.Message("Tom &amp; Jerry are here", "Tom &amp; Jerry sind hier"),
        gettext.Message("Set the LC_ALL variable now", "Setze die LC_ALL Variable jetzt"),
        gettext.Message("the red file now", "die rote Datei jetzt", fuzzy=True),
        gettext.Message("same words in both", "same words in both"),
        gettext.Message("Open", "Öffnen"),
        gettext.Message("_Open the  red\nfile", "Die rote Datei _öffnen"),
        gettext.Message("&Save the red file", "Die rote Datei &speichern"),
    ]
    cleaned = [gettext.clean_pair(m) for m in messages]
    reasons = [why for _, why in cleaned]
    assert reasons == ["placeholder", "placeholder", "markup", "markup", "identifier", "fuzzy",
                       "identical", "length", "", ""]  # fmt: skip
    assert cleaned[8][0] == ("Die rote Datei öffnen", "Open the red file")
    assert cleaned[9][0] == ("Die rote Datei speichern", "Save the red file")


def test_mo_and_po_readers_plurals_contexts_fuzzy(tmp_path):
    write_mo(tmp_path / "x.mo", {"menu\x04one red file\x00many red files": "eine\x00viele"})
    assert gettext.read_catalogue(str(tmp_path / "x.mo")) == [
        gettext.Message("", "Content-Type: text/plain; charset=UTF-8\n"),
        gettext.Message("one red file", "eine"),
    ]
    po = (
        '#, fuzzy\nmsgid "a"\nmsgstr "b"\n\nmsgctxt "c"\nmsgid "one "\n"file"\n'
        'msgid_plural "files"\nmsgstr[0] "eine \\"Datei\\""\nmsgstr[1] "Dateien"\n'
        '#~ msgid "old"\n#~ msgstr "alt"\n'
    )
    assert gettext.read_po(po) == [
        gettext.Message("a", "b", fuzzy=True),
        gettext.Message("one file", 'eine "Datei"'),
    ]


def test_gettext_floor_is_a_one_line_error(tmp_path, monkeypatch):
    write_catalogues(tmp_path / "few", 20)
    monkeypatch.setenv(gettext.SEARCH_PATH_ENV, str(tmp_path / "few"))
    with pytest.raises(gettext.CatalogueError) as e:
        parallel.gettext_source("ln_jax_gettext/de-en", str(tmp_path / "data"))
    message = str(e.value)
    assert "\n" not in message and "40 clean pairs" in message
    assert "apt-get install" in message and "pip install django" in message


def test_gettext_config_name_follows_the_catalogues(catalogues):
    before = gettext.gettext_config("de-en")
    assert before.name.startswith("de-en-") and len(before.catalogues) == 2
    assert gettext.gettext_config("de-en").name == before.name
    write_mo(catalogues / "de" / "LC_MESSAGES" / "app.mo", dict([sentence_pair(9999)]))
    assert gettext.gettext_config("de-en").name != before.name
    assert gettext.gettext_config("fr-en").catalogues == ()
    with pytest.raises(ConfigError, match="did you mean .ln_jax_gettext/de-en."):
        gettext.gettext_config("de-eng")


# --------------------------------------------------------------------------- other sources


def _write_paralleltext(prefix, counts=(300, 20, 20)):
    for split, n in zip(("train", "valid", "test"), counts, strict=True):
        pairs = [sentence_pair(i + 1000 * len(split), words=3 + i % 5) for i in range(n)]
        prefix.with_name(f"{prefix.name}.{split}.src").write_text(
            "".join(de + "\n" for _, de in pairs), encoding="utf-8"
        )
        prefix.with_name(f"{prefix.name}.{split}.tgt").write_text(
            "".join(en + "\n" for en, _ in pairs), encoding="utf-8"
        )


def test_paralleltext_round_trip_and_errors(tmp_path):
    prefix = tmp_path / "iwslt"
    _write_paralleltext(prefix)
    cfg = DataConfig(dataset=f"paralleltext:{prefix}", cache_dir=str(tmp_path / "cache"))
    source = parallel.open_parallel(cfg)
    assert len(source.pairs("train")) == 300 and len(source.pairs("validation")) == 20
    assert source.pairs("test")[1] == tuple(reversed(sentence_pair(4001, words=4)))
    (tmp_path / "iwslt.valid.tgt").write_text("one line\n")
    with pytest.raises(parallel.ParallelDataError, match="has 20 lines but .* has 1") as e:
        parallel.open_parallel(cfg).pairs("validation")
    assert "\n" not in str(e.value)
    (tmp_path / "iwslt.test.src").unlink()
    with pytest.raises(parallel.ParallelDataError, match="iwslt.test.src does not exist"):
        parallel.open_parallel(cfg)


# Every character str.splitlines() ends a line at (Python's documentation lists them).
SPLITLINES_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_the_line_breaks_listed_are_all_those_splitlines_knows():
    found = {c for c in map(chr, range(0x3000)) if len(f"a{c}b".splitlines()) == 2}
    assert found == set(SPLITLINES_BREAKS)
    assert set(SPLITLINES_BREAKS[2:]) == set(parallel.OTHER_LINE_BREAKS)  # but "\n" and "\r"


@pytest.mark.parametrize("breaker", list(SPLITLINES_BREAKS[1:]), ids=lambda c: f"U+{ord(c):04X}")
def test_paralleltext_lines_end_at_newline_only_so_pairs_stay_aligned(tmp_path, breaker):
    """A line break of str.splitlines() inside a sentence (one in each file, at other lines)
    made the two files' counts agree with each other but not with `wc -l`, and shifted the
    pairs between them: here it is text, and every pair is the pair it was."""
    pairs = [(f"quelle {i}", f"source {i}") for i in range(30)]
    pairs[7] = (f"quelle{breaker}7", "source 7")
    pairs[19] = ("quelle 19", f"source{breaker}19")
    prefix = tmp_path / "c"
    for split in ("train", "valid", "test"):
        for side, suffix in ((0, "src"), (1, "tgt")):
            lines = "".join(p[side] + "\r\n" * (split == "valid") + "\n" * (split != "valid")
                            for p in pairs)  # fmt: skip
            (tmp_path / f"c.{split}.{suffix}").write_bytes(lines.encode())
    source = parallel.open_parallel(DataConfig(dataset=f"paralleltext:{prefix}"))
    assert source.pairs("train") == pairs
    assert source.pairs("validation") == pairs  # CRLF: the "\r" of each line end goes


def test_paralleltext_errors_are_one_line_naming_the_file_and_line(tmp_path):
    prefix = tmp_path / "c"
    _write_paralleltext(prefix, counts=(30, 5, 5))
    cfg = DataConfig(dataset=f"paralleltext:{prefix}")
    # Other counts: both files and counts, and the line with a character other tools split at.
    src = tmp_path / "c.valid.src"
    lines = src.read_text().splitlines()
    src.write_text("\n".join([*lines[:2], lines[2] + "\u2028" + lines[3], *lines[4:]]) + "\n")
    with pytest.raises(parallel.ParallelDataError) as err:
        parallel.check_paralleltext(cfg)
    assert f"{src} has 4 lines but {tmp_path / 'c.valid.tgt'} has 5" in str(err.value)
    assert f"{src} line 3 holds U+2028, which other tools split lines at" in str(err.value)
    # Not UTF-8: the file, the line and how to convert it.
    src.write_bytes(b"eins\nzwei\n" + "drei für\n".encode("latin-1") + b"vier\nfunf\n")
    with pytest.raises(parallel.ParallelDataError) as err:
        parallel.check_paralleltext(cfg)
    assert str(err.value).startswith(f"{src}, line 3: not UTF-8 (byte 0xfc, byte 7 of the line)")
    assert "iconv" in str(err.value)
    # Empty training files: before sentencepiece sees them.
    for suffix in ("src", "tgt"):
        (tmp_path / f"c.train.{suffix}").write_text("")
    with pytest.raises(parallel.ParallelDataError, match="c.train.tgt hold no lines"):
        parallel.check_paralleltext(cfg)
    # A byte-order mark is no part of the first sentence; no final newline ends one all the same.
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfeins\r\nzwei")
    assert parallel.read_lines(str(tmp_path / "bom.txt")) == ["eins", "zwei"]


def test_a_po_string_holding_a_line_separator_is_one_string():
    po = 'msgid "open the\u2028file"\nmsgstr "die\x0cDatei\u0085offnen"\n'
    assert gettext.read_po(po) == [gettext.Message("open the\u2028file", "die\x0cDatei\x85offnen")]


def test_unknown_names_and_unprepared_wmt(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'synthetic:copy'"):
        parallel.open_parallel(DataConfig(dataset="synthetic:cpy"))
    with pytest.raises(ConfigError, match="did you mean 'wmt14_translate/de-en'"):
        parallel.open_parallel(DataConfig(dataset="wmt14_translate/de-em"))
    from ln_jax.data.sources import DatasetNotPreparedError, open_source

    with pytest.raises(ConfigError, match="parallel text for the translation task"):
        open_source("synthetic:copy")  # not a pretraining corpus

    cfg = DataConfig(dataset="wmt14_translate/de-en", data_dir=str(tmp_path))
    with pytest.raises(DatasetNotPreparedError, match="tfds build wmt14_translate/de-en") as e:
        parallel.open_parallel(cfg)
    assert "TensorFlow" in str(e.value)


# --------------------------------------------------------------------------- tokenizers


def test_joint_sentencepiece_ids_and_round_trip(tmp_path):
    prefix = tmp_path / "corpus"
    _write_paralleltext(prefix)
    cfg = DataConfig(dataset=f"paralleltext:{prefix}", cache_dir=str(tmp_path / "c"), vocab_size=60)
    source = parallel.open_parallel(cfg)
    tok = tok_lib.translation_tokenizer(cfg, source, None)
    assert [tok.sp.id_to_piece(i) for i in range(4)] == list(tok_lib.SPECIAL_PIECES)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3) == (
        tok.sp.pad_id(), tok.sp.unk_id(), tok.sp.bos_id(), tok.sp.eos_id()
    )  # fmt: skip
    for text in ("öffne die rote datei jetzt", "open the blue folder later"):
        ids = tok.encode(text)
        assert min(ids) >= 4 and tok.decode(ids) == text
        assert tok.decode([2, *ids, 3, *ids, 0]) == text  # stops at EOS, drops BOS/PAD
    assert tok_lib.translation_tokenizer(cfg, source, None).fingerprint == tok.fingerprint


def test_symbol_tokenizer():
    tok = tok_lib.SymbolTokenizer(8)
    assert tok.vocab_size == 12 and tok.encode("w0 w7 w9") == [4, 11, 1]
    assert tok.decode([2, 4, 11, 3, 5]) == "w0 w7" and tok.decode([0, 5, 0]) == "w1"


# --------------------------------------------------------------------------- batches

MAX_TOKENS, MAX_SRC, MAX_TGT = 320, 10, 12


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(2, 2, 2)


def _cfg(**kw) -> DataConfig:
    return DataConfig(**{"dataset": "synthetic:reverse", **kw})


def _pipeline(mesh, split="train", seed=3, cfg=None):
    return translation.make_translation_pipeline(
        cfg or _cfg(), split=split, seed=seed, mesh=mesh, max_tokens=MAX_TOKENS,
        max_source_length=MAX_SRC, max_target_length=MAX_TGT,
    )  # fmt: skip


def _np(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


def test_batches_fit_the_budget_in_static_buckets(mesh):
    it, tok = _pipeline(mesh)
    plan = it.host.batches.plan
    assert plan.buckets.lengths == (MAX_TGT,) or plan.buckets.lengths[-1] == MAX_TGT
    shapes = {plan.buckets.shape(j) for j in range(len(plan.buckets.lengths))}
    for _ in range(6):
        batch = next(it)
        b, s = batch["src"].shape
        t = batch["tgt_in"].shape[1]
        assert (b, s, t) in shapes and b % 8 == 0 and b * max(s, t) <= MAX_TOKENS
        assert batch["src"].sharding == sharding.batch_sharding(mesh)
        host = _np(batch)
        real = host["tgt_mask"].sum(1) > 0
        src_len = host["src_mask"].sum(1)
        assert (host["src"][np.arange(b), src_len - 1] == tok_lib.EOS_ID).all()
        tgt_len = (host["tgt_out"] != 0).sum(1)
        assert (host["tgt_out"][np.arange(b), tgt_len - 1] == tok_lib.EOS_ID).all()
        assert (host["tgt_in"][:, 0] == tok_lib.BOS_ID).all()
        np.testing.assert_array_equal(host["tgt_in"][:, 1:], np.where(
            host["tgt_out"][:, :-1] == tok_lib.EOS_ID, 0, host["tgt_out"][:, :-1]))  # fmt: skip
        for row in np.flatnonzero(real):  # reverse task: target = reversed source
            words = tok.decode(host["src"][row]).split()
            assert tok.decode(host["tgt_out"][row]).split() == words[::-1]
    it.close()


def test_an_epoch_serves_every_fitting_pair_once(mesh):
    it, _ = _pipeline(mesh)
    plan, encoded = it.host.batches.plan, it.host.batches.encoded
    src_len, tgt_len = encoded.lengths()
    fits = (src_len <= MAX_SRC) & (tgt_len <= MAX_TGT)
    assert plan.dropped == int((~fits).sum()) > 0
    for epoch in (0, 1):
        served = np.concatenate(
            [rows[rows >= 0] for _, rows in plan.epoch(epoch)]
        )  # fmt: skip
        np.testing.assert_array_equal(np.sort(served), np.flatnonzero(fits))
    assert [r[:4].tolist() for _, r in plan.epoch(0)[:3]] != [
        r[:4].tolist() for _, r in plan.epoch(1)[:3]
    ]
    it.close()


def test_resume_is_exact(mesh):
    first, _ = _pipeline(mesh)
    for _ in range(3):
        next(first)
    state = first.get_state()
    expected = [_np(next(first)) for _ in range(3)]
    fresh, _ = _pipeline(mesh)
    fresh.set_state(state)
    for want in expected:
        got = _np(next(fresh))
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    other_seed, _ = _pipeline(mesh, seed=4)
    with pytest.raises(ValueError, match="different data pipeline"):
        other_seed.set_state(state)
    for it in (first, fresh, other_seed):
        it.close()


def test_host_shares_partition_the_global_batch():
    kw = dict(split="train", seed=1, max_tokens=MAX_TOKENS, max_source_length=MAX_SRC,
              max_target_length=MAX_TGT)  # fmt: skip
    whole, _ = translation.make_host_translation_pipeline(_cfg(), multiple=2, **kw)
    shares = [
        translation.make_host_translation_pipeline(
            _cfg(), multiple=2, process_index=p, process_count=2, **kw
        )[0]
        for p in (0, 1)
    ]
    for _ in range(4):
        full = next(whole)
        parts = [next(s) for s in shares]
        for k in full:
            np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), full[k])


def test_eval_batches_cover_each_pair_once(mesh):
    ev, tok = _pipeline(mesh, split="eval")
    n = len(ev.pairs)
    assert n == parallel.SYNTHETIC_SIZES["validation"] and len(ev.references) == n
    seen = []
    for _ in range(2):  # re-iterable, the same batches
        indices = []
        for batch in ev:
            host = _np(batch)
            real = host["index"] >= 0
            assert ((host["tgt_mask"].sum(1) > 0) == real).all()
            for row in np.flatnonzero(real):
                source = ev.sources[host["index"][row]].split()
                assert tok.decode(host["src"][row]).split() == source[: MAX_SRC - 1]
            indices.extend(host["index"][real].tolist())
        seen.append(indices)
    assert seen[0] == seen[1] and sorted(seen[0]) == list(range(n))
    assert ev.num_truncated > 0
    head = ev.head(50)
    assert head.pairs == ev.pairs[:50]
    assert sorted(i for b in head for i in np.asarray(b["index"]).tolist() if i >= 0) == list(
        range(50)
    )


def test_gettext_through_the_entry_point(catalogues, tmp_path, mesh):
    cfg = DataConfig(
        dataset="ln_jax_gettext/de-en", data_dir=str(tmp_path / "d"), vocab_size=48,
    )  # fmt: skip
    lengths = dict(max_tokens=256, max_source_length=16, max_target_length=16)
    ev, tok = translation.make_translation_pipeline(cfg, split="eval", seed=0, mesh=mesh, **lengths)
    assert tok.vocab_size == 48 and ev.pairs
    indices = sorted(i for b in ev for i in np.asarray(b["index"]).tolist() if i >= 0)
    assert indices == list(range(len(ev.pairs)))
    assert all(tok.decode(tok.encode(s)) == s for s, _ in ev.pairs)
    train, _ = translation.make_translation_pipeline(
        cfg, split="train", seed=0, mesh=mesh, **lengths
    )
    assert next(train)["src"].shape[0] % jax.device_count() == 0
    train.close()


def test_making_a_local_corpus_builder_warns_nothing_on_the_terminal(tmp_path, caplog):
    """TFDS logs "Using custom data configuration" (absl, WARNING) when a builder with a
    custom config is made: ln_jax's local corpora demote it to INFO (train.log only)."""
    import logging

    from ln_jax.data import sitedocs

    with caplog.at_level(logging.INFO, logger="absl"):
        gettext.gettext_builder("de-en", str(tmp_path))
        sitedocs.sitedocs_builder(str(tmp_path))
    custom = [r for r in caplog.records if "custom data configuration" in r.getMessage()]
    assert len(custom) == 2  # both builders were made with their custom config ...
    assert all(r.levelno == logging.INFO for r in custom)  # ... and said so at INFO
