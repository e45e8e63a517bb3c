"""The reference pages of the documentation, generated from the code so that they cannot drift.

`render(NAME)` returns the Markdown that docs/hooks.py puts where a page says
`<!-- reference: NAME -->`. The job-file keys come from the config dataclasses, the parameters of
algorithms, loss terms and partitions from their Params dataclasses and signatures, the command
line from its parsers. A dataclass field is documented by the `#` comment after it, continued on
the comment-only lines below it: the comments read in the code are the reference's text.
"""
import ast
import contextlib
import dataclasses
import inspect
import io
import os
import re
import textwrap
import tokenize
import typing
from unittest import mock

from hpcfl.config import JobConfig
from hpcfl.sweep import toml_value


def field_docs(cls: type) -> dict[str, str]:
    """Each field of a dataclass (its bases included) -> the comment that documents it."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if not (dataclasses.is_dataclass(klass) and klass.__dict__.get("__annotations__")):
            continue                                # declares no field of its own (e.g. a preset's Params)
        source = textwrap.dedent(inspect.getsource(klass))
        comments, code_lines = {}, set()
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string.lstrip("#").strip()
            elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                    tokenize.ENDMARKER):
                code_lines.add(token.start[0])
        body = ast.parse(source).body[0].body
        for node in body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                line, text = node.end_lineno + 1, [comments.get(n, "") for n in range(node.lineno, node.end_lineno + 1)]
                while line in comments and line not in code_lines:      # continuation lines
                    text.append(comments[line])
                    line += 1
                docs[node.target.id] = " ".join(t for t in text if t)
    return docs


def toml(value) -> str:
    """A default as a job file writes it: --set's syntax (hpcfl.sweep.toml_value), inline tables spaced."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    return toml_value(value)


def default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def fields_table(cls: type, prefix: str = "") -> str:
    """| key | type | default | meaning | for the fields of a dataclass."""
    docs = field_docs(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) or typing.get_origin(f.type) else f.type.__name__   # list[float]
        shown = default(f)
        rows.append(f"| `{prefix}{f.name}` | {cell(str(kind))} | "
                    f"{'(required)' if shown is None else f'`{cell(toml(shown))}`'} | {cell(docs.get(f.name, ''))} |")
    return "\n".join(rows)


def job_keys() -> str:
    """One section per job-file table: every key, its type, default and meaning."""
    sections = []
    for f in dataclasses.fields(JobConfig):
        cls = f.default_factory
        sections.append(f"## {f.name}\n\n{summary(cls)}\n\n{fields_table(cls, f.name + '.')}\n")
    return "\n".join(sections)


def traits_line(cls) -> str:
    traits = cls.traits
    said = ["keeps no client state between rounds (dealt to workers afresh each round)" if traits.stateless
            else "its clients keep state between rounds (each stays on one worker)"]
    if traits.batched:
        said.append("can train clients together (`train.batched_clients`)")
    return "; ".join(said)


def registry_sections(registry, describe) -> str:
    out = []
    for name in registry:
        found = registry[name]
        params = getattr(found, "Params", None)
        table = fields_table(params) if params and dataclasses.fields(params) else "No parameters."
        out.append(f"## {name}\n\n{summary(found)}\n\n`{found.__module__}.{found.__qualname__}`. {describe(found)}"
                   f"\n\n{table}\n")
    return "\n".join(out)


def algorithms() -> str:
    from hpcfl.algorithms import ALGORITHMS
    return registry_sections(ALGORITHMS, lambda cls: f"In `[algorithm.params]`; {traits_line(cls)}.")


def terms() -> str:
    from hpcfl.terms import TERMS

    def describe(cls):
        said = ["keeps per-client state" if cls.keeps_state else "keeps no per-client state"]
        if cls.needs_anchors:
            said.append("needs the anchor phase (FedFM's anchors)")
        return f"In `[algorithm.terms.<name>]`; {', '.join(said)}."
    return registry_sections(TERMS, describe)


