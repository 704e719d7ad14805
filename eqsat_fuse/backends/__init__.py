"""The code that runs kernels: NumPy and Numba backends, and the onnx.reference runner."""
