"""The SPIRAL study of ``experiments/spiral.py`` (its config, presets and run stay there): the LM loaded, the rows of
its results table (vs every fixed opponent, the games' exact evaluations, transfer), the in-training win rates,
the variants' histories, the comparison figure and the summary. ``config`` is the experiment's config (duck-typed).

    model, tok, task_tok = load_lm(config)
    row = evaluate_model(config, graphdef, params, model, games, sampler, key, tok, task_tok)
    run_steps(..., win_rate_eval(config, learner, vcfg, sampler, tok))       # every eval_every steps
    hist, row = variant_row(vdir, vcfg)                                        # its metrics merged by step
    diffs = arm_differences(rows, config.final_eval_episodes)                  # the first variant minus each other
    compare_plot(run_dir, {variant: hist})                                      # compare.png
"""

from __future__ import annotations

import json

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.agents.spiral import evaluation as E
from jaxrl_reason.agents.spiral.rollout import GAMES
from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer
from jaxrl_reason.agents.spiral.warmstart import warm_start
from jaxrl_reason.envs.games import game_spec
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer, Tokenizer
from jaxrl_reason.rewards.evaluation import binomial_se
from jaxrl_reason.rl.grpo.recipes import PolicySource
from jaxrl_reason.utils.checkpoint import Checkpointer
from jaxrl_reason.utils.experiment import RunDir


def load_lm(config) -> tuple[Transformer, Tokenizer, Tokenizer | None]:
    """-> (LM, its tokenizer, the transfer tasks' tokenizer: ``CharTokenizer`` through ``TaskView``, or None for a
    checkpoint, whose tasks are encoded with its own tokenizer). An arch's vocabulary (128256 or 151936 ids) holds
    the byte tokenizer's 264; a checkpoint's pad / bos / eos come from its tokenizer config."""
    from jaxrl_reason.models.lm import load_tokenizer

    source = PolicySource(config.model, config.arch, config.max_seq_len, config.dtype)
    model = source.build(config.lm, config.seed, remat=config.remat)
    if config.model is not None:
        return model, load_tokenizer(config.model), None
    return model, spiral_tokenizer(), CharTokenizer()


def warm_started(config, model: Transformer, games, tok: Tokenizer, run_dir: RunDir) -> int:
    """SPIRAL's SFT warm start of ``model`` (in place; ``warmstart.warm_start``), its NLL logged every 10 steps and
    its weights checkpointed in ``<run>/warm_start``: a resumed run restores them instead of training again
    -> the number of SFT examples."""
    ckpt, info = Checkpointer(run_dir.path / "warm_start"), run_dir.path / "warm_start.json"
    if ckpt.latest_step() is not None and info.exists():
        nnx.update(model, ckpt.restore(nnx.state(model))[1])
        return json.loads(info.read_text())["examples"]
    _, m = warm_start(model, games, config.warm, seed=config.seed, style=config.spiral.prompt_style, tokenizer=tok)
    for i, nll in enumerate(m["nll"]):
        if i % 10 == 0 or i == len(m["nll"]) - 1:
            run_dir.log(i, {"sft/nll": nll})
    ckpt.save(len(m["nll"]), nnx.state(model), force=True)
    run_dir.save_json(info.name, {"examples": int(m["examples"]), "nll": [float(x) for x in m["nll"]]})
    return m["examples"]


def row_once(run_dir: RunDir, name: str, compute) -> dict:
    """``compute()`` (a results row) saved as ``<run>/<name>.json``; a resumed run reads it back instead."""
    path = run_dir.path / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    row = compute()
    run_dir.save_json(path.name, row)
    return row


def evaluate_model(config, graphdef, params, model, games, sampler, key, tokenizer: Tokenizer,
                   task_tokenizer: Tokenizer | None) -> dict:
    """Final evaluation row: vs every fixed opponent of each game, each game's exact evaluations of the LM's
    policy (``GameSpec.evaluations``: Kuhn Poker's exploitability, ...), transfer."""
    row, style = {}, config.spiral.prompt_style
    for game in games:
        for opp in E.OPPONENTS[game]:
            key, sub = jax.random.split(key)
            r = E.win_rates(graphdef, params, game, opp, config.final_eval_episodes, sampler, sub, style,
                            tokenizer=tokenizer)
            for k in ("win", "draw", "loss", "forfeit", "mean_return", "return_se"):
                row[f"{game}_vs_{opp}/{k}"] = r[k]
    for game in games:
        if game_spec(game).evaluations:
            k = E.lm_policy_evaluations(graphdef, params, game, sampler, config.infoset_samples, key, style,
                                        tokenizer=tokenizer)
            for name in (*game_spec(game).evaluations, "valid_rate"):
                row[f"{game}/{name}"] = k[name]
    for task, r in E.transfer_eval(model, config.transfer_problems, max_new_tokens=config.transfer_max_new_tokens,
                                   tokenizer=tokenizer, task_tokenizer=task_tokenizer).items():
        row[f"transfer_{task}/accuracy"] = r["accuracy"]
        row[f"transfer_{task}/format_rate"] = r["format_rate"]
    return row


