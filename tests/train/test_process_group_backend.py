"""train.cpu_object_collectives (on by default): which process group a training process asks Accelerate for. Only
an FSDP job on GPUs gets CPU_OBJECT_BACKEND, a mixed group (NCCL for CUDA tensors, gloo for the CPU tensors of object
collectives such as DCP's save planning); a CPU run is gloo already and DeepSpeed takes one backend name. The GPU
group itself needs CUDA (it ran on 4 and on 2 H100s, BENCHMARKS.md's seventh 4-GPU session): what runs here is the
choice, and the key's path from train.toml."""

from __future__ import annotations

import pytest

from contract.config import ConfigError, TrainConfig, load_train_config
from train.engine.sharding import CPU_OBJECT_BACKEND, process_group_backend


@pytest.mark.parametrize(("asked", "on_cpu", "fsdp", "expected"), [
    (True, False, True, CPU_OBJECT_BACKEND),
    (False, False, True, None),  # turned off: Accelerate's nccl
    (True, True, True, None),  # CPU hosts: gloo for everything already
    (True, False, False, None),  # DeepSpeed / DDP
])
def test_only_fsdp_on_gpus_gets_the_mixed_group_and_only_when_asked(asked, on_cpu, fsdp, expected):
    assert process_group_backend(asked, on_cpu, fsdp) == expected


def test_the_key_is_on_by_default_and_read_from_the_train_section(tmp_path):
    assert TrainConfig().train.cpu_object_collectives is True
    toml = tmp_path / "train.toml"
    toml.write_text("[train]\ncpu_object_collectives = false\n")
    assert load_train_config(toml).train.cpu_object_collectives is False
    toml.write_text('[train]\ncpu_object_collectives = "yes"\n')
    with pytest.raises(ConfigError, match="train.cpu_object_collectives"):
        load_train_config(toml)
