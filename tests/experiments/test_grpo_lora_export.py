"""The grpo experiment with --lora-rank ends with both exports: hf/ (adapters merged) and adapter/ (a PEFT adapter on
the --model checkpoint), and peft loads the adapter on that checkpoint with hf/'s logits."""

import json
import pathlib

import numpy as np
import pytest

from jaxrl_reason.cli import run_experiment
from jaxrl_reason.data.loading import write_jsonl
from jaxrl_reason.models.tokenizer import HFTokenizer


@pytest.mark.slow  # a tiny checkpoint, 1 GRPO step of 4 samples, rank-2 adapters, 2 evaluations (~35 s busy)
def test_grpo_lora_run_exports_merged_and_a_peft_adapter(tmp_path):
    transformers, peft = pytest.importorskip("transformers"), pytest.importorskip("peft")
    from testutil import hf_logits, rel_error, tiny_hf_checkpoint

    from jaxrl_reason.rl.grpo.start import CHATML, SPECIAL

    rows = [{"question": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(8) for b in range(5)]
    write_jsonl(rows, tmp_path / "train.jsonl")
    texts = [r["question"] + " <answer>" + r["answer"] + "</answer>" for r in rows] * 4
    tok = HFTokenizer.train_bpe(texts, 300, SPECIAL, eos="<|im_end|>", pad="<pad>", bos="<bos>", chat_template=CHATML)
    ckpt = tiny_hf_checkpoint(tmp_path / "ckpt", tok, max_positions=128)
    (tmp_path / "spread.py").write_text(  # a reward that differs within a group: non-zero advantages, B moves
        "def spread(prompts, completions):\n    return [float(sum(map(ord, c)) % 7) for c in completions]\n")
    summary = run_experiment("grpo", [
        "--run-root", str(tmp_path / "runs"), "--model", str(ckpt), "--data", str(tmp_path / "train.jsonl"),
        "--prompt-field", "question", "--reward-fn", f"{tmp_path / 'spread.py'}:spread", "--steps", "1",
        "--lora-rank", "2", "--lora-alpha", "4", "--grpo.lr", "0.05",
        "--grpo.prompts-per-step", "2", "--grpo.group-size", "2", "--grpo.max-new-tokens", "6", "--logger", "none"])
    run = pathlib.Path(summary["run_dir"])
    assert (summary["hf"], summary["adapter"]) == (str(run / "hf"), str(run / "adapter"))
    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (2, 4, str(ckpt))
    assert set(config["target_modules"]) == {f"self_attn.{p}_proj" for p in "qkvo"} | {
        f"mlp.{p}_proj" for p in ("gate", "up", "down")}  # --lora-targets all_linear

    toks = np.random.default_rng(0).integers(0, tok.vocab_size, (2, 10))
    base = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    before = hf_logits(base, toks)
    adapted = hf_logits(peft.PeftModel.from_pretrained(base, run / "adapter"), toks)
    merged = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(run / "hf"), toks)
    assert rel_error(adapted, before) > 1e-4  # the step moved the adapters
    assert rel_error(adapted, merged) < 1e-5
