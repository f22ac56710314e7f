"""rl/grpo/recipes.py: ``ARCHS`` (the gpu presets' policies) and ``PolicySource``, every experiment's one policy
loader."""

import jax
import pytest
from flax import nnx

from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.tokenizer import HFTokenizer


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer.train_bpe(["what is 1 plus 2? <think>3</think><answer>3</answer>"] * 8, 120,
                                 special_tokens=("<pad>", "<bos>", "<eos>"))


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


def test_setup_policy_sizes_a_checkpoints_prompts_and_its_window_for_the_eval_file(tok, tmp_path):
    """``setup_policy`` with a checkpoint and no prompt length: the longest probed task prompt through its template
    (here the plain R1 prompt: no chat template) + ``PROMPT_MARGIN``; the window fits that or the eval file's longest
    kept prompt (rows over the window minus the new tokens dropped and counted) + the new tokens; a given length
    too short is one error naming --prompt-len and the length needed."""
    from testutil import tiny_hf_checkpoint

    from jaxrl_reason.data import write_jsonl
    from jaxrl_reason.rl.grpo import recipes
    from jaxrl_reason.rl.grpo.agent import GRPOConfig
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    ckpt = str(tiny_hf_checkpoint(tmp_path / "ckpt", tok))
    tasks, grpo = [RandomCalculation(1, 1, 9, "+-*")], GRPOConfig(max_new_tokens=8)
    fmt = recipes.checkpoint_format(tok)
    need = recipes.longest_prompt(tasks, tok, fmt, 0)
    assert need == max(len(recipes.prompt_ids(tok, p, fmt)) for p in recipes.sft_problems(tasks, 64, 5))
    setup = lambda **kw: recipes.setup_policy(recipes.PolicySource(ckpt, max_seq_len=need + 60), recipes.TinyLM(),
                                              recipes.WarmStart(), tasks, 0, raw_prompt_len=24, grpo=grpo, **kw)
    policy = setup(prompt_len=None)
    assert policy.prompt_len == need + recipes.PROMPT_MARGIN and policy.model.cfg.max_seq_len == need + 16
    assert policy.heldout_file is None
    long = "what is " + "1+" * 10 + "1?"
    write_jsonl([{"prompt": "what is 1+2?", "answer": "3"}, {"prompt": long, "answer": "31"},
                 {"prompt": long * 3, "answer": "0"}], tmp_path / "eval.jsonl")
    policy = setup(prompt_len=need, eval_file=recipes.EvalFile(str(tmp_path / "eval.jsonl")))
    held = policy.heldout_file.dataset
    assert (len(held), held.dropped) == (2, 1) and held.prompt_len > need  # the third is over the window
    assert policy.prompt_len == need and policy.model.cfg.max_seq_len == held.prompt_len + 8
    with pytest.raises(ValueError, match=rf"--prompt-len {need - 1} is too short: the task prompts through the "
                                         rf"checkpoint's chat template need {need} tokens"):
        setup(prompt_len=need - 1)


def test_eval_files_render_as_the_task_prompts_and_bad_rewards_fail_first(tmp_path):
    """Without a chat template an eval file's prompts are ``<bos>`` + the text, as the tasks' raw prompts
    (``prompt_ids``), and the default reward is the experiments' own: exact match of the ``<answer>`` span; unknown
    rewards are refused when the config is made; the tiny LM's prompts keep the raw length, checked."""
    from jaxrl_reason.data import write_jsonl
    from jaxrl_reason.models.tokenizer import CharTokenizer
    from jaxrl_reason.rl.grpo import recipes
    from jaxrl_reason.rl.grpo.agent import GRPOConfig
    from jaxrl_reason.tasks.base import Problem
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    char = CharTokenizer()
    path = write_jsonl([{"prompt": "calc 3+4", "answer": "7"}], tmp_path / "eval.jsonl")
    ev = recipes.heldout_file(recipes.EvalFile(str(path)), char, None, 40, GRPOConfig(max_new_tokens=8))
    ids, lens = ev.dataset.ids([0])
    problem = Problem(prompt="calc 3+4", answer="7", wrong="6", trace="", difficulty=1, task="calc")
    assert ids[0, : lens[0]].tolist() == recipes.prompt_ids(char, problem)
    (fn,) = recipes.EvalFile(str(path)).reward_fns()
    assert fn.name == "exact_match" and fn(["p", "p"], ["<answer>7</answer>", "7"], answer=["7", "7"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="unknown --eval-reward 'exact'"):
        recipes.EvalFile(str(path), eval_reward=("exact",))
    with pytest.raises(ValueError, match=r"--prompt-len 5 is too short: the task prompts \(<bos> \+ the problem text\) "
                                         r"need 9 tokens"):
        recipes.setup_policy(recipes.PolicySource(), recipes.TinyLM(), recipes.WarmStart(),
                             [RandomCalculation(1, 1, 9, "+-*")], 0, prompt_len=5, raw_prompt_len=24,
                             grpo=GRPOConfig(max_new_tokens=8))


def test_gpu_preset_scales_grpo_and_prompts_then_applies_the_changes():
    """``gpu_preset``: the task experiments' shared "gpu" block (128 prompts x 16, 512 new tokens, lr 1e-6,
    8 minibatches, prompts of 256 and answers of 16), the other GRPO settings kept, then the changes given."""
    import dataclasses

    from jaxrl_reason.rl.grpo.agent import GRPOConfig
    from jaxrl_reason.rl.grpo.recipes import GPU_LM, TinyLM, gpu_preset

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        lm: TinyLM = TinyLM()
        grpo: GRPOConfig = GRPOConfig(temperature=0.7, max_new_tokens=20)
        prompt_len: int | None = None
        answer_len: int = 12
        rl_steps: int = 10

    gpu = gpu_preset(Cfg(), lm=GPU_LM, rl_steps=400, answer_len=20)
    g = gpu.grpo
    assert (g.prompts_per_step, g.group_size, g.max_new_tokens, g.lr, g.minibatches, g.temperature) == (
        128, 16, 512, 1e-6, 8, 0.7)
    assert (gpu.prompt_len, gpu.answer_len, gpu.rl_steps, gpu.lm) == (256, 20, 400, GPU_LM)
