"""Throughput of the pretraining-data pipeline at seq 128, next to what a train step consumes.

Run:  python bench/speed/bench_data.py [--data_dir DIR] [--seconds 3] [--step_seconds 0.3 0.5 1.0]
      (pin one core for steadier numbers: taskset -c 0 python bench/speed/bench_data.py)

It prepares the embedded corpus and the tokenizer if needed (timed), then reads batches from
the host pipeline (numpy) and from the device pipeline (global jax.Arrays on a one-device mesh)
and prints examples/s and batches/s. A train step of S seconds at batch B consumes B/S
examples/s: the loader is not the bottleneck while its rate is well above that.

Comparisons (issue 17), each alternating its arms in one run (ABAB) and reporting medians and
ratios, with the machine's load before and after:

  taskset -c 0 python bench/speed/bench_data.py --compare_old=REV   # batched loader vs the
      per-example loader of git revision REV (extracted with `git archive`), in-process, one
      core, batch 256
  python bench/speed/bench_data.py --workers 0 1 2  # grain worker processes
  python bench/speed/bench_data.py --transport 2        # 2 workers' chunks: pipe vs shared memory
  python bench/speed/bench_data.py --closes 20          # seconds per close of a 2-worker pipeline
  python bench/speed/bench_data.py --pairs [--pairs_scale=20] [--compare_old=REV]   # pair index:
      first start (build + save) vs second start (memory-map the cache) [vs REV's build]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ln_jax import sharding  # noqa: E402
from ln_jax.data import DataConfig, sources, tokenizer  # noqa: E402
from ln_jax.data.bert import examples as pretraining  # noqa: E402
from ln_jax.data.bert import pairs  # noqa: E402
from ln_jax.data.bert import pipeline as loader  # noqa: E402
from ln_jax.data.bert.options import PretrainingOptions  # noqa: E402


@dataclasses.dataclass
class Row:
    name: str
    batch: int
    examples_per_s: float
    batches_per_s: float


def _rate(it, batch: int, seconds: float, block=None) -> tuple[float, float]:
    """Batches/s of an iterator over at least `seconds` (after two warm-up batches)."""
    for _ in range(2):
        b = next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 3:
        b = next(it)
        if block:
            block(b)
        n += 1
    per_s = n / (time.perf_counter() - start)
    return per_s * batch, per_s


def _timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"{label:<44s} {time.perf_counter() - start:7.2f} s", flush=True)
    return out


def prepare(cfg: DataConfig) -> None:
    """Times the one-off steps: corpus generation, tokenizer training, token ids, pairs."""
    opened = _timed(
        "prepare corpus (cached after the first run)",
        lambda: sources.open_sources(cfg),
    )
    tok = _timed("tokenizer (trained once, then cached)", lambda: tokenizer.get_tokenizer(cfg))
    print(f"  {tok.path}")
    docs = sum(s.num_documents(cfg.train_split) for s, _ in opened)
    comps, _ = _timed(
        "pipeline construction (token ids + pairs)", lambda: loader.load_examples(cfg, "train", 0)
    )
    print(f"  {docs} train documents -> {sum(len(c) for c, _ in comps)} examples at seq 128")


def measure(cfg: DataConfig, seconds: float, threads: int) -> list[Row]:
    rows = []
    mesh = sharding.single_device_mesh()
    variants = [
        ("host, NSP", {}, 16),
        ("host, NSP", {}, 256),
        ("host, NSP + whole-word", {"whole_word_masking": True}, 256),
        ("host, no NSP (packed)", {"nsp": False}, 256),
    ]
    for name, overrides, batch in variants:
        c = dataclasses.replace(cfg, global_batch_size=batch)
        examples = PretrainingOptions(**overrides)
        it, _ = loader.make_host_pipeline(c, examples=examples, seed=0, threads=threads)
        rows.append(Row(name, batch, *_rate(it, batch, seconds)))
    for batch in (16, 256):
        c = dataclasses.replace(cfg, global_batch_size=batch)
        it, _ = loader.make_pipeline(c, seed=0, mesh=mesh, threads=threads)
        block = lambda b: jax.block_until_ready(b)  # noqa: E731
        rows.append(Row("device (global jax.Array)", batch, *_rate(it, batch, seconds, block)))
    return rows


def _bert_step(vocab_size: int, size: str):
    """A jitted BERT pretraining step (AdamW, MLM + NSP loss) of ln_jax's model."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from ln_jax.config.run import model_config
    from ln_jax.models.bert.model import create_model

    model = create_model(model_config(size, vocab_size=vocab_size), seed=0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.adamw(1e-4)

    def loss_fn(params, rest, batch):
        out = nnx.merge(graphdef, params, rest)(
            batch["input_ids"],
            batch["segment_ids"],
            batch["attention_mask"],
            batch["masked_positions"],
        )
        logp = jax.nn.log_softmax(out["mlm_logits"])
        nll = -jnp.take_along_axis(logp, batch["masked_ids"][..., None], axis=-1)[..., 0]
        w = batch["masked_weights"]
        mlm = (nll * w).sum() / jnp.maximum(w.sum(), 1.0)
        nsp = optax.softmax_cross_entropy_with_integer_labels(out["nsp_logits"], batch["nsp_label"])
        return mlm + nsp.mean()

    @jax.jit
    def step(params, opt_state, rest, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, rest, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, params, opt.init(params), rest


def measure_train_step(cfg: DataConfig, batch: int, steps: int, size: str) -> dict[str, float]:
    """s/step of a BERT train step alone (fixed batch) and fed by the pipeline, same run."""
    c = dataclasses.replace(cfg, global_batch_size=batch)
    it, tok = loader.make_pipeline(c, seed=0, mesh=sharding.single_device_mesh())
    step, params, opt_state, rest = _bert_step(tok.vocab_size, size)
    fixed = next(it)
    for _ in range(2):  # compile and warm up
        params, opt_state, loss = step(params, opt_state, rest, fixed)
    jax.block_until_ready(loss)
    feeds = {"step alone": lambda: fixed, "step fed by loader": lambda: next(it)}
    timings = dict.fromkeys(feeds, 0.0)
    for _ in range(2):  # alternate the two loops: the second core is sometimes contended
        for name, feed in feeds.items():
            start = time.perf_counter()
            for _ in range(steps // 2):
                params, opt_state, loss = step(params, opt_state, rest, feed())
            jax.block_until_ready(loss)
            timings[name] += (time.perf_counter() - start) / (2 * (steps // 2))
    return timings


def report(rows: list[Row], steps: list[tuple[str, float]], train_batch: int) -> None:
    print(f"\n{'pipeline':<28s} {'batch':>5s} {'examples/s':>11s} {'batches/s':>10s}")
    for r in rows:
        print(f"{r.name:<28s} {r.batch:5d} {r.examples_per_s:11.0f} {r.batches_per_s:10.1f}")
    slowest = min(r.examples_per_s for r in rows if r.batch == train_batch)
    print(f"\nA train step at batch {train_batch} consumes (headroom = slowest loader row / need):")
    print(f"{'train step':<44s} {'s/step':>7s} {'examples/s':>11s} {'headroom':>9s}")
    for name, sec in steps:
        need = train_batch / sec
        print(f"{name:<44s} {sec:7.3f} {need:11.1f} {slowest / need:8.0f}x")


# --------------------------------------------------------------------------------------------
# Comparisons: alternating arms, medians and ratios
# --------------------------------------------------------------------------------------------

VARIANTS = {  # name -> PretrainingOptions overrides (BERT's section "bert")
    "NSP": {},
    "NSP + whole-word": {"whole_word_masking": True},
    "no NSP (packed)": {"nsp": False},
}

# A measuring process for one source tree (old or new ln_jax): it builds the host pipeline
# (in-process, computing each batch on `next`), then times it for the seconds read from stdin.
_LOADER_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["LN_JAX_TREE"])
import dataclasses
from ln_jax.data import DataConfig
given = json.loads(sys.argv[1])
try:
    from ln_jax.data.bert import pipeline as loader
    from ln_jax.data.bert.options import PretrainingOptions
except ImportError:  # a tree before 2026-12-06: ln_jax.data.loader, the fields DataConfig's
    from ln_jax.data import loader
    cfg = DataConfig(**given)
    it, _ = loader.make_host_pipeline(cfg, seed=0, threads=0)
else:
    mine = {f.name for f in dataclasses.fields(PretrainingOptions)}
    examples = PretrainingOptions(**{k: v for k, v in given.items() if k in mine})
    cfg = DataConfig(**{k: v for k, v in given.items() if k not in mine})
    it, _ = loader.make_host_pipeline(cfg, examples=examples, seed=0, threads=0)
next(it)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    seconds, n, start = float(line), 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 3:
        next(it)
        n += 1
    rate = n * cfg.global_batch_size / (time.perf_counter() - start)
    print(json.dumps({"value": rate}), flush=True)
"""

# A process timing one tree's NSP pair construction on a saved corpus, once per stdin line.
_PAIRS_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["LN_JAX_TREE"])
try:
    from ln_jax.data.bert import examples as pretraining
except ImportError:  # a tree before 2026-12-06
    from ln_jax.data import pretraining
corpus = pretraining.load_corpus(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    pretraining.nsp_pairs(corpus, max_seq_length=128, short_seq_prob=0.1, seed=0)
    print(json.dumps({"value": time.perf_counter() - start}), flush=True)
"""


class Child:
    """A measuring subprocess: `measure(arg)` sends a line and returns the number it prints."""

    def __init__(self, script: str, tree: str, argv: list[str]):
        env = dict(os.environ, LN_JAX_TREE=tree, JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *argv], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self._read()  # ready

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"measuring process exited with {self.proc.wait()}")

    def measure(self, arg: float = 0.0) -> float:
        self.proc.stdin.write(f"{arg}\n")
        self.proc.stdin.flush()
        return self._read()["value"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def old_tree(rev: str) -> str:
    """`ln_jax/` of git revision `rev`, extracted into a temporary folder (no worktree)."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", "--format=tar", rev, "ln_jax"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    folder = tempfile.mkdtemp(prefix=f"ln_jax_{rev}_")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def alternate(arms: dict, rounds: int) -> dict[str, list[float]]:
    """Runs every arm (name -> measure()) once per round, in the same order: A B A B ..."""
    values: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name, measure in arms.items():
            values[name].append(measure())
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in values.items()),
              flush=True)  # fmt: skip
    return values


def summarize(values: dict[str, list[float]], unit: str, base: str) -> None:
    """Medians (p25-p75) per arm, and each arm's ratio to `base` (median of per-round ratios)."""
    for name, v in values.items():
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        ratios = [a / b for a, b in zip(v, values[base], strict=True)]
        line = f"  {name:<26s} median {statistics.median(v):10.4g} {unit} ({q[0]:.4g}-{q[2]:.4g})"
        if name != base:
            line += f"  ratio to {base}: {statistics.median(ratios):.2f}x"
            line += f" (per round {min(ratios):.2f}-{max(ratios):.2f})"
        print(line, flush=True)


def machine_load(label: str) -> None:
    """What else runs on the machine: load averages and the busiest processes."""
    print(f"[{label}] load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    top = subprocess.run(["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"],
                         capture_output=True, text=True).stdout.splitlines()[1:6]  # fmt: skip
    for line in top:
        print(f"    {line[:110]}")


def compare_old(cfg: DataConfig, rev: str, batch: int, rounds: int, seconds: float) -> None:
    """Batched loader (this tree) vs the per-example loader of `rev`, same core, alternating."""
    tree = old_tree(rev)
    print(f"\nloader, in-process, batch {batch}, seq 128, CPUs {sorted(os.sched_getaffinity(0))}")
    try:
        for name, overrides in VARIANTS.items():
            c = dataclasses.asdict(dataclasses.replace(cfg, global_batch_size=batch))
            args = [json.dumps({k: c[k] for k in ("data_dir", "global_batch_size")} | overrides)]
            children = {f"old ({rev})": Child(_LOADER_CHILD, tree, args),
                        "new (batched)": Child(_LOADER_CHILD, ROOT, args)}  # fmt: skip
            print(f"{name} (examples/s):")
            arms = {k: (lambda ch=ch: ch.measure(seconds)) for k, ch in children.items()}
            summarize(alternate(arms, rounds), "ex/s", f"old ({rev})")
            for child in children.values():
                child.close()
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _children_cpu_s() -> float:
    """CPU seconds used so far by this process's child processes (the data workers)."""
    total, me = 0.0, str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[1] == me:  # ppid; utime and stime follow at 11, 12
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _rate(it, batch: int, seconds: float, skip: int, cpu: list) -> float:
    """Examples/s read from `it` for `seconds` after skipping `skip` batches (what workers
    buffered while other arms ran); appends (trainer process, workers) CPU ms per batch."""
    for _ in range(skip):
        next(it)
    main, children, start, n = time.process_time(), _children_cpu_s(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds or n < 3:
        next(it)
        n += 1
    rate = n * batch / (time.perf_counter() - start)
    used = (time.process_time() - main, _children_cpu_s() - children)
    cpu.append(tuple(1e3 * u / n for u in used))
    return rate


def _cpu_line(name: str, pairs_ms: list) -> tuple[str, float, float]:
    main = statistics.median(m for m, _ in pairs_ms)
    work = statistics.median(k for _, k in pairs_ms)
    line = f"  {name}: CPU per batch: trainer process {main:.2f} ms, workers {work:.2f} ms"
    return line, main, work


def compare_workers(cfg: DataConfig, counts: list[int], batch: int, rounds: int, seconds: float):
    """Examples/s with 0 (in-process), 1, 2, ... worker processes, alternating; and the CPU
    time per batch of the trainer's process and of the workers, which projects the scaling on
    idle cores when other programs hold some of them."""
    c = dataclasses.replace(cfg, global_batch_size=batch)
    pipelines = {w: loader.make_host_pipeline(c, seed=0, threads=0, workers=w)[0] for w in counts}
    for it in pipelines.values():
        next(it)  # starts the workers
    cpu: dict[int, list[tuple[float, float]]] = {w: [] for w in counts}  # (main, workers) ms
    print(f"\nloader with worker processes, batch {batch}, CPUs {sorted(os.sched_getaffinity(0))}")
    arms = {
        f"{w} workers": (lambda it=it, w=w: _rate(it, batch, seconds, 2 * w + 2, cpu[w]))
        for w, it in pipelines.items()
    }
    values = alternate(arms, rounds)
    base = f"{min(w for w in counts if w > 0)} workers" if any(counts) else f"{counts[0]} workers"
    summarize(values, "ex/s", base)
    for it in pipelines.values():
        it.close()
    for w, pairs_ms in cpu.items():
        line, main, work = _cpu_line(f"{w} workers", pairs_ms)
        if w > 1:  # w idle cores for the workers, the trainer's share spread over them too
            single = statistics.median(k for _, k in cpu[1]) if 1 in cpu else work
            line += f"; on {w} idle cores: {w * single / (work + main):.2f}x one worker"
        print(line)
    best = max(counts)
    per_core = statistics.median(values[f"{best} workers"]) / max(best, 1)
    print(
        f"  per core with {best} workers: {per_core:.0f} ex/s; an H100 at 5,800 ex/s needs "
        f"{5800 / per_core:.2f} host cores, an 8-GPU host (48,000 ex/s) {48000 / per_core:.1f}"
    )


def compare_transport(cfg: DataConfig, workers: int, batch: int, rounds: int, seconds: float):
    """How worker chunks reach the trainer's process: through grain's pipe (what ln_jax uses)
    vs grain's default, a shared-memory block per chunk; alternating, same worker count."""
    import grain

    from ln_jax.data import host_iterator

    c = dataclasses.replace(cfg, global_batch_size=batch)
    shipped, pipelines = host_iterator._NO_SHARED_MEMORY, {}
    try:
        for name, size in (("pipe", 1 << 40), ("shared memory", 0)):
            host_iterator._NO_SHARED_MEMORY = grain.experimental.DatasetOptions(min_shm_size=size)
            pipelines[name] = loader.make_host_pipeline(c, seed=0, threads=0, workers=workers)[0]
            next(pipelines[name])  # starts the workers (the option is read here)
    finally:
        host_iterator._NO_SHARED_MEMORY = shipped
    cpu = {name: [] for name in pipelines}
    print(f"\nworker chunks, pipe vs shared memory, {workers} workers, batch {batch}")
    arms = {
        name: (lambda it=it, name=name: _rate(it, batch, seconds, 2 * workers + 2, cpu[name]))
        for name, it in pipelines.items()
    }
    summarize(alternate(arms, rounds), "ex/s", "pipe")
    for name, it in pipelines.items():
        it.close()
        print(_cpu_line(name, cpu[name])[0])


def time_closes(cfg: DataConfig, workers: int, cycles: int, batch: int) -> None:
    """Seconds each `close` of a `workers`-worker pipeline takes, right after its first three
    batches; a close that waits for grain's 25 s kill timeout shows as a long one."""
    c = dataclasses.replace(cfg, global_batch_size=batch)
    times = []
    for _ in range(cycles):
        it = loader.make_host_pipeline(c, seed=0, threads=0, workers=workers)[0]
        for _ in range(3):
            next(it)
        start = time.perf_counter()
        it.close()
        times.append(time.perf_counter() - start)
    slow = sum(t > 10 for t in times)
    median, longest = statistics.median(times), max(times)
    print(f"\nclose of a {workers}-worker pipeline, {cycles} times:")
    print(f"  median {median:.2f} s, max {longest:.2f} s, {slow} over 10 s")


def scaled_corpus(corpus: pretraining.TokenizedCorpus, copies: int) -> pretraining.TokenizedCorpus:
    """The corpus repeated `copies` times (as more documents): a larger corpus to index."""
    n_tok, n_sent = len(corpus.tokens), corpus.num_sentences
    tokens = np.tile(np.asarray(corpus.tokens), copies)
    sent = [corpus.sent_starts[:-1] + k * n_tok for k in range(copies)] + [[copies * n_tok]]
    docs = [corpus.doc_starts[:-1] + k * n_sent for k in range(copies)] + [[copies * n_sent]]
    return pretraining.TokenizedCorpus(tokens, np.concatenate(sent), np.concatenate(docs))


def compare_pairs(cfg: DataConfig, scale: int, rounds: int, rev: str | None) -> None:
    """First start (build + save + map the pair index) vs second start (map the cache)."""
    opened = sources.open_sources(cfg)
    tok = tokenizer.get_tokenizer(cfg, opened)
    corpus = loader.tokenized_corpus(opened[0][0], cfg.train_split, tok)
    corpus = scaled_corpus(corpus, scale)
    work = tempfile.mkdtemp(prefix="ln_jax_pairs_bench_")
    source = types.SimpleNamespace(cache_dir=pathlib.Path(work))
    meta = loader.pair_index_meta(cfg, PretrainingOptions(), "x", tok, 0)
    folder = loader.pair_index_folder(source, meta)

    def timed(fresh: bool) -> float:
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        start = time.perf_counter()
        loader.pair_index(source, corpus, meta)
        return time.perf_counter() - start

    print(f"\npair index of {len(corpus.tokens):,} tokens ({corpus.num_docs:,} documents), "
          f"NSP, seq 128 (seconds)")  # fmt: skip
    arms = {"first start (build)": lambda: timed(True), "second start (load)": lambda: timed(False)}
    tree = None
    if rev:
        tree, saved = old_tree(rev), os.path.join(work, "corpus")
        pretraining.save_corpus(corpus, saved)
        old = Child(_PAIRS_CHILD, tree, [saved])
        arms[f"old build ({rev})"] = old.measure
    try:
        values = alternate(arms, rounds)
        summarize(values, "s", "second start (load)")
        if rev:
            summarize({k: values[k] for k in list(values)[::2]}, "s", "first start (build)")
        print(f"  pairs: {len(pairs.load_pair_index(folder)):,}")
    finally:
        if tree:
            old.close()
            shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default=None, help="TFDS data dir (default: TFDS's)")
    p.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    p.add_argument("--threads", type=int, default=1, help="grain read threads")
    p.add_argument("--step_seconds", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--train_batch", type=int, default=16, help="batch of the train step")
    p.add_argument("--model_size", default="mini", help="ln_jax model size of the train step")
    p.add_argument("--train_steps", type=int, default=10, help="0 = skip the train step")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument(
        "--compare_old",
        default=None,
        metavar="REV",
        help="batched loader vs the loader of git revision REV (one core: taskset)",
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=None,
        help="compare these worker counts (e.g. 0 1 2)",
    )
    p.add_argument(
        "--transport",
        type=int,
        default=0,
        metavar="W",
        help="W workers' chunks through grain's pipe vs shared memory",
    )
    p.add_argument("--closes", type=int, default=0, metavar="N", help="time N closes (2 workers)")
    p.add_argument("--pairs", action="store_true", help="pair index: build vs cached load")
    p.add_argument("--pairs_scale", type=int, default=1, help="--pairs on the corpus x N")
    p.add_argument("--batch", type=int, default=256, help="batch of the comparisons")
    p.add_argument("--rounds", type=int, default=5, help="alternations of each comparison")
    args = p.parse_args(argv)  # fmt: skip
    cfg = DataConfig(data_dir=args.data_dir, max_seq_length=128)  # P: BERT's 20 (the default)
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, {jax.device_count()} device(s)")
    prepare(cfg)
    if args.compare_old or args.workers or args.pairs or args.transport or args.closes:
        machine_load("before")
        if args.pairs:
            compare_pairs(cfg, args.pairs_scale, args.rounds, args.compare_old)
        elif args.compare_old:
            compare_old(cfg, args.compare_old, args.batch, args.rounds, args.seconds)
        if args.workers:
            compare_workers(cfg, args.workers, args.batch, args.rounds, args.seconds)
        if args.transport:
            compare_transport(cfg, args.transport, args.batch, args.rounds, args.seconds)
        if args.closes:
            time_closes(cfg, 2, args.closes, args.batch)
        machine_load("after")
        return 0
    rows = measure(cfg, args.seconds, args.threads)
    timings = {}
    if args.train_steps:
        try:
            timings = measure_train_step(cfg, args.train_batch, args.train_steps, args.model_size)
        except Exception as e:  # the model is another part of the project: report, go on
            print(f"train step not measured ({type(e).__name__}: {e})")
    steps = [(f"assumed {s:g} s/step", s) for s in args.step_seconds]
    steps += [(f"BERT-{args.model_size}, {name} (measured)", t) for name, t in timings.items()]
    report(rows, steps, args.train_batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [dataclasses.asdict(r) for r in rows], "train": timings}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
