"""Character-level tokenizers built offline with the `tokenizers` library: the builtin `tiny-arith` task's, and
`build_char_tokenizer(alphabet, vocab_size)` for other synthetic tasks (same specials, same layout).

Vocabulary (32 ids, the size of the tiny model's embedding):

    0 <pad>   1 <bos>   2 <eos>   3 <unk>   4..13 "0".."9"   14 "+"   15 "="   16 " "   17..31 <reserved_i>

Every character is one token (a regex pre-tokenizer isolates each one); a character outside the alphabet encodes to
`<unk>` (never dropped). Encoding adds `<bos>` in front (the prompt "07+35=" becomes `<bos>07+35=`), never `<eos>`.
Decoding fuses tokens with no separator; `skip_special_tokens=True` drops pad/bos/eos/unk and gives the plain text.
The `<reserved_i>` ids only pad the vocabulary to 32; they are ordinary (non-special) tokens, so a model that emits
one decodes to visible garbage (a wrong answer), not to silently shortened text. Padding side is left: the rollout
layout left-pads prompts.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
ALPHABET = "0123456789+= "
VOCAB_SIZE = 32
MODEL_MAX_LENGTH = 128


def char_vocab(alphabet: str, vocab_size: int) -> dict[str, int]:
    """Token -> id map: the 4 specials, `alphabet` (one token per character), then reserved fillers to `vocab_size`."""
    tokens = [*SPECIAL_TOKENS, *alphabet]
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character")
    if len(tokens) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the 4 specials + {len(alphabet)} characters")
    tokens += [f"<reserved_{i}>" for i in range(vocab_size - len(tokens))]
    return {tok: idx for idx, tok in enumerate(tokens)}


def arith_vocab() -> dict[str, int]:
    """Token -> id map of `tiny-arith`: the 4 specials, the task alphabet, then reserved fillers up to `VOCAB_SIZE`."""
    return char_vocab(ALPHABET, VOCAB_SIZE)


def build_char_tokenizer(
    alphabet: str, vocab_size: int, model_max_length: int = MODEL_MAX_LENGTH
) -> PreTrainedTokenizerFast:
    """A character-level HF fast tokenizer over `alphabet` (module docstring: specials, <bos>, left padding)."""
    core = Tokenizer(models.WordLevel(char_vocab(alphabet, vocab_size), unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    core.decoder = decoders.Fuse()  # concatenate pieces, no separator
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, BOS_ID)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=model_max_length,
    )
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID) or len(tokenizer) != vocab_size:
        raise RuntimeError(f"char tokenizer built with special ids {ids} and {len(tokenizer)} tokens")
    return tokenizer


def build_arith_tokenizer() -> PreTrainedTokenizerFast:
    """The `tiny-arith` tokenizer as a standard HF fast tokenizer (saveable, loadable with AutoTokenizer)."""
    return build_char_tokenizer(ALPHABET, VOCAB_SIZE, MODEL_MAX_LENGTH)
