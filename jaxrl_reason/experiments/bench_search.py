"""Throughput of the step-level MCTS over a language model (ASTRO's search) next to best-of-N sampling.

Both run jitted and batched over the same held-out problems with the same model (the ASTRO base policy,
``agents.astro.base_policy``: a tiny LM after a short SFT, so rollouts stop at their answers as in the
experiment). Timed after compilation, interleaved round by round (``utils.timing``):

- MCTS: simulations/s (problems x simulations per call / seconds) and generated tokens/s (the tokens the
  search counts: candidates and rollouts of expanded nodes; the batched search also computes, and
  discards, expansions below closed answers, which are not counted);
- best-of-N: ``num_samples`` whole responses per problem, generated tokens/s;
- ratio: the search's tokens/s over best-of-N's (the price of tree search per generated token:
  short rollouts from many prefixes instead of one long batch of samples).

    python experiments/bench_search.py --preset cpu
    python experiments/bench_search.py --preset gpu                      # Llama 3.2 1B shapes, random weights
    python experiments/bench_search.py --preset gpu --model CKPT_DIR     # a checkpoint (agents.astro.make_tokenizer)

``--model`` / ``--arch`` replace the astro preset's policy (``experiments/astro.py``: a HF checkpoint whose
tokenizer has the R1 tags as single tokens, or random weights of ``recipes.ARCHS[arch]``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.agents import astro as stages
from jaxrl_reason.cli import load_experiment
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.search.lm_mcts import best_of_n, make_step_search
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    astro_preset: str = "cpu"  # experiments/astro.py preset: model size, task, base SFT, search, prompt lengths
    model: str | None = None  # astro's --model (a HF checkpoint dir); None: the preset's
    arch: str | None = None  # astro's --arch (a name in recipes.ARCHS); None: the preset's
    problems: int = 32  # problems per jitted call (both methods)
    num_samples: int = 16  # best-of-N samples per problem
    rounds: int = 3

    def __post_init__(self):
        check_hyperparameters(self)
        for f in ("problems", "num_samples", "rounds"):
            if getattr(self, f) < 1:
                raise ValueError(f"Config.{f} must be >= 1, got {getattr(self, f)}")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(astro_preset="gpu", problems=256, num_samples=32),
}


def run(config: Config, run_dir: RunDir) -> dict:
    astro = load_experiment("astro")
    if config.astro_preset not in astro.PRESETS:
        raise ValueError(f"astro_preset must be one of {sorted(astro.PRESETS)}, got {config.astro_preset!r}")
    a = astro.PRESETS[config.astro_preset]
    a = dataclasses.replace(a, seed=config.seed, model=config.model or a.model, arch=config.arch or a.arch)
    tok = stages.make_tokenizer(a)
    graphdef, params = nnx.split(stages.base_policy(a, tok))
    batch = recipes.heldout([a.task], config.problems, config.seed, a.prompt_len, a.answer_len, tok)
    problem = (batch.prompts, batch.prompt_lens, batch.answers, batch.answer_lens)
    search = make_step_search(graphdef, a.search, tokenizer=tok)
    tokens = {}

    def mcts(i):
        out = search(params, jax.random.key(i), *problem)
        tokens.setdefault("mcts", []).append(out.tokens)
        return out.solved

    def bon(i):
        solved, toks = best_of_n(graphdef, params, jax.random.key(i), *problem, num_samples=config.num_samples,
                                 max_new_tokens=a.grpo.max_new_tokens, temperature=a.search.temperature,
                                 tokenizer=tok)
        tokens.setdefault("best_of_n", []).append(toks)
        return solved

    t = timing.interleaved({"mcts": mcts, "best_of_n": bon}, config.rounds)
    # tokens per call: mean over the timed rounds (the first call compiled)
    per_call = {k: float(np.mean([np.asarray(x).sum() for x in v[1:]])) for k, v in tokens.items()}
    rate = {k: per_call[k] / t[k].median for k in t}
    rows = [
        {"method": f"MCTS ({a.search.num_simulations} sims, {a.search.branching} rollouts/expansion)",
         "problems": config.problems, "seconds": t["mcts"].median,
         "simulations_per_s": config.problems * a.search.num_simulations / t["mcts"].median,
         "tokens_per_call": per_call["mcts"], "tokens_per_s": rate["mcts"]},
        {"method": f"best-of-{config.num_samples}", "problems": config.problems, "seconds": t["best_of_n"].median,
         "simulations_per_s": float("nan"), "tokens_per_call": per_call["best_of_n"], "tokens_per_s": rate["best_of_n"]},
    ]
    print(run_dir.write_table("results", rows))
    summary = {"device": jax.devices()[0].device_kind, "policy": stages.policy_name(a),
               "simulations_per_s": rows[0]["simulations_per_s"],
               "mcts_tokens_per_s": rate["mcts"], "best_of_n_tokens_per_s": rate["best_of_n"],
               "tokens_per_s_ratio": rate["mcts"] / rate["best_of_n"]}
    print(f"search / best-of-N generated tokens per second: {summary['tokens_per_s_ratio']:.2f}")
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
