"""Stage 1: an ONNX file read, checked and encoded as egglog terms.

- `importer`: the import stage (`import_model`): an ONNX model -> `ir.Graph` with static
  shapes, or with symbolic dims where the inputs leave dims open, built from, in import
  order (each imports only modules listed before it): `protos` (small readers of ONNX
  protos: `all_tensors`, attributes, element types), `reading` (the file, its external data,
  the topology checks), `shapes` (input shapes, shape inference, the size limits), `folding`
  (evaluating what is constant at import), `symbolic` (symbolic shape inference, the shape
  subgraphs folded into dim expressions) and `normalize` (each node into the term language's
  form, or Opaque);
- `encode`: `ir.Graph` -> the egglog program (`encode`), and an extracted program written back
  as one (`encode_choice`).
"""
