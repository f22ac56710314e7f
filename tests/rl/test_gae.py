"""GAE against a hand-computed example."""

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.rl.gae import compute_gae


def test_gae_hand_example():
    # T=3, one env; episode ends at t=1, so t=1 does not bootstrap from t=2.
    r = jnp.array([1.0, 2.0, 3.0])
    v = jnp.array([0.5, 1.0, 1.5])
    d = jnp.array([False, True, False])
    gamma, lam, last = 0.9, 0.8, 2.0
    adv, ret = compute_gae(r, v, d, jnp.array(last), gamma, lam)
    d2 = 3.0 + gamma * last - 1.5
    d1 = 2.0 - 1.0
    d0 = 1.0 + gamma * 1.0 - 0.5
    expected = np.array([d0 + gamma * lam * d1, d1, d2])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + np.asarray(v), rtol=1e-6)
