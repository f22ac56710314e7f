"""MemAgent training: SFT warm start on oracle memory updates, then Multi-Conv RL on the LM learner; evaluation
and cost.

    agent = MemAgent(agent_cfg, tokenizer)                                  # config bound to a tokenizer
    sft_warm_start(model, task, agent, SFTConfig())                         # tiny LM from scratch
    learner, rl = multiconv_learner(MultiConvConfig(), agent, model, questions)   # questions(s): step s's DocBatch
    state = learner.init(key)
    state, metrics = learner.step(state, rl, questions(0))  # Q questions, each rolled out G times
    run_steps(run_dir, learner.step_fn(rl), state, ...)     # (step s trains on questions(s))
    evaluate_agent(graphdef, model_state, batch, agent) -> {"accuracy", "overflow_rate", ...}   (= learner.evaluate)
    agent_memory(graphdef, model_state, batch, agent)   -> compiled memory analysis (bytes)

Multi-Conv RL (MemAgent, arXiv 2507.02259): each of the Q questions is rolled out G times with
sampling; a rollout is n memory-update conversations plus one final-answer conversation. The
final answer's exact-match reward is handed to the learner (``rl.lm.Learner``) with the question as its
group, and its registered estimator (``MultiConvConfig.advantage``: "grpo" mean-centred and std-normalised,
"dr_grpo" mean-centred, any other in ``rl.lm.advantages.ESTIMATORS``) gives one advantage per rollout,
broadcast to *every* conversation of that rollout (``Rollout.sample``); all conversations then enter one
clipped policy loss (``LossConfig``: DAPO clip-higher ``eps_high`` and token-mean aggregation). The rollout
(``MultiConvAgent``) is the multi-turn protocol's (``rl.lm.multiturn.make_turn_rollout`` over
``agent.MemoryEnv``), its ``Turns`` one ``Rollout`` row per conversation with the loss on the memory / answer
tokens the model wrote (``conversations``); the learner jits it with the advantages and ``epochs`` x
``minibatches`` optimiser steps as one program. Old log-probs are those of the sampling temperature: with one
epoch of one minibatch the loss forward's own (under ``stop_gradient``), otherwise a forward pass ahead of the
steps.

The RL reward is exact match on token ids inside the jitted step: the answer must be spelled as the
targets are, one token per character (what the oracle SFT teaches), so with a checkpoint tokenizer a
multi-character token in the answer scores 0 there. ``evaluate_agent`` scores the decoded text
(``tasks.longcontext.exact_match_text``), where such an answer counts when its text is right; with
the character tokenizers of the presets the two agree.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.agents.memagent.agent import AgentOutput, DocBatch, MemAgent, num_chunks, run_agent
from jaxrl_reason.agents.memagent.data import conversation_arrays, oracle_conversations
from jaxrl_reason.models.lm.sft import SFTConfig, fit
from jaxrl_reason.parallel.mesh import check_data_split
from jaxrl_reason.rl.lm import Learner, LearnerConfig, Rollout
from jaxrl_reason.rl.lm.advantages import REGISTERED
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.tasks.longcontext import LongContextTask, exact_match_text
from jaxrl_reason.utils.validation import POSITIVE, at_least, check_hyperparameters


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
    advantage: str = "grpo"  # a registered estimator: "grpo": (r - mean) / std;  "dr_grpo": r - mean; ...
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    logprob_chunk: int = 16
    mesh: str | None = None  # e.g. "data=8": the rollouts split over the data axis (multi-process: data over all)

    CHECKS = (("group_size", at_least(2), "group advantages need a group"),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              (("epochs", "minibatches", "logprob_chunk"), at_least(1)),
              ("advantage", REGISTERED))  # (utils.validation; lr and max_grad_norm: their names' ranges)

    def __post_init__(self):
        check_hyperparameters(self)

    def learner_config(self) -> LearnerConfig:
        """The learner's configuration: optimiser, estimator, objective, epochs x minibatches, the sampling
        temperature the log-probs are taken at, the mesh."""
        return LearnerConfig(lr=self.lr, max_grad_norm=self.max_grad_norm, adam_b2=self.adam_b2,
                             advantage=self.advantage, loss=self.loss, epochs=self.epochs,
                             minibatches=self.minibatches, temperature=self.temperature,
                             logprob_chunk=self.logprob_chunk, mesh=self.mesh)


def conversations(out: AgentOutput, group_size: int, *, pad_id: int) -> Rollout:
    """A recorded rollout -> the learner's ``Rollout``, one row per conversation, with the rewards for its
    estimator.

    out: AgentOutput(record=True) of R = Q x G rollouts (Q questions each G times in a row: ``DocBatch.repeat``)
    with n chunks (``out.turns`` [n + 1, R, ...]). Rows turn-major (``Turns.to_rollout``): C = n*R + R (the memory
    updates, then the final answers), row t*R + r is turn t of rollout r, [C, P + N] with P / N the wider prompt /
    response; ``mask`` on the tokens the model wrote (its memory or answer, <eos> included), 0 on updates past a
    document's end (``info["active"]``); ``sample_logp`` the sampler's log-probs. ``rewards`` [R]: the final
    answer's exact match; ``groups`` [R]: the question (``num_groups`` Q); ``sample`` [C]: the rollout of each row,
    so the rollout's advantage reaches every one of its conversations."""
    turns = out.turns
    t, r = turns.live.shape
    return turns.to_rollout(None, active=turns.info["active"], pad_id=pad_id, rewards=turns.reward.sum(0),
                            groups=jnp.arange(r) // group_size, sample=jnp.tile(jnp.arange(r), t),
                            num_groups=r // group_size)


@dataclasses.dataclass(frozen=True)
class MultiConvAgent:
    """Multi-Conv RL on a ``MemAgent``, as a rollout of the learner (``rl.lm.Learner``; module docstring).

    ``rollout(policy, key, batch)``: the Q questions of ``batch`` (a ``DocBatch``) each read ``group_size``
    times with sampling (``run_agent(record=True)``), every conversation one row (``conversations``). Hashable
    (equal agents share the learner's compiled programs); ``questions(s)``, RL step s's ``DocBatch`` (the
    learner's ``step_fn`` draws it), is not part of that comparison."""

    graphdef: Any
    config: MultiConvConfig
    agent: MemAgent
    mesh: Any = None  # the learner's: the rollouts split over its data axis
    questions: Callable[[int], DocBatch] | None = dataclasses.field(default=None, compare=False, repr=False)

    def batch(self, step: int) -> DocBatch:
        """RL step ``step``'s questions: ``questions(step)`` (drawn from a stream seeded by the step, so a resumed
        run draws the same)."""
        if self.questions is None:
            raise ValueError("MultiConvAgent: no questions(step) given; pass the step's DocBatch to learner.step")
        return self.questions(step)

    def check(self, batch: DocBatch) -> None:
        """A clear ``ValueError`` before compiling: the conversations must split into ``minibatches`` and the
        rollouts over the mesh's data axis."""
        rows = len(batch) * self.config.group_size
        n_conv = rows * (1 + num_chunks(batch.doc.shape[1], self.agent))
        if n_conv % self.config.minibatches:
            raise ValueError(f"{n_conv} conversations per step are not divisible by minibatches "
                             f"{self.config.minibatches}")
        check_data_split(self.mesh, {"rollouts per step (questions x group_size)": rows}, "MultiConvAgent")

    def rollout(self, policy, key, batch: DocBatch) -> tuple[Rollout, dict]:
        """-> (Rollout of C = (n + 1) Q G conversations with rewards [Q G], metrics)."""
        self.check(batch)
        g = self.config.group_size
        out = run_agent(self.graphdef, policy, batch.repeat(g), key, agent=self.agent,
                        temperature=self.config.temperature, record=True, mesh=self.mesh)
        rollout = conversations(out, g, pad_id=self.agent.pad_id)
        grouped = rollout.rewards.reshape(-1, g)
        return rollout, {"overflow_rate": (out.overflow > 0).mean(),
                         "zero_variance_groups": (grouped.std(axis=1) == 0).mean(),
                         "memory_len": out.memory_lens.mean(), "conversations": jnp.float32(len(rollout))}

    def evaluate(self, policy, key, batch: DocBatch) -> dict:
        """``evaluate_agent``: greedy accuracy and overflow rates on ``batch`` (``learner.evaluate``)."""
        return evaluate_agent(self.graphdef, policy, batch, self.agent, key)


def multiconv_learner(config: MultiConvConfig, agent: MemAgent, model,
                      questions: Callable[[int], DocBatch] | None = None) -> tuple[Learner, MultiConvAgent]:
    """-> (the learner of ``model``, its Multi-Conv rollout). ``questions(s)``: RL step s's ``DocBatch`` of Q
    questions (what ``learner.step_fn(rl)`` trains on at step s)."""
    agent.check_model(model.cfg)
    learner = Learner(config.learner_config(), model)
    if learner.mesh is not None and "data" not in learner.mesh.shape:
        raise ValueError(f"MultiConvConfig.mesh {config.mesh!r} has no 'data' axis to split the rollouts over")
    return learner, MultiConvAgent(learner.graphdef, config, agent, learner.mesh, questions)


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


__all__ = ["MultiConvAgent", "MultiConvConfig", "SFTConfig", "agent_memory", "conversations", "evaluate_agent",
           "multiconv_learner", "sft_warm_start", "train_conversations"]
