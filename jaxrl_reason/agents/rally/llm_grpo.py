"""RL fine-tuning of the LLM intent policy on the one LM learner (``rl.lm.Learner``), reward = episode return.

    learner, agent = intent_learner(policy, IntentGRPOConfig())
    state = learner.init(key, agent)                        # the reference = the starting (SFT) params
    state, metrics = learner.step(state, agent)             # one iteration
    tuned = learner.model(state)

One iteration (``IntentAgent.rollout``, pure): ``num_groups`` start states, each played ``group_size`` times by
the sampling LLM policy (both stages sampled: proposal, then consensus revision); an episode's return (mean over
UAVs) is its reward, its start state its group, and the learner's estimator (``advantage``, default ``"grpo"``)
turns each group's returns into advantages. Every decision (episode, step, UAV) is one row whose two response
tokens are the proposal and the revised answer letters; it carries its episode's advantage (``Rollout.sample``).
``updates`` minibatch steps of the objective (``loss``: clipped ratio, k3 KL to the starting model) follow, each
minibatch drawn with replacement among the valid decisions (``IntentAgent.batches``); the old log-probs are
recomputed once before them. Log-probabilities are those of the policy as it samples: the softmax over the action
letters only (``IntentAgent.logp``). Prompts are ids of the policy's tokenizer (``LLMIntentPolicy.tokenizer``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.agents.rally import llm
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rl.lm import Learner, LearnerConfig, Rollout
from jaxrl_reason.rl.lm.advantages import REGISTERED
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class IntentGRPOConfig:
    """GRPO of the intent LM on episode return (iterations of group rollouts from shared start states)."""

    iterations: int = 10
    num_groups: int = 4  # start states per iteration
    group_size: int = 4  # episodes per start state
    updates: int = 8  # minibatch steps per iteration
    minibatch: int = 256  # decisions per minibatch
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.999  # (rl.lm.optim's default)
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, kl_coef=0.02)
    advantage: str = "grpo"  # a registered estimator (rl.lm.advantages.ESTIMATORS) over each start state's episodes

    CHECKS = (("advantage", REGISTERED),)

    def __post_init__(self):
        check_hyperparameters(self)
        for name in ("iterations", "num_groups", "updates", "minibatch"):
            if getattr(self, name) < 1:
                raise ValueError(f"IntentGRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"IntentGRPOConfig.group_size must be >= 2 (a group baseline), got {self.group_size}")

    @property
    def episodes(self) -> int:
        return self.num_groups * self.group_size

    def learner_config(self) -> LearnerConfig:
        """The learner's config: the old log-probs recomputed once before the ``updates`` minibatch steps."""
        return LearnerConfig(lr=self.lr, max_grad_norm=self.max_grad_norm, adam_b2=self.adam_b2,
                             advantage=self.advantage, loss=self.loss, old_logp="recompute")


def answer_logp(model, env, seqs: jax.Array, prompt_len: int, tokenizer: Tokenizer) -> jax.Array:
    """``seqs [U, L]`` (consensus prompt + final letter, ids of ``tokenizer``) -> ``[U, 2]`` log-probs of the
    proposal and final letters under the letter-restricted softmax."""
    L = seqs.shape[1]
    h, _, _ = model.hidden(seqs)
    pos = jnp.array([prompt_len - 1, L - 2])
    logits = model.logits(h[:, pos])[..., llm._letter(jnp.arange(env.num_actions), tokenizer)]  # [U, 2, n]
    answers = llm.letter_action(seqs[:, pos + 1], tokenizer)
    return jnp.take_along_axis(jax.nn.log_softmax(logits), answers[..., None], -1)[..., 0]


def rollout(env, graphdef, policy, key, num_groups: int, group_size: int, tokenizer: Tokenizer):
    """``policy`` (the LM's ``nnx.State``) -> ``(seqs [T, B, A, L], valid [T, B] bool, returns [B])`` for
    ``B = num_groups * group_size`` sampled episodes (prompts: ids of ``tokenizer``); episodes of a group share
    their start state."""
    model = nnx.merge(graphdef, policy)
    B, A = num_groups * group_size, env.num_agents
    letters = llm._letter(jnp.arange(env.num_actions), tokenizer)
    k_reset, k_play = jax.random.split(key)
    starts = jnp.repeat(jax.random.split(k_reset, num_groups), group_size, axis=0)
    state, ts = jax.vmap(env.reset)(starts)

    def choose(key, ids):  # ids [B, A, P] -> sampled actions [B, A]
        logits = model(ids.reshape(B * A, -1))[0][:, -1, letters]
        return jax.random.categorical(key, logits).reshape(B, A).astype(jnp.int32)

    def body(carry, key):
        state, ts, alive, ret = carry
        k1, k2, k3 = jax.random.split(key, 3)
        prompt = jax.vmap(functools.partial(llm.render_prompt, env, tokenizer=tokenizer))(ts.obs)
        prop = choose(k1, prompt)
        seq = jax.vmap(functools.partial(llm.render_consensus, tokenizer=tokenizer))(prompt, prop, ts.info["neighbors"])
        final = choose(k2, seq)
        state, nts = jax.vmap(env.step)(jax.random.split(k3, B), state, final)
        ret = ret + alive * nts.reward.mean(-1)
        full = jnp.concatenate([seq, llm._letter(final, tokenizer)[..., None]], -1)
        return (state, nts, alive & ~nts.done, ret), (full, alive)

    init = (state, ts, jnp.ones((B,), bool), jnp.zeros((B,)))
    (_, _, _, ret), (seqs, valid) = jax.lax.scan(body, init, jax.random.split(k_play, env.max_episode_steps))
    return seqs, valid, ret


