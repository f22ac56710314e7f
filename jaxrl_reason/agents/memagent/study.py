"""The MemAgent study of ``experiments/memagent.py`` (its config, presets and run stay there): the LM and its tokenizer,
the documents at a multiple of the training length, one row of the evaluation vs length (the agents after RL and
after SFT, the full-context reader, the agent's compiled memory and time per document), its figures and the summary.
``config`` is the experiment's config (duck-typed).

    tok = load_tokenizer(config); model = build_lm(config, tok, seq_len)
    rows = [length_row(config, agent, mult, {"rl": (gd, st), "sft": (gd, st)}, (rgd, rst), reader, tok, run_dir)
            for mult in config.multipliers]
    plot_length(run_dir, rows); summary = summarize(rows, run_dir)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_reason.agents.memagent.agent import MemAgent, num_chunks
from jaxrl_reason.agents.memagent.data import doc_batch
from jaxrl_reason.agents.memagent.reader import Reader, fits, run_reader
from jaxrl_reason.agents.memagent.trainer import agent_memory, evaluate_agent
from jaxrl_reason.models.lm import Transformer, pretrained
from jaxrl_reason.models.tokenizer import CharTokenizer, Tokenizer
from jaxrl_reason.rl.grpo.recipes import PolicySource
from jaxrl_reason.tasks.longcontext import exact_match_text
from jaxrl_reason.utils.experiment import RunDir


def load_tokenizer(config) -> Tokenizer:
    """The checkpoint's tokenizer, else the character tokenizer of the presets."""
    return pretrained.load_tokenizer(config.model) if config.model is not None else CharTokenizer()


def build_lm(config, tokenizer: Tokenizer, max_seq_len: int) -> Transformer:
    """A fresh LM with a window of ``max_seq_len`` tokens: the checkpoint's weights (fp32), random weights
    of ``ARCHS[config.arch]`` (activations in ``PolicySource().dtype``), or the tiny ``config.lm``."""
    tiny = dataclasses.replace(config.lm, max_seq_len=max_seq_len).config(tokenizer.vocab_size)
    return PolicySource(config.model, config.arch, max_seq_len).build(tiny, config.seed)


def length_batch(config, agent: MemAgent, mult: int, n: int, stream: int):
    """``n`` documents ``mult`` x the training length (seed stream ``stream``) as the agent's batch."""
    task = config.task.with_length(config.task.num_facts * mult)
    return doc_batch(task.generate_batch(np.random.default_rng([config.seed, stream, mult]), n), agent)


def length_row(config, agent: MemAgent, mult: int, splits: dict, reader_split: tuple, rcfg: Reader,
               tokenizer: Tokenizer, run_dir: RunDir) -> dict:
    """One row of the evaluation vs length at ``mult`` x the training length: each agent's (``splits``: {name:
    (graphdef, state)}) and the reader's (``rcfg``, its ``reader_split``) exact-match accuracy, whether the documents fit the reader's window, the
    "rl" agent's compiled memory and seconds per document; logged at step ``mult`` as ``length/...``."""
    rgd, rst = reader_split
    n = config.eval_docs if mult < 64 else config.eval_docs_long
    batch = length_batch(config, agent, mult, n, 5)
    row = {"x": mult, "chunks": num_chunks(batch.doc.shape[1], agent), "doc_tokens": batch.doc.shape[1]}
    for name, (gd, st) in splits.items():
        row[f"{name}_acc"] = evaluate_agent(gd, st, batch, agent)["accuracy"]
    ans, lens = run_reader(rgd, rst, batch, jax.random.key(0), reader=rcfg)
    row["reader_acc"] = float(exact_match_text(ans, lens, batch.answer, batch.answer_lens, tokenizer).mean())
    row["reader_fits"] = fits(batch, rcfg)
    gd, st = splits["rl"]
    tb = length_batch(config, agent, mult, config.timing_docs, 6)
    mem = agent_memory(gd, st, tb, agent)
    row.update(temp_bytes=mem["temp"], peak_bytes=mem["peak"], doc_bytes=mem["document"])
    row["sec_per_doc"] = evaluate_agent(gd, st, tb, agent, timed=True)["seconds_per_doc"]
    run_dir.log(mult, {f"length/{k}": v for k, v in row.items() if k != "x"})
    print(row, flush=True)
    return row


def plot_length(run_dir: RunDir, rows: list[dict]) -> None:
    """accuracy_vs_length.png, memory_vs_length.png and time_vs_length.png from the rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["x"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for k, lab in (("rl_acc", "MemAgent (SFT + Multi-Conv RL)"), ("sft_acc", "MemAgent (SFT only)"),
                   ("reader_acc", "full-context reader (truncated past window)")):
        ax.plot(xs, [r[k] for r in rows], marker="o", label=lab)
    ax.axvline(1, color="grey", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="document length (x training length)", ylabel="exact-match accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir.path / "accuracy_vs_length.png", dpi=100)
    plt.close(fig)
    for key, fname, ylab in (("mem", "memory_vs_length.png", "bytes (XLA compiled memory analysis)"),
                             ("time", "time_vs_length.png", "seconds per document")):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        if key == "mem":
            for k in ("temp_bytes", "peak_bytes", "doc_bytes"):
                ax.plot(xs, [r[k] for r in rows], marker="o", label=k.replace("_bytes", ""))
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        else:
            ax.plot(xs, [r["sec_per_doc"] for r in rows], marker="o", label="measured")
            ax.plot(xs, [rows[-1]["sec_per_doc"] * x / xs[-1] for x in xs], ls="--", label="linear")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set(xscale="log", xlabel="document length (x training length)", ylabel=ylab)
        fig.tight_layout()
        fig.savefig(run_dir.path / fname, dpi=100)
        plt.close(fig)


def summarize(rows: list[dict], run_dir: RunDir) -> dict:
    """The summary: accuracy at 1x and at every multiple (agent after RL, after SFT, reader), and the memory and time
    ratios of the longest documents to 1x."""
    by, xs = {r["x"]: r for r in rows}, [r["x"] for r in rows]
    first, last = rows[0], rows[-1]
    summary = {
        "rl_acc_1x": first["rl_acc"], "sft_acc_1x": first["sft_acc"], "reader_acc_1x": first["reader_acc"],
        **{f"rl_acc_{m}x": by[m]["rl_acc"] for m in xs}, **{f"sft_acc_{m}x": by[m]["sft_acc"] for m in xs},
        **{f"reader_acc_{m}x": by[m]["reader_acc"] for m in xs},
        "temp_bytes_ratio_last_vs_1x": last["temp_bytes"] / first["temp_bytes"],
        "time_ratio_last_vs_1x": last["sec_per_doc"] / first["sec_per_doc"], "length_ratio": last["x"] / first["x"],
        "run_dir": str(run_dir.path),
    }
    return summary
