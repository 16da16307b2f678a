"""The tenant edge that the server and the gateway share: the tenants file and its keys,
the limits at the door, OpenAI-style errors with one set of codes, body reading, and
the serving metrics' families. Neither imports the other; both import this."""
