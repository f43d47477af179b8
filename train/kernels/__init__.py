"""kernels: attention backends (FA4 included), the fused SwiGLU MLP, the chunked loss, compile/fusion features.
May import contract only; never another train folder."""
