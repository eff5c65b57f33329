"""Watching a model served by another engine (`tokentui --server URL`): llama.cpp's llama-server, vLLM, SGLang or
any OpenAI-compatible server. `ServerEngine` (engine.py) yields the same events as the local engine, from the
server's streamed completion; what the server does not report is None in them, never estimated.

http.py: the connection (one-line errors, the API key from the environment); wire.py: the streamed chunks read
into tokens; probe.py: what the server is and what it says about its model; vocab.py: token bytes as the server
gives them."""
