"""moe: mixture of experts: grouped experts (experts.py), expert LoRA (hf.py), router.py, expert_parallel.py.
May import contract only; never another train folder."""
