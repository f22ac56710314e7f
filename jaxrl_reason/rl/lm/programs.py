"""The learner's jitted programs (``rl.lm.learner``): one step of a pure agent (its rollout, the advantages, the
optimiser steps: one program), a pure agent's rollout alone, a host agent's old / reference log-prob passes and its
update. Cached by (model structure, config, agent or its hooks): runs of a study with equal agents share them.
``cfg`` is a ``LearnerConfig``, ``state`` a ``LearnerState`` (``rl.lm.learner``, which imports this module).

    step(state, batch, reset_every) -> (state, metrics)           a pure agent
    passes(state, rows) -> {"old", "old_entropy", "ref"}           a host agent, before it scores (or None)
    update(state, rollout, logps, key, reset_every) -> (state, metrics)
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.rl.lm.advantages import estimate, select_groups
from jaxrl_reason.rl.lm.logp import lm_logp_fn, trainable_rows_only
from jaxrl_reason.rl.lm.loss import make_loss
from jaxrl_reason.rl.lm.rollout import Rollout
from jaxrl_reason.rl.lm.update import make_update


def rollout_fn(agent) -> Callable:
    return getattr(agent, "rollout", agent)


def default_keys(key, step):
    """The step's (rollout key, update key): ``split(fold_in(key, step))``."""
    return tuple(jax.random.split(jax.random.fold_in(key, step)))


def merged(params, rest, multi: bool):
    if multi:
        return tuple(nnx.merge_state(p, r) for p, r in zip(params, rest))
    return nnx.merge_state(params, rest)


class _Hooks(NamedTuple):
    """The hooks of an agent that its update programs call (module docstring)."""

    logp: Callable | None
    batches: Callable | None
    metrics: Callable | None

    @staticmethod
    def of(agent) -> "_Hooks":
        return _Hooks(*(getattr(agent, name, None) for name in _Hooks._fields))


class _ByIdentity:
    """A cache key of an unhashable object: the object itself (kept alive by the cache)."""

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _ByIdentity) and other.obj is self.obj


def program(graphdef, loss_graphdef, cfg, multi: bool, kind: str, agent):
    """The cached jitted program ``kind`` (step | rollout | passes | update) of ``agent``: a step or a rollout holds
    the agent's rollout; passes and updates only its hooks, so host agents with equal hooks share them. An
    unhashable agent gets programs of its own."""
    key = agent if kind in ("step", "rollout") else _Hooks.of(agent)
    try:
        hash(key)
    except TypeError:
        key = _ByIdentity(key)
    return _programs(graphdef, loss_graphdef, cfg, multi, kind, key)


@functools.lru_cache(maxsize=None)
def _programs(graphdef, loss_graphdef, cfg, multi: bool, kind: str, key):
    key = key.obj if isinstance(key, _ByIdentity) else key
    hooks = _Hooks.of(key) if kind in ("step", "rollout") else key
    if kind == "passes":
        return _passes(graphdef, cfg, multi, hooks)
    learn = functools.partial(_learn, graphdef, loss_graphdef, cfg, multi, hooks)
    if kind == "update":
        return jax.jit(learn, donate_argnums=0)
    agent = key
    if kind == "rollout":  # a pure agent's rollout alone (evaluation)
        return jax.jit(rollout_fn(agent))
    keys = getattr(agent, "keys", default_keys)
    roll, carried = rollout_fn(agent), hasattr(agent, "init_carry")

    def step(state, batch, reset_every):
        k_roll, k_update = keys(state.key, state.step)
        policy = merged(state.params, state.rest, multi)
        if carried:
            rollout, metrics, agent_carry = roll(policy, k_roll, batch, state.agent_carry)
            state = state.replace(agent_carry=agent_carry)
        else:
            rollout, metrics = roll(policy, k_roll, batch)
        state, m = learn(state, rollout, {}, k_update, reset_every)
        return state, {**m, **metrics}

    return jax.jit(step, donate_argnums=0)


def _logp_fn(graphdef, cfg, multi: bool, hooks: _Hooks, n: int, remat: str):
    """(params, rest, rows) -> (logp [B, n], entropy [B, n] or None): the agent's ``logp`` or the LM's tempered
    response log-probs; several models: each row under ``rows.extra["model"]``'s."""
    own = hooks.logp
    if own is not None:
        one = lambda params, rest, rows: own(nnx.merge(graphdef, params, rest), rows)
    else:
        one = lm_logp_fn(graphdef, n, cfg.temperature, cfg.logprob_chunk, remat, cfg.prompt_group)
    if cfg.update_rows:
        one = trainable_rows_only(one, cfg.update_rows)
    if not multi:
        return one

    def each(params, rest, rows):
        out = [one(p, r, rows) for p, r in zip(params, rest)]
        if len(out) == 1:
            return out[0]
        pick = lambda xs: jnp.choose(rows.extra["model"][:, None], xs, mode="clip")
        return pick([o[0] for o in out]), (None if out[0][1] is None else pick([o[1] for o in out]))

    return each


def _passes(graphdef, cfg, multi: bool, hooks: _Hooks):
    """Jitted: (state, rows) -> {"old", "old_entropy"} (when the update needs a pass of its own) and {"ref"} (with a
    reference), each [B, N], over every row a host rollout gave; None when neither is needed."""
    old = cfg.needs_old_pass(hooks.batches is not None)
    if not (old or cfg.needs_ref):
        return None

    def run(state, rows: Rollout):
        logp = _logp_fn(graphdef, cfg, multi, hooks, rows.mask.shape[1], "none")
        out = {}
        if old:
            out["old"], out["old_entropy"] = logp(state.params, state.rest, rows)
        if cfg.needs_ref:
            out["ref"] = logp(state.ref_params, state.rest, rows)[0]
        return {k: v for k, v in out.items() if v is not None}

    return jax.jit(run)


