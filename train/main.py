"""Entry point of a training process: ``accelerate launch … -m train --config RUN_DIR/train.toml``.

Exit codes (docs/ARCHITECTURE.md): 0 done and exported; 75 (EXIT_REQUEUE) checkpointed after a stop
request; 76 (EXIT_HUNG) no progress: the watchdog fired (train/engine/watchdog.py) or a collective timed out
or lost a peer; 1 runtime failure (including a failed checkpoint write — the previous one stays
intact); 2 bad configuration (one line naming the key). A failure also leaves one record in
RUN_DIR/logs/failures.jsonl (contract/failure.py) so the launcher can say why in one line.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from pathlib import Path

from contract.config import load_train_config
from contract.failure import EXIT_CONFIG, EXIT_FAILURE, EXIT_HUNG, PeerFailedError, first_line, record_failure
from contract.liveness import append_roster
from contract.protocol import COMPILE_CACHE_DIR
from contract.schema import ConfigError
from train.observe.ranklog import console_handler, redirect_output
from train.observe.startup import StartupClock

logger = logging.getLogger("train")

# The CUDA caching allocator's setting unless the environment has one (PYTORCH_ALLOC_CONF, torch's newer
# name, or PYTORCH_CUDA_ALLOC_CONF). Expandable segments grow one mapped segment instead of cudaMalloc-ing
# fixed blocks, so a run near the GPU's capacity does not free and re-allocate cached blocks (each
# cudaFree synchronizes the device). Why: the 8B run on 4 x H100
# (bench/results/h100/four-gpu-2026-11-27/multi-4gpu-8b-full.json) held 77.5 GiB reserved for 65.7 GiB
# allocated, and its steps alternated 0.85 s / 1.0 s; its FP8 run (68.7 GiB reserved) did not.
# metrics.jsonl's `alloc_retries` counts the allocator's free-and-retry passes.
CUDA_ALLOC_CONF = "expandable_segments:True"


def _configure_logging(run_dir: Path, attempt: str | None) -> None:
    rank = os.environ.get("RANK", "0")
    console = None
    if attempt is not None:  # every executor passes one: the whole output goes to this rank's log
        console = redirect_output(run_dir, attempt, int(rank), int(os.environ.get("LOCAL_RANK", "0")))
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    if console is not None:
        root = logging.getLogger()
        root.addHandler(console_handler(console, root.handlers[0].formatter or logging.Formatter()))
    # Per-rank facts (peak RSS at load) are INFO on every rank: let model loading through.
    logging.getLogger("train.engine.model").setLevel(logging.INFO)
    # Accelerate narrates every save_state/load_state in ~14 INFO lines (each file it writes);
    # train/engine/checkpoint.py says it in one line of its own. Its warnings still come through.
    logging.getLogger("accelerate").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description="Run SFT training from a train.toml.")
    parser.add_argument("--config", required=True, help="path to RUN_DIR/train.toml")
    parser.add_argument("--attempt", help="write this process's output to RUN_DIR/logs/ranks/ATTEMPT/rank-N.log")
    args = parser.parse_args(argv)
    startup = StartupClock()  # from the job's start: every phase to the first step (#53)
    if not (os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOC_CONF  # read at the first CUDA allocation
    run_dir = Path(args.config).resolve().parent  # train.toml sits in the run directory
    # Read when torch.compile first compiles; the environment's own choice wins.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(run_dir / COMPILE_CACHE_DIR))
    _configure_logging(run_dir, args.attempt)
    started = time.time()
    append_roster(run_dir)  # before anything can hang: which host runs this rank
    try:
        cfg = load_train_config(args.config)
    except ConfigError as err:
        return _failed(run_dir, EXIT_CONFIG, f"error: {err}", str(err))
    # Heavy imports only after the config is known to be valid (fast exit 2 on a typo). A package
    # missing on the compute nodes is the classic first failure: it gets its record like any other.
    try:
        from torch.distributed.checkpoint import CheckpointException

        from train.engine.loop import train
        from train.engine.sharding import build_accelerator, release_process_group
        from train.engine.watchdog import collective_failure, record_collective_failure
    except ImportError as err:
        logger.exception("import failed")
        record_failure(run_dir, EXIT_FAILURE, f"{type(err).__name__}: {first_line(str(err))}")
        return EXIT_FAILURE
    # The imports' objects (~450k: modules, classes, functions) live as long as the process: frozen, no garbage
    # collection walks them again. A full collection cost 0.4 s on CPU (the loop's before the first step, and
    # each automatic one while the model is built and torch.compile traces its layers); frozen, 20 us.
    gc.freeze()
    startup.mark("imports")
    try:
        accelerator = build_accelerator(cfg.model.precision, cfg.run.collective_timeout_s,
                                        cfg.train.cpu_object_collectives)
        startup.mark("process_group")
        return release_process_group(accelerator, train(cfg, accelerator, startup))
    except ConfigError as err:
        return _failed(run_dir, EXIT_CONFIG, f"error: {err}", str(err))
    except PeerFailedError as err:
        logger.error("%s", err)  # a consequence: the rank that failed first says why
        record_failure(run_dir, EXIT_FAILURE, str(err), follow_on=True)
        return EXIT_FAILURE
    except (Exception, CheckpointException) as err:  # a failed sharded (DCP) save raises a BaseException
        logger.exception("training failed")
        if collective_failure(err):
            record_collective_failure(run_dir, err, started)
            return EXIT_HUNG
        record_failure(run_dir, EXIT_FAILURE, f"{type(err).__name__}: {first_line(str(err))}")
        return EXIT_FAILURE


def _failed(run_dir: Path, code: int, shown: str, message: str) -> int:
    print(shown, file=sys.stderr)
    record_failure(run_dir, code, message)
    return code
