"""GRPO as an agent of the one learner: prompts from a dataset -> G samples each (the jitted LM sampler) ->
reward functions on the decoded text; the learner (``rl.lm.Learner``) makes the group advantages and runs the
update (clipped, KL-regularised policy loss, ``epochs`` x ``minibatches``).

    learner, agent = grpo_learner(GRPOConfig(...), model, tokenizer, dataset, reward_fns)
    #   dataset: data.PromptDataset (rows from a file, rendered prompts) or tasks.TaskDataset (synthetic tasks)
    #   reward_fns: [fn | (fn, weight)], fn(prompts, completions, *, completion_ids, step, **row_fields) -> [B]
    #   numbers or None (jaxrl_reason.rewards; each keyword optional to declare; sync or async)
    learner, agent = grpo_for_tasks(GRPOConfig(...), model, CharTokenizer(), [RandomCalculation()], prompt_len=24)
    state = learner.init(jax.random.key(0), agent)          # starts from the model's weights
    state, metrics = learner.step(state, agent, agent.batch(int(state.step)))      # one RL step
    run_steps(run_dir, learner.step_fn(agent), state, n, ...)        # checkpoints + exact resume (rl.base)

One step: (1) ``agent.batch(step)``: ``prompts_per_step * oversample`` prompts from the dataset, seeded by
(config.seed, step), so a resumed run sees the same data; (2) ``agent.rollout``: ``group_size`` responses per
prompt at ``temperature``, stopping at eos or a stop string (``</answer>``), decoded and handed to the reward
functions in a thread pool (``rewards.RewardSuite``); (3) the learner dispatches the old-policy and reference
log-prob passes where they are needed, then ``agent.score`` waits for the rewards (weighted sum, each logged as
``reward/<name>``; a sample any function returned None for is excluded: no part in its group's statistics,
advantage 0, no loss tokens; counted as ``reward/<name>/excluded`` and ``excluded``): ``time_reward_idle_s`` is
the time the device waited for them; (4) the learner's jitted update: dynamic sampling (``Rollout.keep``: groups
with non-zero reward variance first, then the rest: static shapes, oversample-and-select), the advantages of the
registered estimator ``advantage``, the optimiser steps, the ProRL reference hard reset (``ref_reset_every``).

No wasted passes: the reference's log-probs are computed (and ``state.ref_params`` kept; None otherwise) only
with a KL term (``loss.kl_coef > 0``) or ``log_kl=True`` (the ``kl`` / ``kl_ref`` metrics). Old log-probs: with
one epoch of one minibatch (and no LoRA dropout) they are the loss forward's own under ``stop_gradient`` (ratio
1, the same gradient; ``logp_mismatch`` compares them with the sampler's), otherwise a forward pass ahead of the
update. ``remat`` (none / block / dots, ``rl.lm.logp``) trades the loss backward's memory for recomputation.

Knobs a TRL user reaches for: ``lr_schedule`` constant / cosine / linear with ``warmup_steps`` (optax schedules
over ``schedule_steps`` RL steps; logged as ``lr``), ``weight_decay`` (AdamW on matrices), ``top_p`` / ``top_k`` /
``min_p`` (the sampler's filters), ``mask_truncated`` (completions cut by ``max_new_tokens`` add no loss; logged
as ``truncated_fraction``). ``agent.last_samples`` holds the last step's prompts, completions and rewards.

The policy distribution trained is the tempered one (logits / temperature, without the top-p / top-k / min-p
filters, as TRL and verl score it). Multi-device: ``mesh="data=8"`` (any spec of ``parallel.mesh.make_mesh``):
the learner shards the parameters with the LM partition rules, the agent the batch over the data axes.
Multi-process (``parallel.distributed``; with ``mesh=None`` the batch is split over every device of every
process): every process draws the same global prompt batch from the seeded stream and places its own slice
(``to_global``); the completions are all-gathered so every process decodes and scores all of them.

LoRA: ``GRPOConfig(lora=LoRAConfig(...))``: the learner adds adapters (``models.lm.lora``) to the model (a copy
sharing its arrays; a model that already has adapters keeps them); ``state.params`` and the optimiser state hold
the adapters only, the base weights ride in ``state.rest`` frozen, and ``state.ref_params`` is the adapters with B
zeroed, so the KL reference is exactly the base model with no second copy of the weights.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.models.lm.lora import LoRAConfig
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.distributed import host_values, to_global
from jaxrl_reason.rewards import R1Format, RewardSuite, make_reward
from jaxrl_reason.rl.lm import Learner, LearnerConfig, Rollout
from jaxrl_reason.rl.lm.advantages import REGISTERED
from jaxrl_reason.rl.lm.learner import LR_SCHEDULES
from jaxrl_reason.rl.lm.logp import REMAT
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.tasks.rewards import RewardConfig, task_rewards
from jaxrl_reason.utils.validation import (NONNEGATIVE, POSITIVE, Range, at_least, check_hyperparameters, one_of,
                                           or_none, require)


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
    reward: RewardConfig = RewardConfig()  # the reward of grpo_for_tasks (synthetic task presets)
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
        try:
            self.learner_config()  # the learner's own checks (schedules, resets)
        except ValueError as e:
            raise ValueError(str(e).replace("LearnerConfig", "GRPOConfig")) from None
        SamplerConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                      top_p=self.top_p, min_p=self.min_p)  # the sampler's own checks

    @property
    def groups_sampled(self) -> int:
        return self.prompts_per_step * (self.oversample if self.dynamic_sampling else 1)

    @property
    def prompt_group(self) -> int:
        """Rows per shared prompt in the learner's forward passes (``share_prompts``), else 1."""
        return self.group_size if self.share_prompts and self.prompts_per_step % self.minibatches == 0 else 1

    def learner_config(self) -> LearnerConfig:
        """The learner's part of this config (``rl.lm.LearnerConfig``)."""
        return LearnerConfig(
            lr=self.lr, max_grad_norm=self.max_grad_norm, adam_b2=self.adam_b2, weight_decay=self.weight_decay,
            lr_schedule=self.lr_schedule, warmup_steps=self.warmup_steps, schedule_steps=self.schedule_steps,
            advantage=self.advantage, loss=self.loss, dynamic_sampling=self.dynamic_sampling, epochs=self.epochs,
            minibatches=self.minibatches, prompt_group=self.prompt_group, temperature=self.temperature,
            logprob_chunk=self.logprob_chunk, remat=self.remat, lora=self.lora, log_kl=self.log_kl,
            ref_reset_every=self.ref_reset_every, mesh=self.mesh)


