"""The GRPO-family experiments on the synthetic tasks (r1_zero, prorl, spurious_rewards, lora; ``rl.grpo.recipes``'
``setup_policy`` and ``train``) from a tiny HF checkpoint through the CLI: with no --prompt-len the prompt length is
sized through its chat template with the R1 system message (a too short --prompt-len is one line naming the length
needed), and --eval-data is evaluated before the first step, every --eval-every steps and after the last (3 steps,
every 2: steps 0, 2, 3) in every arm: greedy accuracy with SE and n, pass@k and mean@n, each reward (a function that
excludes rows: its own n), response length, in metrics.jsonl and eval.png."""

import json
import pathlib
import warnings

import numpy as np
import pytest

from jaxrl_reason.cli import run_experiment
from jaxrl_reason.data import load_rows, write_jsonl
from jaxrl_reason.utils.experiment import read_metrics

REWARDS_PY = '''
def longer(completions, *, answer):
    # None (excluded) for the rows with a negative answer
    return [None if a.startswith("-") else float(len(c) >= 3) for c, a in zip(completions, answer)]
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A tiny Qwen3 checkpoint (byte-level BPE, ChatML) at ckpt/, 6 RandomCalculation problems in eval.jsonl and a
    rewards file my_rewards.py."""
    pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from testutil import tiny_hf_checkpoint

    from jaxrl_reason.models.tokenizer import R1_SYSTEM, HFTokenizer
    from jaxrl_reason.rl.grpo.start import CHATML, SPECIAL
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    root = tmp_path_factory.mktemp("family")
    problems = [RandomCalculation(1, 1, 9, "+-*").generate(np.random.default_rng([0, i])) for i in range(200)]
    texts = [R1_SYSTEM] * 20 + [f"{p.prompt} <answer>{p.answer}</answer>" for p in problems]
    tok = HFTokenizer.train_bpe(texts, 400, SPECIAL, eos="<|im_end|>", pad="<pad>", bos="<bos>", chat_template=CHATML)
    tiny_hf_checkpoint(root / "ckpt", tok)
    write_jsonl([{"prompt": p.prompt, "answer": p.answer} for p in problems[:6]], root / "eval.jsonl")
    (root / "my_rewards.py").write_text(REWARDS_PY)
    return root


SMALL = ["--grpo.prompts-per-step", "2", "--grpo.group-size", "2", "--grpo.max-new-tokens", "6", "--logger", "none"]
#: what each experiment needs to run small: its own held-out sets shrunk, one arm where it has a choice
OWN = {"r1_zero": ["--heldout-problems", "4", "--passk-problems", "2", "--passk-samples", "2"],
       "prorl": ["--eval-problems", "4", "--final-samples", "2", "--reset-every", "2"],
       "spurious_rewards": ["--heldout-problems", "4", "--variants", "correct", "--no-contamination-demo"],
       "lora": ["--heldout-problems", "4", "--arms", "lora"]}
ARMS = {"prorl": ["no_reset", "reset"], "spurious_rewards": ["correct"], "lora": ["lora"]}


def check_eval_data(run_path: pathlib.Path, held: list[dict]) -> None:
    """The --eval-data evaluations of one run dir: steps 0, 2 and 3 (3 steps, every 2), every number with its SE and
    n, the function's rows that it excluded left out of its n, and eval.png."""
    evals = [r for r in read_metrics(run_path / "metrics.jsonl") if "eval_data/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    for ev in evals:
        p, n = ev["eval_data/accuracy"], ev["eval_data/n"]
        assert n == len(held) and ev["eval_data/dropped"] == 0
        assert ev["eval_data/se"] == pytest.approx(np.sqrt(p * (1 - p) / n))
        for key in ("pass@1", "pass@2", "mean@2", "reward/exact_match", "reward/longer", "response_length"):
            assert np.isfinite(ev[f"eval_data/{key}"]) and f"eval_data/{key}_se" in ev, key
        assert ev["eval_data/pass@1"] <= ev["eval_data/pass@2"] and ev["eval_data/pass@2_n"] == len(held)
        assert ev["eval_data/reward/exact_match_n"] == len(held)
        assert ev["eval_data/reward/longer_n"] == sum(not r["answer"].startswith("-") for r in held)
        assert 0 < ev["eval_data/response_length"] <= 6 and "eval_data/strict_accuracy" in ev
    assert (run_path / "eval.png").stat().st_size > 0 and (run_path / "eval_samples.jsonl").is_file()


def run_family(name: str, workdir, tmp_path, *extra: str) -> dict:
    return run_experiment(name, ["--run-root", str(tmp_path), "--model", str(workdir / "ckpt"), "--rl-steps", "3",
                                 "--eval-every", "2", "--eval-data", str(workdir / "eval.jsonl"), "--eval-samples",
                                 "2", "--eval-reward", "exact_match", "--eval-reward-fn",
                                 f"{workdir / 'my_rewards.py'}:longer", *OWN[name], *SMALL, *extra])


@pytest.mark.slow  # a refused run, then 3 GRPO steps on a tiny checkpoint and 3 evaluations of 6 rows (~12 s)
def test_r1_zero_sizes_its_prompts_from_the_chat_template_and_evaluates_the_eval_file(workdir, tmp_path):
    from jaxrl_reason.models.lm import load_tokenizer
    from jaxrl_reason.rl.grpo import recipes
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    tok = load_tokenizer(workdir / "ckpt")
    need = recipes.longest_prompt([RandomCalculation(1, 1, 9, "+-*")], tok, recipes.checkpoint_format(tok), 0)
    assert need > 24  # the R1 system message through the chat template: the raw prompts' 24 is too short
    with pytest.raises(SystemExit, match=rf"--prompt-len 24 is too short: the task prompts through the checkpoint's "
                                         rf"chat template need {need} tokens \(give --prompt-len {need + 8}"):
        run_family("r1_zero", workdir, tmp_path / "short", "--prompt-len", "24")
    summary = run_family("r1_zero", workdir, tmp_path)  # no --prompt-len: sized from the prompts
    run_path = pathlib.Path(summary["run_dir"])
    assert json.loads((run_path / "config.json").read_text())["prompt_len"] is None
    check_eval_data(run_path, load_rows(workdir / "eval.jsonl"))
    own = [r["step"] for r in read_metrics(run_path / "metrics.jsonl") if "eval/accuracy" in r]
    assert own == [0, 2, 3]  # the experiment's own held-out evaluation: the same steps


@pytest.mark.slow  # per arm: 3 GRPO steps on a tiny checkpoint, 3 evaluations of 6 rows (~2-10 s a test)
@pytest.mark.parametrize("name", ["prorl", "spurious_rewards", "lora"])
def test_every_arm_evaluates_the_eval_file_at_the_interval_and_at_the_end(workdir, tmp_path, name):
    summary = run_family(name, workdir, tmp_path)
    held = load_rows(workdir / "eval.jsonl")
    for arm in ARMS[name]:
        check_eval_data(pathlib.Path(summary["run_dir"]) / arm, held)


def test_prorl_late_gain_is_nan_without_an_evaluation_in_a_quarter():
    """ProRL's late gain: last quarter's mean minus the second quarter's; NaN, with no numpy warning, when a quarter
    holds no evaluation (a 3-step run evaluated at 0, 2, 3 has none in the second quarter)."""
    from jaxrl_reason.cli import load_experiment

    late_gain = load_experiment("prorl").late_gain
    steps = np.arange(0, 101, 10)
    assert late_gain((steps, steps / 100.0)) == pytest.approx(np.mean([0.8, 0.9, 1.0]) - np.mean([0.3, 0.4, 0.5]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(late_gain((np.array([0, 2, 3]), np.array([0.1, 0.2, 0.3]))))


@pytest.mark.slow  # per experiment: the checkpoint loaded and 6 rows evaluated once, nothing trained (~5 s a test)
@pytest.mark.parametrize("name", ["r1_zero", "prorl", "spurious_rewards", "lora"])
def test_rl_steps_0_evaluates_the_eval_file_alone(workdir, tmp_path, name, capsys):
    """Issue 51 item 3: --rl-steps 0 --model M --eval-data F evaluates F once (its rule printed and in the summary),
    with no arm trained and no task evaluation."""
    summary = run_experiment(name, ["--run-root", str(tmp_path), "--model", str(workdir / "ckpt"), "--rl-steps", "0",
                                    "--eval-data", str(workdir / "eval.jsonl"), "--eval-samples", "2", *OWN[name],
                                    *SMALL])
    run_path = pathlib.Path(summary["run_dir"])
    ev = summary["eval_data"]
    assert ev["n"] == summary["n"] == 6 and ev["accuracy"] == summary["accuracy"] == ev["strict_accuracy"]
    assert ev["pass@2_n"] == 6 and "reward/exact_match" in ev
    assert summary["correct_by"] == "the strict answer match (the extracted final answer against 'answer')"
    assert f"a row of {workdir / 'eval.jsonl'} is correct by the strict answer match" in capsys.readouterr().out
    metrics = read_metrics(run_path / "metrics.jsonl")
    assert [r["step"] for r in metrics if "eval_data/accuracy" in r] == [0] and not any("eval/" in k for r in metrics
                                                                                          for k in r)
    assert (run_path / "eval.png").is_file() and not [p for p in run_path.iterdir() if p.is_dir()]  # no arm
