"""Local verification of one RandomCalculation reasoning step ``a op b=c`` (a process check).

Needs no reference solution: a step is *valid* when it is well formed and arithmetically true, with
``c`` written as ``fmt`` writes it (lowest terms, no denominator for integers). Two forms:

    step_is_valid("7*2=15,")                                  # host text -> False
    step_is_wrong(tokens [..., S], lengths [...], tokenizer)  # jittable, on token ids -> bool [...]
    check = step_checker(tokenizer)                           # the same as check(tokens, lengths) (cached)

The token form reads the ids of ``tokenizer`` (``models.tokenizer``): it needs each character of a step
(digits, ``+-*/=`` and ``,``) to be one token on its own (``tokenizer.encode(ch)``, decoding back to ``ch``)
and ``</think>`` as one token, e.g. ``CharTokenizer``, ``ByteTokenizer`` or a byte-level BPE checkpoint
tokenizer (Qwen2/3, Llama 3, DeepSeek-V3: every printable ASCII character is one token); its id tables are
built once per tokenizer (static ids, no global vocabulary). It reads steps spelled one token per character
(as ``CharTokenizer`` writes them, and as ``models.tokenizer.SpelledTokenizer`` spells a BPE's
text: valid ids, not the canonical merged tokenization). A step holding a token that spells several step
characters (a BPE merge such as ``14`` or ``=1``, which a checkpoint may still generate) is not read, so not
judged; a token whose text has any other character (a letter, a space, a tag) makes the step malformed.

``step_is_wrong`` judges only *complete* steps (the last token is ``,`` or ``</think>``) whose
numbers have at most ``MAX_DIGITS`` digits (int32 arithmetic): it returns True only for a step it
can show is not valid, so a search may prune on it. On those steps it agrees with ``step_is_valid``.

The trace text is ambiguous for ``n/(p/q)``, written ``n/p/q``: both checks read ``(n/p)/q``, as a
greedy parse does, so such gold steps (about 1.4% of steps with all four operations; none without
``/``) are called invalid.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.random_calculation import _apply, fmt

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


class _Ids(NamedTuple):
    """A tokenizer's static ids and character tables for the in-jit check."""

    digit: np.ndarray  # [vocab] int32: the digit of a token, -1 for any other token
    op: np.ndarray  # [vocab] int32: the index of a token's operator in "+-*/", -1 for any other token
    merged: np.ndarray  # [vocab] bool: the token spells 2+ characters, all of STEP_CHARS (a step holding one is not judged)
    minus: int
    slash: int
    eq: int
    zero: int
    ends: tuple[int, int]  # the step delimiters: "," and "</think>"
    pad: int


STEP_CHARS = "0123456789+-*/=,"


def _name(tokenizer: Tokenizer) -> str:
    return f"{type(tokenizer).__name__} (vocab {tokenizer.vocab_size})"


def _char_id(tokenizer: Tokenizer, ch: str) -> int:
    try:
        return tokenizer.spell(ch)[0]
    except ValueError as e:
        raise ValueError(f"calc_steps: {e}; the in-jit step check reads steps spelled one token per character "
                         "(a character-level tokenizer, or a byte-level BPE such as Qwen2/3, Llama 3, DeepSeek-V3)") from None


def _merged(tokenizer: Tokenizer) -> np.ndarray:
    """[vocab] bool: ids whose text is 2+ characters, all of ``STEP_CHARS`` (one host decode per id, once)."""
    out = np.zeros((tokenizer.vocab_size,), bool)
    for i in range(tokenizer.vocab_size):
        text = tokenizer.decode([i])
        out[i] = len(text) > 1 and all(c in STEP_CHARS for c in text)
    return out


@functools.lru_cache(maxsize=16)
def _ids(tokenizer: Tokenizer) -> _Ids:
    """The tables of ``tokenizer`` (built once per tokenizer object); ValueError naming the first character
    of a step that is not one token on its own."""
    chars = {c: _char_id(tokenizer, c) for c in STEP_CHARS}
    think_end = tokenizer.single_token_id("</think>")
    if think_end is None:
        raise ValueError(f"calc_steps: '</think>' is not one token of {_name(tokenizer)}")

    def table(cs: str) -> np.ndarray:
        t = np.full((tokenizer.vocab_size,), -1, np.int32)
        t[[chars[c] for c in cs]] = np.arange(len(cs))
        return t

    if tokenizer.pad_id in set(chars.values()) | {think_end}:
        raise ValueError("calc_steps: the pad token must not be a character of a step")
    return _Ids(table("0123456789"), table("+-*/"), _merged(tokenizer), chars["-"], chars["/"], chars["="], chars["0"],
                (chars[","], think_end), tokenizer.pad_id)


