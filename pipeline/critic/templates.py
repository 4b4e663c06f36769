"""Critic prompt templates: versioned Markdown files under prompts/, or plain-text prompts, validated at load.

A template file is a YAML front matter block between two ``---`` lines, then a
``## system`` section and a ``## user`` section whose texts become the two chat messages::

    ---
    task: sentiment
    version: 1
    placeholders: [response]
    labels: [positive, negative]
    ---

    ## system
    ... Task: sentiment ...
    ### Output format
    ...
    ## user
    <response>
    {response}
    </response>

Placeholders are written ``{name}``; a literal brace is written ``{{`` or ``}}``. The
system section must hold a line ``Task: <task>`` (the offline lexicon critic reads it) and
one of the sections an ``### Output format`` heading. The SHA-256 of the file bytes goes
into the annotations table, so a changed prompt is visible in every row it produced.

A file with any other extension (e.g. the paper's ``prompt_sentiment_3shot_v2.txt``) is a
**plain-text prompt**: the whole file is the one user message (no system message), with
positional ``{}`` placeholders filled in the order of the task's ``critic_fields``
(summarization: document, summary, score). It has no front matter, so the task and the
labels come from the caller (``run.task`` and ``critic.labels``).

A prompt whose last line is an open header naming one label (``Identified Positive Text
Span:``) gets that label as ``leading_label``: the model's answer often continues under
that header without repeating it, and the parser gives the first items that label.
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.core.errors import TemplateError

__all__ = ["Template", "load_template"]

FRONT_MATTER_KEYS = ("task", "version", "placeholders", "labels")
_SECTION_HEADING = re.compile(r"^##[ \t]+(\S.*?)[ \t]*$", re.MULTILINE)
_OUTPUT_FORMAT_HEADING = re.compile(r"^###[ \t]+output format[ \t]*$", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class Template:
    """One loaded and validated critic prompt.

    Attributes:
        path: the file it was read from.
        task: the task it critiques (``sentiment``, ``toxicity``, ``summarization``).
        version: the template's declared version, as text.
        placeholders: the field names :meth:`render` requires, in declared order.
        labels: the span labels the output format asks for.
        system: the system message text, placeholders unfilled.
        user: the user message text, placeholders unfilled.
        sha256: hex SHA-256 of the file bytes.
        leading_label: the label of the prompt's last line when that line is an open header
            (``Identified Positive Text Span:``), else ``None``.
        positional: a plain-text prompt: ``user`` holds ``{}`` placeholders, filled in the
            order of ``placeholders``, and there is no system message.
    """

    path: str
    task: str
    version: str
    placeholders: tuple[str, ...]
    labels: tuple[str, ...]
    system: str
    user: str
    sha256: str
    leading_label: str | None = None
    positional: bool = False

    def render(self, fields: dict[str, str]) -> list[dict]:
        """Fill the placeholders and return OpenAI chat messages.

        Params:
            fields: one string value per declared placeholder, no more, no fewer.
        Returns:
            ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``; a
            plain-text prompt gives the user message only.
        Raises:
            TemplateError: a field is missing, undeclared or not a string.
        """
        missing = [name for name in self.placeholders if name not in fields]
        extra = sorted(name for name in fields if name not in self.placeholders)
        if missing or extra:
            raise TemplateError(
                f"{self.path}: render() got missing fields {missing} and extra fields {extra}; "
                f"pass exactly {list(self.placeholders)}"
            )
        not_text = sorted(name for name, value in fields.items() if not isinstance(value, str))
        if not_text:
            raise TemplateError(f"{self.path}: fields {not_text} are not strings; convert them with str() first")
        if self.positional:
            return [{"role": "user", "content": self.user.format(*(fields[name] for name in self.placeholders))}]
        return [
            {"role": "system", "content": self.system.format_map(fields)},
            {"role": "user", "content": self.user.format_map(fields)},
        ]


def load_template(path: str | Path, *, task: str | None = None, labels=(), fields=None) -> Template:
    """Read a prompt template file and validate it.

    Params:
        path: a ``prompts/<task>.md`` file, or a plain-text prompt with ``{}`` placeholders.
        task: the run's task (``run.task``); required for a plain-text prompt; a Markdown
            template names its own (callers compare it with ``run.task``).
        labels: the span labels (``critic.labels``); required for a plain-text prompt; for
            a Markdown template empty means "from the front matter", else they must match it.
        fields: the task's ``critic_fields`` (row -> placeholder values); required for a
            plain-text prompt, whose ``{}`` are filled in the order of the fields it returns.
    Returns:
        The frozen :class:`Template`.
    Raises:
        TemplateError: the file is unreadable, the front matter is missing or incomplete,
            a section is missing, a declared placeholder is unused or an undeclared one is
            used, braces are unbalanced, the ``Task:`` line does not name the task, the
            given labels disagree with the front matter, or a plain-text prompt
            lacks its task, labels or fields or has a placeholder count other than the task's fields.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateError(f"{path}: cannot read the template ({error}); give a UTF-8 prompts/*.md file") from error
    labels = tuple(labels)
    if path.suffix.lower() != ".md":
        return _plain_text_template(path, text, hashlib.sha256(raw).hexdigest(), task=task, labels=labels,
                                    fields=fields)
    template = _markdown_template(path, text, hashlib.sha256(raw).hexdigest())
    if labels and labels != template.labels:
        raise TemplateError(f"{path}: critic.labels {list(labels)} differ from the front matter labels "
                            f"{list(template.labels)}; set critic.labels: [] to use the front matter's")
    return template


