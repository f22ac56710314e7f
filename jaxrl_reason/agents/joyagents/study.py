"""The JoyAgents study of ``experiments/joyagents.py`` (its config, presets and run stay there): the agents' LMs and
tokenizer, the request batches, each arm's results row and curves, the updates to reach plain joint GRPO's final
accuracy, the figures, the seed's summary, and the paired comparison over seeds. ``config`` is the experiment's
config (duck-typed).

    tok = load_tokenizer(config); models = initial_models(config, tok)
    held = requests(config, task.generate_batch(rng, n, "heldout", balanced=True), tok)
    row, curve = arm_row(arm_dir, arm, mode, memory, state)      # after run_steps (eval/ and train_eval/ logged)
    updates_to_joint_final(rows, curves); plot_arms(run_dir, curves); summary = seed_summary(run_dir, rows)
    paired_summary(config, run_dir, [(summary, curves) for each seed])   # paired.md/.csv, the seed-mean curves
"""

from __future__ import annotations

import numpy as np

from jaxrl_reason.agents.joyagents.system import requests_from_arrays
from jaxrl_reason.agents.joyagents.trainer import build_models, evaluate, load_models
from jaxrl_reason.models.lm import pretrained
from jaxrl_reason.models.tokenizer import CharTokenizer, Tokenizer
from jaxrl_reason.rl.grpo.recipes import PolicySource, plot_curves, series
from jaxrl_reason.tasks.assistant import TYPES, request_arrays
from jaxrl_reason.utils.experiment import RunDir

# arm -> (mode, memory, group-size multiplier); "joint_4g" is plain joint GRPO with 4G trajectories per request, the
# same number of sampled trajectories per update as node-wise sampling (4 nodes x G): the equal-samples control
ARMS = {"joint": ("joint", False, 1), "joint+memory": ("joint", True, 1), "nodewise": ("nodewise", False, 1),
        "nodewise+memory": ("nodewise", True, 1), "joint_4g": ("joint", False, 4)}


def load_tokenizer(config) -> Tokenizer:
    """The checkpoint's tokenizer, else the character tokenizer of the presets (96 ids)."""
    return pretrained.load_tokenizer(config.model) if config.model is not None else CharTokenizer()


def initial_models(config, tokenizer: Tokenizer) -> list:
    """The system's LM(s) before the SFT warm start: the checkpoint (every model a copy of it), random weights of
    ``ARCHS[config.arch]`` (activations in ``PolicySource().dtype``), or the tiny ``config.lm``; one per agent
    unless ``system.shared``. The window of a checkpoint / arch model is ``system.seq_len``."""
    system = config.system
    if config.model is not None:
        return load_models(config.model, system, tokenizer=tokenizer)
    lm = config.lm if config.arch is None else PolicySource(arch=config.arch, max_seq_len=system.seq_len).arch_config()
    return build_models(lm, system, config.seed, tokenizer=tokenizer)


def requests(config, batch, tokenizer: Tokenizer):
    """Generated requests as the system's arrays (``config.system``'s request and answer lengths)."""
    return requests_from_arrays(request_arrays(batch, config.system.request_tokens, config.system.answer_tokens,
                                               tokenizer))


#: paired comparisons over seeds: (label, arm, baseline arm)
COMPARISONS = (("memory (joint)", "joint+memory", "joint"), ("memory (node-wise)", "nodewise+memory", "nodewise"),
               ("node-wise vs joint", "nodewise", "joint"), ("node-wise vs joint (memory)", "nodewise+memory", "joint+memory"),
               ("node-wise vs equal-samples joint", "nodewise", "joint_4g"))


#: the summary metrics of every paired comparison (held-out, then training-split accuracy)
HEADLINE = ("final_acc", "mean_acc", "train_final_acc", "train_mean_acc")


def paired_summary(config, run_dir: RunDir, per_seed: list) -> dict:
    """Paired differences over seeds (``COMPARISONS``) -> paired.md/.csv, and the seed-mean curves."""
    metrics = (*HEADLINE, *[f"acc_{t}" for t in TYPES])
    rows = []
    for label, arm, base in COMPARISONS:
        if arm not in config.arms or base not in config.arms:
            continue
        for m in metrics:
            d = np.asarray([s[f"{arm}/{m}"] - s[f"{base}/{m}"] for s, _ in per_seed])
            rows.append({"comparison": label, "arm": arm, "baseline": base, "metric": m, "mean_diff": float(d.mean()),
                         "se": float(d.std(ddof=1) / np.sqrt(len(d))), "positive": f"{int((d > 0).sum())}/{len(d)}"})
    print(run_dir.write_table("paired", rows))
    steps = per_seed[0][1][config.arms[0]]["steps"]
    mean_curve = lambda key: {a: (steps, np.mean([c[a][key] for _, c in per_seed], axis=0)) for a in config.arms}
    plot_curves(run_dir.path / "accuracy_vs_updates_mean.png",
                {"held-out accuracy, mean over seeds": mean_curve("acc"),
                 "training-split accuracy, mean over seeds": mean_curve("train_acc")},
                title=f"JoyAgents: {config.seeds} seeds")
    summary = {"paired": rows, "seeds": [s for s, _ in per_seed], "run_dir": str(run_dir.path)}
    run_dir.save_json("summary.json", summary)
    return {"paired": {f"{r['comparison']} | {r['metric']}": f"{r['mean_diff']:+.3f} ± {r['se']:.3f} ({r['positive']})"
                       for r in rows if r["metric"] in HEADLINE}, "run_dir": str(run_dir.path)}


