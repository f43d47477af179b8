"""Per-GPU activation and logits memory: the terms that scale with a micro-batch's tokens. Pure Python (no torch).

Activations are counted from the tensors autograd saves in `LlamaDecoderLayer` (transformers 5,
flash/SDPA attention, so no T x T matrix); see `layer_activation_bytes_per_token`. The model state
(parameters, gradients, optimizer, master weights) is launcher/plan/memory.py's; launcher/plan/peak.py
adds both up phase by phase.
"""

from __future__ import annotations

from dataclasses import replace

from contract.config import Fp8Linears, checkpointed_layers
from contract.shape import LORA_TARGETS, ModelShape
from launcher.plan.memory import MemoryOptions, adapter_bytes, low_bytes


def layer_activation_bytes_per_token(shape: ModelShape, elem: int, compiled: bool = False,
                                     fused_mlp: bool = False, fp8: Fp8Linears = "") -> int:
    """Bytes autograd keeps per token for one LlamaDecoderLayer without checkpointing (elem = 2 for bf16).

    Eager (`compiled` False) saved tensors, in forward order (d hidden, q = heads x head_dim (= d for
    Llama), kv = kv_heads x head_dim, I intermediate):
      2 x RMSNorm: fp32 copy of the input (saved by pow and by x*rsqrt, 4d) + the normalized
        activation in the input dtype (saved by weight*x, elem*d)             -> 2 (4 + elem) d
      q/k/v_proj input (one shared tensor)                                    -> elem d
      attention kernel: q, k, v after RoPE (RoPE itself saves only cos/sin)   -> elem (q + 2 kv)
      attention output + fp32 log-sum-exp per head                            -> elem q + 4 heads
      o_proj input (the `.contiguous()` re-layout of the output is a copy)    -> elem q
      gate/up_proj input (shared)                                             -> elem d
      SwiGLU: gate out (for SiLU), SiLU out and up out (for the product),
        product (down_proj input)                                             -> 4 elem I
    Residual adds save nothing. For Llama-3-8B in bf16 this is ~204 KiB/token/layer (22d + 4kv + 8I).

    Compiled (train.compile: torch.compile per decoder layer) the AOT partitioner saves a different,
    smaller set: it recomputes the norms' fp32 copies and the SwiGLU product in the backward. Measured
    on CPU (bench/saved_activations.py, torch 2.13: a tiny Llama layer's saved tensors through
    saved_tensors_hooks): the layer input, the q/k/v, o_proj and MLP inputs (elem (3d + q)), the
    attention's q, k, v, output and log-sum-exp, one fp32 rstd per norm (8 B), and gate and up outputs
    plus SiLU(gate) (3 elem I): 148 KiB/token/layer at 8B in bf16 instead of 204. With float8
    linears (train/kernels/float8.py, torchao) the matmul inputs are recomputed too (the norms and the
    float8 casts are one fusible chain): only the layer input, the residual after attention, attention
    and gate/up outputs stay (elem (2d) + attention + 2 elem I). Our float8 linears
    (train/kernels/fp8_linear.py) also keep each matmul input as its transposed float8 copy for the
    weight gradient, 1 byte per element (2d + q + I). K and V are counted at the query width:
    torch <= 2.11's varlen_attn has no enable_gqa, so train/kernels/attention.py expands them to every
    query head before the kernel saves them (FA4 and FA2 take GQA natively: 2 elem (q - kv) less, 3 GiB
    of ~65 at the 8B point below).
    Fused SwiGLU MLP (train/kernels/swiglu.py, eager or compiled): only its input and the gate/up
    pre-activation [T, 2I] are kept (elem d + 2 elem I); the interleaved weight copy it saves is per
    layer, not per token (`fused_mlp_weight_bytes`).
    A mixture-of-experts layer counts I as k·I_expert (+ a shared expert's width), plus `_routing_bytes`
    (the gathered and output copies, the router's fp32 tensors, the sort indices); compiled, the same extra
    is assumed (measured eager only).
    Checked against the 4 x H100 runs (tests/launcher/test_planner_calibration.py, GPU_RUNS): 8B full
    fine-tuning compiled with the fused MLP peaked at 65.7 GiB allocated where the eager count predicted
    ~82; FP8 at 54.7; LoRA on 2 GPUs at 49.9.
    """
    d, q, heads = shape.hidden, shape.q_dim, shape.heads
    routing = _routing_bytes(shape, elem)
    if not compiled:
        norms = 2 * (4 + elem) * d
        attention = elem * d + elem * (q + 2 * shape.kv_dim) + elem * q + 4 * heads + elem * q
        return norms + attention + mlp_bytes_per_token(shape, elem, fused_mlp)
    attention = elem * 3 * q + elem * q + 4 * heads  # q, K and V (query width), output, log-sum-exp
    rstd = 2 * 4
    if fp8:  # layer input and the residual after attention; the bf16 matmul inputs are recomputed
        float8_inputs = 2 * d + q + shape.mlp_width if fp8 == "ours" else 0  # 1-byte transposed copies
        return 2 * elem * d + attention + rstd + 2 * elem * shape.mlp_width + float8_inputs + routing
    inputs = elem * (3 * d + q)  # layer input, q/k/v input, MLP input, o_proj input
    mlp = (2 if fused_mlp else 3) * elem * shape.mlp_width
    return inputs + attention + rstd + mlp + routing


