"""Search over per-layer shardings: relaxation, gradient search, discrete
refinement and exact solvers (issue 5). Never imports flax."""

__all__: list[str] = []
