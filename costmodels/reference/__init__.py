"""A plain-Python, per-layer evaluation of one discrete plan: the same cost
model as :func:`costmodels.cost_table` + :func:`costmodels.iteration_time`
(:mod:`costmodels.reference.iteration_time`) and
:func:`costmodels.memory_per_device` (:mod:`costmodels.reference.memory`),
written independently with scalar ``math`` and loops.

It exists as a test oracle for the vectorised model (the one-hot identity)
and as the baseline of ``benchmarks/costmodel_speed.py``. It is far slower;
never use it for planning.
"""

from costmodels.reference.iteration_time import reference_iteration_time
from costmodels.reference.memory import reference_memory

__all__ = ["reference_iteration_time", "reference_memory"]