def mlp_bytes_per_token(shape: ModelShape, elem: int, fused_mlp: bool = False) -> int:
    """The eager MLP's (or MoE block's) share of `layer_activation_bytes_per_token`: its input, the SwiGLU
    intermediates at the per-token width, and an MoE block's routing (`_routing_bytes`)."""
    return elem * shape.hidden + (2 if fused_mlp else 4) * elem * shape.mlp_width + _routing_bytes(shape, elem)


def _routing_bytes(shape: ModelShape, elem: int) -> int:
    """A grouped-expert MoE block's saved bytes per token beyond the dense MLP count above (whose per-token
    width is k·I_expert, ModelShape.mlp_width), from the tensors autograd saves in train/moe/experts.py
    `routed_experts` behind Qwen3-MoE's fp32 router (train/moe/router.py), exact on CPU
    (tests/train/test_moe_saved_activations.py):
      the k input rows in expert order (gathered copies, the gate/up input)           -> k elem d
      the expert outputs, saved by the combine's multiply with the routing weights   -> k elem d
      fp32 router: its fp32 copy of the input, saved by its matmul, in place of the
        dense MLP's elem-d input (nothing else saves the block's input)              -> (4 - elem) d
      fp32 router probabilities (softmax output)                                     -> 4 E
      top-k values and ids (4 + 8 B each), their sum (norm_topk_prob, as Qwen3-MoE's presets), the sort
        permutation and its // k (int64 each), the weights in expert order (fp32)    -> 32 k + 4
    Per layer, not per token and not counted: the router's fp32 weight copy (4 E d, 1 MiB at 30B-A3B). gpt-oss's
    router (softmax over its k logits) saves no 4 E probabilities and no sum (over-counted here), and its
    clamped gate saves more than SiLU's (not measured). The combine's fp32 products are transient
    (`moe_combine_bytes`)."""
    if not shape.is_moe:
        return 0
    k, d = shape.experts_per_token, shape.hidden
    router_input = (4 - elem) * d if shape.family.fp32_router else 0
    return 2 * k * elem * d + router_input + 4 * shape.experts + 32 * k + 4


def moe_combine_bytes(shape: ModelShape, tokens: int) -> int:
    """Transient, one MoE layer at a time (forward, recompute and backward alike): `combine_sorted` holds the
    weighted expert outputs and their token-order copy, both fp32 [tokens·k, d] (bf16 times fp32 weights),
    and their fp32 sum [tokens, d] before it is cast back; the backward's gradients of them are as large.
    The forward's is measured on CPU (tests/train/test_moe_saved_activations.py)."""
    return 4 * tokens * (2 * shape.experts_per_token + 1) * shape.hidden if shape.is_moe else 0


