"""Local verification of one RandomCalculation reasoning step ``a op b=c`` (a process check).

Needs no reference solution: a step is *valid* when it is well formed and arithmetically true, with
``c`` written as ``fmt`` writes it (lowest terms, no denominator for integers). Two forms:

    step_is_valid("7*2=15,")                      # host text -> False
    step_is_wrong(tokens [..., S], lengths [...])  # jittable, on token ids -> bool [...]

``step_is_wrong`` judges only *complete* steps (the last token is ``,`` or ``</think>``) whose
numbers have at most ``MAX_DIGITS`` digits (int32 arithmetic): it returns True only for a step it
can show is not valid, so a search may prune on it. On those steps it agrees with ``step_is_valid``.

The trace text is ambiguous for ``n/(p/q)``, written ``n/p/q``: both checks read ``(n/p)/q``, as a
greedy parse does, so such gold steps (about 1.4% of steps with all four operations; none without
``/``) are called invalid.
"""

from __future__ import annotations

import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.tasks.random_calculation import _apply, fmt
from jaxrl_reason.tasks.vocab import VOCAB

MAX_DIGITS = 4  # longer numbers are not judged by step_is_wrong (products must fit in int32)
MAX_HOST_DIGITS = 1000  # step_is_valid calls a step with longer numbers invalid (Python's int <-> str limit is 4300)
# ASCII digits only (``\d`` would also read '١' as 1)
_NUMBER = rf"-?[0-9]{{1,{MAX_HOST_DIGITS}}}(?:/[0-9]{{1,{MAX_HOST_DIGITS}}})?"
_STEP = re.compile(rf"({_NUMBER})([-+*/])({_NUMBER})=({_NUMBER})")


def step_is_valid(step: str) -> bool:
    """Host check of one step's text (a trailing ``,`` allowed); never raises (anything malformed,
    including a non-string, is False)."""
    if not isinstance(step, str):
        return False
    m = _STEP.fullmatch(step.removesuffix(","))
    if m is None:
        return False
    a, op, b, c = m.groups()
    try:
        value = _apply(Fraction(a), op, Fraction(b))
    except ZeroDivisionError:  # an operand "n/0"
        return False
    return value is not None and fmt(value) == c


def _char_table(chars: str) -> np.ndarray:
    """[vocab] int32: the index of a token's character in ``chars``, -1 for any other token."""
    table = np.full((VOCAB.size,), -1, np.int32)
    table[[VOCAB.encode(ch)[0] for ch in chars]] = np.arange(len(chars))
    return table


_DIGIT = _char_table("0123456789")
_OP = _char_table("+-*/")
_MINUS, _SLASH, _EQ = (VOCAB.encode(c)[0] for c in "-/=")
_ENDS = (VOCAB.encode(",")[0], VOCAB.think_end)


def _number(tok, digit, pos, i, j):
    """Parse tok[i:j] as ``-?d+(/d+)?`` -> (ok, numerator, denominator, canonical) (int32 scalars)."""
    neg = tok[i] == _MINUS
    s = i + neg.astype(jnp.int32)
    slash = (tok == _SLASH) & (pos > s) & (pos < j)
    has_slash = jnp.any(slash)
    q = jnp.where(has_slash, jnp.argmax(slash), j)
    num_span, den_span = (pos >= s) & (pos < q), (pos > q) & (pos < j)
    ok = ((jnp.sum(slash) <= 1) & jnp.all(jnp.where(num_span | den_span, digit >= 0, True))
          & jnp.any(num_span) & (~has_slash | jnp.any(den_span)))
    value = lambda span, end: jnp.sum(jnp.where(span, jnp.maximum(digit, 0) * 10 ** jnp.clip(end - 1 - pos, 0, 9), 0))
    num, den = value(num_span, q), jnp.where(has_slash, value(den_span, j), 1)
    no_leading_zero = lambda span, start: (tok[start] != VOCAB.encode("0")[0]) | (jnp.sum(span) == 1)
    canonical = (no_leading_zero(num_span, s) & (~has_slash | (no_leading_zero(den_span, q + 1) & (den > 1)))
                 & ~(neg & (num == 0)) & (jnp.gcd(num, den) == 1))
    return ok, jnp.where(neg, -num, num), den, canonical


def _one_step_is_wrong(tok, n):
    """tok [S] int32, n scalar -> True iff the step is complete, judgeable and not valid."""
    pos = jnp.arange(tok.shape[0])
    complete = (n >= 1) & jnp.isin(tok[jnp.maximum(n - 1, 0)], jnp.array(_ENDS))
    m = n - 1  # body length, without the delimiter
    tok = jnp.where(pos < m, tok, VOCAB.pad)
    digit = jnp.asarray(_DIGIT)[tok]
    # a digit run longer than MAX_DIGITS could overflow int32: such a step is not judged
    last_non_digit = jax.lax.cummax(jnp.where(digit < 0, pos, -1))
    too_long = jnp.max(jnp.where(digit >= 0, pos - last_non_digit, 0)) > MAX_DIGITS
    eq = tok == _EQ
    e = jnp.argmax(eq)

    def split(o):  # operator at o: both sides must be numbers
        ok_a, an, ad, _ = _number(tok, digit, pos, 0, o)
        ok_b, bn, bd, _ = _number(tok, digit, pos, o + 1, e)
        return (jnp.asarray(_OP)[tok[o]] >= 0) & (o >= 1) & (o < e - 1) & ok_a & ok_b, an, ad, bn, bd

    # the last such o (a regex's greedy first operand: "6/4/2" is (6/4)/2)
    ok_o, an, ad, bn, bd = jax.vmap(split)(pos)
    o = jnp.maximum(jnp.max(jnp.where(ok_o, pos, -1)), 0)
    an, ad, bn, bd, op = an[o], ad[o], bn[o], bd[o], jnp.asarray(_OP)[tok[o]]
    vn = jnp.select([op == 0, op == 1, op == 2], [an * bd + bn * ad, an * bd - bn * ad, an * bn], an * bd)  # "+-*/"
    vd = jnp.where(op == 3, ad * bn, ad * bd)
    ok_c, cn, cd, canonical = _number(tok, digit, pos, e + 1, m)
    g = jnp.maximum(jnp.gcd(vn, vd), 1)
    sign = jnp.where(vd < 0, -1, 1)
    true = (ad != 0) & (bd != 0) & (vd != 0) & (sign * vn // g == cn) & (jnp.abs(vd) // g == cd)
    valid = (jnp.sum(eq) == 1) & jnp.any(ok_o) & ok_c & canonical & true
    return complete & ~too_long & ~valid


def step_is_wrong(tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """tokens [..., S] int32 (a step's ids, padded), lengths [...] -> bool [...]: provably not a valid step."""
    return jnp.vectorize(_one_step_is_wrong, signature="(s),()->()")(tokens, lengths)
