"""The local search: a plan improved by moves scored exactly, for all
layers and options at once.

* :mod:`search.local.refinement`: local search and the refinement of several
  candidate plans, after their repair to memory feasibility at the least
  time cost (:mod:`search.local._repair`);
* :mod:`search.local.moves`: single-layer moves and moves of an edge's two
  layers, their times and memories (with runs of recomputing layers, in a
  window around each move: :mod:`search.local.run_moves`);
* :mod:`search.local.segments`: the large neighbourhood, whole chain segments
  re-planned by Viterbi;
* :mod:`search.local.relevel`: a plan's memory levers re-planned exactly with
  its strategies fixed, by the exact label search over runs.

This module's ``__all__`` is what the rest of ``search`` uses.
"""

from search.local._repair import repair
from search.local.refinement import RefineResult, drop_idle_levers, free_levers, local_search, refine

__all__ = ["RefineResult", "drop_idle_levers", "free_levers", "local_search", "refine", "repair"]
