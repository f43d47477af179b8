"""Mixture-of-experts LoRA on ONE GPU (issue #65): the Qwen3-30B-A3B shape (random weights, bf16 base) against
TRL's SFTTrainer + PEFT on the same documents, then the gpt-oss-20b shape trained by ours alone.

    python -m bench.suites.gpu_moe_lora --results bench/results/h200    # one H200 (the 30B bf16 base is 61 GB)
    python -m bench.suites.gpu_moe_lora --cpu-smoke --out /tmp/moe      # tiny shapes on CPU: proves it runs

Phases, in one call: (1) one layer's experts, forward + backward, per implementation (bench/kernels/
gpu_moe_experts.py: transformers' loop, its grouped_mm, ours; PEFT's folded expert LoRA against ours), which
says why the peer runs `grouped_mm` and we run our grouped GEMMs; (2) --repeat runs a side, alternating from the
peer (bench/report/distribution.py), LoRA r 16 with the SAME targets on both sides: q/k/v/o and the experts'
fused weights (PEFT reaches those through `target_parameters`; ours adapts them inside the grouped GEMMs,
train/moe/hf.py). The peer as a user tunes it for speed (bench/peers/peer_trl_moe.py): BFD packing, padding-
free rows, flex_attention, Liger, fused AdamW, transformers' fastest experts implementation. Both sides with
activation checkpointing (--no-checkpointing to drop it): without, the peer's folded expert weights are kept
for backward, a full copy of every layer's experts (58 GB at this shape). MFU counts the active parameters
(contract/shape.py: the top-k experts a token passes through). (3) the gpt-oss-20b shape, LoRA on the same
targets, trained by ours (its attention with sinks as transformers defines it; the peer is not run there).
Prints a short table last; with --results writes moelora-<shape>.json through bench/report/results_io.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common.processes import TIMED_OUT, run_logged
from bench.common.synthetic import document_lengths, write_token_jsonl
from bench.report import distribution
from bench.report.results_io import WARMUP_STEPS, throughput_numbers, write_result
from bench.suites.gpu_single import device_peak, kernels_in_log, steady_state, windows, write_train_toml
from contract.shape import LORA_TARGETS, ModelShape

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = int(os.environ.get("BENCH_RUN_TIMEOUT_S", "420"))
# Public config.json values (Qwen/Qwen3-30B-A3B, openai/gpt-oss-20b). moe_intermediate_size (768) is left to
# Qwen3MoeConfig's default, which is that value: model.arch takes it once contract/shape.py knows the key.
QWEN3_30B_A3B = dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, rope_theta=1e6,
                     max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     router_aux_loss_coef=0.001)
GPT_OSS_20B = dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                   num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                   num_local_experts=32, num_experts_per_tok=4, sliding_window=128, rope_theta=150000,
                   max_position_embeddings=131072, tie_word_embeddings=False, router_aux_loss_coef=0.9)
TINY_MOE = dict(QWEN3_30B_A3B, vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                num_experts_per_tok=2, max_position_embeddings=4096)
TINY_GPT_OSS = dict(GPT_OSS_20B, vocab_size=2048, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                    num_experts_per_tok=2, sliding_window=32, max_position_embeddings=4096)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj"]
RANK = 16


def adapters_per_token(arch: dict, targets: list[str]) -> int:
    """The LoRA parameters a token passes through (MFU's N_lora): contract/shape.py's count."""
    shape = ModelShape.from_arch(arch)
    active = getattr(shape, "active_lora_params", None)  # the MoE-aware count (contract/shape.py, `shapes` work)
    return active(RANK, targets) if active else shape.lora_params(RANK, [t for t in targets if t in LORA_TARGETS])


def ours_overrides(arch: dict, steps: int, checkpointing: bool) -> dict[str, dict[str, Any]]:
    return {"model": {"arch": arch},
            "train": {"compile": False, "gradient_checkpointing": checkpointing, "max_steps": steps},
            "lora": {"enabled": True, "r": RANK, "alpha": 2 * RANK, "dropout": 0.0, "target_modules": TARGETS}}


def run_ours(name: str, out: Path, data: Path, arch: dict, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a run left by an earlier call would be resumed and its metrics read
    toml = write_train_toml(run_dir, data, arch, args.budget,
                            ours_overrides(arch, args.steps, not args.no_checkpointing))
    log = run_dir / "train.log"
    code = run_logged([sys.executable, "-m", "train", "--config", str(toml)], log, RUN_TIMEOUT_S, dict(os.environ))
    if code != 0:
        print(log.read_text()[-3000:])
        return {"path": name, "error": f"timeout {RUN_TIMEOUT_S} s" if code == TIMED_OUT else f"exit {code}"}
    metrics = run_dir / "metrics.jsonl"
    return {"path": name, **steady_state(metrics), **kernels_in_log(log.read_text()), "windows": windows(metrics)}


def run_peer(out: Path, data: Path, arch: dict, args: argparse.Namespace) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)  # nothing of an earlier call's run
    out.mkdir(parents=True, exist_ok=True)
    (out / "arch.json").write_text(json.dumps(arch))
    command = [sys.executable, "-m", "bench.peers.peer_trl_moe", "--data", str(data), "--arch", str(out / "arch.json"),
               "--targets", ",".join(TARGETS), "--max-length", str(args.budget), "--max-steps", str(args.steps),
               "--out", str(out / "trl")] + ([] if args.no_checkpointing else ["--gradient-checkpointing"]) \
        + (["--no-liger"] if args.peer_no_liger else [])
    stdout, stderr = out / "peer.out", out / "peer.err"
    code = run_logged(command, stdout, RUN_TIMEOUT_S, dict(os.environ), errors=stderr)
    if code != 0:
        print(stderr.read_text()[-3000:])
        return {"path": "peer-trl-moe-lora", "error": f"timeout {RUN_TIMEOUT_S} s" if code == TIMED_OUT else f"exit {code}"}
    return json.loads(stdout.read_text().strip().splitlines()[-1])


def with_rates(r: dict[str, Any], arch: dict, lengths: list[int], peak: float | None) -> dict[str, Any]:
    if "error" not in r:
        adapters = adapters_per_token(arch, TARGETS)
        r.update(lora_params=adapters, **throughput_numbers(arch, lengths, r["real_tokens_per_s"], 1, peak, adapters))
    print(json.dumps({k: v for k, v in r.items() if k not in ("windows", "step_seconds")}), flush=True)
    return r


def layer_table(cpu: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.kernels.gpu_moe_experts", "--json"] + (["--cpu-smoke"] if cpu else [])
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=8192, help="packed tokens per step (one micro-batch) a side")
    parser.add_argument("--steps", type=int, default=WARMUP_STEPS + 8, help="optimizer steps a run (warm-up included)")
    parser.add_argument("--docs", type=int, default=0, help="documents (default: enough for --steps)")
    parser.add_argument("--repeat", type=int, default=distribution.RUNS_PER_SIDE)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--no-gpt-oss", action="store_true")
    parser.add_argument("--peer-no-liger", action="store_true", help="the peer without Liger (where it cannot patch "
                        "this transformers' Qwen3-MoE: the peer's error in a first call says so)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-moe-lora"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    if args.cpu_smoke:
        os.environ["BENCH_CPU"] = "1"
        args.budget, args.steps, args.repeat = 512, WARMUP_STEPS + 2, 1
    arch, gpt_oss = (TINY_MOE, TINY_GPT_OSS) if args.cpu_smoke else (QWEN3_30B_A3B, GPT_OSS_20B)
    lengths = document_lengths(args.docs or 16 * args.steps * args.budget // 800, args.budget)
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, lengths, arch["vocab_size"])
    gpu, peak = device_peak()
    base = {"shape": "tiny-moe" if args.cpu_smoke else "qwen3-30b-a3b", "arch": arch, "budget": args.budget,
            "steps": args.steps, "docs": len(lengths), "total_real_tokens": sum(lengths), "gpu": gpu, "gpu_count": 1,
            "peak_flops": peak, "lora_r": RANK, "lora_targets": TARGETS, "layer": layer_table(args.cpu_smoke)}
    path = args.results / f"moelora-{base['shape']}.json" if args.results else None

    def written(fields: dict[str, Any]) -> None:  # after every run: a call cut off by its limit keeps what landed
        if path:
            write_result(path, {**base, **fields})

    record = {**base, **distribution.compare(
        args.repeat, lambda i: with_rates(run_peer(args.out / f"peer-{i}", data, arch, args), arch, lengths, peak),
        lambda i: with_rates(run_ours("ours-moe-lora", args.out / f"ours-{i}", data, arch, args), arch, lengths, peak),
        {"path": "ours-moe-lora", "gradient_checkpointing": not args.no_checkpointing},
        {"path": "peer-trl-moe-lora", "gradient_checkpointing": not args.no_checkpointing}, written)}
    if not args.no_gpt_oss:
        data_oss = args.out / "docs-gpt-oss.jsonl"
        write_token_jsonl(data_oss, lengths, gpt_oss["vocab_size"])
        record["gpt_oss"] = with_rates(run_ours("ours-gpt-oss-lora", args.out / "gpt-oss", data_oss, gpt_oss, args),
                                       gpt_oss, lengths, peak)
        written({k: v for k, v in record.items() if k not in base})
    print_table(record)


def print_table(record: dict[str, Any]) -> None:
    print(f"\n{record['gpu']}, {record['shape']}: one layer's experts ({record['layer'].get('tokens')} tokens), fwd+bwd")
    print("| experts | ms |\n|---|---|")
    for row in record["layer"].get("rows", []):
        print(f"| {row['row']} | {row['ms']:.2f} |" if "ms" in row else f"| {row['row']} | {row['error'][:80]} |")
    print(f"\nLoRA r {RANK} on {', '.join(TARGETS)}; {record['budget']} tokens a step, {record['steps']} steps, "
          f"{WARMUP_STEPS} warm-up steps skipped")
    print("| side | runs | median real tokens/s | MFU (active params) | peak GiB |\n|---|---|---|---|---|")
    sides = [(name, side["runs"]) for name, side in record["sides"].items()]
    sides += [("gpt-oss-20b ours", [record["gpt_oss"]])] if "gpt_oss" in record else []
    for name, runs in sides:
        done = sorted((r for r in distribution.counted(runs)), key=lambda r: r["real_tokens_per_s"])
        if not done:
            print(f"| {name} | 0 | {runs[-1].get('error', 'no run') if runs else 'no run'} | | |")
            continue
        mid = done[len(done) // 2]
        mfu = f"{mid['mfu'] * 100:.1f}%" if mid.get("mfu") is not None else "n/a"
        print(f"| {name} | {len(done)} | {mid['real_tokens_per_s']:,.0f} | {mfu} | {mid.get('peak_mem_gib') or 0:.1f} |")
    if record["ratio_median"] is not None:
        print(f"\nours / peer, real tokens/s: {distribution.ratio_cell(record)}")


if __name__ == "__main__":
    main()
