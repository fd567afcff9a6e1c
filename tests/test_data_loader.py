"""Loader: sharded global batches, per-host shares, determinism, exact resume, eval, config."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from ln_jax import sharding
from ln_jax.data import DataConfig, host_iterator, parse_dataset
from ln_jax.data.bert import examples as pt
from ln_jax.data.bert import pairs as pairs_lib
from ln_jax.data.bert import pipeline as loader
from ln_jax.data.bert.options import PretrainingOptions
from ln_jax.data.stream import HostBatches

pytest_plugins = ("tests.data_fixtures",)  # fixtures: data_dir, make_config, text_maker

FIELDS = {
    "input_ids": (np.int32, 128),
    "segment_ids": (np.int32, 128),
    "attention_mask": (np.int32, 128),
    "masked_positions": (np.int32, 20),
    "masked_ids": (np.int32, 20),
    "masked_weights": (np.float32, 20),
    "nsp_label": (np.int32, None),
}


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(2, 2, 2)


def test_global_batches_are_sharded_and_equal_host_batches(make_config, mesh):
    cfg = make_config(global_batch_size=8)
    it, tok = loader.make_pipeline(cfg, split="train", seed=0, mesh=mesh)
    host, _ = loader.make_host_pipeline(cfg, split="train", seed=0)
    assert tok.vocab_size == 8000
    for batch, ref in zip(_take(it, 2), _take(host, 2), strict=True):
        assert batch.keys() == FIELDS.keys()
        for key, (dtype, width) in FIELDS.items():
            arr = batch[key]
            assert arr.shape == ((8, width) if width else (8,)) and arr.dtype == dtype
            assert arr.sharding == sharding.batch_sharding(mesh)
            assert len(arr.addressable_shards) == 8
            np.testing.assert_array_equal(np.asarray(arr), ref[key])


def test_same_seed_same_batches_other_seed_other_batches(make_config):
    cfg = make_config()
    first = _take(loader.make_host_pipeline(cfg, seed=3)[0], 3)
    _assert_same(first, _take(loader.make_host_pipeline(cfg, seed=3)[0], 3))
    other = _take(loader.make_host_pipeline(cfg, seed=4)[0], 1)[0]
    assert not np.array_equal(other["input_ids"], first[0]["input_ids"])


def _original_ids(batch):
    ids = batch["input_ids"].copy()
    rows, cols = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, cols]] = batch["masked_ids"][rows, cols]
    return ids


def test_next_epoch_reshuffles_and_remasks(train_corpus, tokenizer):
    # A small corpus (40 documents): two epochs are two batches.
    small = pt.TokenizedCorpus(
        train_corpus.tokens,
        train_corpus.sent_starts,
        train_corpus.doc_starts[:41],
    )
    spec = pt.masking_spec(tokenizer, PretrainingOptions())
    examples = pt.PretrainingExamples(small, spec, seed=0)
    n = len(examples)
    stream = loader.example_stream([(examples, 1.0)], seed=0)
    epochs = [stream.batch(np.arange(e * n, (e + 1) * n)) for e in range(2)]
    # An example's identity: its token ids before masking.
    keys = [[row.tobytes() for row in _original_ids(ep)] for ep in epochs]
    assert sorted(keys[0]) == sorted(keys[1]) and len(set(keys[0])) == n  # the same examples...
    assert keys[0] != keys[1]  # ...in another order
    masks = [
        dict(zip(ks, ep["masked_positions"], strict=True))
        for ks, ep in zip(keys, epochs, strict=True)
    ]
    changed = np.mean([not np.array_equal(masks[0][k], masks[1][k]) for k in masks[0]])
    assert changed > 0.9  # ...with new masks


@pytest.mark.parametrize("threads", [0, 1])
def test_iterator_state_restores_exactly(make_config, threads):
    cfg = make_config()
    it, _ = loader.make_host_pipeline(cfg, seed=0, threads=threads)
    _take(it, 3)
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
    expected = _take(it, 4)
    fresh, _ = loader.make_host_pipeline(cfg, seed=0, threads=threads)
    fresh.set_state(state)
    _assert_same(_take(fresh, 4), expected)


def test_global_iterator_state_restores_exactly(make_config, mesh):
    cfg = make_config()
    it, _ = loader.make_pipeline(cfg, seed=1, mesh=mesh)
    _take(it, 2)
    state = it.get_state()
    expected = _take(it, 3)
    fresh, _ = loader.make_pipeline(cfg, seed=1, mesh=mesh)
    fresh.set_state(state)
    _assert_same(_take(fresh, 3), expected)
    other, _ = loader.make_pipeline(cfg, seed=2, mesh=mesh)
    with pytest.raises(ValueError, match="different data pipeline"):
        other.set_state(state)


def test_workers_give_the_same_batches_and_resume_exactly(make_config):
    cfg = make_config()
    expected = _take(loader.make_host_pipeline(cfg, seed=2, workers=0)[0], 6)
    two, _ = loader.make_host_pipeline(cfg, seed=2, workers=2)
    try:
        _assert_same(_take(two, 3), expected[:3])
        state = json.loads(json.dumps(two.get_state()))  # mid-epoch: 24 of ~6,300 examples
        processes = _worker_processes(two, 2)
    finally:
        two.close()
    _assert_stopped_not_killed(processes)
    one, _ = loader.make_host_pipeline(cfg, seed=2, workers=1)
    try:
        one.set_state(state)  # saved with 2 workers, resumed with 1
        _assert_same(_take(one, 3), expected[3:])
        processes = _worker_processes(one, 1)
    finally:
        one.close()
    _assert_stopped_not_killed(processes)


def _worker_processes(it, count):
    """The grain worker processes of a HostBatchIterator, once their queues are full (the state
    in which a close used to wait 25 s for a worker that could not finish sending a chunk)."""
    workers = host_iterator.grain_workers(it._it)
    assert len(workers) == count  # the grain internals `host_iterator.draining` reads
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(w._buffer.full() for w in workers):
        time.sleep(0.05)
    return [w._prefetch_process for w in workers]


def _assert_stopped_not_killed(processes):
    # grain kills (SIGKILL, exit code -9) a worker that has not exited 25 s after its close.
    assert [p.exitcode for p in processes] == [0] * len(processes)


def test_a_dead_worker_is_an_error_naming_it_and_the_examples(make_config):
    batches = loader.make_host_pipeline(make_config(), seed=0, workers=0)[0].batches
    # Memory-mapped token ids and pair indexes travel to the workers as their paths.
    assert len(pickle.dumps(batches)) < 50_000

    class Dying(HostBatches):  # defined here, so pickled by value into the workers
        def __call__(self, step, count=1):
            if step // count % 2:  # worker 1's chunks (worker 0 builds chunks 0, 2, ...)
                os._exit(3)
            return super().__call__(step, count)

    dying = host_iterator.HostBatchIterator(Dying(batches.stream, 8, batches.rows), {}, workers=2)
    first = host_iterator._chunk_size(8)  # batches in worker 0's chunk
    try:
        message = (
            r"^data worker 1 of 2 \(pid \d+\) died with exit code 3 before delivering global "
            rf"batches {first}\.\.{2 * first - 1} \(stream positions from {8 * first}; the first "
            r"example is "
            r"example \d+ of dataset 0, epoch 0\): .*exit code 3"
        )
        with pytest.raises(host_iterator.DataWorkerError, match=message):
            _take(dying, first + 1)  # the death may surface at any batch up to there
    finally:
        dying.close()


def test_a_worker_reaped_before_the_watch_saw_it_is_still_named(tmp_path):
    """On a loaded machine grain may reap the dead worker before the watch thread polls: the
    awaited worker is named with the exit code or signal grain reports."""
    (tmp_path / "worker-1").write_text("4242")
    watch = host_iterator._WorkerWatch(str(tmp_path))  # not started: it saw nothing
    grain_error = RuntimeError("Worker process was terminated unexpectedly with exit code 3.")
    assert watch.inferred(1, grain_error) == {1: (4242, "exit code 3")}
    killed = RuntimeError("terminated unexpectedly with exit code -9")
    assert watch.inferred(1, killed) == {1: (4242, "signal 9")}
    assert watch.inferred(0, grain_error) == {}  # no pid file for worker 0
    assert watch.inferred(1, RuntimeError("something else")) == {}


_KILLED_TRAINER = """
import json, os, signal, sys, time
from ln_jax.data.bert import pipeline as loader
from tests.data_fixtures import test_config

