"""`python -m train.export_checkpoint`: a complete training checkpoint -> a Hugging Face model directory.

For `sft-launch eval RUN --checkpoint STEP`. Run under `accelerate launch` with the run's
accelerate.yaml (one node): the model and optimizer are built and prepared exactly as in training,
`load_state` restores the checkpoint (FSDP2 sharded states reshard onto this world), and
train/engine/export.py's `export_model` writes the same files as the final export. The directory is
written under a temporary name and renamed, so a half-written export is never evaluated.
Exit 0 ok, 2 bad config / not a complete checkpoint, 1 failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
from pathlib import Path

from contract.config import load_train_config
from contract.protocol import (
    EXIT_OK,
    EXIT_USAGE,
    EVAL_PINNED_PREFIX as PINNED_PREFIX,  # eval --every-checkpoint's copies, the only ones removed
)
from contract.schema import ConfigError
from train.engine.checkpoint import MARKER

logger = logging.getLogger(__name__)


def export_checkpoint(config: Path, checkpoint: Path, output: Path) -> None:
    from train.kernels.attention import setup_attention
    from train.engine.checkpoint import load_checkpoint
    from train.dataset.load import load_tokenizer
    from train.engine.export import export_model
    from train.engine.model import attention_features, build_model
    from train.engine.optim import prepare_for_training
    from train.engine.sharding import build_accelerator

    cfg = load_train_config(config)
    accelerator = build_accelerator(cfg.model.precision)  # as training built it: FSDP2 states load sharded
    tokenizer = load_tokenizer(cfg)
    attn = setup_attention(cfg.model.attn_implementation, accelerator.device, cfg.data.packing,
                           attention_features(cfg))
    model = build_model(cfg, accelerator, attn)
    model, _, _ = prepare_for_training(accelerator, model, cfg, total_steps=1)  # load_state restores their state
    load_checkpoint(accelerator, checkpoint)
    tmp = output.with_name(f".tmp-{output.name}")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    export_model(accelerator, model, tokenizer, dataclasses.replace(cfg, run=dataclasses.replace(
        cfg.run, export_dir=str(tmp.resolve()))))
    if accelerator.is_main_process:
        tmp.replace(output)
        logger.info("exported %s to %s", checkpoint, output)
    accelerator.wait_for_everyone()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.export_checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="RUN/train.toml")
    parser.add_argument("--checkpoint", required=True, type=Path, help="a checkpoints/step-N directory")
    parser.add_argument("--output", required=True, type=Path, help="model directory to create")
    parser.add_argument("--remove-checkpoint", action="store_true",
                        help=f"remove --checkpoint after the export (only a pinned copy, {PINNED_PREFIX}*)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="sft-launch export: %(message)s")
    if not (args.checkpoint / MARKER).is_file():
        print(f"error: --checkpoint {args.checkpoint}: not a complete checkpoint (no {MARKER})",
              file=sys.stderr)
        return EXIT_USAGE
    if args.remove_checkpoint and not args.checkpoint.name.startswith(PINNED_PREFIX):
        print(f"error: --remove-checkpoint: {args.checkpoint} is not a pinned copy ({PINNED_PREFIX}*)", file=sys.stderr)
        return EXIT_USAGE
    try:
        export_checkpoint(args.config, args.checkpoint, args.output)
        if args.remove_checkpoint and int(os.environ.get("RANK", "0")) == 0:
            shutil.rmtree(args.checkpoint)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
