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
the step search and the character spans of procedure cloning read. ``make_tokenizer`` builds it, ``run`` hands it
to every stage (search, cloning, SFT, GRPO, evaluation).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer, load_tokenizer
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample
from jaxrl_reason.models.tokenizer import R1_TAGS, CharTokenizer, SpelledTokenizer, Tokenizer, with_tokens
from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.search.best_of_n import matched_best_of_n
from jaxrl_reason.search.lm_mcts import StepSearchConfig, make_step_search
from jaxrl_reason.search.procedure_cloning import CloningConfig, clone_procedure, count_backtracks
from jaxrl_reason.tasks import calc_steps
from jaxrl_reason.tasks.base import make_batch, prompt_ids, response_ids
from jaxrl_reason.tasks.countdown import Countdown
from jaxrl_reason.rewards.evaluation import answer_stops
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig
from jaxrl_reason.tasks.verify import answer_verifier, score
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


SEARCHES = ("mcts", "mcts_step_checked", "mcts_step_graded")


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
    # each arm's GRPO also evaluated on a prompt/answer file (raw <bos> + prompt, as the task prompts)
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

    @property
    def max_seq_len(self) -> int:
        """The policy's window: the longest of a search context, an SFT trace and a GRPO sequence."""
        return max(self.search.context_len(self.prompt_len), self.trace_seq_len,
                   self.prompt_len + self.grpo.max_new_tokens)

    def lm(self, tokenizer: Tokenizer) -> LMConfig:
        """The tiny LM (without --model / --arch)."""
        return LMConfig(vocab_size=tokenizer.vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=4,
                        n_kv_heads=4, d_ff=4 * self.d_model, max_seq_len=self.max_seq_len)


