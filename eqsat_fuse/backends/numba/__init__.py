"""The Numba backend: generated, JIT-compiled fused kernels and their runtime helpers."""
