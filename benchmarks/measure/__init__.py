"""The measurements of benchmarks/bench.py, one module each (numbered as the issue that asked for them), and the
report writer."""
