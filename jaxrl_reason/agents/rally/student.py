"""Is the lookahead's gain over the RALLY prior learnable by a role policy? The pieces of
``experiments/rally_lookahead.py`` (its config, presets and run stay there): the lookahead (``agents.rally.lookahead``)
plays and labels every live (step, UAV) decision with its role; a classifier learns the role from the decision's
features; the student plays the prior's action with the classifier's role where it is sure of a change.

    data = teacher_decisions(env, prior, key, num_episodes, ("local", "global"))   # {"x/<kind>", "role", "prior_role"}
    graphdef, params = fit(config, data["x/local"], data["role"], weight, key)      # config: hidden, lr, batch, steps
    policy = student_policy(env, prior, "local", graphdef, params, threshold=0.7)

``local`` features are exactly the RMIX agent net's input (the UAV's observation, its id and the prior's proposal);
``global`` ones add the swarm's global state in front.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.agents.rally import rmix
from jaxrl_reason.agents.rally.intent import act
from jaxrl_reason.agents.rally.lookahead import lookahead_policy
from jaxrl_reason.envs.swarm import NUM_ROLES
from jaxrl_reason.models.policies import MLP
from jaxrl_reason.rl.marl import common, qmix
from jaxrl_reason.utils.guard import guard_optimizer

FEATURES = ("local", "global")


def decision_features(env, kind: str, ts, proposal: jax.Array) -> jax.Array:
    """ONE environment's timestep, proposal [A] -> [A, D]: the RMIX agent input (``local``), or it with the
    global state in front (``global``)."""
    x = rmix.with_proposal(qmix.agent_input(common.flat_obs(ts)), proposal, env.num_actions)
    if kind == "global":
        g = common.global_state(ts)
        x = jnp.concatenate([jnp.broadcast_to(g, (x.shape[0], g.shape[-1])), x], -1)
    return x


def teacher_decisions(env, prior, key, num_episodes: int, kinds) -> dict:
    """The lookahead plays; -> {"x/<kind>": [N, D], "role": [N] (its role), "prior_role": [N]} over live decisions."""
    teacher = lookahead_policy(env, prior)

    def episode(key):
        state, ts = env.reset(key)

        def body(c, k):
            state, ts, alive = c
            proposal = act(prior, k, ts).astype(jnp.int32)
            _, action = teacher(None, k, ts, state)
            out = ({f"x/{kind}": decision_features(env, kind, ts, proposal) for kind in kinds}, action % NUM_ROLES,
                   proposal % NUM_ROLES, jnp.broadcast_to(alive, proposal.shape))
            state, ts = env.step(k, state, action)
            return (state, ts, alive & ~ts.done), out

        return jax.lax.scan(body, (state, ts, jnp.bool_(True)), jax.random.split(key, env.max_episode_steps))[1]

    x, role, prior_role, alive = jax.jit(jax.vmap(episode))(jax.random.split(key, num_episodes))
    live = np.asarray(alive)
    data = {k: np.asarray(v)[live] for k, v in x.items()}
    return {**data, "role": np.asarray(role)[live], "prior_role": np.asarray(prior_role)[live]}


class RoleClassifier(nnx.Module):
    """An MLP torso (tanh) and a linear head: a decision's features -> logits over the roles."""

    def __init__(self, in_dim: int, hidden: int, *, rngs: nnx.Rngs):
        self.torso = MLP([in_dim, hidden, hidden], rngs=rngs)
        self.head = nnx.Linear(hidden, NUM_ROLES, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.torso(x)))


def fit(config, x: np.ndarray, role: np.ndarray, weight: np.ndarray, key) -> tuple:
    """A ``RoleClassifier`` (``config.hidden`` units, seeded by ``config.seed``) fit to ``role`` from ``x``: weighted
    cross-entropy, Adam (``config.lr``), ``config.train_steps`` batches of ``config.batch_size`` -> (graphdef,
    params)."""
    graphdef, params = nnx.split(RoleClassifier(x.shape[-1], config.hidden, rngs=nnx.Rngs(config.seed)))
    tx = guard_optimizer(optax.adam(config.lr))

    def step(carry, k):
        params, opt = carry
        idx = jax.random.randint(k, (config.batch_size,), 0, x.shape[0])

        def loss(p):
            ce = optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, p)(x[idx]), role[idx])
            return jnp.sum(weight[idx] * ce) / jnp.sum(weight[idx])

        grads = jax.grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), None

    x, role, weight = jnp.asarray(x), jnp.asarray(role), jnp.asarray(weight)
    (params, _), _ = jax.jit(lambda p, ks: jax.lax.scan(step, (p, tx.init(p)), ks))(
        params, jax.random.split(key, config.train_steps))
    return graphdef, params


def student_policy(env, prior, kind: str, graphdef, params, threshold: float):
    """The prior's action, with the classifier's role where it is at least ``threshold`` sure of a change."""

    def policy(carry, key, ts):
        proposal = act(prior, key, ts).astype(jnp.int32)
        p = jax.nn.softmax(nnx.merge(graphdef, params)(decision_features(env, kind, ts, proposal)), -1)
        role = jnp.argmax(p, -1)
        change = (p.max(-1) >= threshold) & (role != proposal % NUM_ROLES)
        return carry, jnp.where(change, (proposal // NUM_ROLES) * NUM_ROLES + role, proposal)

    return policy
