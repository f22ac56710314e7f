"""A GRPO step against this machine's own limits: the matmul peaks (float32 and bfloat16, at the model's shapes,
through XLA) and the memory bandwidth, measured here; then the GRPO update's achieved FLOP/s as a fraction of the
matmul peak, sampling's time against its roofline (compute- or bandwidth-bound, whichever applies), and the gain of
prefilling each prompt once per group.

    jaxrl-reason run bench_roofline --preset cpu     # SmolLM2-135M-Instruct, 8 prompts x 8, 16 new tokens (remat block)
    jaxrl-reason run bench_roofline --preset tiny    # a tiny random model, synthetic prompts (the test)

FLOPs and bytes are the plan's (``rl.lm.plan``): useful work, what the tokens need (sampling: each group's prompt
once, the LM head where a token is drawn; the update: forward + backward + the remat's recomputation), and the least
memory traffic (the weights once per pass and per decode step, the KV cache at each decode step, the optimiser's
state). The step's phases are the learner's own timings (``time_sample_s``: sampling and decoding the text;
``time_update_s``: the update program), medians over ``steps`` steps after ``warmup`` ones. The prefill arms
(``generate(group=1)`` against ``group=G`` on the same prompts, key and weights) are medians of interleaved rounds;
their tokens are checked equal. A peak is the best of a few calls; everything of ours a median.
"""

from __future__ import annotations

import dataclasses
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.data import PromptFormat
from jaxrl_reason.models.lm import LMConfig, Transformer, load_model, load_tokenizer
from jaxrl_reason.models.lm.sampler import generate
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig
from jaxrl_reason.utils import roofline, timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    model: str = "smollm2-135m-instruct"  # a packaged name, HF directory or .gguf; "" = a tiny random model
    prompts: int = 8  # prompts per step
    group: int = 8  # completions per prompt
    max_new_tokens: int = 16
    prompt_len: int = 64
    remat: str = "block"
    lr: float = 2e-6
    warmup: int = 1  # GRPO steps not timed (compilation)
    steps: int = 3  # timed GRPO steps (median)
    rounds: int = 3  # interleaved rounds of the prefill arms
    repeats: int = 5  # calls per peak measurement (best)
    bandwidth_mib: int = 256

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.prompts, self.group, self.max_new_tokens, self.prompt_len, self.steps, self.rounds) < 1:
            raise ValueError("prompts, group, max_new_tokens, prompt_len, steps and rounds must be >= 1")


PRESETS = {
    "cpu": Config(),
    "tiny": Config(model="", prompts=2, group=4, max_new_tokens=8, prompt_len=16, steps=2, rounds=2, repeats=2,
                   bandwidth_mib=32),
}


def _learner(c: Config):
    """(learner, agent) of a GRPO run on synthetic arithmetic (the chat template of a real checkpoint)."""
    cfg = GRPOConfig(seed=c.seed, prompts_per_step=c.prompts, group_size=c.group, max_new_tokens=c.max_new_tokens,
                     lr=c.lr, remat=c.remat, reward=RewardConfig("correct"),
                     loss=LossConfig(eps_low=0.2, eps_high=0.2, aggregation="token_mean"))
    tasks = [RandomCalculation(max_difficulty=2, ops="+-*")]
    if not c.model:
        tok = CharTokenizer()
        model = Transformer(LMConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                     d_ff=128, max_seq_len=c.prompt_len + c.max_new_tokens), rngs=nnx.Rngs(c.seed))
        return grpo_for_tasks(cfg, model, tok, tasks, c.prompt_len)
    tok = load_tokenizer(c.model)
    return grpo_for_tasks(cfg, load_model(c.model), tok, tasks, c.prompt_len, fmt=PromptFormat("chat", "{prompt}"))


def _shapes(model_cfg, c: Config) -> list[tuple[int, int, int]]:
    """The matmuls of a step: the update's (its tokens: each group's prompt once, every row's response) and
    decoding's (one token per row): [M, d] @ [d, ff], [M, ff] @ [ff, d], [M, d] @ [d, vocab]."""
    d, ff, v = model_cfg.d_model, model_cfg.d_ff, model_cfg.vocab_size
    rows = c.prompts * c.group
    update_m = c.prompts * c.prompt_len + rows * c.max_new_tokens
    return [(update_m, d, ff), (update_m, ff, d), (update_m, d, v), (rows, d, ff), (rows, d, v)]


