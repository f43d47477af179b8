"""launcher/plan/activations.py's compiled-layer activation count against the tensors a compiled tiny Llama
layer really saves on CPU (bench/kernels/saved_activations.py: saved_tensors_hooks, torch.compile's partitioner)."""

from __future__ import annotations

import pytest

from bench.kernels.saved_activations import _register_cpu_swiglu, measure


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["compiled", "compiled+fused_mlp", "compiled+fp8"])
def test_compiled_layer_saves_what_the_planner_counts(variant):
    if variant.endswith("fused_mlp"):
        _register_cpu_swiglu()
    row = measure(variant)
    assert row["bytes_per_token"] == pytest.approx(row["planner_bytes_per_token"], rel=0.02), row
    assert row["bytes_per_layer"] == pytest.approx(row["planner_bytes_per_layer"], rel=0.02, abs=1024), row
