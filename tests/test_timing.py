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
