"""search/procedure_cloning.py: ASTRO's search trees written out as reasoning with detours and backtracks,
and the SFT batches that skip a detour's failed-step targets."""

import types

import numpy as np
import pytest

from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.search.procedure_cloning import CloningConfig, clone_procedure, count_backtracks
from jaxrl_reason.tasks.base import Problem, sft_batch

TOK = CharTokenizer()


def _encode(text):
    """Model-written text: the R1 tags in it are the control tokens (as the model emits them)."""
    return TOK.encode(text, allow_special=True)


def _decode(ids):
    return TOK.decode(np.asarray(ids).tolist())


def _pad(text, n):
    ids = _encode(text)
    return np.array(ids + [TOK.pad_id] * (n - len(ids))), len(ids)


def _fake_tree():
    """root -> {1: '3+4=8,' (failed), 2: '3+4=7,'}; 2 -> {3: '7*2=14</think>' (verified), 4: '7*2=15</think>' (failed)}."""
    responses = ["<think>", "<think>3+4=8,", "<think>3+4=7,", "<think>3+4=7,7*2=14</think>",
                 "<think>3+4=7,7*2=15</think>"]
    rollouts = ["9</think><answer>9</answer>", "8</think><answer>8</answer>", "7*2=14</think><answer>14</answer>",
                "<answer>14</answer>", "<answer>15</answer>"]
    resp, rlen = zip(*(_pad(r, 32) for r in responses))
    roll, olen = zip(*(_pad(r, 32) for r in rollouts))
    emb = types.SimpleNamespace(response=np.stack(resp)[None], response_len=np.array(rlen)[None],
                                rollout=np.stack(roll)[None], rollout_len=np.array(olen)[None],
                                correct=np.array([[False, False, True, True, False]]))
    return types.SimpleNamespace(
        embeddings=emb, node_visits=np.array([[5, 1, 4, 2, 1]]), node_values=np.array([[0.6, 0.0, 0.8, 1.0, 0.0]]),
        parents=np.array([[-1, 0, 0, 2, 2]]), children_index=np.array([[[1, 2], [-1, -1], [3, 4], [-1, -1], [-1, -1]]]),
    )


def test_procedure_cloning_detours_and_backtracks():
    tree = _fake_tree()
    two = clone_procedure(tree, 0, CloningConfig(num_detours=2), seed=0, tokenizer=TOK)
    assert two.think == "3+4=8,wrong!back to 0,3+4=7,7*2=15,wrong!back to 1,7*2=14"
    assert (two.answer, two.detours, two.direct) == ("14", 2, "3+4=7,7*2=14")
    assert [two.think[a:b] for a, b in two.failed_spans] == ["3+4=8,", "7*2=15,"]
    assert count_backtracks(two.think) == 2
    one = [clone_procedure(tree, 0, CloningConfig(num_detours=1), seed=s, tokenizer=TOK).think for s in range(8)]
    assert set(one) == {"3+4=8,wrong!back to 0,3+4=7,7*2=14", "3+4=7,7*2=15,wrong!back to 1,7*2=14"}
    assert one == [clone_procedure(tree, 0, CloningConfig(num_detours=1), seed=s, tokenizer=TOK).think for s in range(8)]
    # with a local step check, a detour goes only through a step that fails it
    not_first = lambda step: step != "3+4=8,"  # calls the first failed step valid
    assert {clone_procedure(tree, 0, CloningConfig(num_detours=1), seed=s, shows_mistake=not_first, tokenizer=TOK).think
            for s in range(8)} == {"3+4=7,7*2=15,wrong!back to 1,7*2=14"}
    # "attempt" detours write out the failed child's rollout reasoning too (node 1's rollout: '8</think>...')
    attempt = CloningConfig(num_detours=2, detour="attempt")
    assert clone_procedure(tree, 0, attempt, seed=0, tokenizer=TOK).think == "3+4=8,8,wrong!back to 0,3+4=7,7*2=15,wrong!back to 1,7*2=14"
    seen = []
    clone_procedure(tree, 0, attempt, seed=0, shows_mistake=lambda text: seen.append(text) or True, tokenizer=TOK)
    assert sorted(seen) == ["3+4=8,8,", "7*2=15,"]  # a step that closed </think> has nothing more to write
    # failed = no verified answer below, whatever the node values (a graded process value makes them positive)
    tree.node_values[:] = 0.4
    assert clone_procedure(tree, 0, CloningConfig(num_detours=2), seed=0, tokenizer=TOK).think == two.think
    direct = clone_procedure(tree, 0, CloningConfig(num_detours=0), seed=0, tokenizer=TOK)
    assert direct.think == direct.direct and count_backtracks(direct.think) == 0 and direct.failed_spans == ()
    tree.embeddings.correct[:] = False
    assert clone_procedure(tree, 0, CloningConfig(), seed=0, tokenizer=TOK) is None


def test_sft_batch_skips_failed_step_targets():
    """Skipped trace characters stay in the input and lose exactly their own targets."""
    p = Problem(prompt="3+4*2=", answer="14", wrong="15", trace="3+4=8,wrong!back to 0,3+4=7,7*2=14", difficulty=2, task="t")
    full, skip = sft_batch([p], 64, tokenizer=TOK), sft_batch([p], 64, skip_spans=[[(0, 6)]], tokenizer=TOK)
    np.testing.assert_array_equal(full["tokens"], skip["tokens"])
    dropped = np.flatnonzero(full["loss_mask"][0] != skip["loss_mask"][0]) + 1  # positions of the targets
    assert _decode(full["tokens"][0][dropped]) == "3+4=8,"
    assert skip["loss_mask"][0].sum() == full["loss_mask"][0].sum() - 6
    with pytest.raises(ValueError, match="span"):
        sft_batch([p], 64, skip_spans=[[(30, 99)]], tokenizer=TOK)
    with pytest.raises(ValueError, match="one span list per problem"):
        sft_batch([p], 64, skip_spans=[], tokenizer=TOK)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="step"):
        CloningConfig(reflection="go back")
    with pytest.raises(ValueError, match="num_detours"):
        CloningConfig(num_detours=-1)
    with pytest.raises(ValueError, match="detour"):
        CloningConfig(detour="branch")
