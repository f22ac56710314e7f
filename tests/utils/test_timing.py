"""utils.timing: the interleaving order and the summary statistics (no timing is asserted)."""

import pytest

from jaxrl_reason.utils import timing


def test_interleaved_warms_up_then_alternates_rounds():
    calls = []
    fns = {"a": lambda i: calls.append(("a", i)), "b": lambda i: calls.append(("b", i))}
    t = timing.interleaved(fns, rounds=3)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert set(t) == {"a", "b"} and len(t["a"].wall) == len(t["b"].cpu) == 3
    assert t["a"].best <= t["a"].median <= max(t["a"].wall)
    with pytest.raises(ValueError, match="rounds"):
        timing.interleaved(fns, rounds=0)
    last = {}
    timing.interleaved({"sq": lambda i: i * i, "neg": lambda i: -i}, rounds=2, last=last)
    assert last == {"sq": 4, "neg": -2}  # each function's last result, for checks after the timing


def test_after_warmup_returns_the_last_result_of_one_plus_repeats_calls():
    calls = []

    def f(x):
        calls.append(x)
        return len(calls)

    out, seconds = timing.after_warmup(f, "x", repeats=3)
    assert calls == ["x"] * 4 and out == 4 and seconds >= 0
    with pytest.raises(ValueError, match="repeats"):
        timing.after_warmup(f, repeats=0)
