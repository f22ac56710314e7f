"""GRPO on user data: a JSONL dataset with a BPE tokenizer whose R1 tags are several tokens (the stop-sequence
path), failing reward functions (a clear RewardError, the last checkpoint intact), the synthetic presets'
problem stream, rewards running on host threads while the device computes log-probs, and the generic
``experiments/grpo.py`` end to end through the CLI (its ``hf/`` export loads in transformers with the same
logits)."""

import json
import pathlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.cli import run_experiment
from jaxrl_reason.data import PromptDataset, load_rows, write_jsonl
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import CharTokenizer, HFTokenizer
from jaxrl_reason.rewards import RewardError, make_reward
from jaxrl_reason.rl.grpo.trainer import GRPOConfig, GRPOTrainer
from jaxrl_reason.tasks import Countdown, RandomCalculation, make_batch
from jaxrl_reason.utils.experiment import RunDir, read_metrics
from jaxrl_reason.utils.loop import run_chunks
from testutil import hf_logits, model_logits, rel_error

ROWS = [{"question": f"what is {a} plus {b}?", "answer": str(a + b), "id": 10 * a + b, "meta": {"level": a % 3}}
        for a in range(6) for b in range(4)]
LONG = [{"question": "what is " + " plus ".join(["1"] * (8 + k)) + "?", "answer": str(8 + k), "id": 100 + k,
         "meta": {"level": 0}} for k in range(3)]  # far over MAX_PROMPT_LEN tokens
MAX_PROMPT_LEN = 16
CFG = GRPOConfig(prompts_per_step=4, group_size=2, max_new_tokens=8, lr=1e-3)


@pytest.fixture(scope="module")
def tok():
    corpus = [r["question"] for r in ROWS + LONG] + [f"<think>{r['question']}</think><answer>{r['answer']}</answer>"
                                                     for r in ROWS]
    return HFTokenizer.train_bpe(corpus * 4, 300, special_tokens=("<pad>", "<bos>", "<eos>"))


@pytest.fixture(scope="module")
def dataset(tok, tmp_path_factory):
    path = write_jsonl(ROWS[:5] + LONG + ROWS[5:], tmp_path_factory.mktemp("data") / "train.jsonl")
    return PromptDataset(load_rows(path), tok, prompt_field="question", max_prompt_len=MAX_PROMPT_LEN, seed=0,
                         required_fields=("answer",), source=str(path))


@pytest.fixture(scope="module")
def model(tok):
    cfg = LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=32)
    return Transformer(cfg, rngs=nnx.Rngs(0))  # only split by the trainers, never mutated


def _chain_params(model, seq, scale=10.0):
    """Params of ``model``'s structure that emit ``seq`` over and over after any prompt, at any temperature
    near 1: every block zeroed (identity residual), every token embedded as e_0 except seq[i] as e_{i+1},
    and the head maps e_0 -> seq[0], e_{i+1} -> seq[i+1] (the last back to seq[0]) with logit ~scale*sqrt(d)."""
    assert len(set(seq)) == len(seq) and len(seq) < model.cfg.d_model
    g, params, rest = nnx.split(model, nnx.Param, ...)
    m = nnx.merge(g, jax.tree.map(jnp.zeros_like, params), rest)
    v, d = model.cfg.vocab_size, model.cfg.d_model
    emb = np.zeros((v, d), np.float32)
    emb[:, 0] = 1.0
    head = np.zeros((d, v), np.float32)
    head[0, seq[0]] = scale
    for i, t in enumerate(seq):
        emb[t] = np.eye(d, dtype=np.float32)[i + 1]
        head[i + 1, seq[(i + 1) % len(seq)]] = scale
    m.embed[...] = jnp.asarray(emb)
    m.final_norm.scale[...] = jnp.ones_like(m.final_norm.scale[...])
    m.lm_head.kernel[...] = jnp.asarray(head)
    return nnx.state(m, nnx.Param)


