"""The real Qwen3 tokenizer (shipped inside the maxtext wheel) and a chat renderer for the agent harness.

Qwen3's chat format, thinking disabled (what the harness uses)::

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{instruction}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{action}<|im_end|>\\n      <- {action}<|im_end|> is generated
    <|im_start|>user\\n<tool_response>\\n{observation}\\n</tool_response><|im_end|>\\n

Rendering is a concatenation of per-segment encodings, and every segment boundary sits next to a special token,
so encoding the segments one by one gives the same ids as encoding the whole string (checked in the tests
against HF ``apply_chat_template``). That is what lets the harness append turns token-in, token-out: the
prompt for turn k+1 is turn k's prompt + the sampled ids + :meth:`ChatRenderer.close_turn` + the rendered
observation + :meth:`ChatRenderer.generation_prompt`, and no sampled text is ever re-tokenized.

One deliberate difference from HF's template: HF drops the empty ``<think></think>`` block from assistant turns
*before* the last user message when it re-renders a history. We keep it in every assistant turn, because it
is what the model actually saw when it sampled that turn.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import tokenizers

ROLES = ("system", "user", "assistant", "tool")


def default_tokenizer_dir() -> Path:
  """The Qwen3 tokenizer folder inside the installed maxtext package."""
  spec = importlib.util.find_spec("maxtext")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("the maxtext package is not installed; it ships the Qwen3 tokenizer")
  return Path(list(spec.submodule_search_locations)[0]) / "assets" / "tokenizers" / "qwen3-tokenizer"


class Tokenizer:
  """A thin wrapper over ``tokenizers.Tokenizer`` with Qwen3's special ids. Special tokens in text are parsed."""

  def __init__(self, path: str | Path):
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
      raise FileNotFoundError(f"tokenizer file {file} does not exist")
    self.path = file
    self._tok = tokenizers.Tokenizer.from_file(str(file))
    self.im_start_id = self._required_id("<|im_start|>")
    self.im_end_id = self._required_id("<|im_end|>")
    self.endoftext_id = self._required_id("<|endoftext|>")
    self.eos_ids = (self.im_end_id, self.endoftext_id)
    self.pad_id = self.endoftext_id
    # A second instance that reads special-token strings in text as plain text (for untrusted content).
    self._plain = tokenizers.Tokenizer.from_file(str(file))
    self._plain.encode_special_tokens = True

  def _required_id(self, token: str) -> int:
    i = self._tok.token_to_id(token)
    if i is None:
      raise ValueError(f"{self.path}: not a Qwen3 tokenizer (no {token} token)")
    return i

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_text(self, text: str) -> list[int]:
    """Encode ``text`` with special-token strings (``<|im_end|>``...) read as ordinary characters."""
    return self._plain.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def vocab(self) -> dict[str, int]:
    """Every token (in the tokenizer's byte-level spelling: a leading space is ``\u0120``) -> its id."""
    return self._tok.get_vocab()

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> Tokenizer:
  return Tokenizer(path)


def load_tokenizer(path: str | Path = "") -> Tokenizer:
  """The Qwen3 tokenizer: ``path`` (a folder with tokenizer.json, or the file), or the one maxtext ships."""
  return _load_cached(str(Path(path) if path else default_tokenizer_dir()))


@dataclasses.dataclass(frozen=True)
class RenderedChat:
  ids: np.ndarray  # (T,) int32
  gen_mask: np.ndarray  # (T,) bool: True where the assistant generated the token (content + <|im_end|>)

  def __len__(self):
    return len(self.ids)