def partitions() -> str:
    from hpcfl.data.partition import PARTITIONS
    rows = ["| `data.partition` | `data.partition_params` (default) | what it does |", "|---|---|---|"]
    for name, scheme in PARTITIONS.items():
        params = [p for p in inspect.signature(scheme).parameters.values() if p.kind is p.KEYWORD_ONLY]
        shown = ", ".join(f"`{p.name}`" + ("" if p.default is p.empty else
                                           f" ({'unset' if p.default is None else toml(p.default)})") for p in params)
        rows.append(f"| `{name}` | {shown or '—'} | {cell(' '.join(inspect.getdoc(scheme).split()))} |")
    return "\n".join(rows)


def models() -> str:
    from hpcfl.models import MODELS, model_options
    rows = ["| `model.name` | built by | `model.params` (default): meaning |", "|---|---|---|"]
    for name in MODELS:
        built = MODELS[name]
        cls = getattr(built, "func", built)             # a partial: its class, with the arguments it fixes
        fixed = ", ".join(f"{k}={v!r}" for k, v in getattr(built, "keywords", {}).items())
        options, docs = model_options(name), field_docs(model_options(name))
        shown = "<br>".join(f"`{f.name}` ({toml(default(f))}): {cell(docs.get(f.name, ''))}"
                            for f in dataclasses.fields(options)) if dataclasses.is_dataclass(options) else ""
        rows.append(f"| `{name}` | `{cls.__name__}{f'({fixed})' if fixed else ''}` | {shown or '—'} |")
    return "\n".join(rows)


def help_text(argv: list[str]) -> str:
    """What `hpcfl ARGV -h` prints, at a fixed width."""
    from hpcfl.cli import main
    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "100"}), contextlib.redirect_stdout(out), \
            contextlib.suppress(SystemExit):
        main([*argv, "-h"])
    return out.getvalue().rstrip()


def cli() -> str:
    from hpcfl.analyze import COMMANDS as ANALYSES
    from hpcfl.cli import COMMANDS
    blocks = [("hpcfl", [])] + [(f"hpcfl {c}", [c]) for c in COMMANDS]
    blocks += [(f"hpcfl analyze {a}", ["analyze", a]) for a in ANALYSES]
    return "\n\n".join(f"## {title}\n\n```text\n{help_text(argv)}\n```" for title, argv in blocks)


def exit_codes() -> str:
    from hpcfl.errors import EXIT_MEANING
    rows = ["| status | name | meaning |", "|---|---|---|"]
    rows += [f"| `{int(code)}` | `{code.name}` | {cell(text)} |" for code, text in EXIT_MEANING.items()]
    return "\n".join(rows)


def summary(found) -> str:
    """The first paragraph of an object's own docstring ("" for the signature a dataclass makes up)."""
    doc = found.__doc__ if inspect.isclass(found) or callable(found) else None
    if not doc or doc.startswith(getattr(found, "__name__", "") + "("):
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


MODULE_PATH = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*\b)")


def signature(name: str, found) -> str:
    """How `hpcfl.NAME` is called (a class: its constructor), annotations without their modules
    (`JobConfig`, not `hpcfl.config.JobConfig`); a constant: its type (and a string its value)."""
    if not callable(found):
        return f"hpcfl.{name}: {type(found).__name__}" + (f" = {found!r}" if isinstance(found, str) else "")
    if not inspect.isclass(found):
        return f"hpcfl.{name}{MODULE_PATH.sub('', str(inspect.signature(found)))}"
    try:
        made = inspect.signature(found).replace(return_annotation=inspect.Signature.empty)
    except ValueError:                          # an exception class: built-in constructor, no signature
        made = "(message)"
    return f"class hpcfl.{name}{MODULE_PATH.sub('', str(made))}"


def python_api() -> str:
    import hpcfl
    blocks = []
    for name in sorted(hpcfl.__all__, key=str.lower):
        found = getattr(hpcfl, name)
        module = hpcfl._EXPORTS.get(name, "hpcfl")
        blocks.append(f"### `{name}`\n\n```python\n{signature(name, found)}\n```\n\n"
                      f"Defined in `{module}`. {summary(found)}".rstrip())
    return "\n\n".join(blocks)


PAGES = {"job-keys": job_keys, "algorithms": algorithms, "terms": terms, "partitions": partitions, "models": models,
         "cli": cli, "exit-codes": exit_codes, "python-api": python_api}


def render(name: str) -> str:
    if name not in PAGES:
        raise KeyError(f"no generated reference {name!r}; known: {sorted(PAGES)}")
    return PAGES[name]()
