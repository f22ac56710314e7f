"""AlphaZero (search/alphazero.py) split over a data mesh: the multi-process path on 8 virtual devices."""

import jax
import numpy as np
import pytest

from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig


@pytest.mark.slow
def test_games_split_over_the_data_mesh_take_the_same_iteration():
    """mesh="data=8": each device plays and searches its slice of the self-play games (a data axis over every
    process's devices in a multi-process run); the iteration equals the one-device one up to float rounding."""
    runs = {}
    for mesh in (None, "data=8"):
        az = AlphaZero(AlphaZeroConfig(num_envs=16, rollout_length=3, num_simulations=4, sgd_steps=2,
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
