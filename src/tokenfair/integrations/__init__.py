"""tokenfair inside other engines: the policies behind an existing engine's own queue."""
