"""rlpost's benchmarks: one harness (`benchmarks.harness`) and the scripts that use it; results under `results/`."""
