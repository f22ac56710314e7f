"""Tool use on the multi-turn protocol: GRPO teaches a small model to answer arithmetic with a calculator (the
agent, its start and its evaluation: ``agents.tool_use``; here the config, the presets and the run).

    jaxrl-reason run tool_use                  # --preset cpu: the whole run on CPU, nothing downloaded (~minutes)
    jaxrl-reason run tool_use --preset gpu     # longer, larger batches

The start: a byte tokenizer with the tool's tags (``tasks.tool_calc.tool_tokenizer``) and a Qwen3-architecture model
(``rl.grpo.start.start_model_config``) given a deliberately short SFT on oracle episodes (``CalcEnv.oracle``): half
with the tool (call, result, answer), half without (the answer alone), so the format is known and the copying only
partly learnt. GRPO then trains on tool episodes (``tasks.tool_calc.CalcEnv``, a ``HostTextEnv``: the calculator
runs on host threads between the device's turns, ``rl.lm.host_rollout.HostRollout``) on the one LM learner
(``rl.lm.Learner``: advantages by the registered estimator ``advantage``); the loss covers only the
model's tokens (``Episodes.to_rollout``: the results are context). Evaluation: greedy, on ``eval_problems``
problems held out whole (in neither SFT nor RL data), with the tool and without it (the same model, turns and
token budget; ``mind:`` prompts and the calculator off), before and after GRPO: accuracy with SE and n, and the
tool's counters (calls, malformed, oversized, endless calls, no answer; ``calc_metrics``).
"""

from __future__ import annotations

import dataclasses
import time

import jax

from jaxrl_reason.agents.tool_use import ToolUseConfig, sft_start, tool_use_learner, tool_use_model
from jaxrl_reason.utils.experiment import RunDir


@dataclasses.dataclass(frozen=True)
class Config(ToolUseConfig):
    """``agents.tool_use.ToolUseConfig`` (the start, the rollout, the learner, the evaluation) and the run's length."""

    steps: int = 150  # GRPO steps
    eval_every: int = 0  # held-out evaluation interval in GRPO steps (0: before and after only)
    log_every: int = 10
    plan: bool = False  # compile a step for the episode's T turns, print its memory (the KV cache) and cost, and stop

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 0 or self.eval_every < 0 or self.log_every < 0:
            raise ValueError("tool_use: steps, eval_every and log_every must be >= 0")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(steps=400, prompts_per_step=32, group_size=16, lr=3e-4, eval_problems=2048, eval_batch=1024,
                  eval_every=100, chunks=4, log_every=25),
}


def _row(stage: str, tool: bool, m: dict) -> dict:
    return {"stage": stage, "tool": "on" if tool else "off", "accuracy": round(m["accuracy"], 4),
            "se": round(m["accuracy_se"], 4), "n": m["n"], "calls": round(m["calls"], 3),
            "malformed": round(m["malformed"], 3), "oversized": round(m["oversized"], 3),
            "turn_limit": round(m["turn_limit"], 3), "no_answer": round(m["no_answer"], 3)}


def run(config: Config, run_dir: RunDir) -> dict:
    t_start = time.perf_counter()
    model = tool_use_model(config)
    if config.plan:  # before the start's SFT: nothing trained, a plan that does not fit refused
        learner, agent = tool_use_learner(config, model)
        with agent:
            report = learner.plan(agent)
        print(report.summary())
        report.check()
        return {"plan_peak_bytes": report.peak, "plan_kv_cache_bytes": report.kv_cache, "run_dir": str(run_dir.path)}
    sft_loss = sft_start(model, config)
    learner, agent = tool_use_learner(config, model)
    with agent:
        state = learner.init(jax.random.key(config.seed), agent)
        evaluate = lambda state, tool: agent.evaluate(learner.policy(state), tool=tool)
        evals = {("start", t): evaluate(state, t) for t in (True, False)}
        for tool in (True, False):
            run_dir.log(0, {f"eval_{'tool' if tool else 'no_tool'}_{k}": v for k, v in evals[("start", tool)].items()})
        for s in range(config.steps):
            state, m = learner.step(state, agent, agent.batch(s))
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            run_dir.log(s + 1, m)
            if config.log_every and (s + 1) % config.log_every == 0:
                print(f"step {s + 1}: reward {m['reward']:.3f} calls {m['train_calls']:.2f} "
                      f"malformed {m['train_malformed']:.3f} turns {m['turns']:.2f}", flush=True)
            if config.eval_every and (s + 1) % config.eval_every == 0 and s + 1 < config.steps:
                run_dir.log(s + 1, {f"eval_tool_{k}": v for k, v in evaluate(state, True).items()})
        if config.steps:
            evals.update({("final", t): evaluate(state, t) for t in (True, False)})
            for tool in (True, False):
                run_dir.log(config.steps, {f"eval_{'tool' if tool else 'no_tool'}_{k}": v
                                           for k, v in evals[("final", tool)].items()})
    rows = [_row(stage, tool, m) for (stage, tool), m in evals.items()]
    print(run_dir.write_table("results", rows))
    if config.steps:
        run_dir.plot(["reward", "train_calls", "train_malformed", "eval_tool_accuracy"], "tool_use.png",
                     title="GRPO with a calculator tool")
    end = "final" if config.steps else "start"
    acc = lambda stage, tool: evals[(stage, tool)]["accuracy"]
    se = lambda stage, tool: evals[(stage, tool)]["accuracy_se"]
    summary = {
        "n_heldout": len(agent.heldout), "sft_loss": sft_loss,
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
