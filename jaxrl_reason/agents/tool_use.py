"""Tool use on the one LM learner (``rl.lm.Learner``): GRPO teaches a small model to answer arithmetic with a
calculator that runs on host threads between the device's turns.

    model = tool_use_model(config)                       # the start: a byte tokenizer's Qwen3-architecture LM
    sft_loss = sft_start(model, config)                  # the short SFT on oracle episodes (the model in place)
    learner, agent = tool_use_learner(config, model)
    state = learner.init(jax.random.key(config.seed), agent)
    state, metrics = learner.step(state, agent, agent.batch(step))      # or learner.step_fn(agent)
    agent.evaluate(learner.policy(state), tool=False)    # greedy held-out episodes -> calc_metrics
    agent.close()                                        # the rollouts' thread pools

The start: ``tasks.tool_calc.tool_tokenizer`` and a Qwen3-architecture model (``rl.grpo.start.start_model_config``)
given a deliberately short SFT on oracle episodes (``CalcEnv.oracle``): with the tool (``sft_tool_fraction``; of
those ``sft_call_fraction`` call it) and without it, so the format is known and the copying only partly learnt.
``ToolUseAgent`` is a host rollout (``host = True``): each step's ``prompts_per_step`` problems are played
``group_size`` times (``rl.lm.multiturn.HostRollout`` over ``CalcEnv``), B = prompts_per_step * group_size
episodes, each one row of the ``Rollout`` (``Episodes.to_rollout``: the loss covers only the model's tokens), its
return the reward and its problem the group of the learner's estimator (``advantage``). Evaluation: greedy, on
``eval_problems`` problems held out whole (in neither SFT nor RL data), with the tool or without it (``mind:``
prompts and the calculator off, the same turns and token budget); ``calc_metrics``: accuracy with SE and n, and
the tool's counters.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.models.lm.sft import fit
from jaxrl_reason.models.tokenizer import ByteTokenizer
from jaxrl_reason.rl.grpo.start import StartConfig, start_model_config
from jaxrl_reason.rl.lm import Learner, LearnerConfig, Rollout
from jaxrl_reason.rl.lm.advantages import REGISTERED
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.lm.host_rollout import HostRollout
from jaxrl_reason.rl.lm.multiturn import lm_responder, response_width
from jaxrl_reason.tasks.tool_calc import CalcEnv, CalcProblem, ToolCalcTask, calc_metrics, segment_rows, tool_tokenizer
from jaxrl_reason.utils.validation import check_hyperparameters

HELDOUT_STREAM, SFT_STREAM, RL_STREAM = 1, 2, 3  # default_rng([seed, stream]) per use: disjoint draws
LOGPROB_CHUNK = 32  # positions per log-prob chunk of the update


@dataclasses.dataclass(frozen=True)
class ToolUseConfig:
    """The start, the rollout, the learner and the evaluation of tool use (the experiment adds the run's length)."""

    seed: int = 0
    task: ToolCalcTask = ToolCalcTask()
    # the policy's size: only its model fields are used
    model: StartConfig = StartConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=256,
                                     max_seq_len=128)
    max_turns: int = 3  # the model's turns per episode (a call, an answer, one spare)
    turn_tokens: int = 16  # new tokens per turn
    result_chars: int = 10  # a longer result is "too long" (oversized)
    sft_problems: int = 4096
    sft_steps: int = 800  # the format and (mostly) the copying are learnt; when to call is not (RL's headroom)
    sft_batch: int = 32
    sft_lr: float = 3e-3
    sft_tool_fraction: float = 0.9  # SFT episodes with the tool (the rest answer without it)
    sft_call_fraction: float = 0.3  # of those, the share that calls it (GRPO has to learn that calling pays)
    prompts_per_step: int = 8
    group_size: int = 8
    lr: float = 3e-4  # (1e-3: the calls turn malformed)
    temperature: float = 0.7  # (1.0: a start that copies imperfectly is rarely right)
    advantage: str = "grpo"  # a registered estimator (rl.lm.advantages.ESTIMATORS) over each problem's episodes
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    chunks: int = 2  # HostRollout: chunks of episodes whose tool calls overlap the other chunk's sampling
    eval_problems: int = 512
    eval_batch: int = 256

    CHECKS = (("advantage", REGISTERED),)

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.max_turns, self.turn_tokens, self.sft_problems, self.sft_steps, self.sft_batch,
               self.prompts_per_step, self.eval_problems, self.eval_batch, self.chunks) < 1:
            raise ValueError("tool_use: turns, tokens, problem counts, steps, batches and chunks must be >= 1")
        if self.group_size < 2 or self.temperature <= 0 or self.lr <= 0:
            raise ValueError("tool_use: need group_size >= 2 (group advantages), temperature > 0 and lr > 0")

    def learner_config(self) -> LearnerConfig:
        """One optimiser step per GRPO step on every episode (old log-probs fused into the loss forward)."""
        return LearnerConfig(lr=self.lr, advantage=self.advantage, loss=self.loss, temperature=self.temperature,
                             logprob_chunk=LOGPROB_CHUNK)


