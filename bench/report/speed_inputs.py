"""Which plan a results file's training run is: the planner's input for each run of ours a GPU results file
records, in a setting the planner can express (its shape, GPU count, tokens per micro-batch, full / LoRA /
QLoRA, checkpointing, FP8, gradient accumulation, activation offload and MLP chunks), its measured tokens/s per
GPU, and what the planner's speed model (launcher/plan/speed.py) predicts for it.

Two readers: results_io.write_result records each run's `predicted_tokens_per_s_per_gpu` and `speed_error`
(= predicted / measured - 1) beside its measured numbers, and bench/suites/speed_calibration.py predicts every
committed file again with today's model (issue #55). Peers' runs (TRL, FastChat), kernel micro-benchmarks,
loss-parity and resume checks are not training throughput of ours: no runs.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any

from bench.common.synthetic import SHAPES, attended_length, document_lengths
from bench.common.variants import VARIANTS
from contract.gpus import gpu_type_from_device_name
from launcher.plan.planner import make_plan, plan_input_from_dict

LLAMA_70B = dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                 intermediate_size=28672, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096)
SCALING_1B_TOKENS = 16384  # bench/multi/gpu_multi.py --tokens1b's default: its scaling runs do not record it


@dataclass
class Run:
    name: str  # "<file>" or "<file> <block>"
    where: tuple[str, ...]  # the keys of the run's block in the results file (() = the file itself)
    setting: str
    measured: float  # real tokens/s per GPU
    plan_input: dict[str, Any]


def _arch(shape: str) -> dict[str, Any]:
    return dict(LLAMA_70B) if shape == "llama-70b" else dict(SHAPES[shape])


def _reaching(arch: dict[str, Any], tokens: int) -> dict[str, Any]:
    """`arch` with positions for a micro-batch of `tokens` (the planner refuses a longer one)."""
    return dict(arch, max_position_embeddings=max(arch.get("max_position_embeddings", 0), tokens))


def _plan_input(arch: dict[str, Any], gpu_type: str, gpus: int, tokens: int, docs: int, **settings: Any) -> dict:
    return {"arch": _reaching(arch, tokens), "gpu_type": gpu_type, "gpus_per_node": gpus, "micro_batch_tokens": tokens,
            "mean_doc_tokens": attended_length(document_lengths(docs, tokens)), **settings}


def _describe(inp: dict[str, Any], shape: str) -> str:
    kind = "QLoRA" if inp.get("quant") == "nf4" else "LoRA" if inp.get("lora") else "full"
    layers = inp.get("checkpoint_layers", "all")
    checkpointing = "ckpt" if layers == "all" else f"ckpt {layers} layers"
    parts = [shape, kind, f"{inp['gpus_per_node']} GPU", f"{inp['micro_batch_tokens']} tok",
             checkpointing if inp.get("gradient_checkpointing") else "no ckpt"]
    parts += [label for key, label in (("fp8", "fp8"), ("activation_offload", "offload"),
                                       ("mlp_chunk_tokens", "MLP chunks")) if inp.get(key)]
    if inp.get("gradient_accumulation_steps", 1) > 1:
        parts.append(f"GA {inp['gradient_accumulation_steps']}")
    return " ".join(parts)


def _layers(settings: dict[str, Any]) -> dict[str, Any]:
    """train.checkpoint_layers where a run set it (files before it checkpointed every layer)."""
    return {"checkpoint_layers": settings["checkpoint_layers"]} if "checkpoint_layers" in settings else {}


def _accumulation(record: dict[str, Any]) -> int:
    command = record.get("provenance", {}).get("command", [])
    for item in command:
        if item.startswith("train.gradient_accumulation_steps="):
            return int(item.split("=", 1)[1])
    return 1


def _run(name: str, where: tuple[str, ...], shape: str, measured: float, inp: dict[str, Any]) -> Run:
    return Run(name, where, _describe(inp, shape), measured, inp)


def _top_level(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """single-*.json (bench/suites/gpu_single.py's variants) and the 70B runs (bench/multi/gpu_qlora.py)."""
    path = data["path"]
    if path.startswith("peer") or "real_tokens_per_s" not in data:
        return []
    if path.startswith(("lora-bf16-llama70b", "qlora-llama70b")):
        quant = "nf4" if path.startswith("qlora") else "none"
        inp = _plan_input(LLAMA_70B, gpu, data["gpu_count"], data["budget"], data["docs"], lora=True, quant=quant,
                          gradient_checkpointing=data.get("gradient_checkpointing", True), **_layers(data))
        # the run's rate over its timed steps, as the headline shows it (tokens_per_s_per_gpu is its last step's)
        return [_run(name, (), "llama-70b", data["real_tokens_per_s"] / data["gpu_count"], inp)]
    variant = VARIANTS.get(path)
    if variant is None:
        return []
    train, lora = variant.get("train", {}), variant.get("lora", {})
    tokens = variant.get("data", {}).get("tokens_per_micro_batch", data["budget"])
    inp = _plan_input(_arch(data["shape"]), gpu, data["gpu_count"], tokens, data["docs"],
                      gradient_checkpointing=train["gradient_checkpointing"], lora=bool(lora.get("enabled")),
                      quant=lora.get("quant", "none"))
    return [_run(name, (), data["shape"], data["real_tokens_per_s"] / data["gpu_count"], inp)]


def _block(name: str, where: tuple[str, ...], gpu: str, shape: str, docs: int, block: dict[str, Any], tokens: int,
           accumulation: int = 1, **settings: Any) -> Run:
    inp = _plan_input(_arch(shape), gpu, block["gpu_count"], tokens, docs,
                      gradient_checkpointing=block.get("gradient_checkpointing", False),
                      gradient_accumulation_steps=accumulation, **settings)
    return _run(name, where, shape, block["real_tokens_per_s"] / block["gpu_count"], inp)


def _multi(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """bench/multi's files: 8B full (8b_full), 8B LoRA (8b_lora), bf16 vs FP8 (fp8_8b), 1B scaling."""
    runs, docs = [], data.get("docs", 0)
    if "real_tokens_per_s" in data.get("8b_full", {}):
        block = data["8b_full"]
        runs.append(_block(f"{name} 8b_full", ("8b_full",), gpu, data["shape"], docs, block,
                           block["tokens_per_micro_batch"], _accumulation(data),
                           fp8="torchao" if block.get("precision") == "fp8" else ""))
    if "real_tokens_per_s" in data.get("8b_lora", {}):
        runs.append(_block(f"{name} 8b_lora", ("8b_lora",), gpu, data["shape"], docs, data["8b_lora"], data["budget"],
                           lora=True))
    for side, fp8 in (("bf16", ""), ("fp8", "torchao")):
        block = data.get("fp8_8b", {}).get(side)
        if block and "real_tokens_per_s" in block:
            runs.append(_block(f"{name} fp8_8b.{side}", ("fp8_8b", side), gpu, "llama3-8b", docs, block,
                               block["tokens_per_micro_batch"], fp8=fp8))
    for count, block in sorted(data.get("scaling_1b", {}).items()):
        if "real_tokens_per_s" in block:
            runs.append(_block(f"{name} scaling_1b.{count}", ("scaling_1b", count), gpu, "llama3.2-1b", docs, block,
                               SCALING_1B_TOKENS))
    return runs


def _compare(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """compare-*.json: our side's repeated runs, their median."""
    ours = data["sides"]["ours"]
    measured = statistics.median(r["real_tokens_per_s"] for r in ours["runs"]) / data["gpu_count"]
    inp = _plan_input(_arch(data["shape"]), gpu, data["gpu_count"], data["budget"], data["docs"],
                      gradient_checkpointing=ours["gradient_checkpointing"])
    return [_run(f"{name} ours", ("sides", "ours"), data["shape"], measured, inp)]


def _one_document(gpu: str, data: dict[str, Any]) -> dict[str, Any]:
    """The plan input both long-context kinds share: one document of exactly seq_len tokens a micro-batch (nothing
    padded: packing efficiency 1, s̄ = seq_len), split over context_parallel GPUs."""
    tokens = data["seq_len"]
    return {"arch": _reaching(data["arch"], tokens), "gpu_type": gpu, "gpus_per_node": data["gpu_count"],
            "micro_batch_tokens": tokens, "mean_doc_tokens": float(tokens), "packing_efficiency": 1.0,
            "context_parallel": data["context_parallel"]}


def _long_context(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """longctx-*.json (bench/suites/gpu_long_context.py): LoRA on one document of seq_len tokens a micro-batch
    (_one_document), the last step's rate."""
    if data.get("fine_tune") == "full":
        return _long_context_full(name, gpu, data)
    if data.get("tokens_per_s") is None:
        return []
    train = data["settings"]["train"]
    inp = {**_one_document(gpu, data), "lora": True, "lora_r": data["lora_r"],
           "lora_target_modules": data["lora_targets"], "gradient_checkpointing": train["gradient_checkpointing"],
           "activation_offload": train.get("activation_offload", False),
           "mlp_chunk_tokens": train.get("mlp_chunk_tokens", 0),
           "recompute_attention": train.get("recompute_attention", True), **_layers(train)}
    return [_run(name, (), data["shape"], data["tokens_per_s"] / data["gpu_count"], inp)]


def _long_context_full(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """longctx-*-full-*-cp<N>.json (bench/multi/gpu_context_parallel.py): 8B full fine-tune, one document of
    seq_len tokens a step split over context_parallel GPUs, all GPUs of one host."""
    if "real_tokens_per_s" not in data:
        return []
    inp = {**_one_document(gpu, data), "gradient_checkpointing": data["gradient_checkpointing"],
           "activation_offload": data.get("activation_offload", False)}
    return [_run(name, (), data["shape"], data["real_tokens_per_s"] / data["gpu_count"], inp)]


SAVE_RUNS = ("nosave", "async", "sync")  # bench/multi/gpu_save_async.py's training runs (resume trains no timed steps)


def _save_async(name: str, gpu: str, data: dict[str, Any]) -> list[Run]:
    """save-async.json (bench/multi/gpu_save_async.py): full fine-tunes of `arch` (the 8B layer shape, as many
    layers as the disk holds two checkpoints of), FSDP2 over gpu_count GPUs, checkpointing, compiled layers. The
    rate is the training steps' (metrics' elapsed_s leaves the save pauses out), so the plan's speed applies to
    each run alike; the pauses are the runs' own fields."""
    runs = []
    for side in SAVE_RUNS:
        block = data.get(side)
        if block and "real_tokens_per_s" in block:
            inp = _plan_input(data["arch"], gpu, data["gpu_count"], data["tokens_per_micro_batch"], data["docs"],
                              gradient_checkpointing=True,
                              gradient_accumulation_steps=data.get("gradient_accumulation_steps", 1))
            shape = f"llama3-8b x{data['arch']['num_hidden_layers']} layers"
            runs.append(_run(f"{name} {side}", (side,), shape, block["real_tokens_per_s"] / data["gpu_count"], inp))
    return runs


def runs_of(name: str, gpu_type: str, data: dict[str, Any]) -> list[Run]:
    """The runs of ours in one results file (`name`: its path, the file name last) on GPUs of `gpu_type`."""
    if name.rsplit("/", 1)[-1].startswith("compare-"):
        return _compare(name, gpu_type, data)
    if name.rsplit("/", 1)[-1].startswith("save-async"):
        return _save_async(name, gpu_type, data)
    if "seq_len" in data:
        return _long_context(name, gpu_type, data)
    if "path" in data:
        return _top_level(name, gpu_type, data)
    return _multi(name, gpu_type, data)


def predicted_tokens_per_s(run: Run) -> float:
    """The planner's tokens/s per GPU for the run's setting (launcher/plan/speed.py through make_plan)."""
    plan = make_plan(plan_input_from_dict(run.plan_input))
    return plan.time.tokens_per_s / plan.input.world_size


def block_of(record: dict[str, Any], where: tuple[str, ...]) -> dict[str, Any]:
    for key in where:
        record = record[key]
    return record


def with_predictions(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """A copy of `record` (provenance included: it names the GPUs) where each run of ours records the plan's
    `predicted_tokens_per_s_per_gpu` and `speed_error` in its block; unchanged where it has none or its GPUs
    are not a type contract/gpus.py knows."""
    gpus = record.get("provenance", {}).get("gpus") or []
    gpu_type = gpu_type_from_device_name(gpus[0]) if gpus else None
    if gpu_type is None:
        return record
    record = copy.deepcopy(record)
    for run in runs_of(name, gpu_type, record):
        predicted = predicted_tokens_per_s(run)
        block_of(record, run.where).update(predicted_tokens_per_s_per_gpu=predicted,
                                           speed_error=predicted / run.measured - 1)
    return record
