"""The Numba backend: generated, JIT-compiled fused kernels and their runtime helpers
(`backend.NumbaBackend` generates and compiles; `binder.NumbaAdapter` is it behind the backend
interface of `backends.base`, binding the compiled kernels to the arena in segments)."""
