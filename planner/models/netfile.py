"""Import ParaDL ``.net`` network files (ParaDL §5) as :class:`LayerGraph` s.

A ``.net`` file (also ``.net_sc``, ``.net_256``) describes a CNN as a chain of
layers, per sample, with its data set and input size::

    Dataset|ImageNet
    Input|1280000x3x226x226                 # D x C x W x H [x D]
    Model|ResNet50
    NAME|x dims|w dims|y dims[|time_s]      # x = CxWxH[xD], w = CxFxKxK[xK], y = FxWxH[xD]

``#`` starts a comment (whole lines, e.g. ``# Second block group|0``, and the
rest of a line). The layer type is the first of CONV, MPOOL, APOOL, RELU, FC,
BNORM, ADD, DROPOUT that is a substring of NAME (ParaDL §5). Every layer
goes through :class:`~planner.ir.builder.GraphBuilder`:

* CONV -> ``conv`` without bias (the files carry no biases, ParaDL §9.2),
  kernel from the w dims, stride and explicit padding inferred from the x and
  y shapes (:func:`_infer_window`);
* FC -> ``flatten`` (only when x has a spatial dim > 1) then ``dense``
  without bias on C·∏spatial inputs: ParaDL's "conv whose filter equals the
  input size" (ParaDL §1);
* MPOOL / APOOL -> ``pool`` (max / avg), window from the w dims
  (``0x0xKxK``), stride and padding inferred like a conv's;
* RELU / DROPOUT -> ``elementwise``;
* BNORM -> ``batch_norm(affine=False)``: the files carry no BN parameters
  (w = ``CxCx0x0``, ParaDL §5, §9.2);
* ADD -> a single-input ``elementwise`` layer (1 FLOP per element, saving no
  activation): the files are chains and do not say where a residual comes
  from, and ``GraphBuilder.add`` needs two or more inputs.

Spatial dims are written W×H[×D] in the files and stored D×H×W (depth or
height first, :mod:`planner.ir.graph`), i.e. reversed; every shipped file is
square or cubic. Element-wise and channel-wise layers (RELU, DROPOUT, BNORM,
ADD) take their input shape from the previous layer's output, not from their
x field: ``COSMOFLOW.net_256`` has the typo ``RELU|32x2128x128x128`` that
ParaDL never notices (ParaDL §5). Their y must still equal that shape.

The measured whole-network FW+BW time per sample is the 5th field of the
first layer that has a non-zero one (ParaDL §4.10); it becomes
``LayerGraph.measured_time_per_sample_s``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from costmodels import LAYER_TYPES, layer_type, read_input  # ParaDL's layer types (the oracle reads them too)
from planner.ir.builder import GraphBuilder
from planner.ir.graph import LayerGraph, LayerKind

__all__ = ["load_net", "parse_net", "paradl_totals", "layer_type", "LAYER_TYPES", "NET_SUFFIXES"]

NET_SUFFIXES: tuple[str, ...] = (".net", ".net_sc", ".net_256")

_HEADERS = ("Dataset", "Input", "Model")
_ELEMENTWISE_TYPES = ("RELU", "DROPOUT", "BNORM", "ADD")  # shape from the previous layer
# ParaDL §5: "Σx and Σy exclude ReLU/BN" (DROPOUT, ADD and FC count; checked
# against the table for all six shipped files).
_TOTALS_EXCLUDED_TYPES = ("RELU", "BNORM")
_LAYER_FORMAT = "NAME|x dims|w dims|y dims[|time_s], e.g. CONV1|3x226x226|3x96x11x11|96x54x54|0"

Shape = tuple[int, tuple[int, ...]]  # (channels, spatial in graph order)


def load_net(path: str | os.PathLike[str]) -> LayerGraph:
    """Read a ParaDL ``.net`` file (ParaDL §5) into a :class:`LayerGraph`.

    Raises ``ValueError`` (naming the file, and the line where the text is
    wrong) if it cannot be read (missing, a folder, not a regular file,
    over :data:`costmodels.MAX_INPUT_BYTES`) or is not a valid network
    description."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"load_net takes the path of a .net file, got {type(path).__name__}")
    source = os.fspath(path)
    raw = read_input(source, "ParaDL .net network description")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{source}: not a text file; expected a ParaDL .net network description") from None
    return parse_net(text, source=source)


