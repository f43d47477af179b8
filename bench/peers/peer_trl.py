"""The strongest peer: TRL's SFTTrainer configured for speed, on the same documents as ours.

BFD packing with padding-free batches (one row of up to --max-length tokens, positions restart per
document), flex_attention (transformers builds the document mask from position_ids), Liger kernels
(fused RMSNorm/RoPE/SwiGLU and the fused linear cross-entropy), bf16 autocast over fp32 weights,
fused AdamW, no gradient checkpointing (unless --gradient-checkpointing); optionally torch.compile, optionally LoRA through PEFT
(r 16, all linear layers, base weights in bf16 as TRL's speed recipes load them), or QLoRA: the same
LoRA over bitsandbytes' NF4 base (double quantization, bf16 compute and storage).

    python -m bench.peers.peer_trl --data DATA.jsonl --shape llama3.2-1b [--compile] [--lora]

Prints one JSON line (real tokens and seconds after the warm-up steps on the shared clock,
bench/peers/peer_clock.py; peak memory); bench/suites/gpu_single.py drives it. Under `accelerate launch` with an FSDP2
config (bench/multi/gpu_multi_lora.py) each rank builds the model on its own GPU, the Trainer shards it, and
rank 0 prints the job's line: every rank's real tokens, the longest clock, the largest peak. Real
tokens = non-padding tokens (the synthetic ids never hit the pad id).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import SFTConfig, SFTTrainer

from bench.peers.peer_clock import TimedSteps
from bench.common.synthetic import SHAPES, read_token_jsonl

TOKENIZER = Path(__file__).resolve().parents[2] / "train" / "assets" / "tiny-tokenizer"


class TimedSFTTrainer(TimedSteps, SFTTrainer):
    """SFTTrainer on the shared peer clock (bench/peers/peer_clock.py)."""

    def count_real_tokens(self, inputs):
        return int((inputs["input_ids"] != self.processing_class.pad_token_id).sum())


def build_model(shape: str, lora: bool, qlora: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    if "LOCAL_RANK" in os.environ:  # under `accelerate launch`: this rank's GPU, before the Trainer sets it
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    config = LlamaConfig(**SHAPES[shape], use_cache=False)
    dtype = torch.bfloat16 if lora or qlora else torch.float32
    with torch.device("cuda"):  # random init on the GPU (minutes on the CPU for 8B), as ours does
        model = LlamaForCausalLM._from_config(config, attn_implementation="flex_attention", dtype=dtype)
    return quantize_bnb(model) if qlora else model


def quantize_bnb(model: torch.nn.Module) -> torch.nn.Module:
    """QLoRA's base as bitsandbytes builds it for `BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bf16,
    bnb_4bit_quant_storage=bf16)`: every linear layer but lm_head becomes a `Linear4bit` (a random
    model cannot go through from_pretrained's quantizer without a checkpoint on disk)."""
    import bitsandbytes as bnb

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or name == "lm_head":
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                      quant_storage=torch.bfloat16, device="meta")
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", quant_storage=torch.bfloat16,
                                             module=layer)._quantize(child.weight.device)
            setattr(parent, name, layer)
    torch.cuda.empty_cache()
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--qlora", action="store_true", help="LoRA over a bitsandbytes NF4 base (double quant, bf16)")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: one epoch)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="non-reentrant activation checkpointing (the fall-back when a run does not fit)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_trl"))
    args = parser.parse_args()

    rows = Dataset.from_dict({"input_ids": read_token_jsonl(args.data)})
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    peft_config = None
    if args.lora or args.qlora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    config = SFTConfig(
        output_dir=str(args.out), max_length=args.max_length, packing=True, packing_strategy="bfd",
        padding_free=True, per_device_train_batch_size=1, num_train_epochs=1, bf16=True,
        use_liger_kernel=True, optim="adamw_torch_fused", learning_rate=2e-5, lr_scheduler_type="cosine",
        warmup_steps=0.03, weight_decay=0.0, torch_compile=args.compile, gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1000, save_strategy="no", report_to=[], seed=0, dataset_num_proc=1, max_steps=args.max_steps,
    )
    trainer = TimedSFTTrainer(model=build_model(args.shape, args.lora, args.qlora), args=config, train_dataset=rows,
                              processing_class=tokenizer, peft_config=peft_config)
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    kind = "-qlora" if args.qlora else "-lora" if args.lora else ""
    name = "peer-trl" + kind + ("-compile" if args.compile else "") + ("-ckpt" if args.gradient_checkpointing else "")
    result = trainer.result(name)
    if torch.distributed.is_initialized():  # under FSDP: every rank's tokens, the slowest clock, the largest peak
        result = trainer.all_ranks(result)
    if trainer.accelerator.is_main_process:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
