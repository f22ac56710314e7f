"""``Environment.info_metrics``: the swarm's own metric (coverage), forwarded by wrappers; none by default."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason import envs


def _step(env):
    """The timestep of one all-zero action after reset (jitted: eagerly, each op of a step compiles on its own)."""

    @jax.jit
    def one_step():
        state, _ = env.reset(jax.random.key(0))
        return env.step(jax.random.key(1), state, jnp.zeros(env.action_shape(), jnp.int32))[1]

    return one_step()


def test_swarm_reports_coverage_and_wrappers_forward_it():
    swarm = envs.make("swarm", num_agents=3, num_targets=2, max_steps=10)
    ts = _step(swarm)
    metrics = swarm.info_metrics(ts.info)
    assert set(metrics) == {"coverage"}
    np.testing.assert_array_equal(metrics["coverage"], ts.info["coverage"])
    wrapped = envs.EpisodeStats(envs.AutoReset(swarm))
    wts = _step(wrapped)
    assert set(wrapped.info_metrics(wts.info)) == {"coverage"}
    np.testing.assert_array_equal(wrapped.info_metrics(wts.info)["coverage"], ts.info["coverage"])


def test_default_is_no_metrics():
    catch = envs.make("catch")
    assert catch.info_metrics(_step(catch).info) == {}
    assert envs.AutoReset(catch).info_metrics(_step(catch).info) == {}
