"""The flags several `klineage` subcommands share: defined once (klineage/cli_options.py), and every subcommand
keeps the flags and defaults it had before they were shared."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from klineage import cli

PACKAGE = Path(__file__).resolve().parent.parent / "klineage"
SHARED = ["problem", "kernel", "--gate", "--placement", "--jobs", "--record", "--library", "--out", "--json"]


def subcommands(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every leaf subcommand's parser, by its words ("library admit")."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= subcommands(sub, f"{path} {name}".strip())
    return found or {path: parser}


def defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    """The shared arguments a subcommand has, each with its default."""
    return {a.option_strings[0] if a.option_strings else a.dest: a.default for a in parser._actions
            if (a.option_strings[0] if a.option_strings else a.dest) in SHARED}


def test_each_shared_argument_is_added_in_one_place():
    places: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in SHARED):
                places.setdefault(node.args[0].value, []).append(path.relative_to(PACKAGE).as_posix())
    assert places == {name: ["cli_options.py"] for name in SHARED}


# What each subcommand took before the flags were shared (compared on the parsers then and now).
EXPECTED = {
    "gate": {"problem": None, "kernel": None, "--gate": None, "--placement": "as_loaded", "--record": False,
             "--json": False},
    "walk": {"kernel": None, "--gate": None, "--placement": "as_loaded", "--record": False, "--jobs": 6,
             "--out": None},
    "problems": {"--json": False},
    "kernels": {"--json": False},
    "optimize": {"problem": None, "--library": None, "--gate": None, "--jobs": 1, "--out": None, "--json": False},
    "library build": {"--out": None},
    "library show": {"--library": None, "--json": False},
    "library fit": {"kernel": None, "--library": None, "--json": False},
    "library export": {"--library": None},
    "library import": {"--library": None, "--out": None, "--json": False},
    "library admit": {"--library": None, "--out": None, "--gate": None, "--placement": "as_loaded",
                      "--record": False, "--jobs": 1},
    "kernel export": {},
    "recorded compact": {},
}


def test_every_subcommand_keeps_its_shared_arguments_and_defaults():
    assert {words: defaults(sub) for words, sub in subcommands(cli.parser()).items()} == EXPECTED


@pytest.mark.parametrize("words", sorted(EXPECTED))
def test_every_help_renders_and_a_jobs_help_names_its_default(words):
    sub = subcommands(cli.parser())[words]
    text = " ".join(sub.format_help().split())
    assert text.startswith(f"usage: klineage {words} [-h]")
    jobs = [a for a in sub._actions if a.dest == "jobs"]
    if jobs:
        assert re.search(rf"--jobs JOBS GPU gate: judge .* side by side .* \(default {jobs[0].default}\)", text)


def test_shared_flags_parse_as_before():
    args = cli.parser().parse_args(["library", "admit", "--jobs", "3", "--placement", "exchanged", "--gate", "replay",
                                    "--record", "--out", "x.json"])
    assert (args.jobs, args.placement, args.gate, args.record, args.out, args.library) == (3, "exchanged", "replay",
                                                                                          True, "x.json", None)
    args = cli.parser().parse_args(["walk", "row_softmax/naive"])
    assert (args.kernel, args.jobs, args.placement, args.gate, args.record) == ("row_softmax/naive", 6, "as_loaded",
                                                                               None, False)


@pytest.mark.parametrize("argv", [["gate", "p", "k", "--placement", "nowhere"], ["walk", "k", "--jobs", "many"],
                                  ["optimize", "p", "--from", "k", "--gate", "cpu"]])
def test_a_bad_shared_flag_is_refused_with_its_name(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(argv)
    assert exit_.value.code == 2
    assert f"argument {argv[-2]}" in capsys.readouterr().err
