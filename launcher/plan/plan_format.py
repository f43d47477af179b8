"""The planner's compact table: what `sft-launch plan` and every launch print (`--json` uses
`planner.plan_to_dict` instead), and a suggestion as the flags that apply it. Pure formatting of a
`planner.Plan`; no model logic here."""

from __future__ import annotations

from contract import gpus
from contract.config import checkpointed_layers
from contract.shape import ModelShape
from contract.strategies import STRATEGIES
from launcher.plan.memory import GIB, MemoryBreakdown
from launcher.plan.planner import MAX_SUGGESTED_NODES, Plan, PlanInput, Suggestion

GIB_F = float(GIB)
GPU_ONLY_TERMS = ("allocator_slack", "cuda_context_nccl")  # CUDA's caching allocator, context and NCCL


def _gib(n: int | float) -> str:
    return f"{n / GIB_F:7.2f}"


def _count(n: int) -> str:
    if n >= 1e8:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _memory_lines(plan: Plan) -> list[str]:
    gpu, inp = plan.gpu, plan.input
    # On a CPU profile the "device" is one training process and its memory a share of the node's RAM.
    title, unit = ("GPU memory per GPU", inp.gpu_type) if inp.device == "gpu" else \
        ("RAM per CPU process", "its share of node RAM")
    lines = [f"{title} (peak in {gpu.peak_phase})".ljust(51) + "GiB"]
    for term in MemoryBreakdown.TERMS:
        if inp.device == "cpu" and term in GPU_ONLY_TERMS:
            continue
        lines.append(f"  {term.replace('_', ' '):<22}{_gib(getattr(gpu, term))}   {gpu.notes.get(term, '')}")
    usable = "?" if plan.gpu_usable_bytes is None else _gib(plan.gpu_usable_bytes).strip()
    lines.append(f"  {'total':<22}{_gib(gpu.total)}   of {usable} usable "
                 f"({inp.usable_gpu_fraction:.0%} of {unit})")
    cpu = plan.cpu
    cpu_usable = "unchecked" if plan.cpu_usable_bytes is None else f"of {_gib(plan.cpu_usable_bytes).strip()} usable"
    lines.append(f"CPU RAM node 0         {_gib(cpu['total'])}   {cpu_usable} (processes "
                 f"{_gib(cpu['process_baseline']).strip()}, loading {_gib(cpu['model_loading']).strip()}, "
                 f"offload {_gib(cpu['offload']).strip()})")
    return lines


def _time_lines(plan: Plan) -> list[str]:
    t, inp = plan.time, plan.input
    rate = (f"{t.tokens_per_s:,.0f} tok/s predicted (MFU {t.expected_mfu:.0%})" if t.tokens_per_s and t.expected_mfu
            else "? tok/s")
    steps = "?" if t.steps is None else f"{t.steps:,}"
    tokens = "?" if t.total_tokens is None else _count(t.total_tokens)
    per_billion = f"; 1B tokens in {_duration(1e9 / t.tokens_per_s)}" if t.tokens_per_s else ""
    lines = [f"Time    {steps} steps x {t.tokens_per_step:,} tok = {tokens} tokens; {rate}{per_billion}",
             f"        ETA {_duration(t.eta_s)} (compute {_duration(t.train_time_s)})"
             + ("" if inp.device == "cpu" else f", {'?' if t.gpu_hours is None else f'{t.gpu_hours:,.1f}'} GPU-hours")
             + (f", cost {t.cost:,.0f}" if t.cost is not None else "")]
    if inp.time_limit_s:
        lines.append(f"        time limit {_duration(inp.time_limit_s)}: "
                     f"{'?' if t.requeues is None else t.requeues} requeue(s)")
    if inp.fp8 and (spec := gpus.lookup(inp.gpu_type)) is not None:
        fp8_peak = f"{spec.peak_tflops_fp8:,.0f}" if spec.peak_tflops_fp8 else "?"
        lines.append(f"        MFU against the bf16 peak ({spec.peak_tflops_bf16:,.0f} TFLOP/s per GPU); "
                     f"FP8 peak {fp8_peak} TFLOP/s")
    lines.append(_signal_line(plan))
    lines += _preempt_lines(plan)
    return lines


def _signal_line(plan: Plan) -> str:
    """The lead launch.slurm asks for (profile.signal_lead_s), and what the stop-save needs."""
    cadence = plan.cadence
    inflight = ", or finishing the asynchronous one in flight" if cadence and cadence.asynchronous else ""
    needs = (f"a stop-save needs ~{plan.signal_lead_s} s: the step in progress and the checkpoint "
             f"({plan.checkpoint_bytes / 1e9:.1f} GB{inflight})")
    if plan.input.signal_lead_s is None:
        return f"Signal  none: no time limit here (a stop request checkpoints; {needs})"
    return f"Signal  {plan.input.signal_lead_s} s before the limit (profile.signal_lead_s; {needs})"


