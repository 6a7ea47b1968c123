"""Plans on JAX's runtime: export to jax.sharding, the sharded step, multi-process meshes, validation against the compiled program, HLO parsing."""
