"""The server kinds of ``critic.server``, and where each takes a constrained answer.

drlc builds one constrained request per ``critic.answer_format`` (:mod:`pipeline.critic.constraint`):
``json`` as OpenAI's strict ``response_format``, ``copy``/``copy_words`` as a GBNF ``grammar`` plus
drlc's own ``drlc_copy``. That is the *canonical* body: drlc's own server reads it, and llama.cpp's
server reads its ``grammar``. Other servers take the same constraint in other fields, and silently
ignore fields they do not know (vLLM logs and drops a top-level ``grammar``), so
:func:`body_for` rewrites the canonical body for the server kind:

========== ======================================== ===========================
kind       json                                     copy, copy_words
========== ======================================== ===========================
drlc       ``response_format`` (json_schema)        ``grammar`` + ``drlc_copy``
llamacpp   ``response_format`` (json_schema)        ``grammar`` + ``drlc_copy``
vllm       ``structured_outputs: {json: schema}``   ``structured_outputs: {grammar: GBNF}``
sglang     ``response_format`` (json_schema)        ``ebnf: GBNF``
openai     ``response_format`` (json_schema)        refused: OpenAI takes no grammar
========== ======================================== ===========================

drlc and llamacpp keep the canonical body, so their cache keys are those of the drlc that
sent it before ``critic.server`` existed; the kind enters a key only through the body it changes.

Which kind answers (``critic.server: auto``), whether it is up and whether it applied the constraint
is :mod:`pipeline.critic.endpoint`; the constraint itself is built, bounded and checked in
:mod:`pipeline.critic.constraint`.
"""
from __future__ import annotations

from pipeline.core.config import CRITIC_SERVERS
from pipeline.core.errors import ConfigError
from pipeline.critic.constraint import CONSTRAINT_FIELDS, constrained, schema_bound

__all__ = ["KINDS", "body_for"]

KINDS = tuple(kind for kind in CRITIC_SERVERS if kind != "auto")


def body_for(kind: str, body: dict) -> dict:
    """The canonical ``body`` as server ``kind`` takes it (see the module's table); other fields as they are.

    >>> body_for("vllm", {"grammar": "root ::= \\"x\\"", "drlc_copy": {}, "repeat_penalty": 1.0})
    {'repeat_penalty': 1.0, 'structured_outputs': {'grammar': 'root ::= "x"'}}
    """
    if kind not in KINDS:
        raise ConfigError(f"critic server kind {kind!r} is unknown; use one of {list(KINDS)}")
    if kind in ("drlc", "llamacpp") or not constrained(body):
        return body
    rest = {name: value for name, value in body.items() if name not in CONSTRAINT_FIELDS}
    grammar, response_format = body.get("grammar"), body.get("response_format")
    if kind == "vllm":
        if grammar is not None:
            return rest | {"structured_outputs": {"grammar": grammar}}
        bounded = schema_bound(response_format)[2] is not None  # then no free spacing, or the bound would not hold
        return rest | {"structured_outputs": {"json": response_format["json_schema"]["schema"]}
                       | ({"disable_any_whitespace": True} if bounded else {})}
    if grammar is not None:
        if kind == "openai":
            raise ConfigError("critic.server openai takes no grammar (critic.answer_format copy/copy_words): use "
                              "critic.answer_format: json, or a vllm, sglang or llama.cpp server")
        return rest | {"ebnf": grammar}  # sglang
    return rest | {"response_format": response_format}  # sglang, openai: json as OpenAI's response_format

