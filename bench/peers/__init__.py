"""The other side of a comparison: TRL's SFTTrainer (alone, under FSDP2, in the parity run), a FastChat-style Trainer, their clock.
May import bench.common and bench.report."""
