"""JoyAgents-R1 training: SFT warm start on scripted traces, then joint GRPO of all agents, either plain
(whole-trajectory groups) or node-wise Monte Carlo with marginal-benefit (top-K) selection, with or
without memory evolution; greedy evaluation per request type.

    tok = CharTokenizer()                                               # every id comes from it
    models = build_models(lm, cfg, seed, tokenizer=tok)                 # 1 (shared) or 4 LMs, from scratch
    # or: tok = load_tokenizer(ckpt); models = load_models(ckpt, cfg, tokenizer=tok)
    sft_warm_start(models, requests, cfg, TraceNoise(...), SFTConfig(), tokenizer=tok)
    trainer = JoyTrainer(JoyConfig(mode="nodewise", top_k=2, memory=True), cfg, models, requests, tokenizer=tok)
    state = trainer.init(key)                           # requests(s): RL step s's Requests (Q training requests)
    state, metrics = trainer.step(state)
    evaluate(trainer, state, req_heldout) -> {"accuracy", "accuracy/<type>", "route_accuracy", ...}

Plain joint GRPO (``mode="joint"``): each request is rolled out G times; the trajectory reward's
group advantage (``rl.lm.advantages.group_advantages``) is broadcast to every active node of the
trajectory (``broadcast_advantages``), and all agents are updated from it.

Node-wise Monte Carlo (``mode="nodewise"``): at the route node G fresh trajectories are sampled and
the first is the base trajectory; then at each later node k (step 1, step 2, final) G actions are
resampled with nodes < k fixed to the base (``run_system(start=k, fixed=...)``) and each
continuation runs to the end and is scored (one ``lax.scan`` over k; ``continuation="greedy"`` decodes
the nodes after k greedily, so each resampled action is scored by what the current policy does next).
Each (request, node) group gives group advantages for the G resampled actions of node k only.
Marginal-benefit selection keeps, per request, the ``top_k`` active nodes whose groups have the largest
reward variance; only those rows enter the loss. Both modes take one clipped GRPO step (``grpo_loss`` through the
learner core, ``rl.lm.make_update``; ``minibatches`` > 1: that many, for a large model's memory) per RL step, so
"updates" are comparable; the node-wise step samples 4G
trajectories (G full + 3 x G continuations) per request against G for the plain one, which the
metrics report (``trajectories``).

Checkpoints (``load_models``): every agent starts from the same checkpoint weights (one copy per model,
each trained separately, as ``build_models`` seeds one fresh LM per model); the SFT warm start still
runs on them (it teaches the system's protocol: templates, routing tokens, calls and text spelled one
token per character, ``tasks.assistant.spell``).

Memory (``memory=True``): the route hint of every request is retrieved from the shared memory
(``memory.retrieve``) and after each step the route groups (the plain groups, or the node-0 groups of
node-wise sampling) are written into it (``memory.write``). Rollout, rewards, selection, memory and
the update are one jitted program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.agents.joyagents.data import TraceNoise, scripted_conversations
from jaxrl_reason.agents.joyagents.memory import Memory, init_memory, retrieve, write
from jaxrl_reason.agents.joyagents.system import (
    NUM_NODES, NodeRecord, Requests, SystemConfig, SystemIds, empty_record, run_system)
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.models.lm.sft import SFTConfig, fit, sft_examples
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import check_data_split, data_mesh, replicate
from jaxrl_reason.rl.lm.advantages import REGISTERED, broadcast_advantages, group_advantages
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_logp_fn, lm_optimizer, make_update
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.tasks.assistant import TYPES, AssistantRequest
from jaxrl_reason.utils.validation import POSITIVE, Range, Rule, at_least, check_hyperparameters, one_of

MODES = ("joint", "nodewise")
CONTINUATIONS = ("sample", "greedy")


def build_models(lm: TinyLM | LMConfig, config: SystemConfig, seed: int, *, tokenizer: Tokenizer) -> list:
    """One LM (shared weights) or one per agent, each seeded differently, from scratch: a ``TinyLM`` sized
    for ``tokenizer``, or an ``LMConfig`` as is (e.g. ``config_from_hf(recipes.ARCHS[name], ...)``)."""
    if isinstance(lm, LMConfig):
        models = [Transformer(lm, rngs=nnx.Rngs(seed + i)) for i in range(config.num_models)]
    else:
        models = [build_model(lm, seed + i, tokenizer) for i in range(config.num_models)]
    config.check_model(models[0].cfg, tokenizer)
    return models


def load_models(path, config: SystemConfig, *, tokenizer: Tokenizer, max_seq_len: int | None = None) -> list:
    """One LM (shared weights) or one per agent, every one the HF checkpoint at ``path`` (fp32; loaded once,
    copied: the same initial weights, trained separately). ``max_seq_len`` (default ``config.seq_len``):
    the models' window (KV cache and RoPE table). ``tokenizer``: the checkpoint's (``HFTokenizer``)."""
    from jaxrl_reason.models.lm.pretrained import load_model

    model = load_model(path, max_seq_len=config.seq_len if max_seq_len is None else max_seq_len)
    config.check_model(model.cfg, tokenizer)
    return [model] + [nnx.clone(model) for _ in range(config.num_models - 1)]


def sft_warm_start(models: Sequence, requests: Sequence[AssistantRequest], config: SystemConfig, noise: TraceNoise,
                   sft: SFTConfig, seed: int = 0, *, tokenizer: Tokenizer) -> list[np.ndarray]:
    """Train the model(s) in place on scripted conversations; separate models see their own agent's
    conversations only. Returns the per-step loss of each model."""
    if len(models) != config.num_models:
        raise ValueError(f"sft_warm_start: config.shared={config.shared} needs {config.num_models} model(s), "
                         f"got {len(models)}")
    convs = scripted_conversations(requests, config, noise, np.random.default_rng([seed, 2001]), tokenizer=tokenizer)
    losses = []
    for i, model in enumerate(models):
        mine = [(p, r) for p, r, a in convs if config.shared or a == i]
        data = sft_examples([p for p, _ in mine], [r for _, r in mine], config.seq_len, tokenizer)
        losses.append(fit(model, data, sft.steps, sft.batch_size, sft.lr, [seed + i, 1002], name="JoyAgents SFT")[1])
    return losses


@dataclasses.dataclass(frozen=True)
class JoyConfig:
    mode: str = "nodewise"  # "joint" (plain joint GRPO) | "nodewise" (node-wise MC + top-K selection)
    group_size: int = 8  # G
    top_k: int = 2  # nodes updated per request (node-wise)
    memory: bool = True
    memory_slots: int = 8
    memory_rate: float = 0.5
    temperature: float = 1.0
    # node-wise: the nodes after the resampled one are sampled at ``temperature`` ("sample") or decoded
    # greedily ("greedy": each resampled action is scored by what the current policy does next at
    # evaluation, without the later nodes' sampling noise in its reward)
    continuation: str = "sample"
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.99  # (rl.lm.optim's default is 0.999; JoyAgents has always used 0.99)
    advantage: str = "grpo"
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    logprob_chunk: int = 8
    # the RL step's rows (every node of every sampled trajectory) in this many gradient steps: 1 = one
    # optimiser update per RL step (the cpu preset); > 1 bounds the activations of a large model's update
    # (each RL step is then that many optimiser updates, in both modes alike)
    minibatches: int = 1
    mesh: str | None = None  # e.g. "data=8": the trajectories split over the data axis (multi-process: over all)

    CHECKS = (("mode", one_of(MODES)),
              ("group_size", at_least(2), "group advantages need a group"),
              ("top_k", Rule(lambda k: 1 <= k <= NUM_NODES, f"in [1, {NUM_NODES}]"), f"there are {NUM_NODES} nodes"),
              (("memory_slots", "minibatches", "logprob_chunk"), at_least(1)),
              ("memory_rate", Range(0.0, 1.0, low_open=True)),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              ("continuation", one_of(CONTINUATIONS)),
              ("advantage", REGISTERED))  # (utils.validation; lr and max_grad_norm: their names' ranges)

    def __post_init__(self):
        check_hyperparameters(self)


@flax.struct.dataclass
class JoyState:
    params: tuple  # per model nnx.State
    rest: tuple
    opt_state: optax.OptState
    memory: Memory
    step: jax.Array
    key: jax.Array  # step s samples with fold_in(key, s)


def no_hints(n: int, tokenizer: Tokenizer) -> jax.Array:
    """[n] no-hint tokens (route prompts without a memory)."""
    return jnp.full((n,), SystemIds.from_tokenizer(tokenizer).no_hint, jnp.int32)


def hints_for(cfg: JoyConfig, memory: Memory, kinds: jax.Array, *, tokenizer: Tokenizer) -> jax.Array:
    return retrieve(memory, kinds, tokenizer=tokenizer) if cfg.memory else no_hints(kinds.shape[0], tokenizer)


def flat_nodes(rec: NodeRecord, nodes: Sequence[int] | None = None) -> dict:
    """NodeRecord [4, B, ...] (or the chosen nodes) -> rows [n*B, ...] (node-major)."""
    nodes = list(range(NUM_NODES)) if nodes is None else list(nodes)
    take = lambda x: jnp.concatenate([x[n] for n in nodes])
    return {f.name: take(getattr(rec, f.name)) for f in dataclasses.fields(rec)}


def select_top_k(variance: jax.Array, active: jax.Array, k: int) -> jax.Array:
    """Marginal-benefit selection: variance, active [Q, N] -> bool [Q, N], True on the ``k`` active nodes
    of each request with the largest group reward variance (inactive nodes are never chosen)."""
    score = jnp.where(active, variance, -jnp.inf)
    idx = jax.lax.top_k(score, k)[1]
    chosen = jnp.zeros(score.shape, bool).at[jnp.arange(score.shape[0])[:, None], idx].set(True)
    return chosen & active


class JoyTrainer:
    def __init__(self, config: JoyConfig, system: SystemConfig, models: Sequence,
                 requests: Callable[[int], Requests], *, tokenizer: Tokenizer):
        """``requests(s)``: RL step s's Q training requests (drawn from a stream seeded by s: a resume draws the
        same)."""
        if len(models) != system.num_models:
            raise ValueError(f"JoyTrainer: system.shared={system.shared} needs {system.num_models} model(s), "
                             f"got {len(models)}")
        system.check_model(models[0].cfg, tokenizer)
        self.config, self.system, self.tokenizer, self.requests = config, system, tokenizer, requests
        splits = [nnx.split(m, nnx.Param, ...) for m in models]
        self.graphdef = splits[0][0]
        self._params = tuple(s[1] for s in splits)
        self._rest = tuple(s[2] for s in splits)
        self.optimizer = _optimizer(config)
        self.mesh = data_mesh(config.mesh, {}, "JoyConfig")
        self._step = _step_fn(self.graphdef, config, system, tokenizer, self.mesh)

    def init(self, key: jax.Array, params: tuple | None = None) -> JoyState:
        params = jax.tree.map(jnp.array, self._params if params is None else params)
        return replicate(JoyState(params=params, rest=self._rest, opt_state=self.optimizer.init(params),
                                  memory=init_memory(self.config.memory_slots), step=jnp.int32(0), key=key), self.mesh)

    def step(self, state: JoyState) -> tuple[JoyState, dict]:
        """One RL step on the Q requests of ``requests(step)``, each sampled ``group_size`` times (per node,
        node-wise)."""
        s = int(state.step)
        req, key = self.requests(s), jax.random.fold_in(state.key, s)
        check_data_split(self.mesh, {"trajectories per group draw (requests x group_size)":
                                     len(req) * self.config.group_size}, "JoyTrainer")
        return self._step(state, replicate(req, self.mesh), replicate(key, self.mesh))

    def states(self, state: JoyState) -> tuple:
        return tuple(nnx.merge_state(p, r) for p, r in zip(state.params, state.rest))


def _optimizer(cfg: JoyConfig):
    return lm_optimizer(cfg.lr, cfg.max_grad_norm, cfg.adam_b2)


@functools.lru_cache(maxsize=None)
def _step_fn(graphdef, cfg: JoyConfig, system: SystemConfig, tokenizer: Tokenizer, mesh):
    optimizer = _optimizer(cfg)
    g = cfg.group_size
    pad_id = SystemIds.from_tokenizer(tokenizer).pad

    def step(state: JoyState, req: Requests, key):
        k_roll, k_perm = jax.random.split(key)
        states = tuple(nnx.merge_state(p, r) for p, r in zip(state.params, state.rest))
        q = len(req)
        hints = hints_for(cfg, state.memory, req.kind, tokenizer=tokenizer)
        rep, rep_hints = req.repeat(g), jnp.repeat(hints, g)
        roll = functools.partial(run_system, graphdef, states, config=system, tokenizer=tokenizer,
                                 temperature=cfg.temperature, mesh=mesh)
        if cfg.mode == "joint":
            out = roll(rep, rep_hints, k_roll)
            reward = out.reward.reshape(q, g)
            adv = group_advantages(reward, cfg.advantage).reshape(-1)
            rows = flat_nodes(out.record)
            rows["adv"] = broadcast_advantages(adv, jnp.tile(jnp.arange(q * g), NUM_NODES))
            rows["use"] = rows["active"]
            route_groups, route_rewards = out.route.reshape(q, g), reward
            extra = {"selected_nodes": jnp.float32(NUM_NODES), "trajectories": jnp.float32(q * g)}
            final_reward = reward
        else:
            def mc(fixed, k):
                """Node k: G resampled actions after the fixed prefix, each continued to the end. Node 0's
                group is G fresh trajectories; its first trajectory is the base the others branch from."""
                out = roll(rep, rep_hints, jax.random.fold_in(k_roll, k), start=k, fixed=fixed,
                           continuation_temperature=0.0 if cfg.continuation == "greedy" else None)
                first = jax.tree.map(lambda x: jnp.repeat(x.reshape(x.shape[0], q, g, *x.shape[2:])[:, :, 0], g, axis=1),
                                     out.record)
                fixed = jax.tree.map(lambda a, b: jnp.where(k == 0, a, b), first, fixed)
                row = {f.name: getattr(out.record, f.name)[k] for f in dataclasses.fields(out.record)}
                return fixed, (row, out.reward.reshape(q, g), out.route.reshape(q, g))

            _, (parts, rewards, routes) = jax.lax.scan(mc, empty_record(q * g, system), jnp.arange(NUM_NODES))
            variances = rewards.var(axis=2).T  # [Q, 4]
            active = parts["active"].reshape(NUM_NODES, q, g)[:, :, 0].T  # [Q, 4]: node k exists on the base path
            chosen = select_top_k(variances, active, cfg.top_k)  # [Q, 4]
            rows = jax.tree.map(lambda x: x.reshape(NUM_NODES * q * g, *x.shape[2:]), parts)
            rows["adv"] = jax.vmap(lambda r: group_advantages(r, cfg.advantage).reshape(-1))(rewards).reshape(-1)
            rows["use"] = rows["active"] & jnp.repeat(chosen.T, g, axis=1).reshape(-1)
            route_groups, route_rewards = routes[0], rewards[0]
            names = ("route", "step1", "step2", "final")
            extra = {"selected_nodes": chosen.sum(1).mean().astype(jnp.float32),
                     "trajectories": jnp.float32(q * NUM_NODES * g),
                     **{f"selected/{n}": chosen[:, i].mean() for i, n in enumerate(names)},
                     **{f"variance/{n}": jnp.where(active[:, i], variances[:, i], 0).mean() for i, n in enumerate(names)}}
            final_reward = rewards[0]
        n_resp = rows["tokens"].shape[1]
        seqs = join(rows["prompts"], rows["prompt_lens"], rows["tokens"], pad_id)
        mask = response_mask(rows["lengths"], n_resp, rows["use"])
        model_of = jnp.zeros_like(rows["agent"]) if system.shared else jnp.maximum(rows["agent"], 0)

        one = lm_logp_fn(graphdef, n_resp, cfg.temperature, cfg.logprob_chunk)

        def logp_fn(params, rows):  # each row under its agent's model (shared: the one model)
            out = [one(p, r, rows) for p, r in zip(params, state.rest)]
            if len(out) == 1:
                return out[0]
            pick = lambda xs: jnp.choose(rows.extra["model"][:, None], xs, mode="clip")
            return pick([o[0] for o in out]), pick([o[1] for o in out])

        rollout = Rollout(seqs, rows["prompt_lens"], mask, rows["adv"], extra={"model": model_of})
        learn = make_update(logp_fn, make_loss(cfg.loss), optimizer, UpdateConfig(minibatches=cfg.minibatches))
        (params, opt_state), m = learn(state.params, state.opt_state, rollout, k_perm)
        memory = (write(state.memory, req.kind, route_groups, route_rewards, cfg.memory_rate) if cfg.memory
                  else state.memory)
        metrics = {k: v.mean() for k, v in m.items()}
        metrics.update(reward=final_reward.mean(), trained_rows=rows["use"].sum().astype(jnp.float32),
                       memory_entries=(memory.kind >= 0).sum().astype(jnp.float32),
                       zero_variance_route_groups=(route_rewards.std(axis=1) == 0).mean(), **extra)
        return state.replace(params=params, opt_state=opt_state, memory=memory, step=state.step + 1), metrics

    return jax.jit(step, donate_argnums=0)


def evaluate(trainer: JoyTrainer, state: JoyState, req: Requests, use_memory: bool | None = None) -> dict:
    """Greedy accuracy overall and per request type; route accuracy needs the correct route = the type."""
    use = trainer.config.memory if use_memory is None else use_memory
    tok = trainer.tokenizer
    hints = retrieve(state.memory, req.kind, tokenizer=tok) if use else no_hints(len(req), tok)
    out = run_system(trainer.graphdef, trainer.states(state), req, hints, jax.random.key(0), config=trainer.system,
                     tokenizer=tok)
    reward, route, kind = (np.asarray(x) for x in (out.reward, out.route, req.kind))
    res = {"accuracy": float(reward.mean()), "route_accuracy": float((route == kind).mean())}
    for i, name in enumerate(TYPES):
        sel = kind == i
        if sel.any():
            res[f"accuracy/{name}"] = float(reward[sel].mean())
            res[f"route_accuracy/{name}"] = float((route[sel] == i).mean())
    return res


__all__ = ["JoyConfig", "JoyState", "JoyTrainer", "MODES", "build_models", "evaluate", "flat_nodes", "hints_for",
           "load_models", "no_hints", "select_top_k", "sft_warm_start"]
