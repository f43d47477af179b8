"""The fused/chunked loss equals the dense lm_head + cross-entropy, value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from train.kernels.loss import (IGNORE_INDEX, fused_linear_cross_entropy_sum, linear_cross_entropy_sum, logit_grad_pass,
                        shift_labels)


def _dense_reference(hidden, weight, labels):
    logits = (hidden @ weight.t()).float()
    targets = shift_labels(labels)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def test_shift_labels_ends_rows_with_ignore():
    labels = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert shift_labels(labels).tolist() == [[2, 3, -100], [5, 6, -100]]


@pytest.mark.parametrize("backend", ["chunked", "fused"])  # fused: 3 uneven chunks of 4096 tokens
def test_backend_matches_dense_value_and_grads(backend):
    torch.manual_seed(0)
    hidden = torch.randn(1, 9000, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (1, 9000))
    labels[0, ::7] = IGNORE_INDEX
    ref = _dense_reference(hidden, weight, labels)  # softmax in fp32
    ref_grads = torch.autograd.grad(ref * 0.5, [hidden, weight])  # scaled, as loss / label tokens
    got = linear_cross_entropy_sum(hidden, weight, labels, backend=backend)
    got_grads = torch.autograd.grad(got * 0.5, [hidden, weight])
    torch.testing.assert_close(got, ref.to(got.dtype))
    for g, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_auto_on_cpu_uses_chunked_and_no_grad_path():
    torch.manual_seed(1)
    hidden = torch.randn(2, 30, 8)
    weight = torch.randn(20, 8)
    labels = torch.randint(0, 20, (2, 30))
    with torch.no_grad():
        got = linear_cross_entropy_sum(hidden, weight, labels)
    torch.testing.assert_close(got, _dense_reference(hidden, weight, labels))


def test_fused_leaves_a_frozen_weight_without_gradient_and_eval_without_autograd():
    torch.manual_seed(3)
    hidden = torch.randn(40, 8, requires_grad=True)
    weight = torch.randn(20, 8)  # frozen (a LoRA run's lm_head)
    targets = torch.randint(0, 20, (40,))
    got = fused_linear_cross_entropy_sum(hidden, weight, targets, chunk_tokens=16)
    (grad,) = torch.autograd.grad(got, [hidden])
    ref = F.cross_entropy(hidden @ weight.t(), targets, reduction="sum")
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(grad, torch.autograd.grad(ref, [hidden])[0])
    with torch.no_grad():
        torch.testing.assert_close(fused_linear_cross_entropy_sum(hidden, weight, targets, 16), ref.detach())


def test_fused_loss_pass_on_cpu_is_eager():
    """quack's in-place kernel (Hopper/Blackwell) and the compiled pass are CUDA-only; test_gpu checks
    the kernel against the eager pass."""
    assert logit_grad_pass(torch.device("cpu")) == "eager"
