"""Stage 2: equality saturation under budgets and hard limits; the serialized e-graph."""
