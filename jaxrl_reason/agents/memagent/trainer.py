"""MemAgent training: SFT warm start on oracle memory updates, then Multi-Conv RL; evaluation and cost.

    agent = MemAgent(agent_cfg, tokenizer)                                  # config bound to a tokenizer
    sft_warm_start(model, task, agent, SFTConfig())                         # tiny LM from scratch
    trainer = MultiConvTrainer(MultiConvConfig(), agent, model, batches)   # batches(s): RL step s's DocBatch
    state = trainer.init(key)
    state, metrics = trainer.step(state)                  # Q questions, each rolled out G times
    evaluate_agent(graphdef, model_state, batch, agent) -> {"accuracy", "overflow_rate", ...}
    agent_memory(graphdef, model_state, batch, agent)   -> compiled memory analysis (bytes)

Multi-Conv RL (MemAgent, arXiv 2507.02259): each of the Q questions is rolled out G times with
sampling; a rollout is n memory-update conversations plus one final-answer conversation. The
final answer's exact-match reward gives one group advantage per rollout (``group_advantages``:
mean-centred, std-normalised for "grpo", not for "dr_grpo"), broadcast to *every* conversation of
that rollout; all conversations then enter one clipped policy loss
(``grpo_loss`` with ``LossConfig``: DAPO clip-higher ``eps_high`` and token-mean aggregation).
Rollout, reward, advantages and ``epochs`` x ``minibatches`` optimiser steps are one jitted program; the
update is the learner core's (``rl.lm.make_update``): the rollout is the multi-turn protocol's
(``rl.lm.multiturn.make_turn_rollout`` over ``agent.MemoryEnv``), its ``Turns`` one ``Rollout`` row per
conversation with the loss on the memory / answer tokens the model wrote (``conversations``). Old log-probs
are those of the sampling temperature: with one epoch of one minibatch the loss forward's own (under
``stop_gradient``), otherwise a forward pass ahead of the steps.

The RL reward is exact match on token ids inside the jitted step: the answer must be spelled as the
targets are, one token per character (what the oracle SFT teaches), so with a checkpoint tokenizer a
multi-character token in the answer scores 0 there. ``evaluate_agent`` scores the decoded text
(``tasks.longcontext.exact_match_text``), where such an answer counts when its text is right; with
the character tokenizers of the presets the two agree.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_reason.agents.memagent.agent import DocBatch, MemAgent, num_chunks, run_agent
from jaxrl_reason.agents.memagent.data import conversation_arrays, oracle_conversations
from jaxrl_reason.models.lm.sft import SFTConfig, fit
from jaxrl_reason.parallel.mesh import check_data_split, data_mesh, replicate
from jaxrl_reason.rl.lm.advantages import REGISTERED, group_advantages
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_logp_fn, lm_optimizer, make_update
from jaxrl_reason.tasks.longcontext import LongContextTask, exact_match_text
from jaxrl_reason.utils.validation import POSITIVE, at_least, check_hyperparameters, one_of


# ---------------------------------------------------------------------------------------- SFT
def sft_warm_start(model, task: LongContextTask, agent: MemAgent, config: SFTConfig, seed: int = 0,
                   seq_len: int | None = None) -> np.ndarray:
    """Train ``model`` in place on oracle conversations of ``config.problems`` fresh problems.

    Returns the per-step training loss [steps]."""
    agent.check_model(model.cfg)
    problems = task.generate_batch(np.random.default_rng([seed, 1001]), config.problems)
    data = conversation_arrays(oracle_conversations(task, problems, agent), seq_len or agent.seq_len,
                               tokenizer=agent.tokenizer)
    return train_conversations(model, data, config, seed)


def train_conversations(model, data: dict, config: SFTConfig, seed: int = 0) -> np.ndarray:
    """Masked next-token SFT (``models.lm.sft.fit``) on {"tokens", "loss_mask"} rows; model updated in place.
    Returns the per-step training loss [steps]."""
    return fit(model, data, config.steps, config.batch_size, config.lr, [seed, 1002], name="memagent SFT")[1]


# ---------------------------------------------------------------------------------------- RL
@dataclasses.dataclass(frozen=True)
class MultiConvConfig:
    group_size: int = 8  # G rollouts per question
    temperature: float = 1.0
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.99  # (rl.lm.optim's default is 0.999; MemAgent has always used 0.99)
    epochs: int = 1
    minibatches: int = 1
    advantage: str = "grpo"  # "grpo": (r - mean) / std;  "dr_grpo": r - mean
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    logprob_chunk: int = 16
    mesh: str | None = None  # e.g. "data=8": the rollouts split over the data axis (multi-process: data over all)

    CHECKS = (("group_size", at_least(2), "group advantages need a group"),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              (("epochs", "minibatches", "logprob_chunk"), at_least(1)),
              ("advantage", REGISTERED))  # (utils.validation; lr and max_grad_norm: their names' ranges)

    def __post_init__(self):
        check_hyperparameters(self)


@flax.struct.dataclass
class RLState:
    params: nnx.State
    rest: nnx.State
    opt_state: optax.OptState
    step: jax.Array
    key: jax.Array  # step s samples with fold_in(key, s)


def _optimizer(cfg: MultiConvConfig):
    return lm_optimizer(cfg.lr, cfg.max_grad_norm, cfg.adam_b2)


def conversations(out, advantages: jax.Array, *, pad_id: int) -> Rollout:
    """A recorded rollout -> the learner's ``Rollout``, one row per conversation.

    out: AgentOutput(record=True) of R rollouts with n chunks (``out.turns`` [n + 1, R, ...]); advantages [R], one
    per rollout, broadcast to each of its conversations. Rows turn-major (``Turns.to_rollout``): C = n*R + R (the
    memory updates, then the final answers), [C, P + N] with P / N the wider prompt / response; ``mask`` on the
    tokens the model wrote (its memory or answer, <eos> included), 0 on updates past a document's end
    (``info["active"]``); ``sample_logp`` the sampler's log-probs."""
    turns = out.turns
    return turns.to_rollout(jnp.broadcast_to(advantages, turns.live.shape), active=turns.info["active"], pad_id=pad_id)


