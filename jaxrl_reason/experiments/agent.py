"""Your LM agent from a file, trained by the one learner: ``--rollout FILE.py:NAME`` names a function
``NAME(graphdef, tokenizer) -> agent`` (``rl.lm.agents``; the agent: an object with ``rollout(policy, key, batch)
-> (Rollout, metrics)``, or that function itself; ``rl.lm.learner`` lists its optional hooks).

    jaxrl-reason run agent --rollout examples/copy_letter.py:make_agent
    jaxrl-reason run agent --rollout my_game.py:make_agent --model CKPT_DIR --learner.lr 1e-5 --steps 200

The model: ``--model`` a HF checkpoint directory (its weights and tokenizer), or by default a tiny LM from scratch
(``--lm.*``) on the character tokenizer. Every ``--eval-every`` steps, before the first and after the last, the
agent is evaluated (``Learner.evaluate``: the agent's ``evaluate`` hook, or its rollout's mean reward with SE and n);
the run checkpoints and resumes like every LM experiment (``rl.base.run_steps``) and ends with the policy in HF
format (``hf/``).
"""

from __future__ import annotations

import dataclasses

import jax

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.base import run_steps
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.rl.lm import Learner, LearnerConfig, LossConfig
from jaxrl_reason.rl.lm.agents import load_agent_factory
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import at_least, check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    rollout: str = "examples/copy_letter.py:make_agent"  # FILE.py:NAME, NAME(graphdef, tokenizer) -> agent
    model: str | None = None  # a HF checkpoint directory; None: a tiny LM from scratch (lm) on CharTokenizer
    lm: TinyLM = TinyLM(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=64)
    learner: LearnerConfig = LearnerConfig(lr=3e-3, loss=LossConfig(aggregation="token_mean"))
    seed: int = 0
    steps: int = 60  # 0: evaluate only
    eval_every: int = 20
    log_every: int = 10

    CHECKS = ((("steps", "eval_every", "log_every"), at_least(0)),)

    def __post_init__(self):
        check_hyperparameters(self)


PRESETS = {"cpu": Config(), "gpu": Config(steps=400, eval_every=100, log_every=25)}


def run(config: Config, run_dir: RunDir) -> dict:
    make_agent = load_agent_factory(config.rollout)
    if config.model is None:
        tok = CharTokenizer()
        model = build_model(config.lm, config.seed, tok)
    else:
        from jaxrl_reason.models.lm import load_model, load_tokenizer

        tok, model = load_tokenizer(config.model), load_model(config.model)
    learner = Learner(config.learner, model)
    agent = make_agent(learner.graphdef, tok)
    state = learner.init(jax.random.key(config.seed), agent)
    evaluate = lambda state: {f"eval/{k}": v for k, v in learner.evaluate(state, agent).items()}
    state = run_steps(run_dir, learner.step_fn(agent), state, config.steps, config.eval_every, evaluate, desc="agent",
                      log_every=config.log_every, show={"reward": "reward"})
    evals = [r for r in run_dir.read_metrics() if "eval/reward" in r]
    first, last = evals[0], evals[-1]
    saved_tok = tok if hasattr(tok, "save") else None  # (the character tokenizer has no HF files)
    exported = learner.export(state, run_dir.path / "hf", saved_tok, source=config.model)
    close = getattr(agent, "close", None)
    if close is not None:
        close()
    return {"rollout": config.rollout, "start_reward": first["eval/reward"], "start_se": first["eval/reward_se"],
            "final_reward": last["eval/reward"], "final_se": last["eval/reward_se"], "n": last["eval/n"],
            "steps": int(state.step), "hf": exported["hf"], "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