def arm_row(arm_dir: RunDir, arm: str, mode: str, memory: bool, state, joy, held) -> tuple[dict, dict]:
    """An arm's results row (start / final / best / mean held-out accuracy, trajectories, each type's and the route
    accuracy, training-split accuracy; with memory, the final accuracy with it off and its entries) and its curves,
    read from ``arm_dir``'s metrics."""
    # the last logged evaluation is the final one (run_steps evaluates after the last step)
    steps, acc = series(arm_dir, "eval/accuracy")
    _, traj = series(arm_dir, "trajectories")
    _, train_acc = series(arm_dir, "train_eval/accuracy")
    by_type = {t: series(arm_dir, f"eval/accuracy/{t}")[1] for t in TYPES}
    row = {"arm": arm, "mode": mode, "memory": memory, "updates": int(state.step), "start_acc": float(acc[0]),
           "final_acc": float(acc[-1]), "best_acc": float(acc.max()), "mean_acc": float(acc.mean()),
           "trajectories": float(traj.sum()), **{f"acc_{t}": float(by_type[t][-1]) for t in TYPES},
           "route_acc": float(series(arm_dir, "eval/route_accuracy")[1][-1]), "train_final_acc": float(train_acc[-1]),
           "train_mean_acc": float(train_acc.mean())}
    if memory:
        row["final_acc_memory_off"] = evaluate(joy, state, held, use_memory=False)["accuracy"]
        row["memory_entries"] = str(state.agent_carry.entries())
    return row, {"steps": steps, "acc": acc, "train_acc": train_acc,
                 "traj_per_update": float(traj.mean()) if len(traj) else 0.0, **by_type}


def finish_seed(run_dir: RunDir, rows: list[dict], curves: dict) -> dict:
    """A seed's end: each row's updates to reach plain joint GRPO's final accuracy (same memory setting; -1: never),
    the figures (accuracy_vs_updates.png, accuracy_vs_trajectories.png), results.md/.csv and the seed's summary
    (summary.json) -> the summary."""
    ref = {False: next((r for r in rows if r["arm"] == "joint"), None),
           True: next((r for r in rows if r["arm"] == "joint+memory"), None)}
    for r in rows:
        base = ref[r["memory"]]
        if base is not None:
            c = curves[r["arm"]]
            hit = np.nonzero(c["acc"] >= base["final_acc"] - 1e-9)[0]
            r["updates_to_joint_final"] = int(c["steps"][hit[0]]) if len(hit) else -1
    panels = {"held-out accuracy (all types)": {a: (c["steps"], c["acc"]) for a, c in curves.items()},
              "training-split accuracy (all types)": {a: (c["steps"], c["train_acc"]) for a, c in curves.items()}}
    for t in TYPES:
        panels[t] = {a: (c["steps"], c[t]) for a, c in curves.items()}
    plot_curves(run_dir.path / "accuracy_vs_updates.png", panels,
                title="JoyAgents: greedy accuracy vs updates (per type: held-out)")
    plot_curves(run_dir.path / "accuracy_vs_trajectories.png",
                {"held-out accuracy vs sampled trajectories (x = updates x trajectories per update)":
                 {a: (c["steps"] * c["traj_per_update"], c["acc"]) for a, c in curves.items()}})
    print(run_dir.write_table("results", [{k: v for k, v in r.items() if k != "memory_entries"} for r in rows]))
    by = {r["arm"]: r for r in rows}
    summary = {f"{a}/{k}": v for a, r in by.items() for k, v in r.items()
               if k in ("final_acc", "best_acc", "mean_acc", "start_acc", "updates_to_joint_final",
                        "final_acc_memory_off", "train_final_acc", "train_mean_acc",
                        "trajectories", *[f"acc_{t}" for t in TYPES])}
    summary["memories"] = {a: r["memory_entries"] for a, r in by.items() if "memory_entries" in r}
    summary["run_dir"] = str(run_dir.path)
    run_dir.save_json("summary.json", summary)
    return summary
