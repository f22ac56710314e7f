"""experiments/tool_use.py through the CLI: a 2-step run writes its results with SE and n; the agent
(``agents.tool_use``) is a host rollout of the one learner that takes any registered estimator; GRPO with the
calculator improves the held-out accuracy of its start (fixed seed)."""

import dataclasses
import json
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.tool_use import sft_start, tool_use_learner, tool_use_model
from jaxrl_reason.cli import run_experiment
from jaxrl_reason.experiments.tool_use import Config
from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.tasks.tool_calc import ToolCalcTask

SFT_STEPS = 300  # (200: the copying is not learnt, nor then the calls)
TINY = ["--logger", "none", "--sft-steps", "5", "--sft-problems", "64", "--steps", "2", "--prompts-per-step", "2",
        "--group-size", "2", "--eval-problems", "8", "--eval-batch", "8", "--log-every", "1"]


def test_tool_use_two_steps_end_to_end(tmp_path):
    s = run_experiment("tool_use", ["--run-root", str(tmp_path), *TINY])
    assert s["n_heldout"] == 8
    for k in ("start_tool", "start_no_tool", "final_tool", "final_no_tool"):
        assert 0 <= s[f"{k}_accuracy"] <= 1 and s[f"{k}_se"] >= 0
    assert {"calls", "malformed", "oversized", "turn_limit", "no_answer", "disabled_calls"} <= set(s["final_tool_metrics"])
    run = pathlib.Path(s["run_dir"])
    assert (run / "results.csv").is_file() and (run / "tool_use.png").is_file()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("train_malformed" in m for m in metrics) and any("eval_tool_accuracy" in m for m in metrics)


def test_tool_use_refuses_bad_options(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_experiment("tool_use", ["--run-root", str(tmp_path), "--group-size", "1"])
    assert "group_size >= 2" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(ValueError, match="sft_call_fraction must be a finite number in"):
        Config(sft_call_fraction=1.5)
    with pytest.raises(ValueError, match="registered advantage estimator"):
        Config(advantage="nope")


def test_the_agent_is_a_host_rollout_of_the_learner_with_any_estimator():
    """One step with RLOO: B = prompts x group rows, the groups are the problems; a model too short for an episode
    is refused; ``close`` shuts the rollouts' pools."""
    cfg = dataclasses.replace(Config(), prompts_per_step=2, group_size=2, advantage="rloo", eval_problems=4)
    model = tool_use_model(cfg)
    learner, agent = tool_use_learner(cfg, model)
    assert agent.host and learner.config.advantage == "rloo" and learner.config.temperature == cfg.temperature
    with agent:
        state = learner.init(jax.random.key(0), agent)
        problems = agent.batch(0)
        rollout, m = agent.rollout(learner.policy(state), jax.random.key(1), problems)
        assert len(rollout) == 4 and rollout.advantages is None and rollout.rewards.shape == (4,)
        np.testing.assert_array_equal(np.asarray(rollout.groups), [0, 0, 1, 1])
        assert {"train_calls", "turns", "model_tokens"} <= set(m)
        state, m = learner.step(state, agent, problems)
        assert int(state.step) == 1 and np.isfinite(float(m["loss"])) and "train_malformed" in m
        assert {"accuracy", "accuracy_se", "n"} <= set(learner.evaluate(state, agent))
    assert all(r.pool._shutdown for r in agent.rollouts.values())
    small = Transformer(dataclasses.replace(model.cfg, max_seq_len=16), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        tool_use_learner(cfg, small)


@pytest.mark.slow  # SFT + 20 GRPO steps: ~60 s on 2 quiet cores (157 s under a load of 8)
def test_grpo_with_the_calculator_learns_to_call_it_and_answers_better():
    """A start SFT'd to call the tool on 30% of its traces (greedy: never); 20 GRPO steps (fixed seed) make it call
    and raise its held-out greedy accuracy (n = 128) by more than 2 SE of the difference (measured: 0.016 -> 0.125,
    calls 0 -> 0.99)."""
    cfg = dataclasses.replace(Config(), task=ToolCalcTask(low=10, high=40, forms=("{a}*{b}",)), sft_problems=1024,
                              sft_steps=SFT_STEPS, sft_tool_fraction=1.0, steps=20, eval_problems=128,
                              eval_batch=128, chunks=1)
    model = tool_use_model(cfg)
    sft_start(model, cfg)
    learner, agent = tool_use_learner(cfg, model)
    with agent:
        state = learner.init(jax.random.key(cfg.seed), agent)
        start = agent.evaluate(learner.policy(state))
        for s in range(cfg.steps):
            state, _ = learner.step(state, agent, agent.batch(s))
        final = agent.evaluate(learner.policy(state))
    se = np.hypot(start["accuracy_se"], final["accuracy_se"])
    assert final["calls"] > start["calls"] + 0.3, (start, final)
    assert final["accuracy"] - start["accuracy"] > 2 * se, (start, final)
