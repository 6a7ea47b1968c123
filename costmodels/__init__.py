"""Cost models: hardware specs and per-layer compute, communication, memory
and resharding costs of every sharding, as jitted JAX functions (issue 3)."""

__all__: list[str] = []
