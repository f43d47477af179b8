"""train.profile_steps: a real profile of a tiny model's steps leaves a trace and a breakdown by kind."""

import logging

import torch
from transformers import LlamaForCausalLM

from train.observe.profiling import (StepProfiler, format_steps, kernel_breakdown, kernel_kind, launching_ops, read_trace,
                                     step_breakdown)


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
    assert [row["step"] for row in step_breakdown(events)] == [2, 3]  # each step's own range
    assert "step 3: " in caplog.text
    paths = launching_ops(events).values()  # each operator with the ones that called it, from the real trace
    assert any(path.startswith("aten::mm < ") for path in paths)


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


def test_a_kernel_is_attributed_to_its_operator_and_that_operators_callers_on_its_thread():
    """Which copy: the launching op, then the ranges enclosing it on its own thread, innermost first. A
    labelled range's module is dropped (the same cause in every layer adds up); another thread's ranges and
    the step's own label are no caller."""
    def op(name, ts, dur, tid=1, cat="cpu_op", external=None):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid,
                "args": {} if external is None else {"External id": external}}

    events = [
        op("sft optimizer step 3", 0, 1000, cat="user_annotation"),
        op("FSDP::post_backward_reduce (model.layers.0)", 10, 100, cat="user_annotation"),
        op("aten::contiguous", 20, 50, external=1),
        op("aten::copy_", 30, 10, external=2),
        op("FSDP::post_backward_reduce (model.layers.1)", 200, 100, cat="user_annotation"),
        op("aten::contiguous", 210, 50, external=3),
        op("aten::copy_", 220, 10, external=4),
        op("aten::copy_", 500, 10, external=5),  # after the label ended: only the step encloses it
        op("sft::swiglu_mlp_bwd", 0, 900, tid=2, external=6),  # another thread, overlapping in time
    ]
    events += [{"cat": "kernel", "name": "void at::native::unrolled_elementwise_kernel<direct_copy>", "dur": 700.0,
                "args": {"External id": external}} for external in (2, 4, 5)]
    assert launching_ops(events)[2] == "aten::copy_ < aten::contiguous < FSDP::post_backward_reduce"
    assert kernel_breakdown(events)["launched_by"]["other"] == {
        "aten::copy_ < aten::contiguous < FSDP::post_backward_reduce": 1.4, "aten::copy_": 0.7}


def test_each_step_apart_shows_gpu_busy_idle_and_the_allocators_host_time():
    """A slow step beside a fast one: the kernels each launched (matched by correlation id, also when they
    run after the host left the step), overlapping streams counted once in busy time, and cudaFree's host
    time booked to its step."""
    def host(name, ts, dur, corr=None):
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    def kernel(name, ts, dur, corr):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    events = [
        {"cat": "user_annotation", "name": "sft optimizer step 30", "ts": 0.0, "dur": 850_000.0},
        {"cat": "user_annotation", "name": "sft optimizer step 31", "ts": 850_000.0, "dur": 1_000_000.0},
        host("cudaLaunchKernel", 10.0, 5.0, corr=1), kernel("nvjet_tst_x", 100.0, 700_000.0, 1),
        host("cudaLaunchKernel", 20.0, 5.0, corr=2), kernel("ncclDevKernel_AllGather_RING_LL", 200.0, 800_000.0, 2),
        host("cudaLaunchKernel", 860_000.0, 5.0, corr=3), kernel("nvjet_tst_x", 1_100_000.0, 700_000.0, 3),
        host("cudaFree", 870_000.0, 150_000.0), host("cudaStreamSynchronize", 1_820_000.0, 2_000.0),
    ]
    fast, slow = step_breakdown(events)
    assert (fast["step"], fast["wall_ms"], fast["allocator_ms"]) == (30, 850.0, 0.0)
    assert fast["gpu_ms"] == {"communication": 800.0, "matmul": 700.0}
    assert fast["gpu_busy_ms"] == 800.1  # [100, 700100) and [200, 800200) overlap: counted once
    assert (slow["wall_ms"], slow["gpu_busy_ms"], slow["allocator_ms"], slow["allocator_calls"]) == (1000.0, 700.0, 150.0, 1)
    assert slow["sync_ms"] == 2.0
    text = format_steps([fast, slow])
    assert "step 31: 1000.0 ms on the host, GPU busy 700.0 ms" in text and "allocator calls 150.0 ms (1 calls)" in text


def test_the_compute_streams_waits_are_booked_to_the_step_whose_kernel_ends_them():
    """A collective on its own stream keeps the GPU busy while no compute kernel runs: that wait is shown, with the
    kernels on either side, and the wait before a step's first kernel is that step's (the host was late)."""
    def pair(name, ts, dur, corr):
        return [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(corr), "dur": 1.0,
                 "args": {"correlation": corr}},
                {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}]

    events = [{"cat": "user_annotation", "name": "sft optimizer step 7", "ts": 0.0, "dur": 5.0},
              {"cat": "user_annotation", "name": "sft optimizer step 8", "ts": 5.0, "dur": 5.0},
              *pair("nvjet_a", 100.0, 1_000.0, 1), *pair("ncclDevKernel_AllGather", 1_100.0, 3_000.0, 2),
              *pair("triton_b", 3_100.0, 1_000.0, 3),  # 2 ms after nvjet_a, the all-gather running
              *pair("nvjet_c", 16_100.0, 1_000.0, 6)]  # step 8's first kernel, 12 ms after step 7's last
    first, second = step_breakdown(events)
    assert first["compute_idle_ms"] == 2.0 and first["compute_gaps"] == [(2.0, "nvjet_a", "triton_b")]
    assert first["gpu_busy_ms"] == 4.0  # the all-gather fills the wait: busy alone would not show it
    assert second["compute_idle_ms"] == 12.0 and second["compute_gaps"] == [(12.0, "triton_b", "nvjet_c")]
    assert "no compute kernel for 12.0 ms (longest: 12.0 ms after triton_b before nvjet_c)" in format_steps([second])
