"""The fused/chunked loss equals the dense lm_head + cross-entropy, value and gradients."""

import torch
import torch.nn.functional as F

from train.loss import IGNORE_INDEX, linear_cross_entropy_sum, shift_labels


def _dense_reference(hidden, weight, labels):
    logits = (hidden @ weight.t()).float()
    targets = shift_labels(labels)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def test_shift_labels_ends_rows_with_ignore():
    labels = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert shift_labels(labels).tolist() == [[2, 3, -100], [5, 6, -100]]


def test_chunked_matches_dense_value_and_grads():
    torch.manual_seed(0)
    hidden = torch.randn(1, 9000, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (1, 9000))
    labels[0, ::7] = IGNORE_INDEX
    ref = _dense_reference(hidden, weight, labels)
    ref_grads = torch.autograd.grad(ref, [hidden, weight])
    got = linear_cross_entropy_sum(hidden, weight, labels, backend="chunked")
    got_grads = torch.autograd.grad(got, [hidden, weight])
    torch.testing.assert_close(got, ref.to(got.dtype))
    for g, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_auto_on_cpu_uses_chunked_and_no_grad_path():
    torch.manual_seed(1)
    hidden = torch.randn(2, 30, 8)
    weight = torch.randn(20, 8)
    labels = torch.randint(0, 20, (2, 30))
    with torch.no_grad():
        got = linear_cross_entropy_sum(hidden, weight, labels)
    torch.testing.assert_close(got, _dense_reference(hidden, weight, labels))
