"""The edge's defaults that the CLI shows in `--help`.

They live apart from the code that applies them so that `tokenfair serve --help` and
`tokenfair gateway --help` work on a base install, where FastAPI and uvicorn are absent.
"""

# The largest request body, by default, of the server and the gateway alike: a 128k-token
# prompt as token ids is about 1 MiB of JSON, a long chat several.
DEFAULT_MAX_BODY_BYTES = 4 << 20

# Seconds a client has to send a request's headers, and may pause inside its body
# (edge/read_timeout.py).
DEFAULT_READ_TIMEOUT_S = 30.0
