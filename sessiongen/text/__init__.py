"""Text both the workload and the simulator need, below both of them: tokenizers and the
needle probes' phrasing. The workload writes prompts with them; the simulated replicas
read prompts with them; neither imports the other.

- :mod:`.tokenize`: the tokenizers a scenario can name (cl100k, tokenizer.json, a server);
- :mod:`.probes`: the needle fact and question as written, the planted answer a healthy
  model gives, and how an answer is graded.
"""
