"""Memory evolution: a shared, bounded memory of (request type, strategy) entries, written and evicted
with the GRPO rewards and retrieved into the master's route prompt. Fixed-size arrays; all jittable.

    mem = init_memory(slots=8)
    hints = retrieve(mem, kinds, tokenizer=tok)     # kinds [B] -> hint tokens [B] (a route token or "?")
    mem = write(mem, kinds, routes, rewards)        # kinds [Q], routes/rewards [Q, G] of Q reward groups

A strategy is a route index (into ``tasks.assistant.ROUTES``). ``write`` goes through the Q groups
in order (``lax.scan``); for each group of type t and every route s sampled in it, the group's mean
reward for s, r_s, is the evidence, weighted by the fraction f_s of the group's samples that used s
(a single lucky sample of a rare route is weak evidence):
  * an entry (t, s) already in memory moves towards it: score <- (1 - rate f_s) score + rate f_s r_s;
  * the best route of the group (highest f_s r_s > min_reward) that has no entry yet is written into
    a free slot with score f_s r_s, or evicts the lowest-scoring entry if f_s r_s beats its score.
``retrieve`` returns the strategy of the highest-scoring entry of the request's type if its score
exceeds ``min_reward``, else the "no hint" token. Scores live in [0, 1] (rewards are 0/1).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from jaxrl_reason.agents.joyagents.system import SystemIds
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.tasks.assistant import ROUTES


@flax.struct.dataclass
class Memory:
    """kind [K] int32 (-1 = empty slot), strategy [K] int32 (route index), score [K] float32."""

    kind: jax.Array
    strategy: jax.Array
    score: jax.Array

    @property
    def slots(self) -> int:
        return self.kind.shape[0]

    def entries(self) -> list[tuple[int, str, float]]:
        """Host-side: [(kind, route string, score)] of the filled slots."""
        k, s, v = (jax.device_get(x) for x in (self.kind, self.strategy, self.score))
        return [(int(a), ROUTES[int(b)], float(c)) for a, b, c in zip(k, s, v) if a >= 0]


def init_memory(slots: int) -> Memory:
    if slots < 1:
        raise ValueError(f"memory needs >= 1 slot, got {slots}")
    return Memory(kind=jnp.full((slots,), -1, jnp.int32), strategy=jnp.zeros((slots,), jnp.int32),
                  score=jnp.zeros((slots,), jnp.float32))


def retrieve(mem: Memory, kinds: jax.Array, min_reward: float = 0.0, *, tokenizer: Tokenizer) -> jax.Array:
    """kinds [B] -> hint tokens [B] of ``tokenizer``: the best strategy stored for each type (its route
    token), or the no-hint token."""
    ids = SystemIds.from_tokenizer(tokenizer)
    match = (mem.kind[None] == kinds[:, None]) & (mem.score[None] > min_reward)  # [B, K]
    best = jnp.argmax(jnp.where(match, mem.score[None], -jnp.inf), axis=1)
    tokens = jnp.asarray(ids.routes, jnp.int32)[mem.strategy[best]]
    return jnp.where(jnp.any(match, axis=1), tokens, ids.no_hint).astype(jnp.int32)


def write(mem: Memory, kinds: jax.Array, routes: jax.Array, rewards: jax.Array, rate: float = 0.5,
          min_reward: float = 0.0) -> Memory:
    """Update with Q reward groups: kinds [Q], routes [Q, G] (route index, -1 invalid), rewards [Q, G]."""
    if routes.shape != rewards.shape or routes.ndim != 2 or kinds.shape != routes.shape[:1]:
        raise ValueError(f"write: need kinds [Q], routes and rewards [Q, G]; got {kinds.shape}, {routes.shape}, "
                         f"{rewards.shape}")
    if not 0 < rate <= 1:
        raise ValueError(f"write: rate must be in (0, 1], got {rate}")
    n_routes = len(ROUTES)

    def one(m: Memory, group):
        t, rt, rw = group
        used = rt[None] == jnp.arange(n_routes)[:, None]  # [S, G]
        count = used.sum(1)
        mean = jnp.where(count > 0, (used * rw[None]).sum(1) / jnp.maximum(count, 1), 0.0)  # [S]
        seen = count > 0
        frac = count / rt.shape[0]  # [S]
        is_entry = (m.kind[:, None] == t) & (m.strategy[:, None] == jnp.arange(n_routes)[None])  # [K, S]
        ev = is_entry & seen[None]
        upd = jnp.where(ev, mean[None], 0.0).sum(1)
        w = rate * jnp.where(ev, frac[None], 0.0).sum(1)  # [K]
        score = jnp.where(ev.any(1), (1 - w) * m.score + w * upd, m.score)
        m = Memory(kind=m.kind, strategy=m.strategy, score=score)
        # insert the group's best new strategy
        known = is_entry.any(0)
        cand = jnp.where(seen & ~known, frac * mean, -jnp.inf)
        s = jnp.argmax(cand)
        value = cand[s]
        slot_score = jnp.where(m.kind >= 0, m.score, -jnp.inf)
        slot = jnp.argmin(slot_score)
        ok = (value > min_reward) & (value > slot_score[slot])
        m = Memory(kind=m.kind.at[slot].set(jnp.where(ok, t, m.kind[slot])),
                   strategy=m.strategy.at[slot].set(jnp.where(ok, s, m.strategy[slot])),
                   score=m.score.at[slot].set(jnp.where(ok, value, m.score[slot])))
        return m, None

    return jax.lax.scan(one, mem, (kinds.astype(jnp.int32), routes.astype(jnp.int32), rewards.astype(jnp.float32)))[0]


__all__ = ["Memory", "init_memory", "retrieve", "write"]