def _preempt_lines(plan: Plan) -> list[str]:
    """What a preemption loses when SLURM's GraceTime ends before the stop-save: the steps since the newest
    COMPLETE checkpoint, and the train.save_steps that bounds it (saves.save_cadence)."""
    cadence, save_steps = plan.cadence, plan.input.save_steps
    if cadence is None or cadence.lost_steps is None:
        return []
    mode = "asynchronous saves" if cadence.asynchronous else "synchronous saves"
    lost = f"{cadence.lost_steps:,} steps" + (f" (~{_duration(cadence.lost_s)})" if cadence.lost_s else "")
    line = (f"Preempt GraceTime under ~{cadence.stop_save_s} s: a preempted job loses up to {lost} "
            f"(save_steps {save_steps:,}, {mode}, each written in ~{_duration(cadence.write_s)})")
    lines = [line, *([f"        each save {cadence.staging}"] if cadence.staging else [])]
    suggested = cadence.suggested_save_steps
    if suggested is None or cadence.lost_s is None or suggested > 0.75 * save_steps:
        return lines  # only a clearly shorter interval is worth a suggestion
    step_s = cadence.lost_s / cadence.lost_steps
    bound = (cadence.lost_steps - save_steps + suggested) * step_s
    return [*lines, f"        --set train.save_steps={suggested} bounds it to ~{_duration(bound)}"]


def _checkpointing(inp: PlanInput) -> str:
    if not inp.gradient_checkpointing:
        return "off"
    layers = ModelShape.from_arch(inp.arch).layers
    count = len(checkpointed_layers(layers, inp.checkpoint_layers))
    kept = [] if inp.recompute_attention else ["attention outputs kept"]
    parts = ([] if count == layers else [f"{count} of {layers} layers"]) + kept
    return f"on ({', '.join(parts)})" if parts else "on"


def format_plan(plan: Plan) -> str:
    """Compact human-readable table: memory breakdown, verdict + suggestions, time/cost, signal lead."""
    inp = plan.input
    trainable = f", {_count(plan.params_trainable)} trainable (LoRA r={inp.lora_r})" if inp.lora else ""
    if plan.params_active < plan.params_total:  # mixture of experts: all resident, the top-k computed
        trainable = f" ({_count(plan.params_active)} active){trainable}"
    devices = f"{inp.nodes}x{inp.gpus_per_node} {inp.gpu_type}" if inp.device == "gpu" else \
        f"{inp.nodes}x{inp.gpus_per_node} CPU processes"
    strategy = STRATEGIES[inp.strategy].title if inp.device == "gpu" else "FSDP2 over gloo (planned as full replicas)"
    lines = [
        f"Plan    {_count(plan.params_total)} params{trainable} · {strategy}"
        f"{' + CPU offload' if inp.cpu_offload else ''} · {devices} · "
        f"{'fp8 linears + ' if inp.fp8 else ''}{inp.precision} · checkpointing {_checkpointing(inp)} · "
        f"micro-batch {inp.micro_batch_tokens} tok x GA {inp.gradient_accumulation_steps}"
        + (f" · context parallel {inp.context_parallel}" if inp.context_parallel > 1 else "")
        + (f" · expert parallel {inp.expert_parallel}" if inp.expert_parallel > 1 else ""),
        *_memory_lines(plan),
        f"Verdict {plan.verdict.upper() if plan.fits is False else plan.verdict}",
    ]
    per = "GPU" if inp.device == "gpu" else "process"
    lines += [f"  try: {s.text} -> {s.total_gib:.1f} GiB/{per}" for s in plan.suggestions]
    if plan.fits is False and not plan.suggestions:
        lines.append(f"  no single change found that fits (up to {MAX_SUGGESTED_NODES} nodes)")
    lines += _time_lines(plan)
    lines += _expert_lines(plan)
    lines += [f"Warning {w}" for w in plan.warnings]
    return "\n".join(lines)


def _expert_lines(plan: Plan) -> list[str]:
    """A mixture-of-experts model: its expert-parallel degrees ranked (fits first, then tokens/s)."""
    if len(plan.experts) < 2:
        return []
    rows = [f"EP {o.expert_parallel} ({o.experts_per_gpu} experts/GPU"
            + ("" if o.fits else ", does not fit") + ")"
            + (f" {o.tokens_per_s:,.0f} tok/s" if o.tokens_per_s else "") for o in plan.experts]
    best = plan.experts[0].expert_parallel
    advice = f" -> --expert_parallel {best}" if best != plan.input.expert_parallel and best > 1 else ""
    return [f"Experts {' > '.join(rows)}{advice}"]


def suggestion_flags(suggestion: Suggestion) -> str:
    """The command-line flags that apply a planner suggestion."""
    flags = {
        "nodes": lambda v: f"--nodes {v}", "strategy": lambda v: f"--strategy {v}",
        "gradient_checkpointing": lambda v: f"--gradient_checkpointing {str(v).lower()}",
        "checkpoint_layers": lambda v: f"--set train.checkpoint_layers={v if isinstance(v, int) else repr(v)}",
        "micro_batch_tokens": lambda v: f"--set data.tokens_per_micro_batch={v}",
        "gradient_accumulation_steps": lambda v: f"--gradient_accumulation_steps {v}",
        "cpu_offload": lambda v: f"--set profile.cpu_offload={str(v).lower()}", "lora": lambda v: "--lora",
        "quant": lambda v: "--qlora", "context_parallel": lambda v: f"--context_parallel {v}",
        "expert_parallel": lambda v: f"--expert_parallel {v}",
    }
    change = suggestion.change
    if change.get("quant", "none") != "none":  # --qlora is --lora with the quantized base
        change = {key: value for key, value in change.items() if key != "lora"}
    return " ".join(flags[key](value) for key, value in change.items() if key in flags)
