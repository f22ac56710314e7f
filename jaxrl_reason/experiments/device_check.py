"""Device check: every benchmark's preset at reduced sizes in one run, one table of its headline figures.

On whatever JAX sees (the device kind and count are printed first), each benchmark of ``BENCHES`` is loaded
(``cli.load_experiment``), its ``gpu`` or ``cpu`` preset (``Config.base``) is ``dataclasses.replace``d to
the reduced sizes of ``BENCHES[name].reduce`` and its ``run`` is called under ``run_dir.child(name)``. The
figures of the table are the ones its summary returns (ratio to its anchor, roofline or MFU fraction, or its
own ratio such as batch over one solve); nothing is recomputed here, except the memagent row (its script
returns rows, not a summary: the ratio is its seconds per document per x at the longest document over 1x).

A failing benchmark is one row with ``status`` "error: ..." and the check goes on with the next; an anchor
that is not installed is named in ``note`` (the hf benches then run without it). Rows start while the time
left in ``budget_s`` covers the benchmark's own budget (``BENCHES[name].budget_s[base]``), else
"skipped: budget"; a row that took longer than its budget says so in ``note``. ``strict``: exit nonzero at
the end when a row failed.

    jaxrl-reason run device_check --preset gpu     # the accelerator check (H200: about 6 min)
    jaxrl-reason run device_check --preset cpu     # tiny sizes on the CPU (the test suite runs this)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import runpy
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_reason.cli import available_experiments, load_experiment
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

NAN = float("nan")
replace = dataclasses.replace


def _fig(metric: str, ours=None, anchor=None, ratio=None, unit: str = "") -> dict:
    """One table row's figures (``None`` / NaN: not reported)."""
    return {"metric": metric, "ours": ours, "anchor": anchor, "ratio": ratio, "unit": unit}


# -- figures: a benchmark's summary -> rows ------------------------------------------------------------
def _games(s: dict, c, mod) -> list[dict]:
    rows = [_fig(f"{game} env steps/s, ours / pgx", ratio=s[f"{mod.CASES[game][0][0]}_{sampler}_ratio"],
                 unit=f"ratio ({sampler} sampler)")
            for game in c.games for sampler in (["categorical"] + (["uniform_kth"] if c.sampler == "both" else []))]
    return rows + [_fig(f"gumbel_muzero {c.num_simulations} sims/s, ours / mctx on pgx", ratio=s["search_ratio"],
                        unit="ratio")]


def _hanabi(s: dict, c, mod) -> list[dict]:
    return [_fig(f"hanabi {mode} obs B={b} steps/s, ours / JaxMARL", s[f"ours_{mode}_B{b}"], s.get(f"jaxmarl_B{b}"),
                 s[f"ratio_{mode}_B{b}"], "steps/s")
            for b in c.batch_sizes for mode in c.obs_modes]


def _swarm(s: dict, c, mod) -> list[dict]:
    return [_fig(f"swarm N={r['agents']} B={r['B']} steps/s, ours / JaxMARL simple_tag", r["swarm_steps_per_s"],
                 r["jaxmarl_steps_per_s"], r["ratio"], "steps/s") for r in s["rows"]]


def _search(s: dict, c, mod) -> list[dict]:
    return [_fig("LM MCTS tokens/s / best-of-N tokens/s", s["mcts_tokens_per_s"], s["best_of_n_tokens_per_s"],
                 s["tokens_per_s_ratio"], "tokens/s")]


def _krylov(s: dict, c, mod) -> list[dict]:
    head = f"vmap{c.batch_rhs}_over_one["
    return [_fig(f"{c.batch_rhs} RHS vmapped / one solve, time [{k[len(head):-1]}]", ratio=v, unit="ratio")
            for k, v in s.items() if k.startswith(head)]


def _lm(s: dict, c, mod) -> list[dict]:
    if "decode_roofline_fraction" in s:
        rows = [_fig("decode tokens/s, fraction of the HBM roofline", s["decode_tokens_per_s"], None,
                     s["decode_roofline_fraction"], "tokens/s; roofline fraction")]
    else:
        rows = [_fig("decode tokens/s, ours / HF generate", s["decode_tokens_per_s"], s.get("hf_generate_tokens_per_s"),
                     s.get("ratio_vs_hf"), "tokens/s")]
    if "decode_data_parallel_tokens_per_s" in s:
        rows.append(_fig("decode tokens/s data-parallel, ours / HF generate", s["decode_data_parallel_tokens_per_s"],
                         s.get("hf_generate_tokens_per_s"), s.get("ratio_data_parallel_vs_hf"), "tokens/s"))
    mfu = ("train_mfu", "MFU (peak_flops)") if "train_mfu" in s else ("train_mfu_vs_matmul", "MFU vs a measured matmul")
    rows.append(_fig(f"train tokens/s, {mfu[1]}", s["train_tokens_per_s"], None, s[mfu[0]], "tokens/s; fraction"))
    return rows


