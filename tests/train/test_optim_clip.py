"""clip_and_step (train/engine/optim.py): the fused AdamW clips through its grad_scale, as
clip_grad_norm_ followed by a step would; other optimizers go through Accelerate's clip.

One process on CPU (fused AdamW runs there). The FSDP2 path (DTensor gradients, the norm gathered
across ranks) runs in the 2-rank reference and resume tests (test_checkpoint_resume.py)."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from train.engine.optim import clip_and_step


def _model_with_grads() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model(torch.randn(8, 16)).pow(2).sum().backward()
    return model


def _reference_step(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return norm


@pytest.mark.parametrize("max_norm", [0.05, 1e6, float("inf")])  # clipping hard; a scale of 1; no clip
def test_fused_adamw_clips_inside_its_step_like_clip_grad_norm(max_norm):
    ours = _model_with_grads()
    reference = _model_with_grads()  # deepcopy would drop the gradients
    want_norm = _reference_step(reference, max_norm)
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2, fused=True)
    norm = clip_and_step(Accelerator(cpu=True), optimizer, list(ours.parameters()), max_norm)

    assert optimizer.grad_scale is None  # left for no other step
    torch.testing.assert_close(norm, want_norm, rtol=0, atol=0)
    for got, want in zip(ours.parameters(), reference.parameters()):
        if max_norm > 1e3:  # a scale of exactly 1, or none: bitwise the unclipped step
            assert torch.equal(got, want)
        else:  # g / (norm / max_norm) against g * (max_norm / norm): rounding apart
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_foreach_adamw_is_clipped_by_accelerate():
    ours = _model_with_grads()
    reference = _model_with_grads()  # deepcopy would drop the gradients
    want_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
    torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=True).step()
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2, foreach=True)
    norm = clip_and_step(Accelerator(cpu=True), optimizer, list(ours.parameters()), 0.05)

    assert getattr(optimizer, "grad_scale", None) is None
    torch.testing.assert_close(norm, want_norm, rtol=0, atol=0)
    for got, want in zip(ours.parameters(), reference.parameters()):
        assert torch.equal(got, want)
