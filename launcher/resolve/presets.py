"""Model presets and `--model` resolution (preset name, local directory, or HF id in the local cache).

Architecture numbers are config.json facts under Hugging Face's key names (model_type, num_experts,
layer_types, ...): contract/shape.py reads them for the planner and train's MFU. The presets' numbers are
copied from each model's public config.json (no weights); tests/launcher/test_shape_meta.py builds each on
the meta device with transformers' own class and checks the planner's parameter count against it.
Never touches the network: an HF id that is not a preset must already be in the HF cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.schema import ConfigError, closest
from contract.families import text_config
from contract.shape import KNOWN_ARCH_KEYS, ModelShape

ARCH_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
)


@dataclass(frozen=True)
class Preset:
    name: str
    hf_id: str  # "" = random init from `arch` (tiny)
    arch: dict[str, Any]
    layer_class: str = "LlamaDecoderLayer"  # decoder layer FSDP wraps
    train_defaults: dict[str, Any] = field(default_factory=dict)  # [train] keys the preset suggests

    @property
    def num_params(self) -> int:
        """Every parameter of the model (contract/shape.py: all experts, biases, norms; tied embeddings once)."""
        return ModelShape.from_arch(self.arch).total_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (top-k routed experts); = num_params for a dense model."""
        return ModelShape.from_arch(self.arch).active_params


def _arch(layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, ctx: int, tied: bool) -> dict[str, Any]:
    return dict(zip(ARCH_KEYS, (layers, hidden, heads, kv, inter, vocab, tied, ctx)))


def _hf(model_type: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, ctx: int,
        tied: bool, **extra: Any) -> dict[str, Any]:
    """A config.json's architecture facts (the keys contract/shape.py reads)."""
    return {"model_type": model_type, **_arch(layers, hidden, heads, kv, inter, vocab, ctx, tied), **extra}


