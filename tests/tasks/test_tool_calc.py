"""tasks.tool_calc: the sandboxed evaluator refuses what is not arithmetic (and never evals), the calculator env
handles and counts malformed, oversized, disabled and endless calls; the tool_use experiment runs and learns."""

import ast
import builtins
import inspect
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.models.lm.sampler import SampleOutput
from jaxrl_reason.rl.lm.host_rollout import HostRollout
from jaxrl_reason.tasks import tool_calc
from jaxrl_reason.tasks.tool_calc import (CalcEnv, CalcError, CalcLimits, ToolCalcTask, calc_metrics, safe_eval,
                                          segment_rows, tool_tokenizer)


@pytest.mark.parametrize("expr, value", [("3*(4+5)", 27), ("-7//2", -4), ("7%3", 1), ("2**10", 1024), ("1/4", "1/4"),
                                          ("1.5*2", 3), ("-(2-5)", 3), ("2**-2", "1/4"), (" 12 ", 12)])
def test_safe_eval_computes_arithmetic_exactly(expr, value):
    assert safe_eval(expr) == Fraction(value)


@pytest.mark.parametrize("expr, kind", [
    ("__import__('os').system('true')", "malformed"), ("x+1", "malformed"), ("(1).real", "malformed"),
    ("abs(-1)", "malformed"), ("[1][0]", "malformed"), ("1<2", "malformed"), ("lambda: 1", "malformed"),
    ("True+1", "malformed"), ("'a'*3", "malformed"), ("1j*2", "malformed"), ("1/0", "malformed"), ("3*", "malformed"),
    ("2**0.5", "malformed"), ("9**9**9", "oversized"), ("2**65", "oversized"), ("10**15*10", "oversized"),
    ("99999999**2", "oversized"), ("1+" * 40 + "1", "oversized"), ("-(" * 30 + "1" + ")" * 30, "oversized")])
def test_safe_eval_refuses_what_is_not_bounded_arithmetic(expr, kind):
    with pytest.raises(CalcError) as err:
        safe_eval(expr)
    assert err.value.kind == kind


def test_safe_eval_never_calls_eval_or_exec(monkeypatch):
    tree = ast.parse(inspect.getsource(tool_calc))
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__"}

    def refuse(*a, **k):
        raise AssertionError("eval called")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert safe_eval("6*7") == 42


def test_oversized_power_is_refused_before_it_is_computed():
    # 10**60 digits would take long to build: the size check comes first, with a low max_abs too
    with pytest.raises(CalcError, match="power exceeds"):
        safe_eval("99**60", CalcLimits(max_abs=10**6))


TOK = tool_tokenizer()


def ids(text):
    return TOK.encode(text, allow_special=True)


def test_calc_env_counts_every_kind_of_call():
    env = CalcEnv(TOK, max_turns=3, result_chars=10)
    p = ToolCalcTask().generate(np.random.default_rng(0))
    ep, prompt = env.reset(p)
    assert TOK.decode(prompt) == f"<bos>calc: {p.expr}="
    ep, obs, r, done = env.step(ep, ids(f"<calc>{p.expr}</calc>"))
    assert TOK.decode(obs) == f"<result>{p.answer}</result>" and r == 0 and not done
    ep, obs, r, done = env.step(ep, ids(f"<answer>{p.answer}</answer><eos>"))
    assert obs == [] and r == 1.0 and done and ep.correct and ep.calls == 1

    ep, _ = env.reset(p)
    for call, reply in [("1+*2", "error"), ("99999*99999*999", "too long"), ("2**99", "too long")]:
        ep, obs, _, done = env.step(ep, ids(f"<calc>{call}</calc>"))
        if ep.turn < 3:
            assert TOK.decode(obs) == f"<result>{reply}</result>" and not done
    assert done and ep.turn_limit and ep.calls == 3 and ep.malformed == 1 and ep.oversized == 2  # endless calls

    ep, _ = env.reset(p)
    ep, obs, _, _ = env.step(ep, ids("</calc>"))  # a close with no open
    assert TOK.decode(obs) == "<result>error</result>" and ep.malformed == 1
    ep, obs, r, done = env.step(ep, ids("12<eos>"))  # no <answer>: ends, no reward
    assert done and r == 0 and not ep.answered

    off = CalcEnv(TOK, tool=False)
    ep, prompt = off.reset(p)
    assert TOK.decode(prompt).startswith("<bos>mind: ")
    ep, obs, _, _ = off.step(ep, ids("<calc>1+1</calc>"))
    assert TOK.decode(obs) == "<result>none</result>" and ep.disabled_calls == 1
    m = calc_metrics([ep])
    assert m["n"] == 1 and m["disabled_calls"] == 1 and m["accuracy"] == 0


def test_calc_env_in_the_host_rollout_counts_endless_calls():
    """A model that only ever calls: every episode ends at the turn limit, its results never in the loss."""
    env = CalcEnv(TOK, max_turns=2)
    call = np.asarray(ids("<calc>12*34</calc>"), np.int32)

    def always_call(params, prompts, prompt_lens, key, live):
        b = prompts.shape[0]
        n = jnp.where(live, len(call), 0)
        return SampleOutput(jnp.broadcast_to(jnp.asarray(call), (b, len(call))), jnp.zeros((b, len(call))), n)

    roll = HostRollout(env, always_call, len(call), pad_id=TOK.pad_id, chunks=2)
    problems = ToolCalcTask().problems(np.random.default_rng(1), 5)
    ep, states = roll(None, jax.random.key(0), problems)
    roll.close()
    m = calc_metrics(states)
    assert m["turn_limit"] == 1 and m["calls"] == 2 and m["accuracy"] == 0 and m["malformed"] == 0
    assert np.all(np.asarray(ep.done)) and np.all(np.asarray(ep.turns) == 2)
    # two calls (model tokens) around one result (context)
    np.testing.assert_array_equal(np.asarray(ep.loss_mask.sum(1)), [2 * len(call)] * 5)
    assert TOK.decode(np.asarray(ep.seqs[0, : int(ep.prompt_lens[0] + ep.lengths[0])]).tolist()).endswith(
        "<calc>12*34</calc><result>408</result><calc>12*34</calc>")


def test_segment_rows_masks_everything_the_model_did_not_write():
    env = CalcEnv(TOK)
    p = ToolCalcTask().generate(np.random.default_rng(2))
    segs = env.oracle(p)
    data = segment_rows([segs], 64, TOK.pad_id)
    toks, mask = data["tokens"][0], data["loss_mask"][0]
    targets = [TOK.decode([int(t)]) for t, m in zip(toks[1:], mask) if m]
    assert "".join(targets) == f"<calc>{p.expr}</calc><answer>{p.answer}</answer><eos>"
    with pytest.raises(ValueError, match="seq_len"):
        segment_rows([segs], 8, TOK.pad_id)
