"""rl/grpo/on_data.py and rl/grpo/flags.py (``jaxrl-reason run grpo``'s pieces) without a model: template variables,
built-in rewards by name, the rewards' weights and names, and the options a run would not use refused (the run
itself: tests/experiments/test_grpo.py)."""

import dataclasses

import pytest

from jaxrl_reason.rl.grpo.agent import GRPOConfig
from jaxrl_reason.rl.grpo.flags import check_flags
from jaxrl_reason.rl.grpo.on_data import builtin_reward, chat_kwargs, reward_fns, reward_names, synthetic_rows


@dataclasses.dataclass(frozen=True)
class _Config:  # the fields of experiments/grpo.py's config these functions read
    data: str | None = None
    eval_data: str | None = None
    steps: int = 10
    model: str | None = None
    reward: tuple | None = None
    reward_fn: tuple = ()
    reward_weight: tuple = ()
    answer_field: str | None = "answer"
    require: str = "any"
    lora_rank: int = 0
    accuracy: str | None = None
    fit_new_tokens: bool = False
    grpo: GRPOConfig = GRPOConfig()


_config = _Config


def test_chat_kwargs_reads_json_values_else_text():
    assert chat_kwargs(("enable_thinking=false", "n=3", "style=terse")) == (
        ("enable_thinking", False), ("n", 3), ("style", "terse"))
    with pytest.raises(ValueError, match="NAME=VALUE"):
        chat_kwargs(("no_value",))


def test_builtin_rewards_by_name():
    assert callable(builtin_reward("math_verify", "answer", "any"))
    with pytest.raises(ValueError, match="overlong-cache"):
        builtin_reward("overlong", "answer", "any")
    with pytest.raises(ValueError, match="unknown --reward 'nope'"):
        builtin_reward("nope", "answer", "any")
    with pytest.raises(ValueError, match="give --answer-field"):
        builtin_reward("exact_match", None, "any")


def test_reward_choice_weights_and_names():
    assert [w for _, w in reward_fns(_config())] == [1.0]  # math_verify by default
    assert reward_names(_config(reward=("math_verify", "math_verify"))) != ("math_verify", "math_verify")  # unique
    with pytest.raises(ValueError, match="at least one"):
        reward_fns(_config(reward=()))
    with pytest.raises(ValueError, match="one weight per reward"):
        reward_fns(_config(reward=("math_verify",), reward_weight=(1.0, 2.0)))


def test_check_flags_refuses_options_the_run_would_not_use():
    assert synthetic_rows(_config()) and not synthetic_rows(_config(data="d.jsonl"))
    with pytest.raises(ValueError, match="--train-rows sets the synthetic rows, which --data replaces"):
        check_flags(_config(data="d.jsonl"), {"train_rows"})
    with pytest.raises(ValueError, match="--lora-alpha needs --lora-rank"):
        check_flags(_config(), {"lora_alpha"})
    with pytest.raises(ValueError, match="--grpo.lr applies to training"):
        check_flags(_config(steps=0, data="d.jsonl"), {"grpo.lr"})
    fitted = _config(fit_new_tokens=True)
    assert not check_flags(fitted, {"grpo.max_new_tokens"}).fit_new_tokens  # the budget given is the budget
    assert check_flags(fitted, {"steps"}) is fitted