class GRPOAgent:
    """GRPO's rollout on the learner (module docstring): a host agent (decoding and reward functions run in Python).
    ``graphdef``: the learner's (``learner.graphdef``: LoRA adapters included); ``mesh``: the learner's."""

    host = True

    def __init__(self, config: GRPOConfig, graphdef, tokenizer: Tokenizer, dataset, reward_fns: Sequence,
                 stop_strings: Sequence[str] = ("</answer>",), reward_workers: int = 4, mesh=None):
        self.config, self.graphdef, self.tokenizer, self.dataset, self.mesh = config, graphdef, tokenizer, dataset, mesh
        self.prompt_len = dataset.prompt_len
        fns = list(reward_fns)
        if config.overlong_cache:
            fns.append(make_reward("overlong", max_new_tokens=config.max_new_tokens, cache=config.overlong_cache))
        self.rewards = RewardSuite(fns, max_workers=reward_workers)
        self._format = R1Format()
        self.stop_tokens, self.stop_sequences = tokenizer.stops(stop_strings)
        self.sampler_config = SamplerConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                            top_k=config.top_k, top_p=config.top_p, min_p=config.min_p,
                                            pad_id=tokenizer.pad_id)
        self.num_groups = config.groups_sampled
        self.last_samples: dict[str, list] = {}  # the last step's prompts, completions and rewards (to log)
        self._pending = None
        if mesh is not None:
            from jaxrl_reason.models.lm.sharding import BATCH_AXES

            n_batch = int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.shape]))
            rows = {"sampled rows (groups_sampled*group_size)": config.groups_sampled * config.group_size,
                    "minibatch rows": config.prompts_per_step * config.group_size // config.minibatches}
            for what, n in rows.items():
                if n % n_batch:
                    raise ValueError(f"GRPOConfig: {what} = {n} is not divisible by the {n_batch} devices of the "
                                     f"batch axes of mesh {dict(mesh.shape)} ({jax.process_count()} "
                                     f"process(es)); use a multiple of {n_batch}")

    def keys(self, key, step):
        """GRPO's keys since its first runs: ``split(fold_in(key, step), 3)``, the first and the last."""
        k_sample, _, k_update = jax.random.split(jax.random.fold_in(key, step), 3)
        return k_sample, k_update

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

    def batch(self, step: int):
        """Step ``step``'s prompts, each repeated group_size times: (step, rows, prompt strings, ids [B, P],
        lens [B])."""
        rows, ids, lens = self.dataset.sample(step, self.config.groups_sampled)
        g = self.config.group_size
        rows = [r for r in rows for _ in range(g)]
        return step, rows, self.dataset.prompt_strings(rows), np.repeat(ids, g, axis=0), np.repeat(lens, g, axis=0)

    prompts = batch

    def rollout(self, policy, key, batch):
        """Sample the batch's completions, decode them and start their rewards (``score`` waits for them) ->
        (Rollout without rewards yet, {})."""
        cfg = self.config
        step, rows, prompt_text, ids, lens = batch
        b = len(rows)
        prompts, plens = self._put(ids), self._put(lens)
        seqs = None if self.stop_sequences is None else self._put(jnp.broadcast_to(
            self.stop_sequences, (b,) + self.stop_sequences.shape))
        stops = self._put(jnp.broadcast_to(self.stop_tokens, (b,) + self.stop_tokens.shape))
        out = generate(self.graphdef, policy, prompts, plens, key, stops,
                       self._put(jnp.full((b,), cfg.max_new_tokens, jnp.int32)), seqs, config=self.sampler_config,
                       group=cfg.group_size)  # batch(): each prompt group_size times in a row, prefilled once
        tokens, lengths = host_values([out.tokens, out.lengths])  # all rows, on every process
        completions = self.tokenizer.decode_completions(tokens, lengths)
        fields = {k: [r[k] for r in rows] for k in rows[0] if all(k in r for r in rows)}
        fields["completion_ids"] = [t[:n].tolist() for t, n in zip(tokens, lengths)]
        self._pending = (self.rewards.score(prompt_text, completions, fields, step=step), prompt_text, completions,
                         tokens, lengths)
        rollout = Rollout(_join(prompts, plens, out.tokens, self.tokenizer.pad_id), plens,
                          response_mask(out.lengths, cfg.max_new_tokens), sample_logp=out.logprobs,
                          num_groups=cfg.groups_sampled, keep=cfg.prompts_per_step)
        return rollout, {}

    def score(self, rollout: Rollout) -> tuple[Rollout, dict]:
        """The rollout's rewards (waits for the reward functions) -> (rollout with rewards, valid and, with
        ``mask_truncated``, a loss mask; host metrics)."""
        cfg = self.config
        pending, prompt_text, completions, tokens, lengths = self._pending
        self._pending = None
        scores = pending.result()
        total, per_fn = scores.total, scores.per_fn
        none = lambda v: [None if not np.isfinite(x) else float(x) for x in v]  # excluded samples: None
        self.last_samples = {"prompt": prompt_text, "completion": completions,
                             "reward": none(np.where(scores.valid, total, np.nan)),
                             **{f"reward/{k}": none(v) for k, v in per_fn.items()}}
        metrics = dict(self.rewards.metrics(per_fn))
        if cfg.mask_truncated:  # a cut-off completion adds no loss
            finished = self._finished(tokens, lengths)
            rollout = rollout.replace(loss_mask=self._put(np.repeat(finished[:, None], cfg.max_new_tokens, 1)))
            metrics["truncated_fraction"] = 1.0 - float(finished.mean())
        metrics["excluded"] = float(len(total) - scores.valid.sum())  # samples some reward returned None for
        if "correct" in per_fn:
            metrics["accuracy"] = float(np.mean(per_fn["correct"] == 1.0))
        metrics["format_rate"] = float(np.mean(self._format(prompt_text, completions)))
        return rollout.replace(rewards=jnp.asarray(total, jnp.float32),
                               valid=jnp.asarray(scores.valid, jnp.float32)), metrics

    def plan(self, learner: Learner, **kw):
        """The run's memory and FLOPs per device (``rl.lm.plan.plan_grpo``)."""
        from jaxrl_reason.rl.lm.plan import plan_grpo

        return plan_grpo(learner, self, **kw)

    def close(self):
        self.rewards.close()


_join = jax.jit(join, static_argnums=3)


def _ends_with_stop(row, length: int, stop_tokens, stop_sequences) -> bool:
    """Whether a completion's ``length`` tokens ``row`` end with a stop token or stop sequence."""
    if length and int(row[length - 1]) in stop_tokens:
        return True
    for seq in stop_sequences:
        seq = [int(t) for t in seq if t >= 0]
        if seq and length >= len(seq) and [int(t) for t in row[length - len(seq):length]] == seq:
            return True
    return False


def grpo_learner(config: GRPOConfig, model, tokenizer: Tokenizer, dataset, reward_fns: Sequence,
                 stop_strings: Sequence[str] = ("</answer>",), reward_workers: int = 4) -> tuple[Learner, GRPOAgent]:
    """The learner of ``config.learner_config()`` on ``model`` and GRPO's agent on its graphdef, after the model's
    checks (its tokenizer, its window for the prompts and ``max_new_tokens``)."""
    prompt_len = dataset.prompt_len
    tokenizer.check_model(model.cfg, prompt_len + config.max_new_tokens, "GRPO")
    model.cfg.check_cache(prompt_len, config.max_new_tokens, prompt_len + config.max_new_tokens)
    learner = Learner(config.learner_config(), model)
    return learner, GRPOAgent(config, learner.graphdef, tokenizer, dataset, reward_fns, stop_strings, reward_workers,
                              learner.mesh)


def grpo_for_tasks(config: GRPOConfig, model, tokenizer: Tokenizer, tasks: Sequence, prompt_len: int,
                   task_weights=None, fmt=None, **kw) -> tuple[Learner, GRPOAgent]:
    """The synthetic-task presets: ``tasks.TaskDataset`` prompts (``<bos>`` + problem text, or rendered with
    ``fmt``, e.g. a checkpoint's chat template; the problems drawn from default_rng([config.seed, step])) and the
    rewards of ``config.reward`` (``task_rewards``)."""
    from jaxrl_reason.tasks import TaskDataset

    tasks = list(tasks)
    if not tasks:
        raise ValueError("grpo_for_tasks: need at least one task")
    dataset = TaskDataset(tasks, tokenizer, prompt_len, weights=task_weights, seed=config.seed, fmt=fmt)
    return grpo_learner(config, model, tokenizer, dataset, task_rewards(tasks, config.reward, config.seed), **kw)


__all__ = ["GRPOAgent", "GRPOConfig", "grpo_for_tasks", "grpo_learner"]
