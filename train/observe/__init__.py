"""observe: throughput and MFU, the per-step metrics, kernel profiles, per-rank log files.
May import contract only; never another train folder."""
