"""moe: mixture of experts: grouped-GEMM experts (experts.py) with expert LoRA (hf.py), the router (router.py).
May import contract only; never another train folder."""
