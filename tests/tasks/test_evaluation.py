"""pass@k estimator, the contamination probe (flags a model fine-tuned on the test split, not a clean one) and
``reward_eval``'s strict score beside the reward's (a warning with sample completions when they diverge)."""

from math import comb

import numpy as np
import pytest

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.rewards import MathVerify
from jaxrl_reason.tasks import evaluation
from jaxrl_reason.tasks.evaluation import contamination_probe, pass_at_k, reward_eval


def test_pass_at_k_matches_combinatorial_formula():
    for n, c, k in [(10, 0, 1), (10, 3, 1), (10, 3, 4), (64, 5, 16), (8, 7, 2), (5, 5, 5)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    np.testing.assert_allclose(pass_at_k(4, np.array([0, 1, 2, 4]), 1), [0, 0.25, 0.5, 1])
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


@pytest.mark.slow
def test_contamination_probe_flags_only_the_contaminated_model():
    task = RandomCalculation(1, 2, 9, "+-*")
    lm = recipes.TinyLM(d_model=48, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64)
    tok = CharTokenizer()
    test = recipes.heldout([task], 16, 0, 24, 12, tok).problems
    other = recipes.sft_problems([task], 16, 1)
    result = {}
    for name, data in (("clean", other), ("contaminated", test)):
        model = recipes.build_model(lm, 0, tok)
        sft_warm_start(model, list(data), 150, 16, 48, 3e-3, prompt_loss=True, tokenizer=tok)
        result[name] = contamination_probe(model, test, tok, 0.6)
    assert result["contaminated"]["completion_exact"] >= 0.3, result  # measured 0.44
    assert result["clean"]["completion_exact"] <= 0.1, result  # measured 0.0


class _Rows:
    """The parts of ``data.PromptDataset`` that ``reward_eval`` reads."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def ids(self, idx):
        return np.zeros((len(idx), 4), np.int32), np.full(len(idx), 4, np.int32)

    def prompt_strings(self, rows):
        return [r["prompt"] for r in rows]


def _reward_eval_on(completions, monkeypatch, reward=MathVerify(), **kw):
    """reward_eval on 64 sums with the model's greedy completions replaced by ``completions(rows)``."""
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in zip(range(10, 74), range(20, 84))]
    monkeypatch.setattr(evaluation, "_generate", lambda model, ids, *a, **k: (None, np.full(len(ids), 3),
                                                                              completions(rows)))
    return reward_eval(None, None, _Rows(rows), reward, 8, batch_size=64, **kw)


def test_reward_eval_reports_strict_accuracy_and_warns_when_a_reward_is_gamed(monkeypatch, caplog):
    # a reward that credits a restated question (as the old free-text math_verify did) vs strict correctness
    restating = lambda prompts, completions, **f: np.ones(len(completions), np.float32)
    restated = lambda rows: [r["prompt"].removeprefix("What is ").rstrip("?") + " is a sum" for r in rows]
    kept = []
    with caplog.at_level("WARNING", logger="jaxrl_reason.tasks.evaluation"):
        res = _reward_eval_on(restated, monkeypatch, restating, on_samples=kept.extend)
    assert res["accuracy"] == 1.0 and res["strict_accuracy"] == 0.0 and res["n"] == 64
    assert "differ by 1.000" in caplog.text and "10 + 20 is a sum" in caplog.text  # names both, shows completions
    assert len(kept) == 4 and kept[0]["extracted"] is None and kept[0]["strict"] is False and kept[0]["reward"] == 1.0

    caplog.clear()
    half = lambda rows: [r["answer"] if i % 2 else f"The answer is {r['answer']}0" for i, r in enumerate(rows)]
    with caplog.at_level("WARNING", logger="jaxrl_reason.tasks.evaluation"):
        res = _reward_eval_on(half, monkeypatch)
    assert res["accuracy"] == res["strict_accuracy"] == 0.5 and res["strict_se"] == pytest.approx(0.0625)
    assert not caplog.text  # they agree: no warning
    assert "strict_accuracy" not in _reward_eval_on(half, monkeypatch, answer_field=None)
