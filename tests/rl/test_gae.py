"""GAE and the PPO loss against hand-computed examples."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.rl.gae import compute_gae
from jaxrl_reason.rl.ppo_loss import ppo_loss


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


def test_ppo_loss_hand_example():
    logp = jnp.log(jnp.array([0.5, 0.9]))
    old = jnp.log(jnp.array([0.25, 0.9]))
    adv = jnp.array([1.0, -1.0])
    zeros = jnp.zeros(2)
    loss, m = ppo_loss(logp, old, adv, zeros, zeros, zeros, zeros, clip_eps=0.2, ent_coef=0.0)
    # ratio 2 clipped to 1.2 for the positive advantage; ratio 1 for the other.
    assert m["policy_loss"] == pytest.approx(-(1.2 * 1.0 + 1.0 * -1.0) / 2)
    assert m["clip_fraction"] == pytest.approx(0.5)
    mask = jnp.array([False, True])
    _, m2 = ppo_loss(logp, old, adv, zeros, zeros, zeros, zeros, mask=mask)
    assert m2["policy_loss"] == pytest.approx(1.0)
