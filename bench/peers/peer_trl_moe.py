"""The mixture-of-experts LoRA peer: TRL's SFTTrainer + PEFT on a random Qwen3-MoE (or any family transformers
builds from a config dict), configured for speed as bench/peers/peer_trl.py is: BFD packing with padding-free
rows, flex_attention, Liger kernels, fused AdamW, bf16; the experts through the fastest implementation
transformers 5 ships for training (`grouped_mm`: torch's grouped GEMM, measured against `eager` and
`batched_mm` by bench/suites/gpu_moe_lora.py's layer table); LoRA r 16 through PEFT on the attention
projections (`target_modules`) and, where asked, on the experts' fused 3D weights (`target_parameters`, PEFT
>= 0.17: per-expert A/B, folded into the full weight at each forward).

    python -m bench.peers.peer_trl_moe --data DATA.jsonl --arch ARCH.json --targets q_proj,...,experts.down_proj

Prints one JSON line (the shared clock, bench/peers/peer_clock.py); bench/suites/gpu_moe_lora.py drives it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig

from bench.common.synthetic import read_token_jsonl
from bench.peers.peer_trl import TOKENIZER, TimedSFTTrainer

EXPERT_PARAMETERS = ("experts.gate_up_proj", "experts.down_proj")


def build_model(arch: dict, experts_implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(**arch, use_cache=False)
    with torch.device("cuda"):  # random init on the GPU, in bf16 (the LoRA base, as TRL's recipes load it)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention", dtype=torch.bfloat16)
    model.set_experts_implementation(experts_implementation)
    return model


def lora_config(targets: list[str]):
    from peft import LoraConfig

    modules = [t for t in targets if t not in EXPERT_PARAMETERS]
    parameters = [t for t in targets if t in EXPERT_PARAMETERS]
    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=modules,
                      target_parameters=parameters or None, task_type="CAUSAL_LM")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--arch", type=Path, required=True, help="JSON file: the model's config dict (model_type ...)")
    parser.add_argument("--targets", required=True, help="comma list: attention linears and experts.* parameters")
    parser.add_argument("--experts-implementation", default="grouped_mm")
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--no-liger", action="store_true", help="where Liger does not patch this family")
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_trl_moe"))
    args = parser.parse_args()

    arch = json.loads(args.arch.read_text())
    rows = Dataset.from_dict({"input_ids": read_token_jsonl(args.data)})
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    config = SFTConfig(
        output_dir=str(args.out), max_length=args.max_length, packing=True, packing_strategy="bfd",
        padding_free=True, per_device_train_batch_size=1, num_train_epochs=1, bf16=True,
        use_liger_kernel=not args.no_liger,
        # Liger's SwiGLU patch replaces the experts' forward, which PEFT's wrapped expert weights break ("'ParamWrapper'
        # object has no attribute 'hidden_dim'", one H100, 2026-12-06): its RMSNorm, RoPE and fused loss stay on.
        liger_kernel_config={"swiglu": False} if not args.no_liger else None,
        optim="adamw_torch_fused", learning_rate=2e-5, lr_scheduler_type="cosine",
        warmup_steps=0.03, weight_decay=0.0, gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}, logging_steps=1000, save_strategy="no", report_to=[],
        seed=0, dataset_num_proc=1, max_steps=args.max_steps,
    )
    trainer = TimedSFTTrainer(model=build_model(arch, args.experts_implementation), args=config, train_dataset=rows,
                              processing_class=tokenizer, peft_config=lora_config(args.targets.split(",")))
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    result = trainer.result("peer-trl-moe-lora" + ("-ckpt" if args.gradient_checkpointing else ""))
    result["experts_implementation"] = args.experts_implementation
    print(json.dumps(result))


if __name__ == "__main__":
    main()