class MultiConvTrainer:
    """Multi-Conv RL on a MemAgent (see the module docstring)."""

    def __init__(self, config: MultiConvConfig, agent: MemAgent, model, batches: Callable[[int], DocBatch]):
        """``batches(s)``: RL step s's Q questions (drawn from a stream seeded by s, so a resume draws the same)."""
        agent.check_model(model.cfg)
        self.config, self.agent, self.batches = config, agent, batches
        self.graphdef, self._params, self._rest = nnx.split(model, nnx.Param, ...)
        self.optimizer = _optimizer(config)
        self.mesh = data_mesh(config.mesh, {}, "MultiConvConfig")
        self._step = _rl_step_fn(self.graphdef, config, agent, self.mesh)

    def init(self, key: jax.Array, params: nnx.State | None = None) -> RLState:
        params = jax.tree.map(jnp.array, self._params if params is None else params)
        return replicate(RLState(params=params, rest=self._rest, opt_state=self.optimizer.init(params),
                                 step=jnp.int32(0), key=key), self.mesh)

    def step(self, state: RLState) -> tuple[RLState, dict]:
        """One RL step on the Q questions of ``batches(step)``, each rolled out ``group_size`` times."""
        s = int(state.step)
        batch, key = self.batches(s), jax.random.fold_in(state.key, s)
        rows = len(batch) * self.config.group_size
        n_conv = rows * (1 + num_chunks(batch.doc.shape[1], self.agent))
        if n_conv % self.config.minibatches:
            raise ValueError(f"{n_conv} conversations per step are not divisible by minibatches "
                             f"{self.config.minibatches}")
        check_data_split(self.mesh, {"rollouts per step (questions x group_size)": rows}, "MultiConvTrainer")
        return self._step(state, replicate(batch, self.mesh), replicate(key, self.mesh))

    def model(self, state: RLState):
        return nnx.merge(self.graphdef, state.params, state.rest)


