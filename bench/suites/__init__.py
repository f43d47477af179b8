"""Drivers that train on one GPU or check the CLI: ours against the peers, learning parity, every strategy, memory, latency.
May import bench.common, bench.report and bench.peers."""