def _number(ids: _Ids, tok, digit, pos, i, j):
    """Parse tok[i:j] as ``-?d+(/d+)?`` -> (ok, numerator, denominator, canonical) (int32 scalars)."""
    neg = tok[i] == ids.minus
    s = i + neg.astype(jnp.int32)
    slash = (tok == ids.slash) & (pos > s) & (pos < j)
    has_slash = jnp.any(slash)
    q = jnp.where(has_slash, jnp.argmax(slash), j)
    num_span, den_span = (pos >= s) & (pos < q), (pos > q) & (pos < j)
    ok = ((jnp.sum(slash) <= 1) & jnp.all(jnp.where(num_span | den_span, digit >= 0, True))
          & jnp.any(num_span) & (~has_slash | jnp.any(den_span)))
    value = lambda span, end: jnp.sum(jnp.where(span, jnp.maximum(digit, 0) * 10 ** jnp.clip(end - 1 - pos, 0, 9), 0))
    num, den = value(num_span, q), jnp.where(has_slash, value(den_span, j), 1)
    no_leading_zero = lambda span, start: (tok[start] != ids.zero) | (jnp.sum(span) == 1)
    canonical = (no_leading_zero(num_span, s) & (~has_slash | (no_leading_zero(den_span, q + 1) & (den > 1)))
                 & ~(neg & (num == 0)) & (jnp.gcd(num, den) == 1))
    return ok, jnp.where(neg, -num, num), den, canonical


def _one_step_is_wrong(ids: _Ids, tok, n):
    """tok [S] int32, n scalar -> True iff the step is complete, judgeable and not valid."""
    pos = jnp.arange(tok.shape[0])
    complete = (n >= 1) & jnp.isin(tok[jnp.maximum(n - 1, 0)], jnp.array(ids.ends))
    m = n - 1  # body length, without the delimiter
    tok = jnp.where(pos < m, tok, ids.pad)
    digit = jnp.asarray(ids.digit)[tok]
    # a digit run longer than MAX_DIGITS could overflow int32: such a step is not judged
    last_non_digit = jax.lax.cummax(jnp.where(digit < 0, pos, -1))
    too_long = jnp.max(jnp.where(digit >= 0, pos - last_non_digit, 0)) > MAX_DIGITS
    unread = jnp.any(jnp.asarray(ids.merged)[tok] & (pos < m))  # a merged token: not read, so not judged
    eq = tok == ids.eq
    e = jnp.argmax(eq)

    def split(o):  # operator at o: both sides must be numbers
        ok_a, an, ad, _ = _number(ids, tok, digit, pos, 0, o)
        ok_b, bn, bd, _ = _number(ids, tok, digit, pos, o + 1, e)
        return (jnp.asarray(ids.op)[tok[o]] >= 0) & (o >= 1) & (o < e - 1) & ok_a & ok_b, an, ad, bn, bd

    # the last such o (a regex's greedy first operand: "6/4/2" is (6/4)/2)
    ok_o, an, ad, bn, bd = jax.vmap(split)(pos)
    o = jnp.maximum(jnp.max(jnp.where(ok_o, pos, -1)), 0)
    an, ad, bn, bd, op = an[o], ad[o], bn[o], bd[o], jnp.asarray(ids.op)[tok[o]]
    vn = jnp.select([op == 0, op == 1, op == 2], [an * bd + bn * ad, an * bd - bn * ad, an * bn], an * bd)  # "+-*/"
    vd = jnp.where(op == 3, ad * bn, ad * bd)
    ok_c, cn, cd, canonical = _number(ids, tok, digit, pos, e + 1, m)
    g = jnp.maximum(jnp.gcd(vn, vd), 1)
    sign = jnp.where(vd < 0, -1, 1)
    true = (ad != 0) & (bd != 0) & (vd != 0) & (sign * vn // g == cn) & (jnp.abs(vd) // g == cd)
    valid = (jnp.sum(eq) == 1) & jnp.any(ok_o) & ok_c & canonical & true
    return complete & ~too_long & ~unread & ~valid


def step_is_wrong(tokens: jax.Array, lengths: jax.Array, tokenizer: Tokenizer) -> jax.Array:
    """tokens [..., S] int32 (a step's ids of ``tokenizer``, padded), lengths [...] -> bool [...]: provably not
    a valid step. ``tokenizer`` is static (a Python object, not traced)."""
    one = functools.partial(_one_step_is_wrong, _ids(tokenizer))
    return jnp.vectorize(one, signature="(s),()->()")(tokens, lengths)


@functools.lru_cache(maxsize=16)
def step_checker(tokenizer: Tokenizer):
    """-> ``check(tokens, lengths) -> bool [...]``: ``step_is_wrong`` for ``tokenizer``, the
    ``step_is_wrong`` / ``value_check`` of ``search.lm_mcts.make_step_search``. One function object per
    tokenizer (cached), so it can be a static argument without recompiling."""
    _ids(tokenizer)  # fail here, not inside a trace, for a tokenizer without one token per character
    return functools.partial(step_is_wrong, tokenizer=tokenizer)
