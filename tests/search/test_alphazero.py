"""AlphaZero (search/alphazero.py): config checks, one iteration and the search against random play, and the
split over a data mesh (the multi-process path on 8 virtual devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games import arena
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig, search, uniform_evaluate


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_simulations"):
        AlphaZeroConfig(num_simulations=0)
    with pytest.raises(ValueError, match="value_target"):
        AlphaZeroConfig(value_target="bootstrap")
    with pytest.raises(ValueError, match="explore_eps"):
        AlphaZeroConfig(explore_eps=1.5)


@pytest.mark.slow
def test_alphazero_iteration_runs_and_search_beats_random():
    cfg = AlphaZeroConfig(num_envs=32, num_steps=9, num_simulations=8, sgd_steps=2,
                          minibatch_size=128, hidden=(32,))
    az = AlphaZero(cfg)
    state, m = az.iteration(az.init(jax.random.key(0)))
    assert np.isfinite(float(m["loss"])) and int(m["episodes"]) > 0
    # the search itself (uniform prior, real simulator) wins far more than random does
    env = envs.make("tictactoe")

    def searcher(key, s, ts):
        return search(env, uniform_evaluate, None, key, s, ts, 16, 9, 1.0).action.astype(jnp.int32)

    ret, illegal = jax.jit(lambda k: arena.play(env, (searcher, O.batched(O.random_action)), k, 100))(jax.random.key(1))
    base, _ = jax.jit(lambda k: arena.play(env, (O.batched(O.random_action),) * 2, k, 100))(jax.random.key(1))
    assert int(illegal) == 0
    assert float((ret[:, 0] > 0).mean()) > float((base[:, 0] > 0).mean()) + 0.1
    assert float((ret[:, 0] < 0).mean()) < 0.5 * float((base[:, 0] < 0).mean())


@pytest.mark.slow
def test_games_split_over_the_data_mesh_take_the_same_iteration():
    """mesh="data=8": each device plays and searches its slice of the self-play games (a data axis over every
    process's devices in a multi-process run); the iteration equals the one-device one up to float rounding."""
    runs = {}
    for mesh in (None, "data=8"):
        az = AlphaZero(AlphaZeroConfig(num_envs=16, num_steps=3, num_simulations=4, sgd_steps=2,
                                       minibatch_size=32, hidden=(16,), mesh=mesh))
        state, metrics = az.iteration(az.init(jax.random.key(0)))
        runs[mesh] = jax.device_get(metrics), jax.tree.map(np.asarray, state.params)
        if mesh:
            obs = state.ts.obs
            assert obs.sharding.shard_shape(obs.shape)[0] == 2  # 16 games: 2 per device
    (m1, p1), (m8, p8) = runs[None], runs["data=8"]
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), p8, p1)
    with pytest.raises(ValueError, match="AlphaZeroConfig num_envs = 12 is not divisible by the 8 devices"):
        AlphaZero(AlphaZeroConfig(num_envs=12, minibatch_size=32, mesh="data=8"))
