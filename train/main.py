"""Entry point of a training process: ``accelerate launch … -m train --config RUN_DIR/train.toml``.

Exit codes (docs/ARCHITECTURE.md): 0 done and exported; 75 (EXIT_REQUEUE) checkpointed after a stop
request; 1 runtime failure (including a failed checkpoint write — the previous one stays intact);
2 bad configuration (one line naming the key).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from launcher.schema import ConfigError
from train.config import load_train_config

logger = logging.getLogger("train")


def _configure_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    # Per-rank facts (peak RSS at load) are INFO on every rank: let model loading through.
    logging.getLogger("train.model").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train", description="Run SFT training from a train.toml.")
    parser.add_argument("--config", required=True, help="path to RUN_DIR/train.toml")
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        cfg = load_train_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Heavy imports only after the config is known to be valid (fast exit 2 on a typo).
    from torch.distributed.checkpoint import CheckpointException

    from train.loop import train
    from train.sharding import build_accelerator

    try:
        return train(cfg, build_accelerator(cfg.model.precision))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (Exception, CheckpointException):  # a failed sharded (DCP) save raises a BaseException
        logger.exception("training failed")
        return 1
