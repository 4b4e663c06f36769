"""Critic prompt templates: versioned Markdown files under prompts/, validated at load.

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
"""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.errors import TemplateError

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
    """

    path: str
    task: str
    version: str
    placeholders: tuple[str, ...]
    labels: tuple[str, ...]
    system: str
    user: str
    sha256: str

    def render(self, fields: dict[str, str]) -> list[dict]:
        """Fill the placeholders and return OpenAI chat messages.

        Params:
            fields: one string value per declared placeholder, no more, no fewer.
        Returns:
            ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``.
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
        return [
            {"role": "system", "content": self.system.format_map(fields)},
            {"role": "user", "content": self.user.format_map(fields)},
        ]


def load_template(path: str | Path) -> Template:
    """Read a prompt template file and validate it.

    Params:
        path: a ``prompts/<task>.md`` file.
    Returns:
        The frozen :class:`Template`.
    Raises:
        TemplateError: the file is unreadable, the front matter is missing or incomplete,
            a section is missing, a declared placeholder is unused or an undeclared one is
            used, braces are unbalanced, or the ``Task:`` line does not name the task.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateError(f"{path}: cannot read the template ({error}); give a UTF-8 prompts/*.md file") from error
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
        sha256=hashlib.sha256(raw).hexdigest(),
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