def calc_envs(config: ToolUseConfig, tokenizer: ByteTokenizer) -> dict[bool, CalcEnv]:
    """{tool on: CalcEnv, tool off: CalcEnv}."""
    return {tool: CalcEnv(tokenizer, tool=tool, max_turns=config.max_turns, result_chars=config.result_chars)
            for tool in (True, False)}


def context_width(config: ToolUseConfig, env: CalcEnv) -> int:
    """Tokens of a whole episode: the prompt, then T turns and T - 1 observations."""
    return env.prompt_tokens + response_width(config.max_turns, config.turn_tokens, env.obs_tokens)


def heldout_problems(config: ToolUseConfig) -> list[CalcProblem]:
    """The ``eval_problems`` held-out problems (in neither SFT nor RL data)."""
    return config.task.problems(np.random.default_rng([config.seed, HELDOUT_STREAM]), config.eval_problems)


def tool_use_model(config: ToolUseConfig, tokenizer: ByteTokenizer | None = None) -> Transformer:
    """The start's model, randomly initialised (``config.seed``), long enough for a whole episode and a turn."""
    tok = tokenizer or tool_tokenizer()
    width = context_width(config, calc_envs(config, tok)[True])
    cfg = dataclasses.replace(start_model_config(config.model, tok.vocab_size),
                              max_seq_len=max(config.model.max_seq_len, width + config.turn_tokens))
    return Transformer(cfg, rngs=nnx.Rngs(config.seed))


def sft_start(model: Transformer, config: ToolUseConfig, tokenizer: ByteTokenizer | None = None) -> float:
    """The short SFT start on oracle episodes (the model in place; no held-out problem) -> its last loss."""
    c, tok = config, tokenizer or tool_tokenizer()
    envs = calc_envs(c, tok)
    rng = np.random.default_rng([c.seed, SFT_STREAM])
    problems = c.task.problems(rng, c.sft_problems, frozenset(p.expr for p in heldout_problems(c)))
    tools = rng.random(len(problems)) < c.sft_tool_fraction
    calls = tools & (rng.random(len(problems)) < c.sft_call_fraction)
    data = segment_rows([envs[bool(t)].oracle(p, bool(k)) for p, t, k in zip(problems, tools, calls)], 64, tok.pad_id)
    _, losses = fit(model, data, c.sft_steps, c.sft_batch, c.sft_lr, [c.seed, SFT_STREAM], name="tool SFT")
    return float(losses[-1])


