"""Every command the README and the docs show works as written: each `loopline ...` parses with the
CLI's own parser, each `make` target exists, and each `--set key=value` is a valid configuration."""
from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

from pipeline.cli import _parse
from pipeline.config import ConfigError, load_config
from tests.conftest import REPO

# The generated references are written from the parser and the config themselves.
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "reference" not in p.parts)]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
SET = re.compile(r"""--set[ =](?:'([^']*)'|"([^"]*)"|([A-Za-z_][\w.]*=[^\s`]*))""")
SHELL = ("bash", "sh", "shell", "console")


def _code(text: str) -> tuple[list[str], list[str]]:
    """Shell lines of the fenced blocks (continuations joined, a `$ ` prompt dropped; in a block
    without a language only lines that start with `loopline`), and the inline code spans."""
    lines = []
    for info, block in FENCE.findall(text):
        if info.strip() not in SHELL + ("",):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if info.strip() or line.startswith("loopline "):
                lines.append(line)
    return lines, INLINE.findall(FENCE.sub("", text))


def _commands(snippet: str) -> list[list[str]]:
    """The `loopline ...` invocations in one line of shell: words after `loopline` up to `&`, `|`,
    `;` or a comment; a `[...]` synopsis group is read as its contents, `...` is dropped."""
    try:
        words = shlex.split(re.sub(r"(^|\s)\[([^\]]*)\]", r"\1\2", snippet), comments=True)
    except ValueError:  # unbalanced quotes: reported when it was meant to be a command
        return [[f"<the shell cannot split: {snippet}>"]] if re.match(r"\s*loopline ", snippet) else []
    found, current, at_start = [], None, True
    for word in words:
        if word in ("&", "&&", "|", ";", "||"):
            current, at_start = None, True
            continue
        if at_start and word in ("loopline", ".venv/bin/loopline", "$(VENV)/bin/loopline"):
            current = []
            found.append(current)
        elif current is not None and word != "...":  # a bare `loopline` names the program: no command
            current.append(word.rstrip("&"))
        at_start = False
    return [argv for argv in found if argv]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """The CLI's parser on argv: exit code (0 when accepted), what it printed, what it said."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            _parse(argv)
    except SystemExit as exc:
        return exc.code or 0, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def _parses(argv: list[str]) -> str | None:
    """None when the CLI accepts argv, else the last line it said."""
    code, _, said = _cli(argv)
    return None if code == 0 else said.strip().splitlines()[-1]


def _mentions_real_flags(argv: list[str]) -> bool:
    """Inline code in prose may name a command and some of its flags without every argument
    (`loopline predict`, `loopline train --work-dir`): the command must exist and its --help list
    each flag named."""
    words = [w for w in argv if not w.startswith("-")]
    flags = [w.split("=")[0] for w in argv if w.startswith("--")]
    for cut in range(len(words), 0, -1):
        code, shown, _ = _cli([*words[:cut], "--help"])
        if code == 0:
            return all(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", shown) for f in flags)
    return False


def documented():
    for page in PAGES:
        text = page.read_text()
        lines, spans = _code(text)
        for line in lines:
            for argv in _commands(line):
                yield page.relative_to(REPO), argv, False
        for span in spans:
            for argv in _commands(span):
                yield page.relative_to(REPO), argv, True


def test_every_loopline_command_in_the_docs_parses():
    found = list(documented())
    assert len(found) > 60, f"only {len(found)} commands found: the extraction is broken"
    bad = []
    for page, argv, inline in found:
        problem = _parses(argv)
        if problem and not (inline and _mentions_real_flags(argv)):
            bad.append(f"{page}: loopline {' '.join(argv)}  ->  {problem}")
    assert not bad, "\n".join(bad)


def test_a_wrong_command_would_be_caught():
    """The checks above are not no-ops: a misspelt flag, a missing argument and an unknown command fail."""
    assert _parses(["run", "--epochs", "3"])
    assert _parses(["compile", "--target", "kubeflow"])  # --image is required
    assert _parses(["serve", "--grpc_port", "1"])  # neither loopline's --grpc-port nor a TF Serving flag
    assert not _mentions_real_flags(["trian"])
    assert not _mentions_real_flags(["train", "--workdir"])
    assert _mentions_real_flags(["train", "--work-dir"])
    assert _parses(["serve", "--port=8500", "--model_name=m", "--model_base_path=/models/m"]) is None


def _config_of(argv: list[str]):
    config = argv[argv.index("--config") + 1] if "--config" in argv else "loopline.yaml"
    overrides = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--set"]
    return REPO / config, overrides


def test_every_set_in_the_docs_is_a_valid_configuration():
    """Each command's --set overrides together on its --config (or loopline.yaml), through the
    loader the CLI uses; and each `--set key=value` written anywhere else, alone."""
    checked, bad = 0, []
    for page, argv, _ in documented():
        path, overrides = _config_of(argv)
        if overrides:
            checked += 1
            try:
                load_config(path, overrides)
            except ConfigError as exc:
                bad.append(f"{page}: loopline {' '.join(argv)}  ->  {exc}")
    for page in PAGES:
        for quoted, double, bare in SET.findall(page.read_text()):
            override = quoted or double or bare.rstrip(".,;:)")  # a bare one may end a sentence
            checked += 1
            try:
                load_config(REPO / "loopline.yaml", [override])
            except ConfigError as exc:
                bad.append(f"{page.relative_to(REPO)}: --set {override}  ->  {exc}")
    assert checked > 30, f"only {checked} overrides found"
    assert not bad, "\n".join(bad)
    with pytest.raises(ConfigError, match="trainer.epochz"):
        load_config(REPO / "loopline.yaml", ["trainer.epochz=3"])


def test_every_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    used = []
    for page in PAGES:
        lines, spans = _code(page.read_text())
        for snippet in lines + spans:
            used += [(page.relative_to(REPO), t) for t in re.findall(r"(?:^|[\s;&(])make ([a-z][\w-]*)", snippet)]
    assert {t for _, t in used} >= {"run", "test", "docs"}
    missing = [f"{page}: make {target}" for page, target in used if target not in targets]
    assert not missing, "\n".join(missing)