def _alternating(layers: int, every: int) -> list[str]:
    """layer_types with a full-attention layer every `every`-th, sliding-window layers between."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]


def _llama2(ctx_defaults: dict[str, Any], **kw: Any) -> Preset:
    return Preset(**kw, train_defaults={"model_max_length": 4096, **ctx_defaults})


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("tiny", "", _arch(2, 64, 4, 2, 128, 512, 2048, False),
               train_defaults={"model_max_length": 256, "learning_rate": 1e-3, "per_device_train_batch_size": 2,
                               "gradient_checkpointing": False, "save_steps": 20, "logging_steps": 1}),
        _llama2({}, name="llama-7b", hf_id="meta-llama/Llama-2-7b-hf",
                arch=_arch(32, 4096, 32, 32, 11008, 32000, 4096, False)),
        _llama2({}, name="llama-13b", hf_id="meta-llama/Llama-2-13b-hf",
                arch=_arch(40, 5120, 40, 40, 13824, 32000, 4096, False)),
        _llama2({"learning_rate": 1e-5}, name="llama-70b", hf_id="meta-llama/Llama-2-70b-hf",
                arch=_arch(80, 8192, 64, 8, 28672, 32000, 4096, False)),
        Preset("llama3-8b", "meta-llama/Meta-Llama-3-8B", _arch(32, 4096, 32, 8, 14336, 128256, 8192, False),
               train_defaults={"model_max_length": 8192}),
        Preset("llama3-70b", "meta-llama/Meta-Llama-3-70B", _arch(80, 8192, 64, 8, 28672, 128256, 8192, False),
               train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("llama3.2-1b", "meta-llama/Llama-3.2-1B", _arch(16, 2048, 32, 8, 8192, 128256, 131072, True),
               train_defaults={"model_max_length": 8192, "per_device_train_batch_size": 8}),
        Preset("mistral-7b", "mistralai/Mistral-7B-v0.1",
               _hf("mistral", 32, 4096, 32, 8, 14336, 32000, 32768, False, sliding_window=4096),
               layer_class="MistralDecoderLayer", train_defaults={"model_max_length": 8192}),
        Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B", _hf("qwen2", 28, 3584, 28, 4, 18944, 152064, 131072, False),
               layer_class="Qwen2DecoderLayer", train_defaults={"model_max_length": 8192}),
        # What people fine-tune now; config.json facts of each hf id (no weights).
        Preset("llama3.1-8b", "meta-llama/Llama-3.1-8B",
               _hf("llama", 32, 4096, 32, 8, 14336, 128256, 131072, False),
               train_defaults={"model_max_length": 8192}),
        Preset("llama3.3-70b", "meta-llama/Llama-3.3-70B-Instruct",
               _hf("llama", 80, 8192, 64, 8, 28672, 128256, 131072, False),
               train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("qwen3-8b", "Qwen/Qwen3-8B", _hf("qwen3", 36, 4096, 32, 8, 12288, 151936, 40960, False, head_dim=128),
               layer_class="Qwen3DecoderLayer", train_defaults={"model_max_length": 8192}),
        Preset("qwen3-32b", "Qwen/Qwen3-32B", _hf("qwen3", 64, 5120, 64, 8, 25600, 151936, 40960, False, head_dim=128),
               layer_class="Qwen3DecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
               _hf("qwen3_moe", 48, 2048, 32, 4, 6144, 151936, 40960, False, head_dim=128, num_experts=128,
                   num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[]),
               layer_class="Qwen3MoeDecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B",
               _hf("qwen3_moe", 94, 4096, 64, 4, 12288, 151936, 40960, False, head_dim=128, num_experts=128,
                   num_experts_per_tok=8, moe_intermediate_size=1536, decoder_sparse_step=1, mlp_only_layers=[]),
               layer_class="Qwen3MoeDecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("gpt-oss-20b", "openai/gpt-oss-20b",
               _hf("gpt_oss", 24, 2880, 64, 8, 2880, 201088, 131072, False, head_dim=64, num_local_experts=32,
                   num_experts_per_tok=4, sliding_window=128, attention_bias=True, layer_types=_alternating(24, 2)),
               layer_class="GptOssDecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        Preset("gpt-oss-120b", "openai/gpt-oss-120b",
               _hf("gpt_oss", 36, 2880, 64, 8, 2880, 201088, 131072, False, head_dim=64, num_local_experts=128,
                   num_experts_per_tok=4, sliding_window=128, attention_bias=True, layer_types=_alternating(36, 2)),
               layer_class="GptOssDecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
        # The language model of the multimodal checkpoint (its text_config; vocab_size is transformers'
        # Gemma3TextConfig default, which the checkpoint's config.json leaves unset).
        Preset("gemma3-27b", "google/gemma-3-27b-pt",
               _hf("gemma3_text", 62, 5376, 32, 16, 21504, 262208, 131072, True, head_dim=128, sliding_window=1024,
                   query_pre_attn_scalar=168, layer_types=_alternating(62, 6)),
               layer_class="Gemma3DecoderLayer", train_defaults={"model_max_length": 8192, "learning_rate": 1e-5}),
    ]
}


def _layer_class(config: dict[str, Any]) -> str:
    """'LlamaForCausalLM' -> 'LlamaDecoderLayer' (the naming every HF decoder-only model follows;
    'Gemma3ForConditionalGeneration' -> 'Gemma3DecoderLayer')."""
    architectures = config.get("architectures") or ["LlamaForCausalLM"]
    return architectures[0].replace("ForCausalLM", "DecoderLayer").replace("ForConditionalGeneration", "DecoderLayer")


def preset_from_config_json(path: Path, name: str, hf_id: str) -> Preset:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"--model {name}: cannot read {path}: {err}") from None
    text = text_config(config)
    missing = [k for k in ARCH_KEYS if k not in text and k not in ("num_key_value_heads", "tie_word_embeddings")]
    if missing:
        raise ConfigError(f"--model {name}: {path} lacks {', '.join(missing)} (not a decoder-only LM config?)")
    arch = {k: text[k] for k in KNOWN_ARCH_KEYS if k in text}
    arch["num_key_value_heads"] = arch.get("num_key_value_heads") or arch["num_attention_heads"]
    try:
        shape = ModelShape.from_arch(arch)
    except ConfigError as err:
        raise ConfigError(f"--model {name}: {path}: {err}") from None
    arch["tie_word_embeddings"] = shape.tied
    return Preset(name, hf_id, arch, layer_class=_layer_class(config))


def cached_hf_config(hf_id: str, hf_home: str = "") -> Path | None:
    """config.json of the newest cached HF snapshot (in hf_home's hub cache, else this environment's);
    None when not downloaded."""
    hub = Path(hf_home) / "hub" if hf_home else \
        Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = hub.expanduser() / f"models--{hf_id.replace('/', '--')}" / "snapshots"
    candidates = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return candidates[0] if candidates else None


def model_dir(value: str, hf_home: str = "") -> Path | None:
    """The folder a model.path (or model.tokenizer) names: a local directory, else an HF id's newest cached
    snapshot (cached_hf_config); None when neither is here."""
    if Path(value).expanduser().is_dir():
        return Path(value).expanduser()
    config = cached_hf_config(value, hf_home)
    return config.parent if config is not None else None


def resolve_model(spec: str) -> Preset:
    """Preset name, local model directory (config.json), or an HF id already in the HF cache."""
    if spec in PRESETS:
        return PRESETS[spec]
    local = Path(spec).expanduser()
    if local.is_dir():
        config = local / "config.json"
        if not config.is_file():
            raise ConfigError(f"--model {spec}: directory has no config.json")
        directory = local.resolve()
        return preset_from_config_json(config, directory.name, str(directory))
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        for preset in PRESETS.values():
            if preset.hf_id == spec:
                return preset
        cached = cached_hf_config(spec)
        if cached is not None:
            return preset_from_config_json(cached, spec.split("/")[1], spec)
        raise ConfigError(f"--model {spec}: not a preset and not in the HF cache; download it first "
                          "(huggingface-cli download) or pass a local directory")
    raise ConfigError(f"--model {spec}: unknown model{closest(spec, PRESETS)}; presets: {', '.join(PRESETS)}")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n > 1e8 else f"{n / 1e6:.2f}M"


def format_presets() -> str:
    """The `sft-launch models` table (params: every parameter; active: those one token uses)."""
    rows = [("name", "hf id", "params", "active", "layers", "hidden", "heads/kv", "ffn", "experts", "vocab", "tied",
             "layer class")]
    for p in PRESETS.values():
        a, shape = p.arch, ModelShape.from_arch(p.arch)
        experts = f"{shape.experts_per_token}/{shape.experts}x{shape.expert_intermediate}" if shape.is_moe else "-"
        rows.append((p.name, p.hf_id or "(random init)", _count(shape.total_params), _count(shape.active_params),
                     str(a["num_hidden_layers"]), str(a["hidden_size"]),
                     f"{a['num_attention_heads']}/{a['num_key_value_heads']}", str(a["intermediate_size"]), experts,
                     str(a["vocab_size"]), "yes" if shape.tied else "no", p.layer_class))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
