"""ASTRO at small scale (``experiments/astro.py`` holds the config, the presets and the run): step-level MCTS over an
LM, procedure cloning of its search trees into linear chains of thought, SFT on them, then GRPO. ``config`` below is
the experiment's config (duck-typed: ``seed``, ``task``, ``search``, ``cloning``, ``grpo`` and the stage sizes).

    tokenizer = make_tokenizer(config)                  # the character tokenizer, or --model's spelled per character
    base = base_policy(config, tokenizer)               # policy_model + the short SFT on gold traces
    searches = make_searches(config, graphdef, tokenizer)    # {"mcts", "mcts_step_checked", "mcts_step_graded"}
    table = search_vs_sampling(config, searches, graphdef, params, held, tokenizer)   # vs best-of-N, equal tokens
    train, traces, stats = search_stage(config, search, params, tokenizer, run_dir)  # ASTRO and direct traces
    rows = train_arms(config, arms, held, tokenizer, run_dir, heldout_file)            # each arm, then GRPO

With ``--model`` the checkpoint's tokenizer spells plain text one token per character (``SpelledTokenizer``), which
the in-jit step check, the step search and the character spans of procedure cloning read; its four R1 tags must be
single tokens (``add_r1_tags`` adds the missing ones, ``models.lm.model.grow_vocab`` growing the embeddings).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import Transformer, load_tokenizer
from jaxrl_reason.models.lm.model import grow_vocab
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample
from jaxrl_reason.models.tokenizer import R1_TAGS, CharTokenizer, SpelledTokenizer, Tokenizer, with_tokens
from jaxrl_reason.rewards.evaluation import answer_stops, binomial_se
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.agent import grpo_for_tasks
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.search.best_of_n import matched_best_of_n
from jaxrl_reason.search.lm_mcts import make_step_search
from jaxrl_reason.search.procedure_cloning import CloningConfig, clone_procedure, count_backtracks
from jaxrl_reason.tasks import calc_steps
from jaxrl_reason.tasks.base import make_batch, prompt_ids, response_ids
from jaxrl_reason.tasks.countdown import Countdown
from jaxrl_reason.tasks.verify import answer_verifier, score
from jaxrl_reason.utils.experiment import RunDir

#: the searches compared with best-of-N: outcome verifier only; the step check pruning candidates; grading nodes
SEARCHES = ("mcts", "mcts_step_checked", "mcts_step_graded")


def make_tokenizer(config) -> Tokenizer:
    """The presets' vocabulary: the 96-id character tokenizer (every prompt, step and answer spelled per
    character, the R1 tags single tokens), which the step check and procedure cloning need. With ``--model``:
    the checkpoint's tokenizer spelled one token per character (``SpelledTokenizer``); its four R1 tags are
    ``config.tag_words`` (words the checkpoint already has: plain text it reads and writes with its own rows),
    else its own single tokens (the search writes and parses them inside jit), else ``add_r1_tags`` adds them
    (new rows), else one ValueError naming the missing ones (``HFImportError``: the CLI reports it in one line)."""
    from jaxrl_reason.models.lm.hf_import import HFImportError

    if config.model is None:
        return CharTokenizer()
    inner = load_tokenizer(config.model)
    name = f"the tokenizer of checkpoint {config.model}"
    tags = dict(zip(R1_TAGS, config.tag_words)) if config.tag_words else None
    missing = [t for t in R1_TAGS if inner.single_token_id(t) is None]
    if missing and config.add_r1_tags:
        inner = with_tokens(inner, missing)
    elif missing and not tags:
        raise HFImportError(
            f"astro --model: {name} does not have the R1 tags {missing} as single tokens. ASTRO's step search writes "
            "and parses <think> </think> <answer> </answer> as single tokens inside jit. Name four words the "
            "checkpoint has as single tokens with --tag-words (e.g. ' Steps' ' So' ' answer' ' Done': plain text "
            "it already reads), use a checkpoint whose tokenizer has all four as added tokens (e.g. one made by "
            "jaxrl_reason.rl.grpo.start.make_start_checkpoint), --add-r1-tags to add them (new embedding rows, "
            "which a short fine-tune does not teach), or --arch NAME for random weights of a recipes.ARCHS "
            "configuration with the character tokenizer")
    try:
        return SpelledTokenizer(inner, name, tags=tags)  # "," (the step delimiter) included
    except ValueError as e:
        raise HFImportError(f"astro --model: {e}") from e


#: held-out responses kept to read (``base_policy.json``, each arm's ``samples.json`` after RL)
SAMPLES_TO_READ = 8


def _until_pad(ids, pad_id: int) -> list[int]:
    """A sampled row up to its first pad (the sampler pads after the response)."""
    ids = list(ids)
    return ids[: ids.index(pad_id)] if pad_id in ids else ids


def evaluate_reasoning(model, tasks, batch, max_new_tokens: int, cloning: CloningConfig, tokenizer: Tokenizer,
                       examples: int = 0) -> dict:
    """Greedy held-out accuracy (overall, by difficulty), response length and backtrack statistics; with
    ``examples`` = K also ``"examples"``: the first K problems' ``"prompt -> response [right|wrong]"`` (to read)."""
    out = sample(model, batch.prompts, batch.prompt_lens, jax.random.key(0),
                 SamplerConfig(max_new_tokens=max_new_tokens, temperature=0.0, pad_id=tokenizer.pad_id),
                 stop_tokens=answer_stops(tokenizer))
    scores = score(tasks, batch, out.tokens, out.lengths, tokenizer)
    correct = scores["correct"].astype(bool)
    texts = [tokenizer.decode(_until_pad(t, tokenizer.pad_id)) for t in np.asarray(out.tokens).tolist()]
    backs = np.array([count_backtracks(t, cloning) for t in texts])
    diff = np.asarray(batch.difficulty)
    return {
        "accuracy": float(correct.mean()),
        "format_rate": float(scores["formatted"].mean()),  # the whole response <think>..</think><answer>..</answer>
        "n": int(correct.size),
        **{f"accuracy_d{d}": float(correct[diff == d].mean()) for d in np.unique(diff)},
        "response_length": float(np.asarray(out.lengths).mean()),
        "backtracks_per_response": float(backs.mean()),
        "correct_with_backtrack": float((correct & (backs > 0)).mean()),
        **({"examples": [f"{p.prompt} -> {t} [{'right' if c else 'wrong'}]"
                         for p, t, c in zip(batch.problems[:examples], texts, correct)]} if examples else {}),
    }