def _hf_decode(s: dict, c, mod) -> list[dict]:
    rows = []
    if "ratio_ours_vs_hf" in s:
        rows.append(_fig("greedy decode tokens/s, ours / transformers generate", s["ours_tokens_per_s"],
                         s["hf_tokens_per_s"], s["ratio_ours_vs_hf"], "tokens/s"))
    if "roofline_percent" in s:
        rows.append(_fig("greedy decode tokens/s, fraction of the HBM roofline", s["ours_tokens_per_s"],
                         s["roofline_tokens_per_s"], s["roofline_percent"] / 100, "tokens/s; roofline fraction"))
    return rows or [_fig("greedy decode tokens/s (no anchor, no known peak bandwidth)", s["ours_tokens_per_s"],
                         unit="tokens/s")]


def _grpo(s: dict, c, mod) -> list[dict]:
    text, token = s["text"], s["token"]
    return [_fig("GRPO step s, text rewards (seam) / token-id scoring", text["step_s"], token["step_s"],
                 s["ratio_text_over_token_step"], "s; ratio"),
            _fig("GRPO sampled tokens/s (token arm); ratio = sampling s / step s", token["sampled_tokens_per_s"], None,
                 token["sample_s"] / token["step_s"], "tokens/s; fraction")]


def _selfplay(s: dict, c, mod) -> list[dict]:
    return [_fig(f"self-play episodes/s, on device / Python-driven (same games: {s['same_games']})",
                 s["device_episodes_per_s"], s["python_episodes_per_s"], s["speedup"], "episodes/s"),
            _fig(f"self-play s, rules prefix prefilled once / every prompt whole (tokens equal: "
                 f"{s['whole_token_agreement']:.3f})", s["device_s"], s["device_whole_s"], s["whole_over_shared"], "s")]


def _memagent(rows: list[dict], c, mod) -> list[dict]:
    first, last = rows[0], rows[-1]
    return [_fig(f"memagent s/doc per x at {last['x']}x / at {first['x']}x (1 = linear)", last["sec_per_doc"],
                 first["sec_per_doc"], last["sec_per_doc_per_x"] / first["sec_per_doc_per_x"], "s/doc; ratio")]


def _run_memagent(mod, kwargs: dict, run_dir: RunDir):
    """bench_memagent_scaling is a script (``main(mults, docs)``), not a Config/run experiment."""
    return mod["main"](**kwargs)


def _short_base_sft(steps: int):
    """``prepare`` of bench_search: its astro presets with ``steps`` base-SFT steps (it names an astro preset and
    has no field for them; the gpu preset's 600 steps of a 1B model would take minutes). Patches only the
    bench_search module loaded for this row."""

    def prepare(mod):
        astro = load_experiment("astro")
        for k, a in astro.PRESETS.items():
            astro.PRESETS[k] = replace(a, base_sft=replace(a.base_sft, steps=steps))
        mod.load_experiment = lambda name: astro if name == "astro" else load_experiment(name)

    return prepare


def _load_script(name: str):
    return runpy.run_path(str(available_experiments()[name]))  # its globals; the __main__ block does not run


@dataclasses.dataclass(frozen=True)
class Bench:
    """A row of the check: the experiment, its reduced preset per base (``"gpu"`` / ``"cpu"``), the figures
    of its summary, the anchors it compares with (``no_anchor`` turns the comparison off when they are missing)
    and its time budget per base."""

    module: str
    reduce: dict[str, Callable[[Any], Any]]
    figures: Callable[[Any, Any, Any], list[dict]]
    budget_s: dict[str, float]
    anchors: tuple[str, ...] = ()
    no_anchor: Callable[[Any], Any] | None = None
    script: Callable | None = None  # (module globals, reduced kwargs, run_dir) -> result; for non-experiments
    prepare: dict[str, Callable[[Any], None]] = dataclasses.field(default_factory=dict)  # base -> fn(module)


