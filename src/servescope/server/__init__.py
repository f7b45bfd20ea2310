"""A live OpenAI-compatible server (vLLM, SGLang): the HTTP client, health, bench serve (streams, worker pool,
/metrics), profile, and the /proc and unit queries behind settings."""