def search_batches(config, search, params, problems_batch):
    """Search every problem in jitted batches of ``config.search_batch`` -> yields (offset, SearchResult)."""
    for i in range(0, len(problems_batch), config.search_batch):
        part = problems_batch.take(range(i, i + config.search_batch))
        yield i, search(params, jax.random.key(config.seed * 1000 + i), part.prompts, part.prompt_lens,
                        part.answers, part.answer_lens)


def search_stats(results) -> dict:
    """SearchResults of consecutive batches -> {"solved": [N] bool, "tokens": [N] generated per problem}."""
    return {k: np.concatenate([np.asarray(getattr(r, k)) for r in results]) for k in ("solved", "tokens")}


def search_traces(config, search, params, problems_batch, tokenizer: Tokenizer) -> tuple[list, dict]:
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


def search_vs_sampling(config, searches: dict, graphdef, params, held, tokenizer: Tokenizer) -> list[dict]:
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


def sft_on(base: Transformer, problems, traces, config, direct: bool, tokenizer: Tokenizer) -> Transformer:
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


def policy_model(config, tokenizer: Tokenizer):
    """The policy before any SFT, with a window of ``config.max_seq_len``: the checkpoint's weights (``--model``,
    fp32), random weights of ``recipes.ARCHS[arch]`` (``--arch``, activations in ``arch_dtype``), or a fresh tiny LM."""
    source = recipes.PolicySource(config.model, config.arch, config.max_seq_len, config.arch_dtype)
    model = source.build(config.lm(tokenizer), config.seed)
    if config.add_r1_tags:  # the tags make_tokenizer added
        model = grow_vocab(model, tokenizer.vocab_size)
    tokenizer.check_model(model.cfg, config.max_seq_len, "astro")
    return model


def policy_name(config) -> str:
    return f"checkpoint {config.model}" if config.model else config.arch or "tiny LM"


def base_policy(config, tokenizer: Tokenizer) -> Transformer:
    """The base policy: ``policy_model`` after the short, partial SFT on gold traces (``config.base_sft``)."""
    base = policy_model(config, tokenizer)
    ws = config.base_sft
    sft_warm_start(base, recipes.sft_problems([config.task], ws.problems, config.seed), ws.steps, ws.batch_size,
                   ws.seq_len, ws.lr, seed=config.seed, tokenizer=tokenizer)
    return base


def check_base_format(config, base: Transformer, held, tokenizer: Tokenizer, run_dir: RunDir) -> dict:
    """The base policy on the held-out problems (``evaluate_reasoning``, greedy), saved as ``base_policy.json``;
    ValueError when its format rate is below ``config.min_base_format_rate`` (search and cloning need answers in
    the R1 format: a longer base SFT, ``--base-sft.steps``)."""
    row = evaluate_reasoning(base, [config.task], held, config.grpo.max_new_tokens, config.cloning, tokenizer,
                             examples=SAMPLES_TO_READ)
    run_dir.save_json("base_policy.json", row)
    print(f"base policy after its SFT: format rate {row['format_rate']:.3f}, accuracy {row['accuracy']:.3f} "
          f"(n = {row['n']})")
    if row["format_rate"] < config.min_base_format_rate:
        raise ValueError(f"the base policy's held-out format rate is {row['format_rate']:.3f} (n = {row['n']}) after "
                         f"{config.base_sft.steps} base SFT steps, below min_base_format_rate = "
                         f"{config.min_base_format_rate}: lengthen the base SFT (--base-sft.steps) or raise its lr")
    return row


