"""Mixture-of-experts training: grouped-GEMM experts (experts.py), LoRA on the experts, the router's loss."""
