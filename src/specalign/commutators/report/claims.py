"""The claim rules of the commutator study's reproduction (Nyström, arXiv:2608.22910,
Section 10): when ours *differs* from a published number, and when an exact identity's
residual is floating-point rounding.

The rules are fixed in advance and never adjusted to a result; the tables
(:mod:`specalign.commutators.report.tables`) apply them to every row and the reproduction
report (:mod:`specalign.commutators.report.reproduction`) states them.
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np

#: Relative tolerance of the materiality rule (beyond the paper's rounding).
MATERIAL_REL = 0.10
#: Absolute floor for quantities on a unit scale (fractions, correlations, chi, I):
#: below one hundredth of the source budget a difference does not change a reading.
MATERIAL_ABS_BOUNDED = 0.01
#: Relative tolerance for seed standard deviations: the sampling error of an sd from
#: 20 seeds is already ~16 %, so 10 % would flag noise.
MATERIAL_REL_SPREAD = 0.25
#: Identity residuals at or below this are floating-point rounding in float64
#: (paper Sec. 10.7).
RESIDUAL_ROUNDING = 1e-10

#: Quantities bounded by 1 in magnitude, which get the absolute floor.
BOUNDED_PREFIXES = ("chi", "rho_", "I_", "e_")


def _half_unit(value: float | int) -> float:
    """Half a unit in the last printed digit of a paper value (its rounding error)."""
    if isinstance(value, int | np.integer):
        return 0.0
    exponent = Decimal(repr(float(value))).as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)


def rule_for(quantity: str, statistic: str) -> str:
    """The materiality rule of :func:`differs` that a published number obeys: ``count``
    for counts, ``spread`` for seed standard deviations, ``bounded`` for quantities on a
    unit scale, ``relative`` for the rest."""
    if statistic == "count":
        return "count"
    if statistic == "sd":
        return "spread"
    if quantity.startswith(BOUNDED_PREFIXES):
        return "bounded"
    return "relative"


def differs(paper: float | int, ours: float, rule: str) -> bool | None:
    """Whether ``ours`` differs materially from ``paper`` (``None``: ours undefined).

    Rules, fixed in advance and never adjusted to a result:

    * ``count``: any difference.
    * ``relative``: ``|ours - paper| > max(10 % of |paper|, paper rounding)``.
    * ``bounded`` (fractions, correlations, chi, I on a unit scale): as ``relative``
      with an absolute floor of 0.01.
    * ``spread`` (seed standard deviations): 25 % instead of 10 %.
    """
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return None
    diff = abs(float(ours) - float(paper))
    if rule == "count":
        return diff != 0
    rel = MATERIAL_REL_SPREAD if rule == "spread" else MATERIAL_REL
    tol = max(rel * abs(float(paper)), _half_unit(paper))
    if rule == "bounded":
        tol = max(tol, MATERIAL_ABS_BOUNDED)
    return bool(diff > tol)


def at_rounding_level(residuals: np.ndarray) -> bool:
    """Whether an exact identity holds to rounding: its residuals (non-NaN entries) are
    there and none exceeds :data:`RESIDUAL_ROUNDING`."""
    residuals = np.asarray(residuals, dtype=float)
    return bool(residuals.size and residuals.max() <= RESIDUAL_ROUNDING)
