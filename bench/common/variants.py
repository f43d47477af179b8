"""The variants of our package that bench/suites/gpu_single.py runs on one GPU (name -> train.toml overrides,
section -> key -> value); its results files name theirs in `path`, and bench/report/speed_inputs.py reads the
settings of a run back from here."""

from __future__ import annotations

from typing import Any

VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "ours": {"train": {"compile": True, "gradient_checkpointing": False}},
    "ours-nocompile": {"train": {"compile": False, "gradient_checkpointing": False}},
    "ours-ckpt": {"train": {"compile": True, "gradient_checkpointing": True}},
    "ours-48k": {"train": {"compile": True, "gradient_checkpointing": False},
                 "data": {"tokens_per_micro_batch": 49152}},
    "ours-varlen": {"train": {"compile": True, "gradient_checkpointing": False},
                    "model": {"attn_implementation": "varlen"}},
    "ours-stockmlp": {"train": {"compile": True, "gradient_checkpointing": False, "fused_mlp": False}},
    "ours-liger": {"train": {"compile": True, "gradient_checkpointing": False, "fused_loss": "liger"}},
    "ours-lora": {"train": {"compile": True, "gradient_checkpointing": False}, "lora": {"enabled": True}},
    # As the TRL QLoRA peer: r 16 on all linear layers, no dropout
    "ours-qlora": {"train": {"compile": True, "gradient_checkpointing": False},
                   "lora": {"enabled": True, "quant": "nf4", "dropout": 0.0}},
    "ours-qlora-nocompile": {"train": {"compile": False, "gradient_checkpointing": False},
                             "lora": {"enabled": True, "quant": "nf4", "dropout": 0.0}},
}
