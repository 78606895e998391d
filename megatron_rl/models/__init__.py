"""Architectures: the model spec read from a recipe or a checkpoint, megatron-core's config and layer
specs from it, HF names both ways, dtypes, expert GEMMs, tiny random checkpoints for tests. Nothing
here knows a process group."""