it, _ = loader.make_host_pipeline(test_config(sys.argv[1]), seed=0, workers=2)
next(it)
deadline = time.monotonic() + 120  # on a loaded machine worker 1 may start well after 0
while len(os.listdir(it._pids)) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
pids = [int(open(os.path.join(it._pids, f)).read()) for f in sorted(os.listdir(it._pids))]
open(sys.argv[2], "w").write(json.dumps(pids))
os.kill(os.getpid(), signal.SIGKILL)  # no close: the workers are never asked to stop
"""


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_workers_exit_when_the_trainer_is_killed(data_dir, tmp_path):
    """A trainer killed outright (SIGKILL, the OOM killer) leaves no data worker behind."""
    out = tmp_path / "pids.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = os.environ | {"PYTHONPATH": root}
    cmd = [sys.executable, "-c", _KILLED_TRAINER, data_dir, str(out)]
    # Its stderr in a file: the killed process's children (its multiprocessing resource
    # tracker: "leaked semaphore objects") write to it after it died.
    with open(tmp_path / "stderr.txt", "w") as err:
        done = subprocess.run(
            cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=300
        )
    assert done.returncode == -9, (tmp_path / "stderr.txt").read_text()[-3000:]
    pids = json.loads(out.read_text())
    assert len(pids) == 2
    deadline = time.monotonic() + 20  # each polls its parent once a second
    while time.monotonic() < deadline and any(map(_running, pids)):
        time.sleep(0.1)
    alive = [pid for pid in pids if _running(pid)]
    for pid in alive:
        os.kill(pid, 9)  # leave nothing running, whatever the outcome
    assert not alive, f"data workers {alive} outlived their killed trainer"


def test_device_prefetch_keeps_the_state_of_the_next_batch(make_config, mesh):
    assert loader.device_prefetch(make_config(), mesh) == 0  # CPU devices: nothing to gain
    ahead, _ = loader.make_pipeline(make_config(device_prefetch=2), seed=1, mesh=mesh)
    plain, _ = loader.make_pipeline(make_config(device_prefetch=0), seed=1, mesh=mesh)
    _assert_same(_take(ahead, 2), _take(plain, 2))
    assert ahead.host.get_state()["next_batch"] == 4  # batches 2 and 3 are on the devices
    state = ahead.get_state()
    assert state == plain.get_state() and state["next_batch"] == 2
    expected = _take(ahead, 3)
    fresh, _ = loader.make_pipeline(make_config(device_prefetch=2), seed=1, mesh=mesh)
    fresh.set_state(state)
    _assert_same(_take(fresh, 3), expected)


def test_pair_index_is_built_once_then_loaded(make_config, tokenizer, train_corpus, tmp_path,
                                              monkeypatch):  # fmt: skip
    source = types.SimpleNamespace(cache_dir=tmp_path)  # the cache goes beside the token ids
    for examples in (PretrainingOptions(), PretrainingOptions(nsp=False)):
        meta = loader.pair_index_meta(make_config(), examples, "train", tokenizer, seed=3)
        built = loader.pair_index(source, train_corpus, meta)
        fresh = pairs_lib.build_pair_index(
            train_corpus, max_seq_length=128, short_seq_prob=0.1, nsp=examples.nsp, seed=3
        )
        assert built.equals(fresh) and isinstance(built.a_start, np.memmap)
        # A waiting process (or a later start) loads it, memory-mapped.
        loaded = loader.pair_index(source, train_corpus, meta, builder=False, timeout_s=0)
        assert loaded.equals(fresh) and len(pickle.dumps(loaded)) < 1000
    assert len(list(tmp_path.glob("pairs-*"))) == 2
    # A process other than 0 waits for process 0's file ...
    monkeypatch.setattr(loader, "_POLL_S", 0.02)
    meta = loader.pair_index_meta(make_config(), PretrainingOptions(), "train", tokenizer, seed=4)
    folder = loader.pair_index_folder(source, meta)
    writer = threading.Timer(0.2, pairs_lib.save_pair_index, (fresh, folder, meta))
    writer.start()
    assert loader.pair_index(source, train_corpus, meta, builder=False, timeout_s=30).equals(fresh)
    # ... and stops with a clear error when it does not come.
    shutil.rmtree(folder)
    with pytest.raises(loader.CacheWaitError, match=rf"waited 0 s for the pair index {folder}"):
        loader.pair_index(source, train_corpus, meta, builder=False, timeout_s=0.05)


def test_per_host_shares_assemble_the_global_batch(make_config):
    cfg = make_config(global_batch_size=8)
    whole = _take(loader.make_host_pipeline(cfg, seed=5)[0], 2)
    shares = [
        _take(loader.make_host_pipeline(cfg, seed=5, process_index=p, process_count=2)[0], 2)
        for p in range(2)
    ]
    for step in range(2):
        for key in whole[step]:
            assert shares[0][step][key].shape[0] == 4
            joined = np.concatenate([shares[0][step][key], shares[1][step][key]])
            np.testing.assert_array_equal(joined, whole[step][key])
    # A state saved on two processes resumes on one: the step count is global.
    two, _ = loader.make_host_pipeline(cfg, seed=5, process_index=1, process_count=2)
    _take(two, 1)
    one, _ = loader.make_host_pipeline(cfg, seed=5)
    one.set_state(two.get_state())
    _assert_same([next(one)], [whole[1]])


def test_host_rows():
    assert loader.host_rows(16, 0, 1) == slice(0, 16)
    assert [loader.host_rows(12, p, 3) for p in range(3)] == [
        slice(0, 4),
        slice(4, 8),
        slice(8, 12),
    ]
    with pytest.raises(ValueError, match="global_batch_size=10 .* process count 4"):
        loader.host_rows(10, 0, 4)


def test_batch_size_must_divide(make_config, mesh):
    assert sharding.batch_divisor(mesh) == 4
    with pytest.raises(ValueError, match=r"global_batch_size=6 .*batch_divisor.* = 4"):
        loader.make_pipeline(make_config(global_batch_size=6), seed=0, mesh=mesh)
    with pytest.raises(ValueError, match=r"global_batch_size=8 .*process count = 3"):
        loader.check_global_batch(8, 4, 3)
    assert loader.mesh_rows(mesh, 8) == (0, 1)  # one process holds every row


def test_eval_batches_are_fixed_and_finite(make_config, mesh):
    cfg = make_config(eval_batch_size=8)
    evals, _ = loader.make_pipeline(cfg, split="eval", seed=0, mesh=mesh)
    first, second = list(evals), list(evals)
    assert len(first) == len(evals) >= 1
    _assert_same(first, second)
    assert first[0]["input_ids"].sharding == sharding.batch_sharding(mesh)
    five, _ = loader.make_host_pipeline(cfg, split="eval", seed=0, num_batches=5)
    batches = list(five)
    assert len(batches) == 5
    _assert_same(batches[:1], [{k: np.asarray(v) for k, v in first[0].items()}])


def test_mixture_of_datasets(make_config, tmp_path, text_maker):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(6):
        (folder / f"story{i}.txt").write_text(text_maker(i, 40))
    spec = f"ln_jax_pydocs:0.5,textdir:{folder}:0.5"
    cfg = make_config(dataset=spec, tokenizer_type="bpe", vocab_size=1000)
    it, tok = loader.make_host_pipeline(cfg, seed=0)
    assert tok.path.parent.parent.name == "ln_jax_mixes"  # one tokenizer for the mix
    batches = _take(it, 4)
    _assert_same(batches, _take(loader.make_host_pipeline(cfg, seed=0)[0], 4))
    texts = [tok.decode(row) for b in batches for row in _original_ids(b)]
    story = [("gardener" in t or "lantern" in t or "harbour" in t) for t in texts]
    assert 0.2 < np.mean(story) < 0.8  # both datasets appear, about half each


def test_the_examples_options_reach_the_batches(make_config):
    """The pipeline makes its examples as `examples` says: P masked positions, packed full
    sentences without NSP, and a saved state restores only into the same options."""
    cfg = make_config(global_batch_size=4)
    packed = PretrainingOptions(max_predictions_per_seq=5, nsp=False)
    it, _ = loader.make_host_pipeline(cfg, examples=packed, seed=0, threads=0)
    batch = next(it)
    assert batch["masked_positions"].shape == (4, 5) and not batch["nsp_label"].any()
    assert not batch["segment_ids"].any()  # one segment: packed sentences
    default, _ = loader.make_host_pipeline(cfg, seed=0, threads=0)
    first = next(default)
    assert first["masked_positions"].shape == (4, 20) and first["segment_ids"].any()
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        default.set_state(it.get_state())


def test_data_config():
    cfg, examples = DataConfig(), PretrainingOptions()
    assert (cfg.dataset, cfg.vocab_size, cfg.max_seq_length, examples.nsp) == (
        "ln_jax_pydocs",
        8000,
        128,
        True,
    )
    with pytest.raises(ValueError, match="Did you mean 'vocab_size'"):
        DataConfig.from_mapping({"vocab_sise": 100})
    assert DataConfig.from_mapping({"max_seq_length": 512}).max_seq_length == 512
    with pytest.raises(TypeError, match="max_seq_length must be int"):
        DataConfig(max_seq_length="128")
    with pytest.raises(ValueError, match="tokenizer_type"):
        DataConfig(tokenizer_type="wordpiece")
    # BERT's example fields are its section "bert", named so in their errors.
    with pytest.raises(ValueError, match=r"bert.masked_lm_prob=1.5 must be in \[0, 1\]: set "
                       r"--config.bert.masked_lm_prob"):  # fmt: skip
        PretrainingOptions(masked_lm_prob=1.5)
    with pytest.raises(TypeError, match="bert.nsp must be bool"):
        PretrainingOptions(nsp="yes")
    with pytest.raises(ValueError, match="bert.max_predictions_per_seq=0 must be >= 1"):
        PretrainingOptions(max_predictions_per_seq=0)
    assert parse_dataset("wikipedia/20230601.en:0.9,bookcorpus:0.1") == (
        ("wikipedia/20230601.en", 0.9),
        ("bookcorpus", 0.1),
    )
    assert parse_dataset("wikipedia/20230601.en:1.0.0") == (("wikipedia/20230601.en:1.0.0", 1.0),)
    assert parse_dataset("textdir:/data/books") == (("textdir:/data/books", 1.0),)
    mix = DataConfig(dataset=[["a", 3], ["b", 1]])
    assert mix.dataset == (("a", 3), ("b", 1)) and mix.sources == (("a", 0.75), ("b", 0.25))
    with pytest.raises(ValueError, match="weight > 0"):
        parse_dataset("a:0")
