"""GRPO trainer: prompts from a dataset -> G samples each (jitted LM sampler) -> reward functions on
the decoded text -> group advantages -> several epochs of minibatch updates of the clipped,
KL-regularised policy loss.

    trainer = GRPOTrainer(GRPOConfig(...), model, tokenizer, dataset, reward_fns)
    #   dataset: data.PromptDataset (rows from a file, rendered prompts) or tasks.TaskDataset (synthetic tasks)
    #   reward_fns: [fn | (fn, weight)], fn(prompts, completions, *, completion_ids, step, **row_fields) -> [B]
    #   numbers or None (jaxrl_reason.rewards; each keyword optional to declare; sync or async)
    trainer = GRPOTrainer.for_tasks(GRPOConfig(...), model, CharTokenizer(), [RandomCalculation()], prompt_len=24)
    state = trainer.init(jax.random.key(0))                 # starts from the model's weights
    state, metrics = trainer.step(state)                    # one RL step (host entry point)
    run_chunks(run_dir, state, host_steps(trainer.step, 10), n)     # checkpoints + exact resume (rl.base)

One step: (1) take ``prompts_per_step * oversample`` prompts from the dataset, seeded by
(config.seed, step), so a resumed run sees the same data; (2) sample ``group_size`` responses per
prompt at ``temperature``, stopping at eos or a stop string (``</answer>``); (3) decode them and score
them with the reward functions in a thread pool (``rewards.RewardSuite``; weighted sum, each logged as
``reward/<name>``; a sample any function returned None for is excluded: no part in its group's statistics,
advantage 0, no loss tokens; counted as ``reward/<name>/excluded`` and ``excluded``) while the device computes
the old-policy and reference log-probs where they are needed; (4) in one jitted update (``rl.lm.make_update``): dynamic sampling (keep groups with non-zero
reward variance first, then fill with the rest: static shapes, oversample-and-select), advantages
(``rl.lm.advantages.ESTIMATORS``), ``epochs`` x ``minibatches`` optimiser steps of the loss
(``rl.lm.loss``: objective clip / gspo / cispo), and the ProRL reference hard reset (reference <-
policy and the optimiser state re-initialised every ``ref_reset_every`` steps). ``time_reward_idle_s``
is the time the device waited for the host's rewards after its log-probs were done.

No wasted passes: the reference's log-probs are computed (and ``state.ref_params`` kept; None
otherwise) only with a KL term (``loss.kl_coef > 0``) or ``log_kl=True`` (the ``kl`` / ``kl_ref``
metrics). Old log-probs: with one epoch of one minibatch (and no LoRA dropout) they are the loss
forward's own under ``stop_gradient`` (ratio 1, the same gradient; ``logp_mismatch`` compares them with
the sampler's), otherwise a forward pass of the sampling parameters ahead of the update. ``remat``
(none / block / dots, ``rl.lm.logp``) trades the loss backward's memory for recomputation.

Knobs a TRL user reaches for: ``lr_schedule`` constant / cosine / linear with ``warmup_steps`` (optax schedules
over ``schedule_steps`` RL steps; logged as ``lr``), ``weight_decay`` (AdamW on matrices), ``top_p`` / ``top_k`` /
``min_p`` (the sampler's filters), ``mask_truncated`` (completions cut by ``max_new_tokens`` add no loss; logged
as ``truncated_fraction``). ``trainer.last_samples`` holds the last step's prompts, completions and rewards.

The policy distribution trained is the tempered one (logits / temperature, without the top-p / top-k / min-p
filters, as TRL and verl score it). Multi-device:
``mesh="data=8"`` (any spec of ``parallel.mesh.make_mesh``) shards the parameters with the LM
partition rules and the batch over the data axes. Multi-process (``parallel.distributed``; with
``mesh=None`` the batch is split over every device of every process): every process draws the
same global prompt batch from the seeded stream and places its own slice (``to_global``); the
completions are all-gathered so every process decodes and scores all of them (the rewards, and so
the update, are those of one process with the same global batch and mesh).

LoRA: ``GRPOConfig(lora=LoRAConfig(...))`` adds adapters (``models.lm.lora``) to the model (a copy
sharing its arrays; a model that already has adapters keeps them). ``state.params`` and the
optimiser state then hold the adapters only, the base weights ride in ``state.rest`` frozen, and
``state.ref_params`` is the adapters with B zeroed, so the KL reference is exactly the base model
with no second copy of the weights (a ProRL reset makes it base + the current adapters).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.models.lm.lora import LoRAConfig, LoRAParam, apply_lora, has_lora, lora_off
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.distributed import host_values, to_global
from jaxrl_reason.parallel.mesh import config_mesh
from jaxrl_reason.rewards import R1Format, RewardSuite, make_reward
from jaxrl_reason.rl.lm.advantages import REGISTERED, estimate
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_logp_fn, lm_optimizer, make_update, remat_graphdef
from jaxrl_reason.rl.lm.logp import REMAT
from jaxrl_reason.tasks.rewards import RewardConfig, task_rewards
from jaxrl_reason.utils.validation import (NONNEGATIVE, POSITIVE, Range, at_least, check_hyperparameters, one_of,
                                           or_none, require)


LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    seed: int = 0  # problem stream
    group_size: int = 8
    prompts_per_step: int = 16
    dynamic_sampling: bool = False  # drop zero-variance groups, refill from oversampled ones
    oversample: int = 2  # groups drawn = prompts_per_step * oversample (only with dynamic_sampling)
    epochs: int = 1
    minibatches: int = 1
    lr: float = 1e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.99  # (rl.lm.optim's default is 0.999; GRPO has always used 0.99)
    temperature: float = 1.0
    max_new_tokens: int = 32
    advantage: str = "grpo"  # grpo | dr_grpo | rloo
    loss: LossConfig = LossConfig()
    reward: RewardConfig = RewardConfig()  # the reward of GRPOTrainer.for_tasks (synthetic task presets)
    overlong_cache: int = 0  # DAPO soft overlong window in tokens (0 = off): adds the "overlong" reward
    ref_reset_every: int | None = None  # ProRL hard reset interval in steps (None = never)
    mesh: str | None = None  # e.g. "data=8"
    logprob_chunk: int = 64
    lora: LoRAConfig | None = None  # train LoRA adapters only (see the module docstring)
    log_kl: bool = False  # compute the reference's log-probs without a KL term, for the kl / kl_ref metrics
    remat: str = "none"  # the loss forward's rematerialisation: none | block | dots (rl.lm.logp)
    lr_schedule: str = "constant"  # constant | cosine | linear (decay to 0 at schedule_steps)
    warmup_steps: int = 0  # linear warmup from 0 over these steps
    schedule_steps: int = 0  # the RL steps cosine / linear decay over (0: the experiment sets its run length)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay on matrices (ndim >= 2; not norms or biases)
    top_p: float = 1.0  # sampling filters (models.lm.sampler); the loss still scores the tempered distribution
    top_k: int = 0
    min_p: float = 0.0
    mask_truncated: bool = False  # completions that hit max_new_tokens add no loss (their rewards still count)
    # the learner's forward passes run each prompt once per group into a KV cache the group's completions attend to
    # (exact; fewer positions: Q*P + Q*G*N instead of Q*G*(P+N)); needs minibatches that divide prompts_per_step,
    # else off
    share_prompts: bool = True

    CHECKS = (("group_size", at_least(2), "group-relative advantages need a group"),
              (("prompts_per_step", "oversample", "epochs", "minibatches", "max_new_tokens"), at_least(1)),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              ("advantage", REGISTERED),
              ("ref_reset_every", or_none(at_least(1), "never")),
              ("remat", one_of(REMAT)),
              ("lr_schedule", one_of(LR_SCHEDULES)),
              (("warmup_steps", "schedule_steps"), at_least(0)),
              ("weight_decay", NONNEGATIVE),
              ("min_p", Range(0.0, 1.0, high_open=True)))  # rules of one field (utils.validation); between fields:

    def __post_init__(self):
        check_hyperparameters(self)
        require(self, (self.prompts_per_step * self.group_size) % self.minibatches == 0,
                f"prompts_per_step*group_size ({self.prompts_per_step * self.group_size}) must be divisible by "
                f"minibatches ({self.minibatches})")
        require(self, 0 <= self.overlong_cache <= self.max_new_tokens,
                f"overlong_cache must be in [0, max_new_tokens={self.max_new_tokens}], got {self.overlong_cache}")
        fits = not self.schedule_steps or self.schedule_steps > self.warmup_steps
        require(self, self.lr_schedule == "constant" or fits,
                f"lr_schedule {self.lr_schedule!r} needs schedule_steps ({self.schedule_steps}) > warmup_steps "
                f"({self.warmup_steps})")
        require(self, not (self.scheduled and self.ref_reset_every), "a learning-rate schedule or warmup restarts at "
                "every reference reset (the optimiser is re-initialised): use one or the other")
        SamplerConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                      top_p=self.top_p, min_p=self.min_p)  # the sampler's own checks

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate changes over the run (a schedule or warmup)."""
        return self.lr_schedule != "constant" or self.warmup_steps > 0

    def learning_rate(self) -> optax.Schedule:
        """RL step -> lr: linear warmup over ``warmup_steps``, then constant / cosine / linear decay to 0 at
        ``schedule_steps``."""
        if self.lr_schedule != "constant" and not self.schedule_steps:
            raise ValueError(f"GRPOConfig: lr_schedule {self.lr_schedule!r} needs schedule_steps (the run's length)")
        decay = self.schedule_steps - self.warmup_steps
        after = {"constant": optax.constant_schedule(self.lr),
                 "cosine": optax.cosine_decay_schedule(self.lr, max(decay, 1)),
                 "linear": optax.linear_schedule(self.lr, 0.0, max(decay, 1))}[self.lr_schedule]
        if not self.warmup_steps:
            return after
        return optax.join_schedules([optax.linear_schedule(0.0, self.lr, self.warmup_steps), after],
                                    [self.warmup_steps])

    @property
    def groups_sampled(self) -> int:
        return self.prompts_per_step * (self.oversample if self.dynamic_sampling else 1)

    @property
    def needs_ref(self) -> bool:
        """Whether the reference policy (its params and log-probs) is needed: a KL term or KL metrics."""
        return self.loss.kl_coef > 0 or self.log_kl

    @property
    def dropout(self) -> bool:
        return self.lora is not None and self.lora.dropout > 0

    @property
    def prompt_group(self) -> int:
        """Rows per shared prompt in the learner's forward passes (``share_prompts``), else 1."""
        return self.group_size if self.share_prompts and self.prompts_per_step % self.minibatches == 0 else 1

    @property
    def update_config(self) -> UpdateConfig:
        return UpdateConfig(epochs=self.epochs, minibatches=self.minibatches, group=self.prompt_group)

    @property
    def needs_old_pass(self) -> bool:
        """Whether old log-probs take a forward pass of their own (several steps per batch, or dropout)."""
        return self.update_config.needs_old_pass(deterministic=not self.dropout)


