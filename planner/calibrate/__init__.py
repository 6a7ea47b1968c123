"""Measured times: profiling layer shards, fitting hardware descriptions to step times."""
