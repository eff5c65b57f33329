"""What the README and docs/ promise about the program, held to the program: the README's two commands are the
scripts that exist (and CI runs exactly its test command), its keys table and the dashboard page's list every key the
dashboard binds and no other, and the flags page has a row for every flag that `tokentui --help` and each command's
--help list, and none for a flag that is gone. A key or flag added without its line in the docs, or a line for one
that is gone, fails here."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tokentui.cli import build_parser
from tokentui.commands.branch import build_branch_parser
from tokentui.commands.fanout import build_fanout_parser
from tokentui.commands.replay import build_replay_parser
from tokentui.commands.score import build_score_parser
from tokentui.tui.keys import KEYS

ROOT = Path(__file__).resolve().parents[2]


def section(path: Path, heading: str) -> str:
    """The text under `## heading` in `path`, up to the next heading of that level or above."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = re.search(r"\n##? ", text[start:])
    return text[start:start + end.start()] if end else text[start:]


def first_column_keys(table: str) -> set[str]:
    """The keys a markdown table names in its first column: every `code` span there, minus the header row."""
    rows = [line for line in table.splitlines() if line.startswith("|") and not line.startswith("| ---")][1:]
    return {key for row in rows for key in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def bound_keys() -> set[str]:
    return {key for spec in KEYS for key in spec.display.split(" / ")}


def test_the_two_commands_are_the_scripts_and_ci_runs_the_test_command():
    blocks = re.findall(r"```sh\n(.*?)```", section(ROOT / "README.md", "Two commands"), re.S)
    assert [b.strip() for b in blocks] == ["./tokentui.sh", "./test.sh"]
    for command in blocks:
        script = ROOT / command.strip()
        assert script.is_file() and os.access(script, os.X_OK), f"{command.strip()} is not an executable script"
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["./test.sh"], "CI runs something other than the README's test command"


def test_the_keys_tables_list_every_bound_key_and_no_other():
    keys = bound_keys()
    assert {"t", "T", "space", "→", "ctrl+p", "?", "q"} <= keys  # the table read from the bindings is the real one
    for page, heading in ((ROOT / "README.md", "Keys"), (ROOT / "docs" / "dashboard.md", "Keys")):
        listed = first_column_keys(section(page, heading))
        assert listed - keys == set(), f"{page.name} lists keys the dashboard does not bind"
        assert keys - listed == set(), f"{page.name} leaves out keys the dashboard binds"


def _options(parser) -> set[str]:
    """The long options a parser's --help lists, each on its own line ("  --flag VALUE   what it does")."""
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", parser.format_help(), re.M)) - {"--help", "--version"}


def test_the_flags_page_has_a_row_for_every_flag_of_every_command_and_no_other():
    parsers = [build_parser(), build_branch_parser(), build_replay_parser(), build_fanout_parser(),
               build_score_parser(build_parser)]
    flags = set().union(*map(_options, parsers))
    assert {"--model", "--server", "--temperature", "--speed", "--answer-file", "--tokens"} <= flags
    rows = [line for line in (ROOT / "docs" / "flags.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    documented = {m for row in rows for m in re.findall(r"--[a-z][a-z0-9-]*", row.split(" | ")[0])}
    assert flags - documented == set(), "docs/flags.md has no row for these flags"
    assert documented - flags == set(), "docs/flags.md documents flags tokentui does not have"
