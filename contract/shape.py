"""A decoder-only model's shape, read from its config.json (an HF config dict): parameter counts, the
FLOPs per trained token that MFU is measured against, and what LoRA adapts. Pure Python: the planner on
the login node and train.observe.metrics on the GPU count the same N the same way.

Families (`model_type`): llama, mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, gpt_oss, gemma3_text (a
multimodal `gemma3` config is read through its `text_config`: the language model is what is planned).
What is counted is what transformers builds (tests/launcher/test_shape_meta.py builds every preset and
tiny config on the meta device and compares exactly): q/k/v/o and their biases where the family has
them, QK-norm weights, attention sinks, the norms (two per layer, four for Gemma 3), dense SwiGLU MLPs,
every routed expert (the fused [E, ., .] `experts.gate_up_proj` / `experts.down_proj` and gpt-oss's
expert biases), routers (and gpt-oss's router bias), shared experts and their gate, the embedding, the
final norm, and the lm_head unless it is tied to the embedding (then counted once).

Model FLOPs per trained token (forward + backward = 3 × forward, 2 FLOPs per multiply-add)::

    flops_per_token = 6·N + attention                 full fine-tuning
    flops_per_token = 4·N + 6·N_lora + attention      LoRA / QLoRA: the frozen weights get no weight
                                                      gradients (forward + input gradients only); the
                                                      adapters a token passes through, N_lora, are trained

* N — the matmul weights one token passes through (the *active* parameters): per layer q, k, v, o, and
  the dense MLP's three projections, or for a mixture-of-experts layer the router plus the top-k routed
  experts (num_experts_per_tok of num_experts) plus any shared expert and its gate; plus the lm_head
  (counted whether or not it is tied, since it is a real matmul). The embedding lookup is a gather and is
  excluded; so are norms, biases and sinks (no matmul). So MFU of a MoE model is counted against its
  active parameters (Qwen3-30B-A3B: ~3.3B of 30.5B), as its FLOPs are: the experts a token is not routed
  to do no work for it. Memory, by contrast, holds every expert (`total_params`).
* attention — scores and weighted values: 2 matmuls × 2 FLOPs × a per attended (query, key) pair, × 3
  for backward = 12·a per pair; a = heads × head_dim (= hidden size for Llama, not for models with an
  explicit `head_dim`). A causal full-attention layer attends s̄/2 keys per token, so 6·a·s̄ a layer; a
  sliding-window layer (window w, Mistral/gpt-oss/Gemma 3 `layer_types`) attends s̄/2 while s̄ ≤ w and
  w − w²/(2·s̄) past it (a document of length s̄: the first w tokens see their prefix, the rest w keys).
* s̄ — the mean *document* length attended, token-weighted (Σ nᵢ² / Σ nᵢ over the documents),
  because packed documents do not attend to each other.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from contract.families import FAMILIES, Family, layer_windows, moe_layers, text_config
from contract.schema import ConfigError

REQUIRED_ARCH_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
)
# LlamaConfig keys (and the family's) the presets and users set; a key not among them that is close to
# one is a typo that transformers would take silently as an extra attribute (`hiden_size = 128`).
KNOWN_ARCH_KEYS = (*REQUIRED_ARCH_KEYS, "num_key_value_heads", "head_dim", "tie_word_embeddings",
                   "max_position_embeddings", "rope_theta", "rope_scaling", "rms_norm_eps", "initializer_range",
                   "hidden_act", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
                   "model_type", "architectures", "layer_types", "num_experts", "num_local_experts",
                   "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                   "decoder_sparse_step", "mlp_only_layers", "max_window_layers", "query_pre_attn_scalar",
                   "sliding_window_pattern", "rope_parameters", "hidden_activation", "norm_topk_prob")


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
class Linear:
    """One adapted (or quantized) weight kind: `count` instances in the model of (in, out) each; an expert
    target's instances are its experts (count = MoE layers × experts)."""

    name: str
    n_in: int
    n_out: int
    count: int


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only model's architecture numbers and derived parameter counts (module docstring)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int  # the dense MLP's width (gpt-oss: each expert's)
    vocab: int
    tied: bool
    head_dim: int
    family: Family = FAMILIES["llama"]
    attention_bias: bool = False  # config `attention_bias` (families whose biases it decides)
    mlp_bias: bool = False
    experts: int = 0  # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # Qwen2-MoE's shared expert (0 = none)
    moe_layers: tuple[bool, ...] = ()  # per layer: routed experts (True) or the dense MLP
    windows: tuple[int | None, ...] = ()  # per layer: sliding window, None = full attention

    @classmethod
    def from_arch(cls, config: dict[str, Any]) -> ModelShape:
        """From a config.json dict (or a preset's arch, or `model.config.to_dict()` on the GPU)."""
        arch = text_config(config)
        model_type = arch.get("model_type") or "llama"
        if model_type not in FAMILIES:
            raise ConfigError(f"arch.model_type: {model_type!r} is not a family the planner counts; known: "
                              f"{', '.join(FAMILIES)}", "arch.model_type")
        family = FAMILIES[model_type]
        for key in REQUIRED_ARCH_KEYS:
            _positive_int(arch, key)
        heads, layers = arch["num_attention_heads"], arch["num_hidden_layers"]
        if arch.get("head_dim") is not None:
            head_dim = _positive_int(arch, "head_dim")
        elif arch["hidden_size"] % heads:
            raise ConfigError("arch.hidden_size: must be divisible by num_attention_heads (or set head_dim)",
                              "arch.hidden_size")
        else:
            head_dim = arch["hidden_size"] // heads
        experts = int(arch.get("num_experts") or arch.get("num_local_experts") or 0) if family.moe else 0
        expert_width = arch.get("moe_intermediate_size") or arch["intermediate_size"]
        tied = arch.get("tie_word_embeddings")
        bias = arch.get("attention_bias")
        return cls(
            layers=layers, hidden=arch["hidden_size"], heads=heads,
            kv_heads=int(arch.get("num_key_value_heads") or heads), intermediate=arch["intermediate_size"],
            vocab=arch["vocab_size"], tied=family.tied_default if tied is None else bool(tied), head_dim=head_dim,
            family=family, attention_bias=family.attention_bias_default if bias is None else bool(bias),
            mlp_bias=bool(arch.get("mlp_bias")), experts=experts,
            experts_per_token=int(arch.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate=int(expert_width) if experts else 0,
            shared_intermediate=int(arch.get("shared_expert_intermediate_size") or 0) if experts else 0,
            moe_layers=moe_layers(arch, layers, experts), windows=layer_windows(arch, family, layers),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def moe_layer_count(self) -> int:
        return sum(self.moe_layers)

    # -- parameters ---------------------------------------------------------------------------------------
    def _attention_params(self) -> tuple[int, int]:
        """(matmul weights, everything else) of one attention block."""
        d, q, kv = self.hidden, self.q_dim, self.kv_dim
        qkv_bias = self.attention_bias if self.family.qkv_bias is None else self.family.qkv_bias
        o_bias = self.attention_bias if self.family.o_bias is None else self.family.o_bias
        extra = (q + 2 * kv) * qkv_bias + d * o_bias + 2 * self.head_dim * self.family.qk_norm
        return 2 * d * q + 2 * d * kv, extra + self.heads * self.family.sinks

    def _dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate + (2 * self.intermediate + self.hidden) * self.mlp_bias

    def _expert_params(self) -> int:
        """One routed expert: gate, up, down (+ gpt-oss's biases)."""
        d, i = self.hidden, self.expert_intermediate
        return 3 * d * i + (2 * i + d) * self.family.expert_bias

    def _router_and_shared(self) -> tuple[int, int]:
        """(matmul weights, biases) of one MoE layer's router, shared expert and its gate."""
        d = self.hidden
        shared = 3 * d * self.shared_intermediate + d if self.shared_intermediate else 0
        return d * self.experts + shared, self.experts * self.family.router_bias

    def _layer_params(self, moe: bool, ep: int = 1) -> int:
        matmul, extra = self._attention_params()
        own = matmul + extra + self.family.norms_per_layer * self.hidden
        if not moe:
            return own + self._dense_mlp_params()
        router, router_bias = self._router_and_shared()
        return own + router + router_bias + -(-self.experts // ep) * self._expert_params()

    @property
    def layer_params(self) -> int:
        """The largest decoder layer's parameters (what FSDP all-gathers at once), every expert included."""
        return self.gathered_layer_params()

    def gathered_layer_params(self, ep: int = 1) -> int:
        """The largest layer as one rank gathers it with its experts split over `ep` expert-parallel ranks."""
        return max(self._layer_params(moe, ep) for moe in set(self.moe_layers or (False,)))

    @property
    def expert_params(self) -> int:
        """Every routed expert's parameters in the model (what expert parallelism divides)."""
        return self.moe_layer_count * self.experts * self._expert_params()

    @property
    def total_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        layers = sum(self._layer_params(moe) for moe in self.moe_layers)
        return layers + embeddings + self.hidden

    def params_per_rank(self, world: int, ep: int = 1) -> int:
        """Parameters one of `world` ranks holds: the experts split over `ep` expert-parallel ranks and
        sharded over the world // ep ranks that share them, everything else sharded over the world (FSDP).
        With ep = 1 (every expert resident and sharded, today's only layout) that is total / world."""
        dense = self.total_params - self.expert_params
        return -(-dense // world) + -(-self.expert_params // (ep * (world // ep)))

    @property
    def active_params(self) -> int:
        """Parameters one token uses: the layers with top-k routed experts, the embedding row, lm_head."""
        per_layer = self._layer_params(False) - self._dense_mlp_params()  # attention + norms
        moe_active = per_layer + sum(self._router_and_shared()) + self.experts_per_token * self._expert_params()
        layers = sum(moe_active if moe else self._layer_params(False) for moe in self.moe_layers)
        return layers + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def _layer_matmul(self, moe: bool, routed: int) -> int:
        attention = self._attention_params()[0]
        if not moe:
            return attention + 3 * self.hidden * self.intermediate
        return attention + self._router_and_shared()[0] + routed * 3 * self.hidden * self.expert_intermediate

    @property
    def matmul_params(self) -> int:
        """N of the MFU formula: the matmul weights a token passes through (top-k experts) incl. lm_head."""
        layers = sum(self._layer_matmul(moe, self.experts_per_token) for moe in self.moe_layers)
        return layers + self.vocab * self.hidden

    @property
    def all_matmul_params(self) -> int:
        """Every matmul weight, every expert included (what an autocast cache of bf16 copies holds)."""
        return sum(self._layer_matmul(moe, self.experts) for moe in self.moe_layers) + self.vocab * self.hidden

    @property
    def mlp_width(self) -> int:
        """The MLP's intermediate width per token in the widest layer: I dense, k·I_expert (+ shared) MoE."""
        moe = self.experts_per_token * self.expert_intermediate + self.shared_intermediate
        return max(moe if is_moe else self.intermediate for is_moe in (self.moe_layers or (False,)))

    # -- FLOPs -------------------------------------------------------------------------------------------
    def attended_keys(self, mean_doc_len: float) -> float:
        """Keys a token attends summed over the layers (causal; windows per layer, module docstring)."""
        s = mean_doc_len
        return sum(s / 2 if w is None or s <= w else w - w * w / (2 * s) for w in (self.windows or
                                                                                     (None,) * self.layers))

    def attention_flops_per_token(self, mean_doc_len: float) -> float:
        """12·a per attended (query, key) pair, forward and backward."""
        return 12 * self.q_dim * self.attended_keys(mean_doc_len)

    def flops_per_token(self, mean_doc_len: float, lora_params: int | None = None) -> float:
        """6·N + attention; with LoRA (`lora_params`: the adapters a token passes through,
        `active_lora_params`) 4·N + 6·N_lora + attention. The one count of model FLOPs:
        train.observe.metrics, the planner and bench/ all call it."""
        weights = 6 * self.matmul_params if lora_params is None else 4 * self.matmul_params + 6 * lora_params
        return float(weights + self.attention_flops_per_token(mean_doc_len))

    # -- LoRA / QLoRA targets ----------------------------------------------------------------------------
    def linears(self, targets: list[str]) -> list[Linear]:
        """Every instance of the named weights in the model. A dense name (gate_proj) counts the dense MLPs
        and any shared expert; an expert name counts each routed expert of each MoE layer. A name the model
        has nowhere is an error (a LoRA that adapts nothing of it)."""
        d, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        dense, moe = self.layers - self.moe_layer_count, self.moe_layer_count
        shared = moe if self.shared_intermediate else 0
        si, ei, e = self.shared_intermediate, self.expert_intermediate, self.experts * moe
        table = {
            "q_proj": [(d, q, self.layers)], "k_proj": [(d, kv, self.layers)], "v_proj": [(d, kv, self.layers)],
            "o_proj": [(q, d, self.layers)],
            "gate_proj": [(d, i, dense), (d, si, shared)], "up_proj": [(d, i, dense), (d, si, shared)],
            "down_proj": [(i, d, dense), (si, d, shared)],
            "experts.gate_up_proj": [(d, 2 * ei, e)], "experts.down_proj": [(ei, d, e)],
            "router": [(d, self.experts, moe)],
        }
        found = []
        for name in targets:
            if name not in table:
                raise ConfigError(f"lora_target_modules: unknown module {name!r}; valid: "
                                  f"{', '.join(VALID_LORA_TARGETS)}", "lora_target_modules")
            found += [Linear(name, n_in, n_out, count) for n_in, n_out, count in table[name] if count]
        if not found:
            raise ConfigError(f"lora_target_modules: this model has none of {', '.join(targets)}",
                              "lora_target_modules")
        return found

    def linear_dims(self, targets: list[str]) -> list[tuple[int, int]]:
        """(in, out) of each kind of named weight (one instance each; `linears` counts them)."""
        return [(lin.n_in, lin.n_out) for lin in self.linears(targets)]

    def nf4_blocker(self, targets: list[str], world: int) -> str | None:
        """Why QLoRA cannot quantize the targeted weights over `world` ranks ("q_proj.weight (64, 64) is not
        ..."); None if every one splits into whole NF4 blocks per rank (nf4_blocker)."""
        for lin in self.linears(targets):
            experts = lin.name.startswith("experts.")
            weight = (self.experts, lin.n_out, lin.n_in) if experts else (lin.n_out, lin.n_in)  # torch: (out, in)
            blocker = nf4_blocker(weight, world)
            if blocker:
                return f"{lin.name}{'' if experts else '.weight'} {blocker}"
        return None

    def lora_params(self, r: int, targets: list[str]) -> int:
        """The adapters' parameters: r x (in + out) per adapted weight (per expert for expert targets)."""
        return sum(lin.count * r * (lin.n_in + lin.n_out) for lin in self.linears(targets))

    def active_lora_params(self, r: int, targets: list[str]) -> int:
        """The adapters one token passes through: an expert adapter only for its top-k experts."""
        share = {n: self.experts_per_token / self.experts for n in EXPERT_LORA_TARGETS[:2]} if self.experts else {}
        return round(sum(lin.count * share.get(lin.name, 1.0) * r * (lin.n_in + lin.n_out)
                         for lin in self.linears(targets)))

    def lora_tensor_sizes(self, r: int, targets: list[str]) -> list[int]:
        """Elements of each adapter tensor: A (r x in) and B (out x r); an expert target's pair per layer is
        [E, r, in] and [E, out, r]."""
        sizes = []
        for lin in self.linears(targets):
            experts = self.experts if lin.name.startswith("experts.") else 1
            sizes += [experts * r * lin.n_in, experts * r * lin.n_out] * (lin.count // experts)
        return sizes

    def parameter_tensor_sizes(self) -> list[int]:
        """Elements of each weight tensor of the model (norms, embeddings, matmuls; biases and sinks are
        left out: far smaller than any bucket)."""
        d, q, kv = self.hidden, self.q_dim, self.kv_dim
        attention = [d * q, d * kv, d * kv, q * d] + [d] * self.family.norms_per_layer
        dense = [self.hidden * self.intermediate] * 3
        moe = [self.experts * d * 2 * self.expert_intermediate, self.experts * self.expert_intermediate * d,
               d * self.experts] + [d * self.shared_intermediate] * (3 if self.shared_intermediate else 0)
        layers = [n for is_moe in self.moe_layers for n in attention + (moe if is_moe else dense)]
        return layers + [self.vocab * d] * (1 if self.tied else 2) + [d]

    def target_params(self, targets: list[str]) -> int:
        """Weights of the targeted linears in the whole model (what QLoRA quantizes)."""
        return sum(lin.count * lin.n_in * lin.n_out for lin in self.linears(targets))
