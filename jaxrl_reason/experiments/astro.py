"""ASTRO at small scale: step-level MCTS over a tiny LM -> procedure cloning -> SFT -> GRPO.

1. base policy: a tiny char-level LM (or ``--arch`` / ``--model``, below) with a short, partial SFT on the task's
   gold traces (RandomCalculation; ``--preset countdown``: Countdown, verified by ``task.check`` in the search too);
2. search vs sampling: on held-out multi-step problems (where one greedy pass often fails), MCTS
   with the base policy (outcome verifier only, and with the local step check of ``tasks.calc_steps``
   pruning candidate steps) vs best-of-N sampling with (at least) the same number of generated
   tokens, overall and per difficulty; solved = a verified-correct answer was found (all use the same answer verifier); the table
   gives each search's paired difference to best-of-N (mean and standard error over problems);
   ``--compare-only`` stops here (``--compare-problems 512`` for a tight comparison);
3. search on training problems -> linear chains of thought: ASTRO traces (failed branch, reflection,
   "back to step i", the good step) and direct traces (successful path only), keeping only traces
   whose successful path passes the local step check (``traces_need_valid_steps``);
4. three arms, each then GRPO with the verifier reward: base, SFT on ASTRO traces, SFT on direct
   traces; held-out greedy accuracy by difficulty, backtracks per response (and backtracks in
   correct responses), response length over RL steps; plots and a results table.

The policy: the tiny LM (``d_model``, ``n_layers``), or ``--arch NAME`` (random weights of
``recipes.ARCHS[NAME]``: throughput; the gpu preset uses Llama 3.2 1B), or ``--model CKPT_DIR`` (a Hugging Face
checkpoint: its weights and tokenizer). Whichever it is, ASTRO's SFT stages (the base SFT on gold traces, then the
SFT on search traces) and GRPO run on it, with raw ``<bos>`` + problem prompts (no chat template). A checkpoint's
tokenizer must have the four R1 tags as single tokens (the search writes and parses them inside jit, and adding
tokens would resize the embeddings): Qwen3's has only ``<think>`` ``</think>`` and Llama 3's none, and those are
refused with one error naming the missing tags; the project's own checkpoints have them
(``rl.grpo.start.make_start_checkpoint``, or ``models.lm.hf_export.save_hf_model`` with such a tokenizer).

The presets' vocabulary is the 96-id ``models.tokenizer.CharTokenizer``; with ``--model`` it is the checkpoint's
tokenizer with plain text spelled one token per character (``SpelledTokenizer``), which the in-jit step check,
the step search and the character spans of procedure cloning read. ``agents.astro.make_tokenizer`` builds it, ``run``
hands it to every stage (search, cloning, SFT, GRPO, evaluation; each stage in ``agents.astro``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro
from flax import nnx

from jaxrl_reason.agents import astro
from jaxrl_reason.agents.astro import SEARCHES
from jaxrl_reason.models.lm import LMConfig
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.agent import GRPOConfig
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.search.lm_mcts import StepSearchConfig
from jaxrl_reason.search.procedure_cloning import CloningConfig
from jaxrl_reason.tasks.countdown import Countdown
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # the policy: --model CKPT_DIR (a HF checkpoint: its weights and tokenizer; the base SFT, trace SFT and GRPO run
    # on it), else --arch NAME (random weights of recipes.ARCHS[NAME], activations in arch_dtype: throughput),
    # else the tiny LM below (d_model, n_layers). --model wins over --arch.
    model: str | None = None
    # a checkpoint whose tokenizer lacks the R1 tags: add the missing ones as new special tokens, with new rows of
    # the (tied) embedding and head at the mean embedding (else the checkpoint is refused, make_tokenizer)
    add_r1_tags: bool = False
    # a checkpoint's R1 tags as four words it has (one token each, e.g. " Steps" " So" " answer" " Done": no new rows)
    tag_words: tuple[str, str, str, str] | None = None
    min_base_format_rate: float = 0.0  # stop before the search when the base policy's held-out format rate is lower
    base_arm: bool = True  # also GRPO from the base policy (the third arm)
    arch: str | None = None
    arch_dtype: str = "bfloat16"
    # RandomCalculation (one exact answer) or Countdown (reach a target; many valid answers, verified by task.check)
    task: RandomCalculation | Countdown = RandomCalculation(min_difficulty=1, max_difficulty=3, max_operand=9, ops="+-*")
    d_model: int = 64
    n_layers: int = 2
    base_sft: recipes.WarmStart = recipes.WarmStart(problems=2048, steps=300, batch_size=32, lr=3e-3, seq_len=64)
    search: StepSearchConfig = StepSearchConfig(num_simulations=12, branching=4, max_depth=4, step_tokens=10,
                                                rollout_tokens=32, temperature=1.0)
    search_batch: int = 32  # problems searched per jitted call
    search_problems: int = 512  # training problems searched for traces
    compare_problems: int = 64  # held-out problems for MCTS vs best-of-N
    compare_min_difficulty: int = 2  # ... of at least this difficulty (multi-step: one greedy pass often fails)
    # the searches compared with best-of-N: "mcts" (outcome verifier only), "mcts_step_checked" (the step check
    # prunes candidates), "mcts_step_graded" (the step check grades open nodes)
    compare_searches: tuple[str, ...] = ("mcts", "mcts_step_checked", "mcts_step_graded")
    cloning: CloningConfig = CloningConfig(num_detours=1)
    # detours only through visible mistakes (``shows_mistake``): a step tasks.calc_steps rejects; countdown: an
    # attempt whose steps are true but whose result misses the target
    detours_need_visible_mistake: bool = True
    prune_with_step_check: bool = False  # the trace search prunes rejected steps (measured: no better at equal tokens)
    # SFT only on traces whose successful path passes tasks.calc_steps (measured: without it about half of the
    # verified traces reach the answer over false steps and SFT on them falls below the base policy)
    traces_need_valid_steps: bool = True
    # False: ASTRO SFT reads the failed steps but takes no loss on them (learns to undo a wrong step, not to write one)
    loss_on_failed_steps: bool = True
    trace_sft_steps: int = 150
    trace_sft_lr: float = 1e-3
    trace_seq_len: int = 112
    grpo: GRPOConfig = GRPOConfig(
        group_size=8, prompts_per_step=16, lr=2e-4, temperature=1.0, max_new_tokens=72,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
        reward=RewardConfig("correct", format_weight=0.1),
    )
    compare_only: bool = False  # stop after the MCTS vs best-of-N comparison (stage 2)
    rl_steps: int = 60
    eval_every: int = 20  # held-out evaluation interval (0: only before and after; the last step is always evaluated)
    heldout_problems: int = 192
    # --eval-data FILE (+ --eval-samples, --eval-reward, --eval-reward-fn, --eval-prompt-field, --eval-answer-field):
    # each arm's GRPO also evaluated on a prompt/answer file (raw <bos> + prompt)
    eval_file: Annotated[recipes.EvalFile, tyro.conf.OmitArgPrefixes] = recipes.EvalFile()
    prompt_len: int = 24
    answer_len: int = 12

    def __post_init__(self):
        check_hyperparameters(self)
        check_intervals(self.rl_steps, eval_every=self.eval_every)
        for f in ("search_batch", "search_problems", "compare_problems", "trace_sft_steps", "heldout_problems"):
            if getattr(self, f) < 1:
                raise ValueError(f"Config.{f} must be >= 1, got {getattr(self, f)}")
        if self.search_problems % self.search_batch or self.compare_problems % self.search_batch:
            raise ValueError("search_problems and compare_problems must be multiples of search_batch")
        unknown = set(self.compare_searches) - set(SEARCHES)
        if unknown or not self.compare_searches:
            raise ValueError(f"Config.compare_searches: one or more of {SEARCHES}, got {self.compare_searches}")
        if self.arch is not None and self.arch not in recipes.ARCHS:
            raise ValueError(f"Config.arch: unknown arch {self.arch!r}; known: {sorted(recipes.ARCHS)}")
        if (self.add_r1_tags and self.tag_words) or not 0 <= self.min_base_format_rate <= 1:
            raise ValueError("Config: add_r1_tags or tag_words (not both); min_base_format_rate in [0, 1]")

    @property
    def max_seq_len(self) -> int:
        """The policy's window: the longest of a search context, an SFT trace and a GRPO sequence."""
        return max(self.search.context_len(self.prompt_len), self.trace_seq_len,
                   self.prompt_len + self.grpo.max_new_tokens)

    def lm(self, tokenizer: Tokenizer) -> LMConfig:
        """The tiny LM (without --model / --arch)."""
        return LMConfig(vocab_size=tokenizer.vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=4,
                        n_kv_heads=4, d_ff=4 * self.d_model, max_seq_len=self.max_seq_len)


