"""pass@k estimator and the contamination probe (flags a model fine-tuned on the test split, not a clean one)."""

from math import comb

import numpy as np
import pytest

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.evaluation import contamination_probe, pass_at_k


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