def parse_net(text: str, *, source: str = "<string>") -> LayerGraph:
    """Parse the text of a ParaDL ``.net`` file (ParaDL §5) into a
    :class:`LayerGraph`; ``source`` names the text in error messages.
    ``ValueError`` if ``text`` is not a string (a path: :func:`load_net`)."""
    if not isinstance(text, str):
        raise ValueError(f"parse_net takes the text of a .net file, got {type(text).__name__}"
                         + ("; to read a file, call load_net(path)" if isinstance(text, os.PathLike) else ""))
    headers: dict[str, tuple[int, str]] = {}
    builder: GraphBuilder | None = None
    node = GraphBuilder.input
    measured: float | None = None
    layers = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split("|")]
        where = f"{source}:{lineno}"
        if fields[0] in _HEADERS:
            if builder is not None:
                raise ValueError(f"{where}: header {fields[0]!r} after the first layer; expected layer lines only")
            if fields[0] in headers:
                raise ValueError(f"{where}: repeated header {fields[0]!r}; expected it once")
            if len(fields) != 2 or not fields[1]:
                raise ValueError(f"{where}: malformed {fields[0]} line {line!r}; expected {fields[0]}|VALUE")
            headers[fields[0]] = (lineno, fields[1])
            continue
        if builder is None:
            builder = _start(headers, source, where)
        node, time_s = _add_layer(builder, node, fields, line, where)
        layers += 1
        if measured is None and time_s:
            measured = time_s
    if builder is None or layers == 0:
        raise ValueError(f"{source}: no layers; expected Dataset|, Input|, Model| lines then {_LAYER_FORMAT}")
    return builder.build(measured_time_per_sample_s=measured)


def paradl_totals(graph: LayerGraph) -> dict[str, int]:
    """ParaDL's per-sample totals of a network (the Σ|x|, Σ|y|, Σ|w| columns
    of ParaDL §5's table): ``x`` and ``y`` sum the input and output
    elements of every layer except ReLU and batch norm (by ParaDL's NAME rule,
    :func:`layer_type`, or the ``BATCH_NORM`` kind) and the ``FLATTEN`` layers
    the importer inserts before FC layers; ``w`` is the parameter total.
    Meant for graphs imported from ``.net`` files."""
    a = graph.unpadded()
    kinds = a.kind
    keep = [
        layer_type(name) not in _TOTALS_EXCLUDED_TYPES
        and int(kinds[i]) not in (LayerKind.BATCH_NORM, LayerKind.FLATTEN)
        for i, name in enumerate(graph.names)
    ]
    x = sum(float(v) for v, k in zip(a.in_elements, keep, strict=True) if k)
    y = sum(float(v) for v, k in zip(a.out_elements, keep, strict=True) if k)
    return {"x": int(x), "y": int(y), "w": int(graph.total("params"))}


# -- parsing helpers ------------------------------------------------------------


def _dims(text: str, where: str, what: str, *, allow_zero: bool = False) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split("x")]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d < 0 or (d == 0 and not allow_zero) for d in dims):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{where}: {what} {text!r} is malformed; expected {kind} integers joined by 'x'")
    return dims


def _shape(dims: Sequence[int]) -> Shape:
    """File order C, W, H[, D] -> graph order (C, (D,) H, W)."""
    return dims[0], tuple(reversed(dims[1:]))


def _show(shape: Shape) -> str:
    """A graph shape in the file's notation (CxWxH[xD])."""
    c, sp = shape
    return "x".join(str(d) for d in (c, *reversed(sp)))


def _same(a: Shape, b: Shape) -> bool:
    """Equal shapes, a flat ``(C, ())`` matching ``(C, (1, ..., 1))``."""
    if a[0] != b[0]:
        return False
    if len(a[1]) == 0 or len(b[1]) == 0:
        return all(d == 1 for d in a[1] + b[1])
    return a[1] == b[1]


