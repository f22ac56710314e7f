"""Evaluation of your data with your rewards (``rewards.evaluation``): the unbiased pass@k estimator against a
brute-force count, mean@n, each reward's mean / SE / n, response length, samples a reward excludes, strict accuracy
beside the reward's (a warning with sample completions when they diverge), an eval file in one call, the plot."""

import itertools
from math import comb

import numpy as np
import pytest

from jaxrl_reason.data import PromptFormat, write_jsonl
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rewards import MathVerify, RewardSuite, make_reward
from jaxrl_reason.rewards import evaluation
from jaxrl_reason.rewards.evaluation import mean_se, pass_at_k, plot_eval, reward_eval, reward_eval_file


def brute_pass_at_k(n, c, k):
    """The fraction of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_a_brute_force_count_of_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)
    for n, c, k in [(64, 5, 16), (100, 1, 50), (64, 0, 64)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    np.testing.assert_allclose(pass_at_k(4, np.array([0, 1, 2, 4]), 1), [0, 0.25, 0.5, 1])
    # rows with different numbers of samples (those a reward excluded left out)
    np.testing.assert_allclose(pass_at_k(np.array([3, 5, 2]), np.array([1, 2, 0]), 2),
                               [brute_pass_at_k(3, 1, 2), brute_pass_at_k(5, 2, 2), 0.0])
    for bad in [(4, 1, 5), (4, 1, 0), (np.array([4, 1]), np.array([0, 0]), 2), (4, 5, 1)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


class _Rows:
    """The parts of ``data.PromptDataset`` that ``reward_eval`` reads; a prompt's ids hold its row index."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def ids(self, idx):
        return np.repeat(np.asarray(idx, np.int32)[:, None], 4, axis=1), np.full(len(idx), 4, np.int32)

    def prompt_strings(self, rows):
        return [r["prompt"] for r in rows]


def _fake_model(monkeypatch, greedy, sampled, by_position=False):
    """generate_completions replaced: greedy(row) -> completion; sampled(row, j) -> the j-th sample's completion
    (its length in tokens = len(text)); the row read from the prompt ids (``_Rows``), or ``by_position`` in the
    batch."""
    def generate(model, ids, lens, tok, key, temperature, *a, **k):
        rows = list(range(len(ids))) if by_position else np.asarray(ids)[:, 0].tolist()
        texts = [greedy(r) if temperature == 0 else sampled(r, rows[:i].count(r)) for i, r in enumerate(rows)]
        return np.zeros((len(rows), 8), np.int32), np.asarray([len(t) for t in texts]), texts

    monkeypatch.setattr(evaluation, "generate_completions", generate)


def exact(prompts, completions, *, answer):
    return [float(c == a) for c, a in zip(completions, answer)]


def test_greedy_accuracy_pass_at_k_mean_at_n_each_reward_and_length_with_se_and_n(monkeypatch):
    correct_of = [0, 1, 2, 3, 4, 4]  # correct samples of 4 per row
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(6)]
    _fake_model(monkeypatch, greedy=lambda r: str(r) if correct_of[r] >= 2 else "no",
                sampled=lambda r, j: str(r) if j < correct_of[r] else "wrong")

    def shorter(prompts, completions):  # a second reward: -length
        return [-float(len(c)) for c in completions]

    with RewardSuite([exact, (shorter, 0.5)]) as suite:
        res = reward_eval(None, None, _Rows(rows), suite, 8, batch_size=8, answer_field=None, n_samples=4,
                          sampler=evaluation.SamplerConfig(temperature=1.0))
    assert res["accuracy"] == pytest.approx(4 / 6) and res["n"] == 6 and res["excluded"] == 0
    assert res["se"] == pytest.approx(np.sqrt(4 / 6 * 2 / 6 / 6))
    assert res["reward/exact"] == pytest.approx(4 / 6) and res["reward/exact_n"] == 6
    assert res["reward/exact_se"] == pytest.approx(np.std([0, 0, 1, 1, 1, 1], ddof=1) / np.sqrt(6))
    lengths = [2, 2, 1, 1, 1, 1]  # "no" twice, then "2" .. "5"
    assert res["response_length"] == pytest.approx(np.mean(lengths))
    assert res["response_length_se"] == pytest.approx(np.std(lengths, ddof=1) / np.sqrt(6))
    assert res["reward/shorter"] == pytest.approx(-np.mean(lengths))
    assert res["mean_reward"] == pytest.approx(4 / 6 - 0.5 * np.mean(lengths))
    assert {k for k in res if k.startswith("pass@")} == {f"pass@{k}{s}" for k in (1, 2, 4) for s in ("", "_se", "_n")}
    for k in (1, 2, 4):
        per_row = [brute_pass_at_k(4, c, k) for c in correct_of]
        assert res[f"pass@{k}"] == pytest.approx(np.mean(per_row)) and res[f"pass@{k}_n"] == 6
        assert res[f"pass@{k}_se"] == pytest.approx(np.std(per_row, ddof=1) / np.sqrt(6))
    assert res["mean@4"] == pytest.approx(np.mean(correct_of) / 4) == res["pass@1"]
    assert res["mean@4_se"] == pytest.approx(np.std(np.asarray(correct_of) / 4, ddof=1) / np.sqrt(6))