def _prefill_arms(learner, agent, state, c: Config) -> dict:
    """Sampling the step's prompts with every row prefilled vs each prompt once per group: medians of interleaved
    rounds, and whether their tokens are equal."""
    _, rows, _, ids, lens = agent.batch(0)
    b, policy, cfg = len(rows), learner.policy(state), agent.sampler_config
    args = (jnp.asarray(ids), jnp.asarray(lens))
    tail = (jnp.broadcast_to(agent.stop_tokens, (b,) + np.shape(agent.stop_tokens)),
            jnp.full((b,), c.max_new_tokens, jnp.int32))
    run = lambda group: lambda i: generate(learner.graphdef, policy, *args, jax.random.key(i), *tail, config=cfg,
                                           group=group)
    arms = {"every_row": run(1), "once_per_group": run(c.group)}
    t = timing.interleaved(arms, c.rounds)
    same = all(np.array_equal(arms["every_row"](i).tokens, arms["once_per_group"](i).tokens) for i in range(2))
    return {"prefill_every_row_s": t["every_row"].median, "prefill_once_per_group_s": t["once_per_group"].median,
            "prefill_once_per_group_speedup": t["every_row"].median / t["once_per_group"].median,
            "prefill_tokens_equal": same}


def run(config: Config, run_dir: RunDir) -> dict:
    c = config
    learner, agent = _learner(c)
    model_cfg = nnx.merge(learner.graphdef, learner._params, learner._rest).cfg
    peaks = roofline.matmul_peaks(_shapes(model_cfg, c), repeats=c.repeats)
    bandwidth = roofline.read_bandwidth(c.bandwidth_mib, repeats=c.repeats)
    f32, bf16 = peaks["float32"]["peak"], peaks["bfloat16"]["peak"]
    print(f"[bench_roofline] matmul peak float32 {f32 / 1e9:.1f} GFLOP/s, bfloat16 {bf16 / 1e9:.1f} GFLOP/s; "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    for dtype, rates in peaks.items():
        print("  " + dtype + ": " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rates.items() if k != "peak"))
    peak = f32 if model_cfg.jdtype == jnp.float32 else bf16  # the update's matmuls run in the parameters' dtype
    plan = learner.plan(agent, flops_per_s=peak, bandwidth=bandwidth)
    print(plan.summary(), flush=True)

    state = learner.init(jax.random.key(c.seed), agent)
    step = learner.step_fn(agent)
    phases = {"time_sample_s": [], "time_update_s": []}
    for i in range(c.warmup + c.steps):
        state, m = step(state)
        if i >= c.warmup:
            for k in phases:
                phases[k].append(float(m[k]))
    sample_s, update_s = (statistics.median(phases[k]) for k in ("time_sample_s", "time_update_s"))
    out = _prefill_arms(learner, agent, state, c)
    agent.close()

    flops, moved = plan.flops, plan.bytes
    sample_roof = plan.time_s("sample")
    out.update({
        "matmul_peak_f32": f32, "matmul_peak_bf16": bf16, "read_bandwidth": bandwidth,
        **{f"matmul_{d}_{k}": v for d, rates in peaks.items() for k, v in rates.items() if k != "peak"},
        "update_flops": flops["update"], "update_bytes": moved["update"], "update_s": update_s,
        "update_flops_per_s": flops["update"] / update_s, "update_fraction_of_peak": flops["update"] / update_s / peak,
        "sample_flops": flops["sample"], "sample_bytes": moved["sample"], "sample_s": sample_s,
        "sample_roofline_s": sample_roof, "sample_fraction_of_roofline": sample_roof / sample_s,
        "sample_bound": "bandwidth" if moved["sample"] / bandwidth > flops["sample"] / peak else "compute",
        "plan_step_s": plan.step_time_s, "dtype": str(jnp.dtype(model_cfg.jdtype)),
    })
    print(f"[bench_roofline] update {update_s:.2f} s: {out['update_flops_per_s'] / 1e9:.1f} GFLOP/s = "
          f"{100 * out['update_fraction_of_peak']:.0f}% of the {out['dtype']} matmul peak")
    print(f"[bench_roofline] sampling {sample_s:.2f} s against its roofline {sample_roof:.2f} s "
          f"({out['sample_bound']}-bound): {100 * out['sample_fraction_of_roofline']:.0f}%")
    print(f"[bench_roofline] prefill once per group: {out['prefill_once_per_group_speedup']:.2f}x the sampler's "
          f"time with every row prefilled (tokens equal: {out['prefill_tokens_equal']})", flush=True)
    return out


def record(summary: dict) -> list[dict]:
    """The figures ``--record`` writes."""
    pct = lambda k: 100 * summary[k]
    return [{"name": "matmul peak float32", "value": summary["matmul_peak_f32"] / 1e9, "unit": "GFLOP/s"},
            {"name": "matmul peak bfloat16", "value": summary["matmul_peak_bf16"] / 1e9, "unit": "GFLOP/s"},
            {"name": "read bandwidth", "value": summary["read_bandwidth"] / 1e9, "unit": "GB/s"},
            {"name": "GRPO update, % of the matmul peak", "value": pct("update_fraction_of_peak"), "unit": "%"},
            {"name": "sampling, % of its roofline", "value": pct("sample_fraction_of_roofline"), "unit": "%"},
            {"name": "prefill once per group, speed-up of sampling", "value": summary["prefill_once_per_group_speedup"],
             "unit": "x"}]


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
