"""Writes the reference pages from the code they describe, so they cannot drift from it:
docs/reference/configuration.md from the pydantic configuration (every key: type, default, allowed
values, description) and docs/reference/cli.md from `loopline`'s argparse parser (every command and
option). `python -m pipeline.reference` rewrites both; a test compares them with a fresh generation.
Neither TensorFlow nor TFX is imported."""
from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from pipeline.cli import build_parser
from pipeline.config import LooplineConfig

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "docs" / "reference"
REGENERATE = "python -m pipeline.reference"
# The placeholder a mapping of sections is keyed by in dotted names (`trainer.optimizers.<name>.*`).
_PLACEHOLDERS = {"evaluator.thresholds": "<metric>"}
# Where a section's whole story is told (relative to docs/reference/).
_SEE_ALSO = {
    "pipeline": "[Runs and pushes](../runs-and-pushes.md)",
    "data": "[Your own data](../data.md)",
    "trainer": "[Model quality](../model-quality.md)",
    "serving": "[Serving](../serving.md)",
    "serving.request_log": "[Monitoring](../monitoring.md)",
    "evaluator": "[Model quality](../model-quality.md)",
}


@dataclass(frozen=True)
class Key:
    name: str  # dotted, as `--set` takes it
    type: str
    default: object  # the default as YAML would hold it (None: null); PydanticUndefined: none
    allowed: str
    description: str


@dataclass(frozen=True)
class Section:
    name: str
    description: str
    keys: list[Key]


# ---- the configuration ----------------------------------------------------------------------------

def _section_model(annotation) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _mapping_of_sections(annotation) -> type[BaseModel] | None:
    """The section model of `dict[str, Model]`, else None."""
    if typing.get_origin(annotation) is dict:
        return _section_model(typing.get_args(annotation)[1])
    return None


def config_sections(model: type[BaseModel] = LooplineConfig, prefix: str = "",
                    description: str = "") -> list[Section]:
    """One Section per model reachable from `model` (depth first, in field order); a mapping of
    sections (`trainer.optimizers`) is both a key of its parent and a section of its own."""
    keys, nested = [], []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}.{name}" if prefix else name
        section = _section_model(field.annotation)
        if section is not None:
            nested += config_sections(section, dotted, field.description or "")
            continue
        keys.append(_key(dotted, field))
        mapped = _mapping_of_sections(field.annotation)
        if mapped is not None:
            placeholder = _PLACEHOLDERS.get(dotted, "<name>")
            nested += config_sections(mapped, f"{dotted}.{placeholder}", field.description or "")
    own = [Section(prefix, description, keys)] if prefix and keys else []
    return own + nested


def config_keys() -> list[Key]:
    return [key for section in config_sections() for key in section.keys]


def _key(dotted: str, field: FieldInfo) -> Key:
    type_name, allowed = _describe(field.annotation)
    allowed += _constraints(field.metadata)
    default = field.get_default(call_default_factory=True)
    if default is not PydanticUndefined:
        default = to_jsonable_python(default)
    return Key(dotted, type_name, default, "; ".join(allowed), (field.description or "").strip())


def _describe(annotation) -> tuple[str, list[str]]:
    """A type as a YAML writer reads it ("int or null", "list of string") and its allowed values."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        name, allowed = _describe(args[0])
        return name, allowed + _constraints(args[1:])
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in args if a is not type(None)]
        literals = [a for a in args if typing.get_origin(a) is typing.Literal]
        name = " or ".join(dict.fromkeys(p[0] for p in parts)) + (" or null" if type(None) in args else "")
        if literals and len(parts) > len(literals):  # e.g. an int >= 1, or auto
            return name, [_either(parts)]
        return name, [a for p in parts for a in p[1]]
    if origin is typing.Literal:
        return _scalar_name(type(args[0])), [f"one of: {', '.join(f'`{_yaml(a)}`' for a in args)}"]
    if origin is list:
        item, allowed = _describe(args[0])
        return f"list of {item}", [f"each {a}" for a in allowed]
    if origin is dict:
        key, key_allowed = _describe(args[0])
        value, value_allowed = _describe(args[1])
        return (f"mapping of {key} to {value}",
                [f"keys {a}" for a in key_allowed] + [f"values {a}" for a in value_allowed])
    if _section_model(annotation):
        return "section", []
    return _scalar_name(annotation), []


def _either(parts: list[tuple[str, list[str]]]) -> str:
    """Allowed values of a union such as `Annotated[int, Field(ge=1)] | Literal["auto"]`."""
    texts = []
    for name, allowed in parts:
        if allowed and allowed[0].startswith("one of: "):
            texts.append(allowed[0][len("one of: "):])
        else:
            texts.append(f"{'an' if name[0] in 'aeiou' else 'a'} {name}" + (f" {', '.join(allowed)}" if allowed else ""))
    return ", or ".join(texts)


def _scalar_name(kind) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string"}.get(kind, getattr(kind, "__name__", str(kind)))


def _constraints(metadata) -> list[str]:
    """Pydantic's constraint objects (Field(ge=1, pattern=...)) as text."""
    out = []
    for item in metadata:
        if isinstance(item, FieldInfo):  # the Field(...) inside an Annotated
            out += _constraints(item.metadata)
            continue
        for attr, text in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{text} {_yaml(value)}")
        if isinstance(item, annotated_types.MinLen):
            out.append(f"at least {item.min_length} item{'s' if item.min_length > 1 else ''}")
        elif isinstance(item, annotated_types.MaxLen):
            out.append(f"at most {item.max_length} items")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            out.append(f"matching `{pattern}`")
    return out


