"""The strongest peer: TRL's SFTTrainer configured for speed, on the same documents as ours.

BFD packing with padding-free batches (one row of up to --max-length tokens, positions restart per
document), flex_attention (transformers builds the document mask from position_ids), Liger kernels
(fused RMSNorm/RoPE/SwiGLU and the fused linear cross-entropy), bf16 autocast over fp32 weights,
fused AdamW, no gradient checkpointing; optionally torch.compile, optionally LoRA through PEFT
(r 16, all linear layers, base weights in bf16 as TRL's speed recipes load them).

    python -m bench.peer_trl --data DATA.jsonl --shape llama3.2-1b [--compile] [--lora]

Prints one JSON line (real tokens and seconds after the warm-up steps on the shared clock,
bench/peer_clock.py; peak memory); bench/gpu_single.py drives it. Real tokens = non-padding tokens
(the synthetic ids never hit the pad id).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer

from bench.peer_clock import TimedSteps
from bench.synthetic import SHAPES, read_token_jsonl

TOKENIZER = Path(__file__).resolve().parent.parent / "train" / "assets" / "tiny-tokenizer"


class TimedSFTTrainer(TimedSteps, SFTTrainer):
    """SFTTrainer on the shared peer clock (bench/peer_clock.py)."""

    def count_real_tokens(self, inputs):
        return int((inputs["input_ids"] != self.processing_class.pad_token_id).sum())


def build_model(shape: str, lora: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], use_cache=False)
    dtype = torch.bfloat16 if lora else torch.float32
    with torch.device("cuda"):  # random init on the GPU (minutes on the CPU for 8B), as ours does
        return LlamaForCausalLM._from_config(config, attn_implementation="flex_attention", dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_trl"))
    args = parser.parse_args()

    rows = Dataset.from_dict({"input_ids": read_token_jsonl(args.data)})
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    config = SFTConfig(
        output_dir=str(args.out), max_length=args.max_length, packing=True, packing_strategy="bfd",
        padding_free=True, per_device_train_batch_size=1, num_train_epochs=1, bf16=True,
        use_liger_kernel=True, optim="adamw_torch_fused", learning_rate=2e-5, lr_scheduler_type="cosine",
        warmup_steps=0.03, weight_decay=0.0, gradient_checkpointing=False, torch_compile=args.compile,
        logging_steps=1000, save_strategy="no", report_to=[], seed=0, dataset_num_proc=1,
    )
    trainer = TimedSFTTrainer(model=build_model(args.shape, args.lora), args=config, train_dataset=rows,
                              processing_class=tokenizer, peft_config=peft_config)
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    name = "peer-trl" + ("-lora" if args.lora else "") + ("-compile" if args.compile else "")
    print(json.dumps(trainer.result(name)))

if __name__ == "__main__":
    main()
