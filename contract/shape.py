"""A LLaMA-family model's shape (from an HF LlamaConfig-style dict): parameter counts and the
FLOPs per trained token that MFU is measured against. Pure Python: the planner on the login node
and train.observe.metrics on the GPU count the same N the same way.

Model FLOPs per trained token (forward + backward = 3 × forward, 2 FLOPs per multiply-add)::

    flops_per_token = 6·N + 6·L·a·s̄                 full fine-tuning
    flops_per_token = 4·N + 6·N_lora + 6·L·a·s̄      LoRA / QLoRA: the frozen weights get no weight
                                                      gradients (forward + input gradients only); the
                                                      adapters N_lora are trained in full

* N — every matmul weight: per layer q, k, v, o and the three MLP projections, plus the lm_head
  (counted whether or not it is tied to the embedding, since it is a real matmul); the embedding
  lookup is a gather and is excluded. Norm weights are negligible and excluded.
* 6·L·a·s̄ — attention scores and weighted values: 2 matmuls × 2 FLOPs × a per pair of attended
  positions, × 3 for backward, halved because attention is causal (12·L·a·s̄ / 2); a = heads ×
  head_dim (= hidden size for Llama; not for models with an explicit `head_dim`).
* s̄ — the mean *document* length attended, token-weighted (Σ nᵢ² / Σ nᵢ over the documents),
  because packed documents do not attend to each other.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from contract.schema import ConfigError

REQUIRED_ARCH_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
)
# LlamaConfig keys (and the family's) the presets and users set; a key not among them that is close to
# one is a typo that transformers would take silently as an extra attribute (`hiden_size = 128`).
KNOWN_ARCH_KEYS = (*REQUIRED_ARCH_KEYS, "num_key_value_heads", "head_dim", "tie_word_embeddings",
                   "max_position_embeddings", "rope_theta", "rope_scaling", "rms_norm_eps", "initializer_range",
                   "hidden_act", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window")


def misspelt_arch_key(arch: dict[str, Any]) -> tuple[str, str] | None:
    """(key, the known key it resembles) for the first arch key that looks misspelt; None when none does."""
    for key in arch:
        if key not in KNOWN_ARCH_KEYS:
            match = difflib.get_close_matches(key, KNOWN_ARCH_KEYS, n=1, cutoff=0.85)
            if match:
                return key, match[0]
    return None


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Mixture-of-experts targets: the routed experts' fused 3-D weights (transformers 5's [E, ., .]
# `experts.gate_up_proj` and `experts.down_proj`; an adapter per expert, A [E, r, in] and B [E, out, r])
# and the router (Qwen3-MoE's `mlp.gate`, gpt-oss's `mlp.router`).
EXPERT_LORA_TARGETS = ("experts.gate_up_proj", "experts.down_proj", "router")
VALID_LORA_TARGETS = (*LORA_TARGETS, *EXPERT_LORA_TARGETS)
# Tokens per chunk of the fused lm_head + cross-entropy (train/kernels/loss.py): the logits of one chunk exist
# at a time (the planner sizes the loss's memory by it); at 4,096 the lm_head's matmuls run at full
# cuBLAS speed, ~10% faster than in Liger's 1,024-token chunks (bench/gpu_ceilings.py).
FUSED_LOSS_CHUNK_TOKENS = 4096


# QLoRA's NF4 (train/engine/qlora.py): an absmax per 64 weights, the absmaxes double-quantized per 256.
NF4_BLOCK_SIZE = 64
NF4_SCALER_BLOCK_SIZE = 256
NF4_QUANT_UNIT = NF4_BLOCK_SIZE * NF4_SCALER_BLOCK_SIZE  # a quantized weight's element count is a multiple of this


def rope_factor(model_max_length: int, context: int | None) -> int | None:
    """The linear RoPE interpolation factor when training past the model's context (max_position_embeddings):
    ceil(model_max_length / context), as FastChat stretches it; None within the context. train/engine/model.py
    applies it, the plan says it."""
    if not context or model_max_length <= context:
        return None
    return math.ceil(model_max_length / context)


def nf4_blocker(weight_shape: tuple[int, ...], world: int) -> str | None:
    """Why a weight of this (rows, ...) shape cannot be NF4-quantized and sharded over `world` ranks; None
    if it can. FSDP2 cuts dim 0 into `world` row blocks and NF4Tensor cuts its packed buffers the same way,
    so each shard must hold whole double-quantization blocks."""
    numel = math.prod(weight_shape)
    if numel % (NF4_QUANT_UNIT * world) or weight_shape[0] % world:
        return (f"{tuple(weight_shape)} is not a multiple of {NF4_QUANT_UNIT} x {world} ranks elements with rows "
                f"divisible by {world}")
    return None


def _positive_int(arch: dict[str, Any], key: str) -> int:
    value = arch.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"arch.{key}: expected a positive integer, got {value!r}", f"arch.{key}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """LLaMA architecture numbers and derived parameter counts."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int

    @classmethod
    def from_arch(cls, arch: dict[str, Any]) -> ModelShape:
        for key in REQUIRED_ARCH_KEYS:
            _positive_int(arch, key)
        heads = arch["num_attention_heads"]
        if arch.get("head_dim") is not None:
            head_dim = _positive_int(arch, "head_dim")
        elif arch["hidden_size"] % heads:
            raise ConfigError("arch.hidden_size: must be divisible by num_attention_heads (or set head_dim)",
                              "arch.hidden_size")
        else:
            head_dim = arch["hidden_size"] // heads
        return cls(
            layers=arch["num_hidden_layers"], hidden=arch["hidden_size"], heads=heads,
            kv_heads=int(arch.get("num_key_value_heads") or heads), intermediate=arch["intermediate_size"],
            vocab=arch["vocab_size"], tied=bool(arch.get("tie_word_embeddings", False)), head_dim=head_dim,
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """q,o (d x q) + k,v (d x kv) + gate,up,down (3 d I) + two RMSNorm weights."""
        d = self.hidden
        return 2 * d * self.q_dim + 2 * d * self.kv_dim + 3 * d * self.intermediate + 2 * d

    @property
    def total_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params + embeddings + self.hidden

    @property
    def matmul_params(self) -> int:
        """N of the MFU formula: every matmul weight incl. lm_head (tied or not), no embedding lookup."""
        return self.layers * (self.layer_params - 2 * self.hidden) + self.vocab * self.hidden

    def flops_per_token(self, mean_doc_len: float, lora_params: int | None = None) -> float:
        """6·N + 6·L·a·s̄; with LoRA (`lora_params`: the adapters' count) 4·N + 6·N_lora + 6·L·a·s̄.
        The one count of model FLOPs: train.observe.metrics, the planner and bench/ all call it."""
        weights = 6 * self.matmul_params if lora_params is None else 4 * self.matmul_params + 6 * lora_params
        return float(weights + 6 * self.layers * self.q_dim * mean_doc_len)

    def linear_dims(self, targets: list[str]) -> list[tuple[int, int]]:
        """(in, out) of each named linear of one decoder layer."""
        d, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
                "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}
        for name in targets:
            if name not in dims:
                raise ConfigError(f"lora_target_modules: unknown module {name!r}; valid: {', '.join(LORA_TARGETS)}",
                                  "lora_target_modules")
        return [dims[name] for name in targets]

    def nf4_blocker(self, targets: list[str], world: int) -> str | None:
        """Why QLoRA cannot quantize the targeted linears over `world` ranks ("q_proj.weight (64, 64) is not
        ..."); None if every one splits into whole NF4 blocks per rank (nf4_blocker)."""
        for name, (n_in, n_out) in zip(targets, self.linear_dims(targets)):
            blocker = nf4_blocker((n_out, n_in), world)  # torch.nn.Linear's weight is (out, in)
            if blocker:
                return f"{name}.weight {blocker}"
        return None

    def lora_params(self, r: int, targets: list[str]) -> int:
        """r x (in + out) per adapted linear per layer."""
        return self.layers * sum(r * (n_in + n_out) for n_in, n_out in self.linear_dims(targets))

    def target_params(self, targets: list[str]) -> int:
        """Weights of the targeted linears in the whole model (what QLoRA quantizes)."""
        return self.layers * sum(n_in * n_out for n_in, n_out in self.linear_dims(targets))