def _yaml(value) -> str:
    """A value as it is written in loopline.yaml (flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def configuration_page() -> str:
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the pydantic configuration by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every key of loopline's configuration (`loopline.yaml`), with its type, default, the values it takes and what "
        "it does. Every key can be set in the file or on the command line: `loopline run --set trainer.epochs=5` "
        "(the value is read as YAML). An unknown key or a bad value stops the command before any work, naming the "
        "key. Relative paths are relative to the configuration file's folder. The defaults are the code's; the "
        "bundled `loopline.yaml` sets a few differently (" + _bundled_overrides() + ").",
        "",
    ]
    for section in config_sections():
        lines += [f"## {_text(section.name)}", ""]
        intro = _text(section.description)
        if section.name in _SEE_ALSO:
            intro += f" See {_SEE_ALSO[section.name]}."
        lines += [intro.strip(), "", "| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for key in section.keys:
            default = "(none)" if key.default is PydanticUndefined else _code(_yaml(key.default))
            lines.append(f"| {_code(key.name)} | {key.type} | {default} | {_text(key.allowed)} | "
                         f"{_text(key.description)} |")
        lines.append("")
    return "\n".join(lines)


def _bundled_overrides() -> str:
    """The keys the bundled loopline.yaml sets to something other than the default."""
    bundled = yaml.safe_load((Path(__file__).resolve().parent.parent / "loopline.yaml").read_text())
    defaults = LooplineConfig().as_dict()
    changed = [f"`{section}.{key}: {_yaml(value)}`" for section, values in bundled.items() for key, value in values.items()
               if defaults[section][key] != value]
    return ", ".join(changed)


# ---- the command line -----------------------------------------------------------------------------

def commands(parser: argparse.ArgumentParser | None = None, name: str = "loopline",
             help_text: str = "") -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(command line, help, parser) for `loopline` and every subcommand, nested ones included."""
    parser = parser or build_parser()
    out = [(name, help_text or parser.description or "", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                out += commands(sub, f"{name} {sub_name}", helps.get(sub_name) or "")
    return out


def cli_page() -> str:
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Generated from the argparse parsers (pipeline/cli.py) by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every `loopline` command and its options; `loopline <command> --help` prints the same. The configuration "
        "keys that `--set` takes are in the [configuration reference](configuration.md).",
        "",
    ]
    for name, help_text, parser in commands():
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        lines += [f"## {name}", "", _text(_sentence(help_text)), ""]
        lines += ["```", _usage(parser), "```", ""]
        if parser.epilog:
            lines += [_text(parser.epilog), ""]
        if subcommands:
            lines += ["| command | what it does |", "|---|---|"]
            for action in subcommands:
                for choice in action._choices_actions:
                    lines.append(f"| {_code(name + ' ' + choice.dest)} | {_text(choice.help or '')} |")
            lines.append("")
        options = [a for a in parser._actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if options:
            lines += ["| argument | default | description |", "|---|---|---|"]
            lines += [f"| {_code(_argument(a))} | {_option_default(a)} | {_text(_option_help(a))} |" for a in options]
            lines.append("")
    return "\n".join(lines)


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line at a fixed width (argparse otherwise wraps at the terminal's)."""
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper()
    return ", ".join(action.option_strings) + (f" {metavar}" if takes_value else "")


def _option_default(action: argparse.Action) -> str:
    if action.required or not action.option_strings:
        return "(required)"
    if action.nargs == 0:
        return "off"
    if action.default in (None, []):
        return "(none)"
    return _code(str(action.default))


def _option_help(action: argparse.Action) -> str:
    text = _sentence(action.help or "")
    if action.choices:
        text += f" One of: {', '.join(map(str, action.choices))}."
    if action.nargs in ("+", "*"):
        text += " Repeatable." if action.option_strings else " One or more."
    return text


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else ""


# ---- Markdown -------------------------------------------------------------------------------------

def _code(text: str) -> str:
    """Inline code in a table cell; a pipe inside it would end the cell, so it goes in as HTML."""
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;") + "</code>"


def _text(text: str) -> str:
    """Plain text for a Markdown table cell: code spans kept, `<...>` outside them escaped (not
    read as HTML), pipes escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(_code(part[1:-1]))
        else:
            out.append(part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
                       .replace("*", "\\*"))
    return "".join(out)


def pages() -> dict[str, str]:
    """File name under docs/reference/ -> its content."""
    return {"configuration.md": configuration_page(), "cli.md": cli_page()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REFERENCE_DIR), help="folder to write the pages into")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