class Spy:
    """A reward function recording what it is given (from the suite's worker threads)."""

    name = "spy"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **fields):
        self.calls.append((list(prompts), list(completions), fields))
        return np.zeros(len(completions))


def test_grpo_on_a_jsonl_dataset_with_multi_token_tags(tok, dataset, model):
    assert len(tok.encode("</answer>")) > 1
    with pytest.raises(ValueError, match="not single tokens"):
        tok.tag_ids()
    assert dataset.dropped == len(LONG) and len(dataset) == len(ROWS)
    spy = Spy()
    trainer = GRPOTrainer(CFG, model, tok, dataset, [make_reward("exact_match"), (make_reward("r1_format"), 0.1), spy])
    assert trainer.stop_tokens.tolist() == [tok.eos_id]
    assert np.asarray(trainer.stop_sequences).tolist() == [tok.encode("</answer>")]  # the stop-sequence path

    state = trainer.init(jax.random.key(0))
    for _ in range(2):
        state, m = trainer.step(state)
        for k in ("loss", "kl", "entropy", "grad_norm", "reward", "response_length", "reward/exact_match",
                  "reward/r1_format", "reward/spy", "format_rate", "time_reward_idle_s"):
            assert np.isfinite(m[k]), k
        assert "accuracy" not in m  # no reward named "correct"
    assert int(state.step) == 2 and len(spy.calls) == 2
    b = CFG.prompts_per_step * CFG.group_size
    for step, (prompts, completions, fields) in enumerate(spy.calls):
        assert fields["step"] == step and len(prompts) == len(completions) == b
        rows = [r for r in dataset.sample(step, CFG.prompts_per_step)[0] for _ in range(CFG.group_size)]
        assert prompts == dataset.prompt_strings(rows) == [r["question"] for r in rows]
        assert all(r["id"] < 100 for r in rows)  # never a dropped long prompt
        for key in ("question", "answer", "id", "meta"):
            assert fields[key] == [r[key] for r in rows], key
        ids = fields["completion_ids"]
        assert len(ids) == b and all(0 < len(x) <= CFG.max_new_tokens for x in ids)
        assert completions == [tok.decode(x[:-1] if x[-1] == tok.eos_id else x) for x in ids]

    # a policy that writes "</answer>" over and over: the multi-token stop sequence ends every sample
    # right after its first "</answer>" (it never emits eos)
    stop = tok.encode("</answer>")
    spy.calls.clear()
    _, m = trainer.step(trainer.init(jax.random.key(1), params=_chain_params(model, stop)))
    _, completions, fields = spy.calls[0]
    assert completions == ["</answer>"] * b and fields["completion_ids"] == [stop] * b
    assert float(m["response_length"]) == len(stop) < CFG.max_new_tokens


def _boom(prompts, completions, **kw):
    raise ZeroDivisionError("grader crashed")


def _short(prompts, completions, **kw):
    return [1.0] * (len(completions) - 1)


def _nan_reward(prompts, completions, **kw):
    r = np.zeros(len(completions))
    r[2] = np.nan
    return r


@pytest.mark.parametrize("fn, msg", [
    (_boom, r"reward function '_boom' raised ZeroDivisionError at step 0 on a batch of 8 completions: grader crashed"),
    (_short, r"reward function '_short' returned length 7 at step 0, expected a 1-D sequence of length 8"),
    (_nan_reward, r"reward function '_nan_reward' returned 1 non-finite value\(s\) at step 0: rows \[2\]"),
], ids=["raises", "wrong_length", "nan"])
def test_a_failing_reward_function_is_named(fn, msg, tok, dataset, model):
    trainer = GRPOTrainer(CFG, model, tok, dataset, [make_reward("exact_match"), fn, make_reward("r1_format")])
    state = trainer.init(jax.random.key(0))
    with pytest.raises(RewardError, match=msg):
        trainer.step(state)
    assert int(state.step) == 0 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
    trainer.rewards.close()