#: the rows, in order (budget cuts the last ones first); gpu budgets are estimates for an H200 (compilation
#: included, not measured there yet), cpu budgets are the walls measured on the 2-core CPU machine under load
BENCHES: dict[str, Bench] = {
    "games": Bench(
        "bench_games",
        {"gpu": lambda c: replace(c, steps=20, repeats=3, sampler="categorical", num_simulations=32),
         "cpu": lambda c: replace(c, batch_size=256, steps=10, repeats=1, games=("tictactoe",), sampler="categorical",
                                  search_batch=32, num_simulations=8)},
        _games, {"gpu": 45, "cpu": 25}, anchors=("pgx", "mctx")),
    "lm": Bench(
        "bench_lm",
        {"gpu": lambda c: replace(c, new_tokens=128, repeats=2, train_steps=3, fp8_steps=0),
         "cpu": lambda c: replace(c, d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=256, batch=4,
                                  prompt_len=8, new_tokens=8, repeats=1, data_parallel=0, torch_threads=1,
                                  train_batch=2, train_len=32, train_steps=1, train_d_model=64, train_layers=1,
                                  train_vocab=256, train_d_ff=128, train_heads=4, fp8_steps=0)},
        _lm, {"gpu": 60, "cpu": 40}, anchors=("transformers", "torch"), no_anchor=lambda c: replace(c, hf=False)),
    "krylov": Bench(
        "bench_krylov",
        {"gpu": lambda c: replace(c, maxiter=2000, batch_ns=(32,), anchors=False),
         "cpu": lambda c: replace(c, ns=8, restart=16, maxiter=200, batch_rhs=4, batch_ns=(4,), anchors=False)},
        _krylov, {"gpu": 35, "cpu": 80}),
    "search": Bench(
        "bench_search",
        {"gpu": lambda c: replace(c, problems=64, num_samples=16, rounds=1),
         "cpu": lambda c: replace(c, problems=4, num_samples=2, rounds=1)},
        _search, {"gpu": 75, "cpu": 70}, prepare={"gpu": _short_base_sft(50), "cpu": _short_base_sft(20)}),
    "hanabi": Bench(
        "bench_hanabi",
        {"gpu": lambda c: replace(c, batch_sizes=(65536,), steps=20, repeats=3, obs_modes=("canonical",)),
         "cpu": lambda c: replace(c, batch_sizes=(64,), steps=5, repeats=1, obs_modes=("canonical",))},
        _hanabi, {"gpu": 35, "cpu": 35}, anchors=("jaxmarl",)),
    "swarm": Bench(
        "bench_swarm",
        {"gpu": lambda c: replace(c, agent_counts=(4, 64), steps=20, repeats=3),
         "cpu": lambda c: replace(c, agent_counts=(4,), batches=(64,), steps=5, repeats=1)},
        _swarm, {"gpu": 30, "cpu": 20}, anchors=("jaxmarl",)),
    "hf_decode": Bench(
        "bench_hf_decode",
        {"gpu": lambda c: replace(c, new_tokens=64, rounds=2),
         "cpu": lambda c: replace(c, vocab_size=256, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                                  d_ff=128, batch=2, prompt_len=8, new_tokens=8, rounds=1)},
        _hf_decode, {"gpu": 35, "cpu": 15}, anchors=("transformers", "torch"),
        no_anchor=lambda c: replace(c, hf=False)),
    "grpo": Bench(
        "bench_grpo",
        {"gpu": lambda c: replace(c, new_tokens=128, steps=1),
         "cpu": lambda c: replace(c, prompts=2, group_size=2, new_tokens=8, steps=1)},
        _grpo, {"gpu": 50, "cpu": 25}),
    "selfplay": Bench(
        "bench_selfplay",
        {"gpu": lambda c: replace(c, num_episodes=256, warm=replace(c.warm, steps=100), repeats=1),
         "cpu": lambda c: replace(c, num_episodes=2, max_new_tokens=8, warm=replace(c.warm, games_per_game=8, steps=5,
                                                                                   batch_size=4), repeats=1)},
        _selfplay, {"gpu": 40, "cpu": 40}),
    "memagent": Bench(
        "bench_memagent_scaling",
        {"gpu": lambda kw: {"mults": (1, 16), "docs": 8}, "cpu": lambda kw: {"mults": (1, 2), "docs": 1}},
        _memagent, {"gpu": 20, "cpu": 20}, script=_run_memagent),
}


