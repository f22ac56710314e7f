"""One shared check of a config dataclass's float hyperparameters.

``check_hyperparameters(config)`` (called first thing in every config's ``__post_init__``) walks
the dataclass's fields, nested dataclasses included, and raises ``ValueError`` naming the class,
field, value and valid range for any float that is NaN, infinite or out of range. A field is a
float field when its annotation mentions ``float`` or its value is a float; tuples are checked
element-wise; ``None`` is skipped (``float | None`` options).

The range comes from ``RULES``: the first entry whose ``fnmatch`` pattern matches the field name;
fields no pattern matches must only be finite. A field the table gets wrong declares its own range::

    moe_seq_aux_alpha: float = dataclasses.field(default=0.0, metadata={VALID: NONNEGATIVE})

(``VALID = "valid_range"``; the value is a ``Range``). Infinity passes only where the range says
``allow_inf`` (e.g. ``max_grad_norm = inf`` turns clipping off).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import numbers

VALID = "valid_range"  # dataclasses.field(metadata={VALID: Range(...)}) overrides RULES for one field


@dataclasses.dataclass(frozen=True)
class Range:
    """``low <= x <= high`` (``low < x`` with ``low_open``); NaN never, +-inf only with ``allow_inf``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False  # True: low itself is excluded
    allow_inf: bool = False

    def __contains__(self, x) -> bool:
        if math.isnan(x) or (math.isinf(x) and not self.allow_inf):
            return False
        return (x > self.low if self.low_open else x >= self.low) and x <= self.high

    def __str__(self) -> str:
        kind = "a number (inf allowed)" if self.allow_inf else "a finite number"
        if self.low > -math.inf and self.high < math.inf:
            return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low > -math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind} <= {self.high:g}" if self.high < math.inf else kind


FINITE = Range()
POSITIVE = Range(0.0, low_open=True)
NONNEGATIVE = Range(0.0)
UNIT = Range(0.0, 1.0)

#: (field-name patterns, range); the first match wins, so specific patterns come first.
RULES: tuple[tuple[tuple[str, ...], Range], ...] = (
    # step sizes, clip ranges, tolerances, scales: strictly positive
    (("lr", "*_lr", "learning_rate", "clip*", "eps_low", "eps_high", "dt", "*_dt",
      "rtol", "atol", "norm_eps", "*_std", "*_scale", "rope_theta"), POSITIVE),
    (("max_grad_norm",), Range(0.0, low_open=True, allow_inf=True)),  # inf: no clipping
    # probabilities, fractions, discounts, EMA / mixing rates
    (("gamma", "discount", "lambda", "*_lambda", "alpha", "*_alpha", "tau", "*_prob", "*probability*",
      "p_*", "*_p", "*_rate", "*_frac", "*fraction*", "dropout", "eps_start", "eps_end", "*explore*"), UNIT),
    # loss coefficients and weights, margins, bonuses, physical sizes, sampling temperature (0 = greedy)
    (("*_coef", "*_coeff", "*coefficient*", "beta", "*_beta", "*_weight", "weights", "w_*", "bc_*",
      "*margin", "*bonus", "pb_c*", "*_radius", "*_speed", "*_accel", "peak_*", "temperature"), NONNEGATIVE),
)


def valid_range(field: dataclasses.Field) -> Range:
    """The range a field's floats must lie in: its metadata override, else the first matching rule."""
    if VALID in field.metadata:
        return field.metadata[VALID]
    for patterns, rng in RULES:
        if any(fnmatch.fnmatchcase(field.name, p) for p in patterns):
            return rng
    return FINITE


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_hyperparameters(config) -> None:
    """Raise ``ValueError`` if a float field of ``config`` (or of a nested dataclass) is invalid."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                check_hyperparameters(item)
        nums = [(i, x) for i, x in enumerate(items) if _is_number(x)]
        if not nums or ("float" not in str(field.type) and not any(isinstance(x, float) for _, x in nums)):
            continue  # not a float field (ints, strings, None)
        rng = valid_range(field)
        for i, x in nums:
            if x not in rng:
                where = f"{field.name}[{i}]" if isinstance(value, tuple) else field.name
                raise ValueError(f"{type(config).__name__}.{where} must be {rng}, got {x!r}")