@flax.struct.dataclass
class GRPOState:
    params: nnx.State  # trained: nnx.Param leaves, or (LoRA) the adapters' LoRAParam leaves only
    rest: nnx.State  # everything else (e.g. MoE expert biases; with LoRA the frozen base), not trained
    ref_params: nnx.State | None  # reference policy's params (LoRA: the adapters with B zeroed); None without
    # a KL term or KL metrics (GRPOConfig.needs_ref)
    opt_state: optax.OptState
    step: jax.Array  # int32 []
    key: jax.Array


def _optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """``rl.lm.lm_optimizer`` with the config's learning rate (a schedule of RL steps when ``scheduled``)."""
    per_step, updates = cfg.learning_rate(), cfg.epochs * cfg.minibatches  # optax counts optimiser updates
    lr = (lambda count: per_step(count // updates)) if cfg.scheduled else cfg.lr
    return lm_optimizer(lr, cfg.max_grad_norm, cfg.adam_b2, cfg.weight_decay)


def select_groups(rewards: jax.Array, keep: int, dynamic: bool, valid: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """rewards [Q, G] (valid [Q, G]: 0 on excluded samples) -> (indices of ``keep`` groups [keep], fraction of
    groups with zero variance among their valid samples).

    Dynamic sampling with static shapes: groups with non-zero reward variance come first (stable
    order), zero-variance groups only fill the remaining slots (their advantages are 0 anyway).
    """
    if valid is None:
        informative = jnp.std(rewards, axis=1) > 0
    else:
        w = valid.astype(rewards.dtype)
        mean = (rewards * w).sum(1, keepdims=True) / jnp.maximum(w.sum(1, keepdims=True), 1.0)
        informative = ((rewards - mean) ** 2 * w).sum(1) > 0
    frac_filtered = 1.0 - jnp.mean(informative.astype(jnp.float32))
    order = jnp.argsort(~informative, stable=True) if dynamic else jnp.arange(rewards.shape[0])
    return order[:keep], frac_filtered


class GRPOTrainer:
    def __init__(self, config: GRPOConfig, model, tokenizer: Tokenizer, dataset, reward_fns: Sequence,
                 stop_strings: Sequence[str] = ("</answer>",), reward_workers: int = 4):
        """dataset: ``sample(step, n) -> (rows, ids [n, P], lens [n])``, ``prompt_len``, ``prompt_strings(rows)``
        (``data.PromptDataset`` / ``tasks.TaskDataset``); reward_fns: see ``jaxrl_reason.rewards``."""
        self.config, self.tokenizer, self.dataset = config, tokenizer, dataset
        self.prompt_len = dataset.prompt_len
        tokenizer.check_model(model.cfg, self.prompt_len + config.max_new_tokens, "GRPOTrainer")
        fns = list(reward_fns)
        if config.overlong_cache:
            fns.append(make_reward("overlong", max_new_tokens=config.max_new_tokens, cache=config.overlong_cache))
        self.rewards = RewardSuite(fns, max_workers=reward_workers)
        self._format = R1Format()
        self.stop_tokens, self.stop_sequences = tokenizer.stops(stop_strings)
        model.cfg.check_cache(self.prompt_len, config.max_new_tokens, self.prompt_len + config.max_new_tokens)
        if config.lora is not None and not has_lora(model):
            model = apply_lora(model, config.lora)
        self.graphdef, params, rest = nnx.split(model, LoRAParam if config.lora is not None else nnx.Param, ...)
        self._init_params, self._rest = params, rest
        self.optimizer = _optimizer(config)
        self.sampler_config = SamplerConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                            top_k=config.top_k, top_p=config.top_p, min_p=config.min_p,
                                            pad_id=tokenizer.pad_id)
        self.last_samples: dict[str, list] = {}  # the last step's prompts, completions and rewards (to log)
        self.mesh = config_mesh(config.mesh)
        if self.mesh is not None:
            from jaxrl_reason.models.lm.sharding import BATCH_AXES

            n_batch = int(np.prod([self.mesh.shape[a] for a in BATCH_AXES if a in self.mesh.shape]))
            rows = {"sampled rows (groups_sampled*group_size)": config.groups_sampled * config.group_size,
                    "minibatch rows": config.prompts_per_step * config.group_size // config.minibatches}
            for what, n in rows.items():
                if n % n_batch:
                    raise ValueError(f"GRPOConfig: {what} = {n} is not divisible by the {n_batch} devices of the "
                                     f"batch axes of mesh {dict(self.mesh.shape)} ({jax.process_count()} "
                                     f"process(es)); use a multiple of {n_batch}")
        # one compilation per (model structure, update-relevant config): reward, seed and reset interval
        # are not part of it, so the runs of a study share the compiled programs.
        key_cfg = dataclasses.replace(config, seed=0, reward=RewardConfig(), ref_reset_every=None, mesh=None,
                                      overlong_cache=0)
        self._logprobs = _logprobs_fn(self.graphdef, key_cfg, tokenizer.pad_id)  # None: no pass needed
        loss_graphdef = remat_graphdef(self.graphdef, params, rest, remat=config.remat)
        self._update = _update_fn(self.graphdef, loss_graphdef, key_cfg, tokenizer.pad_id)

    @classmethod
    def for_tasks(cls, config: GRPOConfig, model, tokenizer: Tokenizer, tasks: Sequence, prompt_len: int,
                  task_weights=None, fmt=None, **kw) -> "GRPOTrainer":
        """The synthetic-task presets: ``tasks.TaskDataset`` prompts (``<bos>`` + problem text, or rendered
        with ``fmt``, e.g. a checkpoint's chat template; the problems drawn from default_rng([config.seed,
        step])) and the rewards of ``config.reward`` (``task_rewards``)."""
        from jaxrl_reason.tasks import TaskDataset

        tasks = list(tasks)
        if not tasks:
            raise ValueError("GRPOTrainer.for_tasks: need at least one task")
        dataset = TaskDataset(tasks, tokenizer, prompt_len, weights=task_weights, seed=config.seed, fmt=fmt)
        return cls(config, model, tokenizer, dataset, task_rewards(tasks, config.reward, config.seed), **kw)

    # ----------------------------------------------------------------- state
    def init(self, key: jax.Array, params: nnx.State | None = None) -> GRPOState:
        params = self._init_params if params is None else params
        params = jax.tree.map(jnp.array, params)  # own copies (updates are donated)
        rest = jax.tree.map(jnp.array, self._rest)  # (with LoRA the base weights, still the model's arrays)
        if self.mesh is not None:
            from jaxrl_reason.models.lm.sharding import shard_state

            params, rest = shard_state(params, self.mesh), shard_state(rest, self.mesh)
        state = self.new_state(params, rest, key)
        # every leaf committed where the update leaves it (scalars included), so step 2 does not recompile
        if self.mesh is None:
            return jax.device_put(state, jax.tree.leaves(params)[0].sharding)
        from jax.sharding import NamedSharding, PartitionSpec

        replicated = NamedSharding(self.mesh, PartitionSpec())
        on_mesh = lambda x: isinstance(getattr(x, "sharding", None), NamedSharding) and x.sharding.mesh == self.mesh
        return jax.tree.map(lambda x: x if on_mesh(x) else to_global(x, replicated), state)

    def new_state(self, params, rest, key) -> GRPOState:
        """The step-0 state of these params (pure: ``jax.eval_shape`` of it is the state's shapes)."""
        ref = None
        if self.config.needs_ref:
            ref = jax.tree.map(jnp.copy, params)
            if self.config.lora is not None:
                ref = lora_off(ref)  # the base model: no copy of its weights
        return GRPOState(params=params, rest=rest, ref_params=ref, opt_state=self.optimizer.init(params),
                         step=jnp.int32(0), key=key)

    def plan(self, **kw):
        """This run's memory and FLOPs per device from its compiled programs, without running them
        (``rl.lm.plan.plan_grpo``; ``.summary()``, ``.check()`` refuses one that does not fit)."""
        from jaxrl_reason.rl.lm.plan import plan_grpo

        return plan_grpo(self, **kw)

    def model(self, state: GRPOState):
        return nnx.merge(self.graphdef, state.params, state.rest)

    def _put(self, x):
        x = jnp.asarray(x)
        if self.mesh is None:
            return x
        from jaxrl_reason.models.lm.sharding import batch_sharding

        return to_global(x, batch_sharding(self.mesh, x.shape))

    def _finished(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """[B] float32: 1 where a completion stopped (a stop token / sequence, or shorter than max_new_tokens),
        0 where max_new_tokens cut it (``mask_truncated``)."""
        stops = set(np.asarray(self.stop_tokens).tolist())
        seqs = [] if self.stop_sequences is None else np.asarray(self.stop_sequences)
        return np.asarray([n < self.config.max_new_tokens or _ends_with_stop(t, int(n), stops, seqs)
                           for t, n in zip(tokens, lengths)], np.float32)

    # ----------------------------------------------------------------- step
    def prompts(self, step: int):
        """The step's prompts, each repeated group_size times: (rows, prompt strings, ids [B, P], lens [B])."""
        rows, ids, lens = self.dataset.sample(step, self.config.groups_sampled)
        g = self.config.group_size
        rows = [r for r in rows for _ in range(g)]
        return rows, self.dataset.prompt_strings(rows), np.repeat(ids, g, axis=0), np.repeat(lens, g, axis=0)

    def step(self, state: GRPOState) -> tuple[GRPOState, dict]:
        """One GRPO step. Metrics include ``time_sample_s`` (sampling, wall), ``time_reward_idle_s`` (the
        device waiting for host rewards) and ``time_update_s`` (log-probs + the jitted update, blocked on)."""
        cfg = self.config
        t0 = time.perf_counter()
        step = int(state.step)
        rows, prompt_text, ids, lens = self.prompts(step)
        k_sample, _, k_update = jax.random.split(jax.random.fold_in(state.key, step), 3)  # earlier runs' keys
        b = len(rows)
        prompts, plens = self._put(ids), self._put(lens)
        seqs = None if self.stop_sequences is None else self._put(jnp.broadcast_to(
            self.stop_sequences, (b,) + self.stop_sequences.shape))
        stops = self._put(jnp.broadcast_to(self.stop_tokens, (b,) + self.stop_tokens.shape))
        out = generate(self.graphdef, nnx.merge_state(state.params, state.rest), prompts, plens, k_sample, stops,
                       self._put(jnp.full((b,), cfg.max_new_tokens, jnp.int32)), seqs, config=self.sampler_config)
        tokens, lengths = host_values([out.tokens, out.lengths])  # all rows, on every process
        t1 = time.perf_counter()
        completions = self.tokenizer.decode_completions(tokens, lengths)
        fields = {k: [r[k] for r in rows] for k in rows[0] if all(k in r for r in rows)}
        fields["completion_ids"] = [t[:n].tolist() for t, n in zip(tokens, lengths)]
        pending = self.rewards.score(prompt_text, completions, fields, step=step)
        logps = {} if self._logprobs is None else self._logprobs(state, prompts, plens, out.tokens)  # meanwhile
        jax.block_until_ready(logps)
        t2 = time.perf_counter()
        scores = pending.result()
        total, per_fn = scores.total, scores.per_fn
        t3 = time.perf_counter()
        none = lambda v: [None if not np.isfinite(x) else float(x) for x in v]  # excluded samples: None
        self.last_samples = {"prompt": prompt_text, "completion": completions,
                             "reward": none(np.where(scores.valid, total, np.nan)),
                             **{f"reward/{k}": none(v) for k, v in per_fn.items()}}
        finished = self._put(self._finished(tokens, lengths)) if cfg.mask_truncated else None
        state, metrics = self._update(state, k_update, prompts, plens, out.tokens, out.lengths, out.logprobs, logps,
                                      jnp.asarray(total).reshape(-1, cfg.group_size),
                                      jnp.int32(cfg.ref_reset_every or 0), finished,
                                      valid=jnp.asarray(scores.valid, jnp.float32).reshape(-1, cfg.group_size))
        jax.block_until_ready(state.params)
        metrics["time_sample_s"], metrics["time_reward_idle_s"] = t1 - t0, t3 - t2
        metrics["time_update_s"] = time.perf_counter() - t1 - (t3 - t2)
        metrics.update(self.rewards.metrics(per_fn))
        metrics["excluded"] = float(len(total) - scores.valid.sum())  # samples some reward returned None for
        if "correct" in per_fn:
            metrics["accuracy"] = float(np.mean(per_fn["correct"] == 1.0))
        metrics["format_rate"] = float(np.mean(self._format(prompt_text, completions)))
        return state, metrics


def _ends_with_stop(row, length: int, stop_tokens, stop_sequences) -> bool:
    """Whether a completion's ``length`` tokens ``row`` end with a stop token or stop sequence."""
    if length and int(row[length - 1]) in stop_tokens:
        return True
    for seq in stop_sequences:
        seq = [int(t) for t in seq if t >= 0]
        if seq and length >= len(seq) and [int(t) for t in row[length - len(seq):length]] == seq:
            return True
    return False


def _logp_fn(graphdef, cfg: GRPOConfig, remat: str = "none"):
    """(params, rest, rows: Rollout) -> (log pi(response) [B, N], entropy [B, N])."""
    return lm_logp_fn(graphdef, cfg.max_new_tokens, cfg.temperature, cfg.logprob_chunk, remat, cfg.prompt_group)


@functools.lru_cache(maxsize=None)
def _logprobs_fn(graphdef, cfg: GRPOConfig, pad_id: int):
    """Jitted: (state, prompts, prompt_lens, tokens) -> {"old", "old_entropy"} (only when the update needs a pass
    of its own) and {"ref"} (only with ``cfg.needs_ref``), each [B, N]; None when neither is needed."""
    if not (cfg.needs_old_pass or cfg.needs_ref):
        return None
    logp = _logp_fn(graphdef, cfg)

    def run(state: GRPOState, prompts, prompt_lens, tokens):
        rows = Rollout(join(prompts, prompt_lens, tokens, pad_id), prompt_lens, None, None)
        out = {}
        if cfg.needs_old_pass:
            out["old"], out["old_entropy"] = logp(state.params, state.rest, rows)
        if cfg.needs_ref:
            out["ref"] = logp(state.ref_params, state.rest, rows)[0]
        return out

    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _update_fn(graphdef, loss_graphdef, cfg: GRPOConfig, pad_id: int):
    """Jitted update for one model structure and config (see the module docstring)."""
    optimizer = _optimizer(cfg)
    logp_fn = _logp_fn(loss_graphdef, cfg, cfg.remat)
    loss_fn = make_loss(cfg.loss)

    def update(state: GRPOState, key, prompts, prompt_lens, tokens, lengths, sample_logp, logps, rewards, reset_every,
               finished=None, valid=None):
        """rewards, valid [Q, G] (valid: 1, or 0 on a sample a reward excluded with None: no part in its group's
        statistics, advantage 0, no loss tokens)."""
        g, n = cfg.group_size, cfg.max_new_tokens
        sel, frac_filtered = select_groups(rewards, cfg.prompts_per_step, cfg.dynamic_sampling, valid)
        rows = (sel[:, None] * g + jnp.arange(g)[None]).reshape(-1)
        chosen = rewards[sel].reshape(-1)
        kept = None if valid is None else valid[sel].reshape(-1)
        adv, _ = estimate(cfg.advantage, chosen, jnp.repeat(jnp.arange(cfg.prompts_per_step), g), cfg.prompts_per_step,
                          None if kept is None else kept > 0)
        prompt_lens, lengths = prompt_lens[rows], lengths[rows]
        extra = {}
        if cfg.dropout:  # one seed per row; a minibatch uses its first row's
            key, k_drop = jax.random.split(key)
            extra["dropout_seed"] = jax.random.randint(k_drop, rows.shape, 0, jnp.iinfo(jnp.int32).max)
        pick = lambda k: logps[k][rows] if k in logps else None
        mask = response_mask(lengths, n)
        if finished is not None:  # mask_truncated: a cut-off completion adds no loss
            mask = mask * finished[rows][:, None]
        if kept is not None:  # excluded samples add no loss
            mask = mask * kept[:, None]
        rollout = Rollout(join(prompts[rows], prompt_lens, tokens[rows], pad_id), prompt_lens, mask,
                          adv, sample_logp=sample_logp[rows], ref_logp=pick("ref"), old_logp=pick("old"),
                          old_entropy=pick("old_entropy"), extra=extra)
        learn = make_update(lambda p, r: logp_fn(p, state.rest, r), loss_fn, optimizer, cfg.update_config,
                            deterministic=not cfg.dropout)
        (params, opt_state), m = learn(state.params, state.opt_state, rollout, key)
        step = state.step + 1
        reset = (reset_every > 0) & (step % jnp.maximum(reset_every, 1) == 0)
        pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(reset, x, y), a, b)
        ref_params = None if state.ref_params is None else pick(params, state.ref_params)
        opt_state = pick(optimizer.init(params), opt_state)
        metrics = {k: v.mean() for k, v in m.items()}
        mean = lambda r, w: r.mean() if w is None else (r * w).sum() / jnp.maximum(w.sum(), 1.0)
        metrics.update(
            reward=mean(rewards, valid), reward_selected=mean(rewards[sel], None if valid is None else valid[sel]),
            frac_filtered=frac_filtered,
            response_length=lengths.mean(), clip_fraction=m["clip_fraction"].mean(), ref_reset=reset.astype(jnp.float32),
        )
        if "kl" in m:
            metrics["kl_ref"] = m["kl"][0, 0]
        if finished is not None:
            metrics["truncated_fraction"] = 1.0 - finished.mean()
        if cfg.scheduled:
            metrics["lr"] = jnp.asarray(cfg.learning_rate()(state.step), jnp.float32)
        return GRPOState(params=params, rest=state.rest, ref_params=ref_params, opt_state=opt_state, step=step,
                         key=state.key), metrics

    return jax.jit(update, donate_argnums=0)