@dataclasses.dataclass(frozen=True)
class Config:
    base: str = "cpu"  # each benchmark's preset reduced here: "gpu" or "cpu"
    benchmarks: tuple[str, ...] = tuple(BENCHES)
    budget_s: float = 300.0  # total: a row starts only while its own budget fits in what is left
    strict: bool = False  # exit nonzero after the table when a row failed

    def __post_init__(self):
        check_hyperparameters(self)
        if self.base not in ("gpu", "cpu"):
            raise ValueError(f"base must be 'gpu' or 'cpu', got {self.base!r}")
        unknown = set(self.benchmarks) - set(BENCHES)
        if unknown or not self.benchmarks:
            raise ValueError(f"benchmarks: one or more of {sorted(BENCHES)}, got {self.benchmarks}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")


PRESETS = {
    "gpu": Config(base="gpu", budget_s=450.0),  # 8 min on an H200 with start-up and the table
    "cpu": Config(base="cpu", budget_s=600.0),  # all rows: about 4 min on the loaded 2-core machine
}


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def run_bench(name: str, base: str, run_dir: RunDir) -> tuple[list[dict], str]:
    """Run one benchmark reduced; ``(figure rows, note)``. Raises what the benchmark raises."""
    bench = BENCHES[name]
    missing = _missing(bench.anchors)
    note = f"not installed: {', '.join(missing)}" if missing else ""
    if bench.script is not None:
        mod, config = _load_script(bench.module), bench.reduce[base]({})
        result = bench.script(mod, config, run_dir)
    else:
        mod = load_experiment(bench.module)
        config = bench.reduce[base](mod.PRESETS[base])
        if base in bench.prepare:
            bench.prepare[base](mod)
        if missing and bench.no_anchor is not None:
            config = bench.no_anchor(config)
        result = mod.run(config, run_dir)
    return bench.figures(result, config, mod), note


def _finite_positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def run(config: Config, run_dir: RunDir) -> dict:
    devices = jax.devices()
    kind = str(devices[0].device_kind)
    print(f"device: {kind} x {len(devices)} ({jax.default_backend()}); base presets: {config.base}", flush=True)
    rows, start = [], time.perf_counter()
    for name in config.benchmarks:
        budget = BENCHES[name].budget_s[config.base]
        left = config.budget_s - (time.perf_counter() - start)
        head = {"benchmark": name}
        if budget > left:
            rows.append({**head, **_fig(""), "wall_s": 0.0, "cpu_s": 0.0, "status": "skipped: budget",
                         "note": f"needs ~{budget:.0f} s, {max(left, 0):.0f} s left"})
            print(f"[device_check] {name}: skipped (budget)", flush=True)
            continue
        print(f"[device_check] {name} ...", flush=True)
        t, c = time.perf_counter(), time.process_time()
        child = run_dir.child(name)
        try:
            figures, note = run_bench(name, config.base, child)
            status = None
        except Exception as err:  # noqa: BLE001 - one failing benchmark is a row, not the end of the check
            traceback.print_exc()
            figures, note, status = [_fig("")], "", f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        finally:
            child.close()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        if wall > budget:
            note = "; ".join(filter(None, [note, f"over its budget ({budget:.0f} s)"]))
        for f in figures:
            ok = _finite_positive(f["ratio"]) or _finite_positive(f["ours"])
            rows.append({**head, **f, "wall_s": wall, "cpu_s": cpu, "note": note,
                         "status": status or ("ok" if ok else "error: no finite figure")})
        print(f"[device_check] {name}: {wall:.1f} s, {status or 'ok'}", flush=True)
    total = time.perf_counter() - start
    table = [{k: ("" if v is None else v) for k, v in r.items()} for r in rows]
    print(f"device: {kind} x {len(devices)}; {total:.0f} s in all")
    print(run_dir.write_table("device_check", table))
    count = lambda prefix: sum(r["status"].startswith(prefix) for r in rows)
    summary = {"device": kind, "device_count": len(devices), "backend": jax.default_backend(), "base": config.base,
               "wall_s": total, "rows_ok": count("ok"), "rows_failed": count("error"),
               "rows_skipped": count("skipped"), "rows": table}
    if config.strict and summary["rows_failed"]:
        run_dir.save_json("summary", summary)
        raise SystemExit(f"device_check: {summary['rows_failed']} row(s) failed; see {run_dir.path}/device_check.md")
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
