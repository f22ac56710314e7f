"""One step of exact policy improvement over a deterministic intent prior: a privileged reference for
RMIX (it reads the full environment state and simulates; no learner can act like this).

At every step the candidates are the prior's joint action and every joint action that changes ONE
UAV's role (target kept, as roles-only RMIX does): ``1 + 3 A`` candidates. Each candidate's exact value
under the prior, ``Q_prior(s, a') = r(s, a') + return of the prior afterwards``, comes from one
simulated rollout to the end of the episode (the swarm's transitions and the rule prior are
deterministic, so one rollout is exact). The best candidate is played (the prior's on ties). By the
policy improvement theorem the result is never worse than the prior on any episode.

    policy = lookahead_policy(env, prior)                   # policy(carry, key, ts, state) -> (carry, [A])
    stats = evaluate.play(env, policy, carry, key, n, with_state=True)

Cost: ``(1 + 3A) x max_steps`` simulated steps per real step (vmapped candidates, scanned rollouts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.agents.rally.intent import IntentPolicy, act
from jaxrl_reason.envs.swarm import NUM_ROLES, Swarm


def role_deviations(action: jax.Array) -> jax.Array:
    """[A] joint action -> [1 + 3A, A]: itself, then each UAV's role set to 0, 1, 2 in turn (target kept)."""
    target = action // NUM_ROLES
    num_agents = action.shape[0]
    agent = jnp.repeat(jnp.arange(num_agents), NUM_ROLES)  # [3A]
    role = jnp.tile(jnp.arange(NUM_ROLES), num_agents)
    changed = jnp.where(jnp.arange(num_agents)[None] == agent[:, None], target[agent][:, None] * NUM_ROLES
                        + role[:, None], action[None])
    return jnp.concatenate([action[None], changed])


def prior_values(env: Swarm, prior: IntentPolicy, state, ts, candidates: jax.Array) -> jax.Array:
    """Exact ``Q_prior`` [C] of candidate joint actions [C, A] at (state, ts): the candidate, then the prior
    to the end of the episode; return = sum of the per-step mean reward over UAVs, as ``evaluate.play``."""
    if not env.deterministic_transition:
        raise ValueError("lookahead needs deterministic transitions (one rollout per candidate is then exact)")
    key = jax.random.key(0)  # unused by deterministic transitions and the rule prior

    def rollout(first):
        def body(c, i):
            state, ts, alive, ret = c
            a = jnp.where(i == 0, first, act(prior, key, ts))
            state, ts = env.step(key, state, a)
            return (state, ts, alive & ~ts.done, ret + alive * ts.reward.mean()), None

        init = (state, ts, ~ts.done, jnp.float32(0.0))
        return jax.lax.scan(body, init, jnp.arange(env.max_episode_steps))[0][3]

    return jax.vmap(rollout)(candidates)


def lookahead_policy(env: Swarm, prior: IntentPolicy):
    """-> ``policy(carry, key, ts, state) -> (carry, [A] actions)``: the prior improved by one step."""

    def policy(carry, key, ts, state):
        candidates = role_deviations(act(prior, key, ts).astype(jnp.int32))
        q = prior_values(env, prior, state, ts, candidates)
        return carry, candidates[jnp.argmax(q)]  # argmax takes the first maximum: the prior's on ties

    return policy


__all__ = ["lookahead_policy", "prior_values", "role_deviations"]