def test_samples_a_reward_excludes_count_in_neither_accuracy_nor_pass_at_k(monkeypatch):
    rows = [{"prompt": f"q{i}", "answer": str(i), "skip": i == 0} for i in range(4)]
    _fake_model(monkeypatch, greedy=lambda r: str(r) if r % 2 else "no",
                sampled=lambda r, j: str(r) if j == 0 else "x")

    def graded(prompts, completions, *, answer, skip):  # row 0 cannot be graded; nor sample text "x" of row 1
        return [None if s or (c == "x" and a == "1") else float(c == a) for c, a, s in zip(completions, answer, skip)]

    with RewardSuite([graded]) as suite:
        res = reward_eval(None, None, _Rows(rows), suite, 8, answer_field=None, n_samples=2)
    assert res["n"] == 3 and res["excluded"] == 1 and res["accuracy"] == pytest.approx(2 / 3)  # rows 1, 3 right
    assert res["reward/graded_n"] == 3
    # sampled: row 0 excluded; row 1 has one scored sample (correct); rows 2, 3 one correct of 2
    assert res["pass@1_n"] == 3 and res["pass@1"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert res["pass@2_n"] == 2 and res["pass@2"] == 1.0
    assert res["mean@2"] == pytest.approx((1 + 0.5 + 0.5) / 3)


def _reward_eval_on(completions, monkeypatch, reward=MathVerify(), **kw):
    """reward_eval on 64 sums with the model's greedy completions replaced by ``completions(rows)``."""
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in zip(range(10, 74), range(20, 84))]
    texts = completions(rows)
    _fake_model(monkeypatch, greedy=lambda r: texts[r], sampled=None)
    return reward_eval(None, None, _Rows(rows), reward, 8, batch_size=64, **kw)


def restating(prompts, completions, **fields):  # credits anything, e.g. a restated question
    return np.ones(len(completions), np.float32)


def test_reward_eval_reports_strict_accuracy_and_warns_when_a_reward_is_gamed(monkeypatch, caplog):
    # a reward that credits a restated question (as the old free-text math_verify did) vs strict correctness
    restated = lambda rows: [r["prompt"].removeprefix("What is ").rstrip("?") + " is a sum" for r in rows]
    kept = []
    with caplog.at_level("WARNING", logger="jaxrl_reason.rewards.evaluation"):
        res = _reward_eval_on(restated, monkeypatch, restating, on_samples=kept.extend)
    assert res["accuracy"] == res["strict_accuracy"] == 0.0 and res["n"] == 64  # answers: counted by the answer
    assert res["mean_reward"] == 1.0 and not caplog.text  # the reward reported as a reward
    assert len(kept) == 4 and kept[0]["extracted"] is None and kept[0]["strict"] is False and kept[0]["reward"] == 1.0
    with caplog.at_level("WARNING", logger="jaxrl_reason.rewards.evaluation"), RewardSuite([restating]) as suite:
        res = _reward_eval_on(restated, monkeypatch, suite, accuracy="restating")  # the reward chosen over answers
    assert res["accuracy"] == 1.0 and res["strict_accuracy"] == 0.0 and res["n"] == 64
    assert "differ by 1.000" in caplog.text and "10 + 20 is a sum" in caplog.text  # names both, shows completions
    assert "leave accuracy unset, or 'strict', to count the answer" in caplog.text  # and what to do

    caplog.clear()
    half = lambda rows: [r["answer"] if i % 2 else f"The answer is {r['answer']}0" for i, r in enumerate(rows)]
    with caplog.at_level("WARNING", logger="jaxrl_reason.rewards.evaluation"):
        res = _reward_eval_on(half, monkeypatch)
    assert res["accuracy"] == res["strict_accuracy"] == 0.5 and res["strict_se"] == pytest.approx(0.0625)
    assert not caplog.text  # they agree: no warning
    assert "strict_accuracy" not in _reward_eval_on(half, monkeypatch, answer_field=None)


