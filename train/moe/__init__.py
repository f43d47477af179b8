"""moe: mixture of experts: grouped-GEMM experts (experts.py), expert parallelism (expert_parallel.py).
May import contract only; never another train folder."""