def _arrays(tree):
    is_key = lambda v: jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
    return [np.asarray(jax.random.key_data(v) if is_key(v) else v) for v in jax.tree.leaves(tree)]


def test_a_reward_failure_mid_run_keeps_the_last_checkpoint(tok, dataset, model, tmp_path):
    """The grader fails at step 1: run_chunks stops with the RewardError; the checkpoint of step 1 (the state
    after step 0) is intact and restores to exactly what an uninterrupted first step gives."""

    def flaky(prompts, completions, step, **kw):
        if step >= 1:
            raise OSError("grading service unreachable")
        return np.random.default_rng(step).random(len(completions))  # varied: the update moves the params

    trainer = GRPOTrainer(CFG, model, tok, dataset, [flaky])
    init = lambda: trainer.init(jax.random.key(3))
    run = RunDir.create("grpo_data", {"case": "flaky"}, root=tmp_path)
    with pytest.raises(RewardError, match="reward function 'flaky' raised OSError at step 1 .*unreachable"):
        run_chunks(run, init(), trainer.chunk_fn(1), 3)
    run.close()
    resumed = RunDir.create("grpo_data", {"case": "flaky"}, root=tmp_path, resume=True)
    assert resumed.checkpointer().all_steps() == [1] and len(resumed.read_metrics()) == 1
    step, restored = resumed.checkpointer().restore(init())
    resumed.close()
    expected, _ = trainer.step(init())
    assert step == 1 and int(restored.step) == 1
    assert not all(np.array_equal(a, b) for a, b in zip(_arrays(init().params), _arrays(expected.params)))
    for a, b in zip(_arrays(restored), _arrays(expected), strict=True):
        np.testing.assert_array_equal(a, b)
    trainer.rewards.close()


def test_for_tasks_draws_the_old_trainers_problem_stream():
    """``GRPOTrainer.for_tasks``: step s's prompts are the problems of make_batch(tasks, default_rng([seed, s]), ...),
    each repeated group_size times (with dynamic sampling, prompts_per_step * oversample of them)."""
    tok = CharTokenizer()
    tasks, weights = [RandomCalculation(max_difficulty=2), Countdown(max_difficulty=2)], [1.0, 3.0]
    cfg = GRPOConfig(seed=5, prompts_per_step=3, group_size=2, dynamic_sampling=True, oversample=2, max_new_tokens=8)
    model = Transformer(LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64,
                                 max_seq_len=40), rngs=nnx.Rngs(0))
    trainer = GRPOTrainer.for_tasks(cfg, model, tok, tasks, prompt_len=32, task_weights=weights)
    assert trainer.rewards.names == ("correct",)
    g, n = cfg.group_size, cfg.groups_sampled
    for step in (0, 1, 7):
        rows, texts, ids, lens = trainer.prompts(step)
        ref = make_batch(tasks, np.random.default_rng([5, step]), n, 32, 24, weights, tokenizer=tok)
        assert [r["problem"] for r in rows] == [p for p in ref.problems for _ in range(g)]
        assert texts == [p.prompt for p in ref.problems for _ in range(g)]
        np.testing.assert_array_equal(ids, np.repeat(ref.prompts, g, axis=0))
        np.testing.assert_array_equal(lens, np.repeat(ref.prompt_lens, g, axis=0))
        assert [r["task_id"] for r in rows] == np.repeat(ref.task_id, g).tolist()
    with pytest.raises(ValueError, match="at least one task"):
        GRPOTrainer.for_tasks(cfg, model, tok, [], prompt_len=32)


