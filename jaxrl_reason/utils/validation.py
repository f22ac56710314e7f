"""One shared check of a config dataclass: its float hyperparameters by name, and its own table of rules.

``check_hyperparameters(config)`` (called first thing in every config's ``__post_init__``) walks
the dataclass's fields, nested dataclasses included, and raises ``ValueError`` naming the class,
field, value and valid range for any float that is NaN, infinite or out of range. A field is a
float field when its annotation mentions ``float`` or its value is a float; tuples are checked
element-wise; ``None`` is skipped (``float | None`` options).

A config states the rest of its field rules as a table, the class attribute ``CHECKS`` (not a field), read by the
same call: ``(fields, rule)`` or ``(fields, rule, why)`` rows, ``fields`` a name or a tuple of names of any type,
``rule`` a ``Range`` or a ``Rule`` (``at_least``, ``one_of``, ``or_none``); a named field is checked by its rows
instead of its name's float range::

    CHECKS = (("group_size", at_least(2), "group-relative advantages need a group"),
              (("epochs", "minibatches"), at_least(1)),
              ("advantage", one_of(("grpo", "rloo"))))
    -> ValueError: GRPOConfig.group_size must be >= 2 (group-relative advantages need a group), got 1

Rules between fields stay in ``__post_init__``, after the call, each one line: ``require(self, ok, message)``
raises ``ValueError("<Class>: message")``.

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
from typing import Any, Callable, Sequence

VALID = "valid_range"  # dataclasses.field(metadata={VALID: Range(...)}) overrides RULES for one field


@dataclasses.dataclass(frozen=True)
class Range:
    """``low <= x <= high`` (``low < x`` with ``low_open``, ``x < high`` with ``high_open``); NaN never, +-inf
    only with ``allow_inf``."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False  # True: low itself is excluded
    allow_inf: bool = False
    high_open: bool = False  # True: high itself is excluded

    def __contains__(self, x) -> bool:
        if not _is_number(x) or math.isnan(x) or (math.isinf(x) and not self.allow_inf):
            return False
        above = x > self.low if self.low_open else x >= self.low
        return above and (x < self.high if self.high_open else x <= self.high)

    def __str__(self) -> str:
        kind = "a number (inf allowed)" if self.allow_inf else "a finite number"
        if self.low > -math.inf and self.high < math.inf:
            low, high = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{kind} in {low}{self.low:g}, {self.high:g}{high}"
        if self.low > -math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind} {'<' if self.high_open else '<='} {self.high:g}" if self.high < math.inf else kind


class Rule:
    """A rule of a ``CHECKS`` table on a value of any type: ``x in rule`` is ``test(x)``; it reads "must be <text>"."""

    def __init__(self, test: Callable[[Any], bool], text: str):
        self.test, self.text = test, text

    def __contains__(self, x) -> bool:
        return bool(self.test(x))

    def __str__(self) -> str:
        return self.text


def at_least(n: int) -> Rule:
    """A number >= n (counts, sizes, steps)."""
    return Rule(lambda x: _is_number(x) and x >= n, f">= {n}")


def one_of(options: Sequence) -> Rule:
    """One of ``options`` (names of modes, methods, schedules)."""
    options = tuple(options)
    return Rule(lambda x: x in options, f"one of {options}")


def or_none(rule, meaning: str) -> Rule:
    """``None`` (it means ``meaning``, e.g. "never") or a value ``rule`` takes."""
    return Rule(lambda x: x is None or x in rule, f"None ({meaning}) or {rule}")


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


def _table(cls) -> dict[str, list[tuple[Any, str]]]:
    """``cls.CHECKS`` as {field: [(rule, why), ...]} in table order; a name that is no field raises."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, list[tuple[Any, str]]] = {}
    for fields, rule, *why in getattr(cls, "CHECKS", ()):
        for name in (fields,) if isinstance(fields, str) else fields:
            if name not in names:
                raise TypeError(f"{cls.__name__}.CHECKS names {name!r}, which is no field of {cls.__name__}")
            out.setdefault(name, []).append((rule, f" ({why[0]})" if why else ""))
    return out


def check_hyperparameters(config) -> None:
    """Raise ``ValueError`` if a float field of ``config`` (or of a nested dataclass) is invalid, or a field
    breaks a row of its class's ``CHECKS`` table."""
    table = _table(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if dataclasses.is_dataclass(item) and not isinstance(item, type):
                check_hyperparameters(item)
        for rule, why in table.get(field.name, ()):
            if value not in rule:
                raise ValueError(f"{type(config).__name__}.{field.name} must be {rule}{why}, got {value!r}")
        if field.name in table:
            continue  # the table's rows replace the name's float range
        nums = [(i, x) for i, x in enumerate(items) if _is_number(x)]
        if not nums or ("float" not in str(field.type) and not any(isinstance(x, float) for _, x in nums)):
            continue  # not a float field (ints, strings, None)
        rng = valid_range(field)
        for i, x in nums:
            if x not in rng:
                where = f"{field.name}[{i}]" if isinstance(value, tuple) else field.name
                raise ValueError(f"{type(config).__name__}.{where} must be {rng}, got {x!r}")


def require(config, ok: bool, message: str) -> None:
    """A rule between fields, in ``__post_init__`` after ``check_hyperparameters``: ``ValueError("<Class>: message")``
    unless ``ok``."""
    if not ok:
        raise ValueError(f"{type(config).__name__}: {message}")