class ToolUseAgent:
    """The calculator episodes as a host rollout of the learner (module docstring). ``close()`` (or ``with``)
    shuts the rollouts' thread pools."""

    host = True

    def __init__(self, config: ToolUseConfig, graphdef, tokenizer: ByteTokenizer | None = None):
        self.config = c = config
        self.tokenizer = tok = tokenizer or tool_tokenizer()
        self.envs = calc_envs(c, tok)
        stops = [tok.eos_id, tok.token_to_id("</calc>")]
        sampler = lambda t: SamplerConfig(max_new_tokens=c.turn_tokens, temperature=t, pad_id=tok.pad_id)
        self.rollouts = {(tool, greedy): HostRollout(self.envs[tool], lm_responder(
            graphdef, sampler(0.0 if greedy else c.temperature), stops), c.turn_tokens, tok.pad_id, c.chunks)
            for tool in (True, False) for greedy in (True, False)}
        self.heldout = heldout_problems(c)
        self._exclude = frozenset(p.expr for p in self.heldout)

    @property
    def num_groups(self) -> int:
        """Groups per step (a stateful estimator's carry): one per problem."""
        return self.config.prompts_per_step

    def batch(self, step: int) -> list[CalcProblem]:
        """Step ``step``'s ``prompts_per_step`` fresh problems (none held out)."""
        c = self.config
        return c.task.problems(np.random.default_rng([c.seed, RL_STREAM, step]), c.prompts_per_step, self._exclude)

    def rollout(self, policy, key, problems) -> tuple[Rollout, dict]:
        """Each problem played ``group_size`` times with the tool -> (Rollout [B rows], rewards = returns [B],
        groups = problem index; the tool's counters ``train_*``, turns, model tokens)."""
        g = self.config.group_size
        episodes, states = self.rollouts[(True, False)](policy, key, [p for p in problems for _ in range(g)])
        rollout = episodes.to_rollout(None, rewards=episodes.reward, groups=jnp.repeat(jnp.arange(len(problems)), g),
                                      num_groups=len(problems))
        tool = calc_metrics(states)
        metrics = {f"train_{k}": v for k, v in tool.items() if not k.endswith("_se") and k != "n"}
        metrics.update(turns=float(episodes.turns.mean()), model_tokens=float(episodes.loss_mask.sum(1).mean()))
        return rollout, metrics

    def evaluate(self, policy, key=None, batch=None, tool: bool = True) -> dict:
        """Greedy episodes on ``batch`` (default the held-out problems), with the tool or without it ->
        ``calc_metrics`` (accuracy, its SE and n, the tool's counters)."""
        c, roll, states = self.config, self.rollouts[(tool, True)], []
        problems = self.heldout if batch is None else batch
        key = jax.random.key(0) if key is None else key
        for i in range(0, len(problems), c.eval_batch):
            states += roll(policy, key, problems[i: i + c.eval_batch])[1]
        return calc_metrics(states)

    def plan(self, learner: Learner, **kw):
        """A step's memory and cost per device for its T turns (``rl.lm.plan.plan_episodes``: the episodes' carried
        KV cache, the update, FLOPs and bytes); an episode past the model's window refused."""
        from jaxrl_reason.rl.lm.plan import plan_episodes

        c, env = self.config, self.envs[True]
        return plan_episodes(learner, self, env.prompt_tokens, c.max_turns, c.turn_tokens, env.obs_tokens,
                             c.prompts_per_step * c.group_size, **kw)

    def close(self):
        for r in self.rollouts.values():
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tool_use_learner(config: ToolUseConfig, model: Transformer, tokenizer: ByteTokenizer | None = None
                     ) -> tuple[Learner, ToolUseAgent]:
    """The learner of ``model`` (e.g. after ``sft_start``) and the agent that plays the calculator episodes."""
    tok = tokenizer or tool_tokenizer()
    need = context_width(config, calc_envs(config, tok)[True]) + config.turn_tokens
    if model.cfg.vocab_size < tok.vocab_size or model.cfg.max_seq_len < need:
        raise ValueError(f"tool_use: the model needs vocab_size >= {tok.vocab_size} and max_seq_len >= {need} (an "
                         f"episode and a turn), got {model.cfg.vocab_size} and {model.cfg.max_seq_len}")
    learner = Learner(config.learner_config(), model)
    return learner, ToolUseAgent(config, learner.graphdef, tok)


__all__ = ["HELDOUT_STREAM", "RL_STREAM", "SFT_STREAM", "ToolUseAgent", "ToolUseConfig", "calc_envs",
           "context_width", "heldout_problems", "sft_start", "tool_use_learner", "tool_use_model"]
