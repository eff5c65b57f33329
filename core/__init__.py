"""tokentui's headless engine: the six steps of generation as plain Python, never importing textual.

Steps live in their own modules: template (1), tokenize (2), prefill / decode through `forward` (3, 5),
select (4), detokenize (6); `engine` loops them and emits the events of `events`; `process` runs an engine in a
child process for the dashboard.
"""
