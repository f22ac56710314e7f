"""The one LM learner: every LM agent (GRPO, tool use, SPIRAL, MemAgent, JoyAgents, RALLY's intent model, ASTRO's
RL stage, yours) is a rollout it trains.

    learner = Learner(LearnerConfig(lr=1e-4, advantage="grpo"), model)      # or [model, ...]: one per agent role
    agent = MyAgent(learner.graphdef, ...)              # anything with .rollout, or the rollout function itself
    state = learner.init(jax.random.key(0), agent)
    state, metrics = learner.step(state, agent, batch)
    learner.evaluate(state, agent, batch); learner.save(state, dir); learner.restore(dir, agent); learner.export(...)

The rollout: ``rollout(policy, key, batch) -> (Rollout, metrics)``; ``policy`` is the model's whole ``nnx.State``
(trained and frozen parts merged: ``nnx.merge(learner.graphdef, policy)`` is the model), a tuple of them for
several models. The ``Rollout`` (``rl.lm.rollout``) carries advantages of its own, or rewards and groups for the
estimator ``LearnerConfig.advantage`` (any name in ``rl.lm.advantages.ESTIMATORS``). One step: the rollout, the
advantages, the old-policy and reference log-probs where needed, ``epochs`` x ``minibatches`` optimiser steps of
the objective ``loss.objective`` (``rl.lm.loss.OBJECTIVES``) through ``rl.lm.update.make_update``, the ProRL
reference reset. A pure rollout runs with all of that in one jitted program; a host rollout (``host = True``:
decoding, reward functions, a ``HostTextEnv``) runs in Python, then one jitted update.

Optional hooks of an agent (attributes; a plain function has none):

    host: bool                              the rollout runs host code (called outside jit)
    score(rollout) -> (rollout, metrics)    host agents: the rewards, called after the learner dispatched its
                                            old / reference log-prob passes, so they overlap the host's scoring
    keys(key, step) -> (k_roll, k_update)   the step's keys (default ``split(fold_in(key, step))``)
    num_groups: int                         the groups of a stateful estimator's carry (the RAE baselines)
    init_carry() -> carry                   the agent's own state across steps (JoyAgents' memory); the rollout
                                            is then ``rollout(policy, key, batch, carry) -> (Rollout, metrics, carry)``
    logp(model, rows) -> (logp, entropy)    its own log-probs [B, N] (RALLY's letter softmax; entropy may be None);
                                            default: the tempered response log-probs of the LM (``rl.lm.logp``)
    batches(key, rows) -> idx [S, b]        its own minibatches (default: epochs x minibatches shuffles)
    metrics(state) -> dict                  metrics of the state after the update (jitted with the step)
    evaluate(policy, key, batch[, carry]) -> dict    ``learner.evaluate``'s numbers (the carry: an agent with
                                            ``init_carry``; default: the rollout's mean reward, its SE and n)

Programs (``rl.lm.programs``) are cached by (model structure, config, agent): runs of a study with equal agents
share them. Device placement is done here, once, for every agent: without a mesh every leaf is committed to the parameters' device;
with ``mesh`` (``parallel.mesh.make_mesh`` spec; in a multi-process run ``None`` means data over all devices) the
parameters are sharded by the LM partition rules (FSDP / tensor axes where the mesh has them) and the rest of the
state is replicated; a pure rollout's batch is replicated and split by the agent over the data axis.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.models.lm.lora import LoRAConfig, LoRAParam, apply_lora, has_lora, lora_off
from jaxrl_reason.parallel.distributed import to_global
from jaxrl_reason.parallel.mesh import config_mesh, replicate
from jaxrl_reason.rl.lm.advantages import REGISTERED, check_estimator, init_carry
from jaxrl_reason.rl.lm.logp import REMAT, remat_graphdef
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.lm.optim import ADAM_B2, lm_optimizer
from jaxrl_reason.rl.lm.programs import default_keys, merged, program, rollout_fn
from jaxrl_reason.rl.lm.update import OLD_LOGP, UpdateConfig
from jaxrl_reason.utils.validation import NONNEGATIVE, POSITIVE, at_least, check_hyperparameters, one_of, or_none, require

LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    lr: float = 1e-4
    max_grad_norm: float = 1.0
    adam_b2: float = ADAM_B2
    weight_decay: float = 0.0  # AdamW's decoupled weight decay on matrices (ndim >= 2; not norms or biases)
    lr_schedule: str = "constant"  # constant | cosine | linear (decay to 0 at schedule_steps)
    warmup_steps: int = 0  # linear warmup from 0 over these steps
    schedule_steps: int = 0  # the steps cosine / linear decay over
    advantage: str = "grpo"  # a registered estimator (rl.lm.advantages.ESTIMATORS)
    loss: LossConfig = LossConfig()  # its objective: a registered one (rl.lm.loss.OBJECTIVES)
    dynamic_sampling: bool = False  # with Rollout.keep: the informative groups first (DAPO)
    epochs: int = 1
    minibatches: int = 1
    wrap: bool = False  # rows need not divide into minibatches (the last rows of an epoch repeat a few)
    old_logp: str = "auto"  # auto | recompute | sampler (rl.lm.update)
    prompt_group: int = 1  # rows per shared prompt in the log-prob passes (GRPO's group; rl.lm.logp)
    temperature: float = 1.0  # the policy trained is the tempered one (as sampled)
    logprob_chunk: int = 64
    remat: str = "none"  # the loss forward's rematerialisation: none | block | dots (rl.lm.logp)
    update_rows: int = 0  # > 0: rows per log-prob pass, passes without a trained row skipped (multi-turn padding)
    lora: LoRAConfig | None = None  # train LoRA adapters only: params = adapters, the base frozen in rest
    log_kl: bool = False  # reference log-probs without a KL term, for the kl / kl_ref metrics
    ref_reset_every: int | None = None  # ProRL: reference <- policy and a fresh optimiser every N steps
    mesh: str | None = None  # e.g. "data=8" or "data=2,fsdp=4" (parallel.mesh.make_mesh)

    CHECKS = (("advantage", REGISTERED),
              (("epochs", "minibatches", "prompt_group", "logprob_chunk"), at_least(1)),
              (("warmup_steps", "schedule_steps", "update_rows"), at_least(0)),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              ("old_logp", one_of(OLD_LOGP)),
              ("remat", one_of(REMAT)),
              ("lr_schedule", one_of(LR_SCHEDULES)),
              ("weight_decay", NONNEGATIVE),
              ("ref_reset_every", or_none(at_least(1), "never")))  # (utils.validation; lr, max_grad_norm: by name)

    def __post_init__(self):
        check_hyperparameters(self)
        fits = not self.schedule_steps or self.schedule_steps > self.warmup_steps
        require(self, self.lr_schedule == "constant" or fits,
                f"lr_schedule {self.lr_schedule!r} needs schedule_steps ({self.schedule_steps}) > warmup_steps "
                f"({self.warmup_steps})")
        require(self, not (self.scheduled and self.ref_reset_every), "a learning-rate schedule or warmup restarts at "
                "every reference reset (the optimiser is re-initialised): use one or the other")

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes over the run (a schedule or warmup)."""
        return self.lr_schedule != "constant" or self.warmup_steps > 0

    def learning_rate(self) -> optax.Schedule:
        """Step -> lr: linear warmup over ``warmup_steps``, then constant / cosine / linear decay to 0 at
        ``schedule_steps``."""
        if self.lr_schedule != "constant" and not self.schedule_steps:
            raise ValueError(f"LearnerConfig: lr_schedule {self.lr_schedule!r} needs schedule_steps (the run's length)")
        decay = self.schedule_steps - self.warmup_steps
        after = {"constant": optax.constant_schedule(self.lr),
                 "cosine": optax.cosine_decay_schedule(self.lr, max(decay, 1)),
                 "linear": optax.linear_schedule(self.lr, 0.0, max(decay, 1))}[self.lr_schedule]
        if not self.warmup_steps:
            return after
        return optax.join_schedules([optax.linear_schedule(0.0, self.lr, self.warmup_steps), after],
                                    [self.warmup_steps])

    @property
    def needs_ref(self) -> bool:
        """Whether the reference policy (its params and log-probs) is kept: a KL term or KL metrics."""
        return self.loss.kl_coef > 0 or self.log_kl

    @property
    def dropout(self) -> bool:
        return self.lora is not None and self.lora.dropout > 0

    @property
    def update_config(self) -> UpdateConfig:
        return UpdateConfig(epochs=self.epochs, minibatches=self.minibatches, wrap=self.wrap, old_logp=self.old_logp,
                            group=self.prompt_group)

    def needs_old_pass(self, custom_batches: bool = False) -> bool:
        """Whether old log-probs take a forward pass of their own (several steps per batch, or dropout)."""
        return self.update_config.needs_old_pass(not self.dropout, custom_batches)

    def optimizer(self) -> optax.GradientTransformation:
        """``rl.lm.lm_optimizer`` with this learning rate (a schedule of steps when ``scheduled``: optax counts
        optimiser updates, ``epochs * minibatches`` per step)."""
        per_step, updates = self.learning_rate(), self.epochs * self.minibatches
        lr = (lambda count: per_step(count // updates)) if self.scheduled else self.lr
        return lm_optimizer(lr, self.max_grad_norm, self.adam_b2, self.weight_decay)


@flax.struct.dataclass
class LearnerState:
    params: Any  # trained: nnx.Param leaves, or (LoRA) the adapters only; a tuple of them for several models
    rest: Any  # everything else (with LoRA the frozen base), not trained
    ref_params: Any  # the reference's params (LoRA: the adapters with B zeroed); None without a KL term / KL metrics
    opt_state: optax.OptState
    step: jax.Array  # int32 []
    key: jax.Array  # step s uses fold_in(key, s)
    advantage_carry: Any = None  # a stateful estimator's state (the RAE baselines)
    agent_carry: Any = None  # the agent's own state (``init_carry``)


class Learner:
    """The LM learner (module docstring). ``model``: an ``nnx`` LM, or a sequence of LMs of one structure (one per
    agent role, each trained; rows pick theirs with ``rows.extra["model"]``)."""

    def __init__(self, config: LearnerConfig, model: nnx.Module | Sequence[nnx.Module]):
        self.config = config
        self.multi = isinstance(model, (list, tuple))
        models = list(model) if self.multi else [model]
        if not models:
            raise ValueError("Learner: no model")
        if config.lora is not None:
            models = [m if has_lora(m) else apply_lora(m, config.lora) for m in models]
        kind = LoRAParam if config.lora is not None else nnx.Param
        splits = [nnx.split(m, kind, ...) for m in models]
        if any(s[0] != splits[0][0] for s in splits):
            raise ValueError("Learner: the models must share one structure (graphdef)")
        self.graphdef = splits[0][0]
        pick = (lambda i: tuple(s[i] for s in splits)) if self.multi else (lambda i: splits[0][i])
        self._params, self._rest = pick(1), pick(2)
        self.optimizer = config.optimizer()
        self.mesh = config_mesh(config.mesh)
        self.loss_graphdef = remat_graphdef(self.graphdef, splits[0][1], splits[0][2], remat=config.remat)
        # the programs depend on the config but not on the schedule of resets or the mesh (their shardings come in)
        self._key_config = dataclasses.replace(config, ref_reset_every=None, mesh=None)
        self._keep: dict = {}  # agents whose programs are cached by identity (kept alive)

    # ----------------------------------------------------------------- state
    def init(self, key: jax.Array, agent=None, params=None) -> LearnerState:
        """The step-0 state: ``params`` (default: the model's) copied (updates are donated) and placed."""
        cfg = self.config
        check_estimator(cfg.advantage, "LearnerConfig.advantage")
        params = jax.tree.map(jnp.array, self._params if params is None else params)
        rest = jax.tree.map(jnp.array, self._rest)  # (with LoRA the base weights, still the model's arrays)
        if self.mesh is not None:
            from jaxrl_reason.models.lm.sharding import shard_state

            params, rest = shard_state(params, self.mesh), shard_state(rest, self.mesh)
        state = self.new_state(params, rest, key, agent)
        leaf = jax.tree.leaves(params)[0]
        if isinstance(leaf, jax.core.Tracer):
            return state
        if self.mesh is None:  # every leaf committed where the step leaves it (scalars too): no second compile
            return jax.device_put(state, leaf.sharding)
        from jax.sharding import NamedSharding, PartitionSpec

        replicated = NamedSharding(self.mesh, PartitionSpec())
        on_mesh = lambda x: isinstance(getattr(x, "sharding", None), NamedSharding) and x.sharding.mesh == self.mesh
        return jax.tree.map(lambda x: x if on_mesh(x) else to_global(x, replicated), state)

    def new_state(self, params, rest, key, agent=None) -> LearnerState:
        """The step-0 state of these params (pure: ``jax.eval_shape`` of it is the state's shapes)."""
        cfg = self.config
        ref = None
        if cfg.needs_ref:
            ref = jax.tree.map(jnp.copy, params)
            if cfg.lora is not None:
                ref = lora_off(ref)  # the base model: no copy of its weights
        carry = init_carry(cfg.advantage, getattr(agent, "num_groups", 0) or 0)
        if carry is not None and not getattr(agent, "num_groups", 0):
            raise ValueError(f"advantage estimator {cfg.advantage!r} keeps a state per group: the agent must say its "
                             "num_groups")
        agent_carry = agent.init_carry() if hasattr(agent, "init_carry") else None
        return LearnerState(params=params, rest=rest, ref_params=ref, opt_state=self.optimizer.init(params),
                            step=jnp.int32(0), key=key, advantage_carry=carry, agent_carry=agent_carry)

    def policy(self, state: LearnerState):
        """The model's whole state (a tuple of them for several models): what a rollout samples with."""
        return merged(state.params, state.rest, self.multi)

    def model(self, state: LearnerState, index: int = 0) -> nnx.Module:
        """The (``index``-th) model with the state's weights (LoRA: the adapters on the frozen base)."""
        if self.multi:
            return nnx.merge(self.graphdef, state.params[index], state.rest[index])
        return nnx.merge(self.graphdef, state.params, state.rest)

    # ----------------------------------------------------------------- step
    def step(self, state: LearnerState, agent, batch=None) -> tuple[LearnerState, dict]:
        """One step of ``agent`` (a rollout function or an object with ``.rollout``) on ``batch``."""
        if getattr(agent, "host", False):
            return self._host_step(state, agent, batch)
        return self._program("step", agent)(state, replicate(batch, self.mesh), self._reset_every)

    def step_fn(self, agent, data: Callable[[int], Any] | None = None) -> Callable:
        """``state -> (state, metrics)``: ``step`` on ``data(step)`` (default ``agent.batch(step)``, else None), the
        shape ``rl.base.run_steps`` drives (a resumed run draws the batch of its step)."""
        data = data or getattr(agent, "batch", None) or (lambda step: None)
        return lambda state: self.step(state, agent, data(int(state.step)))

    def _host_step(self, state, agent, batch):
        step = int(state.step)
        t0 = time.perf_counter()
        k_roll, k_update = getattr(agent, "keys", default_keys)(state.key, step)
        if hasattr(agent, "init_carry"):
            rollout, metrics, agent_carry = rollout_fn(agent)(self.policy(state), k_roll, batch, state.agent_carry)
            state = state.replace(agent_carry=agent_carry)
        else:
            rollout, metrics = rollout_fn(agent)(self.policy(state), k_roll, batch)
        t1 = time.perf_counter()
        passes = self._program("passes", agent)
        # the old / reference log-probs, while the reward functions the rollout started run on host threads
        logps = {} if passes is None else passes(state, rollout.rows_only())
        jax.block_until_ready(logps)
        t2 = time.perf_counter()
        if hasattr(agent, "score"):
            rollout, scored = agent.score(rollout)
            metrics = {**metrics, **scored}
        t3 = time.perf_counter()
        state, m = self._program("update", agent)(state, rollout, logps, k_update, self._reset_every)
        jax.block_until_ready(state.params)
        return state, {**m, **metrics, "time_sample_s": t1 - t0, "time_reward_idle_s": t3 - t2,
                       "time_update_s": time.perf_counter() - t1 - (t3 - t2)}

    @property
    def _reset_every(self) -> jax.Array:
        return jnp.int32(self.config.ref_reset_every or 0)

    def _program(self, kind: str, agent):
        """The cached jitted program ``kind`` of ``agent`` (``rl.lm.programs``)."""
        return program(self.graphdef, self.loss_graphdef, self._key_config, self.multi, kind, agent)

    # ----------------------------------------------------------------- evaluation, plan, checkpoints, export
    def evaluate(self, state: LearnerState, agent, batch=None, key: jax.Array | None = None) -> dict:
        """``agent.evaluate(policy, key, batch)``, or the rollout's mean reward with its standard error and n."""
        key = jax.random.key(0) if key is None else key
        carry = (state.agent_carry,) if hasattr(agent, "init_carry") else ()
        if hasattr(agent, "evaluate"):
            return agent.evaluate(self.policy(state), key, batch, *carry)
        roll = rollout_fn(agent) if getattr(agent, "host", False) else self._program("rollout", agent)
        rollout = roll(self.policy(state), key, replicate(batch, self.mesh), *carry)[0]
        if hasattr(agent, "score"):
            rollout = agent.score(rollout)[0]
        r = np.asarray(rollout.rewards, np.float64)
        if rollout.valid is not None:
            r = r[np.asarray(rollout.valid) > 0]
        return {"reward": float(r.mean()), "reward_se": float(r.std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else 0.0,
                "n": int(len(r))}

    def plan(self, agent, batch=None, **kw):
        """This run's memory and FLOPs per device from its compiled programs, without running them: the agent's
        own ``plan(learner, **kw)`` (GRPO's) or ``rl.lm.plan.plan_step`` (``.summary()``, ``.check()`` refuses one
        that does not fit)."""
        if hasattr(agent, "plan"):
            return agent.plan(self, **kw)
        from jaxrl_reason.rl.lm.plan import plan_step

        return plan_step(self, agent, batch, **kw)

    def save(self, state: LearnerState, directory, max_to_keep: int = 3) -> None:
        """Write ``state`` as checkpoint ``state.step`` under ``directory`` (``utils.checkpoint``)."""
        from jaxrl_reason.utils.checkpoint import Checkpointer

        with Checkpointer(directory, max_to_keep=max_to_keep) as ckpt:
            ckpt.save(int(state.step), state, force=True)

    def restore(self, directory, agent=None, step: int | None = None, key: jax.Array | None = None) -> LearnerState:
        """The state of checkpoint ``step`` (default the latest) under ``directory``, placed as ``init`` places."""
        from jaxrl_reason.utils.checkpoint import Checkpointer

        template = self.init(jax.random.key(0) if key is None else key, agent)
        with Checkpointer(directory) as ckpt:
            return ckpt.restore(template, step)[1]

    def export(self, state: LearnerState, path, tokenizer=None, *, source=None, dtype: str | None = None,
               adapter_path=None, index: int = 0) -> dict:
        """The trained model as a HF directory at ``path`` (``models.lm.save_hf_model``; LoRA: the adapters merged)
        and, for LoRA, a PEFT adapter at ``adapter_path`` (``models.lm.save_peft_adapter``; None where peft cannot
        name them). Process 0 writes. -> {"hf": path, "adapter": path or None}."""
        from jaxrl_reason.models.lm import save_hf_model, save_peft_adapter
        from jaxrl_reason.parallel.distributed import gathered, on_primary

        graphdef, weights = nnx.split(self.model(state, index))
        policy = nnx.merge(graphdef, gathered(weights))  # multi-process: the whole policy on every host
        hf = on_primary(lambda: str(save_hf_model(policy, path, tokenizer, source=source, dtype=dtype,
                                                  overwrite=True)), errors=(ValueError, OSError))
        adapter = None
        if self.config.lora is not None and adapter_path is not None:
            try:
                adapter = on_primary(lambda: str(save_peft_adapter(policy, adapter_path, base_model=source,
                                                                   overwrite=True)), errors=(ValueError, OSError))
            except ValueError as e:
                print(f"note: no PEFT adapter written ({e}); {path} holds the adapters merged", flush=True)
        return {"hf": hf, "adapter": adapter}


__all__ = ["LR_SCHEDULES", "Learner", "LearnerConfig", "LearnerState", "default_keys"]
