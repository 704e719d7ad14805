"""Stage 4: the chosen terms decoded into kernels, laid out in a planned arena, run as a Program."""
