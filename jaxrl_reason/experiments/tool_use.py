"""Tool use on the multi-turn protocol: GRPO teaches a small model to answer arithmetic with a calculator.

    jaxrl-reason run tool_use                  # --preset cpu: the whole run on CPU, nothing downloaded (~minutes)
    jaxrl-reason run tool_use --preset gpu     # longer, larger batches

The start: a byte tokenizer with the tool's tags (``tasks.tool_calc.tool_tokenizer``) and a Qwen3-architecture model
(``rl.grpo.start.start_model_config``) given a deliberately short SFT on oracle episodes (``CalcEnv.oracle``): half
with the tool (call, result, answer), half without (the answer alone), so the format is known and the copying only
partly learnt. GRPO then trains on tool episodes (``tasks.tool_calc.CalcEnv``, a ``HostTextEnv``: the calculator
runs on host threads between the device's turns, ``rl.lm.multiturn.HostRollout``); the loss covers only the
model's tokens (``Episodes.to_rollout``: the results are context). Evaluation: greedy, on ``eval_problems``
problems held out whole (in neither SFT nor RL data), with the tool and without it (the same model, turns and
token budget; ``mind:`` prompts and the calculator off), before and after GRPO: accuracy with SE and n, and the
tool's counters (calls, malformed, oversized, endless calls, no answer; ``calc_metrics``).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.models.lm.sft import fit
from jaxrl_reason.rl.lm.advantages import ESTIMATORS, group_advantages
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.grpo.start import StartConfig, start_model_config
from jaxrl_reason.rl.lm import UpdateConfig, lm_logp_fn, lm_optimizer, make_update
from jaxrl_reason.rl.lm.multiturn import HostRollout, lm_responder, response_width
from jaxrl_reason.tasks.tool_calc import CalcEnv, ToolCalcTask, calc_metrics, segment_rows, tool_tokenizer
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

HELDOUT_STREAM, SFT_STREAM, RL_STREAM = 1, 2, 3  # default_rng([seed, stream]) per use: disjoint draws


@dataclasses.dataclass(frozen=True)
class Config:
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
    steps: int = 150  # GRPO steps
    prompts_per_step: int = 8
    group_size: int = 8
    lr: float = 3e-4  # (1e-3: the calls turn malformed)
    temperature: float = 0.7  # (1.0: a start that copies imperfectly is rarely right)
    advantage: str = "grpo"
    loss: LossConfig = LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")
    chunks: int = 2  # HostRollout: chunks of episodes whose tool calls overlap the other chunk's sampling
    eval_problems: int = 512
    eval_batch: int = 256
    eval_every: int = 0  # held-out evaluation interval in GRPO steps (0: before and after only)
    log_every: int = 10

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.max_turns, self.turn_tokens, self.sft_problems, self.sft_steps, self.sft_batch,
               self.prompts_per_step, self.eval_problems, self.eval_batch, self.chunks) < 1:
            raise ValueError("tool_use: turns, tokens, problem counts, steps, batches and chunks must be >= 1")
        if self.steps < 0 or self.eval_every < 0 or self.log_every < 0:
            raise ValueError("tool_use: steps, eval_every and log_every must be >= 0")
        if self.group_size < 2 or self.temperature <= 0 or self.lr <= 0:
            raise ValueError("tool_use: need group_size >= 2 (group advantages), temperature > 0 and lr > 0")
        if not (0 <= self.sft_tool_fraction <= 1 and 0 <= self.sft_call_fraction <= 1) or self.advantage not in ESTIMATORS:
            raise ValueError(f"tool_use: sft_tool_fraction and sft_call_fraction in [0, 1], advantage in {tuple(ESTIMATORS)}")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(steps=400, prompts_per_step=32, group_size=16, lr=3e-4, eval_problems=2048, eval_batch=1024,
                  eval_every=100, chunks=4, log_every=25),
}


class ToolUse:
    """The start, the GRPO step and the evaluations of one run (the experiment's pieces, importable)."""

    def __init__(self, config: Config):
        self.config = c = config
        self.tok = tok = tool_tokenizer()
        self.envs = {tool: CalcEnv(tok, tool=tool, max_turns=c.max_turns, result_chars=c.result_chars)
                     for tool in (True, False)}
        env = self.envs[True]
        width = env.prompt_tokens + response_width(c.max_turns, c.turn_tokens, env.obs_tokens)
        cfg = dataclasses.replace(start_model_config(c.model, tok.vocab_size),
                                  max_seq_len=max(c.model.max_seq_len, width + c.turn_tokens))
        self.model = Transformer(cfg, rngs=nnx.Rngs(c.seed))
        self.graphdef, params, self.rest = nnx.split(self.model, nnx.Param, ...)
        stops = [tok.eos_id, tok.token_to_id("</calc>")]
        sampler = lambda t: SamplerConfig(max_new_tokens=c.turn_tokens, temperature=t, pad_id=tok.pad_id)
        self.rollouts = {(tool, greedy): HostRollout(self.envs[tool], lm_responder(
            self.graphdef, sampler(0.0 if greedy else c.temperature), stops), c.turn_tokens, tok.pad_id, c.chunks)
            for tool in (True, False) for greedy in (True, False)}
        self.optimizer = lm_optimizer(c.lr)
        logp_fn = lm_logp_fn(self.graphdef, width - env.prompt_tokens, c.temperature, chunk=32)
        learn = make_update(lambda p, rows: logp_fn(p, self.rest, rows), make_loss(c.loss), self.optimizer,
                            UpdateConfig())
        self._learn = jax.jit(learn)
        self.heldout = c.task.problems(np.random.default_rng([c.seed, HELDOUT_STREAM]), c.eval_problems)
        self._exclude = frozenset(p.expr for p in self.heldout)

    def params(self):
        return nnx.state(self.model, nnx.Param)

    def full_state(self, params):
        return nnx.merge_state(params, self.rest)

    def sft(self) -> float:
        """The short SFT start (the model in place) -> its last loss."""
        c = self.config
        rng = np.random.default_rng([c.seed, SFT_STREAM])
        problems = c.task.problems(rng, c.sft_problems, self._exclude)
        tools = rng.random(len(problems)) < c.sft_tool_fraction
        calls = tools & (rng.random(len(problems)) < c.sft_call_fraction)
        data = segment_rows([self.envs[bool(t)].oracle(p, bool(k)) for p, t, k in zip(problems, tools, calls)], 64,
                            self.tok.pad_id)
        _, losses = fit(self.model, data, c.sft_steps, c.sft_batch, c.sft_lr, [c.seed, SFT_STREAM], name="tool SFT")
        return float(losses[-1])

    def evaluate(self, params, tool: bool) -> dict:
        """Greedy held-out episodes -> ``calc_metrics`` (accuracy, counters, SE, n)."""
        c, roll, states = self.config, self.rollouts[(tool, True)], []
        state = self.full_state(params)
        for i in range(0, len(self.heldout), c.eval_batch):
            states += roll(state, jax.random.key(0), self.heldout[i: i + c.eval_batch])[1]
        return calc_metrics(states)

    def step(self, params, opt_state, step: int):
        """One GRPO step on fresh tool problems -> (params, opt_state, metrics)."""
        c = self.config
        rng = np.random.default_rng([c.seed, RL_STREAM, step])
        problems = c.task.problems(rng, c.prompts_per_step, self._exclude)
        rows = [p for p in problems for _ in range(c.group_size)]
        key = jax.random.fold_in(jax.random.key(c.seed), step)
        k_roll, k_learn = jax.random.split(key)
        t0 = time.perf_counter()
        episodes, states = self.rollouts[(True, False)](self.full_state(params), k_roll, rows)
        t1 = time.perf_counter()
        adv = group_advantages(episodes.reward.reshape(-1, c.group_size), c.advantage).reshape(-1)
        (params, opt_state), m = self._learn(params, opt_state, episodes.to_rollout(adv), k_learn)
        m = {k: float(np.mean(v)) for k, v in jax.device_get(m).items()}
        tool = calc_metrics(states)
        m.update({f"train_{k}": v for k, v in tool.items() if not k.endswith("_se") and k != "n"},
                 reward=float(episodes.reward.mean()), turns=float(episodes.turns.mean()),
                 model_tokens=float(episodes.loss_mask.sum(1).mean()), time_rollout=t1 - t0,
                 time_update=time.perf_counter() - t1)
        return params, opt_state, m

    def close(self):
        for r in self.rollouts.values():
            r.close()


def _row(stage: str, tool: bool, m: dict) -> dict:
    return {"stage": stage, "tool": "on" if tool else "off", "accuracy": round(m["accuracy"], 4),
            "se": round(m["accuracy_se"], 4), "n": m["n"], "calls": round(m["calls"], 3),
            "malformed": round(m["malformed"], 3), "oversized": round(m["oversized"], 3),
            "turn_limit": round(m["turn_limit"], 3), "no_answer": round(m["no_answer"], 3)}


def run(config: Config, run_dir: RunDir) -> dict:
    t_start = time.perf_counter()
    job = ToolUse(config)
    try:
        sft_loss = job.sft()
        params = job.params()
        opt_state = job.optimizer.init(params)
        evals = {("start", t): job.evaluate(params, t) for t in (True, False)}
        for tool in (True, False):
            run_dir.log(0, {f"eval_{'tool' if tool else 'no_tool'}_{k}": v for k, v in evals[("start", tool)].items()})
        for s in range(config.steps):
            params, opt_state, m = job.step(params, opt_state, s)
            run_dir.log(s + 1, m)
            if config.log_every and (s + 1) % config.log_every == 0:
                print(f"step {s + 1}: reward {m['reward']:.3f} calls {m['train_calls']:.2f} "
                      f"malformed {m['train_malformed']:.3f} turns {m['turns']:.2f}", flush=True)
            if config.eval_every and (s + 1) % config.eval_every == 0 and s + 1 < config.steps:
                run_dir.log(s + 1, {f"eval_tool_{k}": v for k, v in job.evaluate(params, True).items()})
        if config.steps:
            evals.update({("final", t): job.evaluate(params, t) for t in (True, False)})
            for tool in (True, False):
                run_dir.log(config.steps, {f"eval_{'tool' if tool else 'no_tool'}_{k}": v
                                           for k, v in evals[("final", tool)].items()})
    finally:
        job.close()
    rows = [_row(stage, tool, m) for (stage, tool), m in evals.items()]
    print(run_dir.write_table("results", rows))
    if config.steps:
        run_dir.plot(["reward", "train_calls", "train_malformed", "eval_tool_accuracy"], "tool_use.png",
                     title="GRPO with a calculator tool")
    end = "final" if config.steps else "start"
    acc = lambda stage, tool: evals[(stage, tool)]["accuracy"]
    se = lambda stage, tool: evals[(stage, tool)]["accuracy_se"]
    summary = {
        "n_heldout": len(job.heldout), "sft_loss": sft_loss,
        "start_tool_accuracy": acc("start", True), "start_tool_se": se("start", True),
        "start_no_tool_accuracy": acc("start", False), "start_no_tool_se": se("start", False),
        "final_tool_accuracy": acc(end, True), "final_tool_se": se(end, True),
        "final_no_tool_accuracy": acc(end, False), "final_no_tool_se": se(end, False),
        "final_tool_metrics": evals[(end, True)], "final_no_tool_metrics": evals[(end, False)],
        "wall_seconds": time.perf_counter() - t_start, "run_dir": str(run_dir.path),
    }
    run_dir.save_json("summary", summary)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
