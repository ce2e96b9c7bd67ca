"""sessiongen: measure when a shared KV cache between LLM replicas pays off."""

__version__ = "0.1.0"
