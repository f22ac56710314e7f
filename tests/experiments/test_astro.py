"""experiments/astro.py (its stages in agents/astro.py): the step check on a BPE that spells one token per character, a checkpoint tokenizer
without the R1 tags refused, a run from a checkpoint, the gpu preset built abstractly."""

import dataclasses
import json
import pathlib
import types

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.agents import astro as stages
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer, SpelledTokenizer
from jaxrl_reason.search.lm_mcts import StepSearchConfig, step_ids
from jaxrl_reason.tasks.base import Problem
from jaxrl_reason.tasks.random_calculation import RandomCalculation

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE (every byte one token, merges such as "14") with the R1 tags as special tokens."""
    from jaxrl_reason.models.tokenizer import HFTokenizer

    problems = [RandomCalculation(max_difficulty=3).generate(np.random.default_rng([0, i])) for i in range(300)]
    return HFTokenizer.train_bpe([t for p in problems for t in (p.prompt, p.trace, p.answer)], 300)


@pytest.fixture(scope="module")
def astro():
    from jaxrl_reason.cli import load_experiment

    return load_experiment("astro")


def test_step_check_reads_a_bpe_spelled_one_token_per_character(bpe, astro):
    from jaxrl_reason.tasks.calc_steps import step_checker, step_is_valid

    spelled = SpelledTokenizer(bpe)
    text = "3+4*2=<think>3+4=7,7*2=14</think>"
    assert spelled.encode(text) == [bpe.encode(c)[0] for c in text]  # plain text: one id per character
    ids = spelled.encode(text, allow_special=True)  # control tokens stay single ids
    assert bpe.token_to_id("<think>") in ids and spelled.decode(ids) == text and len(ids) == len(text) - 13
    assert bpe.encode("14") != spelled.encode("14")  # not the canonical tokenization (a merge)
    assert step_ids(spelled) == step_ids(bpe)  # the same ids
    steps = ["3+4=7,", "7*2=15,", "6/4=3/2,", "2*3=06,", "9*9=81</think>", "9*9=18</think>"]
    want = [not step_is_valid(s.removesuffix("</think>")) for s in steps]
    for tok in (spelled, bpe):  # the tables come from per-character encodes: the raw BPE works too
        ids, lens = tok.pad_batch([spelled.encode(s, allow_special=True) for s in steps], 16)
        assert np.asarray(jax.jit(step_checker(tok))(ids, lens)).tolist() == want
    # a generated merge ("15" as one token) is not read, so the step is not judged
    merged = bpe.encode("7*2=15,")
    assert len(merged) < 7
    ids, lens = bpe.pad_batch([merged], 16)
    assert not np.asarray(step_checker(bpe)(ids, lens))[0]


def test_checkpoint_tokenizer_without_the_r1_tags_is_refused(tmp_path, astro):
    """--model with a tokenizer lacking single-token <answer> </answer> (as Qwen3's, which has only <think>
    </think>): one error naming the missing tags, before any weights are read; the search says the same."""
    from jaxrl_reason.models.tokenizer import HFTokenizer

    tok = HFTokenizer.train_bpe(["3+4=7,7*2=14"] * 8, 280, ("<pad>", "<bos>", "<eos>", "<think>", "</think>"))
    tok.save(tmp_path)
    with pytest.raises(ValueError, match=r"\['<answer>', '</answer>'\] as single tokens.*make_start_checkpoint"):
        stages.make_tokenizer(astro.Config(model=str(tmp_path)))
    with pytest.raises(ValueError, match=r"the step search needs \['<answer>', '</answer>'\]"):
        step_ids(tok)
    # spelling needs every printable ASCII character as one token: CharTokenizer has no '"'
    with pytest.raises(ValueError, match="CharTokenizer does not encode '\"' as one token"):
        SpelledTokenizer(CharTokenizer())
    assert SpelledTokenizer(ByteTokenizer()).encode("7,") == ByteTokenizer().encode("7,")


def _checkpoint(bpe, path):
    """The tiny checkpoint: ``bpe`` + a random 1-layer transformers Qwen3ForCausalLM."""
    import torch
    import transformers

    bpe.save(path)
    torch.manual_seed(0)
    hf = transformers.Qwen3Config(vocab_size=bpe.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                  max_position_embeddings=128, tie_word_embeddings=True)
    transformers.Qwen3ForCausalLM(hf).float().eval().save_pretrained(path)
    return path


def test_astro_runs_from_a_checkpoint(bpe, astro, tmp_path):
    """--model: base SFT, search comparison, search traces, trace SFT and three GRPO steps per arm run on a tiny HF
    checkpoint with its BPE tokenizer spelled one token per character; --model wins over --arch. Every arm's GRPO
    evaluates --eval-data (raw <bos> + prompt) before the first step, every 2 steps and after the last (0, 2, 3)."""
    import math

    from jaxrl_reason.data import write_jsonl
    from jaxrl_reason.rl.grpo import recipes
    from jaxrl_reason.utils.experiment import RunDir, read_metrics

    ckpt = _checkpoint(bpe, tmp_path / "ckpt")
    held = write_jsonl([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(2)],
                       tmp_path / "eval.jsonl")
    cfg = astro.Config(
        model=str(ckpt), arch="llama-3.2-1b", task=RandomCalculation(max_difficulty=2, max_operand=9, ops="+-*"),
        base_sft=recipes.WarmStart(problems=16, steps=2, batch_size=4, lr=1e-3, seq_len=48),
        search=StepSearchConfig(num_simulations=2, branching=2, max_depth=2, step_tokens=6, rollout_tokens=12),
        search_batch=2, search_problems=2, compare_problems=2, compare_searches=("mcts",), trace_sft_steps=1,
        trace_seq_len=48,
        grpo=astro.GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=12), rl_steps=3, eval_every=2,
        heldout_problems=4, prompt_len=16, answer_len=8, eval_file=recipes.EvalFile(str(held), eval_samples=2))
    tok = stages.make_tokenizer(cfg)
    assert isinstance(tok, SpelledTokenizer) and tok.vocab_size == bpe.vocab_size
    model = stages.policy_model(cfg, tok)
    assert (model.cfg.vocab_size, model.cfg.d_model, model.cfg.max_seq_len) == (bpe.vocab_size, 32, cfg.max_seq_len)
    # the trace SFT on the checkpoint, failed steps out of the loss: character spans of the spelled trace
    p = Problem(prompt="3+4*2=", answer="11", wrong="12", trace="4*2=9,wrong!back to 0,4*2=8,3+8=11", difficulty=2,
                task="t")
    trace = types.SimpleNamespace(think=p.trace, direct="4*2=8,3+8=11", failed_spans=((0, 6),))
    before = nnx.state(model, nnx.Param)
    tuned = stages.sft_on(model, [p], [trace], dataclasses.replace(cfg, loss_on_failed_steps=False, trace_sft_steps=2), direct=False,
                         tokenizer=tok)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                         jax.tree.leaves(nnx.state(tuned, nnx.Param))))
    summary = astro.run(cfg, RunDir.create("astro", cfg, root=tmp_path / "runs"))
    nums = {k: v for k, v in summary.items() if k != "run_dir"}
    assert {"mcts_solved", "best_of_n_tokens", "base_rl_accuracy", "astro_sft_rl_accuracy", "astro_minus_direct",
            "astro_minus_direct_se", "base_format_rate"} <= set(nums) and nums["heldout_n"] == nums["base_n"] == 4
    assert "mcts_step_checked_solved" not in nums  # only the searches asked for are compared
    assert all(math.isfinite(v) for v in nums.values()), summary
    for arm in ("base", "astro_sft", "direct_sft"):
        arm_dir = pathlib.Path(summary["run_dir"]) / arm
        evals = [r for r in read_metrics(arm_dir / "metrics.jsonl") if "eval_data/accuracy" in r]
        assert [r["step"] for r in evals] == [0, 2, 3] and all(r["eval_data/n"] == 6 for r in evals)
        assert all(r["eval_data/pass@2_n"] == 6 and "eval_data/reward/exact_match_se" in r for r in evals)
        assert (arm_dir / "eval.png").stat().st_size > 0
        samples = json.loads((arm_dir / "samples.json").read_text())["examples"]  # the responses after RL, to read
        assert len(samples) == 4 and all(" -> " in e and e.endswith(("[right]", "[wrong]")) for e in samples)
    base = json.loads((pathlib.Path(summary["run_dir"]) / "base_policy.json").read_text())
    assert base["n"] == 4 and len(base["examples"]) == 4
    # a base policy below min_base_format_rate stops before the search, its evaluation saved
    gate = RunDir.create("astro", cfg, root=tmp_path / "gate")
    with pytest.raises(ValueError, match=r"format rate is 0\.\d+ \(n = 4\) after 2 base SFT steps, below"):
        astro.run(dataclasses.replace(cfg, min_base_format_rate=1.0), gate)
    assert (gate.path / "base_policy.json").exists() and not (gate.path / "search_vs_sampling.md").exists()
    # --rl-steps 0 with --eval-data: the base policy evaluated on the file alone, no search, no arm (issue 51 item 3)
    only = astro.run(dataclasses.replace(cfg, rl_steps=0), RunDir.create("astro", cfg, root=tmp_path / "only"))
    assert only["n"] == only["eval_data"]["n"] == 6 and only["eval_data"]["pass@2_n"] == 6
    assert not (pathlib.Path(only["run_dir"]) / "search_vs_sampling.md").exists()


def test_gpu_preset_builds_llama_3_2_1b_abstractly(astro):
    """The gpu preset: Llama 3.2 1B's shapes (never materialised) with the character tokenizer; the cpu preset
    keeps the tiny LM; every arch constructs; bench_search takes --model / --arch through the astro config."""
    from jaxrl_reason.cli import load_experiment
    from jaxrl_reason.models.lm.hf_import import config_from_hf
    from jaxrl_reason.rl.grpo.recipes import ARCHS

    for name, hf in ARCHS.items():
        model = nnx.eval_shape(lambda hf=hf: Transformer(config_from_hf(hf, max_seq_len=64), rngs=nnx.Rngs(0)))
        assert model.cfg.vocab_size >= TOK.vocab_size, name
    gpu, cpu = astro.PRESETS["gpu"], astro.PRESETS["cpu"]
    assert gpu.arch == "llama-3.2-1b" and gpu.model is None and cpu.arch is None and cpu.model is None
    tok = stages.make_tokenizer(gpu)
    assert isinstance(tok, CharTokenizer)
    model = nnx.eval_shape(lambda: stages.policy_model(gpu, tok))
    assert (model.cfg.vocab_size, model.cfg.d_model, model.cfg.n_layers, model.cfg.max_seq_len) == (
        128256, 2048, 16, gpu.max_seq_len)
    assert Transformer(cpu.lm(tok), rngs=nnx.Rngs(0)).cfg.d_model == cpu.d_model
    with pytest.raises(ValueError, match="unknown arch"):
        astro.Config(arch="llama-70b")
    with pytest.raises(ValueError, match="compare_searches"):
        astro.Config(compare_searches=("mcts", "bfs"))
    bench = load_experiment("bench_search")
    assert bench.Config(model="ckpt", arch="qwen3-0.6b").arch == "qwen3-0.6b"
