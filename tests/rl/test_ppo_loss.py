"""The PPO loss against a hand-computed example."""

import jax.numpy as jnp
import pytest

from jaxrl_reason.rl.ppo_loss import ppo_loss


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
