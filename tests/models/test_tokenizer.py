"""Byte, character (the synthetic tasks') and tokenizer.json (tokenizers library) tokenizers behind one
interface, and the seam every LM capability uses: R1 tag ids, sampler stops, padding, model checks and
decoding of sampled completions."""

import numpy as np
import pytest

from jaxrl_reason.models.lm import LMConfig
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer, HFTokenizer, TagIds


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
    with pytest.raises(ValueError, match="sequence of 6 tokens does not fit the padded length 3: 'abcdef'"):
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


def test_char_tokenizer_keeps_the_task_vocabulary_ids():
    """The 96 ids of the former tasks.vocab.VOCAB: pad, bos, eos, the 4 tags, <unk>, then the characters."""
    tok = CharTokenizer()
    assert tok.vocab_size == 96 and (tok.pad_id, tok.bos_id, tok.eos_id, tok.token_to_id("<unk>")) == (0, 1, 2, 7)
    assert tok.tag_ids() == TagIds(3, 4, 5, 6)
    assert tok.encode("3+4=") == [11, 18, 12, 22] and tok.encode("aZ") == [34, 85]
    assert tok.encode("<answer>") == tok.encode("<") + tok.encode("answer>") and len(tok.encode("<answer>")) == 8
    text = "<think>1+2</think><answer>3</answer>"
    ids = tok.encode(text, allow_special=True)
    assert ids == [3, 9, 18, 10, 4, 5, 11, 6] and tok.decode(ids) == text and tok.decode(ids, skip_special=True) == "1+23"
    assert tok.encode("é_") == [7, 7] and tok.decode([7, 95]) == "<unk><unk>"  # unknown characters, unused ids
    assert tok.decode(tok.encode("calc 12*(3-4)/5 = ?")) == "calc 12*(3-4)/5 = ?"
    stop_tokens, stop_seqs = tok.stops(["</answer>"])
    assert stop_tokens.tolist() == [2, 6] and stop_seqs is None  # one token each: no stop sequence needed
    batch, lens = tok.pad_batch([[1, 11], [1, 11, 18, 12]], 5)
    assert batch.tolist() == [[1, 11, 0, 0, 0], [1, 11, 18, 12, 0]] and lens.tolist() == [2, 4]
    with pytest.raises(ValueError, match="does not fit the padded length 2"):
        tok.pad_batch([[1, 2, 3]], 2)
    # sampled rows [B, N] with lengths (the stop token included): tags kept, a final eos dropped
    toks = np.array([[3, 11, 4, 5, 11, 6, 0], [11, 18, 2, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0]])
    assert tok.decode_completions(toks, np.array([6, 3, 0])) == ["<think>3</think><answer>3</answer>", "3+", ""]
    cfg = LMConfig(vocab_size=96, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=32)
    tok.check_model(cfg, 32, "test")
    with pytest.raises(ValueError, match="test: a sequence needs 33 tokens > the model's window max_seq_len=32"):
        tok.check_model(cfg, 33, "test")
    with pytest.raises(ValueError, match="model vocab_size 64 < the tokenizer's 96"):
        tok.check_model(LMConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32), 8, "test")


CORPUS = [f"calc {a}+{b}*{c} <think>{a}+{b * c}</think><answer>{a + b * c}</answer>"
          for a in range(10) for b in range(5) for c in range(4)]


def test_train_bpe_specials_tags_and_stop_sequences(tmp_path):
    """train_bpe with only pad/bos/eos as special tokens: the R1 tags are several tokens, so token-level
    tag parsing refuses and ``</answer>`` becomes a stop sequence; with the default specials every tag is one id."""
    tok = HFTokenizer.train_bpe(CORPUS, 300, special_tokens=("<pad>", "<bos>", "<eos>"))
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2) and tok.vocab_size <= 300
    assert not tok.add_bos_token and len(tok.encode("</answer>")) > 1
    with pytest.raises(ValueError, match="R1 tags .* are not single tokens"):
        tok.tag_ids()
    stop_tokens, stop_seqs = tok.stops(["</answer>", "<eos>"])
    assert stop_tokens.tolist() == [2]
    assert np.asarray(stop_seqs).tolist() == [tok.encode("</answer>")]
    text = CORPUS[17]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    row = np.array(ids + [tok.eos_id] + [tok.pad_id] * 3)
    assert tok.decode_completions(row[None], np.array([len(ids) + 1])) == [text]

    full = HFTokenizer.train_bpe(CORPUS, 300)  # DEFAULT_SPECIAL
    assert full.tag_ids() == TagIds(3, 4, 5, 6) and full.stops(["</answer>"])[0].tolist() == [2, 6]
    assert full.encode("<answer>") != [5] and full.encode("<answer>", allow_special=True) == [5]
    full.save(tmp_path / "tok")
    back = HFTokenizer.from_pretrained(tmp_path / "tok")
    assert back.encode(text) == full.encode(text) and back.tag_ids() == full.tag_ids() and back.eos_id == 2
    with pytest.raises(ValueError, match="must be among special_tokens"):
        HFTokenizer.train_bpe(CORPUS, 300, special_tokens=("<pad>", "<bos>"))


