#!/usr/bin/env python3
"""The llama-server tool's command line (stdlib only):

    python scripts/llama_server.py build [-v] [--sdist FILE] [--keep]   build (or find) the cached binary
    python scripts/llama_server.py path                                 print the binary's path (exit 1 if none)
    python scripts/llama_server.py serve [--port N] [--model GGUF]      run one on the embedded model until Ctrl-C

Building and caching is scripts/llama_build.py's, starting a server scripts/llama_serve.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_build import (SDIST_NAME, _log, binary_path, build, embedded_gguf,  # noqa: E402
                         missing_message)
from llama_serve import smoke_test, start  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# Command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find) the cached llama-server and print its path")
    b.add_argument("-v", "--verbose", action="store_true", help="show all of cmake's output")
    b.add_argument("--sdist", type=Path, help=f"use this local {SDIST_NAME} instead of downloading it")
    b.add_argument("--keep", action="store_true", help="keep the temporary source/build folder")
    b.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: all cores)")
    sub.add_parser("path", help="print the llama-server that would be used (exit 1 if none)")
    s = sub.add_parser("serve", help="run llama-server on the embedded model until Ctrl-C")
    s.add_argument("--port", type=int)
    s.add_argument("--model", type=Path)
    s.add_argument("extra", nargs="*", help="extra llama-server arguments (after --)")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        cached = binary_path()
        if cached is not None:
            print(cached)
            return 0
        try:
            path = build(sdist=args.sdist, verbose=args.verbose, keep=args.keep, jobs=args.jobs)
            smoke_test(path)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            _log(f"build failed: {exc}")
            return 1
        print(path)
        return 0
    if args.cmd == "path":
        path = binary_path()
        if path is None:
            _log(missing_message())
            return 1
        print(path)
        return 0
    if args.cmd == "serve":
        def _interrupt(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        with start(args.model or embedded_gguf(), port=args.port, extra_args=args.extra) as server:
            print(f"{server.url}  (log: {server.log_path})", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                server.process.wait()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