@functools.lru_cache(maxsize=None)
def _rl_step_fn(graphdef, cfg: MultiConvConfig, agent: MemAgent, mesh):
    optimizer = _optimizer(cfg)

    def step(state: RLState, batch: DocBatch, key):
        k_roll, k_perm = jax.random.split(key)
        g = cfg.group_size
        rb = batch.repeat(g)
        out = run_agent(graphdef, nnx.merge_state(state.params, state.rest), rb, k_roll, agent=agent,
                        temperature=cfg.temperature, record=True, mesh=mesh)
        reward = out.turns.reward.sum(0)  # [Q*G]: the final answer's exact match (MemoryEnv)
        adv = group_advantages(reward.reshape(-1, g), cfg.advantage).reshape(-1)
        rollout = conversations(out, adv, pad_id=agent.pad_id)
        logp_fn = lm_logp_fn(graphdef, rollout.mask.shape[1], cfg.temperature, cfg.logprob_chunk)
        learn = make_update(lambda p, rows: logp_fn(p, state.rest, rows), make_loss(cfg.loss), optimizer,
                            UpdateConfig(epochs=cfg.epochs, minibatches=cfg.minibatches))
        (params, opt_state), m = learn(state.params, state.opt_state, rollout, k_perm)
        grouped = reward.reshape(-1, g)
        metrics = {k: v.mean() for k, v in m.items()}  # with sample_entropy (the old policy's, token mean)
        metrics.update(
            reward=reward.mean(), overflow_rate=(out.overflow > 0).mean(),
            zero_variance_groups=(grouped.std(axis=1) == 0).mean(),
            memory_len=out.memory_lens.mean(), conversations=jnp.float32(rollout.seqs.shape[0]),
        )
        return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

    return jax.jit(step, donate_argnums=0)


# ---------------------------------------------------------------------------------------- evaluation
def evaluate_agent(graphdef, state, batch: DocBatch, agent: MemAgent, key=None, timed: bool = False) -> dict:
    """Greedy accuracy (exact match of the decoded answer text, ``exact_match_text`` with the agent's
    tokenizer), memory-overflow rate; ``timed``: seconds per document of the fastest of three compiled calls."""
    key = jax.random.key(0) if key is None else key
    call = lambda: run_agent(graphdef, state, batch, key, agent=agent)
    out = jax.block_until_ready(call())
    res = {}
    if timed:  # best of 3 compiled calls: the least disturbed by other load on the machine
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = jax.block_until_ready(call())
            times.append(time.perf_counter() - t0)
        res["seconds_per_doc"] = min(times) / len(batch)
    acc = exact_match_text(out.answer, out.answer_lens, batch.answer, batch.answer_lens, agent.tokenizer)
    res.update(accuracy=float(acc.mean()), overflow_rate=float((out.overflow > 0).mean()),
               answer_overflow_rate=float(out.answer_overflow.mean()))
    return res


def agent_memory(graphdef, state, batch: DocBatch, agent: MemAgent) -> dict:
    """XLA's compiled memory analysis of the greedy agent on this batch shape (bytes).

    ``temp``: working buffers (activations, KV caches, scan carry) -- the part that must not grow
    with the document; ``argument``: parameters + the document itself; ``peak`` = temp + argument + output.
    """
    compiled = run_agent.lower(graphdef, state, batch, jax.random.key(0), agent=agent).compile()
    ma = compiled.memory_analysis()
    temp, arg, out = int(ma.temp_size_in_bytes), int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes)
    return {"temp": temp, "argument": arg, "output": out, "peak": temp + arg + out,
            "document": int(batch.doc.size * batch.doc.dtype.itemsize)}


__all__ = ["MultiConvConfig", "MultiConvTrainer", "RLState", "SFTConfig", "agent_memory", "conversations",
           "evaluate_agent", "sft_warm_start", "train_conversations"]