class ChatRenderer:
  """Qwen3 chat rendering to token ids with a generated-token mask (thinking disabled by default)."""

  def __init__(self, tokenizer: Tokenizer, enable_thinking: bool = False):
    self.tok = tokenizer
    self.enable_thinking = enable_thinking
    self._newline = tokenizer.encode("\n")
    self._gen_prompt = tokenizer.encode(
        "<|im_start|>assistant\n" + ("" if enable_thinking else "<think>\n\n</think>\n\n"))

  @property
  def eos_ids(self) -> tuple[int, ...]:
    return self.tok.eos_ids

  def generation_prompt(self) -> list[int]:
    """Ids that open an assistant turn; the model samples what follows."""
    return list(self._gen_prompt)

  def close_turn(self, sampled_ids: Sequence[int]) -> list[int]:
    """Ids to append after a turn's sampled ids so the next message can follow.

    A turn that ended on <|im_end|> only needs the newline; one cut off (max tokens, stop string) gets
    <|im_end|> too. These ids are not generated (gen_mask 0)."""
    if len(sampled_ids) and int(sampled_ids[-1]) == self.tok.im_end_id:
      return list(self._newline)
    return [self.tok.im_end_id] + list(self._newline)

  def _framed(self, head: str, content: str, tail: str) -> list[int]:
    """``head + content + tail`` as ids, where only the frame may contain control tokens.

    Content (an instruction, a command's output, an action) is untrusted: a program that prints
    ``<|im_end|><|im_start|>assistant`` must not forge turn structure. Content without such strings is
    encoded in one piece (identical to HF's template); content with them is encoded apart, as plain text."""
    if "<|" not in content:
      return self.tok.encode(head + content + tail)
    return self.tok.encode(head) + self.tok.encode_text(content) + self.tok.encode(tail)

  def render_message(self, role: str, content: str) -> list[int]:
    """One complete non-assistant message (system, user, or a tool observation) as ids."""
    if role == "system" or role == "user":
      return self._framed(f"<|im_start|>{role}\n", content, "<|im_end|>\n")
    if role == "tool":
      return self._framed("<|im_start|>user\n<tool_response>\n", content, "\n</tool_response><|im_end|>\n")
    if role == "assistant":
      ids, _ = self.render_assistant(content)
      return ids
    raise ValueError(f"unknown chat role {role!r} (known: {ROLES})")

  def render_assistant(self, content: str) -> tuple[list[int], list[bool]]:
    """A complete assistant turn: generation prompt + content + <|im_end|> + newline, with its gen mask."""
    body = self.tok.encode_text(content) + [self.tok.im_end_id]
    ids = self.generation_prompt() + body + list(self._newline)
    mask = [False] * len(self._gen_prompt) + [True] * len(body) + [False] * len(self._newline)
    return ids, mask

  def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> RenderedChat:
    """Render a conversation. ``messages``: [{"role": system|user|assistant|tool, "content": str}, ...].

    Consecutive tool messages share one user turn (as in Qwen3's template)."""
    ids: list[int] = []
    mask: list[bool] = []
    i = 0
    while i < len(messages):
      m = messages[i]
      role, content = _role_content(m, i)
      if role == "assistant":
        seg, seg_mask = self.render_assistant(content)
      elif role == "tool":
        # Group a run of tool observations into one user turn.
        parts = [content]
        while i + 1 < len(messages) and _role_content(messages[i + 1], i + 1)[0] == "tool":
          i += 1
          parts.append(_role_content(messages[i], i)[1])
        seg = self.tok.encode("<|im_start|>user")
        for p in parts:
          seg += self._framed("\n<tool_response>\n", p, "\n</tool_response>")
        seg += self.tok.encode("<|im_end|>\n")
        seg_mask = [False] * len(seg)
      else:
        seg = self.render_message(role, content)
        seg_mask = [False] * len(seg)
      ids += seg
      mask += seg_mask
      i += 1
    if add_generation_prompt:
      ids += self._gen_prompt
      mask += [False] * len(self._gen_prompt)
    return RenderedChat(np.asarray(ids, np.int32), np.asarray(mask, bool))

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def _role_content(m: Mapping[str, str], i: int) -> tuple[str, str]:
  try:
    role, content = m["role"], m["content"]
  except (KeyError, TypeError):
    raise ValueError(f"message {i}: expected a mapping with 'role' and 'content', got {m!r}") from None
  if role not in ROLES:
    raise ValueError(f"message {i}: unknown chat role {role!r} (known: {ROLES})")
  if not isinstance(content, str):
    raise ValueError(f"message {i}: content must be a string, got {type(content).__name__}")
  return role, content
