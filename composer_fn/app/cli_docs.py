"""The command line's reference page, written from its parser: ``docs/reference/cli.md`` is this module's output
(``python -m composer_fn.app.cli_docs > docs/reference/cli.md``), and a test holds the page equal to it."""

from __future__ import annotations

import argparse

__all__ = ["cli_reference"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|").replace("<", "&lt;")


def _flag(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ", ".join(f"`{name}`" for name in action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if action.choices is not None and action.metavar is None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    value = {"+": f"{metavar} ...", "*": f"[{metavar} ...]", "?": f"[{metavar}]"}.get(str(action.nargs), str(metavar))
    return ", ".join(f"`{name} {value}`" for name in action.option_strings)


def _section(name: str, parser: argparse.ArgumentParser, summary: str) -> list[str]:
    formatter = parser._get_formatter()
    lines = [f"## composer-fn {name}", "", _cell(summary) + ("." if summary and not summary.endswith(".") else ""), ""]
    lines += ["```", " ".join(parser.format_usage().split()).removeprefix("usage: "), "```", ""]
    positional = [a for a in parser._actions if not a.option_strings]
    optional = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    if positional:
        lines += ["| argument | meaning |", "|---|---|"]
        lines += [f"| `{a.metavar or a.dest}` | {_cell(formatter._expand_help(a))} |" for a in positional]
        lines.append("")
    if optional:
        lines += ["| flag | meaning |", "|---|---|"]
        lines += [f"| {_flag(a)} | {_cell(formatter._expand_help(a))} |" for a in optional]
        lines.append("")
    return lines


def cli_reference() -> str:
    """Returns the reference page of the ``composer-fn`` command: each subcommand's usage, arguments and flags, with
    their defaults, as ``--help`` gives them."""
    from composer_fn.app.cli import _parser

    parser, commands = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    lines = [
        "# The command line",
        "",
        "<!-- Written by `python -m composer_fn.app.cli_docs > docs/reference/cli.md`; a test holds it equal. -->",
        "",
        _cell(parser.description or ""),
        "",
        "Every subcommand's `--help` prints the same. A flag's value that starts with a minus (`-1ba`) is the flag's "
        "value, and is checked as such.",
        "",
    ]
    for name, command in commands.items():
        lines += _section(name, command, summaries.get(name, ""))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_reference(), end="")