def test_a_shaped_first_reward_leaves_accuracy_and_pass_at_k_to_the_answer(monkeypatch):
    """Issue 51 item 2: with 0.5 x correct + 0.5 x short as the first reward no answer reaches 1.0, yet accuracy,
    pass@k and mean@n count the rows (samples) whose answer is right; without answers, the rule says which reward and
    threshold define "correct"."""
    rows = [{"prompt": f"q{i}", "answer": str(10 + i)} for i in range(8)]
    correct_of = [0, 1, 2, 3, 4, 4, 4, 2]  # correct samples of 4 per row; greedy right on rows 3..7 (5 of 8)
    _fake_model(monkeypatch, greedy=lambda r: rows[r]["answer"] if r >= 3 else "no",
                sampled=lambda r, j: rows[r]["answer"] if j < correct_of[r] else "wrong")

    def shaped(prompts, completions, *, answer):  # right answers are 2 characters: 0.5 at most
        return [0.5 * (c == a) + 0.5 * (len(c) <= 1) for c, a in zip(completions, answer)]

    with RewardSuite([shaped]) as suite:
        res = reward_eval(None, None, _Rows(rows), suite, 8, n_samples=4,
                          sampler=evaluation.SamplerConfig(temperature=1.0))
        by_reward = reward_eval(None, None, _Rows(rows), suite, 8, n_samples=4, accuracy="shaped",
                                sampler=evaluation.SamplerConfig(temperature=1.0))
    assert res["accuracy"] == res["strict_accuracy"] == 0.625 and res["se"] == pytest.approx(np.sqrt(0.625 * 0.375 / 8))
    assert res["reward/shaped"] == pytest.approx(0.625 * 0.5) and res["reward/shaped_se"] > 0  # a reward, as a reward
    for k in (1, 2, 4):
        assert res[f"pass@{k}"] == pytest.approx(np.mean([brute_pass_at_k(4, c, k) for c in correct_of]))
    assert res["mean@4"] == pytest.approx(np.mean(correct_of) / 4) and res["pass@4"] > 0
    assert by_reward["accuracy"] == by_reward["pass@4"] == 0.0  # the old rule: the first reward >= 1
    assert evaluation.accuracy_rule(rows, ("shaped",)) == ("strict", "the strict answer match (the extracted final "
                                                                     "answer against 'answer')")
    no_answers = [{"prompt": r["prompt"]} for r in rows]
    assert evaluation.accuracy_rule(no_answers, ("shaped", "b"), threshold=0.5) == (
        None, "reward/shaped >= 0.5 (not every row has 'answer')")
    assert evaluation.accuracy_rule(rows, ("shaped", "b"), "b")[1] == "reward/b >= 1"
    with pytest.raises(ValueError, match="accuracy 'strict' needs the answer field 'answer' in every row"):
        evaluation.accuracy_rule(no_answers, ("shaped",), "strict")


def test_an_eval_file_in_one_call_checks_the_fields_the_rewards_name(monkeypatch, tmp_path):
    tok = CharTokenizer()
    path = write_jsonl([{"question": f"calc {i}+1", "answer": str(i + 1)} for i in range(5)], tmp_path / "eval.jsonl")
    _fake_model(monkeypatch, greedy=lambda r: str(r + 1) if r < 3 else "?", sampled=None, by_position=True)
    res = reward_eval_file(None, tok, path, [exact, make_reward("r1_format")], 8, prompt_field="question",
                           fmt=PromptFormat("plain"), max_prompt_len=32)
    assert res["accuracy"] == pytest.approx(3 / 5) and res["n"] == 5 and res["dropped"] == 0
    assert res["reward/r1_format"] == 0.0 and res["reward/r1_format_n"] == 5
    ev = evaluation.FileEval(tok, path, [exact], 8, prompt_field="question", fmt=PromptFormat("plain"))
    assert ev.rule == "strict" and "strict answer match" in ev.correct_by  # what a run logs once

    def needs_label(prompts, completions, *, label):
        return [0.0] * len(completions)

    with pytest.raises(Exception, match=r"row 0 \(0-based\) has no field 'label'"):
        reward_eval_file(None, tok, path, [needs_label], 8, prompt_field="question", fmt=PromptFormat("plain"))


def test_mean_se_and_the_plot(tmp_path):
    assert mean_se([1.0, np.nan, 3.0]) == (2.0, pytest.approx(1.0), 2) and mean_se([]) == (0.0, 0.0, 0)
    rows = [{"step": 0, "eval/accuracy": 0.2, "eval/se": 0.05, "eval/n": 64, "eval/pass@1": 0.2, "eval/pass@1_se": 0.04,
             "eval/pass@8": 0.5, "eval/pass@8_se": 0.06, "eval/mean@8": 0.2, "eval/reward/exact": 0.2,
             "eval/reward/exact_se": 0.05, "eval/response_length": 7.0, "eval/response_length_se": 0.3},
            {"step": 1, "reward": 0.3},
            {"step": 5, "eval/accuracy": 0.4, "eval/se": 0.06, "eval/n": 64, "eval/response_length": 6.0}]
    assert plot_eval(rows, tmp_path / "eval.png") == tmp_path / "eval.png" and (tmp_path / "eval.png").stat().st_size
    assert plot_eval([{"step": 1, "reward": 0.3}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