#: issue 40: ASTRO from the real pretrained SmolLM2-135M-Instruct (--model smollm2-135m-instruct, a packaged GGUF;
#: its tokenizer gets the four R1 tags, add_r1_tags). The same pipeline and equal budgets as the cpu preset
#: (base SFT on gold traces, search traces with backtracking -> procedure cloning -> SFT, then GRPO on every arm;
#: ASTRO traces vs direct answers at the same SFT and RL steps), held-out greedy accuracy; learning rates for a
#: pretrained model, batches and searches small enough for ~1 hour on a 2-core CPU. The cost is the model's: a
#: trained token ~27 ms of forward + backward on the loaded shared 2-core machine, so base SFT 40 x 8 x 64 tokens,
#: trace SFT 24 x 8 x 112 tokens per arm, RL 8 steps x 16 samples per arm (2-step smoke of this preset: 136 s)
SMOLLM2 = Config(
    model="smollm2-135m-instruct", add_r1_tags=True,
    base_sft=recipes.WarmStart(problems=1024, steps=40, batch_size=8, lr=5e-5, seq_len=64),
    search=StepSearchConfig(num_simulations=8, branching=4, max_depth=4, step_tokens=10, rollout_tokens=32,
                            temperature=1.0),
    search_batch=16, search_problems=48, compare_problems=16, compare_searches=("mcts",), trace_sft_steps=24,
    trace_sft_lr=5e-5,
    grpo=dataclasses.replace(Config().grpo, prompts_per_step=4, group_size=4, lr=1e-6, max_new_tokens=48,
                             remat="block"),
    rl_steps=8, eval_every=4, heldout_problems=128,
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


def make_tokenizer(config: Config) -> Tokenizer:
    """The presets' vocabulary: the 96-id character tokenizer (every prompt, step and answer spelled per
    character, the R1 tags single tokens), which the step check and procedure cloning need. With ``--model``:
    the checkpoint's tokenizer spelled one token per character (``SpelledTokenizer``); its four R1 tags must be
    single tokens (the search writes and parses them inside jit; adding them would resize the model's
    embeddings), else one ValueError naming the missing ones (``HFImportError``: the CLI reports it in one line)."""
    from jaxrl_reason.models.lm.hf_import import HFImportError

    if config.model is None:
        return CharTokenizer()
    inner = load_tokenizer(config.model)
    name = f"the tokenizer of checkpoint {config.model}"
    missing = [t for t in R1_TAGS if inner.single_token_id(t) is None]
    if missing and config.add_r1_tags:
        inner = with_tokens(inner, missing)
    elif missing:
        raise HFImportError(
            f"astro --model: {name} does not have the R1 tags {missing} as single tokens. ASTRO's step search writes "
            "and parses <think> </think> <answer> </answer> as single tokens inside jit, and adding tokens would "
            "resize the model's embeddings. Use a checkpoint whose tokenizer has all four as added tokens (e.g. one "
            "made by jaxrl_reason.rl.grpo.start.make_start_checkpoint, or a model exported with "
            "models.lm.hf_export.save_hf_model and such a tokenizer), --add-r1-tags to add them (new embedding rows), "
            "or --arch NAME for random weights of a recipes.ARCHS configuration with the character tokenizer")
    try:
        return SpelledTokenizer(inner, name)  # "," (the step delimiter) included
    except ValueError as e:
        raise HFImportError(f"astro --model: {e}") from e


def grow_vocab(model: Transformer, vocab_size: int) -> Transformer:
    """``model`` with ``vocab_size`` rows of embedding (and of an untied head): the new rows at the mean of the
    old ones (a new token starts as an average one)."""
    n = model.cfg.vocab_size
    if vocab_size <= n:
        return model
    cfg = dataclasses.replace(model.cfg, vocab_size=vocab_size)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    old = nnx.state(model)

    def grow(new, have):  # the embedding [V, d] and the head's kernel [d, V] grow along their vocabulary axis
        axis = [a for a, (x, y) in enumerate(zip(new.shape, have.shape)) if x != y]
        if not axis:
            return have
        mean = jnp.mean(have, axis=axis[0], keepdims=True)
        return jnp.concatenate([have, jnp.repeat(mean, vocab_size - n, axis=axis[0])], axis=axis[0])

    return nnx.merge(graphdef, jax.tree.map(grow, state, old))


def _until_pad(ids, pad_id: int) -> list[int]:
    """A sampled row up to its first pad (the sampler pads after the response)."""
    ids = list(ids)
    return ids[: ids.index(pad_id)] if pad_id in ids else ids


def evaluate_reasoning(model, tasks, batch, max_new_tokens: int, cloning: CloningConfig, tokenizer: Tokenizer) -> dict:
    """Greedy held-out accuracy (overall, by difficulty), response length and backtrack statistics."""
    out = sample(model, batch.prompts, batch.prompt_lens, jax.random.key(0),
                 SamplerConfig(max_new_tokens=max_new_tokens, temperature=0.0, pad_id=tokenizer.pad_id),
                 stop_tokens=answer_stops(tokenizer))
    correct = score(tasks, batch, out.tokens, out.lengths, tokenizer)["correct"].astype(bool)
    texts = [tokenizer.decode(_until_pad(t, tokenizer.pad_id)) for t in np.asarray(out.tokens).tolist()]
    backs = np.array([count_backtracks(t, cloning) for t in texts])
    diff = np.asarray(batch.difficulty)
    return {
        "accuracy": float(correct.mean()),
        **{f"accuracy_d{d}": float(correct[diff == d].mean()) for d in np.unique(diff)},
        "response_length": float(np.asarray(out.lengths).mean()),
        "backtracks_per_response": float(backs.mean()),
        "correct_with_backtrack": float((correct & (backs > 0)).mean()),
    }


def search_batches(config: Config, search, params, problems_batch):
    """Search every problem in jitted batches of ``config.search_batch`` -> yields (offset, SearchResult)."""
    for i in range(0, len(problems_batch), config.search_batch):
        part = problems_batch.take(range(i, i + config.search_batch))
        yield i, search(params, jax.random.key(config.seed * 1000 + i), part.prompts, part.prompt_lens,
                        part.answers, part.answer_lens)


def search_stats(results) -> dict:
    """SearchResults of consecutive batches -> {"solved": [N] bool, "tokens": [N] generated per problem}."""
    return {k: np.concatenate([np.asarray(getattr(r, k)) for r in results]) for k in ("solved", "tokens")}


def search_traces(config: Config, search, params, problems_batch, tokenizer: Tokenizer) -> tuple[list, dict]:
    """Search every problem -> (cloned traces per problem or None, ``search_stats``)."""
    traces, results = [], []
    for i, res in search_batches(config, search, params, problems_batch):
        results.append(res)
        traces += [clone_procedure(res.tree, b, config.cloning, seed=config.seed + i + b,
                                   shows_mistake=shows_mistake(config.task, problems_batch.problems[i + b])
                                   if config.detours_need_visible_mistake else None, tokenizer=tokenizer)
                   for b in range(len(res.solved))]
    return traces, search_stats(results)


def shows_mistake(task, problem):
    """-> ``check(detour text) -> bool``: the detour shows its mistake. Countdown: its steps are all true and
    the last one's result is not the problem's target (a finished attempt that visibly misses); otherwise:
    the detour step is false (``tasks.calc_steps``)."""
    if isinstance(task, Countdown):
        target = problem.prompt.rsplit(" to ", 1)[1]

        def misses_target(text: str) -> bool:
            steps = [s for s in text.split(",") if s]
            return bool(steps) and all(map(calc_steps.step_is_valid, steps)) and steps[-1].split("=")[-1] != target
        return misses_target
    return lambda text: not calc_steps.step_is_valid(text)


def path_is_valid(trace) -> bool:
    """Every step of the trace's successful path passes the local check (``tasks.calc_steps``)."""
    steps = [s for s in trace.direct.split(",") if s.strip()]
    return bool(steps) and all(calc_steps.step_is_valid(s) for s in steps)


def search_vs_sampling(config: Config, searches: dict, graphdef, params, held, tokenizer: Tokenizer) -> list[dict]:
    """Each search in ``searches`` ({name: search fn}) vs best-of-N on held-out multi-step problems.

    Best-of-N draws whole responses until, per jitted batch and per difficulty within it, its mean
    tokens per problem reach the mean of each problem's largest spend over the searches
    (``search.best_of_n.matched_best_of_n``), so it never has fewer tokens than a search it is compared with, overall or
    in any difficulty row.
    -> table rows: "all", then one per difficulty ({name}_solved / _tokens per problem, and
    {name}_minus_bon / _se: the per-problem paired difference of solved to best-of-N).
    """
    multi = np.flatnonzero(np.asarray(held.difficulty) >= min(config.compare_min_difficulty, config.task.max_difficulty))
    if len(multi) < config.compare_problems:
        raise ValueError(f"only {len(multi)} held-out problems of difficulty >= {config.compare_min_difficulty} for "
                         f"compare_problems={config.compare_problems}")
    compare = held.take(multi[: config.compare_problems])
    found = {name: search_stats([r for _, r in search_batches(config, search, params, compare)])
             for name, search in searches.items()}
    diff = np.asarray(compare.difficulty)
    bon_solved, bon_tokens = [], []
    for i in range(0, config.compare_problems, config.search_batch):
        part = compare.take(range(i, i + config.search_batch))
        budget = np.max([f["tokens"][i: i + config.search_batch] for f in found.values()], axis=0)
        groups = diff[i: i + config.search_batch]
        ok, tok = matched_best_of_n(graphdef, params, jax.random.key(7 + i), part, budget, groups,
                                    max_new_tokens=config.grpo.max_new_tokens, temperature=config.search.temperature,
                                    verify=answer_verifier(config.task, tokenizer), tokenizer=tokenizer)
        bon_solved.append(ok)
        bon_tokens.append(tok)
    found["best_of_n"] = {"solved": np.concatenate(bon_solved), "tokens": np.concatenate(bon_tokens)}
    bon = found["best_of_n"]["solved"].astype(np.float64)

    def row(m):
        out = {"problems": int(m.sum()), **{f"{name}_{k}": float(f[k][m].mean())
                                            for name, f in found.items() for k in ("solved", "tokens")}}
        for name in searches:  # paired by problem: solved(search) - solved(best-of-N), mean and standard error
            d = found[name]["solved"][m].astype(np.float64) - bon[m]
            out[f"{name}_minus_bon"] = float(d.mean())
            out[f"{name}_minus_bon_se"] = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
        return out

    return [{"difficulty": "all", **row(diff > 0)}] + [{"difficulty": int(d), **row(diff == d)} for d in np.unique(diff)]


def sft_on(base: Transformer, problems, traces, config: Config, direct: bool, tokenizer: Tokenizer) -> Transformer:
    """A copy of ``base`` fine-tuned on the cloned traces (ASTRO or direct variant)."""
    data = [(dataclasses.replace(p, trace=t.direct if direct else t.think), () if direct else t.failed_spans)
            for p, t in zip(problems, traces) if t is not None]
    # <bos> prompt <think> trace </think> <answer> answer </answer>, and one more token of room
    fits = [(p, spans) for p, spans in data
            if len(prompt_ids(tokenizer, p)) + len(response_ids(tokenizer, p, trace_special=True)) + 1
            <= config.trace_seq_len]
    model = copy_model(base)
    if not fits:
        print(f"no {'direct' if direct else 'ASTRO'} traces fit: the arm keeps the base model")
        return model
    skip = None if config.loss_on_failed_steps else [spans for _, spans in fits]
    sft_warm_start(model, [p for p, _ in fits], config.trace_sft_steps, config.base_sft.batch_size,
                   config.trace_seq_len, config.trace_sft_lr, seed=config.seed, skip_spans=skip, tokenizer=tokenizer,
                   trace_special=True)  # search traces are model-written: their tags stay tags, as generated
    return model


def copy_model(model: Transformer) -> Transformer:
    """An independent copy (the train steps donate their buffers, so arrays must not be shared)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


def policy_model(config: Config, tokenizer: Tokenizer):
    """The policy before any SFT, with a window of ``config.max_seq_len``: the checkpoint's weights (``--model``,
    fp32), random weights of ``recipes.ARCHS[arch]`` (``--arch``, activations in ``arch_dtype``), or a fresh tiny LM."""
    source = recipes.PolicySource(config.model, config.arch, config.max_seq_len, config.arch_dtype)
    model = source.build(config.lm(tokenizer), config.seed)
    if config.add_r1_tags:  # the tags make_tokenizer added
        model = grow_vocab(model, tokenizer.vocab_size)
    tokenizer.check_model(model.cfg, config.max_seq_len, "astro")
    return model


def policy_name(config: Config) -> str:
    return f"checkpoint {config.model}" if config.model else config.arch or "tiny LM"


def base_policy(config: Config, tokenizer: Tokenizer) -> Transformer:
    """The base policy: ``policy_model`` after the short, partial SFT on gold traces (``config.base_sft``)."""
    base = policy_model(config, tokenizer)
    ws = config.base_sft
    sft_warm_start(base, recipes.sft_problems([config.task], ws.problems, config.seed), ws.steps, ws.batch_size,
                   ws.seq_len, ws.lr, seed=config.seed, tokenizer=tokenizer)
    return base


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = [config.task]
    tokenizer = make_tokenizer(config)
    heldout_file = recipes.heldout_file(config.eval_file, tokenizer, None,
                                        config.max_seq_len - config.grpo.max_new_tokens, config.grpo)
    base = base_policy(config, tokenizer)
    if not config.rl_steps and heldout_file is not None:  # --rl-steps 0 --eval-data F: the base policy on F only
        return recipes.evaluate_only(run_dir, base, heldout_file, "astro")
    graphdef, params = nnx.split(base)
    verify = answer_verifier(config.task, tokenizer)
    step_check = calc_steps.step_checker(tokenizer)
    searches = {"mcts": make_step_search(graphdef, config.search, verify=verify, tokenizer=tokenizer),  # outcome only
                "mcts_step_checked": make_step_search(graphdef, config.search, step_check, verify=verify,
                                                      tokenizer=tokenizer),
                # the step check grades nodes (how far rollouts go before a false step) instead of pruning
                "mcts_step_graded": make_step_search(graphdef, config.search, value_check=step_check, verify=verify,
                                                     tokenizer=tokenizer)}
    search = searches["mcts_step_checked" if config.prune_with_step_check else "mcts"]
    held = recipes.heldout(tasks, config.heldout_problems, config.seed, config.prompt_len, config.answer_len,
                           tokenizer=tokenizer)

    # 2. MCTS vs best-of-N at (at least) equal generated tokens, on held-out multi-step problems: ``held`` itself
    # when it holds enough of them (2x: about 2/3 are multi-step), else a longer draw of the held-out stream
    # (not an extension of ``held``: a longer draw gives other problems)
    compare_pool = held if config.heldout_problems >= 2 * config.compare_problems else recipes.heldout(
        tasks, 2 * config.compare_problems, config.seed, config.prompt_len, config.answer_len, tokenizer=tokenizer)
    table = search_vs_sampling(config, {k: searches[k] for k in config.compare_searches}, graphdef, params,
                               compare_pool, tokenizer)
    print(run_dir.write_table("search_vs_sampling", table))
    comparison = {k: v for k, v in table[0].items() if k.endswith(("_solved", "_tokens", "_bon", "_bon_se"))}
    if config.compare_only:
        return comparison

    # 3. search on training problems -> ASTRO and direct traces
    train = make_batch(tasks, np.random.default_rng([config.seed, 17]), config.search_problems, config.prompt_len,
                       config.answer_len, tokenizer=tokenizer)
    traces, stats = search_traces(config, search, params, train, tokenizer)
    verified = sum(t is not None for t in traces)
    if config.traces_need_valid_steps:  # drop lucky answers reached over arithmetically false steps
        traces = [t if t is not None and path_is_valid(t) else None for t in traces]
    found = [t for t in traces if t is not None]
    examples = [f"{p.prompt} -> {t.think} | {t.answer}" for p, t in zip(train.problems, traces) if t is not None][:8]
    run_dir.save_json("trace_examples.json", {"examples": examples})
    trace_stats = {"search_solved": float(stats["solved"].mean()), "verified_traces": verified, "traces": len(found),
                   "traces_with_detour": sum(t.detours > 0 for t in found)}

    # 4. three arms, each then GRPO
    n = config.grpo.max_new_tokens
    arms = {"base": copy_model(base),
            "astro_sft": sft_on(base, train.problems, traces, config, direct=False, tokenizer=tokenizer),
            "direct_sft": sft_on(base, train.problems, traces, config, direct=True, tokenizer=tokenizer)}
    rows, curves = [], {}
    evaluate = lambda m: evaluate_reasoning(m, tasks, held, n, config.cloning, tokenizer)
    for name, model in arms.items():
        before = evaluate(model)
        arm_dir = run_dir.child(name)
        learner, agent = grpo_for_tasks(config.grpo, model, tokenizer, tasks, config.prompt_len)
        state = recipes.train(arm_dir, learner, agent, learner.init(jax.random.key(config.seed), agent),
                              config.rl_steps, config.eval_every, evaluate, desc=f"astro/{name}",
                              heldout_file=heldout_file)
        after = evaluate(learner.model(state))
        rows.append({"arm": name, **{f"sft_{k}": v for k, v in before.items() if k in ("accuracy", "backtracks_per_response")},
                     **{f"rl_{k}": v for k, v in after.items()}})
        curves[name] = {k: recipes.series(arm_dir, f"eval/{k}") for k in
                        ("accuracy", "backtracks_per_response", "response_length")}
    recipes.plot_curves(run_dir.path / "astro.png", {
        "held-out greedy accuracy": {a: c["accuracy"] for a, c in curves.items()},
        "backtracks per response": {a: c["backtracks_per_response"] for a, c in curves.items()},
        "response length (tokens)": {a: c["response_length"] for a, c in curves.items()},
    }, title=f"ASTRO ({policy_name(config)}, {type(config.task).__name__}): SFT arm then GRPO")
    print(run_dir.write_table("results", rows))
    by = {r["arm"]: r for r in rows}
    return {**comparison, **trace_stats,
            **{f"{a}_rl_accuracy": by[a]["rl_accuracy"] for a in arms},
            "astro_correct_with_backtrack": by["astro_sft"]["rl_correct_with_backtrack"],
            "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
