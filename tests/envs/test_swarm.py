"""Swarm environment: dynamics limits, observation masking, rewards on hand-built states,
termination rules, neighbour selection, config errors and hypothesis invariants."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.swarm import COORDINATOR, EXECUTOR, NUM_ROLES, dynamics

KW = dict(num_agents=3, num_targets=2, num_adversaries=1, max_steps=8, max_need=1)
ENV_D = envs.make("swarm", **KW)
ENV_C = envs.make("swarm", **{**KW, "control": "continuous"})


@pytest.fixture(scope="module")
def env():
    return ENV_D


@functools.lru_cache(maxsize=None)
def jitted(env):
    return jax.jit(env.reset), jax.jit(env.step)


def hand_state(env, **overrides):
    """A quiet state: UAVs at rest, targets at (+-0.5, 0.5), pursuer far in a corner."""
    state, _ = jitted(env)[0](jax.random.key(0))
    base = dict(
        pos=jnp.array([[-0.5, -0.5], [0.0, -0.5], [0.5, -0.5]]),
        vel=jnp.zeros((3, 2)),
        target_pos=jnp.array([[-0.5, 0.5], [0.5, 0.5]]),
        urgency=jnp.array([1.0, 0.5]),
        need=jnp.ones((2,)),
        adv_pos=jnp.array([[-0.95, 0.95]]),
    )
    base.update(overrides)
    return state.replace(**base)


def act(target, role):
    return target * NUM_ROLES + role


def test_integrate_respects_limits():
    pos, vel = jnp.zeros((5, 2)), jnp.array([[0.4, 0.0]] * 5)
    acc = jnp.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0], [0.0, 0.0], [3.0, 4.0]])
    new_pos, new_vel = dynamics.integrate(pos, vel, acc, 0.1, max_speed=0.5, max_accel=2.0)
    speed = np.linalg.norm(np.asarray(new_vel), axis=-1)
    dv = np.linalg.norm(np.asarray(new_vel - vel), axis=-1)
    assert (speed <= 0.5 + 1e-5).all() and (dv <= 0.2 + 1e-5).all()
    np.testing.assert_allclose(np.asarray(new_pos), np.asarray(new_vel) * 0.1, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new_vel[3]), [0.4, 0.0], atol=1e-6)


def test_config_errors():
    with pytest.raises(ValueError, match="dim must be 2 or 3"):
        envs.make("swarm", dim=4)
    with pytest.raises(ValueError, match="control must be"):
        envs.make("swarm", control="joystick")
    with pytest.raises(ValueError, match="num_agents must be >= 1"):
        envs.make("swarm", num_agents=0)
    with pytest.raises(TypeError, match="accepted: num_agents"):
        envs.make("swarm", bogus=1)


def test_observation_radius_masking(env):
    c = env.config
    # target 0 within obs_radius of UAV 0 (distance 0.3), target 1 far from it (distance > 1).
    state = hand_state(env, pos=jnp.array([[-0.5, 0.2], [0.5, 0.2], [0.9, -0.9]]))
    obs, nbrs = jax.jit(env.encode)(state)
    per = c.dim + 4
    tgt = np.asarray(obs[0, env.obs_slices["targets"]]).reshape(2, per)
    np.testing.assert_allclose(tgt[0, :2], [0.0, 0.3], atol=1e-6)
    assert tgt[0, -1] == 1.0 and tgt[0, 2] == pytest.approx(1.0)  # visible, urgency
    assert (tgt[1] == 0).all(), "a target outside obs_radius must be fully masked"
    # UAV 0 and 1 are 1.0 apart (> comm_radius 0.8); UAV 2 is far from both.
    assert (np.asarray(nbrs) == -1).all()
    assert (np.asarray(obs[:, env.obs_slices["neighbors"]]) == 0).all()
    assert (np.asarray(obs[:, env.obs_slices["adversaries"]]) == 0).all()
    # move UAV 1 within comm radius of UAV 0: each sees the other, present flag set
    obs, nbrs = jax.jit(env.encode)(state.replace(pos=state.pos.at[1].set(jnp.array([-0.1, 0.2]))))
    assert int(nbrs[0, 0]) == 1 and int(nbrs[1, 0]) == 0 and int(nbrs[2, 0]) == -1
    nb = np.asarray(obs[0, env.obs_slices["neighbors"]]).reshape(env.k, -1)
    np.testing.assert_allclose(nb[0, :2], [0.4, 0.0], atol=1e-6)
    assert nb[0, -1] == 1.0 and (nb[1] == 0).all()


def test_topk_neighbors_match_brute_force():
    env = envs.make("swarm", num_agents=9, num_neighbors=3, comm_radius=3.0)
    state, ts = jax.jit(env.reset)(jax.random.key(1))
    pos = np.asarray(state.pos)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1) + np.eye(9) * 1e9
    expect = np.sort(np.argsort(d, axis=1)[:, :3], axis=1)
    np.testing.assert_array_equal(np.sort(np.asarray(ts.info["neighbors"]), axis=1), expect)


def test_coverage_and_completion_rewards(env):
    reset, step = jitted(env)
    c = env.config
    # UAV 0 sits on target 0 (urgency 1 of total 1.5) and stays there; others far away.
    state = hand_state(env, pos=jnp.array([[-0.5, 0.5], [0.0, -0.5], [0.5, -0.9]]))
    action = jnp.array([act(0, EXECUTOR), act(1, COORDINATOR), act(1, EXECUTOR)])
    _, ts = step(jax.random.key(0), state, action)
    expected = c.w_cover * 1.0 / 1.5
    np.testing.assert_allclose(np.asarray(ts.reward), expected, rtol=1e-5)
    assert float(ts.info["coverage"]) == pytest.approx(1.0 / 1.5, rel=1e-5)
    # one step short of being served: the completion bonus u_0 * w_complete is added once
    near_done = state.replace(progress=jnp.array([c.serve_steps - 1.0, 0.0]))
    s1, ts = step(jax.random.key(0), near_done, action)
    np.testing.assert_allclose(np.asarray(ts.reward), expected + c.w_complete * 1.0, rtol=1e-5)
    assert bool(s1.served[0]) and int(ts.info["num_served"]) == 1 and not bool(ts.done)
    _, ts = step(jax.random.key(0), s1, action)
    np.testing.assert_allclose(np.asarray(ts.reward), 0.0, atol=1e-6)  # served targets pay no more


def test_need_gives_partial_coverage():
    env = envs.make("swarm", **{**KW, "max_need": 2})
    state = hand_state(env, pos=jnp.array([[-0.5, 0.5], [0.0, -0.5], [0.5, -0.9]]),
                       need=jnp.array([2.0, 1.0]))
    _, ts = jax.jit(env.step)(jax.random.key(0), state, jnp.array([act(0, EXECUTOR), 3, 3]))
    np.testing.assert_allclose(np.asarray(ts.reward), env.config.w_cover * 0.5 * 1.0 / 1.5, rtol=1e-5)


def test_capture_and_collision_penalties(env):
    _, step = jitted(env)
    c = env.config
    # UAVs 0 and 1 on the same spot (collision); the pursuer on top of UAV 2 (capture).
    state = hand_state(env, pos=jnp.array([[0.0, 0.0], [0.0, 0.0], [0.7, -0.7]]),
                       target_pos=jnp.array([[0.0, 0.0], [0.9, 0.9]]),
                       adv_pos=jnp.array([[0.7, -0.7]]))
    action = jnp.array([act(0, EXECUTOR), act(0, EXECUTOR), act(1, EXECUTOR)])
    s1, ts = step(jax.random.key(0), state, action)
    team = c.w_cover * 1.0 / 1.5  # target 0 covered
    np.testing.assert_allclose(np.asarray(ts.reward), [team - c.w_collision, team - c.w_collision,
                                                       team - c.w_capture], rtol=1e-5)
    assert np.asarray(s1.alive).tolist() == [True, True, False]
    assert int(ts.info["num_captured"]) == 1
    # a captured UAV is frozen, gets no further penalties, and its observation is blank
    s2, ts2 = step(jax.random.key(1), s1, action)
    np.testing.assert_allclose(np.asarray(s2.pos[2]), np.asarray(s1.pos[2]))
    assert float(ts2.reward[2]) == pytest.approx(team)
    own = np.asarray(ts2.obs[2, env.obs_slices["own"]])
    assert own[2 * c.dim] == 0.0  # active flag
    assert (np.asarray(ts2.obs[2, env.obs_slices["targets"]]) == 0).all()


def test_team_reward_shares_penalties():
    env = envs.make("swarm", **{**KW, "team_reward": True})
    state = hand_state(env, pos=jnp.array([[0.0, 0.0], [0.0, 0.0], [0.9, -0.9]]))
    _, ts = jax.jit(env.step)(jax.random.key(0), state, jnp.array([0, 0, 3]))
    r = np.asarray(ts.reward)
    assert np.allclose(r, r[0]) and r[0] < 0


def test_termination_rules(env):
    _, step = jitted(env)
    c = env.config
    action = jnp.array([act(0, EXECUTOR)] * 3)
    state = hand_state(env)
    # mission complete: every target served
    _, ts = step(jax.random.key(0), state.replace(served=jnp.array([True, True])), action)
    assert bool(ts.terminated) and not bool(ts.truncated)
    # every UAV captured
    _, ts = step(jax.random.key(0), state.replace(alive=jnp.zeros((3,), bool)), action)
    assert bool(ts.terminated) and not bool(ts.truncated)
    # time limit
    _, ts = step(jax.random.key(0), state.replace(t=jnp.int32(c.max_steps - 1)), action)
    assert bool(ts.truncated) and not bool(ts.terminated)
    _, ts = step(jax.random.key(0), state.replace(t=jnp.int32(c.max_steps - 2)), action)
    assert not bool(ts.done)


def test_continuous_3d_obstacles_variant():
    env = envs.make("swarm", num_agents=5, dim=3, control="continuous", num_obstacles=2,
                    dynamics="double_integrator", max_steps=5)
    assert env.action_dim == 3 and env.num_actions == 1
    state, ts = jax.jit(env.reset)(jax.random.key(0))
    assert ts.obs.shape == (5, *env.obs_shape) and ts.info["global_state"].shape == (env.state_dim,)
    state = state.replace(obstacles=jnp.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]),
                          pos=state.pos.at[0].set(jnp.array([0.01, 0.0, 0.0])))
    s1, ts = jax.jit(env.step)(jax.random.key(1), state, jnp.zeros((5, 3)))
    assert np.linalg.norm(np.asarray(s1.pos[0])) >= env.config.obstacle_radius - 1e-5
    r = np.asarray(ts.reward)  # same team term for all; UAV 0 also pays the obstacle collision
    assert r[0] == pytest.approx(r[1] - env.config.w_collision, abs=1e-5)


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**30), acts=st.lists(st.integers(-3, 12), min_size=3, max_size=3),
                  cont=st.lists(st.floats(-5, 5), min_size=6, max_size=6))
def test_step_invariants(seed, acts, cont):
    for env, action in ((ENV_D, jnp.array(acts, jnp.int32)), (ENV_C, jnp.array(cont).reshape(3, 2))):
        reset, step = jitted(env)
        state, ts = reset(jax.random.key(seed))
        state = state.replace(vel=jax.random.uniform(jax.random.key(seed + 1), (3, 2), minval=-0.35, maxval=0.35),
                              alive=state.alive.at[seed % 3].set(seed % 2 == 0))
        new, ts = step(jax.random.key(seed), state, action)
        c = env.config
        speed = np.linalg.norm(np.asarray(new.vel), axis=-1)
        dv = np.linalg.norm(np.asarray(new.vel - state.vel), axis=-1)
        alive = np.asarray(state.alive)
        assert (speed <= c.max_speed + 1e-5).all()
        assert (dv[alive] <= c.max_accel * c.dt + 1e-4).all()
        assert (np.abs(np.asarray(new.pos)) <= 1.0 + 1e-6).all()
        np.testing.assert_array_equal(np.asarray(new.pos)[~alive], np.asarray(state.pos)[~alive])
        assert not (np.asarray(new.alive) & ~alive).any(), "captured UAVs never come back"
        assert np.isfinite(np.asarray(ts.obs)).all() and np.isfinite(np.asarray(ts.reward)).all()
        hi = c.w_cover + c.w_complete * c.num_targets
        lo = -(c.w_capture + c.w_collision)
        assert (np.asarray(ts.reward) <= hi + 1e-5).all() and (np.asarray(ts.reward) >= lo - 1e-5).all()
        assert ts.obs.shape == (3, *env.obs_shape)


def test_learned_adversaries_are_extra_agents():
    env = envs.make("swarm", **{**KW, "adversary_control": "learned"})
    scripted = ENV_D
    assert env.num_agents == 4 and env.num_uavs == 3 and env.obs_shape == scripted.obs_shape
    reset, step = jitted(env)
    c = env.config
    # the pursuer sits on UAV 2 (capture); UAV 0 covers target 0
    state = hand_state(env, pos=jnp.array([[-0.5, 0.5], [0.0, -0.5], [0.7, -0.7]]),
                       adv_pos=jnp.array([[0.7, -0.7]]))
    uav = jnp.array([act(0, EXECUTOR), act(1, COORDINATOR), act(1, EXECUTOR)])
    s1, ts = step(jax.random.key(0), state, jnp.concatenate([uav, jnp.array([0])]))
    team = c.w_cover * 1.0 / 1.5
    np.testing.assert_allclose(np.asarray(ts.reward), [team, team, team - c.w_capture, c.w_capture - team],
                               rtol=1e-5)
    assert ts.obs.shape == (4, *env.obs_shape) and ts.info["neighbors"].shape == (4, env.k)
    # action 0 is the scripted chase: same pursuer motion as the scripted environment
    s_scripted, _ = jitted(scripted)[1](jax.random.key(0), hand_state(scripted, pos=state.pos,
                                                                      adv_pos=state.adv_pos), uav)
    np.testing.assert_allclose(np.asarray(s1.adv_pos), np.asarray(s_scripted.adv_pos), atol=1e-6)
    # heading actions: a = 2 flies along +x, a = 2 + (num_actions - 2) / 2 along -x
    quiet = hand_state(env, adv_pos=jnp.array([[0.0, 0.5]]))
    for a, sign in ((2, 1.0), (2 + (env.num_actions - 2) // 2, -1.0)):
        s2, _ = step(jax.random.key(0), quiet, jnp.concatenate([uav, jnp.array([a])]))
        v = np.asarray(s2.adv_vel[0])
        assert sign * v[0] > 0 and abs(v[1]) < 1e-5, (a, v)
    # a pursuer's "neighbours" are the UAVs within obs_radius of it (here only UAV 1)
    obs, nbrs = jax.jit(env.encode)(quiet.replace(pos=quiet.pos.at[1].set(jnp.array([0.1, 0.4]))))
    assert int(nbrs[3, 0]) == 1 and (np.asarray(nbrs[3, 1:]) == -1).all()
    with pytest.raises(ValueError, match="adversary_control"):
        envs.make("swarm", adversary_control="learned", num_adversaries=0)