def win_rate_eval(config, learner, vcfg, sampler, tok: Tokenizer):
    """``run_steps``' evaluation: the LM at this step (every ``eval_every`` steps and before the first) against
    every fixed opponent of the variant's games (``vcfg.games``; random and the expert: minimax, Nash, ...):
    ``<game>/eval_<win|loss|return|forfeit|format_error>_vs_<opponent>`` over ``config.eval_episodes`` games."""
    def win_rates(state):
        step, full = int(state.step), learner.policy(state)
        row = {}
        for g in vcfg.games:
            for i, opp in enumerate(E.OPPONENTS[g]):
                key = jax.random.key(1000 + step)  # vs random: the key of the runs recorded before the experts
                r = E.win_rates(learner.graphdef, full, g, opp, config.eval_episodes, sampler,
                                jax.random.fold_in(key, i) if i else key, vcfg.prompt_style, tokenizer=tok)
                row.update({f"{g}/eval_{k}_vs_{opp}": r[v] for k, v in
                            (("win", "win"), ("loss", "loss"), ("return", "mean_return"), ("forfeit", "forfeit"),
                             ("format_error", "format_error"))})
        return row

    return win_rates


def variant_row(vdir: RunDir, variant: str, vcfg) -> tuple[list[dict], dict]:
    """(a variant's metrics, a step's training row and its evaluation row merged, by step; its results row: the
    gradient norm's mean and std, each game's final response length and format-error rate over the last 5 steps)."""
    by_step = {}
    for r in vdir.read_metrics():  # a step's training row and its evaluation row, merged
        by_step.setdefault(r["step"], {}).update(r)
    curve = [by_step[k] for k in sorted(by_step)]
    hist = [h for h in curve if "grad_norm" in h]  # the training steps
    grad = np.asarray([h["grad_norm"] for h in hist])
    row = {"variant": variant, "grad_norm_mean": float(grad.mean()), "grad_norm_std": float(grad.std())}
    for g in vcfg.games:
        lens = [h[f"{g}/response_length"] for h in hist]
        row[f"{g}/final_response_length"] = float(np.mean(lens[-5:]))
        row[f"{g}/train_format_error_last5"] = float(np.mean([h[f"{g}/format_error"] for h in hist[-5:]]))
    return curve, row


def arm_differences(rows: list[dict], n: int) -> list[dict]:
    """Each variant after self-play minus the first (on the games both played): the final win and forfeit rates
    (SE of two independent proportions over ``n`` games each) and mean return (its ``return_se`` combined) vs every
    fixed opponent, as rows ``{"comparison", "metric", "difference", "se", "n"}``."""
    arms = [r for r in rows if "grad_norm_std" in r]  # the variants' rows (not the checkpoint's or the start's)
    out, a = [], arms[0] if arms else {}
    for b in arms[1:]:
        for key in a:
            if "_vs_" not in key or key not in b:
                continue
            metric = key.rpartition("/")[2]
            if metric in ("win", "forfeit"):
                se = np.hypot(binomial_se(a[key], n), binomial_se(b[key], n))
            elif metric == "mean_return":
                se = np.hypot(a[key.replace("mean_return", "return_se")], b[key.replace("mean_return", "return_se")])
            else:
                continue
            out.append({"comparison": f"{a['variant']} - {b['variant']}", "metric": key,
                        "difference": a[key] - b[key], "se": float(se), "n": n})
    return out


def summarize(rows: list[dict], sft_examples: int, run_dir: RunDir) -> dict:
    """The summary: each row's win / loss / forfeit / mean return vs random, gradient-norm std and the games' exact
    evaluations, as ``"<variant> | <metric>"``."""
    summary = {"results_md": str(run_dir.path / "results.md"), "sft_examples": sft_examples}
    for r in rows:
        for k, v in r.items():
            game, _, name = k.partition("/")
            if "_vs_random/" in k and name in ("win", "loss", "forfeit", "mean_return") or k == "grad_norm_std" \
                    or game in GAMES and name in game_spec(game).evaluations:
                summary[f"{r['variant']} | {k}"] = v
    return summary


def compare_plot(run_dir: RunDir, curves: dict) -> None:
    """``compare.png``: one row per game (its eval win rate vs each fixed opponent, forfeit rate vs random, training
    response length, format-error rate and reward variance) and the gradient norm, every variant on shared axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = {k for h in curves.values() for row in h for k in row}
    games = [g for g in GAMES if any(k.startswith(f"{g}/") for k in keys)]
    rows = [[(f"{g}/eval_win_vs_{opp}", f"{g}: win vs {opp}") for opp in E.OPPONENTS[g]]
            + [(f"{g}/{m}", f"{g}: {t}") for m, t in (("eval_forfeit_vs_random", "forfeit vs random"),
                                                       ("response_length", "response length"),
                                                       ("format_error", "format errors"),
                                                       ("reward_var", "reward variance"))] for g in games]
    rows = [[p for p in r if p[0] in keys] for r in rows] + [[("grad_norm", "grad norm")]]
    cols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(3.4 * cols, 2.8 * len(rows)), squeeze=False)
    for ax_row, panels in zip(axes, rows):
        for ax in ax_row[len(panels):]:
            ax.axis("off")
        for ax, (key, title) in zip(ax_row, panels):
            for variant, hist in curves.items():
                pts = [(h["step"], h[key]) for h in hist if key in h]
                if pts:
                    ax.plot(*zip(*pts), marker="." if "eval" in key else None, label=variant)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir.path / "compare.png", dpi=100)
    plt.close(fig)
