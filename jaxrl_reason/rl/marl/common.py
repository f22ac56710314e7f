"""Small helpers shared by the multi-agent learners (MAPPO, QMIX/RMIX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason import envs
from jaxrl_reason.rl.onpolicy import flat_obs  # noqa: F401 (re-exported: defined with the on-policy trainer)


def global_state(ts: envs.TimeStep) -> jax.Array:
    """``[..., S]`` centralised state: ``ts.info["global_state"]`` when the environment
    provides it, else every agent's observation concatenated."""
    if "global_state" in ts.info:
        return ts.info["global_state"].astype(jnp.float32)
    lead = ts.legal_action_mask.shape[:-2]
    return ts.obs.reshape(*lead, -1).astype(jnp.float32)


def global_state_dim(env: envs.Environment) -> int:
    return int(jax.eval_shape(lambda k: global_state(env.reset(k)[1]), jax.random.key(0)).shape[-1])


def with_agent_id(obs: jax.Array) -> jax.Array:
    """``[..., A, D] -> [..., A, D + A]``: append a one-hot agent index (parameter sharing)."""
    A = obs.shape[-2]
    eye = jnp.broadcast_to(jnp.eye(A, dtype=jnp.float32), (*obs.shape[:-2], A, A))
    return jnp.concatenate([obs.astype(jnp.float32), eye], -1)


def check_discrete_simultaneous(env: envs.Environment, algo: str) -> None:
    if env.action_dim is not None:
        raise ValueError(f"{algo} needs discrete actions; {env.name} has action_dim={env.action_dim}")
    if env.turn_based:
        raise ValueError(f"{algo} is for simultaneous-move environments; {env.name} is turn-based")
