"""The trainers on ``rl.lm`` give what they gave before it (``golden.json``, recorded from the code before issue 41):
the same metrics and parameter change within float tolerance. The runs without a KL term and with one epoch of one
minibatch (old log-probs fused into the loss forward, no reference pass) drop only the ``kl`` metrics."""

import pytest

from .golden import RUNS, compare, grpo

KL = ("kl", "kl_ref")


@pytest.mark.parametrize("name, skip", [("grpo_kl_epochs", ()), ("grpo_fused", KL), ("grpo_fused_seq_mean", KL)])
def test_grpo_matches_the_code_before_the_learner_core(name, skip):
    got = RUNS[name]()
    assert not set(skip) & set(got["metrics"])  # no reference pass without a KL term
    compare(name, got, skip=skip)


@pytest.mark.parametrize("remat", ["block", "dots"])
def test_remat_gives_the_same_update(remat):
    compare("grpo_fused", grpo("fused", remat), skip=KL)


@pytest.mark.parametrize("name", ["memagent", "joyagents_joint", "joyagents_nodewise"])
def test_agents_match_the_code_before_the_learner_core(name):
    compare(name, RUNS[name]())


@pytest.mark.parametrize("name", ["spiral", "rally"])
def test_spiral_and_rally_match_the_code_before_the_learner_core(name):
    compare(name, RUNS[name]())
