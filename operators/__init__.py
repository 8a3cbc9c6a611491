"""Built-in operators: the SciDB-like library of SubZero.

Every operator computes with numpy/scipy and knows its lineage from
coordinates alone: mapping functions (Map mode) and, when asked, the same
relation written as region pairs (Full mode, also used by black-box
re-execution).  Modules:

elementwise  unary functions, array-scalar ops, thresholds, binary arithmetic
             and comparisons (optionally broadcasting)
masking      where / mask / merge
structural   slice, subarray, subsample, concat, transpose, pad, rebin
stencil      convolve, correlate, mean/median/min/max and generic filters
reduce       whole-array and per-axis reductions
linalg       matrix multiply
components   connected regions of a mask, labelled per tile and merged across
             tile borders (star finding, segmentation)
composite    identity plus a window where flagged (Comp lineage of UDFs that
             change a few cells: cosmic rays, hot pixels, events)
boundary     edge modes and the neighbourhood relation (shared)
base         the MappedOperator skeleton and the Full-pair emitter (shared)
testing      the perturbation oracle used by the tests, for your operators too
"""

from .base import MappedOperator, emit_full
from .components import ConnectedComponents
from .composite import WindowComposite, box_payload, box_payloads, radius_payload
from .elementwise import (
                          Abs,
                          Add,
                          Binary,
                          Clip,
                          Div,
                          Elementwise,
                          Eq,
                          Exp,
                          Ge,
                          Gt,
                          Le,
                          Log,
                          Lt,
                          Maximum,
                          Minimum,
                          Mul,
                          Ne,
                          Negative,
                          Pow,
                          ScalarOp,
                          Sqrt,
                          Sub,
                          Threshold,
                          Unary,
)
from .linalg import MatMul
from .masking import Mask, Merge, Where
from .reduce import Count, Max, Mean, Median, Min, Reduce, Sum
from .stencil import Convolve, Correlate, Filter, MaxFilter, MeanFilter, MedianFilter, MinFilter, Stencil
from .structural import Concat, Pad, Rebin, Slice, Subarray, Subsample, Transpose

__all__ = [
    "MappedOperator", "emit_full",
    "Elementwise", "Unary", "Abs", "Negative", "Sqrt", "Exp", "Log", "Clip", "ScalarOp", "Threshold",
    "Binary", "Add", "Sub", "Mul", "Div", "Pow", "Minimum", "Maximum", "Lt", "Le", "Gt", "Ge", "Eq",
    "Ne",
    "Where", "Mask", "Merge",
    "Slice", "Subarray", "Subsample", "Concat", "Transpose", "Pad", "Rebin",
    "Stencil", "Correlate", "Convolve", "Filter", "MeanFilter", "MedianFilter", "MinFilter",
    "MaxFilter",
    "Reduce", "Sum", "Mean", "Median", "Min", "Max", "Count",
    "MatMul",
    "ConnectedComponents",
    "WindowComposite", "radius_payload", "box_payload", "box_payloads",
]
