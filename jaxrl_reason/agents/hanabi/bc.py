"""Behaviour cloning of a recurrent Hanabi policy from replayed game records.

Each (game, seat) is one sequence: the seat's observation every turn (its GRU
carry advances every turn) and a cross-entropy target on the turns it moved,
with illegal actions masked. One jitted epoch = a ``lax.scan`` over minibatches
of games.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.agents.hanabi.ippo import make_policy, unroll
from jaxrl_reason.models.policies import masked_logits
from jaxrl_reason.utils.guard import guard_optimizer
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class BCConfig:
    epochs: int = 20
    batch_games: int = 32
    lr: float = 1e-3
    hidden: int = 128
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.epochs, self.batch_games, self.hidden) < 1:
            raise ValueError("BCConfig: epochs, batch_games, hidden must be >= 1")


def sequences(data: dict) -> dict:
    """Replay data (``records.replay``) -> time-major per-(game, seat) arrays, cut to the longest game."""
    g, t, n = data["legal"].shape[:3]
    length = int(data["valid"].sum(1).max())
    seat = np.arange(n)[None, None, :]
    acted = (data["player"][..., None] == seat) & data["valid"][..., None]  # [G, T, N]
    acts = np.where(acted, data["actions"][..., None], data["legal"].shape[-1] - 1)
    tm = lambda x: np.swapaxes(x[:, :length], 0, 1)  # [T, G, ...]
    first = np.zeros((length, g, n), bool)
    first[0] = True
    return {"obs": tm(data["obs"]).astype(np.float32), "legal": tm(data["legal"]), "acts": tm(acts),
            "acted": tm(acted), "first": first}


def train_bc(config: BCConfig, env, data: dict):
    """Returns ``(graphdef, params, losses [epochs])``. ``data`` from ``records.replay``."""
    seq = sequences(data)
    g = seq["obs"].shape[1]
    if g < config.batch_games:
        raise ValueError(f"BC needs at least batch_games={config.batch_games} valid games, got {g}")
    graphdef, params = nnx.split(make_policy(env, config.hidden, seed=config.seed))
    tx = guard_optimizer(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.lr)))
    opt_state = tx.init(params)
    seq = jax.tree.map(jnp.asarray, seq)
    n = env.num_agents

    def loss_fn(p, idx):
        sel = {k: v[:, idx] for k, v in seq.items()}
        carry = jnp.zeros((idx.shape[0], n, config.hidden))
        logits, _ = unroll(graphdef, p, carry, sel["obs"], sel["first"])
        logp = jax.nn.log_softmax(masked_logits(logits, sel["legal"]), -1)
        nll = -jnp.take_along_axis(logp, sel["acts"][..., None], -1)[..., 0]
        mask = sel["acted"].astype(jnp.float32)
        acc = (jnp.argmax(logp, -1) == sel["acts"]) * mask
        return (nll * mask).sum() / mask.sum(), acc.sum() / mask.sum()

    @jax.jit
    def epoch(params, opt_state, key):
        nb = g // config.batch_games
        perm = jax.random.permutation(key, g)[: nb * config.batch_games].reshape(nb, -1)

        def mb(c, idx):
            params, opt_state = c
            (loss, acc), grad = jax.value_and_grad(loss_fn, has_aux=True)(params, idx)
            upd, opt_state = tx.update(grad, opt_state, params)
            return (optax.apply_updates(params, upd), opt_state), (loss, acc)

        (params, opt_state), (loss, acc) = jax.lax.scan(mb, (params, opt_state), perm)
        return params, opt_state, loss.mean(), acc.mean()

    key = jax.random.key(config.seed)
    losses, accs = [], []
    for k in jax.random.split(key, config.epochs):  # a few dozen epochs; each is one jitted scan
        params, opt_state, loss, acc = epoch(params, opt_state, k)
        losses.append(float(loss))
        accs.append(float(acc))
    return graphdef, params, {"loss": np.asarray(losses), "accuracy": np.asarray(accs)}
