"""A live OpenAI-compatible server (vLLM, SGLang): the HTTP client, health, /metrics, prompts by its tokenizer,
profile, and the /proc and unit queries behind settings. The load test that drives it is
:mod:`servescope.bench.serve`."""
