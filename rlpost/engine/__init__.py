"""The training engine: FSDP2 sharding and gathers, Ulysses sequence parallelism, packed (remove-padding)
attention and per-sequence linear-attention state, the fused / Triton log-prob heads, activation offload,
LoRA and Liger kernels. Workers build models with it; algorithms never import it."""
