"""`tokentui --version` / `-V`, and every command's --help written for a user: no code names in it (issue 23 item
19: `tokentui branch --help` said "Engine.branch")."""

from __future__ import annotations

import re

import pytest

from cli_run import tokentui
from tokentui import __version__

CODE_NAME = re.compile(r"\b[A-Z][a-z]+[A-Za-z]*\.[a-z_]+\b|\b[a-z]+_[a-z_]+\(")  # Engine.branch, decode_one(


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_is_printed_and_nothing_runs(flag):
    result = tokentui(flag, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"tokentui {__version__}"


@pytest.mark.parametrize("command", [[], ["replay"], ["branch"]])
def test_every_commands_help_names_no_code(command):
    result = tokentui(*command, "--help", timeout=60, env_extra={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "usage: tokentui" in text and "options:" in text
    assert CODE_NAME.findall(text) == [], CODE_NAME.findall(text)
