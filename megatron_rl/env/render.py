"""An observation as tokens: rendered through the model's chat template, appended, nothing re-encoded.

The trajectory's tokens are the prompt's, then each turn exactly as the engine produced it, then each
observation. The observation's tokens are the chat template's text for one more message after an
assistant turn, taken as a difference: the template renders a fixed conversation with and without the
observation, and only the text it adds is encoded. The model's turn is never decoded and encoded
again (re-tokenising "a<|im_end|>" need not give the ids the engine sampled), and the template's
turn closer is not doubled: when the turn ended on its end token, the closer's text that token stands
for is left out of the observation.

The observation's own text is encoded as text: special-token strings in it (a program printing
"<|im_end|>") stay characters, so an environment's output cannot fake a turn boundary. A template that
rewrites earlier turns when a message is added (some drop earlier reasoning) breaks
the rule that a trajectory only grows: it is refused with the reason.

An observation longer than `rollout.observation_max_tokens` keeps its end (the assertion, the error)
and is marked "[...]" where it was cut. Without a chat template (the tiny task's character tokenizer),
the observation is encoded as is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_SENTINEL = "\u2063TURN\u2063"  # text no template adds on its own: where the assistant's content ends


def keep_end(ids: Sequence[int], budget: int) -> list[int]:
    """At most `budget` ids, keeping the end: of a long failure, the last lines (the assertion, the
    error) say the most."""
    ids = list(ids)
    return ids if budget <= 0 or len(ids) <= budget else ids[len(ids) - budget :]


class PlainRenderer:
    """Observations encoded as they are (a tokenizer without a chat template)."""

    def __init__(self, encode: Callable[[str], list[int]]):
        self._encode = encode

    def render(self, observation: str, role: str, turn_ids: Sequence[int], budget: int = 0) -> list[int]:
        return keep_end(self._encode(observation), budget)


class ChatRenderer:
    """Observations as the chat template renders one more message, then the assistant's next header."""

    def __init__(self, tokenizer, stop_ids: Sequence[int] = ()):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatRenderer needs a tokenizer with a chat template (else PlainRenderer)")
        self.tok = tokenizer
        self.stop_ids = {int(t) for t in stop_ids}
        self._cache: dict[str, tuple[str, str]] = {}

    def _template(self, role: str) -> tuple[str, str]:
        """(closer, opener): the template's text after an assistant turn's content up to the observation's
        content, split around it, for messages of `role`."""
        if role in self._cache:
            return self._cache[role]
        convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        before = self._apply(convo, False)
        obs = "\u2063OBS\u2063"
        after = self._apply([*convo, {"role": role, "content": obs}], True)
        if not after.startswith(before):
            raise ValueError(
                f"the chat template renders the conversation before a {role!r} message differently once the "
                "message is added (it rewrites earlier turns): a trajectory's tokens could not only grow; use "
                "a template that appends"
            )
        cut = before.rindex(_SENTINEL) + len(_SENTINEL)
        head, tail = after[cut:].split(obs)
        self._cache[role] = (head, tail)
        return head, tail

    def _apply(self, messages: list[dict], generation_prompt: bool) -> str:
        try:
            return self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as e:  # jinja2 errors: a template that refuses the role
            raise ValueError(f"the chat template refused a {messages[-1]['role']!r} message ({e})") from None

    def render(self, observation: str, role: str, turn_ids: Sequence[int], budget: int = 0) -> list[int]:
        """The observation's tokens; its text cut to its last `budget` tokens first (0: uncut), marked."""
        head, tail = self._template(role)
        # The body is text, whatever it holds: a program that prints "<|im_end|>" gets those characters, not
        # the control token (it would fake a turn boundary in the context the model reads).
        body = self.tok.encode(observation, add_special_tokens=False, split_special_tokens=True)
        if 0 < budget < len(body):
            body = self.tok.encode("[...]", add_special_tokens=False) + keep_end(body, budget)
        if turn_ids and int(turn_ids[-1]) in self.stop_ids:
            said = self.tok.decode([int(turn_ids[-1])], skip_special_tokens=False)
            if head.startswith(said):  # the turn's end token is the closer's first text
                head = head[len(said) :]
        encode = self.tok.encode
        return [*encode(head, add_special_tokens=False), *body, *encode(tail, add_special_tokens=False)]