def test_char_ids_and_spell_one_token_per_character():
    """``Tokenizer.char_ids`` / ``spell``: our tokenizers keep their own ids; a byte-level BPE spells every
    printable character as one token (not its merged tokenization); a missing character is named."""
    from jaxrl_reason.models.tokenizer import CHARS

    char = CharTokenizer()
    table = char.char_ids()
    assert table.shape == (128,) and table.dtype == np.int32 and not table.flags.writeable
    assert table is char.char_ids()  # cached per instance
    for b in range(128):
        assert table[b] == (char.encode(chr(b))[0] if chr(b) in CHARS else -1), chr(b)
    assert char.spell("3+4=7") == char.encode("3+4=7")
    byte = ByteTokenizer()
    np.testing.assert_array_equal(byte.char_ids(), np.arange(128) + byte.n_special)
    assert byte.spell("a|b\n") == byte.encode("a|b\n")
    bpe = HFTokenizer.train_bpe(CORPUS, 300)
    printable = "".join(map(chr, range(32, 127)))
    assert (bpe.char_ids()[[ord(c) for c in printable]] >= 0).all()
    text = "calc 12+3 <answer>15</answer>"
    spelled = bpe.spell(text)
    assert spelled == [bpe.encode(c)[0] for c in text] != bpe.encode(text) and bpe.decode(spelled) == text
    with pytest.raises(ValueError, match=r"CharTokenizer \(vocab_size 96\) does not encode '\|' as a single token"):
        char.spell("a|b")
    with pytest.raises(ValueError, match="'é'"):
        bpe.spell("café")
    # strict=False: a character that is not one token is its own encoding (ASTRO's SpelledTokenizer)
    assert bpe.spell("café", strict=False) == bpe.spell("caf") + bpe.encode("é") and len(bpe.encode("é")) == 2
    assert char.spell("a|b", strict=False) == char.encode("a|b") and char.encode("|") == [char.unk_id]


def test_spelled_tokenizer_reads_and_writes_the_r1_tags_as_words_of_its_vocabulary():
    """``SpelledTokenizer(tags=...)``: each R1 tag is one existing word token (no new ids): encode with specials gives
    the word's id, decode reads it back as the tag (dropped with skip_special), text from data spells the tag, the
    in-jit byte tables read the word as no character, and bad words are refused."""
    from jaxrl_reason.models.tokenizer import R1_TAGS, UNKNOWN, SpelledTokenizer, token_bytes

    words = (" Steps", " So", " answer", " Done")
    bpe = HFTokenizer.train_bpe(["3+4=? Steps 3+4=7 So answer 7 Done"] * 64, 300, ("<pad>", "<bos>", "<eos>"))
    tok = SpelledTokenizer(bpe, tags=dict(zip(R1_TAGS, words)))
    assert tok.vocab_size == bpe.vocab_size and list(tok.tag_ids()) == [bpe.single_token_id(w) for w in words]
    text = "<think>3+4=7</think><answer>7</answer>"
    ids = tok.encode(text, allow_special=True)
    assert len(ids) == 4 + 5 + 1 and tok.decode(ids) == text and tok.decode(ids, skip_special=True) == "3+4=77"
    assert bpe.decode(ids) == " Steps3+4=7 So answer7 Done"
    assert tok.encode("<think>") == bpe.spell("<think>", strict=False)  # data: the tag spelled
    table, lengths = token_bytes(tok)
    assert all(table[i, 0] == UNKNOWN and lengths[i] == 1 for i in tok.tag_ids())
    for bad, match in (({"<think>": "S"}, "two or more characters"), ({"<think>": " Steps", "</think>": " Steps"},
                                                                      "distinct"),
                       ({"<eos>": " So"}, "maps the R1 tags"), ({"<think>": "<eos>"}, "no control token")):
        with pytest.raises(ValueError, match=match):
            SpelledTokenizer(bpe, tags=bad)
