"""search.best_of_n: best-of-N matched to a token budget per group."""

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.search.best_of_n import matched_best_of_n, take_matched
from jaxrl_reason.tasks.base import make_batch
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.verify import answer_verifier

TOK = CharTokenizer()


def test_take_matched_takes_the_fewest_responses_reaching_each_group_budget():
    ok = np.array([[0, 0, 1], [0, 1, 0], [1, 0, 0]], bool)
    tok = np.array([[5, 5, 5], [10, 10, 10], [4, 4, 4]])
    # group 0 (rows 0, 1) needs a mean of 12 tokens: two responses each (mean 15; one gives 7.5); group 1 needs 1
    solved, tokens = take_matched(ok, tok, np.array([14, 10, 1]), np.array([0, 0, 1]))
    assert solved.tolist() == [False, True, True] and tokens.tolist() == [10, 20, 4]
    assert take_matched(ok, tok, np.array([40, 40, 1]), np.array([0, 0, 1])) is None  # 3 responses: mean 22.5


def test_best_of_n_is_matched_to_the_budget_per_group():
    task = RandomCalculation(max_difficulty=2)
    lm = LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=40)
    graphdef, params = nnx.split(Transformer(lm, rngs=nnx.Rngs(0)))
    batch = make_batch(task, np.random.default_rng(0), 2, 24, 8, tokenizer=TOK)
    budget = np.array([30, 10])
    solved, tokens = matched_best_of_n(graphdef, params, jax.random.key(2), batch, budget, np.array([1, 2]),
                                       max_new_tokens=8, temperature=1.0, verify=answer_verifier(task, TOK),
                                       tokenizer=TOK)
    assert (tokens >= budget).all() and solved.dtype == bool  # one problem per group: at least its own budget