def _plain_text_template(path: Path, text: str, sha256: str, *, task: str | None, labels: tuple,
                         fields) -> Template:
    """A whole-file user prompt with positional ``{}`` placeholders in the order of the task's fields."""
    if not task or not labels:
        raise TemplateError(f"{path}: a plain-text prompt has no front matter, so it needs the task and the "
                            f"labels from config (run.task = {task!r}, critic.labels = {list(labels)}); "
                            "set critic.labels, e.g. [positive, negative]")
    names = _field_names(path, task, fields)
    count = _positional_count(path, text)
    if count != len(names):
        raise TemplateError(f"{path}: {count} '{{}}' placeholder(s), but task {task!r} fills {len(names)} "
                            f"({', '.join(names)}, in that order); write one '{{}}' per field, literal "
                            "braces as {{ and }}")
    return Template(path=str(path), task=task, version=sha256[:12], placeholders=names, labels=labels,
                    system="", user=text, sha256=sha256, leading_label=_open_header_label(text, labels),
                    positional=True)


def _field_names(path: Path, task: str, fields) -> tuple[str, ...]:
    """The names `fields` (the task's ``critic_fields``) fills, in order, read from one probe row."""
    if fields is None:
        raise TemplateError(f"{path}: a plain-text prompt is filled in the order of task {task!r}'s critic fields; "
                            "pass fields=pipeline.tasks.get_task(task).critic_fields")
    probe = {"rollout_id": "", "prompt_id": "", "query": "", "response": "", "env_reward": 0.0}
    try:
        return tuple(fields(probe))
    except Exception as error:
        raise TemplateError(f"{path}: cannot read the critic fields of task {task!r} ({error})") from error


def _positional_count(path: Path, text: str) -> int:
    """How many ``{}`` fields ``text`` has; named or numbered fields are rejected."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as error:
        raise TemplateError(f"{path}: unbalanced brace ({error}); write literal braces as {{{{ and }}}}") from error
    fields = [(field, spec, conversion) for _, field, spec, conversion in parsed if field is not None]
    bad = [field for field, spec, conversion in fields if field or spec or conversion]
    if bad:
        raise TemplateError(f"{path}: placeholder {{{bad[0]}}} is not a plain '{{}}'; a plain-text prompt "
                            "uses positional '{}' only")
    return len(fields)


def _open_header_label(text: str, labels: tuple[str, ...]) -> str | None:
    """The one label named by the text's last line when that line is an open header (ends with ':')."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines or not lines[-1].endswith(":"):
        return None
    named = [label for label in labels
             if re.search(r"\b" + r"[\s_-]+".join(map(re.escape, label.split())) + r"\b", lines[-1], re.I)]
    return named[0] if len(named) == 1 else None


def _markdown_template(path: Path, text: str, sha256: str) -> Template:
    """A ``prompts/*.md`` template: front matter, ``## system`` and ``## user`` sections."""
    meta, body = _split_front_matter(path, text)
    system, user = _split_sections(path, body)
    if not _OUTPUT_FORMAT_HEADING.search(system + "\n" + user):
        raise TemplateError(f"{path}: no '### Output format' section; add one saying how the answer must look")
    if not re.search(rf"^Task:[ \t]*{re.escape(meta['task'])}[ \t]*$", system, re.MULTILINE):
        raise TemplateError(f"{path}: the system section has no line 'Task: {meta['task']}'; add it")
    used = _placeholders_used(path, system) | _placeholders_used(path, user)
    declared = set(meta["placeholders"])
    if declared - used:
        raise TemplateError(f"{path}: declared placeholder(s) {sorted(declared - used)} never appear as {{name}}")
    if used - declared:
        raise TemplateError(
            f"{path}: undeclared placeholder(s) {sorted(used - declared)}; declare them in the front matter "
            "or write literal braces as {{ and }}"
        )
    return Template(
        path=str(path),
        task=meta["task"],
        version=meta["version"],
        placeholders=tuple(meta["placeholders"]),
        labels=tuple(meta["labels"]),
        system=system,
        user=user,
        sha256=sha256,
        leading_label=_open_header_label(user, tuple(meta["labels"])),
    )


