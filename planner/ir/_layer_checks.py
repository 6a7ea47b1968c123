"""Each layer of a layer-graph file checked on its own (private; the file
reader :mod:`planner.ir.graph_file` calls it): the output shape follows from
the input shape and the window, parameters and FLOPs from the shapes, by the
formulas :class:`~planner.ir.builder.GraphBuilder` builds every graph with
(:mod:`planner.ir.flops`). A file that says otherwise was edited or written
by another tool, and the plan made from it would be wrong: one line names
the layer, the field, the value found and the value expected.

What is recomputed, per kind (``docs/layer-graph.md`` lists it too):

* conv, windowed pool: output spatial dims
  ``floor((in + lo + hi - dilation * (k - 1) - 1) / stride) + 1`` (the
  convolution arithmetic of Dumoulin & Visin 2016, relationship 15), the
  output rank equal to the input's; a global pool: a flat output.
* pool, batch norm, norm, element-wise, add, multiply: the input's channels;
  the input's spatial dims too, except for an element-wise layer with
  parameters (a learned position embedding, which may add a class token's
  position).
* dense: the input's spatial dims.
* parameters: conv ``prod(k) * C_in / groups * C_out``, dense ``C_in * C_out``,
  each with or without a bias of ``C_out`` (the arrays do not record which;
  the count says it), a dense layer tied to an embedding none; batch norm
  ``2 C`` (affine) or 0; layers without weights (pool, add, multiply) 0.
* FLOPs (forward, backward-data, backward-weight): conv, dense, pool, global
  pool, batch norm, add and multiply, from :mod:`planner.ir.flops` (a layer
  fed only by the model input may have no backward-data FLOPs: JAX does not
  compute that gradient). A file's FLOPs that differ from these by more than
  :data:`FLOPS_REL_TOLERANCE` are refused. The other kinds' FLOPs depend on
  what the arrays do not record (an activation's cost per element, a norm's
  scale and bias, an attention's layout) and are read as given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from costmodels import LayerKind
from planner.ir import flops as F

FLOPS_REL_TOLERANCE = 1e-6  # relative: the file's float64 counts are exact; this allows a rounded hand edit

_SAME_CHANNELS = (LayerKind.POOL, LayerKind.BATCH_NORM, LayerKind.NORM, LayerKind.ELEMENTWISE, LayerKind.ADD,
                  LayerKind.MULTIPLY)
_SAME_SPATIAL = (LayerKind.BATCH_NORM, LayerKind.NORM, LayerKind.ELEMENTWISE, LayerKind.ADD, LayerKind.MULTIPLY,
                 LayerKind.DENSE)
_FLOPS_FIELDS = {"forward": "flops_fwd", "backward_data": "flops_bwd_data", "backward_weight": "flops_bwd_weight"}
_NO_PARAMS = (LayerKind.POOL, LayerKind.ADD, LayerKind.MULTIPLY)


def _ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in v]


def _refuse(name: str, kind: LayerKind, field: str, found: object, expected: str) -> ValueError:
    return ValueError(f"layer {name!r} ({kind.name.lower()}): {field} is {found}, but {expected}; "
                      "the file's layer does not hold together (fix the field or rebuild the graph)")


def window_out_spatial(a: dict[str, np.ndarray], i: int) -> list[int]:
    """The output spatial dims row ``i``'s window gives (padded with 1 past its rank)."""
    r = int(a["spatial_rank"][i])
    out = [1] * len(a["in_spatial"][i])
    for d in range(r):
        n, k, s = a["in_spatial"][i][d], a["kernel"][i][d], a["stride"][i][d]
        dil, lo, hi = a["dilation"][i][d], a["pad_lo"][i][d], a["pad_hi"][i][d]
        out[d] = int((n + lo + hi - dil * (k - 1) - 1) // s) + 1  # Dumoulin & Visin 2016, relationship 15
    return out


def check_layer_shapes(a: dict[str, np.ndarray], names: Sequence[str]) -> None:
    """Each layer's output shape against its input shape and window."""
    for i, name in enumerate(names):
        kind = LayerKind(int(a["kind"][i]))
        r, ro = int(a["spatial_rank"][i]), int(a["out_spatial_rank"][i])
        cin, cout = int(a["in_channels"][i]), int(a["out_channels"][i])
        out = _ints(a["out_spatial"][i])
        if kind in _SAME_CHANNELS and cout != cin:
            raise _refuse(name, kind, "out_channels", cout, f"layers of kind {kind.name.lower()} keep their "
                          f"input's {cin} channels")
        global_pool = kind is LayerKind.POOL and ro == 0
        if kind is LayerKind.CONV or (kind is LayerKind.POOL and not global_pool):
            want = window_out_spatial(a, i)
            if ro != r:
                raise _refuse(name, kind, "out_spatial_rank", ro, f"its input has spatial_rank {r}")
            if out != want:
                raise _refuse(name, kind, "out_spatial", out,
                              f"in_spatial {_ints(a['in_spatial'][i])} with kernel {_ints(a['kernel'][i])}, stride "
                              f"{_ints(a['stride'][i])}, dilation {_ints(a['dilation'][i])} and padding "
                              f"{_ints(a['pad_lo'][i])}/{_ints(a['pad_hi'][i])} gives {want}")
        elif global_pool and out != [1] * len(out):
            raise _refuse(name, kind, "out_spatial", out, "a global pool (out_spatial_rank 0) gives a flat output, "
                          f"{[1] * len(out)}")
        elif kind in _SAME_SPATIAL:
            grows = kind is LayerKind.ELEMENTWISE and float(a["params"][i]) > 0  # a learned position table
            if ro != r and not grows:
                raise _refuse(name, kind, "out_spatial_rank", ro, f"its input has spatial_rank {r}")
            if out != _ints(a["in_spatial"][i]) and not grows:
                raise _refuse(name, kind, "out_spatial", out,
                              f"layers of kind {kind.name.lower()} keep their input's spatial dims "
                              f"{_ints(a['in_spatial'][i])}")


def _params_allowed(a: dict[str, np.ndarray], i: int, kind: LayerKind) -> tuple[float, ...] | None:
    """The parameter counts row ``i``'s shapes allow (None: not determined by them)."""
    cin, cout = float(a["in_channels"][i]), float(a["out_channels"][i])
    if kind is LayerKind.CONV:
        r = int(a["spatial_rank"][i])
        w = math.prod(float(k) for k in a["kernel"][i][:r]) * (cin // float(a["groups"][i])) * cout
        return (w, w + cout)  # without, with a bias
    if kind is LayerKind.DENSE:
        return (cin * cout, cin * cout + cout, 0.0)  # without, with a bias; tied to an embedding
    if kind is LayerKind.BATCH_NORM:
        return (0.0, 2.0 * cin)  # without, with scale and shift
    if kind in _NO_PARAMS:
        return (0.0,)
    return None


def _flops(a: dict[str, np.ndarray], i: int, kind: LayerKind, edges: int) -> list[F.LayerFlops]:
    """Row ``i``'s FLOPs by :mod:`planner.ir.flops`, each count its shapes allow
    (none where the arrays do not determine them). ``edges``: the layers feeding
    it; an add or a product may read the model input too, which has no edge."""
    r = int(a["spatial_rank"][i])
    cin, cout = int(a["in_channels"][i]), int(a["out_channels"][i])
    sp, out = _ints(a["in_spatial"][i][:r]), _ints(a["out_spatial"][i][:int(a["out_spatial_rank"][i])])
    params = float(a["params"][i])
    n_in, n_out = cin * math.prod(sp), cout * math.prod(out)
    if kind is LayerKind.CONV:
        pads = list(zip(_ints(a["pad_lo"][i][:r]), _ints(a["pad_hi"][i][:r]), strict=True))
        bias = params == _params_allowed(a, i, kind)[1]
        return [F.conv_flops(cin, cout, sp, out, _ints(a["kernel"][i][:r]), _ints(a["stride"][i][:r]),
                            _ints(a["dilation"][i][:r]), pads, int(a["groups"][i]), bias)]
    if kind is LayerKind.DENSE:
        return [F.dense_flops(cin, cout, math.prod(sp), params == cin * cout + cout)]
    if kind is LayerKind.POOL:
        if int(a["out_spatial_rank"][i]) == 0:
            return [F.global_pool_flops(n_in)]
        op = "max" if float(a["saved_elements"][i]) > 0 else "avg"  # a max pool keeps its input
        return [F.pool_flops(n_in, n_out, math.prod(_ints(a["kernel"][i][:r])), op)]
    if kind is LayerKind.BATCH_NORM:
        return [F.batch_norm_flops(n_in, params > 0)]
    count = F.add_flops if kind is LayerKind.ADD else F.multiply_flops if kind is LayerKind.MULTIPLY else None
    if count is None:
        return []
    return [count(n_out, n) for n in range(max(edges, 2), edges + 3)]


def _close(found: float, want: float) -> bool:
    return abs(found - want) <= FLOPS_REL_TOLERANCE * max(abs(want), 1.0)


def check_layer_counts(a: dict[str, np.ndarray], names: Sequence[str], dst: Sequence[int]) -> None:
    """Each layer's parameters and FLOPs against the ones its shapes give."""
    inputs = np.bincount(np.asarray(dst, dtype=np.int64), minlength=len(names))
    for i, name in enumerate(names):
        kind = LayerKind(int(a["kind"][i]))
        allowed = _params_allowed(a, i, kind)
        params = float(a["params"][i])
        if allowed is not None and params not in allowed:
            counts = " or ".join(f"{x:.0f}" for x in allowed)
            raise _refuse(name, kind, "params", f"{params:.0f}", f"its shapes give {counts}")
        fed_by_model_input_only = inputs[i] == 0
        candidates = _flops(a, i, kind, int(inputs[i]))
        for field in F.LayerFlops._fields:
            found = float(a[_FLOPS_FIELDS[field]][i])
            wants = [getattr(fl, field) for fl in candidates]
            if not wants or any(_close(found, w) for w in wants) or (
                    field == "backward_data" and fed_by_model_input_only and found == 0):
                continue
            expected = " or ".join(f"{w:.10g}" for w in wants)
            raise _refuse(name, kind, _FLOPS_FIELDS[field], f"{found:.10g}",
                          f"its shapes give {expected} (planner/ir/flops.py)")
