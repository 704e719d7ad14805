"""Stage 3: the cheapest program chosen from the e-graph under a target cost model."""