def _split_front_matter(path: Path, text: str) -> tuple[dict, str]:
    """Return the validated front matter mapping and the text after it."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise TemplateError(f"{path}: no front matter; start the file with a '---' line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise TemplateError(f"{path}: the front matter is not closed; add a '---' line after it") from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)  # one line: the YAML message spans several
        where = f" at line {mark.line + 2}" if mark is not None else ""
        raise TemplateError(f"{path}: the front matter is not valid YAML ({str(error).splitlines()[0]}{where}); "
                            "fix the YAML between the two '---' lines") from None
    if not isinstance(meta, dict):
        raise TemplateError(f"{path}: the front matter must be a mapping with keys {list(FRONT_MATTER_KEYS)}")
    missing = [key for key in FRONT_MATTER_KEYS if key not in meta]
    unknown = sorted(str(key) for key in meta if key not in FRONT_MATTER_KEYS)
    if missing or unknown:
        raise TemplateError(
            f"{path}: front matter is missing {missing} and has unknown keys {unknown}; "
            f"the keys are {list(FRONT_MATTER_KEYS)}"
        )
    return _checked_meta(path, meta), "\n".join(lines[end + 1 :])


def _checked_meta(path: Path, meta: dict) -> dict:
    """Check the types of the front matter values and normalise them."""
    if not isinstance(meta["task"], str) or not meta["task"].strip():
        raise TemplateError(f"{path}: front matter 'task' must be a non-empty string, got {meta['task']!r}")
    if not isinstance(meta["version"], (int, str)) or isinstance(meta["version"], bool) or meta["version"] == "":
        raise TemplateError(f"{path}: front matter 'version' must be a number or string, got {meta['version']!r}")
    for key in ("placeholders", "labels"):
        values = meta[key]
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise TemplateError(f"{path}: front matter '{key}' must be a non-empty list of strings, got {values!r}")
        if len(set(values)) != len(values):
            raise TemplateError(f"{path}: front matter '{key}' has duplicates: {values}")
    bad_names = [name for name in meta["placeholders"] if not name.isidentifier()]
    if bad_names:
        raise TemplateError(f"{path}: placeholder names {bad_names} are not identifiers; use names like 'response'")
    return {
        "task": meta["task"].strip(),
        "version": str(meta["version"]),
        "placeholders": list(meta["placeholders"]),
        "labels": list(meta["labels"]),
    }


def _split_sections(path: Path, body: str) -> tuple[str, str]:
    """Return the stripped texts of the ``## system`` and ``## user`` sections."""
    headings = list(_SECTION_HEADING.finditer(body))
    names = [match.group(1).strip().lower() for match in headings]
    unknown = [name for name in names if name not in ("system", "user")]
    if unknown:
        raise TemplateError(f"{path}: unknown section(s) {unknown}; only '## system' and '## user' are allowed")
    for name in ("system", "user"):
        if names.count(name) != 1:
            raise TemplateError(f"{path}: expected one '## {name}' section, found {names.count(name)}")
    if names != ["system", "user"]:
        raise TemplateError(f"{path}: the '## system' section must come before '## user'")
    if body[: headings[0].start()].strip():
        raise TemplateError(f"{path}: text between the front matter and '## system'; move it into a section")
    system = body[headings[0].end() : headings[1].start()].strip()
    user = body[headings[1].end() :].strip()
    for name, section in (("system", system), ("user", user)):
        if not section:
            raise TemplateError(f"{path}: the '## {name}' section is empty")
    return system, user


def _placeholders_used(path: Path, section: str) -> set[str]:
    """Return the ``{name}`` fields in a section, rejecting anything but plain names."""
    try:
        parsed = list(string.Formatter().parse(section))
    except ValueError as error:
        raise TemplateError(f"{path}: unbalanced brace ({error}); write literal braces as {{{{ and }}}}") from error
    names = set()
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise TemplateError(f"{path}: placeholder {shown} is not a plain {{name}}; use a declared name only")
        names.add(field)
    return names