@dataclasses.dataclass(frozen=True)
class IntentAgent:
    """RALLY's intent LM as a rollout of the learner (module docstring); the learner's state key is the run's key."""

    env: Any  # the swarm env (envs.swarm.Swarm)
    graphdef: Any  # the learner's graphdef
    tokenizer: Tokenizer
    config: IntentGRPOConfig
    prompt_len: int  # P: tokens of a stage-1 prompt (the proposal letter follows it)

    @property
    def num_groups(self) -> int:
        return self.config.num_groups

    def keys(self, key, step):
        """Iteration ``step``'s (rollout key, update key): ``split(split(key, iterations)[step])``."""
        return tuple(jax.random.split(jax.random.split(key, self.config.iterations)[step]))

    def rollout(self, policy, key, batch=None):
        """-> (Rollout: the decisions [T*B*A rows, 2 tokens], rewards = returns [B], groups = start states;
        {"mean_return", "env_steps"})."""
        c = self.config
        seqs, valid, ret = rollout(self.env, self.graphdef, policy, key, c.num_groups, c.group_size, self.tokenizer)
        T, B, A, L = seqs.shape
        valid_u = jnp.broadcast_to(valid[..., None], (T, B, A)).reshape(-1).astype(jnp.float32)
        sample = jnp.broadcast_to(jnp.arange(B)[None, :, None], (T, B, A)).reshape(-1)
        n = T * B * A
        rows = Rollout(seqs.reshape(n, L), jnp.full((n,), self.prompt_len, jnp.int32),
                       jnp.broadcast_to(valid_u[:, None], (n, 2)), rewards=ret.astype(jnp.float32),
                       groups=jnp.arange(B) // c.group_size, sample=sample, num_groups=c.num_groups)
        return rows, {"mean_return": ret.mean(), "env_steps": valid.sum()}

    def logp(self, model, rows: Rollout):
        """The letter-restricted log-probs [n, 2] (no entropy term)."""
        return answer_logp(model, self.env, rows.seqs, self.prompt_len, self.tokenizer), None

    def batches(self, key, rows: Rollout):
        """``updates`` minibatches [updates, minibatch], drawn with replacement among the valid decisions."""
        valid = rows.mask[:, 0]
        p = valid / valid.sum()
        return jax.vmap(lambda k: jax.random.choice(k, len(rows), (self.config.minibatch,), p=p))(
            jax.random.split(key, self.config.updates))


def intent_learner(policy: llm.LLMIntentPolicy, config: IntentGRPOConfig = IntentGRPOConfig()
                   ) -> tuple[Learner, IntentAgent]:
    """The learner of ``policy``'s LM (its reference = that LM) and the agent that plays it."""
    env, tokenizer = policy.env, policy.tokenizer
    learner = Learner(config.learner_config(), nnx.merge(policy.graphdef, policy.params))
    prompt_len = llm.render_prompt(env, jnp.zeros((1, *env.obs_shape)), tokenizer).shape[1]
    return learner, IntentAgent(env, learner.graphdef, tokenizer, config, prompt_len)


def grpo_finetune(policy: llm.LLMIntentPolicy, key: jax.Array, config: IntentGRPOConfig = IntentGRPOConfig(),
                  run_dir=None, log_offset: int = 0) -> tuple[llm.LLMIntentPolicy, dict]:
    """GRPO on episode return, starting from (and KL-regularised towards) ``policy``'s LM; ``config.iterations``
    learner steps. Returns the greedy fine-tuned policy and ``{"env_steps", "mean_return" [iterations]}``."""
    learner, agent = intent_learner(policy, config)
    state = learner.init(key, agent)
    returns, steps = [], 0
    for i in range(config.iterations):
        state, metrics = learner.step(state, agent)
        returns.append(float(metrics["mean_return"]))
        steps += int(metrics.pop("env_steps"))
        if run_dir is not None:
            run_dir.log(log_offset + i, {f"llm/grpo_{k}": float(v) for k, v in metrics.items()})
    tuned = learner.model(state)
    out = llm.LLMIntentPolicy(policy.env, nnx.graphdef(tuned), nnx.state(tuned), greedy=True,
                              tokenizer=policy.tokenizer)
    return out, {"env_steps": steps, "mean_return": returns}


__all__ = ["IntentAgent", "IntentGRPOConfig", "answer_logp", "grpo_finetune", "intent_learner", "rollout"]
