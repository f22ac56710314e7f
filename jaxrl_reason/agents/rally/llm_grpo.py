"""RL fine-tuning of the LLM intent policy with the GRPO loss (``rl.grpo``), reward = episode return.

One iteration: ``num_groups`` start states, each played ``group_size`` times by the sampling
LLM policy (both stages sampled: proposal, then consensus revision); an episode's return
(mean over UAVs) is its reward and ``rl.grpo.grpo_advantages`` turns each group's returns
into advantages. Every decision (episode, step, UAV) is one "sequence" whose two response
tokens are the proposal and the revised answer letters; it carries its episode's advantage.
``updates`` minibatch steps of ``rl.grpo.grpo_loss`` (clipped ratio, k3 KL to the SFT model)
follow, through the learner core (``rl.lm.make_update``: the decisions are one ``Rollout``, each minibatch
drawn with replacement among the valid ones). Log-probabilities are those of the policy as it samples: the softmax over the
action letters only. Prompts are ids of the policy's tokenizer (``LLMIntentPolicy.tokenizer``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.agents.rally import llm
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rl.lm.advantages import grpo_advantages
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_optimizer, make_update
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class IntentGRPOConfig:
    """GRPO of the intent LM on episode return (iterations of group rollouts from shared start states); the LM
    trainer's config is ``rl.grpo.trainer.GRPOConfig``."""

    iterations: int = 10
    num_groups: int = 4  # start states per iteration
    group_size: int = 4  # episodes per start state
    updates: int = 8  # minibatch steps per iteration
    minibatch: int = 256  # decisions per minibatch
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.999  # (rl.lm.optim's default)
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, kl_coef=0.02)

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


def answer_logp(model, env, seqs: jax.Array, prompt_len: int, tokenizer: Tokenizer) -> jax.Array:
    """``seqs [U, L]`` (consensus prompt + final letter, ids of ``tokenizer``) -> ``[U, 2]`` log-probs of the
    proposal and final letters under the letter-restricted softmax."""
    L = seqs.shape[1]
    h, _, _ = model.hidden(seqs)
    pos = jnp.array([prompt_len - 1, L - 2])
    logits = model.logits(h[:, pos])[..., llm._letter(jnp.arange(env.num_actions), tokenizer)]  # [U, 2, n]
    answers = llm.letter_action(seqs[:, pos + 1], tokenizer)
    return jnp.take_along_axis(jax.nn.log_softmax(logits), answers[..., None], -1)[..., 0]


def rollout(env, graphdef, params, rest, key, num_groups: int, group_size: int, tokenizer: Tokenizer):
    """``(seqs [T, B, A, L], valid [T, B] bool, returns [B])`` for ``B = num_groups * group_size``
    sampled episodes (prompts: ids of ``tokenizer``); episodes of a group share their start state."""
    model = nnx.merge(graphdef, params, rest)
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


def grpo_finetune(policy: llm.LLMIntentPolicy, key: jax.Array, config: IntentGRPOConfig = IntentGRPOConfig(),
                  run_dir=None, log_offset: int = 0) -> tuple[llm.LLMIntentPolicy, dict]:
    """GRPO on episode return, starting from (and KL-regularised towards) ``policy``'s LM.
    Returns the greedy fine-tuned policy and ``{"env_steps", "mean_return" [iterations]}``."""
    env, tokenizer = policy.env, policy.tokenizer
    model = nnx.merge(policy.graphdef, policy.params)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    ref_params = params
    p1 = llm.render_prompt(env, jnp.zeros((1, *env.obs_shape)), tokenizer).shape[1]
    tx = lm_optimizer(config.lr, config.max_grad_norm, config.adam_b2)
    opt_state = tx.init(params)

    def logp_fn(params, rows: Rollout):  # the letter-restricted softmax has no entropy term
        return answer_logp(nnx.merge(graphdef, params, rest), env, rows.seqs, p1, tokenizer), None

    def batches(key, rows: Rollout):  # ``updates`` minibatches, drawn with replacement among the valid decisions
        p = rows.extra["valid"] / rows.extra["valid"].sum()
        return jax.vmap(lambda k: jax.random.choice(k, len(rows), (config.minibatch,), p=p))(
            jax.random.split(key, config.updates))

    learn = make_update(logp_fn, make_loss(config.loss), tx, UpdateConfig(old_logp="recompute"), batches=batches)

    @jax.jit
    def iteration(params, opt_state, key):
        k_roll, k_upd = jax.random.split(key)
        seqs, valid, ret = rollout(env, graphdef, params, rest, k_roll, config.num_groups, config.group_size, tokenizer)
        adv = grpo_advantages(ret.reshape(config.num_groups, config.group_size)).reshape(-1)  # [B]
        T, B, A, L = seqs.shape
        seqs = seqs.reshape(-1, L)
        adv_u = jnp.broadcast_to(adv[None, :, None], (T, B, A)).reshape(-1)
        valid_u = jnp.broadcast_to(valid[..., None], (T, B, A)).reshape(-1)
        rows = Rollout(seqs, jnp.full((seqs.shape[0],), p1, jnp.int32), jnp.ones((seqs.shape[0], 2)), adv_u,
                       extra={"valid": valid_u.astype(jnp.float32)})
        if config.loss.kl_coef > 0:  # the reference pass only with a KL term
            rows = rows.replace(ref_logp=jax.lax.stop_gradient(logp_fn(ref_params, rows)[0]))
        (params, opt_state), m = learn(params, opt_state, rows, k_upd)
        metrics = {k: v.mean() for k, v in m.items()}
        metrics["mean_return"] = ret.mean()
        metrics["env_steps"] = valid.sum()
        return params, opt_state, metrics

    returns, steps = [], 0
    for i, k in enumerate(jax.random.split(key, config.iterations)):
        params, opt_state, metrics = iteration(params, opt_state, k)
        returns.append(float(metrics["mean_return"]))
        steps += int(metrics.pop("env_steps"))
        if run_dir is not None:
            run_dir.log(log_offset + i, {f"llm/grpo_{k}": float(v) for k, v in metrics.items()})
    tuned = nnx.merge(graphdef, params, rest)
    out = llm.LLMIntentPolicy(env, nnx.graphdef(tuned), nnx.state(tuned), greedy=True, tokenizer=tokenizer)
    return out, {"env_steps": steps, "mean_return": returns}


__all__ = ["IntentGRPOConfig", "answer_logp", "grpo_finetune", "rollout"]
