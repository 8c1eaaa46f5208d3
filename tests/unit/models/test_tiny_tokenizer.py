"""The tiny-arith character tokenizer: ids, round trips, unknown characters, save/load through AutoTokenizer."""

import pytest
from transformers import AutoTokenizer

from nemo_jetrl.models.tokenizer import ALPHABET, BOS_ID, EOS_ID, PAD_ID, UNK_ID, VOCAB_SIZE, build_arith_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_arith_tokenizer()


def test_special_ids_and_size(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert len(tok) == VOCAB_SIZE == 32
    assert tok.convert_ids_to_tokens(list(range(4, 17))) == list(ALPHABET)


def test_prompt_encoding_adds_bos_only(tok):
    # "0"=4 .. "9"=13, "+"=14, "="=15, " "=16
    assert tok("07+35=").input_ids == [1, 4, 11, 14, 7, 9, 15]
    assert tok("42", add_special_tokens=False).input_ids == [8, 6]
    assert tok("1 2").input_ids == [1, 5, 16, 6]


def test_unknown_characters_become_unk_not_dropped(tok):
    ids = tok("1x\n2é", add_special_tokens=False).input_ids
    assert ids == [5, UNK_ID, UNK_ID, 6, UNK_ID]


def test_decode_round_trip(tok):
    text = "99+01= 100"
    ids = tok(text).input_ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode([BOS_ID, 8, 6, EOS_ID, PAD_ID, PAD_ID], skip_special_tokens=True) == "42"
    assert tok.decode([BOS_ID, 8, 6, EOS_ID]) == "<bos>42<eos>"
    # reserved fillers are not special: a model that emits one produces visibly wrong text
    assert tok.decode([8, 20, 6], skip_special_tokens=True) == "4<reserved_3>2"


def test_batch_padding_is_left(tok):
    enc = tok(["07+35=", "7+5="], padding=True)
    assert enc.input_ids == [[1, 4, 11, 14, 7, 9, 15], [0, 0, 1, 11, 14, 9, 15]]
    assert enc.attention_mask == [[1] * 7, [0, 0, 1, 1, 1, 1, 1]]


def test_save_and_reload_with_auto_tokenizer(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert len(loaded) == 32 and loaded.padding_side == "left"
    for text in ["07+35=", "1x2", "99+99= 198"]:
        assert loaded(text).input_ids == tok(text).input_ids
    assert loaded.decode([1, 5, 16, 6, 2], skip_special_tokens=True) == "1 2"


def test_char_tokenizer_of_another_alphabet():
    from nemo_jetrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("0123456789#;AB", 24, model_max_length=300)
    assert len(tok) == 24 and tok.model_max_length == 300
    assert tok("A1#").input_ids == [BOS_ID, 4 + 10 + 2, 5, 4 + 10]
    assert tok.decode(tok("AB;9").input_ids, skip_special_tokens=True) == "AB;9"
    assert tok("x", add_special_tokens=False).input_ids == [UNK_ID]
    with pytest.raises(ValueError, match="repeats"):
        build_char_tokenizer("00", 8)
    with pytest.raises(ValueError, match="vocab_size 5"):
        build_char_tokenizer("01", 5)
