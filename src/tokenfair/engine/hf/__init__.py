"""Real models: a transformers causal LM behind the engine, KV in our paged pool.

- `executor.HFExecutor`: runs scheduler steps (one packed forward per step).
- `kv_pool`: the paged KV pool, swap area, bytes-per-token arithmetic.
- `step_layout`: a scheduler step as tensors (packed tokens, slots, decode groups, masks).
- `paged_cache` + `attention`: how the stock model reads and writes the pool.
- `sampler`: greedy / temperature / top-k / top-p / seeded sampling, logprobs.
- `loader`, `builtin`, `tokenizer`: `load_model("builtin:tiny" | PATH)`, the byte
  tokenizer, the incremental detokenizer.
- `factory.make_hf_engine`: scheduler + executor + detokenizer as one Engine.
- `profile.measure_profile`, `replay.replay_trace`: calibrate and check the simulator.

Importing this package does not import torch; its modules do. It first asks torch's
OpenMP threads to sleep when idle rather than spin (see `cpu_runtime`), which must
happen before torch is loaded.
"""

from tokenfair.engine.hf.cpu_runtime import default_openmp_environment

default_openmp_environment()