def test_rewards_run_on_host_threads_while_the_device_computes_log_probs(tok, dataset, model, monkeypatch):
    """No timing: (1) ``rewards.submit`` returns while a function is still blocked; (2) in a step, the reward
    function is still running when the log-probs are launched (it waits for that launch, which would never
    come, up to its timeout, if the trainer scored before computing log-probs)."""
    release, started = threading.Event(), threading.Event()

    def gated(prompts, completions, **kw):
        started.set()
        release.wait(timeout=60)
        return np.ones(len(completions))

    trainer = GRPOTrainer(CFG, model, tok, dataset, [gated, make_reward("exact_match")], reward_workers=2)
    fut = trainer.rewards.submit(["p"] * 3, ["c"] * 3, {"answer": ["1", "2", "3"]}, step=0)
    assert started.wait(timeout=60) and not fut.done()
    release.set()
    total, per_fn = fut.result(timeout=60)
    assert total.tolist() == [1.0] * 3 and list(per_fn) == ["gated", "exact_match"]

    launched, seen = threading.Event(), []
    logprobs = trainer._logprobs

    def spy_logprobs(*args):
        launched.set()
        return logprobs(*args)

    def waits_for_log_probs(prompts, completions, **fields):
        seen.append((launched.wait(timeout=60), fields))
        return np.zeros(len(completions))

    trainer.rewards.close()
    monkeypatch.setattr(trainer, "_logprobs", spy_logprobs)
    monkeypatch.setattr(trainer, "rewards", type(trainer.rewards)([waits_for_log_probs]))
    state, m = trainer.step(trainer.init(jax.random.key(0)))
    (overlapped, fields), = seen
    assert overlapped, "the reward function finished before the log-probs were launched"
    assert set(fields) == {"step", "completion_ids", "question", "answer", "id", "meta"} and fields["step"] == 0
    assert np.isfinite(m["time_reward_idle_s"]) and m["reward/waits_for_log_probs"] == 0.0
    trainer.rewards.close()


# ---- experiments/grpo.py through the CLI ----------------------------------------------------------------

TINY = ["--steps", "2", "--eval-every", "1", "--heldout", "16", "--train-rows", "64", "--start.sft-steps", "5",
        "--start.sft-problems", "64", "--start.tokenizer-corpus", "200", "--grpo.prompts-per-step", "4",
        "--grpo.group-size", "2", "--grpo.max-new-tokens", "8"]


@pytest.mark.slow  # a whole run: BPE + SFT start, 2 GRPO steps, evals, export (~40 s on 2 quiet cores)
def test_grpo_experiment_end_to_end_exports_a_transformers_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")  # the hf extra (installed in CI)
    from jaxrl_reason.models.lm import load_hf_model

    summary = run_experiment("grpo", ["--run-root", str(tmp_path), *TINY])
    assert set(summary) == {"start_accuracy", "final_accuracy", "n_heldout", "gain_points", "gain_se_points",
                            "dropped_train_prompts", "hf", "run_dir", "heldout_prompts_in_train"}
    assert summary["heldout_prompts_in_train"] == 0  # synthetic rows: whole problems held out
    assert summary["n_heldout"] == 16 and 0 <= summary["final_accuracy"] <= 1 and summary["dropped_train_prompts"] == 0
    run_path, hf = pathlib.Path(summary["run_dir"]), pathlib.Path(summary["hf"])
    assert hf == run_path / "hf" and (hf / "config.json").is_file() and (hf / "tokenizer.json").is_file()
    assert json.loads((run_path / "summary.json").read_text())["hf"] == str(hf)
    assert (run_path / "grpo.png").is_file() and (run_path / "start" / "config.json").is_file()
    train, held = (load_rows(run_path / "data" / f) for f in ("train.jsonl", "heldout.jsonl"))
    assert 0 < len(train) <= 64 and len(held) == 16
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    metrics = read_metrics(run_path / "metrics.jsonl")
    assert any("reward/math_verify" in r for r in metrics) and any("eval/accuracy" in r for r in metrics)

    ours = load_hf_model(hf)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf).float().eval()
    assert theirs.config.model_type == "qwen3"
    toks = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 24))
    assert rel_error(model_logits(ours, jnp.asarray(toks)), hf_logits(theirs, toks)) <= 1e-3
    text = "calc 3+4*2 <think>4*2=8</think><answer>11</answer>"
    assert (transformers.AutoTokenizer.from_pretrained(hf)(text, add_special_tokens=False)["input_ids"]
            == HFTokenizer.from_pretrained(hf).encode(text, allow_special=True))

    # bad data: row 3 of --data has no answer field -> an error naming the row (the model given: no start build)
    rows = [{"prompt": f"calc {i}+1", "answer": str(i + 1)} for i in range(24)]
    del rows[3]["answer"]
    bad = write_jsonl(rows, tmp_path / "bad.jsonl")
    # one line and exit code 1 (cli.RUN_ERRORS), before any model work
    with pytest.raises(SystemExit, match=r"grpo: DataError: .*bad\.jsonl: row 3 \(0-based\) has no field 'answer'"):
        run_experiment("grpo", ["--run-root", str(tmp_path / "bad"), "--model", str(hf), "--data", str(bad), *TINY])


