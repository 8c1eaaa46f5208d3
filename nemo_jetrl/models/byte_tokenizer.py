"""An offline byte-level ChatML tokenizer for random-weight stand-ins of real models (no download, no training).

Vocabulary (259 ids): ids 0..255 are the 256 bytes (GPT-2's byte-to-unicode alphabet, in byte order, no merges), then
`<|endoftext|>` 256 (pad), `<|im_start|>` 257, `<|im_end|>` 258 (eos: ends a chat turn), Qwen's special-token
spellings. Any text round-trips exactly (one token per UTF-8 byte); the chat template is Qwen's ChatML without tools.
The model's vocabulary may be larger (Qwen3: 151936): ids >= 259 decode to nothing, like Qwen's unused padding ids.
Padding side is left (the rollout layout); encoding adds no BOS / EOS.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
NUM_BYTES = 256
PAD_ID, IM_START_ID, IM_END_ID = NUM_BYTES, NUM_BYTES + 1, NUM_BYTES + 2
BYTE_VOCAB_SIZE = NUM_BYTES + 3
MODEL_MAX_LENGTH = 1 << 20
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (the ByteLevel pre-tokenizer's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(NUM_BYTES):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(NUM_BYTES + extra)
            extra += 1
    return chars


def byte_vocab() -> dict[str, int]:
    """Token -> id: the 256 byte characters in byte order, then the 3 special tokens."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    if set(vocab) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("byte alphabet differs from tokenizers' ByteLevel alphabet")
    vocab.update({PAD_TOKEN: PAD_ID, IM_START: IM_START_ID, IM_END: IM_END_ID})
    return vocab


def build_byte_chat_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level ChatML tokenizer as a HF fast tokenizer (save_pretrained / AutoTokenizer round-trip)."""
    core = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
    )
    ids = (tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids(IM_START), tokenizer.eos_token_id)
    if ids != (PAD_ID, IM_START_ID, IM_END_ID) or len(tokenizer) != BYTE_VOCAB_SIZE:
        raise RuntimeError(f"byte tokenizer built with special ids {ids} and {len(tokenizer)} tokens")
    return tokenizer