def _start(headers: dict[str, tuple[int, str]], source: str, where: str) -> GraphBuilder:
    missing = [h for h in _HEADERS if h not in headers]
    if missing:
        raise ValueError(
            f"{where}: layer line before the {', '.join(h + '|' for h in missing)} header(s); "
            "expected Dataset|NAME, Input|DxCxWxH[xD] and Model|NAME first"
        )
    lineno, value = headers["Input"]
    dims = _dims(value, f"{source}:{lineno}", "Input")
    if not 3 <= len(dims) <= 5:
        raise ValueError(
            f"{source}:{lineno}: Input {value!r} has {len(dims)} dims; "
            "expected samples x channels x 1-3 spatial dims (DxCxWxH[xD])"
        )
    # dims[0] is the data-set size D (ParaDL §1); the graph is per sample.
    c, sp = _shape(dims[1:])
    return GraphBuilder(headers["Model"][1], (c, *sp))


def _add_layer(
    b: GraphBuilder, prev: int, fields: list[str], line: str, where: str
) -> tuple[int, float]:
    if not 4 <= len(fields) <= 5:
        raise ValueError(f"{where}: {len(fields)} '|'-separated fields in {line!r}; expected {_LAYER_FORMAT}")
    raw_name = fields[0]
    t = layer_type(raw_name)
    if not raw_name or t is None:
        raise ValueError(
            f"{where}: layer name {raw_name!r} names no known layer type; "
            f"expected a name containing one of {', '.join(LAYER_TYPES)}"
        )
    x_dims = _dims(fields[1], where, "x dims")
    w_dims = _dims(fields[2], where, "w dims", allow_zero=True)
    y_dims = _dims(fields[3], where, "y dims")
    time_s = 0.0
    if len(fields) == 5 and fields[4]:
        try:
            time_s = float(fields[4])
        except ValueError:
            time_s = math.nan
        if not math.isfinite(time_s) or time_s < 0:
            raise ValueError(f"{where}: time {fields[4]!r} is not a time; expected a non-negative number of seconds")
    name = b.auto_name("", raw_name)
    here = f"{where}: {raw_name}"
    got = b.shape(prev)
    x, y = _shape(x_dims), _shape(y_dims)
    if t in _ELEMENTWISE_TYPES:
        # Shape from the previous layer, not from x: COSMOFLOW.net_256 has
        # "RELU|32x2128x128x128" (ParaDL §5), harmless in ParaDL.
        x = got
    elif not _same(x, got):
        raise ValueError(
            f"{here}: x dims {fields[1]!r} differ from the previous layer's output; "
            f"expected {_show(got)} (the layers form a chain)"
        )
    c, sp = x
    if t in ("CONV", "FC", "MPOOL", "APOOL") and len(w_dims) != 2 + len(sp):
        raise ValueError(
            f"{here}: w dims {fields[2]!r} have {len(w_dims)} entries; "
            f"expected {2 + len(sp)} (C x F x one kernel dim per spatial dim of x)"
        )
    try:
        node = _build_layer(b, t, name, prev, x, y, w_dims, here, fields[2])
    except ValueError as e:
        if str(e).startswith(here):
            raise
        raise ValueError(f"{here}: {e}; expected a layer consistent with its x, w and y dims") from None
    out = b.shape(node)
    if not _same(out, y):
        raise ValueError(f"{here}: y dims {fields[3]!r} do not follow from the layer; expected {_show(out)}")
    return node, time_s


def _build_layer(
    b: GraphBuilder, t: str, name: str, prev: int, x: Shape, y: Shape, w_dims: tuple[int, ...], here: str, w_text: str
) -> int:
    c, sp = x
    if t == "CONV":
        node = _conv(b, name, prev, x, y, w_dims, here, w_text)
    elif t == "FC":
        node = _fc(b, name, prev, x, w_dims, here, w_text)
    elif t in ("MPOOL", "APOOL"):
        if math.prod(w_dims[:2]) != 0:
            raise ValueError(f"{here}: pooling w dims {w_text!r} carry weights; expected 0x0xKxK[xK]")
        if y[0] != c:
            raise ValueError(f"{here}: pooling changes channels {c} -> {y[0]}; expected y channels {c}")
        window = tuple(reversed(w_dims[2:]))
        if not sp or any(k < 1 for k in window):
            raise ValueError(
                f"{here}: pooling window {w_text!r} on input {_show(x)}; "
                "expected a spatial input and w dims 0x0xKxK[xK] with K > 0"
            )
        stride, pads = _infer_window(sp, y[1], window, here)
        node = b.pool(name, prev, window, stride=stride, padding=pads, op="max" if t == "MPOOL" else "avg")
    else:
        if math.prod(w_dims) != 0:
            raise ValueError(f"{here}: {t} layer with w dims {w_text!r}; expected no weights, e.g. {c}x{c}x0x0")
        if t == "BNORM":
            node = b.batch_norm(name, prev, affine=False)
        elif t == "ADD":
            # A chain has no skip input: one-input, add-like (1 FLOP per element, saves nothing).
            node = b.elementwise(name, prev, saves_output=False)
        else:  # RELU, DROPOUT
            node = b.elementwise(name, prev)
    return node


