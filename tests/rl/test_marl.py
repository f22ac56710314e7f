"""rl.marl on the swarm: QMIX's monotone mixer, config and environment errors, QMIX's env-step budget and its
environments split over the data mesh, a MAPPO chunk, and QMIX and MAPPO learning to share out two targets."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import evaluate as rally_eval
from jaxrl_reason.rl import ppo
from jaxrl_reason.rl.marl import mappo, qmix

ENV = envs.make("swarm", num_agents=3, num_targets=2, max_steps=30)


def test_mixer_is_monotone_in_agent_values():
    mixer = qmix.MonotoneMixer(3, 5, 8, rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(1), (64, 3))
    s = jax.random.normal(jax.random.key(2), (64, 5))
    grads = jax.vmap(jax.grad(lambda q, s: mixer(q, s)))(q, s)
    assert (np.asarray(grads) >= 0).all() and (np.asarray(grads) > 0).any()


def test_config_and_env_errors():
    with pytest.raises(ValueError, match="prefill_steps"):
        qmix.QMIXConfig(num_envs=16, prefill_steps=8)
    with pytest.raises(TypeError, match="agent_net"):
        qmix.make_chunked(qmix.QMIXConfig(), ENV, agent_net="transformer")
    with pytest.raises(ValueError, match="discrete actions"):
        qmix.make_chunked(qmix.QMIXConfig(), envs.make("swarm", control="continuous"))
    with pytest.raises(ValueError, match="explore"):
        qmix.make_chunked(qmix.QMIXConfig(), ENV, prior=qmix.Prior(qmix.uniform_behaviour(ENV), explore=1.5))
    with pytest.raises(ValueError, match="turn-based"):
        mappo.make_chunked(ppo.PPOConfig(), envs.make("tictactoe"))


def test_qmix_takes_exactly_the_env_step_budget():
    # prefill 40 -> 10 per env; 23 per env in all -> 6 online iterations of 2 steps, prefill rounded up
    # to 11; 4 iterations per chunk -> the second chunk is partial and must not overrun the budget
    cfg = qmix.QMIXConfig(num_envs=4, num_steps=2, total_timesteps=92, prefill_steps=40, iters_per_chunk=4,
                          batch_size=8, buffer_size=400, hidden=8, mixer_embed=4)
    assert (cfg.num_iters, cfg.prefill_rollout, cfg.num_chunks) == (6, 11, 2)
    trainer = qmix.make_chunked(cfg, ENV)
    state = jax.jit(trainer.init)(jax.random.key(0))
    update = jax.jit(trainer.update)
    state, _ = update(state)
    state, metrics = update(state)
    assert int(state.env_steps) == 92 and int(state.iteration) == 6
    assert int(state.buffer.current_index) == 23  # steps actually added per environment
    np.testing.assert_array_equal(np.asarray(metrics["env_steps"]), [84, 92, 92, 92])
    assert "coverage" in metrics and "bc_loss" not in metrics  # the env's info_metrics; no auxiliary loss
    assert int(np.asarray(metrics["episodes"])[2:].sum()) == 0
    with pytest.raises(ValueError, match="multiple of num_envs"):
        qmix.QMIXConfig(num_envs=16, total_timesteps=20_001)


def test_qmix_environments_split_over_the_data_mesh_take_the_same_chunk():
    """mesh="data=8": each device steps its slice of the environments (the multi-process path); the chunk equals
    the one-device chunk up to float rounding."""
    runs = {}
    for mesh in (None, "data=8"):
        cfg = qmix.QMIXConfig(num_envs=8, num_steps=2, total_timesteps=96, prefill_steps=32, iters_per_chunk=2,
                              batch_size=8, buffer_size=400, hidden=8, mixer_embed=4, mesh=mesh)
        trainer = qmix.make_chunked(cfg, ENV)
        state, metrics = jax.jit(trainer.update)(jax.jit(trainer.init)(jax.random.key(0)))
        runs[mesh] = jax.device_get(metrics), jax.tree.map(np.asarray, state.params)
        if mesh:
            obs = state.timestep.obs
            assert obs.sharding.shard_shape(obs.shape)[0] == 1  # 8 environments: one per device
    (m1, p1), (m8, p8) = runs[None], runs["data=8"]
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), p8, p1)
    with pytest.raises(ValueError, match="QMIXConfig num_envs = 4 is not divisible by the 8 devices"):
        qmix.make_chunked(qmix.QMIXConfig(num_envs=4, total_timesteps=96, prefill_steps=32, buffer_size=400,
                                          mesh="data=8"), ENV)


def test_mappo_chunk_runs():
    cfg = ppo.PPOConfig(num_envs=4, num_steps=8, total_timesteps=64, updates_per_chunk=2, num_minibatches=2)
    trainer = mappo.make_chunked(cfg, ENV)
    state, metrics = jax.jit(trainer.update)(jax.jit(trainer.init)(jax.random.key(0)))
    assert metrics["value_loss"].shape == (2,) and np.isfinite(np.asarray(metrics["value_loss"])).all()
    assert int(state.update) == 2


# The learning tests' task: two UAVs, two targets that each need one UAV, no pursuer, a shared team reward: the
# team scores by covering both targets, i.e. by the UAVs splitting up (QMIX's coordination setting).
SPLIT = envs.make("swarm", num_agents=2, num_targets=2, max_need=1, num_adversaries=0, team_reward=True, max_steps=30)
EVAL_EPISODES = 256


def paired_gain(policy, before, after) -> tuple[float, float]:
    """Mean return (mean over agents) of ``policy(after)`` minus ``policy(before)`` on the same EVAL_EPISODES
    episodes (same key: same starts), and its standard error; ``policy(params) -> (policy_fn, carry)``."""
    play = jax.jit(lambda p: rally_eval.play(SPLIT, *policy(p), jax.random.key(7), EVAL_EPISODES)["return"])
    d = np.asarray(play(after)) - np.asarray(play(before))
    return float(d.mean()), float(d.std() / np.sqrt(len(d)))


@pytest.mark.slow
def test_qmix_learns_to_split_the_targets():
    # 40k env steps (1k of them random prefill). Measured (seed 0, n = 256 paired episodes): the greedy trained
    # networks return +1.70 +- 0.26 over the untrained ones (6.59 -> 8.29; random play 6.41, the scripted prior 9.39)
    cfg = qmix.QMIXConfig(num_envs=16, num_steps=4, total_timesteps=40_000, prefill_steps=1024, iters_per_chunk=700,
                          batch_size=64, buffer_size=40_000, hidden=32, mixer_embed=16)
    trainer = qmix.make_chunked(cfg, SPLIT)
    start = jax.jit(trainer.init)(jax.random.key(0))
    state, _ = jax.jit(trainer.update)(start)
    assert int(state.iteration) == cfg.num_iters and cfg.num_chunks == 1
    gain, se = paired_gain(lambda p: qmix.greedy_policy(trainer.graphdef, p), start.params, state.params)
    assert gain > 0.8 and gain > 3 * se, (gain, se)


@pytest.mark.slow
def test_mappo_learns_to_split_the_targets():
    # 19.2k env steps, 40 updates. Measured (seed 0, n = 256 paired episodes, sampled actions): the trained policy
    # returns +1.12 +- 0.18 over the untrained one (6.46 -> 7.58; random play 6.41)
    cfg = ppo.PPOConfig(num_envs=16, num_steps=30, total_timesteps=19_200, updates_per_chunk=40, lr=1e-3, hidden=32)
    trainer = mappo.make_chunked(cfg, SPLIT)
    start = jax.jit(trainer.init)(jax.random.key(0))
    state, _ = jax.jit(trainer.update)(start)
    assert int(state.update) == cfg.num_updates == 40
    policy = functools.partial(mappo.evaluation_policy, SPLIT, trainer.graphdef, greedy=False)
    gain, se = paired_gain(policy, start.params, state.params)
    assert gain > 0.5 and gain > 3 * se, (gain, se)
