"""The generated reference pages (docs/reference/): every configuration key is described, the
committed pages are what the code generates now, and what they list is real."""
from __future__ import annotations

import contextlib
import html
import io
import re
import typing

import pytest
import yaml
from pydantic import BaseModel

from pipeline import reference
from pipeline.cli import build_parser
from pipeline.config import _PATH_KEYS, ConfigError, LooplineConfig, load_config
from tests.conftest import REPO

PAGES = REPO / "docs" / "reference"
# A name for the placeholder of a mapping of sections, to try its keys with.
SAMPLE = {"<name>": "discriminator", "<metric>": "loss"}


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from `model` through its fields' types (unions, lists and
    mappings included), by a walk of its own: it does not trust the generator's."""
    seen[model.__name__] = model
    stack = [field.annotation for field in model.model_fields.values()]
    while stack:
        annotation = stack.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation.__name__ not in seen:
                _models(annotation, seen)
        else:
            stack.extend(typing.get_args(annotation))
    return seen


def test_every_config_key_has_a_description():
    models = _models(LooplineConfig, {})
    assert {"TrainerConfig", "OptimizerSettings", "Bound", "BatchingConfig", "RequestLogConfig"} <= set(models)
    missing = [f"{model.__module__}.{name}.{key}" for name, model in models.items()
               for key, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"config keys without Field(..., description=...): {', '.join(missing)}"


def test_every_default_config_value_is_in_the_reference():
    """The flattened default configuration (every leaf value, by dotted key) against the keys the
    generator found: a key the walk missed fails here, naming it."""
    documented = {key.name for key in reference.config_keys()}
    missed = [key for key in LooplineConfig().flat()
              if not any(key == name or key.startswith(name + ".") for name in documented)]
    assert not missed, f"keys missing from the configuration reference: {missed}"


@pytest.mark.parametrize("name", ["configuration.md", "cli.md"])
def test_committed_reference_pages_are_a_fresh_generation(name):
    fresh = reference.pages()[name]
    committed = (PAGES / name).read_text() if (PAGES / name).is_file() else ""
    assert committed == fresh, (f"docs/reference/{name} is not what the code generates now; "
                                f"regenerate it with `{reference.REGENERATE}` and commit it")


def _cell(text: str) -> str:
    """A generated table cell back to its text (`code`, <code>...</code> or plain)."""
    text = text.strip()
    if text.startswith("<code>"):
        return html.unescape(text.removeprefix("<code>").removesuffix("</code>"))
    return text.strip("`")


def _documented_keys() -> list[tuple[str, str]]:
    """(dotted key, default as written) of every row of the configuration page's tables."""
    rows = re.findall(r"^\| (`[^`]+`) \| [^|]* \| (`[^`]*`|<code>.*?</code>) \|",
                      (PAGES / "configuration.md").read_text(), re.M)
    return [(_cell(key), _cell(default)) for key, default in rows]


def _at(config: LooplineConfig, dotted: str):
    node = config.model_dump(mode="json")
    for part in dotted.split("."):
        node = node[part]
    return node


def test_every_documented_key_takes_its_documented_default_with_set():
    """Each key on the page, given its documented default with `--set`, is accepted and read
    back as that value: the names are real keys and the defaults are theirs."""
    rows = _documented_keys()
    assert len(rows) == len(reference.config_keys()) > 100
    path_keys = {f"{section}.{key}" for section, key in _PATH_KEYS}
    for key, default in rows:
        for placeholder, sample in SAMPLE.items():
            key = key.replace(placeholder, sample)
        config = load_config(None, [f"{key}={default}"])
        if key not in path_keys:  # paths come back resolved against the working folder
            assert _at(config, key) == yaml.safe_load(default), key
    with pytest.raises(ConfigError, match="unknown key"):  # the check above can fail
        load_config(None, ["trainer.epochz=20"])


def test_every_documented_command_and_option_is_in_the_parsers_help():
    """The commands the CLI page lists are real (`--help` of each succeeds) and each option it
    lists is in that command's own help."""
    page = (PAGES / "cli.md").read_text()
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    listed = {section.splitlines()[0] for section in sections}
    top_level = re.search(r"\{([a-z,]+)\}", build_parser().format_usage()).group(1).split(",")
    assert {f"loopline {name}" for name in top_level} | {"loopline data report", "loopline data accept"} <= listed
    for section in sections:
        command = section.splitlines()[0].split()[1:]
        options = re.findall(r"^\| `(-[^` ]+)", section, re.M)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([*command, "--help"])
        assert exit_.value.code == 0, command
        for option in options:
            assert re.search(rf"(?<![\w-]){re.escape(option.split(',')[0])}(?![\w-])", out.getvalue()), (command, option)
