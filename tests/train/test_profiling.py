"""train.profile_steps: a real profile of a tiny model's steps leaves a trace and a breakdown by kind."""

import logging

import torch
from transformers import LlamaForCausalLM

from train.observe.profiling import StepProfiler, kernel_breakdown, kernel_kind, read_trace


def test_profiled_steps_leave_a_trace_and_a_breakdown(tiny_model_config, tmp_path, caplog):
    model = LlamaForCausalLM(tiny_model_config)
    profiler = StepProfiler("2:4", is_main=True, out_dir=tmp_path / "profile")
    caplog.set_level(logging.INFO, logger="train.observe.profiling")
    for step in range(5):
        profiler.before_step(step)
        ids = torch.randint(0, tiny_model_config.vocab_size, (1, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        profiler.after_step(step)
    trace = tmp_path / "profile" / "steps-2-3.trace.json"
    events = read_trace(trace)
    assert sum(e.get("name") == "aten::mm" for e in events) > 0  # the profiled steps' matmuls are in it
    assert "profile of steps 2..3" in caplog.text and "by kind" in caplog.text


def test_off_on_other_ranks_and_without_spec(tmp_path):
    for spec, is_main in (("", True), ("2:4", False)):
        profiler = StepProfiler(spec, is_main, tmp_path)
        profiler.before_step(2)
        assert profiler.profiler is None


def test_kernel_names_sort_into_kinds():
    assert kernel_kind("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT") == "matmul"
    assert kernel_kind("kernel_cutlass_kernel_flash_attncuteflash_bwd_sm90FlashAttentionBackwardSm90") == "attention"
    assert kernel_kind("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "compiled elementwise"
    assert kernel_kind("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert kernel_kind("_cross_entropy_kernel") == "loss"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>") == "other"


def test_memsets_are_attributed_to_the_op_that_launched_them():
    events = [
        {"cat": "cpu_op", "name": "aten::zeros", "args": {"External id": 7}},
        {"cat": "gpu_memset", "name": "Memset (Device)", "dur": 2000.0, "args": {"External id": 7}},
        {"cat": "kernel", "name": "nvjet_tst_x", "dur": 6000.0, "args": {"External id": 8}},
    ]
    result = kernel_breakdown(events)
    assert result["total_ms"] == 8.0 and result["by_kind"] == {"matmul": 6.0, "memset": 2.0}
    assert result["launched_by"]["memset"] == {"aten::zeros": 2.0}
