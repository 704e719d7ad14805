"""Stage 1: an ONNX file read, checked and encoded as egglog terms."""
