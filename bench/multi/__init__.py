"""Drivers on several GPUs of one host started as a 2-node job (gpu_multi and its phases, LoRA, QLoRA, resume, CP); host.py starts them.
May import bench.common, bench.report, bench.peers and bench.suites."""
