"""rl.onpolicy: the family's shared config names and checks, advantage normalisation, and the hooks
(partner seats leave the loss, targets state threads through updates, auxiliary losses mix convexly)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.hanabi.ippo import IPPOConfig
from jaxrl_reason.models.policies import make_policy
from jaxrl_reason.rl import onpolicy
from jaxrl_reason.rl.ppo import PPOConfig
from jaxrl_reason.rl.selfplay import SelfPlayConfig

FAMILY = (PPOConfig, IPPOConfig, SelfPlayConfig)


@pytest.mark.parametrize("config", FAMILY)
@pytest.mark.parametrize("kwargs, match", [
    (dict(num_envs=30, num_minibatches=4), "divisible"),
    (dict(num_envs=0), "num_envs"),
    (dict(num_steps=0), "num_steps"),
    (dict(gamma=1.5), "gamma"),
    (dict(lr=-1.0), "lr"),
    (dict(adv_norm="batch"), "adv_norm"),
    (dict(adam_eps=0.0), "adam_eps"),
])
def test_family_shares_config_names_and_checks(config, kwargs, match):
    with pytest.raises(ValueError, match=match):
        config(**kwargs)


def test_adam_eps_reaches_the_optimizer():
    """One Adam step from zero moments moves each parameter by lr * g / (|g| + eps): eps is the config's."""
    params = {"w": jnp.asarray([1e-6, 1.0])}
    grads = {"w": jnp.asarray([1e-6, 1.0])}
    for eps in (1e-5, 1e-8):
        tx = onpolicy.make_optimizer(PPOConfig(lr=1.0, anneal_lr=False, max_grad_norm=1e9, adam_eps=eps), 10)
        updates, _ = tx.update(grads, tx.init(params), params)
        np.testing.assert_allclose(updates["w"], -grads["w"] / (jnp.abs(grads["w"]) + eps), rtol=1e-4)


def test_standardise_uses_only_masked_entries():
    x = jnp.asarray([1.0, 3.0, 100.0])
    out = onpolicy.standardise(x, jnp.asarray([True, True, False]))
    np.testing.assert_allclose(out[:2], [-1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(onpolicy.standardise(x, jnp.ones(3, bool)).std(), 1.0, atol=1e-5)


def test_partner_seats_targets_state_and_convex_aux_mix():
    env = envs.make("kuhn_poker")
    build = lambda key: make_policy("mlp", env.obs_shape[0], env.num_actions, rngs=nnx.Rngs(key), hidden=(8,))
    config = SelfPlayConfig(num_envs=8, num_steps=6, num_updates=2, num_minibatches=2, update_epochs=1,
                            adv_norm="minibatch")
    partner_gd, partner_params = nnx.split(build(jax.random.key(5)))
    gae = onpolicy.gae_targets(config)

    def targets(traj, last_value, seen):
        tg, _ = gae(traj, last_value, None)
        seen = seen + jnp.stack([traj.acted[..., 0].sum(), traj.acted[..., 1].sum(), traj.partner_logits.shape[-1]])
        return tg, seen

    zero = lambda logits, values, traj, tg: (jnp.zeros(()), {})
    hooks = onpolicy.Hooks(partner=onpolicy.Partner(partner_gd, partner_params, seats=(False, True)),
                           targets=targets, targets_state=jnp.zeros(3, jnp.int32),
                           aux_losses=(("nothing", 1.0, zero),))
    trainer = onpolicy.make_trainer(config, env, build, hooks, updates_per_chunk=2)
    state0 = trainer.init(jax.random.key(0))
    state, metrics = jax.jit(trainer.update)(state0)
    acted0, acted1, num_actions = np.asarray(state.targets_state)
    assert acted0 > 0 and acted1 == 0  # seat 1 is the partner's
    assert num_actions == 2 * env.num_actions  # its logits are recorded (summed over the 2 updates)
    assert metrics["episodes"].sum() > 0 and metrics["nothing"].shape == (2,)
    # weight 1 on an auxiliary loss of 0: the main loss gets weight 0 and nothing moves
    for a, b in zip(jax.tree.leaves(state0.params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)
