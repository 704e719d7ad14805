"""The NumPy backend: reference kernels per operator and fused bodies run op by op."""