def _mean(x, w=None):
    return x.mean() if w is None else (x * w).sum() / jnp.maximum(w.sum(), 1.0)


def _learn(graphdef, loss_graphdef, cfg, multi: bool, hooks: _Hooks, state,
           rollout: Rollout, logps: dict, key, reset_every):
    """The update of one step (pure): advantages, reference log-probs, the optimiser steps, the reference reset."""
    r, metrics, carry = rollout, {}, state.advantage_carry
    rows = None  # the kept rows (Rollout.keep), when groups are selected
    valid = None if r.valid is None else jnp.asarray(r.valid, jnp.float32)
    if r.rewards is not None:
        rewards = jnp.asarray(r.rewards, jnp.float32)
        metrics["reward"] = _mean(rewards, valid)
    if r.advantages is None:
        if r.rewards is None:
            raise ValueError("the rollout gave neither advantages nor rewards")
        if r.keep:  # rows are samples, in num_groups equal consecutive groups: train on ``keep`` of them
            q = r.num_groups or rewards.shape[0]
            g = rewards.shape[0] // q
            grouped, gvalid = rewards.reshape(q, g), None if valid is None else valid.reshape(q, g)
            sel, metrics["frac_filtered"] = select_groups(grouped, r.keep, cfg.dynamic_sampling, gvalid)
            metrics["reward_selected"] = _mean(grouped[sel], None if gvalid is None else gvalid[sel])
            rows = (sel[:, None] * g + jnp.arange(g)[None]).reshape(-1)
            kept = None if valid is None else valid[rows]
            adv, carry = estimate(cfg.advantage, rewards[rows], jnp.repeat(jnp.arange(r.keep), g), r.keep,
                                  None if kept is None else kept > 0, carry)
            r = r.take(rows).replace(advantages=adv)
            valid = kept
        else:
            groups = jnp.zeros(rewards.shape, jnp.int32) if r.groups is None else r.groups
            adv, carry = estimate(cfg.advantage, rewards, groups, r.num_groups or rewards.shape[0],
                                  None if valid is None else valid > 0, carry)
            r = r.replace(advantages=adv if r.sample is None else adv[r.sample])
    metrics["response_length"] = r.mask.sum(-1).mean()
    if valid is not None:  # excluded samples add no loss
        row_valid = valid if r.sample is None else valid[r.sample]
        r = r.replace(mask=r.mask * row_valid[:, None])
    metrics["mean_abs_adv"] = _mean(jnp.abs(r.advantages), (r.mask.sum(-1) > 0).astype(jnp.float32))  # trained rows
    pick = lambda k: None if k not in logps else (logps[k] if rows is None else logps[k][rows])
    r = r.rows_only().replace(ref_logp=r.ref_logp if pick("ref") is None else pick("ref"),
                              old_logp=r.old_logp if pick("old") is None else pick("old"),
                              old_entropy=r.old_entropy if pick("old_entropy") is None else pick("old_entropy"))
    n = r.mask.shape[1]
    if cfg.needs_ref and r.ref_logp is None:  # a pure rollout: the reference pass here, on the trained rows
        ref = _logp_fn(graphdef, cfg, multi, hooks, n, "none")(state.ref_params, state.rest, r)[0]
        r = r.replace(ref_logp=jax.lax.stop_gradient(ref))
    if cfg.dropout:  # one seed per row; a minibatch uses its first row's
        key, k_drop = jax.random.split(key)
        r = r.replace(extra={**r.extra, "dropout_seed": jax.random.randint(k_drop, (len(r),), 0,
                                                                           jnp.iinfo(jnp.int32).max)})
    optimizer = cfg.optimizer()
    logp_fn = _logp_fn(loss_graphdef, cfg, multi, hooks, n, cfg.remat)
    learn = make_update(lambda p, rows: logp_fn(p, state.rest, rows), make_loss(cfg.loss), optimizer,
                        cfg.update_config, deterministic=not cfg.dropout, batches=hooks.batches)
    (params, opt_state), m = learn(state.params, state.opt_state, r, key)
    step = state.step + 1
    reset = (reset_every > 0) & (step % jnp.maximum(reset_every, 1) == 0)
    keep_or = lambda a, b: jax.tree.map(lambda x, y: jnp.where(reset, x, y), a, b)
    ref_params = None if state.ref_params is None else keep_or(params, state.ref_params)
    opt_state = keep_or(optimizer.init(params), opt_state)
    metrics.update({k: v.mean() for k, v in m.items()})
    metrics["ref_reset"] = reset.astype(jnp.float32)
    if "kl" in m:
        metrics["kl_ref"] = m["kl"].reshape(-1)[0]
    if cfg.scheduled:
        metrics["lr"] = jnp.asarray(cfg.learning_rate()(state.step), jnp.float32)
    new = state.replace(params=params, ref_params=ref_params, opt_state=opt_state, step=step, advantage_carry=carry)
    if hooks.metrics is not None:
        metrics.update(hooks.metrics(new))
    return new, metrics




__all__ = ["default_keys", "merged", "program", "rollout_fn"]
