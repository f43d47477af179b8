"""Tokenizing a 1M-conversation mixture on one node: time, peak memory, cores, and the restart's cache hit.

    python -m bench.suites.data_tokenize [--rows 1000000] [--workers N] [--model-dir DIR] [--root DIR] [--results DIR]

Writes a seeded ShareGPT JSONL of --rows conversations (2-3 exchanges, a system turn in a third) and a
Q&A Parquet source of a tenth as many rows, and builds the training's datasets of that two-source
mixture exactly as a run's local main process does (train.dataset.load.build_datasets: read, parse,
chat template, assistant masks, truncation, Arrow cache under the run dir), on the node's cores
(train/dataset/tokenize.py; --workers overrides). Then builds them again, as a restarted job would:
the tokenized cache must be reused. Prints a table (and with --results writes `tokenize-<rows>.json` through
bench/report/results_io); CPU only (tokenizing never touches a GPU).
Peak memory: this process's and the largest worker's maximum RSS (getrusage; the sum bounds the
node's peak from above).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the model data training token batch node cluster checkpoint gradient loss layer attention "
         "weights learning rate schedule mixture source eval split conversation answer question why how "
         "because first then finally small large fast slow memory disk network").split()


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def write_chats(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(rows):
            turns = [{"from": "system", "value": sentence(rng, 8)}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(2, 3)):
                turns += [{"from": "human", "value": sentence(rng, rng.randint(8, 30))},
                          {"from": "gpt", "value": " ".join(sentence(rng, 12) for _ in range(rng.randint(1, 5)))}]
            handle.write(json.dumps({"conversations": turns}) + "\n")


def write_qa(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": f"What is {i} + {i}?", "answer": f"It is {2 * i}."}
                                         for i in range(rows)]), path)


def build(cfg, tokenizer) -> tuple[float, dict]:  # type: ignore[no-untyped-def]
    from train.dataset.load import build_datasets

    started = time.perf_counter()
    bundle = build_datasets(cfg, tokenizer)
    return time.perf_counter() - started, bundle.stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=0, help="0 = the node's cores")
    parser.add_argument("--model-dir", default="", help="tokenizer folder (default: the shipped tiny one)")
    parser.add_argument("--root", default="", help="where to write the data and the run (default: a temp dir)")
    parser.add_argument("--results", type=Path, help="write tokenize-<rows>.json into this folder")
    args = parser.parse_args()

    from contract.config import TrainConfig
    from contract.sources import DataSource
    from train.dataset import tokenize
    from train.dataset.load import load_tokenizer

    root = Path(args.root or tempfile.mkdtemp(prefix="data-tokenize-"))
    root.mkdir(parents=True, exist_ok=True)
    chats, qa = root / "chats.jsonl", root / "qa.parquet"
    started = time.perf_counter()
    write_chats(chats, args.rows)
    write_qa(qa, max(1, args.rows // 10))
    written = time.perf_counter() - started
    cfg = TrainConfig()
    cfg.run.dir = str(root / "run")
    cfg.model.tokenizer = args.model_dir
    cfg.data.sources = [DataSource(str(chats), name="chats"),
                        DataSource(str(qa), name="qa", format="prompt_completion", weight=0.5,
                                   columns={"prompt": "question", "completion": "answer"})]
    workers = args.workers or tokenize.tokenizing_workers()
    tokenize.tokenizing_workers = lambda: workers  # the bench's --workers; the training uses the node's cores
    tokenizer = load_tokenizer(cfg)
    first_s, stats = build(cfg, tokenizer)
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    again_s, again = build(cfg, tokenizer)
    hits = [source["cache_hit"] for source in again["sources"]]
    rows = stats["rows"]
    print(f"| conversations + Q&A rows | data written | cores | tokenize | rows/s | tokens | peak RSS main / worker "
          f"| restart | cache reused |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.rows:,} + {max(1, args.rows // 10):,} | {written:.0f} s, {chats.stat().st_size / 2**20:,.0f} MiB "
          f"| {workers} | {first_s:,.1f} s | {rows / first_s:,.0f} | {stats['tokens']:,} "
          f"| {peak_self:.2f} / {peak_child:.2f} GiB | {again_s:.1f} s | {all(hits)} ({sum(hits)}/{len(hits)} sources) |")
    if args.results:
        from bench.report.results_io import write_result
        write_result(args.results / f"tokenize-{args.rows}.json", {
            "rows": args.rows, "cores": os.cpu_count(), "qa_rows": max(1, args.rows // 10), "workers": workers, "examples": rows,
            "tokens": stats["tokens"], "tokenize_s": first_s, "rows_per_s": rows / first_s,
            "peak_rss_main_gib": peak_self, "peak_rss_worker_gib": peak_child, "restart_s": again_s,
            "cache_hits": hits, "data_written_s": written, "chats_mib": chats.stat().st_size / 2**20})
    return 0 if all(hits) else 1


if __name__ == "__main__":
    sys.exit(main())