#: issue 40 / 55: ASTRO from the real SmolLM2-135M-Instruct (--model smollm2-135m-instruct, a packaged GGUF) in plain
#: text it already reads: the R1 tags are four of its own words (tag_words: no new rows), steps and reflections spelled
#: per character; its base SFT must reach a 90% held-out format rate before the search. ASTRO traces vs direct traces
#: (the same search's successful paths) at the same SFT and RL steps, n = 512 held out; sized for a 2-core CPU (a
#: trained token ~27 ms of forward + backward): base SFT 60 x 8 x 64 tokens, trace SFT 24 x 8 x 112, RL 8 x 16 an arm
SMOLLM2 = Config(
    model="smollm2-135m-instruct", tag_words=(" Steps", " So", " answer", " Done"), min_base_format_rate=0.9,
    base_sft=recipes.WarmStart(problems=1024, steps=60, batch_size=8, lr=1e-4, seq_len=64),
    search=StepSearchConfig(num_simulations=8, branching=4, max_depth=4, step_tokens=10, rollout_tokens=32,
                            temperature=1.0),
    search_batch=16, search_problems=64, compare_problems=16, compare_searches=("mcts",), trace_sft_steps=24,
    trace_sft_lr=5e-5, base_arm=False,
    grpo=dataclasses.replace(Config().grpo, prompts_per_step=4, group_size=4, lr=1e-6, max_new_tokens=48,
                             remat="block"),
    rl_steps=8, eval_every=4, heldout_problems=512,
)

