"""scripts/try_newest.py without installing anything: what each option asks pip for, and the per-family summary it
prints from pytest's junit report."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from tiny_models import REPO

_spec = importlib.util.spec_from_file_location("try_newest", REPO / "scripts" / "try_newest.py")
try_newest = importlib.util.module_from_spec(_spec)
sys.modules["try_newest"] = try_newest  # its dataclasses look their module up there
_spec.loader.exec_module(try_newest)

PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")
SETUP = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")


def test_each_choice_is_the_requirement_pip_gets():
    low = re.search(r'"transformers>=([0-9.]+)', PYPROJECT).group(1)
    assert try_newest.spec_for("transformers", "newest", PYPROJECT, SETUP) == "transformers"
    assert try_newest.spec_for("transformers", "oldest", PYPROJECT, SETUP) == f"transformers=={low}"
    assert try_newest.spec_for("transformers", "5.24.0", PYPROJECT, SETUP) == "transformers==5.24.0"
    torch_pin = re.search(r"torch==([0-9][0-9.]*)", SETUP).group(1)
    assert try_newest.spec_for("torch", "pinned", PYPROJECT, SETUP) == f"torch=={torch_pin}"
    assert try_newest.spec_for("torch", "newest", PYPROJECT, SETUP) == "torch"
    with pytest.raises(ValueError, match="^--torch takes a version"):
        try_newest.spec_for("torch", "latest", PYPROJECT, SETUP)


def test_the_asked_versions_replace_the_projects_own_and_the_rest_stay():
    reqs = try_newest.requirements(PYPROJECT, {"transformers": "transformers==9.0", "torch": "torch"})
    assert "transformers==9.0" in reqs and "torch" in reqs
    assert not any(r.startswith("transformers>") or r.startswith("torch>") for r in reqs)
    assert any(r.startswith("textual") for r in reqs) and any(r.startswith("pytest") for r in reqs)


@pytest.mark.parametrize("argv, said", [
    (["--transformers", "latest"], "--transformers takes a version"),
    (["--torch", "2.x"], "--torch takes a version"),
    (["--threads", "0"], "--threads takes a positive number"),
])
def test_bad_options_are_one_line_errors(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        try_newest.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and "Traceback" not in "".join(err)


def test_a_venv_path_that_exists_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        try_newest.parse_args(["--venv", str(tmp_path)])
    assert "exists" in capsys.readouterr().err


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_architecture_matrix" name="test_it_runs[llama]" time="1"/>
<testcase classname="tests.unit.test_architecture_matrix" name="test_totals[llama]" time="1"/>
<testcase classname="tests.unit.test_architecture_matrix" name="test_it_runs[mamba2]" time="1">
  <failure message="AssertionError: greedy ids part at step 2&#10;second line">trace</failure></testcase>
<testcase classname="tests.unit.test_architecture_matrix" name="test_totals[mamba2]" time="1">
  <failure message="AssertionError: the KV cache holds 0 bytes">trace</failure></testcase>
<testcase classname="tests.unit.test_architecture_matrix" name="test_prompt[mamba2]" time="1"/>
<testcase classname="tests.unit.test_architecture_matrix" name="test_readme" time="1"><skipped message="x"/></testcase>
<testcase classname="tests.unit.test_fastpaths" name="test_default_engine_matches_generate" time="1">
  <error message="ImportError: no kernels">trace</error></testcase>
</testsuite></testsuites>"""


def test_the_summary_is_one_line_per_family_with_its_first_failure():
    fams = try_newest.families(JUNIT)
    assert list(fams) == ["llama", "mamba2", "matrix (one test, all families)", "engine: test_fastpaths"]
    lines = try_newest.summary_lines(fams)
    assert len(lines) == 4
    assert re.match(r"llama +pass  2/2$", lines[0])
    assert re.match(r"mamba2 +FAIL  1/3  test_it_runs: AssertionError: greedy ids part at step 2$", lines[1])
    assert lines[2].endswith("pass  0/0 (1 skipped)")
    assert "FAIL  0/1  test_default_engine_matches_generate: ImportError: no kernels" in lines[3]
