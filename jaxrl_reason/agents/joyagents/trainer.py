"""JoyAgents-R1 training: SFT warm start on scripted traces, then joint GRPO of all agents on the LM learner, either
plain (whole-trajectory groups) or node-wise Monte Carlo with marginal-benefit (top-K) selection, with or without
memory evolution; greedy evaluation per request type.

    tok = CharTokenizer()                                               # every id comes from it
    models = build_models(lm, cfg, seed, tokenizer=tok)                 # 1 (shared) or 4 LMs, from scratch
    # or: tok = load_tokenizer(ckpt); models = load_models(ckpt, cfg, tokenizer=tok)
    sft_warm_start(models, requests, cfg, TraceNoise(...), SFTConfig(), tokenizer=tok)
    learner, joy = joy_learner(JoyConfig(mode="nodewise", top_k=2, memory=True), cfg, models, tokenizer=tok,
                               requests=requests)            # requests(s): RL step s's Requests (Q training requests)
    state = learner.init(key, joy)                           # state.agent_carry: the memory
    state, metrics = learner.step(state, joy, requests(0))   # or run_steps(run_dir, learner.step_fn(joy), state, ...)
    evaluate(joy, state, req_heldout) -> {"accuracy", "accuracy/<type>", "route_accuracy", ...}

``JoyAgent`` is the rollout; the learner (``rl.lm.Learner``, a list of models: its params a tuple, each row
trained under its agent's model) owns the optimiser, the update and the state. The trajectory rewards go to
the learner's registered estimator (``JoyConfig.advantage``, "grpo" by default):

Plain joint GRPO (``mode="joint"``): each request is rolled out G times; the trajectory reward's
group advantage (groups: the requests) reaches every active node of the trajectory (``Rollout.sample``), and all
agents are updated from it.

Node-wise Monte Carlo (``mode="nodewise"``): at the route node G fresh trajectories are sampled and
the first is the base trajectory; then at each later node k (step 1, step 2, final) G actions are
resampled with nodes < k fixed to the base (``run_system(start=k, fixed=...)``) and each
continuation runs to the end and is scored (one ``lax.scan`` over k; ``continuation="greedy"`` decodes
the nodes after k greedily, so each resampled action is scored by what the current policy does next).
Each (request, node) group gives group advantages for the G resampled actions of node k only.
Marginal-benefit selection keeps, per request, the ``top_k`` active nodes whose groups have the largest
reward variance; only those rows enter the loss (their mask: a choice of rows, not an estimator). Both modes
take one clipped GRPO step (``minibatches`` > 1: that many, for a large model's memory) per RL step, so
"updates" are comparable; the node-wise step samples 4G
trajectories (G full + 3 x G continuations) per request against G for the plain one, which the
metrics report (``trajectories``).

Checkpoints (``load_models``): every agent starts from the same checkpoint weights (one copy per model,
each trained separately, as ``build_models`` seeds one fresh LM per model); the SFT warm start still
runs on them (it teaches the system's protocol: templates, routing tokens, calls and text spelled one
token per character, ``tasks.assistant.spell``).

Memory (``memory=True``): the route hint of every request is retrieved from the shared memory
(``memory.retrieve``) and after each rollout the route groups (the plain groups, or the node-0 groups of
node-wise sampling) are written into it (``memory.write``); the memory is the agent's carry in the learner's
state (``state.agent_carry``). Rollout, rewards, selection, memory and the update are one jitted program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.agents.joyagents.data import TraceNoise, scripted_conversations
from jaxrl_reason.agents.joyagents.memory import Memory, init_memory, retrieve, write
from jaxrl_reason.agents.joyagents.system import (
    NUM_NODES, NodeRecord, Requests, SystemConfig, SystemIds, empty_record, run_system)
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.models.lm.sft import SFTConfig, fit, sft_examples
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import check_data_split
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.rl.lm import Learner, LearnerConfig, LearnerState, Rollout
from jaxrl_reason.rl.lm.advantages import REGISTERED
from jaxrl_reason.rl.lm.loss import LossConfig
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
    advantage: str = "grpo"  # a registered estimator (rl.lm.advantages.ESTIMATORS)
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

    def learner_config(self) -> LearnerConfig:
        """The learner's configuration: optimiser, estimator, objective, minibatches (one epoch), the sampling
        temperature the log-probs are taken at, the mesh."""
        return LearnerConfig(lr=self.lr, max_grad_norm=self.max_grad_norm, adam_b2=self.adam_b2,
                             advantage=self.advantage, loss=self.loss, minibatches=self.minibatches,
                             temperature=self.temperature, logprob_chunk=self.logprob_chunk, mesh=self.mesh)


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


@dataclasses.dataclass(frozen=True)
class JoyAgent:
    """JoyAgents-R1's RL as a rollout of the learner (``rl.lm.Learner`` of the system's models: params a tuple, one
    per model; each row is trained under ``extra["model"]``'s). The memory is the agent's carry
    (``init_carry``): ``rollout(policy, key, requests, memory) -> (Rollout, metrics, memory)``.

    Rows: every node of every sampled trajectory (``flat_nodes``: node-major), ``mask`` on the tokens of the
    nodes trained. The rewards go to the learner's registered estimator (``JoyConfig.advantage``):

    - ``"joint"``: rewards [Q G] of the trajectories, groups = the request (Q groups), ``sample`` = the trajectory
      of each node row: its advantage reaches every active node of the trajectory.
    - ``"nodewise"``: rewards [4 Q G] of the resampled actions, node-major, rows = samples; groups = (node,
      request) pairs (4 Q groups of G). Marginal-benefit (top-K) selection is a choice of the rows trained, not an
      estimator: it stays here, as the rows' ``mask`` (the ``top_k`` active nodes of each request with the
      largest group reward variance).

    Hashable on the graphdef, configs, the tokenizer's ids and templates and the mesh (equal agents share the
    learner's compiled programs); ``requests(s)`` (RL step s's ``Requests``, drawn by the learner's
    ``step_fn``) and the tokenizer object are not part of that comparison."""

    graphdef: Any
    config: JoyConfig
    system: SystemConfig
    tokenizer: Tokenizer = dataclasses.field(compare=False, repr=False)
    mesh: Any = None  # the learner's: the trajectories split over its data axis
    requests: Callable[[int], Requests] | None = dataclasses.field(default=None, compare=False, repr=False)
    ids: SystemIds = dataclasses.field(init=False)  # the tokenizer's static ids and templates (the compared part)
    templates: tuple = dataclasses.field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "ids", SystemIds.from_tokenizer(self.tokenizer))
        object.__setattr__(self, "templates", self.system.templates(self.tokenizer))

    def batch(self, step: int) -> Requests:
        """RL step ``step``'s requests: ``requests(step)`` (drawn from a stream seeded by the step, so a resumed
        run draws the same)."""
        if self.requests is None:
            raise ValueError("JoyAgent: no requests(step) given; pass the step's Requests to learner.step")
        return self.requests(step)

    def init_carry(self) -> Memory:
        """The step-0 memory (empty)."""
        return init_memory(self.config.memory_slots)

    def evaluate(self, policy: tuple, key, req: Requests, memory: Memory) -> dict:
        """``learner.evaluate``'s hook: greedy accuracy per request type with the learnt memory (``evaluate``)."""
        return evaluate_policy(self, policy, memory, req)

    def rollout(self, policy: tuple, key, req: Requests, memory: Memory) -> tuple[Rollout, dict, Memory]:
        """One RL step's sampling on the Q requests of ``req``, each sampled ``group_size`` times (per node,
        node-wise); the memory written with the route groups (``memory.write``) when ``config.memory``."""
        cfg, system, tok, g = self.config, self.system, self.tokenizer, self.config.group_size
        q = len(req)
        check_data_split(self.mesh, {"trajectories per group draw (requests x group_size)": q * g}, "JoyAgent")
        hints = hints_for(cfg, memory, req.kind, tokenizer=tok)
        rep, rep_hints = req.repeat(g), jnp.repeat(hints, g)
        roll = functools.partial(run_system, self.graphdef, policy, config=system, tokenizer=tok,
                                 temperature=cfg.temperature, mesh=self.mesh)
        if cfg.mode == "joint":
            out = roll(rep, rep_hints, key)
            rows = flat_nodes(out.record)
            use = rows["active"]
            scored = dict(rewards=out.reward, groups=jnp.repeat(jnp.arange(q), g),
                          sample=jnp.tile(jnp.arange(q * g), NUM_NODES), num_groups=q)
            route_groups, route_rewards = out.route.reshape(q, g), out.reward.reshape(q, g)
            extra = {"selected_nodes": jnp.float32(NUM_NODES), "trajectories": jnp.float32(q * g)}
        else:
            def mc(fixed, k):
                """Node k: G resampled actions after the fixed prefix, each continued to the end. Node 0's
                group is G fresh trajectories; its first trajectory is the base the others branch from."""
                out = roll(rep, rep_hints, jax.random.fold_in(key, k), start=k, fixed=fixed,
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
            use = rows["active"] & jnp.repeat(chosen.T, g, axis=1).reshape(-1)
            scored = dict(rewards=rewards.reshape(-1), groups=jnp.arange(NUM_NODES * q * g) // g,
                          num_groups=NUM_NODES * q)
            route_groups, route_rewards = routes[0], rewards[0]
            names = ("route", "step1", "step2", "final")
            extra = {"selected_nodes": chosen.sum(1).mean().astype(jnp.float32),
                     "trajectories": jnp.float32(q * NUM_NODES * g),
                     **{f"selected/{n}": chosen[:, i].mean() for i, n in enumerate(names)},
                     **{f"variance/{n}": jnp.where(active[:, i], variances[:, i], 0).mean() for i, n in enumerate(names)}}
        n_resp = rows["tokens"].shape[1]
        seqs = join(rows["prompts"], rows["prompt_lens"], rows["tokens"], self.ids.pad)
        model_of = jnp.zeros_like(rows["agent"]) if system.shared else jnp.maximum(rows["agent"], 0)
        rollout = Rollout(seqs, rows["prompt_lens"], response_mask(rows["lengths"], n_resp, use),
                          extra={"model": model_of}, **scored)
        if cfg.memory:
            memory = write(memory, req.kind, route_groups, route_rewards, cfg.memory_rate)
        metrics = {"reward": route_rewards.mean(), "trained_rows": use.sum().astype(jnp.float32),
                   "memory_entries": (memory.kind >= 0).sum().astype(jnp.float32),
                   "zero_variance_route_groups": (route_rewards.std(axis=1) == 0).mean(), **extra}
        return rollout, metrics, memory


def joy_learner(config: JoyConfig, system: SystemConfig, models: Sequence, *, tokenizer: Tokenizer,
                requests: Callable[[int], Requests] | None = None) -> tuple[Learner, JoyAgent]:
    """-> (the learner of the system's models, its rollout). ``models``: 1 (shared weights, role prompts) or 4 (one
    per agent, ``system.shared=False``), trained each; ``requests(s)``: RL step s's Q training requests."""
    if len(models) != system.num_models:
        raise ValueError(f"joy_learner: system.shared={system.shared} needs {system.num_models} model(s), "
                         f"got {len(models)}")
    system.check_model(models[0].cfg, tokenizer)
    learner = Learner(config.learner_config(), list(models))
    if learner.mesh is not None and "data" not in learner.mesh.shape:
        raise ValueError(f"JoyConfig.mesh {config.mesh!r} has no 'data' axis to split the trajectories over")
    return learner, JoyAgent(learner.graphdef, config, system, tokenizer, learner.mesh, requests)


def policy_of(state: LearnerState) -> tuple:
    """The models' whole states (``Learner.policy`` of a JoyAgents learner): a tuple, one per model."""
    return tuple(nnx.merge_state(p, r) for p, r in zip(state.params, state.rest))


def evaluate(agent: JoyAgent, state: LearnerState, req: Requests, use_memory: bool | None = None) -> dict:
    """Greedy accuracy overall and per request type; route accuracy needs the correct route = the type. The route
    hints come from the state's memory (``state.agent_carry``) when ``use_memory`` (default ``config.memory``).
    ``learner.evaluate(state, agent, req)`` is the same (the agent's ``evaluate`` hook)."""
    return evaluate_policy(agent, policy_of(state), state.agent_carry, req, use_memory)


def evaluate_policy(agent: JoyAgent, policy: tuple, memory: Memory, req: Requests,
                    use_memory: bool | None = None) -> dict:
    """``evaluate`` of the models' whole states ``policy`` with the route memory ``memory``."""
    use = agent.config.memory if use_memory is None else use_memory
    tok = agent.tokenizer
    hints = retrieve(memory, req.kind, tokenizer=tok) if use else no_hints(len(req), tok)
    out = run_system(agent.graphdef, policy, req, hints, jax.random.key(0), config=agent.system, tokenizer=tok)
    reward, route, kind = (np.asarray(x) for x in (out.reward, out.route, req.kind))
    res = {"accuracy": float(reward.mean()), "route_accuracy": float((route == kind).mean())}
    for i, name in enumerate(TYPES):
        sel = kind == i
        if sel.any():
            res[f"accuracy/{name}"] = float(reward[sel].mean())
            res[f"route_accuracy/{name}"] = float((route[sel] == i).mean())
    return res


__all__ = ["JoyAgent", "JoyConfig", "MODES", "build_models", "evaluate", "flat_nodes", "hints_for", "joy_learner",
           "load_models", "no_hints", "policy_of", "evaluate_policy", "select_top_k", "sft_warm_start"]
