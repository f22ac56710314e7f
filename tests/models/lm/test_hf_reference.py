"""models.lm.hf_reference: the left-padded batch layout (no torch needed), and with transformers the multi-turn
``generate`` loop gives our greedy tokens on the same weights (a tiny random Qwen2)."""

import numpy as np
import pytest

from jaxrl_reason.models.lm.hf_reference import hf_multiturn_generate, left_pad, random_hf_checkpoint


def test_left_pad_moves_each_row_to_the_right_end():
    ids, mask = left_pad(np.array([[5, 6, 7], [8, 0, 0]]), np.array([3, 1]), pad_id=9)
    np.testing.assert_array_equal(ids, [[5, 6, 7], [9, 9, 8]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])


def test_an_unknown_family_is_refused(tmp_path):
    with pytest.raises(ValueError, match="family"):
        random_hf_checkpoint(tmp_path, "gpt2", vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                             d_ff=32, max_len=32)


def test_the_loop_resends_the_conversation_and_matches_our_greedy_turns(tmp_path):
    pytest.importorskip("torch")  # a failure in CI (testutil.fail_if_required)
    transformers = pytest.importorskip("transformers")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_reason.envs.text import FixedTextEnv
    from jaxrl_reason.models.lm import load_model
    from jaxrl_reason.models.lm.sampler import SamplerConfig
    from jaxrl_reason.rl.lm.multiturn import lm_responder, make_rollout

    path = random_hf_checkpoint(tmp_path, "qwen2", vocab_size=128, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                d_ff=64, max_len=64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    prompts, lens, obs = np.array([[3, 4, 5, 6], [7, 8, 0, 0]]), np.array([4, 2]), np.array([9, 10, 11])
    turns = hf_multiturn_generate(hf, prompts, lens, obs, turns=3, turn_tokens=4)
    assert turns.shape == (2, 3, 4)
    model = load_model(str(path), max_seq_len=64)
    graphdef, state = nnx.split(model)
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=4, temperature=0.0), stop_tokens=())
    ep = jax.jit(make_rollout(FixedTextEnv(prompts, lens, obs, 3), respond, 4))(state, jax.random.key(0),
                                                                                 jnp.arange(2))
    seqs, mask = np.asarray(ep.seqs), np.asarray(ep.loss_mask)
    ours = np.stack([seqs[b, lens[b]:lens[b] + mask.shape[1]][mask[b] == 1] for b in range(2)]).reshape(2, 3, 4)
    np.testing.assert_array_equal(turns, ours)
    np.testing.assert_array_equal(seqs[1, 2 + 4:2 + 4 + 3], obs)  # the observation follows each turn
