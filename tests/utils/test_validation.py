"""utils.validation's config tables: a config's ``CHECKS`` rows (any field type, one message form), read by the
same ``check_hyperparameters`` call as the float ranges, and ``require`` for rules between fields; the GRPO-family
configs state their common rules through them alike."""

from __future__ import annotations

import dataclasses
import math

import pytest

from jaxrl_reason.agents.joyagents.trainer import JoyConfig
from jaxrl_reason.agents.memagent.trainer import MultiConvConfig
from jaxrl_reason.agents.spiral.agent import SpiralConfig
from jaxrl_reason.rl.grpo.agent import GRPOConfig
from jaxrl_reason.rl.lm.update import UpdateConfig
from jaxrl_reason.utils.validation import (POSITIVE, Range, Rule, at_least, check_hyperparameters, one_of, or_none,
                                           require)


@dataclasses.dataclass(frozen=True)
class _Toy:
    size: int = 2
    mode: str = "a"
    every: int | None = None
    temperature: float = 1.0  # the name's range allows 0; the table says > 0
    steps: int = 4
    CHECKS = (("size", at_least(2), "pairs"), (("mode",), one_of(("a", "b"))), ("every", or_none(at_least(1), "never")),
              ("temperature", POSITIVE), ("steps", at_least(1)), ("steps", Rule(lambda n: n % 2 == 0, "even")))

    def __post_init__(self):
        check_hyperparameters(self)
        require(self, self.steps >= self.size, f"steps ({self.steps}) must be >= size ({self.size})")


@pytest.mark.parametrize("kw, msg", [
    (dict(size=1), "_Toy.size must be >= 2 (pairs), got 1"),
    (dict(size=None), "_Toy.size must be >= 2 (pairs), got None"),  # no TypeError from the comparison
    (dict(mode="c"), "_Toy.mode must be one of ('a', 'b'), got 'c'"),
    (dict(every=0), "_Toy.every must be None (never) or >= 1, got 0"),
    (dict(temperature=0.0), "_Toy.temperature must be a finite number > 0, got 0.0"),
    (dict(temperature=math.nan), "_Toy.temperature must be a finite number > 0, got nan"),
    (dict(steps=0), "_Toy.steps must be >= 1, got 0"),  # a field's rows in table order
    (dict(steps=3), "_Toy.steps must be even, got 3"),
    (dict(size=6), "_Toy: steps (4) must be >= size (6)"),  # a rule between fields, after the table
])
def test_a_table_row_names_class_field_rule_and_value(kw, msg):
    with pytest.raises(ValueError) as e:
        _Toy(**kw)
    assert str(e.value) == msg


def test_a_table_accepts_valid_values_and_names_only_fields():
    _Toy(size=4, mode="b", every=3, temperature=0.5, steps=6)

    @dataclasses.dataclass(frozen=True)
    class Typo:
        lr: float = 1.0
        CHECKS = (("learning_rate", POSITIVE),)

    with pytest.raises(TypeError, match="Typo.CHECKS names 'learning_rate', which is no field of Typo"):
        check_hyperparameters(Typo())


def test_range_with_an_open_high_end():
    r = Range(0.0, 1.0, high_open=True)
    assert 0.0 in r and 0.999 in r and 1.0 not in r and math.nan not in r and "x" not in r
    assert str(r) == "a finite number in [0, 1)" and str(Range(high=2.0, high_open=True)) == "a finite number < 2"


@pytest.mark.parametrize("cls", [GRPOConfig, MultiConvConfig, SpiralConfig, JoyConfig])
def test_the_rl_configs_state_shared_rules_alike(cls):
    """One rule, one message: sampling at temperature 0 and too few minibatches read the same in every config."""
    with pytest.raises(ValueError) as e:
        cls(temperature=0.0)
    assert str(e.value) == f"{cls.__name__}.temperature must be a finite number > 0 (RL trains on the sampler's " \
                           f"log-probs), got 0.0"
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.minibatches must be >= 1, got 0$"):
        cls(minibatches=0)
    assert "need" not in cls.__post_init__.__code__.co_varnames  # no local copy of the check


def test_update_config_table():
    with pytest.raises(ValueError, match=r"^UpdateConfig\.group must be >= 1, got 0$"):
        UpdateConfig(group=0)
    with pytest.raises(ValueError, match=r"^UpdateConfig\.old_logp must be one of \('auto', 'recompute', 'sampler'\)"):
        UpdateConfig(old_logp="fused")
