"""The ParaDL oracle (ParaDL §3-§4): whole-model costs of the seven
parallelization strategies on a machine, per iteration, with their limits,
memory and bottleneck.

:func:`oracle_layers` reads a model into the oracle's per-layer table
(:class:`OracleLayers`), :func:`oracle_context` adds the machine, the mode
and the strategy masks, and :func:`oracle_table` evaluates every (strategy,
device count) pair and returns :class:`StrategyCost` rows, each with a
one-line bottleneck. Two modes:

* default: the TR's models with the original code's bugs fixed
  (:mod:`costmodels.oracle._default`);
* ``compat=True`` (``"paradl"``): the original code's outputs, quirks and
  all (:mod:`costmodels.oracle._compat`), reproducing ParaDL §6 and §7.2.

Batch convention (ParaDL's ``--cBon``): ``batch_per_device`` b is the number
of samples every device works on per iteration, on its share of the model
or image. Data parallelism runs B = b·p; filter, channel, spatial and
pipeline share one batch B = b among all p devices; the hybrids run b per
node-sized group, B = b·p1. A fixed global ``batch`` B instead gives
b = B / (data-parallel replicas).

The parts: the per-layer table and its compute times (``_layers``), the
``.lc`` strategy masks (``_masks``), the result record and the shared
network helpers (``_cost``), the two modes' formulas (``_default``,
``_compat``), pipeline parallelism (``_pipeline``) and the table over
strategies and device counts (``_table``). This module's ``__all__`` is what
the rest of shardplan uses.
"""

from costmodels.oracle._compat import PARADL_COMPAT
from costmodels.oracle._cost import OracleContext, StrategyCost
from costmodels.oracle._layers import MASK_FAMILIES, OracleLayers, oracle_calibration, oracle_layers
from costmodels.oracle._masks import lc_family, load_lc, parse_lc
from costmodels.oracle._table import (
    STRATEGIES,
    bottleneck,
    default_batch_per_device,
    oracle_context,
    oracle_table,
    parse_strategies,
    strategy_cost,
)

__all__ = [
    "MASK_FAMILIES",
    "PARADL_COMPAT",
    "STRATEGIES",
    "OracleContext",
    "OracleLayers",
    "StrategyCost",
    "bottleneck",
    "default_batch_per_device",
    "lc_family",
    "load_lc",
    "oracle_calibration",
    "oracle_context",
    "oracle_layers",
    "oracle_table",
    "parse_lc",
    "parse_strategies",
    "strategy_cost",
]
