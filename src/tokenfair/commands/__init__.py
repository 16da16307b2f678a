"""Sub-commands of the `tokenfair` CLI, one module per group."""
