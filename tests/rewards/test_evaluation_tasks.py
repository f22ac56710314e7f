"""The synthetic tasks' half of ``rewards.evaluation``: the contamination probe flags a model fine-tuned on the test
split, not a clean one (pass@k and ``reward_eval``: tests/rewards/test_evaluation.py)."""

import pytest

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rewards.evaluation import contamination_probe
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.tasks import RandomCalculation


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