def make_searches(config, graphdef, tokenizer: Tokenizer) -> dict:
    """{name: jitted step search} for every name of ``SEARCHES``, each verifying answers by the task's verifier."""
    verify = answer_verifier(config.task, tokenizer)
    step_check = calc_steps.step_checker(tokenizer)
    return {"mcts": make_step_search(graphdef, config.search, verify=verify, tokenizer=tokenizer),  # outcome only
            "mcts_step_checked": make_step_search(graphdef, config.search, step_check, verify=verify,
                                                  tokenizer=tokenizer),
            # the step check grades nodes (how far rollouts go before a false step) instead of pruning
            "mcts_step_graded": make_step_search(graphdef, config.search, value_check=step_check, verify=verify,
                                                 tokenizer=tokenizer)}


def search_stage(config, search, params, tokenizer: Tokenizer, run_dir: RunDir) -> tuple:
    """Stage 3: search ``config.search_problems`` training problems -> (the problems' batch, ASTRO / direct traces
    per problem or None, trace statistics); with ``traces_need_valid_steps`` only traces whose successful path
    passes the step check; the first 8 traces in ``trace_examples.json``."""
    train = make_batch([config.task], np.random.default_rng([config.seed, 17]), config.search_problems,
                       config.prompt_len, config.answer_len, tokenizer=tokenizer)
    traces, stats = search_traces(config, search, params, train, tokenizer)
    verified = sum(t is not None for t in traces)
    if config.traces_need_valid_steps:  # drop lucky answers reached over arithmetically false steps
        traces = [t if t is not None and path_is_valid(t) else None for t in traces]
    found = [t for t in traces if t is not None]
    examples = [f"{p.prompt} -> {t.think} | {t.answer}" for p, t in zip(train.problems, traces) if t is not None][:8]
    run_dir.save_json("trace_examples.json", {"examples": examples})
    trace_stats = {"search_solved": float(stats["solved"].mean()), "verified_traces": verified, "traces": len(found),
                   "traces_with_detour": sum(t.detours > 0 for t in found)}
    return train, traces, trace_stats


def train_arms(config, arms: dict, held, tokenizer: Tokenizer, run_dir: RunDir, heldout_file=None) -> list[dict]:
    """Stage 4: each arm ({name: model}) evaluated (greedy, ``evaluate_reasoning``), trained by GRPO in
    ``run_dir/<name>`` and evaluated again -> the results rows; ``astro.png`` draws the arms' held-out curves."""
    tasks, n = [config.task], config.grpo.max_new_tokens
    rows, curves = [], {}
    evaluate = lambda m, examples=0: evaluate_reasoning(m, tasks, held, n, config.cloning, tokenizer, examples)
    for name, model in arms.items():
        before = evaluate(model)
        arm_dir = run_dir.child(name)
        learner, agent = grpo_for_tasks(config.grpo, model, tokenizer, tasks, config.prompt_len)
        state = recipes.train(arm_dir, learner, agent, learner.init(jax.random.key(config.seed), agent),
                              config.rl_steps, config.eval_every, evaluate, desc=f"astro/{name}",
                              heldout_file=heldout_file)
        after = evaluate(learner.model(state), SAMPLES_TO_READ)
        arm_dir.save_json("samples.json", {"examples": after.pop("examples")})
        rows.append({"arm": name, **{f"sft_{k}": v for k, v in before.items()
                                     if k in ("accuracy", "format_rate", "backtracks_per_response")},
                     **{f"rl_{k}": v for k, v in after.items()}})
        curves[name] = {k: recipes.series(arm_dir, f"eval/{k}") for k in
                        ("accuracy", "backtracks_per_response", "response_length")}
    recipes.plot_curves(run_dir.path / "astro.png", {
        "held-out greedy accuracy": {a: c["accuracy"] for a, c in curves.items()},
        "backtracks per response": {a: c["backtracks_per_response"] for a, c in curves.items()},
        "response length (tokens)": {a: c["response_length"] for a, c in curves.items()},
    }, title=f"ASTRO ({policy_name(config)}, {type(config.task).__name__}): SFT arm then GRPO")
    return rows


def arm_difference(astro_row: dict, direct_row: dict) -> dict:
    """ASTRO-SFT + RL minus direct-SFT + RL in held-out accuracy after RL (``train_arms``' rows), with the SE of two
    independent proportions over the ``n`` held-out problems each arm answered."""
    a, d, n = astro_row["rl_accuracy"], direct_row["rl_accuracy"], astro_row["rl_n"]
    return {"astro_minus_direct": a - d, "astro_minus_direct_se": float(np.hypot(binomial_se(a, n), binomial_se(d, n))),
            "heldout_n": n}
