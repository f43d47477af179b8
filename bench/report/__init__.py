"""Results files and BENCHMARKS.md's tables: the one writer (results_io), the numbers re-derived from them, the tables.
May import bench.common only."""