def router_logits_bytes(shape: ModelShape, tokens: int) -> int:
    """The fp32 router logits of every MoE layer [tokens, E], which each training forward returns for the
    load-balancing loss (train/moe/router.py RouterLoss, always installed): held past the layers, outside any
    checkpoint, until the loss; its softmax's outputs (as large) are saved for the backward in their place."""
    return 4 * tokens * shape.experts * sum(shape.moe_layers) if shape.is_moe else 0


def fused_mlp_weight_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """The fused MLP stacks gate and up into one interleaved [2I, d] weight per call and saves it for
    the backward (train/kernels/swiglu.py): a per-layer copy (224 MiB at 8B), kept like an activation."""
    return 2 * elem * shape.mlp_width * shape.hidden if opts.fused_mlp else 0


def dequantized_weight_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """QLoRA under torch.compile'd decoder layers: the compiled graph saves each NF4 target weight's expansion in the
    compute dtype for the backward (eager layers save the NF4 weight itself, no copy, and expand it again): one
    layer's target weights, a per-layer copy kept like an activation by every layer left uncheckpointed and by the
    layer being recomputed (1.7 GB at 70B). Measured on CPU (tests/train/test_qlora_compiled_saves.py)."""
    if opts.quant != "nf4" or not opts.compile:
        return 0
    return elem * (shape.target_params(opts.lora_target_modules) // shape.layers)


def lora_path_bytes_per_token(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """What PEFT's adapter path saves per token (all layers) beside the base linears. With dropout,
    each adapted module has its own Dropout: its output (a x in, a = `adapter_bytes`) and bool mask
    (1 x in), plus lora_A's r-dim output saved by lora_B (a x r). With dropout 0 PEFT uses Identity:
    no copy in the model dtype, but fp32 adapters save PEFT's fp32 cast of the input (a x in) instead."""
    a, r = adapter_bytes(opts, elem), opts.lora_r
    if opts.lora_dropout > 0:
        per_input, per_rank = a + 1, a
    elif a > elem:
        per_input, per_rank = a, a
    else:
        return 0
    in_features = {"down_proj": shape.mlp_width, "o_proj": shape.q_dim}
    per_layer = sum(per_input * in_features.get(t, shape.hidden) + per_rank * r for t in opts.lora_target_modules)
    return shape.layers * per_layer


def activation_terms(shape: ModelShape, opts: MemoryOptions, elem: int) -> dict[str, int]:
    """Saved activations for the micro-batch, plus the transient per-layer backward memory.

    With non-reentrant per-layer checkpointing only each layer's input (elem x d per token) is kept;
    during backward one layer at a time is recomputed, so one layer's full activations come back.
    `workspace` approximates the gradients of one layer's intermediates alive during its backward
    (grads of gate/up/SiLU outputs ~3 I, of the hidden/residual stream ~3 d; an MoE layer's fp32 combine,
    `moe_combine_bytes`). The MoE router logits every layer returns for the load-balancing loss are saved
    whether or not the layers are checkpointed (`router_logits_bytes`). `last_layer`: what is
    left when backward reaches the first decoder layer (every later layer's tensors are freed): that
    layer's activations (saved or recomputed alike) + its workspace.
    """
    tokens, d = opts.sequence_tokens, shape.hidden
    weight_copy = fused_mlp_weight_bytes(shape, opts, elem) + dequantized_weight_bytes(shape, opts, elem)
    head = (4 + elem) * d + elem * d  # final RMSNorm + lm_head input (never checkpointed)
    layer = _layer_with_adapters_bytes(shape, opts, elem)
    kept = kept_attention_bytes(shape, opts, elem)  # per layer, on the GPU whatever activation_offload says
    checkpointed = checkpointed_count(shape, opts)
    # the checkpointed layers' kept attention outputs and the others' weight copies stay on the GPU
    saved = tokens * head + checkpointed * kept + (shape.layers - checkpointed) * weight_copy
    saved += 0 if opts.activation_offload else offloaded_activation_bytes(shape, opts, always=True)
    recompute = layer + weight_copy - kept if checkpointed else 0  # a recomputed layer reads its kept output back
    saved += router_logits_bytes(shape, tokens)  # layer outputs, not saved tensors: never offloaded
    mlp_rows = min(tokens, opts.mlp_chunk_tokens or tokens)
    workspace = elem * 3 * (mlp_rows * shape.mlp_width + tokens * d) + float8_cast_bytes(shape, opts) \
        + moe_combine_bytes(shape, tokens)
    return {"saved": saved, "recompute": recompute, "workspace": workspace,
            "last_layer": layer + weight_copy + workspace}


def checkpointed_count(shape: ModelShape, opts: MemoryOptions) -> int:
    """The decoder layers that recompute their forward in backward (train.checkpoint_layers; 0 without
    checkpointing): each keeps only its input; the others keep what autograd saves."""
    if not opts.gradient_checkpointing:
        return 0
    return len(checkpointed_layers(shape.layers, opts.checkpoint_layers))


def recompute_share(shape: ModelShape, opts: MemoryOptions) -> float:
    """The share of the decoder layers whose forward runs again in backward (launcher/plan/speed.py)."""
    return checkpointed_count(shape, opts) / shape.layers


def _layer_with_adapters_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """One decoder layer's saved activations for the micro-batch, with its share of the LoRA path's."""
    lora_extra = lora_path_bytes_per_token(shape, opts, elem) if opts.lora else 0
    return _layer_bytes(shape, opts, elem, opts.sequence_tokens) + opts.sequence_tokens * (lora_extra // shape.layers)


def kept_attention_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """train.recompute_attention = false under checkpointing: what each layer's checkpoint keeps from the forward
    (train/kernels/keep_attention.py): the attention output [T, heads x head_dim] in the compute dtype and the
    fp32 log-sum-exp [heads, T]. The checkpoint holds them in its own store, which activation_offload's
    saved-tensor hooks never see: they stay on the GPU."""
    if opts.recompute_attention or not opts.gradient_checkpointing:
        return 0
    return opts.sequence_tokens * (elem * shape.q_dim + 4 * shape.heads)


def _layer_bytes(shape: ModelShape, opts: MemoryOptions, elem: int, tokens: int) -> int:
    """One decoder layer's saved activations for `tokens` tokens; with train.mlp_chunk_tokens the MLP's
    intermediate (the bytes that scale with I) exists for one chunk at a time."""
    per_token = layer_activation_bytes_per_token(shape, elem, opts.compile, opts.fused_mlp, opts.fp8)
    without_mlp = layer_activation_bytes_per_token(replace(shape, intermediate=0), elem, opts.compile,
                                                   opts.fused_mlp, opts.fp8)
    return tokens * without_mlp + min(tokens, opts.mlp_chunk_tokens or tokens) * (per_token - without_mlp)


def offloaded_activation_bytes(shape: ModelShape, opts: MemoryOptions, always: bool = False) -> int:
    """train.activation_offload: what one process keeps in pinned host memory at the end of its forward: each
    checkpointed layer's input, every other layer's saved activations (`always`: what the GPU keeps of both
    without offload)."""
    if not (opts.activation_offload or always):
        return 0
    elem, checkpointed = low_bytes(opts), checkpointed_count(shape, opts)
    inputs = checkpointed * opts.sequence_tokens * elem * shape.hidden
    return inputs + (shape.layers - checkpointed) * _layer_with_adapters_bytes(shape, opts, elem)


def float8_cast_bytes(shape: ModelShape, opts: MemoryOptions) -> int:
    """Transient float8 copies of one layer's matmul operands (train/kernels/float8.py). torchao saves the
    bf16 inputs for backward as before (the saved activations do not shrink); each matmul casts its weight
    (and its transpose for the input gradient) and its input (and the transpose for the weight gradient)
    to 1-byte float8: the layer's linear weights twice plus its widest inputs (d and I per token) twice,
    alive while the layer runs."""
    if not opts.fp8:
        return 0
    weights = sum(n_in * n_out for n_in, n_out in shape.linear_dims(list(LORA_TARGETS)))
    return 2 * weights + 2 * opts.sequence_tokens * (shape.hidden + shape.mlp_width)


EP_LOAD_SKEW = 2.0  # the most tokens one GPU's experts receive, over the even share (router imbalance; assumed)


def expert_dispatch_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """Expert parallelism's buffers beside the single-GPU MoE layer's own (train/moe/expert_parallel.py): the
    send and the receive buffer of one all-to-all in flight, the k routed copies of this GPU's tokens going
    out and those its experts receive (up to EP_LOAD_SKEW times the even share)."""
    if opts.expert_parallel <= 1 or not shape.is_moe:
        return 0
    copies = opts.sequence_tokens * shape.experts_per_token * shape.hidden * elem
    return int(copies * (1 + EP_LOAD_SKEW))


def all_to_all_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """Context parallelism's (Ulysses, train/kernels/context_parallel.py) buffers while a layer's attention
    runs: q, k, v and the output each exist in both layouts (this GPU's sequence share with every head, and
    the whole sequence for its head group: the same bytes), one copy beside the activations counted already
    plus the contiguous send chunks. k and v carry at least N heads (fewer KV heads are repeated)."""
    if opts.context_parallel <= 1:
        return 0
    kv_dim = max(shape.kv_heads, opts.context_parallel) * shape.head_dim
    return 2 * elem * opts.sequence_tokens * (2 * shape.q_dim + 2 * kv_dim)


def logits_terms(shape: ModelShape, opts: MemoryOptions, elem: int) -> dict[str, int]:
    """transformers' ForCausalLMLoss: logits (elem) -> `.float()` copy (4) -> log_softmax output (4,
    saved) = 10 B/token/vocab at the loss; its backward adds grad_output and grad_input (fp32 each) while
    the saved output lives.
    The fused loss (train/kernels/loss.py, loss_chunk_tokens > 0, backend "fused") computes both
    gradients in its forward, a chunk at a time: one chunk's logits (elem) and their gradient (elem;
    quack's kernel writes it over the logits, the compiled pass into a new tensor) plus, when lm_head
    trains, its whole gradient (elem x vocab x d), saved for the backward, which only scales it (the
    scaled copy is the unsharded lm_head gradient of peak.py's comm terms). Nothing vocabulary-sized is
    fp32 and no logits are held.
    The "chunked" and "liger" backends run the unfused accounting on one chunk (checkpointed: no logits
    outlive it).
    `held`: the logits the loop keeps in `outputs` through backward (unfused loss only). FSDP2 returns
    them in bf16; where Accelerate's `prepare_model` wraps forward in autocast (FSDP1, DDP) it also
    converts the outputs to fp32 (`convert_outputs_to_fp32`), so a 4-byte copy is held instead."""
    if opts.loss_chunk_tokens > 0 and opts.loss_backend == "fused":
        rows = min(opts.loss_chunk_tokens, opts.sequence_tokens)
        head_grad = 0 if opts.lora else elem * shape.vocab * shape.hidden
        return {"forward": rows * shape.vocab * 2 * elem + head_grad, "head_backward": head_grad, "held": 0}
    fused = opts.loss_chunk_tokens > 0  # "chunked"/"liger": a chunk's logits, fp32 copy and log-softmax
    rows = min(opts.loss_chunk_tokens, opts.sequence_tokens) if fused else opts.sequence_tokens
    held_elem = 4 if opts.spec.fp32_params else elem
    held = held_elem * shape.vocab * rows if (opts.hold_outputs and not fused) else 0
    return {
        "forward": rows * shape.vocab * (elem + 4 + 4),
        "head_backward": rows * shape.vocab * (4 + 4 + 4) + held,
        "held": held,
    }
