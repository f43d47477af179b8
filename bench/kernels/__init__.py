"""One kernel or one decoder layer timed alone on a GPU (attention, matmuls, MLP, FP8, GEMM configs); autograd's saved bytes.
May import bench.common and bench.report."""
