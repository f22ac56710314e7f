"""GRPO step throughput with the time split between sampling and update.

One step = G completions for each of P prompts from the jitted KV-cache sampler, host-side scoring,
then the jitted update (log-probs of the policy and the reference, loss, optimiser step). The model
is randomly initialised (throughput does not depend on what it knows) and the prompts are
RandomCalculation problems. Token rates count the tokens actually generated (a sequence stops at
its stop token; the loop runs until every sequence has stopped or reached ``new_tokens``).
Steps after ``warmup`` (compilation) are timed; medians are reported. Sampling time includes the
host-side scoring.

    python experiments/bench_grpo.py --preset cpu   # tiny model, 16 prompts x 8, 64 new tokens
    python experiments/bench_grpo.py --preset gpu   # ~100M dense bf16, 256 prompts x 8, 256 new tokens
"""

from __future__ import annotations

import dataclasses
import statistics

import jax
from jaxrl_reason.models.lm import param_count
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.trainer import GRPOConfig, GRPOTrainer
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # unrolled: the sampler keeps per-layer weights and cache in its loop; max_seq_len >= prompt + new tokens
    lm: recipes.TinyLM = recipes.TinyLM(scan_layers=False)
    prompts: int = 16
    group_size: int = 8
    new_tokens: int = 64
    minibatches: int = 1
    prompt_len: int = 28
    answer_len: int = 12
    warmup: int = 1
    steps: int = 3

    def __post_init__(self):
        check_hyperparameters(self)
        if self.warmup < 1 or self.steps < 1:
            raise ValueError(f"warmup and steps must be >= 1 (the first step compiles), got {self.warmup}, {self.steps}")


PRESETS = {
    "cpu": Config(),
    # the target: ~100M parameters (113M), 256 prompts x 8 samples, 256 new tokens
    "gpu": Config(lm=recipes.TinyLM(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=288, dtype="bfloat16"),
                  prompts=256, new_tokens=256, minibatches=8, steps=3),
}


def run(config: Config, run_dir: RunDir) -> dict:
    model = recipes.build_model(config.lm, config.seed)
    grpo = GRPOConfig(group_size=config.group_size, prompts_per_step=config.prompts, max_new_tokens=config.new_tokens,
                      minibatches=config.minibatches, seed=config.seed)
    task = RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=9, ops="+-*")
    trainer = GRPOTrainer(grpo, model, [task], config.prompt_len, config.answer_len)
    state = trainer.init(jax.random.key(config.seed))
    rows = []
    for i in range(config.warmup + config.steps):
        state, m = trainer.step(state)
        if i >= config.warmup:
            rows.append({k: float(m[k]) for k in ("time_sample_s", "time_update_s", "response_length")})
            run_dir.log(i, rows[-1])
    sample_s = statistics.median(r["time_sample_s"] for r in rows)
    update_s = statistics.median(r["time_update_s"] for r in rows)
    sequences = config.prompts * config.group_size
    tokens = sequences * statistics.median(r["response_length"] for r in rows)
    summary = {
        "device": jax.devices()[0].device_kind, "params": param_count(model), "sequences_per_step": sequences,
        "new_tokens": config.new_tokens, "step_s": sample_s + update_s, "sample_s": sample_s, "update_s": update_s,
        "sample_fraction": sample_s / (sample_s + update_s), "sampled_tokens_per_s": tokens / sample_s,
        "step_tokens_per_s": tokens / (sample_s + update_s),
    }
    print(run_dir.write_table("results", [summary]))
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
