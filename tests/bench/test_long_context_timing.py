"""bench/suites/gpu_long_context.py times every step after the warm-up together (issue #64: >= 3 timed steps)."""

from bench.common.synthetic import SHAPES
from bench.suites.gpu_long_context import WARMUP_STEPS, timed


def test_the_steps_after_the_warm_up_are_timed_together():
    arch = SHAPES["llama3-8b"]
    steps = [{"step": 1, "elapsed_s": 90.0, "peak_mem_gib": 70.0},  # warm-up: CUDA, FA4, the allocator's growth
             {"step": 2, "elapsed_s": 140.0, "peak_mem_gib": 71.0}, {"step": 3, "elapsed_s": 190.0},
             {"step": 4, "elapsed_s": 241.0, "peak_reserved_gib": 80.0}]
    result = timed(steps, 131072, arch)
    assert WARMUP_STEPS == 1 and result["timed_steps"] == 3 and result["real_tokens"] == 3 * 131072
    assert result["seconds"] == 151.0 and result["tokens_per_s"] == 3 * 131072 / 151.0
    assert (result["peak_mem_gib"], result["peak_reserved_gib"]) == (71.0, 80.0)