PRESETS = {
    "cpu": Config(),
    "smollm2": SMOLLM2,
    # the same comparison sized for one H200: more search, traces, SFT, RL and held-out problems
    "smollm2_gpu": dataclasses.replace(
        SMOLLM2, base_sft=recipes.WarmStart(problems=8192, steps=400, batch_size=64, lr=2e-5, seq_len=64),
        search=StepSearchConfig(num_simulations=32, branching=4, max_depth=6, step_tokens=12, rollout_tokens=48),
        search_batch=128, search_problems=2048, compare_problems=256, compare_searches=SEARCHES,
        trace_sft_steps=300, trace_sft_lr=2e-5,
        grpo=dataclasses.replace(Config().grpo, prompts_per_step=64, group_size=16, lr=1e-6, max_new_tokens=72,
                                 minibatches=4, remat="block"),
        rl_steps=200, eval_every=20, heldout_problems=1024),
    "gpu": Config(
        # ASTRO starts from Llama-3.3-70B-Instruct; the Llama of recipes.ARCHS that fits one GPU is Llama 3.2 1B:
        # random weights of its configuration (throughput), or --model a checkpoint whose tokenizer has the four R1
        # tags as single tokens (make_tokenizer; Meta's Llama 3.2 tokenizer has none of them). Learning rates are
        # sized for fine-tuning a pretrained 1B model; d_model / n_layers: the tiny LM, used only without an arch
        arch="llama-3.2-1b",
        d_model=256, n_layers=4, task=RandomCalculation(min_difficulty=1, max_difficulty=5, ops="+-*"),
        base_sft=recipes.WarmStart(problems=8192, steps=600, batch_size=128, lr=1e-5, seq_len=96),
        search=StepSearchConfig(num_simulations=32, branching=4, max_depth=6, step_tokens=12, rollout_tokens=48),
        search_batch=128, search_problems=2048, compare_problems=256, trace_sft_steps=400, trace_sft_lr=1e-5,
        trace_seq_len=160,
        grpo=dataclasses.replace(Config().grpo, prompts_per_step=64, group_size=16, max_new_tokens=112, lr=1e-6,
                                 minibatches=8),
        rl_steps=200, heldout_problems=1024, prompt_len=32,
    ),
    # countdown (2-4 numbers up to 9): a search task, where one greedy pass rarely finds the target for 3-4 numbers
    "countdown": Config(task=Countdown(min_difficulty=2, max_difficulty=4, max_number=9), answer_len=16,
                        compare_min_difficulty=3, cloning=CloningConfig(num_detours=1, detour="attempt"),
                        # a 4-number response takes ~45 tokens, a step up to 11
                        search=dataclasses.replace(Config().search, step_tokens=12, rollout_tokens=48),
                        # any failed attempt (measured: only 4 of 280 traces found one with true steps that misses
                        # the target; the base policy's failed attempts bend a step to land on it)
                        detours_need_visible_mistake=False,
                        trace_sft_steps=50, trace_seq_len=128,  # room for a failed attempt, the reflection and a retry
                        grpo=dataclasses.replace(Config().grpo, max_new_tokens=96),
                        base_sft=recipes.WarmStart(problems=2048, steps=1500, batch_size=32, lr=3e-3, seq_len=64)),
}


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = [config.task]
    tokenizer = astro.make_tokenizer(config)
    heldout_file = recipes.heldout_file(config.eval_file, tokenizer, None,
                                        config.max_seq_len - config.grpo.max_new_tokens, config.grpo)
    base = astro.base_policy(config, tokenizer)
    if not config.rl_steps and heldout_file is not None:  # --rl-steps 0 --eval-data F: the base policy on F only
        return recipes.evaluate_only(run_dir, base, heldout_file, "astro")
    graphdef, params = nnx.split(base)
    searches = astro.make_searches(config, graphdef, tokenizer)
    search = searches["mcts_step_checked" if config.prune_with_step_check else "mcts"]
    held = recipes.heldout(tasks, config.heldout_problems, config.seed, config.prompt_len, config.answer_len,
                           tokenizer=tokenizer)
    base_row = astro.check_base_format(config, base, held, tokenizer, run_dir)  # the format before any search

    # 2. MCTS vs best-of-N at (at least) equal generated tokens, on held-out multi-step problems: ``held`` itself
    # when it holds enough of them (2x: about 2/3 are multi-step), else a longer draw of the held-out stream
    # (not an extension of ``held``: a longer draw gives other problems)
    compare_pool = held if config.heldout_problems >= 2 * config.compare_problems else recipes.heldout(
        tasks, 2 * config.compare_problems, config.seed, config.prompt_len, config.answer_len, tokenizer=tokenizer)
    table = astro.search_vs_sampling(config, {k: searches[k] for k in config.compare_searches}, graphdef, params,
                                     compare_pool, tokenizer)
    print(run_dir.write_table("search_vs_sampling", table))
    comparison = {**{f"base_{k}": base_row[k] for k in ("format_rate", "accuracy", "n")},
                  **{k: v for k, v in table[0].items() if k.endswith(("_solved", "_tokens", "_bon", "_bon_se"))}}
    if config.compare_only:
        return comparison

    # 3. search on training problems -> ASTRO and direct traces
    train, traces, trace_stats = astro.search_stage(config, search, params, tokenizer, run_dir)

    # 4. the arms (ASTRO traces, direct traces, the base policy), each then GRPO
    arms = {**({"base": astro.copy_model(base)} if config.base_arm else {}),
            "astro_sft": astro.sft_on(base, train.problems, traces, config, direct=False, tokenizer=tokenizer),
            "direct_sft": astro.sft_on(base, train.problems, traces, config, direct=True, tokenizer=tokenizer)}
    rows = astro.train_arms(config, arms, held, tokenizer, run_dir, heldout_file)
    print(run_dir.write_table("results", rows))
    by = {r["arm"]: r for r in rows}
    return {**comparison, **trace_stats,
            **{f"{a}_rl_accuracy": by[a]["rl_accuracy"] for a in arms},
            "astro_correct_with_backtrack": by["astro_sft"]["rl_correct_with_backtrack"],
            **astro.arm_difference(by["astro_sft"], by["direct_sft"]),
            "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
