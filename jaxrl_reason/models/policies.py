"""Small actor-critic networks (flax NNX) for vector observations.

Every policy has one recurrent-ready signature so algorithms need not care
which one they hold::

    carry = policy.initial_carry(batch_shape)
    carry, logits, value = policy(carry, obs, reset)

``obs`` is ``[*batch, obs_dim]``, ``reset`` ``[*batch]`` bool (True where an
episode starts, which zeroes a recurrent carry), ``logits`` ``[*batch,
num_actions]``, ``value`` ``[*batch]``. Feed-forward policies return an empty
carry.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


def masked_logits(logits: jax.Array, legal_mask: jax.Array | None) -> jax.Array:
    """Illegal actions get a large negative logit (finite, so gradients stay finite)."""
    if legal_mask is None:
        return logits
    return jnp.where(legal_mask, logits, jnp.finfo(logits.dtype).min / 2)


class MLP(nnx.Module):
    def __init__(self, sizes: Sequence[int], *, rngs: nnx.Rngs, final_scale: float = 1.0):
        self.layers = nnx.List(
            [
                nnx.Linear(
                    a, b, rngs=rngs,
                    kernel_init=nnx.initializers.orthogonal(
                        final_scale if i == len(sizes) - 2 else jnp.sqrt(2.0)
                    ),
                )
                for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
            ]
        )

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jnp.tanh(x)
        return x


class MLPActorCritic(nnx.Module):
    """Separate actor and critic MLP torsos (the PureJaxRL default)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int] = (64, 64), *, rngs: nnx.Rngs):
        self.actor = MLP([obs_dim, *hidden, num_actions], rngs=rngs, final_scale=0.01)
        self.critic = MLP([obs_dim, *hidden, 1], rngs=rngs, final_scale=1.0)

    def initial_carry(self, batch_shape: tuple[int, ...]) -> jax.Array:
        return jnp.zeros((*batch_shape, 0), jnp.float32)

    def __call__(self, carry, obs, reset):
        return carry, self.actor(obs), self.critic(obs)[..., 0]


class GRUActorCritic(nnx.Module):
    """Dense encoder -> GRU cell -> actor and critic heads."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64, *, rngs: nnx.Rngs):
        self.hidden = hidden
        self.encoder = nnx.Linear(obs_dim, hidden, rngs=rngs)
        self.cell = nnx.GRUCell(hidden, hidden, rngs=rngs)
        self.actor = MLP([hidden, hidden, num_actions], rngs=rngs, final_scale=0.01)
        self.critic = MLP([hidden, hidden, 1], rngs=rngs, final_scale=1.0)

    def initial_carry(self, batch_shape: tuple[int, ...]) -> jax.Array:
        return jnp.zeros((*batch_shape, self.hidden), jnp.float32)

    def __call__(self, carry, obs, reset):
        carry = jnp.where(reset[..., None], 0.0, carry)
        x = jax.nn.relu(self.encoder(obs))
        flat_carry, flat_x = carry.reshape(-1, self.hidden), x.reshape(-1, self.hidden)
        flat_carry, _ = self.cell(flat_carry, flat_x)
        carry = flat_carry.reshape(carry.shape)
        return carry, self.actor(carry), self.critic(carry)[..., 0]


POLICIES = {"mlp": MLPActorCritic, "gru": GRUActorCritic}


def make_policy(kind: str, obs_dim: int, num_actions: int, *, rngs: nnx.Rngs, **kwargs) -> nnx.Module:
    if kind not in POLICIES:
        raise ValueError(f"unknown policy kind {kind!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[kind](obs_dim, num_actions, rngs=rngs, **kwargs)
