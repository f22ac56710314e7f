"""A user's agent in one file (``examples/copy_letter.py``, not in the package) trains on the one learner from a
script and from the command line (``--rollout FILE.py:NAME``)."""

from __future__ import annotations

import json

import jax
import pytest

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.rl.lm import Learner, LearnerConfig, LossConfig
from jaxrl_reason.rl.lm.agents import load_agent_factory

SPEC = "examples/copy_letter.py:make_agent"


def test_a_user_agent_from_its_file_learns_on_the_learner():
    """Fixed seed: 60 steps take the game's sampled reward (64 episodes, the same key) from ~0.04 to ~0.7."""
    tok = CharTokenizer()
    model = build_model(TinyLM(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=16), 0, tok)
    learner = Learner(LearnerConfig(lr=3e-3, loss=LossConfig(aggregation="token_mean")), model)
    agent = load_agent_factory(SPEC)(learner.graphdef, tok)
    state = learner.init(jax.random.key(0), agent)
    before = learner.evaluate(state, agent)
    for _ in range(60):
        state, m = learner.step(state, agent)
    after = learner.evaluate(state, agent)
    assert before["n"] == after["n"] == 64 and int(state.step) == 60
    gain = after["reward"] - before["reward"]
    assert gain > 0.3 and gain > 4 * (before["reward_se"] ** 2 + after["reward_se"] ** 2) ** 0.5, (before, after)
    assert {"reward", "first_try", "loss", "grad_norm", "entropy"} <= set(m)  # the agent's metric beside the learner's


def test_the_command_line_runs_a_user_agent(tmp_path, capsys):
    from jaxrl_reason.cli import run_experiment

    out = run_experiment("agent", ["--rollout", SPEC, "--steps", "2", "--eval-every", "1", "--run-root",
                                   str(tmp_path), "--logger", "none"])
    assert out["steps"] == 2 and out["n"] == 64 and 0 <= out["start_reward"] <= 1
    assert (tmp_path / "agent").is_dir() and json.loads((next((tmp_path / "agent").iterdir()) / "hf" /
                                                         "config.json").read_text())
    evals = [json.loads(line) for line in (next((tmp_path / "agent").iterdir()) / "metrics.jsonl").open()
             if "eval/reward" in line]
    assert [e["step"] for e in evals] == [0, 1, 2]


@pytest.mark.parametrize("spec, msg", [
    ("examples/copy_letter.py", "must be FILE.py:NAME"),
    ("examples/nope.py:make_agent", "no file"),
    ("examples/copy_letter.py:LETTERS", "LETTERS is a str"),
    ("examples/copy_letter.py:missing", "has no function 'missing'"),
])
def test_a_bad_rollout_spec_is_a_clear_error(spec, msg):
    with pytest.raises(ValueError, match=msg):
        load_agent_factory(spec)
