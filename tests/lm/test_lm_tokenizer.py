"""Byte tokenizer and tokenizer.json (tokenizers library) behind one interface."""

import numpy as np
import pytest

from jaxrl_reason.models.tokenizer import ByteTokenizer, HFTokenizer


def test_byte_tokenizer_roundtrip_and_specials():
    tok = ByteTokenizer(extra_special=("<sep>",))
    text = "<think>héllo 2+2</think><answer>4</answer><eos>"
    ids = tok.encode(text, allow_special=True)
    assert ids[0] == tok.token_to_id("<think>") and ids[-1] == tok.eos_id
    assert tok.decode(ids) == text and tok.decode(ids, skip_special=True) == "héllo 2+24"
    assert tok.vocab_size == 8 + 256 and max(ids) < tok.vocab_size
    batch, lens = tok.encode_batch(["ab", "<sep>c"], max_len=4, add_bos=True, allow_special=True)
    assert batch.tolist() == [[1, 97 + 8, 98 + 8, 0], [1, 7, 99 + 8, 0]] and lens.tolist() == [3, 3]
    assert tok.ids_array(["</answer>", "<eos>"]).tolist() == [6, 2]
    with pytest.raises(ValueError, match="max_len"):
        tok.encode_batch(["abcdef"], max_len=3)
    assert tok.chat_prompt("1+1?").endswith("User: 1+1? Assistant: <think>")


def test_hf_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tk = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<unk>", "<think>", "</think>", "<answer>", "</answer>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["what is two plus two? the answer is four."] * 20, trainer)
    tk.decoder = __import__("tokenizers").decoders.ByteLevel()
    path = tmp_path / "tokenizer.json"
    tk.save(str(path))
    tok = HFTokenizer.from_file(path)
    prompt = tok.chat_prompt("what is two plus two?") + " four </think><answer>four</answer>"
    ids = tok.encode(prompt, allow_special=True)
    assert tok.decode(ids) == prompt
    assert tok.token_to_id("</answer>") in ids and tok.eos_id == tok.token_to_id("<|endoftext|>")
    batch, lens = tok.encode_batch(["two plus", "four"], max_len=8)
    assert batch.shape == (2, 8) and np.all(batch[1, lens[1]:] == tok.pad_id)
    assert tok.decode_batch(batch, lens) == ["two plus", "four"]