def test_start_sft_problems_leave_out_the_excluded_prompts():
    from jaxrl_reason.rl.grpo.start import StartConfig, sft_problems

    cfg = StartConfig(sft_problems=256)
    every = sft_problems(cfg)
    held = frozenset(p.prompt for p in every[:20])
    kept = sft_problems(cfg, held)
    assert len(every) == 256 and 0 < len(kept) <= 256 - 20 and not held & {p.prompt for p in kept}
    assert [p.prompt for p in kept] == [p.prompt for p in every if p.prompt not in held]  # the same draw, filtered


def test_archs_are_the_named_models_and_policy_source_checks_its_name():
    """recipes.ARCHS (the gpu presets' policies without --model) build, abstractly, with the parameter counts of
    the models they are named after; an unknown name is refused."""
    from jaxrl_reason.rl.grpo.recipes import ARCHS, PolicySource

    expected = {"qwen2.5-0.5b": 0.494e9, "qwen3-0.6b": 0.596e9, "r1-distill-qwen-1.5b": 1.777e9, "llama-3.2-1b": 1.236e9}
    assert set(ARCHS) == set(expected)
    for name, params in expected.items():
        model = nnx.eval_shape(lambda: PolicySource(arch=name, max_seq_len=256).build(None, 0, remat=True))
        count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert abs(count - params) / params < 2e-3, (name, count)
        assert (model.cfg.max_seq_len, model.cfg.dtype, model.cfg.remat) == (256, "bfloat16", True)
    with pytest.raises(ValueError, match="unknown arch 'qwen9'"):
        PolicySource(arch="qwen9")


def test_policy_source_builds_the_checkpoint_or_a_fresh_tiny_model(tok, tmp_path):
    """``PolicySource.build``, every experiment's one policy loader: the checkpoint as ``load_hf_model`` loads it
    (window ``max_seq_len``), else a fresh model of the tiny config seeded by ``seed``."""
    from jaxrl_reason.models.lm.hf_import import load_hf_model
    from jaxrl_reason.rl.grpo.recipes import PolicySource, TinyLM
    from testutil import states_equal, tiny_hf_checkpoint

    tiny = TinyLM(d_model=16, n_layers=1, n_heads=2, d_ff=32).config(tok.vocab_size)
    assert states_equal(PolicySource().build(tiny, 3), Transformer(tiny, rngs=nnx.Rngs(3)))
    assert not states_equal(PolicySource().build(tiny, 3), PolicySource().build(tiny, 4))
    ckpt = tiny_hf_checkpoint(tmp_path / "ckpt", tok)
    model = PolicySource(model=str(ckpt), max_seq_len=64).build(tiny, 0)
    assert model.cfg.max_seq_len == 64 and model.cfg.d_model == 32
    assert states_equal(model, load_hf_model(ckpt, max_seq_len=64))
