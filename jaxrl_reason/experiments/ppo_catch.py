"""PPO (PureJaxRL shape) on a small registered environment: the quickstart job.

Trains, checkpoints every few chunks, logs curves, and evaluates the greedy policy
against a uniformly random one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jaxrl_reason import envs
from jaxrl_reason.rl import ppo
from jaxrl_reason.rl.evaluate import evaluate, random_policy
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.loop import run_chunks
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "catch"
    seed: int = 0
    ppo: ppo.PPOConfig = ppo.PPOConfig()
    checkpoint_every: int = 1  # chunks
    eval_episodes: int = 1000

    def __post_init__(self):
        check_hyperparameters(self)
        if self.env not in envs.registered_names():
            raise ValueError(f"unknown env {self.env!r}; registered: {envs.registered_names()}")
        if self.checkpoint_every < 1 or self.eval_episodes < 1:
            raise ValueError("checkpoint_every and eval_episodes must be >= 1")


PRESETS = {
    "cpu": Config(ppo=ppo.PPOConfig(num_envs=32, num_steps=16, total_timesteps=61_440, updates_per_chunk=6)),
    "gpu": Config(ppo=ppo.PPOConfig(num_envs=4096, num_steps=32, total_timesteps=50_000_000,
                                    updates_per_chunk=20, policy="gru", hidden=128)),
}


def run(config: Config, run_dir: RunDir) -> dict:
    env = envs.make(config.env)
    trainer = ppo.make_chunked(config.ppo, env)
    key_train, key_eval = jax.random.split(jax.random.key(config.seed))
    state = run_chunks(
        run_dir,
        jax.jit(trainer.init)(key_train),
        jax.jit(trainer.update),
        config.ppo.num_chunks,
        steps_per_chunk=config.ppo.updates_per_chunk,
        checkpoint_every=config.checkpoint_every,
        desc=f"ppo {config.env}",
    )
    run_dir.plot(["episode_return", "entropy", "value_loss"], "curves.png", title=f"PPO on {config.env}")

    @functools.partial(jax.jit, static_argnums=(0,))
    def play(policy, params, key):
        fn, carry = ppo.evaluation_policy(env, trainer.graphdef, params) if policy else random_policy(env)
        return evaluate(env, fn, carry, key, config.eval_episodes)["return"].mean(0)

    trained = np.asarray(play(True, state.params, key_eval))
    baseline = np.asarray(play(False, None, key_eval))
    rows = [
        {"policy": "random legal", "mean_return": float(baseline.mean())},
        {"policy": "PPO greedy", "mean_return": float(trained.mean())},
    ]
    print(run_dir.write_table("results", rows))
    return {
        "env": config.env,
        "env_steps": int(state.update) * config.ppo.num_envs * config.ppo.num_steps,
        "random_return": float(baseline.mean()),
        "ppo_return": float(trained.mean()),
        "run_dir": str(run_dir.path),
    }


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
