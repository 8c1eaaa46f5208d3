"""Turn a dataset problem into the prompt text the rollout engine tokenizes.

1. `prompt_template` (optional): a `str.format` template with one positional `{}` for the problem, NeMo-RL's prompt
   file convention; literal braces are doubled (`\\boxed{{}}`). None = the problem as is.
2. `use_chat_template`: the result becomes the user message (after an optional `system_prompt`) and is rendered with
   `tokenizer.apply_chat_template(..., add_generation_prompt=True, **chat_template_kwargs)` (NeMo-RL's
   `policy.tokenizer.chat_template_kwargs`, e.g. Qwen3's `enable_thinking`). A tokenizer without a chat template is an
   error (set `data.use_chat_template: false` for a plain-text prompt).

The GRPO loop encodes prompts with `tokenizer(text)`, which adds the tokenizer's own special tokens (e.g. Llama-3's
`<|begin_of_text|>`); when the rendered chat text already starts with that BOS, it is stripped here so the prompt
holds it exactly once.
"""

from __future__ import annotations

from typing import Any


def check_template(template: str | None) -> str | None:
    """`template` if it formats one problem string; ValueError naming `data.prompt_template` otherwise."""
    if template is None:
        return None
    if not isinstance(template, str):
        raise ValueError(f"data.prompt_template must be a string or null, got {type(template).__name__}")
    marker = "\x00problem\x00"
    try:
        rendered = template.format(marker)
    except (IndexError, KeyError, ValueError) as err:
        raise ValueError(
            f"data.prompt_template must be a str.format template with exactly one '{{}}' for the problem "
            f"(double literal braces: '\\\\boxed{{{{}}}}'); formatting it failed: {type(err).__name__}: {err}"
        ) from err
    if rendered.count(marker) != 1:
        raise ValueError(
            f"data.prompt_template must contain exactly one '{{}}' placeholder for the problem, found "
            f"{rendered.count(marker)}"
        )
    return template


class PromptFormatter:
    """Problem text -> prompt text (template, then chat template); see the module docstring."""

    def __init__(
        self,
        tokenizer: Any | None,
        *,
        template: str | None = None,
        system_prompt: str | None = None,
        use_chat_template: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.template = check_template(template)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.system_prompt = system_prompt
        self.use_chat_template = bool(use_chat_template)
        self.tokenizer = tokenizer
        self._strip_bos: str | None = None
        if self.use_chat_template:
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                name = getattr(tokenizer, "name_or_path", None) or "(none)"
                raise ValueError(
                    f"data.use_chat_template is true but the tokenizer {name} has no chat template; "
                    "add one to its tokenizer_config.json / chat_template.jinja or set data.use_chat_template: false"
                )
            self._strip_bos = self._auto_bos(tokenizer)
        elif system_prompt:
            raise ValueError("data.system_prompt needs data.use_chat_template: true (plain prompts have no roles)")

    @staticmethod
    def _auto_bos(tokenizer: Any) -> str | None:
        """The BOS text when `tokenizer(text)` inserts the BOS id itself, else None."""
        bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
        if not bos or bos_id is None:
            return None
        ids = tokenizer("x")["input_ids"]
        return bos if ids and ids[0] == bos_id else None

    def render(self, problem: str) -> str:
        text = self.template.format(problem) if self.template is not None else problem
        if not self.use_chat_template:
            return text
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        rendered = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        if self._strip_bos and rendered.startswith(self._strip_bos):
            rendered = rendered[len(self._strip_bos) :]
        return rendered
