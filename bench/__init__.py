"""Benchmarks: suites/ and multi/ drive GPU calls, kernels/ time one kernel, peers/ are the other side, report/ holds
results I/O and BENCHMARKS.md's tables, common/ the shared helpers; results/ is data (tests/test_architecture.py)."""