def _conv(
    b: GraphBuilder, name: str, prev: int, x: Shape, y: Shape, w: tuple[int, ...], here: str, w_text: str
) -> int:
    c, sp = x
    if len(sp) == 0:
        raise ValueError(f"{here}: CONV on a flat input of {c} channels; expected x with spatial dims")
    if w[0] != c or w[1] != y[0]:
        raise ValueError(f"{here}: w dims {w_text!r} do not match x and y; expected {c}x{y[0]}xK...")
    kernel = tuple(reversed(w[2:]))
    if any(k < 1 for k in kernel):
        raise ValueError(f"{here}: CONV kernel in w dims {w_text!r} is empty; expected positive kernel dims")
    stride, pads = _infer_window(sp, y[1], kernel, here)
    return b.conv(name, prev, y[0], kernel, stride=stride, padding=pads, bias=False)


def _fc(b: GraphBuilder, name: str, prev: int, x: Shape, w: tuple[int, ...], here: str, w_text: str) -> int:
    c, sp = x
    # ParaDL §1: an FC layer is a conv whose filter covers the input: w = C x F x spatial.
    if w[0] != c or tuple(reversed(w[2:])) != tuple(sp):
        expect = "x".join(str(d) for d in (c, "F", *reversed(sp)))
        raise ValueError(f"{here}: FC w dims {w_text!r} do not cover the input; expected {expect}")
    if any(d > 1 for d in sp):
        prev = b.flatten(b.auto_name(name, "flatten"), prev)
    return b.dense(name, prev, w[1], bias=False)


def _infer_window(
    in_sp: Sequence[int], out_sp: Sequence[int], window: Sequence[int], here: str
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Stride and explicit ``(lo, hi)`` padding per dim that turn ``in_sp``
    into ``out_sp`` with ``window``. The files give only shapes (paradl.md
    §5), so: try stride ``max(1, n // out)`` first, then 1, 2, ...; take the
    first that reaches ``out`` exactly with a total padding of at most
    ``window - 1`` (no more than Flax's SAME), split ``lo = total // 2``,
    ``hi = total - lo`` as SAME does. E.g. VGG's 2x2 pools 113 -> 57 need
    stride 2 and padding (0, 1); CosmoFlow-512's CONV_3 (126 -> 62, K = 3)
    is a stride-2 VALID conv."""
    if len(out_sp) != len(in_sp):
        raise ValueError(
            f"{here}: y has {len(out_sp)} spatial dims but x has {len(in_sp)}; expected the same number"
        )
    strides, pads = [], []
    for n, out, k in zip(in_sp, out_sp, window, strict=True):
        # strides that can give `out` positions with at most k - 1 padding: (out - 1) s in
        # [n - k, n - 1]; a bounded range whatever the sizes (not a loop over n)
        lo_s = max(1, (n - k) // max(out - 1, 1))
        hi_s = max(lo_s, (n - 1) // max(out - 1, 1)) + 1
        for s in dict.fromkeys((max(1, n // out), *range(lo_s, min(hi_s, lo_s + 64) + 1))):
            total = (out - 1) * s + k - n
            if total < 0:  # without padding the window leaves a remainder
                total = 0 if (n - k) // s + 1 == out else -1
            lo, hi = total // 2, total - total // 2
            if 0 <= total <= k - 1:
                strides.append(s)
                pads.append((lo, hi))
                break
        else:
            raise ValueError(
                f"{here}: no stride and padding turn {n} into {out} with a window of {k}; "
                "expected y = (x + padding - window) // stride + 1 with 0 <= padding < window"
            )
    return tuple(strides), tuple(pads)
